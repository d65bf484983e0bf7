//! A kernel probe, not a benchmark (it runs no peer): times a product of M rows (default 16; the
//! first argument) by weights of transformer shapes through each f32 path, on cold weights
//! (enough copies to exceed the last-level cache), in GFLOP/s. `cargo run --release --example
//! skinny_gemm -- 16`; ONNX Runtime's figure for the same shapes: bench/skinny_gemm_ort.py.

/// The allocator the `mixprec` binary runs with (crates/cli/src/main.rs says why).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use mixprec::numeric::Accumulator;
use mixprec::ops::sgemm::{gemm, PackB, PackedB, StridedB};
use std::time::Instant;

struct PackOnly<'a>(StridedB<'a>);
impl PackB for PackOnly<'_> {
    fn pack(&self, j0: usize, p0: usize, kc: usize, dst: &mut [f32]) {
        self.0.pack(j0, p0, kc, dst)
    }
}

fn time(mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let mut best = f64::MAX;
    for _ in 0..7 {
        let t = Instant::now();
        let reps = 10;
        for _ in 0..reps {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / reps as f64);
    }
    best
}

fn main() {
    mixprec::threads::run_kernels_on_the_calling_thread(None).unwrap();
    let m: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(16);
    for &(k, n) in &[
        (576, 576),
        (576, 192),
        (576, 1536),
        (1536, 576),
        (576, 49152),
        (2048, 2048),
        (2048, 5632),
    ] {
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        // Copies of B enough to exceed the last-level cache: each call reads its B from memory,
        // as a model's forward pass reads each weight once.
        let copies = (256usize << 20).div_ceil(k * n * 4).max(1);
        let bs: Vec<Vec<f32>> = (0..copies)
            .map(|c| {
                (0..k * n)
                    .map(|i| ((i * 104729 + c) % 1000) as f32 / 1000.0 - 0.5)
                    .collect()
            })
            .collect();
        let next = std::cell::Cell::new(0usize);
        let pick = || {
            next.set((next.get() + 1) % copies);
            next.get()
        };
        let mut c = vec![0f32; m * n];
        let flop = 2.0 * (m * k * n) as f64;
        let sbs: Vec<StridedB> = bs
            .iter()
            .map(|b| StridedB {
                data: b,
                n,
                rs: n,
                cs: 1,
            })
            .collect();
        let t_crate = time(|| {
            let b = &bs[pick()];
            mixprec::ops::matmul::sgemm(
                Accumulator::F32,
                m,
                n,
                k,
                &a,
                false,
                b,
                false,
                &mut c,
                false,
            )
        });
        let t_direct = time(|| gemm(m, n, k, &a, k, 1, &sbs[pick()], &mut c, n, false));
        let pos: Vec<PackOnly> = bs
            .iter()
            .map(|b| {
                PackOnly(StridedB {
                    data: b,
                    n,
                    rs: n,
                    cs: 1,
                })
            })
            .collect();
        let t_pack = time(|| gemm(m, n, k, &a, k, 1, &pos[pick()], &mut c, n, false));
        let pbs: Vec<PackedB> = sbs.iter().map(|sb| PackedB::new(k, n, sb)).collect();
        let t_whole = time(|| gemm(m, n, k, &a, k, 1, &pbs[pick()], &mut c, n, false));
        let g = |t: f64| flop / t / 1e9;
        println!(
            "m={m} k={k} n={n}: gemm-crate {:.1} | direct {:.1} | pack-per-call {:.1} | packed-whole {:.1} GFLOP/s",
            g(t_crate), g(t_direct), g(t_pack), g(t_whole)
        );
    }
}
