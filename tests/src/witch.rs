//! Running witch.

use crate::bins::witch_bin;
use crate::process::{run_cmd, Run};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Builder for `witch <craft> [OPTIONS] -- PROGRAM [ARGS...]`.
pub struct WitchCmd {
    craft: String,
    opts: Vec<OsString>,
    stdin: Option<Vec<u8>>,
    wrapper: Vec<OsString>,
    witch: PathBuf,
}

impl WitchCmd {
    pub fn new(craft: &str) -> WitchCmd {
        WitchCmd { craft: craft.into(), opts: vec![], stdin: None, wrapper: vec![], witch: witch_bin() }
    }
    /// Use another witch binary (e.g. a copy readable by an unprivileged user).
    pub fn witch(mut self, path: &Path) -> Self {
        self.witch = path.to_path_buf();
        self
    }
    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.opts.push(a.as_ref().to_os_string());
        self
    }
    pub fn args<S: AsRef<OsStr>>(mut self, args: &[S]) -> Self {
        self.opts.extend(args.iter().map(|a| a.as_ref().to_os_string()));
        self
    }
    /// `-o FILE`.
    pub fn out(self, path: &Path) -> Self {
        self.arg("-o").arg(path)
    }
    pub fn stdin(mut self, bytes: &[u8]) -> Self {
        self.stdin = Some(bytes.to_vec());
        self
    }
    /// Run witch as nobody (see [`crate::Nobody`]).
    pub fn nobody(self, n: &crate::Nobody) -> Self {
        self.witch(&n.witch).wrapper(&n.wrapper)
    }
    /// Run witch under a wrapper command, e.g. `setpriv ... --`.
    pub fn wrapper<S: AsRef<OsStr>>(mut self, prefix: &[S]) -> Self {
        self.wrapper = prefix.iter().map(|a| a.as_ref().to_os_string()).collect();
        self
    }
    pub fn run(self, program: &Path, args: &[&str]) -> Run {
        let mut cmd = if let Some((first, rest)) = self.wrapper.split_first() {
            let mut c = Command::new(first);
            c.args(rest).arg(&self.witch);
            c
        } else {
            Command::new(&self.witch)
        };
        cmd.arg(&self.craft).args(&self.opts).arg("--").arg(program).args(args);
        let r = run_cmd(cmd, self.stdin.as_deref());
        eprintln!("[witch-tests] {:.2}s: {}", r.elapsed.as_secs_f64(), r.cmdline);
        r
    }
}

/// Run witch with raw arguments (for error cases and subcommands).
pub fn witch_raw<S: AsRef<OsStr>>(args: &[S]) -> Run {
    let mut cmd = Command::new(witch_bin());
    cmd.args(args);
    run_cmd(cmd, None)
}

/// Asserts that a run under witch behaved exactly like the native run:
/// same stdout bytes, same exit status (code or signal).
pub fn assert_same_behaviour(native: &Run, witched: &Run) {
    assert_eq!(
        (native.code(), native.signal()),
        (witched.code(), witched.signal()),
        "exit status under witch differs from the native run\nnative:\n{}\nwitch:\n{}",
        native.describe(),
        witched.describe()
    );
    assert!(
        native.stdout == witched.stdout,
        "stdout under witch differs from the native run\nnative:\n{}\nwitch:\n{}",
        native.describe(),
        witched.describe()
    );
}

/// The build-and-run most tests share: run `prog ARGS` natively (it must exit
/// 3, as the test programs do), then under `witch CRAFT OPTS -q -o DIR/TAG.json`;
/// check that witch changed nothing, and load the report, which must be of
/// CRAFT and rest on at least 200 samples.
pub fn craft_run(
    craft: &str,
    prog: &crate::Program,
    dir: &crate::Scratch,
    tag: &str,
    args: &[&str],
    opts: &[&str],
) -> (Run, crate::Report) {
    let native = prog.run_native(args);
    assert_eq!(native.code(), Some(3), "native run:\n{}", native.describe());
    let out = dir.join(&format!("{tag}.json"));
    let run = WitchCmd::new(craft).args(opts).arg("-q").out(&out).run(&prog.exe, args);
    assert_same_behaviour(&native, &run);
    let rep = crate::report(&out);
    assert_eq!(rep.craft(), craft, "{}", rep.dump());
    rep.assert_samples(200.0);
    (run, rep)
}
