fn main() {
    println!("cargo:rerun-if-changed=src/exec_variadic.c");
    cc::Build::new().file("src/exec_variadic.c").warnings(true).compile("exec_variadic");
    // Keep and export the C wrappers and the assembly stubs
    // (interpose.rs): rustc's cdylib version script only lists Rust's own
    // #[no_mangle] symbols.
    for f in ["execl", "execlp", "execle", "dlopen", "dlmopen", "dlsym"] {
        println!("cargo:rustc-cdylib-link-arg=-Wl,--undefined={f}");
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}/src/exports.map", std::env::var("CARGO_MANIFEST_DIR").unwrap());
}
