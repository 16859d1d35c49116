//! Scheduler throughput benchmarks (filled by the benchmark work).
#![allow(missing_docs)]
fn main() {}
