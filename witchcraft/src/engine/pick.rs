//! A burst's picks: how many it may hold, how it picks them among the
//! accesses it steps through (reservoirs, by access or by bytes), and what
//! became of each (see [`super::burst`]; what each stands for is
//! [`super::settings::BurstWeight`]).

use crate::craft::{Verdict, Watched};
use crate::x86::decode::Access;
use rand::{rngs::SmallRng, RngExt};

/// Most accesses a burst picks (more than the debug registers: a long
/// burst judges many of its picks itself, when their next access comes
/// within it).
pub const MAX_PICKS: usize = 8;

/// The picked access and what became of it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Candidate {
    /// Which of the burst's accesses it is (1 for the first).
    pub(super) id: u64,
    /// Its bytes.
    pub(super) len: u64,
    /// C_watch
    pub(super) ctx: u32,
    /// The watched piece (as a debug register would watch it).
    pub(super) waddr: u64,
    pub(super) wlen: u64,
    pub(super) watched: Watched,
    /// Its bytes are read after its instruction ran (a store's value).
    pub(super) snapshot_after: bool,
    /// Its next access, to be judged after that instruction ran.
    pub(super) trap_after: Option<(Access, u32)>,
    /// Judged within the burst: the verdict and C_trap.
    pub(super) verdict: Option<(Verdict, u32)>,
    /// Accesses the craft ignored (LoadCraft: stores).
    pub(super) ignored: u32,
    /// Given up (too many ignored accesses).
    pub(super) dropped: bool,
}

/// Which of the `m` reservoirs take the access just counted, the `seen`th
/// of the burst, of `len` bytes (`bytes`: the bytes counted so far, its
/// own included). By access: one reservoir of `m` without replacement, so
/// each of the K accesses ends in it with probability m/K. By bytes: `m`
/// reservoirs of one, each ending with an access with probability its
/// bytes over the burst's B (two may hold the same access).
pub(super) fn reservoirs_taking(rng: &mut SmallRng, by_bytes: bool, m: u64, seen: u64, bytes: u64, len: u64) -> [bool; MAX_PICKS] {
    let mut slots = [false; MAX_PICKS];
    if by_bytes {
        for slot in slots.iter_mut().take(m as usize) {
            *slot = rng.random_range(0..bytes) < len;
        }
    } else {
        let k = if seen <= m { seen - 1 } else { rng.random_range(0..seen) };
        if k < m {
            slots[k as usize] = true;
        }
    }
    slots
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// Run the reservoirs over one burst's accesses of `lens` bytes, many
    /// times: how often each access ends in reservoir 0, and in any.
    fn ends(by_bytes: bool, m: u64, lens: &[u64], trials: u32) -> (Vec<f64>, Vec<f64>) {
        let mut rng = SmallRng::seed_from_u64(7);
        let (mut first, mut any) = (vec![0.0; lens.len()], vec![0.0; lens.len()]);
        for _ in 0..trials {
            let mut held = [usize::MAX; MAX_PICKS];
            let mut bytes = 0;
            for (i, &len) in lens.iter().enumerate() {
                bytes += len;
                for (k, on) in reservoirs_taking(&mut rng, by_bytes, m, i as u64 + 1, bytes, len).into_iter().enumerate() {
                    if on {
                        held[k] = i;
                    }
                }
            }
            first[held[0]] += 1.0 / trials as f64;
            for (i, p) in any.iter_mut().enumerate() {
                if held[..m as usize].contains(&i) {
                    *p += 1.0 / trials as f64;
                }
            }
        }
        (first, any)
    }

    #[test]
    fn by_bytes_each_reservoir_holds_an_access_in_proportion_to_its_bytes() {
        let lens = [1, 8, 1, 32, 4, 8, 1, 9];
        let total: u64 = lens.iter().sum();
        let (first, _) = ends(true, 2, &lens, 200_000);
        for (i, &len) in lens.iter().enumerate() {
            let want = len as f64 / total as f64;
            assert!((first[i] - want).abs() < 0.005, "access {i}: {} vs {want}", first[i]);
        }
    }

    #[test]
    fn by_access_each_access_ends_in_the_reservoir_alike() {
        let lens = [1, 8, 1, 32, 4, 8, 1, 9];
        let (_, any) = ends(false, 2, &lens, 200_000);
        for (i, p) in any.iter().enumerate() {
            assert!((p - 2.0 / 8.0).abs() < 0.005, "access {i}: {p}");
        }
    }
}
