//! `witchd`: watch processes for wasted memory operations, continuously.

fn main() {
    eprintln!("witchd: not built yet");
    std::process::exit(2);
}
