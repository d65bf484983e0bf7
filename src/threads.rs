//! The kernels' thread pool, for binaries (`main.rs`, the benchmarks) to set up once at
//! start-up: the library itself never changes process-wide state.
//!
//! Why: the interpreter runs a model on a thread of rayon's pool (`exec::on_pool`), so that
//! the kernels' parallel loops start from a worker. Called from a thread outside the pool,
//! every run is handed to a worker while the caller sleeps on a lock until it is done: two
//! cross-thread wake-ups per run, which in a virtual machine cost 4–18 µs (a one-Relu model
//! ran in 3.4–10 µs; a [1,64,10,10] 3×3 Conv in 48 µs of which the kernel took 35). ONNX
//! Runtime runs on the calling thread. With the calling thread made worker 0 of the pool it
//! does the same: a run starts in place, and the pool has one thread fewer to start.

/// Builds rayon's global pool with the calling thread as its worker 0 and `threads` workers
/// in all (`None`: rayon's default, `RAYON_NUM_THREADS` or one per core). Call it from the
/// thread that will run models (normally `main`), before anything else uses rayon.
///
/// The calling thread takes part in the pool's work only while it is inside a rayon call (a
/// parallel loop, `scope`, `join`): a thread that is not in the pool and hands work to it
/// would wait on it while this thread is elsewhere, and with one thread in all it would wait
/// forever. The library never does that (its other threads only drain pipes).
pub fn run_kernels_on_the_calling_thread(
    threads: Option<usize>,
) -> Result<(), rayon::ThreadPoolBuildError> {
    let builder = rayon::ThreadPoolBuilder::new().use_current_thread();
    match threads {
        Some(n) => builder.num_threads(n.max(1)),
        None => builder,
    }
    .build_global()
}
