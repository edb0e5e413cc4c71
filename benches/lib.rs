//! Nothing here: the benchmarks are `benches/paths.rs` and the Python scripts.
