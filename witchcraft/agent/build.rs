/// The allocation functions' entries (heap_entry.c, heap.rs).
const HEAP: [&str; 12] = [
    "malloc",
    "calloc",
    "realloc",
    "reallocarray",
    "free",
    "aligned_alloc",
    "memalign",
    "posix_memalign",
    "mmap",
    "mmap64",
    "munmap",
    "mremap",
];

fn main() {
    println!("cargo:rerun-if-changed=src/exec_variadic.c");
    println!("cargo:rerun-if-changed=src/heap_entry.c");
    cc::Build::new().file("src/exec_variadic.c").file("src/heap_entry.c").warnings(true).compile("exec_variadic");
    // Keep and export the C wrappers and the assembly stubs
    // (interpose.rs): rustc's cdylib version script only lists Rust's own
    // #[no_mangle] symbols.
    for f in ["execl", "execlp", "execle", "dlopen", "dlmopen", "dlsym"].into_iter().chain(HEAP) {
        println!("cargo:rustc-cdylib-link-arg=-Wl,--undefined={f}");
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}/src/exports.map", std::env::var("CARGO_MANIFEST_DIR").unwrap());
}
