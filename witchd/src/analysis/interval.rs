//! Confidence intervals for the report's ratios.
//!
//! Every figure the report gives as a fraction is a ratio of sums over
//! watchpoint traps: the waste fraction W/(W+U), a pair's own fraction, a
//! pair's or a line's share of all waste. Each trap credits some amount
//! `c_i` either to waste or to use. For a ratio R = Σx_i / Σy_i over traps,
//! the linearized (delta-method) variance of the ratio estimator is
//!
//!   Var(R) ≈ Σ (x_i − R·y_i)² / (Σy_i)²
//!
//! and since each trap is either waste or use, for the waste fraction
//! (x_i = c_i for waste traps, 0 for use traps; y_i = c_i for all) this is
//!
//!   Var(R) ≈ ((1−R)²·S_waste + R²·S_use) / Y²
//!
//! with S the sums of squared per-trap credits the profile keeps beside each
//! sum (`waste_sq`, `approx_waste_sq`, `use_sq`). A share of waste is the
//! same form with "this pair's waste" for waste and "other waste" for use.
//! The interval is R ± 1.96·√Var, clipped to [0, 1]: a normal approximation,
//! fair when many traps carry the figure and optimistic when few do, which is
//! why pairs resting on fewer than [`FEW_TRAPS`] traps are marked. When every
//! trap fell on one side (all waste, or none) that variance is 0, so there
//! the interval is Wilson's score interval at the effective number of traps
//! instead, which is never of zero width; and where one side rests on a few
//! small credits (fewer than [`FEW_TRAPS`] effective draws), the interval
//! joins Wilson's, since those few credits would otherwise set its width.
//!
//! Traps are not independent, though: a software burst picks up to eight
//! accesses from the same few instructions, with one weight, and they are
//! judged together. So the profile also keeps the credits summed per
//! cluster (the traps a thread credited between two sampler interrupts,
//! see `witchcraft::profile::Clustered`): per pair, and per thread over
//! all its pairs. Where it has them the variance takes clusters as the
//! units, with x_b and y_b a cluster's waste and use:
//!
//!   Var(R) ≈ Σ_b ((1−R)·x_b − R·y_b)² / Y²
//!          = ((1−R)²·Σx_b² − 2R(1−R)·Σx_b·y_b + R²·Σy_b²) / Y²
//!
//! with the small-sample corrections of a variance over g clusters,
//! g/(g−1) and Student's t at g−1 degrees of freedom (a run of 0.6 s gets
//! 20 to 100 clusters here). The whole run's and each process's waste
//! fraction use the threads' sums, which are exact. A pair's figures use
//! its own. A line (or pairs merged across processes) adds its pairs'
//! sums, and a share of waste counts the rest of the waste the same way
//! (the sum over the other pairs), which leaves out what two pairs share
//! within one cluster on both sides, as the per-trap sums leave out what
//! two traps share. (Taking the rest as the run's exact sums less the
//! part's put those shared terms all on the rest: a line holding all the
//! waste read 67–100%. Widening every pair by the run's design effect
//! instead read 0–61% for a pair whose share stayed within 27–31% over six
//! runs.) Measured on six real programs: the run-to-run spread was 1.3
//! times the per-trap standard error at the median case and up to 2
//! times; see the accuracy document.
//!
//! An exact profile (`witch CRAFT --exact`, every access judged) is a
//! count, not a sample: its sums are marked [`Sums::exhaustive`], and its
//! figures carry no interval (zero width, standard error 0), so a gate or
//! a diff between exact runs decides on the counts themselves.
//!
//! Profiles written before the sums of squares existed have them at 0; for
//! those each trap of a pair is taken to weigh the same (the pair's total
//! over its traps), which makes the waste fraction's variance the binomial
//! R(1−R)/n over n traps of equal weight.

use witchcraft::profile::Clustered;

/// Fewer traps than this make a figure too uncertain to lean on.
pub const FEW_TRAPS: u64 = 10;

/// Fewer judged samples than this and the report says the whole run's waste
/// fraction rests on too few to rely on (where a normal interval stops being
/// fair).
pub const FEW_JUDGED: u64 = 30;

/// The z value of a two-sided 95% normal interval.
const Z95: f64 = 1.959_963_984_540_054;

/// Sums over a set of traps: amounts and their squares, and the trap count.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sums {
    /// Waste, exact plus approximate.
    pub waste: f64,
    pub waste_sq: f64,
    pub r#use: f64,
    pub use_sq: f64,
    pub traps: u64,
    /// The same credits per cluster, summed over the set's pairs; empty
    /// for profiles without them.
    pub cluster: Clustered,
    /// A run's or a process's total only: its threads' own sums per
    /// cluster (exact, where `cluster` leaves out what pairs share).
    pub run: Clustered,
    /// Every credit came from an exhaustive count (the exact mode): the
    /// figures are counts, with no sampling error.
    pub exhaustive: bool,
}

