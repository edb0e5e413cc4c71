//! `witch CRAFT --exact PROGRAM`: single-step the program under ptrace and
//! judge every access (the reference the sampled modes are measured against).

use super::output::Output;
use crate::cli::RunArgs;
use crate::render::Format;
use anyhow::Result;
use std::ffi::OsString;
use std::path::Path;
use witchcraft::profile::Craft;

pub fn run(craft: Craft, a: &RunArgs, prog: &Path, program: &OsString, out: &Output) -> Result<i32> {
    out.probe()?;
    if !a.quiet {
        crate::say!("witch: exact mode single-steps every instruction; expect it to run thousands of times slower");
    }
    let exact = witchcraft::exact::Exact::new(craft, a.fp_precision).with_inherited(super::launch::inherited());
    let env: Vec<(String, String)> = crate::agent::tunables().map(|t| ("GLIBC_TUNABLES".to_string(), t)).into_iter().collect();
    // On a terminal, a line that says it is alive: an exact run takes long.
    let stepped = exact.stepped();
    let progress = (!a.quiet).then(|| {
        super::launch::Progress::every_second(1.0, move |secs| {
            let n = stepped.load(std::sync::atomic::Ordering::Relaxed);
            format!("witch: exact, {n} instructions single-stepped in {secs:.0} s")
        })
    });
    let run = exact.run(prog, &a.command[1..], program, &env).map_err(|e| anyhow::anyhow!("cannot trace {}: {e}", prog.display()));
    drop(progress);
    let run = run?;
    let pid = run.profile.pid;
    let path = out.path(craft, prog, pid);
    out.save(&run.profile, &path)?;
    if !a.quiet {
        match a.format() {
            Format::Text => crate::say_raw!("{}", super::report::render(&run.profile, a.top, a.pairs, a.objects, Format::Text, None)?),
            Format::Json => {
                crate::print(&super::report::render(&run.profile, a.top, a.pairs, a.objects, Format::Json, Some(path.as_path()))?)?
            }
        }
        crate::say!("witch: {} instructions single-stepped; profile written to {}", run.instructions, path.display());
    }
    Ok(super::launch::pass_through(run.code, run.signal))
}

/// `--exact=cache`: the program runs under the agent in its recording
/// mode and writes every access record into rings it shares with witch
/// (`witchcraft::exact::ring`); a reader thread takes each ring's notices
/// and judges its chunks as they come, or hands them to another judging
/// thread (`witchcraft::exact::Judges`: each recording thread's records
/// on one judge; the shadow memory lives in witch, not in the program).
pub struct Recording {
    theirs: i32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    reader: std::thread::JoinHandle<Judgements>,
    started: std::time::Instant,
}

/// What the judges judged, to go into the profile.
pub struct Judged {
    judged: Judgements,
    /// The recording's wall time.
    wall: std::time::Duration,
}

use witchcraft::exact::{stream::MAX_DATAGRAM, Judgements, Judges};
use witchcraft::sys::fd as fds;

/// How many judging threads a recording gets: `WITCH_JUDGES`, else one
/// per processor (at most 8).
fn judges_wanted() -> Result<usize> {
    match std::env::var("WITCH_JUDGES") {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n @ 1..=64) => Ok(n),
            _ => anyhow::bail!("WITCH_JUDGES={v:?}: expected a number of judging threads from 1 to 64"),
        },
        Err(_) => Ok(witchcraft::exact::default_judges()),
    }
}

impl Recording {
    pub fn start(craft: Craft, precision: f64) -> Result<Recording> {
        let n = judges_wanted()?;
        let (ours, theirs) = fds::seqpacket_pair().map_err(|e| anyhow::anyhow!("cannot make the record socket: {e}"))?;
        // The program's end: out of the program's descriptor range, and
        // kept across its exec.
        fds::reserve_top();
        let theirs = fds::place(theirs).map_err(|e| anyhow::anyhow!("cannot place the record socket (errno {e})"))?;
        fds::inherit(theirs);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        let reader = std::thread::Builder::new()
            .name("witch-judge".into())
            .spawn(move || {
                let mut judges = Judges::new(craft, precision, n);
                let mut buf = vec![0u8; MAX_DATAGRAM];
                loop {
                    match fds::recv_datagram_fd(ours, &mut buf, 100) {
                        Ok(Some((0, None))) | Err(_) => break,
                        Ok(Some((n, passed))) => judges.take_notice(&buf[..n], passed),
                        // Nothing for a while: done once the program is.
                        Ok(None) if stopping.load(std::sync::atomic::Ordering::Acquire) => break,
                        Ok(None) => {}
                    }
                }
                fds::close(ours);
                judges.finish(witchcraft::sys::task::thread_cpu_ns())
            })
            .map_err(|e| anyhow::anyhow!("cannot start the judging thread: {e}"))?;
        Ok(Recording { theirs, stop, reader, started: std::time::Instant::now() })
    }

