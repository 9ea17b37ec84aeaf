//! The load driver (filled in by issue 3).
fn main() {}
