//! The C (and Rust) test programs of `tests/programs/`, built per test.

use crate::bins::programs_dir;
use crate::process::{run_cmd, Run};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A C program from `tests/programs/`, built into a scratch directory.
pub struct Program {
    /// Source file name, e.g. `dead_loop.c`; frames are matched against it.
    pub file: String,
    pub src: PathBuf,
    pub exe: PathBuf,
    text: String,
}

impl Program {
    /// Build `tests/programs/<name>.c` with `gcc -O2 -g` into `dir/<name>`.
    pub fn build(name: &str, dir: &Path) -> Program {
        Self::build_with(name, dir, name, &[]).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Build with extra gcc flags into `dir/<out_name>`; Err carries gcc's output.
    pub fn build_with(name: &str, dir: &Path, out_name: &str, extra: &[&str]) -> Result<Program, String> {
        let src = programs_dir().join(format!("{name}.c"));
        let text = std::fs::read_to_string(&src).map_err(|e| format!("read {}: {e}", src.display()))?;
        let exe = dir.join(out_name);
        let out = Command::new("gcc")
            .args(["-O2", "-g", "-o"])
            .arg(&exe)
            .arg(&src)
            .args(extra)
            .arg("-lpthread")
            .output()
            .map_err(|e| format!("cannot run gcc: {e}"))?;
        if !out.status.success() {
            return Err(format!("gcc {} {:?} failed ({}):\n{}", src.display(), extra, out.status, String::from_utf8_lossy(&out.stderr)));
        }
        Ok(Program { file: format!("{name}.c"), src, exe, text })
    }

    /// Build `programs/<name>.rs` with rustc (optimized, with line tables)
    /// into `dir/<name>`: the linker and layout Rust programs really get.
    pub fn build_rust(name: &str, dir: &Path) -> Program {
        let src = programs_dir().join(format!("{name}.rs"));
        let text = std::fs::read_to_string(&src).unwrap_or_else(|e| panic!("read {}: {e}", src.display()));
        let exe = dir.join(name);
        let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
        let out = Command::new(rustc)
            .args(["-C", "opt-level=2", "-g", "-o"])
            .arg(&exe)
            .arg(&src)
            .output()
            .unwrap_or_else(|e| panic!("cannot run rustc: {e}"));
        assert!(out.status.success(), "rustc {} failed ({}):\n{}", src.display(), out.status, String::from_utf8_lossy(&out.stderr));
        Program { file: format!("{name}.rs"), src, exe, text }
    }

    /// Line number (1-based) of the one source line carrying `/* <marker> */`.
    pub fn line(&self, marker: &str) -> u32 {
        let needle = format!("/* {marker} */");
        let hits: Vec<u32> = self.text.lines().enumerate().filter(|(_, l)| l.contains(&needle)).map(|(i, _)| i as u32 + 1).collect();
        assert_eq!(hits.len(), 1, "marker {needle} must occur on exactly one line of {}: {hits:?}", self.src.display());
        hits[0]
    }

    /// Run the program natively.
    pub fn run_native(&self, args: &[&str]) -> Run {
        let mut cmd = Command::new(&self.exe);
        cmd.args(args);
        run_cmd(cmd, None)
    }

    pub fn run_native_stdin(&self, args: &[&str], stdin: &[u8]) -> Run {
        let mut cmd = Command::new(&self.exe);
        cmd.args(args);
        run_cmd(cmd, Some(stdin))
    }
}
