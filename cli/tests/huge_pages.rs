//! The binary turns transparent huge pages off for its process (cli/src/main.rs
//! `no_huge_pages`, beside mimalloc): the kernel says so in `/proc/<pid>/status`
//! (`THP_enabled: 0`), where a process that did not ask says 1. Checked on a running relay,
//! against this test's own process as the control.
#![cfg(all(target_os = "linux", feature = "mimalloc"))]
#![allow(missing_docs, clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_outbox-lanes");

/// The `THP_enabled` line of `/proc/<pid>/status`, if the kernel writes one.
fn thp_enabled(pid: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .map(|v| v.trim().to_owned())
}

#[test]
fn a_relay_runs_without_transparent_huge_pages() {
    // The control: a process that did not ask (this one) says 1. A kernel without the line
    // (before 5.0) cannot show it either way.
    let Some(own) = thp_enabled("self") else {
        println!("skipped: this kernel does not report THP_enabled");
        return;
    };
    assert_eq!(own, "1", "the test process itself has huge pages allowed");

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("outbox.db").display().to_string();
    let mut relay = Command::new(BIN)
        .args(["--db", &db, "relay"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = relay.id().to_string();
    // Wait (bounded) for the process to be past its start: the status of a relay that is
    // still running and has been asked is read; an exit ends the wait too.
    let start = Instant::now();
    let mut seen = None;
    while start.elapsed() < Duration::from_secs(15) {
        if relay.try_wait().unwrap().is_some() {
            break;
        }
        seen = thp_enabled(&pid);
        if seen.as_deref() == Some("0") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = relay.kill();
    let _ = relay.wait();
    assert_eq!(seen.as_deref(), Some("0"), "the relay's THP_enabled");
}
