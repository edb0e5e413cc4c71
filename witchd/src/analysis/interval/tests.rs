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
