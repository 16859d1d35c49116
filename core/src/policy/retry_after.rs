//! Retry-After parsing (RFC 9110 §10.2.3), without a clock and without dependencies.
//!
//! A Retry-After is either delta-seconds (`120`) or an HTTP-date in any of the three formats
//! RFC 9110 §5.6.7 obliges recipients to accept:
//!
//! - IMF-fixdate: `Sun, 06 Nov 1994 08:49:37 GMT`
//! - obsolete RFC 850: `Sunday, 06-Nov-94 08:49:37 GMT`
//! - ANSI C asctime: `Sun Nov  6 08:49:37 1994`
//!
//! Day and month names are matched case-insensitively, and the day name is not checked
//! against the date (the date alone says when to retry). A two-digit RFC 850 year is read as
//! the year with those last two digits that lies within 50 years of `now`, so a date that
//! would be more than 50 years ahead means the century before (RFC 9110 §5.6.7).
//!
//! # Why not a crate
//!
//! `httpdate`, the HTTP-date crate the HTTP stacks use, needs std (it converts through
//! `std::time::SystemTime`), and this module is part of the `no_std` core that every
//! runtime shares, so that both HTTP clients read a Retry-After the same way. It would also
//! change which values are honoured: it matches day and month names case-sensitively,
//! refuses a date whose day name is wrong, reads a two-digit RFC 850 year with a fixed
//! pivot (`70` is 1970, `69` is 2069) instead of relative to `now`, and refuses years
//! before 1970. Its `no_std` fork `date_header` shares those choices and has had no release
//! since 2023. What stays here is the grammar of RFC 9110 §5.6.7 and a days-from-civil
//! conversion, both exercised by the tests below and the `retry_after` fuzz target.

use core::time::Duration;

use crate::time::Timestamp;

/// The cap the design sets on any Retry-After (OL-6): one hour.
pub const DEFAULT_RETRY_AFTER_CAP: Duration = Duration::from_secs(3600);

/// Parses a Retry-After header value (delta-seconds or HTTP-date) into a delay from `now`,
/// capped at `cap`.
///
/// Surrounding whitespace is ignored. Delta-seconds must be plain digits; any number of
/// them is accepted and large values are clamped to `cap`. A date at or before `now` gives
/// [`Duration::ZERO`] (retry at once).
///
/// Returns `None` for anything else: a sign, a fraction, a date that does not exist
/// (`Feb 30`, `25:00:00`), a wrong format, or garbage. Callers treat `None` as "no
/// Retry-After" and fall back to their own backoff.
///
/// ```
/// use core::time::Duration;
/// use outbox_lanes_core::policy::{parse_retry_after, DEFAULT_RETRY_AFTER_CAP};
/// use outbox_lanes_core::Timestamp;
///
/// let now = Timestamp::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
/// let cap = DEFAULT_RETRY_AFTER_CAP;
/// assert_eq!(parse_retry_after(" 120 ", now, cap), Some(Duration::from_secs(120)));
/// assert_eq!(parse_retry_after("99999999999999999999999", now, cap), Some(cap));
/// assert_eq!(
///     parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now, cap),
///     Some(Duration::from_secs(30)),
/// );
/// assert_eq!(parse_retry_after("-1", now, cap), None);
/// ```
pub fn parse_retry_after(value: &str, now: Timestamp, cap: Duration) -> Option<Duration> {
    let value = value.trim_ascii();
    if value.is_empty() {
        return None;
    }
    if value.bytes().all(|b| b.is_ascii_digit()) {
        let secs = value.bytes().fold(0u64, |acc, b| {
            acc.saturating_mul(10).saturating_add(u64::from(b - b'0'))
        });
        return Some(Duration::from_secs(secs).min(cap));
    }
    let date_secs = parse_http_date(value, now)?;
    let date_ms = i128::from(date_secs) * 1000;
    let now_ms = i128::from(now.as_millis());
    let delay_ms = u64::try_from((date_ms - now_ms).max(0)).unwrap_or(u64::MAX);
    Some(Duration::from_millis(delay_ms).min(cap))
}

/// Parses an HTTP-date (any of the three formats) into seconds since the Unix epoch.
/// `now` is needed only to place a two-digit RFC 850 year.
fn parse_http_date(s: &str, now: Timestamp) -> Option<i64> {
    let b = s.as_bytes();
    let comma = b.iter().position(|&c| c == b',');
    match comma {
        // IMF-fixdate: the short day name is exactly three letters.
        Some(3) => parse_imf_fixdate(b),
        Some(_) => parse_rfc850(b, now),
        None => parse_asctime(b),
    }
}

