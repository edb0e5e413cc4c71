//! dead_loop.c in Rust, built with rustc (which links with lld by default
//! since Rust 1.90, laying out segments differently from GNU ld): every
//! store of the @w loop is overwritten by the @k loop before anything reads
//! it. The loops sit three calls below main, so the contexts show the chain.
//!
//! Usage: rust_dead [reps]   prints a checksum, exits 3.
use std::hint::black_box;
use std::ptr::{read_volatile, write_volatile};

const N: usize = 1 << 19;
const M: usize = 1024;

#[inline(never)]
fn first(a: &mut [u64], nxt: &[u64], mut c: u64) -> u64 {
    for x in a.iter_mut() {
        c = unsafe { read_volatile(&nxt[c as usize]) };
        unsafe { write_volatile(x, c) }; /* @w */
    }
    c
}

#[inline(never)]
fn second(a: &mut [u64], nxt: &[u64], mut c: u64) -> u64 {
    for x in a.iter_mut() {
        c = unsafe { read_volatile(&nxt[c as usize]) };
        unsafe { write_volatile(x, c) }; /* @k */
    }
    c
}

#[inline(never)]
fn pass(a: &mut [u64], nxt: &[u64], c: u64) -> u64 {
    let c = first(a, nxt, c);
    black_box(second(a, nxt, c))
}

#[inline(never)]
fn run(reps: u64) -> (u64, u64) {
    let nxt: Vec<u64> = (0..M as u64).map(|i| (i + 1) % M as u64).collect();
    let mut a = vec![0u64; N];
    let mut c = 0;
    for _ in 0..reps {
        c = black_box(pass(&mut a, &nxt, c));
    }
    (a.iter().sum(), c)
}

fn main() {
    let reps = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(150);
    let (sum, c) = run(reps);
    println!("rust_dead {sum} {c}");
    std::process::exit(3);
}
