//! Will the dynamic loader load witch's agent into a program? The
//! launcher asks before a run (and refuses a program it would not), and
//! the agent asks at each `exec` in a run: an image it cannot enter runs
//! unprofiled, and the exec'ing process's profile says so ([`UNPROFILED`]),
//! so that the report can tell the reader what the run left out.

use object::read::elf::{FileHeader, ProgramHeader};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// What a program's first bytes say it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Image {
    /// An x86-64 ELF program with a dynamic loader (`PT_INTERP`): the
    /// loader preloads the agent.
    Dynamic,
    /// An x86-64 ELF program without one (statically linked, static-pie
    /// included): no loader, no agent.
    Static,
    /// A `#!` script: its interpreter is what runs.
    Script,
    /// A 64-bit ELF file for another machine.
    OtherMachine,
    /// An ELF file that is not 64-bit (or whose header is cut short).
    NotElf64,
    /// Not an ELF file.
    NotElf,
    /// An ELF header whose program headers lie past the bytes given.
    Truncated,
}

/// The bytes of a program's start that [`Image::of_head`] is given: its
/// headers, wherever a linker puts them in practice.
pub const HEAD_BYTES: u64 = 64 << 10;

impl Image {
    /// What `head`, a program's first bytes, says it is.
    pub fn of_head(head: &[u8]) -> Image {
        if head.starts_with(b"#!") {
            return Image::Script;
        }
        let Ok(elf) = object::elf::FileHeader64::<object::Endianness>::parse(head) else {
            return if head.starts_with(b"\x7fELF") { Image::NotElf64 } else { Image::NotElf };
        };
        let Ok(endian) = elf.endian() else { return Image::OtherMachine };
        if elf.e_machine(endian) != object::elf::EM_X86_64 {
            return Image::OtherMachine;
        }
        let end = elf.e_phoff(endian).saturating_add(elf.e_phnum(endian) as u64 * elf.e_phentsize(endian) as u64);
        if end > head.len() as u64 {
            return Image::Truncated;
        }
        match elf.program_headers(endian, head) {
            Ok(phdrs) if phdrs.iter().any(|p| p.p_type(endian) == object::elf::PT_INTERP) => Image::Dynamic,
            Ok(_) => Image::Static,
            Err(_) => Image::Truncated,
        }
    }

    /// What the program at `path` is, from its first [`HEAD_BYTES`].
    pub fn of_file(path: &Path) -> std::io::Result<Image> {
        Ok(Image::of_head(&head(path)?))
    }
}

/// The first [`HEAD_BYTES`] of the file at `path`.
fn head(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::new();
    std::fs::File::open(path)?.take(HEAD_BYTES).read_to_end(&mut head)?;
    Ok(head)
}

/// The interpreter a `#!` script names on its first line (None: not a
/// script, or no path there). The kernel reads that line as the path, then
/// at most one argument.
pub fn interpreter(head: &[u8]) -> Option<PathBuf> {
    let line = head.strip_prefix(b"#!")?.split(|&b| b == b'\n').next()?;
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let start = line.iter().position(|b| !blank(b))?;
    let path = line[start..].split(blank).next().filter(|p| !p.is_empty())?;
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(path)))
}

/// How many interpreters deep a script may go (the kernel's own limit is
/// about as small).
const SCRIPT_DEPTH: u32 = 4;

/// Does running `path` put the loader in secure-execution mode, where it
/// ignores `LD_PRELOAD`: set-user-ID or set-group-ID to someone other than
/// the caller (the kernel ignores the bits on a script), or file
/// capabilities? What it is, if so ("set-user-ID (to uid 0)").
pub fn secure_execution(path: &Path) -> Option<String> {
    let mut head = [0u8; 2];
    if std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut head)).is_ok() && &head == b"#!" {
        return None;
    }
    secure_bits(path)
}