/// A broken-down UTC date and time, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct DateTime {
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
}

impl DateTime {
    /// Checks the fields and converts to seconds since the Unix epoch.
    fn to_unix(self) -> Option<i64> {
        let valid = (1..=12).contains(&self.month)
            && self.day >= 1
            && self.day <= days_in_month(self.year, self.month)
            && self.hour <= 23
            && self.minute <= 59
            // RFC 9110 allows 60 for a leap second.
            && self.second <= 60;
        if !valid {
            return None;
        }
        let days = days_from_civil(self.year, self.month, self.day);
        Some(
            days * 86_400
                + i64::from(self.hour) * 3600
                + i64::from(self.minute) * 60
                + i64::from(self.second),
        )
    }
}

/// `Sun, 06 Nov 1994 08:49:37 GMT`
fn parse_imf_fixdate(b: &[u8]) -> Option<i64> {
    let mut c = Cursor(b);
    c.short_day_name()?;
    c.literal(b", ")?;
    let day = c.digits(2)?;
    c.literal(b" ")?;
    let month = c.month()?;
    c.literal(b" ")?;
    let year = c.digits(4)?;
    c.literal(b" ")?;
    let (hour, minute, second) = c.time_of_day()?;
    c.literal_ci(b" GMT")?;
    c.end()?;
    DateTime {
        year: i64::from(year),
        month,
        day,
        hour,
        minute,
        second,
    }
    .to_unix()
}

/// `Sunday, 06-Nov-94 08:49:37 GMT`
fn parse_rfc850(b: &[u8], now: Timestamp) -> Option<i64> {
    let mut c = Cursor(b);
    c.long_day_name()?;
    c.literal(b", ")?;
    let day = c.digits(2)?;
    c.literal(b"-")?;
    let month = c.month()?;
    c.literal(b"-")?;
    let yy = c.digits(2)?;
    c.literal(b" ")?;
    let (hour, minute, second) = c.time_of_day()?;
    c.literal_ci(b" GMT")?;
    c.end()?;
    DateTime {
        year: expand_two_digit_year(yy, now),
        month,
        day,
        hour,
        minute,
        second,
    }
    .to_unix()
}

/// `Sun Nov  6 08:49:37 1994` (a one-digit day is padded with a space, or a zero)
fn parse_asctime(b: &[u8]) -> Option<i64> {
    let mut c = Cursor(b);
    c.short_day_name()?;
    c.literal(b" ")?;
    let month = c.month()?;
    c.literal(b" ")?;
    let day = if c.literal(b" ").is_some() {
        c.digits(1)?
    } else {
        c.digits(2)?
    };
    c.literal(b" ")?;
    let (hour, minute, second) = c.time_of_day()?;
    c.literal(b" ")?;
    let year = c.digits(4)?;
    c.end()?;
    DateTime {
        year: i64::from(year),
        month,
        day,
        hour,
        minute,
        second,
    }
    .to_unix()
}

/// The year ending in `yy` that lies in `(now_year - 50, now_year + 50]`.
fn expand_two_digit_year(yy: u32, now: Timestamp) -> i64 {
    let days = i64::try_from(now.as_secs() / 86_400).unwrap_or(i64::MAX);
    let (now_year, _, _) = civil_from_days(days);
    let mut year = now_year - now_year.rem_euclid(100) + i64::from(yy);
    if year > now_year + 50 {
        year -= 100;
    } else if year <= now_year - 50 {
        year += 100;
    }
    year
}

