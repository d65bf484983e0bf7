//! Throughput of the output comparator: two 10-million-element f32 arrays compared with
//! `compare_output` (absolute/relative differences, the stats of both sides and of both
//! differences with median and percentiles, four histograms, and the cosine/SNR/top-k metrics).
//!
//! Usage: cargo bench --bench compare [-- N]   (N elements, default 10_000_000)
//! Prints the best of 5 runs and the throughput in GB/s of input (2 × N × 4 bytes).

/// The allocator the `mixprec` binary runs with (crates/cli/src/main.rs says why).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use mixprec::compare::stats::{histogram, quantiles, Stats};
use mixprec::compare::{compare_output, Criterion, ErrorStat, Metric, PerOutput};
use mixprec::tensor::Tensor;
use std::time::Instant;

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.replace('_', "").parse().ok())
        .unwrap_or(10_000_000);
    // Deterministic pseudo-random data: a reference in [1, 2) and a perturbed output.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    let reference: Vec<f32> = (0..n).map(|_| 1.0 + next()).collect();
    let out: Vec<f32> = reference
        .iter()
        .map(|&x| x + (next() - 0.5) * 1e-3)
        .collect();
    let shape = vec![n / 1000, 1000];
    let n = shape.iter().product::<usize>();
    let a = Tensor::from_f32(shape.clone(), out[..n].to_vec());
    let b = Tensor::from_f32(shape, reference[..n].to_vec());
    let plain = Criterion {
        stat: PerOutput::new(ErrorStat::Median),
        ..Default::default()
    };
    let with_metrics = Criterion {
        metrics: [
            "cosine:0.999",
            "snr:40",
            "topk:5:0.9",
            "max-rel-above:1e-3:0.01",
        ]
        .iter()
        .map(|m| Metric::parse(m).expect("valid metric"))
        .collect(),
        ..plain.clone()
    };
    let bytes = (2 * n * 4) as f64;
    // Breakdown of the parts, for one array.
    let v: Vec<f64> = reference[..n].iter().map(|&x| x as f64).collect();
    let time = |label: &str, f: &dyn Fn()| {
        let t = Instant::now();
        f();
        println!("  {label}: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    };
    time("stats of one array", &|| {
        std::hint::black_box(Stats::compute(&v, &[n], true));
    });
    time("quantiles of one array", &|| {
        std::hint::black_box(quantiles(&v, &[0.5, 0.9, 0.95, 0.99]));
    });
    time("histogram of one array", &|| {
        std::hint::black_box(histogram(&v, Some((1.0, 2.0))));
    });
    for (label, c) in [
        ("tolerance only", &plain),
        ("with 4 metrics", &with_metrics),
    ] {
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let t = Instant::now();
            let r = compare_output("y", &a, &b, c).expect("comparable");
            best = best.min(t.elapsed().as_secs_f64());
            std::hint::black_box(r);
        }
        println!(
            "compare {n} f32 elements ({label}): {:.1} ms, {:.2} GB/s (threads: {})",
            best * 1e3,
            bytes / best / 1e9,
            rayon::current_num_threads()
        );
    }
}
