//! `witchd`: continuous inefficiency profiling (being built).

pub mod client;