/// [`secure_execution`] of a program known not to be a script.
fn secure_bits(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    // SAFETY: plain getters.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if m.mode() & libc::S_ISUID != 0 && m.uid() != euid {
        Some(format!("set-user-ID (to uid {})", m.uid()))
    } else if m.mode() & libc::S_ISGID != 0 && m.gid() != egid {
        Some(format!("set-group-ID (to gid {})", m.gid()))
    } else if euid != 0 && has_file_capabilities(path) {
        Some("given capabilities by its file (setcap)".into())
    } else {
        None
    }
}

fn has_file_capabilities(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else { return false };
    // SAFETY: a size query (no buffer) of one attribute of a NUL-terminated path.
    unsafe { libc::getxattr(c.as_ptr(), c"security.capability".as_ptr(), std::ptr::null_mut(), 0) > 0 }
}

/// What every note of an image exec'd in a run and left unprofiled says
/// (the report gathers them from the run's processes).
pub const UNPROFILED: &str = "runs unprofiled";

/// Why the program at `path` (named `shown` in the note), exec'd by
/// process `pid` with environment `env` (its `NAME=value` entries), will
/// run without witch's agent (`agent`: the
/// agent's file name, as `LD_PRELOAD` names it): the note its exec'ing
/// process's profile carries. None if the agent will load, or if that
/// cannot be told (a file that cannot be read: the exec fails too).
pub fn unprofiled_exec<'a>(pid: u32, path: &Path, shown: &Path, env: impl IntoIterator<Item = &'a [u8]>, agent: &[u8]) -> Option<String> {
    let env: Vec<&[u8]> = env.into_iter().collect();
    let why = why_unprofiled(path, &env, agent, 0)?;
    Some(format!("process {pid} exec'd {}, which {UNPROFILED}: {why}", shown.display()))
}

/// Why the program at `path` will run without the agent (see
/// [`unprofiled_exec`]); a script for what its interpreter says, `depth`
/// interpreters deep.
fn why_unprofiled(path: &Path, env: &[&[u8]], agent: &[u8], depth: u32) -> Option<String> {
    let head = head(path).ok()?;
    Some(match Image::of_head(&head) {
        Image::Static => "statically linked (the agent loads only into dynamically linked programs)".to_string(),
        Image::Dynamic => match secure_bits(path) {
            Some(what) => format!("{what} (the loader ignores LD_PRELOAD for it)"),
            None if !preloads(env.iter().copied(), agent) => "its environment leaves out witch's agent (LD_PRELOAD)".to_string(),
            None => return None,
        },
        Image::OtherMachine | Image::NotElf64 => "not a 64-bit x86-64 program (the agent is one)".to_string(),
        Image::Script if depth < SCRIPT_DEPTH => {
            let interp = interpreter(&head)?;
            let why = why_unprofiled(&interp, env, agent, depth + 1)?;
            format!("a script run by {}, {why}", interp.display())
        }
        Image::Script | Image::NotElf | Image::Truncated => return None,
    })
}

