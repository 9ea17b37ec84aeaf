//! loom model harness (filled in by issue 4).