const SHORT_DAYS: [&[u8]; 7] = [b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat", b"Sun"];
const LONG_DAYS: [&[u8]; 7] = [
    b"Monday",
    b"Tuesday",
    b"Wednesday",
    b"Thursday",
    b"Friday",
    b"Saturday",
    b"Sunday",
];
const MONTHS: [&[u8]; 12] = [
    b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec",
];

/// A tiny forward-only byte parser; every method returns `None` on a mismatch.
struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn literal(&mut self, lit: &[u8]) -> Option<()> {
        self.0 = self.0.strip_prefix(lit)?;
        Some(())
    }

    fn literal_ci(&mut self, lit: &[u8]) -> Option<()> {
        let (head, rest) = self.0.split_at_checked(lit.len())?;
        if !head.eq_ignore_ascii_case(lit) {
            return None;
        }
        self.0 = rest;
        Some(())
    }

    /// One of `names`, case-insensitively; returns its index.
    fn one_of(&mut self, names: &[&[u8]]) -> Option<usize> {
        names
            .iter()
            .position(|name| {
                self.0
                    .get(..name.len())
                    .is_some_and(|head| head.eq_ignore_ascii_case(name))
            })
            .and_then(|i| {
                self.0 = self.0.get(names.get(i)?.len()..)?;
                Some(i)
            })
    }

    fn short_day_name(&mut self) -> Option<()> {
        self.one_of(&SHORT_DAYS).map(|_| ())
    }

    fn long_day_name(&mut self) -> Option<()> {
        self.one_of(&LONG_DAYS).map(|_| ())
    }

    /// A month name; returns 1 to 12.
    fn month(&mut self) -> Option<u32> {
        let i = self.one_of(&MONTHS)?;
        u32::try_from(i + 1).ok()
    }

    /// Exactly `n` ASCII digits (n ≤ 4, so no overflow).
    fn digits(&mut self, n: usize) -> Option<u32> {
        let (head, rest) = self.0.split_at_checked(n)?;
        let mut value = 0u32;
        for &b in head {
            if !b.is_ascii_digit() {
                return None;
            }
            value = value * 10 + u32::from(b - b'0');
        }
        self.0 = rest;
        Some(value)
    }

    /// `HH:MM:SS`, not yet range-checked.
    fn time_of_day(&mut self) -> Option<(u32, u32, u32)> {
        let hour = self.digits(2)?;
        self.literal(b":")?;
        let minute = self.digits(2)?;
        self.literal(b":")?;
        let second = self.digits(2)?;
        Some((hour, minute, second))
    }

    fn end(&self) -> Option<()> {
        self.0.is_empty().then_some(())
    }
}

