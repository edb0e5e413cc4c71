//! Float FFT workload: low-pass filters a batch of generated single-precision
//! signals with RustFFT (its planner picks the AVX kernels on a CPU that has
//! them): forward transform, zero the bins above a cut-off, inverse
//! transform, scale, and prints energy checksums.
//! Usage: fft_driver [N [BATCH [REPS]]]: transform length N (mixed radix by
//! default: 3600 = 2^4 * 3^2 * 5^2), BATCH signals per repetition; REPS
//! repeats the filtering of the same signals with the same plans
//! (benches/accuracy.py's steady state: two exact runs differing in REPS).
use rustfft::num_complex::Complex;
use rustfft::FftPlanner;

fn main() {
    let arg = |i: usize, d: usize| std::env::args().nth(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (n, batch, reps) = (arg(1, 3600), arg(2, 8), arg(3, 1));
    let mut rng: u64 = 0x853C49E6748FEA9B;
    let mut signal = Vec::with_capacity(n * batch);
    for b in 0..batch {
        for i in 0..n {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let t = i as f32 / n as f32;
            let noise = (rng >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            let tone = (2.0 * std::f32::consts::PI * (5.0 + b as f32) * t).sin()
                + 0.5 * (2.0 * std::f32::consts::PI * 40.0 * t).cos();
            signal.push(Complex::new(tone + 0.3 * noise, 0.0));
        }
    }
    let mut planner = FftPlanner::<f32>::new();
    let fwd = planner.plan_fft_forward(n);
    let inv = planner.plan_fft_inverse(n);
    let mut scratch = vec![Complex::new(0.0f32, 0.0); fwd.get_inplace_scratch_len().max(inv.get_inplace_scratch_len())];
    let mut buf = signal.clone();
    let cut = n / 16;
    let scale = 1.0 / n as f32;
    let (mut kept, mut energy) = (0.0f64, 0.0f64);
    for _ in 0..reps {
        buf.copy_from_slice(&signal);
        fwd.process_with_scratch(&mut buf, &mut scratch);
        kept = 0.0;
        for chunk in buf.chunks_exact_mut(n) {
            for (k, c) in chunk.iter_mut().enumerate() {
                if k > cut && k < n - cut {
                    *c = Complex::new(0.0, 0.0);
                } else {
                    kept += c.norm_sqr() as f64;
                }
            }
        }
        inv.process_with_scratch(&mut buf, &mut scratch);
        energy = 0.0;
        for c in buf.iter_mut() {
            *c *= scale;
            energy += c.norm_sqr() as f64;
        }
    }
    println!("rustfft n={n} batch={batch} reps={reps} kept={kept:.6e} energy={energy:.6e}");
}