/// Does environment `env` preload `agent` (a file name) and carry witch's
/// settings?
fn preloads<'a>(env: impl IntoIterator<Item = &'a [u8]>, agent: &[u8]) -> bool {
    let (mut preload, mut settings) = (false, false);
    for e in env {
        if let Some(v) = e.strip_prefix(b"LD_PRELOAD=") {
            preload = v.split(|&b| b == b' ' || b == b':').any(|p| p.ends_with(agent));
        } else if e.starts_with(crate::config::keys::CRAFT.as_bytes()) && e.get(crate::config::keys::CRAFT.len()) == Some(&b'=') {
            settings = true;
        }
    }
    preload && settings
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(v: &[&str]) -> Vec<Vec<u8>> {
        v.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn programs_are_told_apart_by_their_headers() {
        let me = std::env::current_exe().unwrap();
        assert_eq!(Image::of_file(&me).unwrap(), Image::Dynamic, "the test binary itself");
        assert_eq!(Image::of_head(b"#!/bin/sh\n"), Image::Script);
        assert_eq!(interpreter(b"#!/bin/sh\n"), Some(PathBuf::from("/bin/sh")));
        assert_eq!(interpreter(b"#! \t/usr/bin/env python3\nprint()"), Some(PathBuf::from("/usr/bin/env")));
        assert_eq!(interpreter(b"#!\n"), None);
        assert_eq!(interpreter(b"\x7fELF"), None);
        assert_eq!(Image::of_head(b"hello"), Image::NotElf);
        assert_eq!(Image::of_head(b"\x7fELF\x01"), Image::NotElf64);
        // The test binary's header with its program headers cut off.
        let mut head = Vec::new();
        std::fs::File::open(&me).unwrap().take(80).read_to_end(&mut head).unwrap();
        assert_eq!(Image::of_head(&head), Image::Truncated);
        // Its PT_INTERP entry (type 3) made a PT_NULL: a static program.
        let mut whole = Vec::new();
        std::fs::File::open(&me).unwrap().take(HEAD_BYTES).read_to_end(&mut whole).unwrap();
        let phoff = u64::from_le_bytes(whole[32..40].try_into().unwrap()) as usize;
        let (phentsize, phnum) = (u16::from_le_bytes([whole[54], whole[55]]) as usize, u16::from_le_bytes([whole[56], whole[57]]) as usize);
        for i in 0..phnum {
            let at = phoff + i * phentsize;
            if u32::from_le_bytes(whole[at..at + 4].try_into().unwrap()) == 3 {
                whole[at..at + 4].copy_from_slice(&0u32.to_le_bytes());
            }
        }
        assert_eq!(Image::of_head(&whole), Image::Static);
    }

    #[test]
    fn an_exec_is_unprofiled_without_the_agent_in_its_environment() {
        let me = std::env::current_exe().unwrap();
        let agent = b"libwitch_agent.so";
        let with = env(&["PATH=/bin", "LD_PRELOAD=/x/libwitch_agent.so /y/other.so", "WITCH_CRAFT=dead"]);
        assert_eq!(unprofiled_exec(7, &me, &me, with.iter().map(Vec::as_slice), agent), None);
        for without in [
            env(&["PATH=/bin"]),
            env(&["LD_PRELOAD=/y/other.so", "WITCH_CRAFT=dead"]),
            env(&["LD_PRELOAD=/x/libwitch_agent.so", "WITCH_CRAFTY=1"]),
        ] {
            let note = unprofiled_exec(7, &me, &me, without.iter().map(Vec::as_slice), agent).expect("a note");
            assert!(note.starts_with("process 7 exec'd /") && note.contains(UNPROFILED) && note.contains("LD_PRELOAD"), "{note}");
        }
        // A script says what its interpreter would.
        let dir = std::env::temp_dir().join(format!("witch-loadable-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("run.sh");
        std::fs::write(&script, format!("#!  {} -x\necho hi\n", me.display())).unwrap();
        let none = env(&["PATH=/bin"]);
        let note = unprofiled_exec(7, &script, &script, none.iter().map(Vec::as_slice), agent).expect("a note");
        assert!(note.contains(&format!("which runs unprofiled: a script run by {}, its environment leaves out", me.display())), "{note}");
        assert_eq!(unprofiled_exec(7, &script, &script, with.iter().map(Vec::as_slice), agent), None);
        // A script for a script for itself ends, saying nothing.
        std::fs::write(&script, format!("#!{}\n", script.display())).unwrap();
        assert_eq!(unprofiled_exec(7, &script, &script, none.iter().map(Vec::as_slice), agent), None);
        std::fs::remove_dir_all(&dir).ok();
        // A file that cannot be read says nothing (the exec fails too).
        assert_eq!(unprofiled_exec(7, Path::new("/nonexistent/x"), Path::new("/nonexistent/x"), std::iter::empty(), agent), None);
    }
}