fn is_leap_year(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap_year(year) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Days from 1970-01-01 to the given proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`). `month` is 1..=12 and `day` 1..=31.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    // Months counted from March, so February's length is the last thing in a year.
    let month_from_march = i64::from((month + 9) % 12);
    let day_of_year = (153 * month_from_march + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The inverse of [`days_from_civil`]: (year, month 1..=12, day 1..=31).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days.saturating_add(719_468);
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    // Both are in range by construction (1..=12, 1..=31).
    (
        year,
        u32::try_from(month).unwrap_or(1),
        u32::try_from(day).unwrap_or(1),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failing unwrap is a failing test
mod tests {
    use super::*;
    use alloc::format;
    use alloc::string::String;

    const CAP: Duration = DEFAULT_RETRY_AFTER_CAP;
    /// Sun, 06 Nov 1994 08:49:37 GMT
    const RFC_EXAMPLE: i64 = 784_111_777;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_secs(u64::try_from(secs).unwrap())
    }

    /// Civil fields of a Unix time, for the formatters below.
    fn fields(secs: i64) -> (i64, u32, u32, i64, i64, i64, usize) {
        let days = secs.div_euclid(86_400);
        let sod = secs.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        // 1970-01-01 was a Thursday (index 3 in SHORT_DAYS).
        let weekday = usize::try_from((days + 3).rem_euclid(7)).unwrap();
        (y, m, d, sod / 3600, sod / 60 % 60, sod % 60, weekday)
    }

    fn name(n: &[u8]) -> &str {
        core::str::from_utf8(n).unwrap()
    }

    fn imf(secs: i64) -> String {
        let (y, m, d, hh, mm, ss, wd) = fields(secs);
        format!(
            "{}, {d:02} {} {y:04} {hh:02}:{mm:02}:{ss:02} GMT",
            name(SHORT_DAYS[wd]),
            name(MONTHS[m as usize - 1])
        )
    }

    fn rfc850(secs: i64) -> String {
        let (y, m, d, hh, mm, ss, wd) = fields(secs);
        format!(
            "{}, {d:02}-{}-{:02} {hh:02}:{mm:02}:{ss:02} GMT",
            name(LONG_DAYS[wd]),
            name(MONTHS[m as usize - 1]),
            y.rem_euclid(100)
        )
    }

    fn asctime(secs: i64) -> String {
        let (y, m, d, hh, mm, ss, wd) = fields(secs);
        format!(
            "{} {} {d:>2} {hh:02}:{mm:02}:{ss:02} {y:04}",
            name(SHORT_DAYS[wd]),
            name(MONTHS[m as usize - 1])
        )
    }

    #[test]
    fn the_rfc_examples() {
        let now = at(RFC_EXAMPLE - 100);
        for s in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
            "  Sun Nov  6 08:49:37 1994\t",
            "sun, 06 nov 1994 08:49:37 gmt",
            "Sun Nov 06 08:49:37 1994",
        ] {
            assert_eq!(parse_http_date(s.trim(), now), Some(RFC_EXAMPLE), "{s}");
            assert_eq!(
                parse_retry_after(s, now, CAP),
                Some(Duration::from_secs(100)),
                "{s}"
            );
        }
        assert_eq!(imf(RFC_EXAMPLE), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(rfc850(RFC_EXAMPLE), "Sunday, 06-Nov-94 08:49:37 GMT");
        assert_eq!(asctime(RFC_EXAMPLE), "Sun Nov  6 08:49:37 1994");
    }

    #[test]
    fn delta_seconds() {
        let now = at(1_000);
        let p = |s: &str| parse_retry_after(s, now, CAP);
        assert_eq!(p("0"), Some(Duration::ZERO));
        assert_eq!(p("120"), Some(Duration::from_secs(120)));
        assert_eq!(p(" \t120\r\n"), Some(Duration::from_secs(120)));
        assert_eq!(p("000120"), Some(Duration::from_secs(120)));
        assert_eq!(p("3600"), Some(CAP));
        assert_eq!(p("3601"), Some(CAP));
        assert_eq!(p("18446744073709551615"), Some(CAP));
        assert_eq!(p("18446744073709551616"), Some(CAP));
        assert_eq!(p(&"9".repeat(10_000)), Some(CAP));
        assert_eq!(
            parse_retry_after("5", now, Duration::from_secs(2)),
            Some(Duration::from_secs(2))
        );
        for bad in [
            "", "  ", "-1", "+1", "1.5", "1e3", "0x10", "1 2", "12a", "١٢", "∞", "NaN",
        ] {
            assert_eq!(p(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn dates_relative_to_now() {
        let now = Timestamp::from_millis(1_700_000_000_500);
        let date = |secs: i64| parse_retry_after(&imf(secs), now, CAP);
        assert_eq!(date(1_700_000_010), Some(Duration::from_millis(9_500)));
        assert_eq!(date(1_700_000_000), Some(Duration::ZERO));
        assert_eq!(date(1_600_000_000), Some(Duration::ZERO));
        assert_eq!(date(1_700_003_600), Some(Duration::from_millis(3_599_500)));
        assert_eq!(date(1_800_000_000), Some(CAP));
        assert_eq!(
            parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", now, CAP),
            Some(Duration::ZERO)
        );
        assert_eq!(
            parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now, CAP),
            Some(CAP)
        );
        assert_eq!(
            parse_retry_after("Sat, 01 Jan 0000 00:00:00 GMT", now, CAP),
            Some(Duration::ZERO)
        );
        // Dates against the extremes of `now`.
        assert_eq!(
            parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", Timestamp::MAX, CAP),
            Some(Duration::ZERO)
        );
        assert_eq!(
            parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", Timestamp::EPOCH, CAP),
            Some(CAP)
        );
    }

    #[test]
    fn invalid_dates_are_refused() {
        let now = at(RFC_EXAMPLE);
        for bad in [
            "Sun, 30 Feb 1994 08:49:37 GMT",
            "Sun, 29 Feb 1900 08:49:37 GMT",
            "Sun, 31 Apr 1994 08:49:37 GMT",
            "Sun, 00 Nov 1994 08:49:37 GMT",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 06 Nov 1994 08:60:00 GMT",
            "Sun, 06 Nov 1994 08:49:61 GMT",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 06 Nov 1994 08:49:37 +0000",
            "Sun, 06 Nov 1994 08:49:37",
            "Sun, 06 Nov 1994 08:49:37 GMT extra",
            "Sun, 6 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 94 08:49:37 GMT",
            "Sun, 06 Xyz 1994 08:49:37 GMT",
            "Xyz, 06 Nov 1994 08:49:37 GMT",
            "Sun,  06 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 8:49:37 GMT",
            "Sun, 06 Nov 1994 08:49 GMT",
            "Sunday, 06-Nov-1994 08:49:37 GMT",
            "Sunday, 31-Nov-94 08:49:37 GMT",
            "Sun, 06-Nov-94 08:49:37 GMT",
            "Sunny, 06-Nov-94 08:49:37 GMT",
            "Sun Nov 6 08:49:37 1994",
            "Sun Nov  6 08:49:37 94",
            "Sun Nov  6 08:49:37 1994 GMT",
            "Sun Feb 30 08:49:37 1994",
            "Sun Nov   6 08:49:37 1994",
            ",",
            "Sun,",
            "Sun, ",
            "Mon, 06 Nov 1994 08:49:37 GMT\u{e9}",
            "\u{e9}\u{e9}\u{e9}, 06 Nov 1994 08:49:37 GMT",
            "garbage",
            "\u{0}\u{1}\u{2}",
        ] {
            assert_eq!(parse_retry_after(bad, now, CAP), None, "{bad:?}");
        }
        // Leap years and the leap second are fine.
        assert!(parse_retry_after("Tue, 29 Feb 2000 00:00:00 GMT", now, CAP).is_some());
        assert!(parse_retry_after("Sun, 29 Feb 2004 00:00:00 GMT", now, CAP).is_some());
        assert_eq!(
            parse_http_date("Sat, 31 Dec 2016 23:59:60 GMT", now),
            Some(1_483_228_800)
        );
        // The day name is not checked against the date.
        assert_eq!(
            parse_http_date("Mon, 06 Nov 1994 08:49:37 GMT", now),
            Some(RFC_EXAMPLE)
        );
    }

    #[test]
    fn two_digit_years_stay_within_fifty_years_of_now() {
        let jan1 = |y: i64| days_from_civil(y, 1, 1) * 86_400;
        let year_of = |s: &str, now_year: i64| {
            let secs = parse_http_date(s, at(jan1(now_year))).unwrap();
            civil_from_days(secs.div_euclid(86_400)).0
        };
        assert_eq!(year_of("Sunday, 06-Nov-94 08:49:37 GMT", 2026), 1994);
        assert_eq!(year_of("Sunday, 06-Nov-76 08:49:37 GMT", 2026), 2076);
        assert_eq!(year_of("Sunday, 06-Nov-77 08:49:37 GMT", 2026), 1977);
        assert_eq!(year_of("Sunday, 06-Nov-26 08:49:37 GMT", 2026), 2026);
        assert_eq!(year_of("Sunday, 06-Nov-00 08:49:37 GMT", 2026), 2000);
        assert_eq!(year_of("Sunday, 06-Nov-00 08:49:37 GMT", 2099), 2100);
        assert_eq!(year_of("Sunday, 06-Nov-49 08:49:37 GMT", 2099), 2149);
        assert_eq!(year_of("Sunday, 06-Nov-50 08:49:37 GMT", 2099), 2050);
        assert_eq!(year_of("Sunday, 06-Nov-69 08:49:37 GMT", 1970), 1969);
        assert_eq!(year_of("Sunday, 06-Nov-20 08:49:37 GMT", 1970), 2020);
        assert_eq!(year_of("Sunday, 06-Nov-21 08:49:37 GMT", 1970), 1921);
    }

    #[test]
    fn civil_conversion_matches_known_days() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(1994, 11, 6) * 86_400, RFC_EXAMPLE - 31_777);
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-719_528), (0, 1, 1));
        for days in (-800_000..3_000_000).step_by(97) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn many_timestamps_round_trip_through_all_three_formats() {
        // xorshift64: deterministic, dependency-free spread over 1970..=9999.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let max = days_from_civil(10_000, 1, 1) * 86_400 - 1;
        for i in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let secs = match i {
                0 => 0,
                1 => max,
                _ => i64::try_from(state % u64::try_from(max).unwrap()).unwrap(),
            };
            // `now` up to 50 minutes before the date, so the delay is under the cap.
            let now_secs = (secs - 3_000).max(0);
            let now = at(now_secs);
            let want = Some(Duration::from_secs(u64::try_from(secs - now_secs).unwrap()));
            for s in [imf(secs), asctime(secs)] {
                assert_eq!(parse_http_date(&s, now), Some(secs), "{s}");
                assert_eq!(parse_retry_after(&s, now, CAP), want, "{s}");
            }
            let s = rfc850(secs);
            assert_eq!(parse_http_date(&s, now), Some(secs), "{s}");
        }
    }

    #[test]
    fn arbitrary_input_never_panics() {
        let alphabet = b"SunMo,-: 0123456789GMTNovFeb\t\xff";
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut buf = alloc::vec::Vec::new();
        for _ in 0..50_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            buf.clear();
            let mut chars = state;
            for _ in 0..(state % 34) {
                chars = chars
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                buf.push(alphabet[(chars >> 33) as usize % alphabet.len()]);
            }
            let s = String::from_utf8_lossy(&buf);
            let _ = parse_retry_after(&s, at(RFC_EXAMPLE), CAP);
            let _ = parse_retry_after(&s, Timestamp::MAX, CAP);
        }
        assert_eq!(
            parse_retry_after(
                "Sun, 06 Nov 1994 08:49:37 GMT",
                Timestamp::MAX,
                Duration::MAX
            ),
            Some(Duration::ZERO)
        );
    }
}
