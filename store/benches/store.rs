//! Store benchmarks (filled below).
fn main() {}
