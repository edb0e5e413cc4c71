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
mod tests;
