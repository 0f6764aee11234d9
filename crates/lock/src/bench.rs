//! Benchmark engine (filled in below).