    /// The descriptor the program sends on.
    pub fn program_fd(&self) -> i32 {
        self.theirs
    }

    /// The program has its copy of the descriptor: witch's goes, so the
    /// reader sees the end when every process of the program has ended.
    pub fn spawned(&mut self) {
        fds::close(self.theirs);
    }

    /// The program ended: judge what is left and stop.
    pub fn finish(self) -> Judged {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        let judged = self.reader.join().unwrap_or_else(|_| Judges::new(Craft::Dead, 0.0, 1).finish(0));
        Judged { judged, wall: self.started.elapsed() }
    }
}

/// A [`witchcraft::exact::JudgedImage`] as profile parts: the instructions
/// and records judged, the threads and the counters.
type ImageParts = (u64, u64, Vec<witchcraft::profile::Thread>, witchcraft::profile::Counters);

/// The judged records of each process image, by pid: a process that
/// execs has one section, and one image number, per image.
#[derive(Default)]
struct Images(std::collections::HashMap<u32, Vec<(u32, ImageParts)>>);

impl Images {
    /// The judged records of the section of process `pid` that started at
    /// `start_unix_ns`: those of the image of that number (a fork child's
    /// is its own: its engine restarts at the fork).
    fn take(&mut self, pid: u32, start_unix_ns: u64) -> Option<ImageParts> {
        let left = self.0.get_mut(&pid)?;
        let at = left.iter().position(|(image, _)| *image == start_unix_ns as u32)?;
        Some(left.swap_remove(at).1)
    }
}

impl Judged {
    /// Put the judged pairs into the profile (and each process's of it):
    /// its threads are the judge's, its sampler says every access was
    /// judged, so `report`, `diff` and `gate` treat it as a count.
    pub fn apply(self, run: &mut witchcraft::profile::Profile) {
        let malformed = self.judged.malformed();
        let total = self.judged.records();
        let (judges, (cpu_ns, busiest_ns)) = (self.judged.judges.len(), self.judged.cpu_ns());
        let mut images = Images::default();
        for j in self.judged.into_processes() {
            let (threads, counters) = witchcraft::exact::thread_profiles(j.threads.iter().map(|(t, s)| (*t, s)));
            images.0.entry(j.pid as u32).or_default().push((j.image, (j.instructions, j.records, threads, counters)));
        }
        let mut one = |p: &mut witchcraft::profile::Profile| {
            let (n, records, threads, mut counters) = images.take(p.pid, p.start_unix_ns).unwrap_or_default();
            counters.interrupts = n;
            counters.threads = p.counters.threads;
            counters.keep_code_cache(&p.counters);
            p.threads = threads;
            p.counters = counters;
            p.sampler = witchcraft::exact::exact_sampler("code-cache");
            p.notes.push(format!("exact from the code cache: {records} access records judged, of {n} instructions"));
            if malformed > 0 {
                p.notes.push(format!("{malformed} record datagrams were malformed (a witch bug)"));
            }
        };
        one(run);
        for p in &mut run.processes {
            one(p);
        }
        run.notes.push(judge_note(cpu_ns, busiest_ns, judges, total, self.wall));
    }
}

/// What judging cost: the judges' CPU time, per record, and the busiest
/// judge's share of the recording's wall time (near 100%: the program's
/// threads waited for that judge, which set the run's pace).
fn judge_note(cpu_ns: u64, busiest_ns: u64, judges: usize, records: u64, wall: std::time::Duration) -> String {
    let cpu = cpu_ns as f64 / 1e9;
    let per = if records > 0 { format!(", {:.1} ns a record", cpu_ns as f64 / records as f64) } else { String::new() };
    let share = if wall.as_secs_f64() > 0.0 {
        let who = if judges > 1 { "the busiest judge " } else { "" };
        format!(", {who}busy {:.0}% of the run's {:.3} s", 100.0 * busiest_ns as f64 / 1e9 / wall.as_secs_f64(), wall.as_secs_f64())
    } else {
        String::new()
    };
    let threads = if judges == 1 { "one thread".to_string() } else { format!("{judges} threads") };
    format!("exact from the code cache: the judge took {cpu:.3} s of CPU time ({threads}){per}{share}")
}
