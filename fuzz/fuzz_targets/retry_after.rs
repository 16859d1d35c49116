//! `parse_retry_after(value, now, cap)`: never panics; a result is never above `cap`; the
//! cap only clamps (the capped result is the uncapped one, clamped); surrounding ASCII
//! whitespace changes nothing.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use outbox_lanes_core::Timestamp;
use outbox_lanes_core::policy::parse_retry_after;

fuzz_target!(|data: &[u8]| {
    if data.len() < 17 {
        return;
    }
    let (head, rest) = data.split_at(17);
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    let now_raw = word(&head[0..8]);
    let cap_raw = word(&head[8..16]);
    // Mostly realistic clocks and caps, sometimes the extremes.
    let now = match head[16] % 4 {
        0 => Timestamp::from_millis(now_raw),
        1 => Timestamp::MAX,
        _ => Timestamp::from_millis(now_raw % 8_000_000_000_000), // up to year ~2223
    };
    let cap = match head[16] / 4 % 4 {
        0 => Duration::from_millis(cap_raw),
        1 => Duration::MAX,
        2 => Duration::ZERO,
        _ => Duration::from_millis(cap_raw % 86_400_000),
    };
    let value = String::from_utf8_lossy(rest);

    let got = parse_retry_after(&value, now, cap);
    if let Some(d) = got {
        assert!(d <= cap, "{value:?}: {d:?} above the cap {cap:?}");
    }
    let uncapped = parse_retry_after(&value, now, Duration::MAX);
    assert_eq!(
        got,
        uncapped.map(|d| d.min(cap)),
        "{value:?}: the cap does more than clamp"
    );
    let padded = format!(" \t{value}\r\n ");
    assert_eq!(
        parse_retry_after(&padded, now, cap),
        got,
        "{value:?}: surrounding whitespace changes the result"
    );
    // delta-seconds are exact.
    let trimmed = value.trim_ascii();
    if !trimmed.is_empty() && trimmed.bytes().all(|b| b.is_ascii_digit()) {
        let secs = trimmed.parse::<u64>().unwrap_or(u64::MAX);
        assert_eq!(got, Some(Duration::from_secs(secs).min(cap)), "{value:?}");
    }
});