impl Sums {
    /// The sums of one raw pair; squares are filled in by the equal-weight
    /// rule when the profile has none.
    pub fn of_pair(p: &witchcraft::profile::Pair) -> Sums {
        let waste = p.waste + p.approx_waste;
        let (mut waste_sq, mut use_sq) = (p.waste_sq + p.approx_waste_sq, p.use_sq);
        if waste_sq == 0.0 && use_sq == 0.0 && waste + p.r#use > 0.0 {
            // One weight per trap: the pair's total over its traps.
            let c = (waste + p.r#use) / p.traps.max(1) as f64;
            waste_sq = waste * c;
            use_sq = p.r#use * c;
        }
        Sums { waste, waste_sq, r#use: p.r#use, use_sq, traps: p.traps, cluster: p.cluster, ..Sums::default() }
    }

    /// The same sums, marked as an exhaustive count or not.
    pub fn counted(self, exhaustive: bool) -> Sums {
        Sums { exhaustive, ..self }
    }

    /// Nothing added yet.
    fn is_empty(&self) -> bool {
        self.traps == 0 && self.waste == 0.0 && self.r#use == 0.0 && self.cluster.is_empty() && self.run.is_empty()
    }

    pub fn add(&mut self, o: &Sums) {
        // Exhaustive only if every part is (an empty start takes the first
        // part's kind).
        self.exhaustive = if self.is_empty() { o.exhaustive } else { self.exhaustive && o.exhaustive };
        self.waste += o.waste;
        self.waste_sq += o.waste_sq;
        self.r#use += o.r#use;
        self.use_sq += o.use_sq;
        self.traps += o.traps;
        self.cluster.add(&o.cluster);
        self.run.add(&o.run);
    }

    /// waste / (waste + use) and its 95% interval.
    pub fn fraction(&self) -> Estimate {
        if self.exhaustive {
            return Estimate::counted(ratio(self.waste, 0.0, self.r#use, 0.0).value, self.waste + self.r#use);
        }
        let c = if self.run.is_empty() { &self.cluster } else { &self.run };
        let (e, waste_sq, use_sq, all_sq) = if c.is_empty() {
            let e = ratio(self.waste, self.waste_sq, self.r#use, self.use_sq);
            (e, self.waste_sq, self.use_sq, self.waste_sq + self.use_sq)
        } else {
            let e = few_clusters(clustered_ratio(self.waste, c.waste_sq, self.r#use, c.use_sq, c.waste_use), c.clusters);
            (e, c.waste_sq, c.use_sq, c.waste_sq + c.use_sq + 2.0 * c.waste_use)
        };
        // Near 0 or 1, when the short side rests on a few draws (Kish's
        // effective number, (Σx)²/Σx², under FEW_TRAPS), its few credits set
        // the linearized variance: 98 waste traps and two small use traps
        // read 99.97–100%. Join Wilson's interval at the effective number of
        // all draws then, as shares do. Only then: with many draws on both
        // sides the two intervals nearly agree, but where the sides' weights
        // differ Wilson's is a little wider (a gate's 74.2–75.8% read
        // 74.1–75.9%), and the linearized one is the better there.
        let short = |x: f64, x_sq: f64| x > 0.0 && x_sq > 0.0 && x * x / x_sq < FEW_TRAPS as f64;
        let y = self.waste + self.r#use;
        if self.waste > 0.0 && self.r#use > 0.0 && all_sq > 0.0 && (short(self.waste, waste_sq) || short(self.r#use, use_sq)) {
            return e.joined_with_wilson(y * y / all_sq);
        }
        e
    }

    /// This set's share of the waste in `all` (a superset), and its 95% interval.
    pub fn share_of(&self, all: &Sums) -> Estimate {
        if self.exhaustive && all.exhaustive {
            return Estimate::counted(if all.waste > 0.0 { self.waste / all.waste } else { 0.0 }, all.waste);
        }
        // What is left of `all`: nothing when it is no more than rounding
        // (the same credits added up in another order), so that a set
        // holding all the waste gets the one-sided interval.
        let rest = |a: f64, b: f64| if a - b <= 1e-9 * a { 0.0 } else { a - b };
        let others = rest(all.waste, self.waste);
        let (a_sq, all_sq) = if self.cluster.is_empty() || all.cluster.is_empty() {
            (self.waste_sq, all.waste_sq)
        } else {
            (self.cluster.waste_sq, all.cluster.waste_sq)
        };
        let others_sq = if others == 0.0 { 0.0 } else { rest(all_sq, a_sq) };
        let mut e = ratio(self.waste, a_sq, others, others_sq);
        // Near 0 or 1 the linearized variance shrinks with the few small
        // credits on the short side (a line with 99.99% of the waste, the
        // rest two small traps, read 99.97–100%): join Wilson's interval at
        // the effective number of waste draws, (Σw)² / Σw², which keeps the
        // width that many draws allow. Inside, the two nearly agree.
        if all_sq > 0.0 && all.waste > 0.0 {
            e = e.joined_with_wilson(all.waste * all.waste / all_sq);
        }
        if self.cluster.is_empty() || all.cluster.is_empty() {
            return e;
        }
        few_clusters(e, if all.run.is_empty() { all.cluster.clusters } else { all.run.clusters })
    }

    /// Every sum a fraction or share is made of is a finite number (a
    /// profile whose figures are each finite may still sum past what a
    /// number holds: its figures cannot be computed).
    pub fn finite(&self) -> bool {
        let c = |c: &Clustered| [c.waste_sq, c.use_sq, c.waste_use];
        [self.waste, self.waste_sq, self.r#use, self.use_sq].into_iter().chain(c(&self.cluster)).chain(c(&self.run)).all(f64::is_finite)
    }

    /// Too few traps carry the figure to lean on (never for a count).
    pub fn few(&self) -> bool {
        !self.exhaustive && self.traps < FEW_TRAPS
    }
}

/// A ratio, its standard error and its 95% interval (clipped to [0, 1] for ratios).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Estimate {
    pub value: f64,
    pub se: f64,
    pub lo: f64,
    pub hi: f64,
    /// A count, not an estimate: see [`Estimate::is_exact`].
    exact: bool,
}

impl Estimate {
    /// Nothing observed: the ratio could be anything.
    const UNKNOWN: Estimate = Estimate::sampled(0.0, 0.5, 0.0, 1.0);

    /// An estimate from a sample: a value, its standard error and interval.
    const fn sampled(value: f64, se: f64, lo: f64, hi: f64) -> Estimate {
        Estimate { value, se, lo, hi, exact: false }
    }

    /// A counted ratio: no interval. With nothing counted (`of` = 0) the
    /// ratio is unknown, as for a sample.
    fn counted(value: f64, of: f64) -> Estimate {
        if of <= 0.0 {
            return Estimate::UNKNOWN;
        }
        Estimate { value, se: 0.0, lo: value, hi: value, exact: true }
    }

    /// Whether the figure is a count: made of sums marked
    /// [`Sums::exhaustive`] (an exact profile's), or the difference of two
    /// such. Its interval has no width; a sample's may have none too (every
    /// cluster at one ratio), and is still not a count.
    pub fn is_exact(&self) -> bool {
        self.exact
    }

    /// The value and its interval are numbers (not NaN or infinite).
    pub fn finite(&self) -> bool {
        [self.value, self.lo, self.hi].into_iter().all(f64::is_finite)
    }

    /// Half the interval's width before clipping.
    pub fn half_width(&self) -> f64 {
        Z95 * self.se
    }

    /// The standard error the interval was made from.
    pub fn se(&self) -> f64 {
        self.se
    }

    /// Widened to hold Wilson's interval at `n` effective draws (and its
    /// standard error at least that interval's).
    fn joined_with_wilson(self, n: f64) -> Estimate {
        let (lo, hi) = wilson(self.value, n);
        Estimate::sampled(self.value, self.se.max((hi - lo) / (2.0 * Z95)), self.lo.min(lo), self.hi.max(hi))
    }
}

/// R = a / (a + b) where each trap credits either a or b, with the sums of
/// squares of those credits.
pub fn ratio(a: f64, a_sq: f64, b: f64, b_sq: f64) -> Estimate {
    let y = a + b;
    if y <= 0.0 {
        return Estimate::UNKNOWN;
    }
    let r = a / y;
    if (a_sq <= 0.0 || b_sq <= 0.0) && a_sq + b_sq > 0.0 {
        // Every trap on one side: the linearized variance is 0, an interval
        // of no width however few the traps. Wilson's score interval at the
        // effective number of traps (Kish: (Σc)²/Σc², n for equal credits)
        // instead: 0 of 6 gives [0, 39%], 0 of 100 [0, 3.7%].
        let n = y * y / (a_sq + b_sq);
        let (lo, hi) = wilson(r, n);
        return Estimate::sampled(r, (hi - lo) / (2.0 * Z95), lo, hi);
    }
    let se = (((1.0 - r).powi(2) * a_sq + r.powi(2) * b_sq) / (y * y)).max(0.0).sqrt();
    let h = Z95 * se;
    Estimate::sampled(r, se, (r - h).max(0.0), (r + h).min(1.0))
}

/// R = a / (a + b) over clusters: `a_sq`, `b_sq` and `ab` are the sums
/// over clusters of a cluster's a squared, b squared and a times b.
pub fn clustered_ratio(a: f64, a_sq: f64, b: f64, b_sq: f64, ab: f64) -> Estimate {
    let y = a + b;
    if y <= 0.0 {
        return Estimate::UNKNOWN;
    }
    let r = a / y;
    if a <= 0.0 || b <= 0.0 {
        // All on one side: Wilson's interval at the effective number of
        // clusters, (Σc)² / Σc_b².
        let n = y * y / (a_sq + b_sq + 2.0 * ab).max(f64::MIN_POSITIVE);
        let (lo, hi) = wilson(r, n);
        return Estimate::sampled(r, (hi - lo) / (2.0 * Z95), lo, hi);
    }
    let se = clustered_variance(a, a_sq, b, b_sq, ab).sqrt();
    let h = Z95 * se;
    Estimate::sampled(r, se, (r - h).max(0.0), (r + h).min(1.0))
}

/// The linearized variance of a / (a + b) over clusters (see the module
/// comment); a + b must be positive.
fn clustered_variance(a: f64, a_sq: f64, b: f64, b_sq: f64, ab: f64) -> f64 {
    let y = a + b;
    let r = a / y;
    (((1.0 - r).powi(2) * a_sq - 2.0 * r * (1.0 - r) * ab + r.powi(2) * b_sq) / (y * y)).max(0.0)
}

/// The usual small-sample corrections of a variance over `g` clusters
/// (as statistics packages make them for cluster-robust errors): the
/// factor g/(g−1), and Student's t with g−1 degrees of freedom instead of
/// the normal z, both folded into the standard error so that every use of
/// it (the interval, a difference, the gate) carries them. At 20 clusters
/// they widen the interval by 10%, at 100 by 2%.
fn few_clusters(e: Estimate, g: u64) -> Estimate {
    if g < 2 || e.se <= 0.0 {
        return e;
    }
    let f = (g as f64 / (g as f64 - 1.0)).sqrt() * t975(g as f64 - 1.0) / Z95;
    let se = e.se * f;
    let h = Z95 * se;
    Estimate::sampled(e.value, se, (e.value - h).max(0.0).min(e.lo), (e.value + h).min(1.0).max(e.hi))
}

/// Student's t quantile at 0.975 for `df` degrees of freedom: from the
/// table up to 4, then the Cornish-Fisher expansion about the normal
/// quantile (within 0.2% of the table from 5 degrees of freedom up).
fn t975(df: f64) -> f64 {
    const TABLE: [f64; 4] = [12.706, 4.303, 3.182, 2.776];
    if df < 4.5 {
        return TABLE[(df.round().max(1.0) as usize) - 1];
    }
    let z = Z95;
    let (z3, z5, z7) = (z.powi(3), z.powi(5), z.powi(7));
    z + (z3 + z) / (4.0 * df)
        + (5.0 * z5 + 16.0 * z3 + 3.0 * z) / (96.0 * df * df)
        + (3.0 * z7 + 19.0 * z5 + 17.0 * z3 - 15.0 * z) / (384.0 * df * df * df)
}

/// Wilson's 95% score interval for a proportion `p` of `n` trials.
fn wilson(p: f64, n: f64) -> (f64, f64) {
    let z2 = Z95 * Z95;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = Z95 / (1.0 + z2 / n) * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// The difference new − base of two independent estimates of fractions,
/// with its 95% interval; exact when both are.
///
/// A difference of two fractions lies within ±1, and its interval must
/// too: the symmetric d ± 1.96·√(se_b² + se_n²) went past it (a change of
/// −84.6 points read −166.6 to −2.5 where one side rested on a few
/// clusters). Clamping that interval to ±1 would keep a bound that means
/// nothing and still ignore that each side's own interval is lopsided near
/// 0 and 1. So the interval is Newcombe's hybrid ("square-and-add", the
/// MOVER method): it recovers the variance at each bound from the two
/// estimates' own intervals,
///
///   lo = d − √((n − l_n)² + (u_b − b)²),   hi = d + √((u_n − n)² + (b − l_b)²)
///
/// ("Interval estimation for the difference between independent
/// proportions: comparison of eleven methods", Newcombe, Statistics in
/// Medicine 1998). Since √(x² + y²) ≤ x + y, lo ≥ l_n − u_b ≥ −1 and
/// hi ≤ u_n − l_b ≤ 1: within the bounds by construction, as each side's
/// interval is within [0, 1]. Where both intervals are symmetric (far from
/// 0 and 1) it is the usual d ± 1.96·√(se_b² + se_n²).
pub fn difference(base: &Estimate, new: &Estimate) -> Estimate {
    let d = new.value - base.value;
    let se = (base.se.powi(2) + new.se.powi(2)).sqrt();
    let lo = d - ((new.value - new.lo).powi(2) + (base.hi - base.value).powi(2)).sqrt();
    let hi = d + ((new.hi - new.value).powi(2) + (base.value - base.lo).powi(2)).sqrt();
    // Rounding only: the bounds are within ±1 by construction.
    Estimate { value: d, se, lo: lo.max(-1.0).min(d), hi: hi.min(1.0).max(d), exact: base.exact && new.exact }
}

#[cfg(test)]
mod tests {
    use super::*;
    use witchcraft::profile::SamplerKind;

    fn sums(waste: &[f64], used: &[f64]) -> Sums {
        Sums {
            waste: waste.iter().sum(),
            waste_sq: waste.iter().map(|c| c * c).sum(),
            r#use: used.iter().sum(),
            use_sq: used.iter().map(|c| c * c).sum(),
            traps: (waste.len() + used.len()) as u64,
            ..Default::default()
        }
    }

    /// Sums over clusters, each given as its traps' (waste, use) credits.
    fn clustered(clusters: &[&[(f64, f64)]]) -> Sums {
        let mut s = Sums::default();
        for c in clusters {
            let (w, u) = c.iter().fold((0.0, 0.0), |(w, u), t| (w + t.0, u + t.1));
            let per_trap = sums(
                &c.iter().map(|t| t.0).filter(|&x| x > 0.0).collect::<Vec<_>>(),
                &c.iter().map(|t| t.1).filter(|&x| x > 0.0).collect::<Vec<_>>(),
            );
            let mut one = per_trap;
            one.cluster = Clustered { clusters: 1, waste_sq: w * w, use_sq: u * u, waste_use: w * u };
            s.add(&one);
        }
        s
    }

    #[test]
    fn a_line_with_all_the_waste_and_a_pair_within_it() {
        // Ten clusters; in each, four traps spread over four pairs of one
        // line (a memset's four store instructions), all waste.
        let pair = || -> Sums {
            let mut s = Sums::default();
            for _ in 0..10 {
                let mut one = sums(&[1.0], &[]);
                one.cluster = Clustered { clusters: 1, waste_sq: 1.0, use_sq: 0.0, waste_use: 0.0 };
                s.add(&one);
            }
            s
        };
        let pairs: Vec<Sums> = (0..4).map(|_| pair()).collect();
        let mut total = Sums::default();
        for p in &pairs {
            total.add(p);
        }
        // The threads' exact sums: each cluster holds 4 of waste.
        total.run = Clustered { clusters: 10, waste_sq: 160.0, use_sq: 0.0, waste_use: 0.0 };
        // The line (all four pairs) holds all the waste: 100%, one-sided.
        let line = total;
        let all = Sums { run: Clustered::default(), ..line }.share_of(&total);
        assert!(all.value == 1.0 && all.hi == 1.0 && all.lo > 0.85, "{all:?}");
        // Also when the line's sums and the total's differ by rounding only
        // (the same credits added up in another order: 4.771 one way,
        // 4.771000000000001 the other).
        let c = |w: f64, sq: f64| Sums {
            waste: w,
            waste_sq: sq,
            traps: 7,
            cluster: Clustered { clusters: 7, waste_sq: sq, ..Default::default() },
            ..Default::default()
        };
        let (line, above) = (c(4.771, 11.2), c(4.771000000000001, 11.200000000000001));
        let s = line.share_of(&above);
        assert!(s.hi == 1.0 && s.lo < 0.9, "{s:?}");
        // Nearly all of it, the rest two small credits: still the width that
        // the number of draws allows, not the rest's few credits'.
        let (big, small) = (sums(&[1.0; 98], &[]), sums(&[0.01; 2], &[]));
        let mut both = big;
        both.add(&small);
        let near = big.share_of(&both);
        assert!(near.value > 0.9997 && near.hi == 1.0 && near.lo < 0.97, "{near:?}");
        let tiny = small.share_of(&both);
        assert!(tiny.value < 0.0003 && tiny.lo == 0.0 && tiny.hi > 0.03, "{tiny:?}");
        // A pair's share: a quarter, with the spread of 40 credits over
        // ten clusters, not of ten clusters of four.
        let one = pairs[0].share_of(&total);
        assert!((one.value - 0.25).abs() < 1e-12);
        let raw = ratio(10.0, 10.0, 30.0, 30.0);
        assert!((one.se() - raw.se() * (10.0f64 / 9.0).sqrt() * t975(9.0) / Z95).abs() < 1e-9, "{one:?}");
        // The run's own fraction uses its exact sums: all waste, Wilson's
        // interval at ten clusters, not forty traps.
        let f = total.fraction();
        let want = 1.0 - Z95 * Z95 / (10.0 + Z95 * Z95);
        assert!(f.value == 1.0 && (f.lo - want).abs() < 1e-9, "{f:?}");
    }

    #[test]
    fn t_quantiles_match_the_table() {
        for (df, t) in [
            (1.0, 12.706),
            (2.0, 4.303),
            (3.0, 3.182),
            (4.0, 2.776),
            (5.0, 2.571),
            (7.0, 2.365),
            (9.0, 2.262),
            (19.0, 2.093),
            (30.0, 2.042),
            (100.0, 1.984),
        ] {
            assert!((t975(df) - t).abs() < 0.002 * t, "t({df}) = {} not {t}", t975(df));
        }
        assert!((t975(1e9) - Z95).abs() < 1e-6);
    }

    #[test]
    fn clusters_are_the_units_of_the_variance() {
        // Ten clusters of four traps each, all four alike: the information is
        // that of ten draws, not forty. Three clusters all waste, seven all use.
        let waste: &[(f64, f64)] = &[(1.0, 0.0); 4];
        let used: &[(f64, f64)] = &[(0.0, 1.0); 4];
        let mut cs = vec![waste; 3];
        cs.extend(vec![used; 7]);
        let s = clustered(&cs);
        let e = s.fraction();
        assert!((e.value - 0.3).abs() < 1e-12);
        // The binomial over ten draws, with the corrections for ten
        // clusters: √(10/9), and t at 9 degrees of freedom (2.262).
        let small = (10.0f64 / 9.0).sqrt() * 2.262 / Z95;
        let want = (0.3f64 * 0.7 / 10.0).sqrt() * small;
        assert!((e.se() - want).abs() < 1e-3 * want, "{} vs {want}", e.se());
        // Trap by trap, the same credits claim twice the precision.
        let mut flat = s;
        flat.cluster = Clustered::default();
        assert!((flat.fraction().se() - (0.3f64 * 0.7 / 40.0).sqrt()).abs() < 1e-9);
        // Mixed clusters: the definition, Σ((1−R)x_b − R y_b)² / Y².
        let cs: Vec<&[(f64, f64)]> = vec![&[(2.0, 0.0), (0.0, 1.0)], &[(0.0, 3.0)], &[(5.0, 0.0), (1.0, 0.0), (0.0, 2.0)]];
        let s = clustered(&cs);
        let (y, r) = (14.0, 8.0 / 14.0);
        let direct: f64 = [(2.0f64, 1.0f64), (0.0, 3.0), (6.0, 2.0)].iter().map(|(x, u)| ((1.0 - r) * x - r * u).powi(2)).sum();
        let v = clustered_variance(s.waste, s.cluster.waste_sq, s.r#use, s.cluster.use_sq, s.cluster.waste_use);
        assert!((v - direct / (y * y)).abs() < 1e-12);
        let raw = clustered_ratio(s.waste, s.cluster.waste_sq, s.r#use, s.cluster.use_sq, s.cluster.waste_use);
        assert!((raw.se() - v.sqrt()).abs() < 1e-12);
        // Three clusters: √(3/2) and t at 2 degrees of freedom (4.303).
        assert!((s.fraction().se() - raw.se() * 1.5f64.sqrt() * 4.303 / Z95).abs() < 1e-9);
        // All on one side: Wilson's interval at ten clusters, not forty traps.
        let none = clustered(&[used; 10]).fraction();
        let want = Z95 * Z95 / (10.0 + Z95 * Z95);
        assert!(none.value == 0.0 && (none.hi - want).abs() < 1e-9, "{none:?}");
    }

    #[test]
    fn equal_weights_give_the_binomial_interval() {
        // 30 waste traps and 70 use traps of equal weight: R = 0.3, Var = R(1-R)/n.
        let s = sums(&[2.0; 30], &[2.0; 70]);
        let e = s.fraction();
        assert!((e.value - 0.3).abs() < 1e-12);
        let want = (0.3f64 * 0.7 / 100.0).sqrt();
        assert!((e.se() - want).abs() < 1e-9, "{} vs {want}", e.se());
        assert!((e.lo - (0.3 - Z95 * want)).abs() < 1e-9 && (e.hi - (0.3 + Z95 * want)).abs() < 1e-9);
    }

    #[test]
    fn the_linearized_variance_matches_its_definition() {
        // Uneven credits: compare with Σ(x_i − R y_i)² / Y² computed trap by trap.
        let waste = [5.0, 1.0, 7.5, 0.5];
        let used = [3.0, 9.0, 2.0];
        let s = sums(&waste, &used);
        let y: f64 = waste.iter().chain(&used).sum();
        let r = s.waste / y;
        let direct: f64 = waste.iter().map(|c| (c - r * c).powi(2)).sum::<f64>() + used.iter().map(|c| (r * c).powi(2)).sum::<f64>();
        let want = (direct / (y * y)).sqrt();
        assert!((s.fraction().se() - want).abs() < 1e-12);
    }

    #[test]
    fn shares_use_the_rest_of_the_waste() {
        let pair = sums(&[4.0, 4.0], &[]);
        let rest = sums(&[4.0; 6], &[1.0; 10]);
        let mut all = pair;
        all.add(&rest);
        let e = pair.share_of(&all);
        assert!((e.value - 0.25).abs() < 1e-12);
        // 2 of 8 equal waste traps: binomial over the waste traps.
        let want = (0.25f64 * 0.75 / 8.0).sqrt();
        assert!((e.se() - want).abs() < 1e-9);
    }

    #[test]
    fn profiles_without_squares_fall_back_to_equal_weights() {
        let p = witchcraft::profile::Pair { waste: 300.0, r#use: 700.0, traps: 100, ..Default::default() };
        let s = Sums::of_pair(&p);
        assert!((s.fraction().se() - (0.3f64 * 0.7 / 100.0).sqrt()).abs() < 1e-9);
        // With squares, they are used as they are.
        let p = witchcraft::profile::Pair { waste: 300.0, waste_sq: 900.0, r#use: 700.0, use_sq: 4900.0, traps: 200, ..Default::default() };
        assert_eq!(Sums::of_pair(&p).waste_sq, 900.0);
    }

    #[test]
    fn all_on_one_side_still_has_an_interval() {
        // 0 waste of 6 equal traps: Wilson's upper bound z²/(n+z²) = 39%.
        let none = sums(&[], &[1.0; 6]).fraction();
        let want = Z95 * Z95 / (6.0 + Z95 * Z95);
        assert!(none.value == 0.0 && none.lo == 0.0 && (none.hi - want).abs() < 1e-9, "{none:?}");
        assert!(none.se() > 0.0);
        let all = sums(&[1.0; 6], &[]).fraction();
        assert!(all.value == 1.0 && all.hi == 1.0 && (all.lo - (1.0 - want)).abs() < 1e-9, "{all:?}");
        // More traps, a narrower interval; unequal credits count fewer.
        let many = sums(&[], &[1.0; 100]).fraction();
        assert!(many.hi < 0.04 && many.hi > 0.03, "{many:?}");
        let uneven = sums(&[], &[50.0, 1.0, 1.0, 1.0, 1.0, 1.0]).fraction();
        assert!(uneven.hi > none.hi, "{uneven:?} vs {none:?}");
        // A difference from such an estimate is not certain either.
        let d = difference(&none, &sums(&[1.0], &[1.0; 5]).fraction());
        assert!(d.lo < 0.0, "{d:?}");
    }

    #[test]
    fn a_fraction_near_0_or_1_keeps_the_width_of_its_draws() {
        // 98 waste traps and two small use traps: 99.98%, but the interval is
        // as wide as 100 draws allow (Wilson's), not the use traps' 0.01s.
        let near = sums(&[1.0; 98], &[0.01; 2]).fraction();
        assert!(near.value > 0.9997 && near.hi == 1.0 && near.lo < 0.97 && near.lo > 0.9, "{near:?}");
        let far = sums(&[0.01; 2], &[1.0; 98]).fraction();
        assert!(far.value < 0.0003 && far.lo == 0.0 && far.hi > 0.03 && far.hi < 0.1, "{far:?}");
        // The same over clusters: 40 all-waste clusters and one with a small use.
        let w: &[(f64, f64)] = &[(1.0, 0.0); 2];
        let u: &[(f64, f64)] = &[(0.0, 0.02)];
        let mut cs = vec![w; 40];
        cs.push(u);
        let c = clustered(&cs).fraction();
        assert!(c.value > 0.9997 && c.lo < 0.95, "{c:?}");
        // Many draws on both sides: the linearized interval, unchanged.
        let mid = sums(&[1.0, 3.0].repeat(40), &[2.0; 30]);
        let raw = ratio(mid.waste, mid.waste_sq, mid.r#use, mid.use_sq);
        assert_eq!(mid.fraction(), raw);
    }

    /// A large change resting on few clusters: the interval of the
    /// difference stays within ±100 points, as each side's does within
    /// [0, 1]; far from the bounds it is the usual normal one.
    #[test]
    fn a_difference_of_fractions_stays_within_its_bounds() {
        // 95% → 10%, each side from three clusters (t at 2 degrees of freedom).
        let side = |w: f64, u: f64| {
            let c: Vec<(f64, f64)> = vec![(w, u), (w * 1.3, u * 0.5), (w * 0.6, u * 1.6)];
            let cs: Vec<&[(f64, f64)]> = c.iter().map(std::slice::from_ref).collect();
            clustered(&cs).fraction()
        };
        let (base, new) = (side(19.0, 1.0), side(1.0, 9.0));
        assert!(base.lo >= 0.0 && base.hi <= 1.0 && new.lo >= 0.0 && new.hi <= 1.0);
        let wald = Z95 * (base.se().powi(2) + new.se().powi(2)).sqrt();
        let d = difference(&base, &new);
        assert!(d.value - wald < -1.0, "the normal interval would pass −100 points: {d:?}");
        assert!(d.lo >= -1.0 && d.hi <= 1.0 && d.lo <= d.value && d.value <= d.hi, "{d:?}");
        assert!(d.lo >= new.lo - base.hi - 1e-12 && d.hi <= new.hi - base.lo + 1e-12, "{d:?}");
        // Symmetric intervals far from 0 and 1: the normal interval.
        let (a, b) = (sums(&[1.0; 300], &[1.0; 300]).fraction(), sums(&[1.0; 200], &[1.0; 400]).fraction());
        let d = difference(&a, &b);
        let h = Z95 * (a.se().powi(2) + b.se().powi(2)).sqrt();
        assert!((d.lo - (d.value - h)).abs() < 1e-9 && (d.hi - (d.value + h)).abs() < 1e-9, "{d:?}");
        // All of it to none of it: −100 points at most.
        let (all, none) = (sums(&[1.0; 3], &[]).fraction(), sums(&[], &[1.0; 3]).fraction());
        let d = difference(&all, &none);
        assert!(d.value == -1.0 && d.lo == -1.0 && d.hi > -1.0 && d.hi < 0.0, "{d:?}");
    }

    #[test]
    fn more_traps_narrow_the_interval_and_limits_hold() {
        let few = sums(&[1.0; 3], &[1.0; 3]).fraction();
        let many = sums(&[1.0; 300], &[1.0; 300]).fraction();
        assert!(few.half_width() > many.half_width() * 5.0);
        assert!(few.lo >= 0.0 && few.hi <= 1.0);
        assert_eq!((Sums::default().fraction().lo, Sums::default().fraction().hi), (0.0, 1.0));
        let d = difference(&many, &few);
        assert!(d.value.abs() < 1e-12 && d.lo < 0.0 && d.hi > 0.0);
    }

    #[test]
    fn exhaustive_counts_have_no_interval_and_mixing_with_samples_keeps_one() {
        let pair = |w: &[f64], u: &[f64]| sums(w, u).counted(true);
        // Three waste traps and one use: 75%, counted.
        let line = pair(&[1.0; 3], &[1.0]);
        let f = line.fraction();
        assert_eq!((f.value, f.lo, f.hi, f.se()), (0.75, 0.75, 0.75, 0.0));
        assert!(f.is_exact() && !line.few(), "{f:?}");
        let mut all = Sums::default();
        all.add(&line);
        all.add(&pair(&[1.0], &[]));
        assert!(all.exhaustive);
        let s = line.share_of(&all);
        assert_eq!((s.value, s.lo, s.hi), (0.75, 0.75, 0.75));
        // Two counts differ by exactly their difference.
        let d = difference(&pair(&[1.0], &[1.0]).fraction(), &f);
        assert_eq!((d.lo, d.hi), (0.25, 0.25));
        // Nothing counted: unknown, as for a sample.
        assert_eq!(Sums::default().counted(true).fraction().hi, 1.0);
        // A sample added to a count is a sample.
        all.add(&sums(&[1.0], &[1.0]));
        assert!(!all.exhaustive && !all.fraction().is_exact());
        assert!(!sums(&[1.0; 3], &[1.0]).fraction().is_exact());
    }

    /// Whether a figure is a count is the profile's to say (its sampler is
    /// the exact mode), not its interval's width: a sample whose clusters
    /// all fall at one ratio has an interval of no width, and is a sample.
    #[test]
    fn a_count_is_what_the_profile_says_not_an_interval_of_no_width() {
        // Twenty clusters, each one waste trap and one use trap of one weight.
        let one: &[(f64, f64)] = &[(1.0, 0.0), (0.0, 1.0)];
        let sample = clustered(&[one; 20]);
        let f = sample.fraction();
        assert_eq!((f.value, f.lo, f.hi, f.se()), (0.5, 0.5, 0.5, 0.0), "no width");
        assert!(!f.is_exact(), "{f:?}");
        assert_eq!(crate::render::units::uncertainty(&f), "95% interval 50.0–50.0%");
        let count = sample.counted(true).fraction();
        assert!(count.is_exact(), "{count:?}");
        assert_eq!(crate::render::units::uncertainty(&count), "an exact count");
        // A difference is a count only between two counts.
        assert!(difference(&count, &count).is_exact());
        assert!(!difference(&f, &f).is_exact() && !difference(&f, &count).is_exact() && !difference(&count, &f).is_exact());
        assert!(!Estimate::default().is_exact() && !Sums::default().counted(true).fraction().is_exact());
    }

    /// The profile's sampler kind, as written ("exact" in its JSON since
    /// the exact mode came), marks the run's sums as a count.
    #[test]
    fn an_exact_profile_as_written_reads_as_counts() {
        for (kind, word, exact) in [(SamplerKind::Exact, "exact", true), (SamplerKind::Software, "software", false)] {
            let mut p = crate::daemon::store::tests_support::profile(7, 0, 0);
            p.sampler.kind = kind;
            let json = serde_json::to_string(&p).unwrap();
            assert!(json.contains(&format!(r#""kind":"{word}""#)), "{json}");
            let p = witchcraft::profile::Profile::from_bytes(json.as_bytes()).unwrap();
            assert_eq!(p.sampler.kind.is_exhaustive(), exact);
            let s = crate::analysis::run_sums(&p);
            let f = s.fraction();
            assert_eq!((s.exhaustive, f.is_exact(), s.few()), (exact, exact, !exact), "{kind:?}: {f:?}");
            assert_eq!(f.value, 0.75);
        }
    }
}
