//! Test recipients: real HTTP servers on 127.0.0.1 that record arrival order and inject faults.
