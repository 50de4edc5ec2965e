//! A minimal timing loop shared by the benches: runs a closure in batches until about a
//! second has passed and reports the median ns per call over the batches.

#![expect(clippy::print_stdout, reason = "a benchmark prints its results")]

use std::hint::black_box;
use std::time::{Duration, Instant};

/// Times `f` and prints `name: <median> ns/op (min <min>)`.
pub(crate) fn bench<T>(name: &str, mut f: impl FnMut() -> T) {
    const BATCH: u32 = 10_000;
    let mut per_op = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(1) || per_op.len() < 5 {
        let t = Instant::now();
        for _ in 0..BATCH {
            black_box(f());
        }
        per_op.push(t.elapsed().as_nanos() as f64 / f64::from(BATCH));
    }
    per_op.sort_by(f64::total_cmp);
    let median = per_op[per_op.len() / 2];
    println!("{name:<48} {median:>9.1} ns/op  (min {:.1}, {} batches)", per_op[0], per_op.len());
}
