//! The pool's other workers kept spinning for the length of a run, as ONNX Runtime's threads
//! spin between a run's kernels: a run is a few hundred kernels, most of them parallel loops a
//! few microseconds apart, and a rayon worker that finds no work yields, then sleeps, and is
//! woken again for the next loop — in a virtual machine each wake-up costs microseconds. A
//! spinning worker takes the next loop's tasks as soon as they are pushed (it asks the pool
//! for work in a loop, `rayon::yield_now`). Measured 2026-11-27 on the 2-core Zen 5 machine
//! (in-process harness, min of 3 alternating rounds): Magika and PP-OCRv4 det −6 %, Silero
//! kernels −12 %, the classifier −2 %, YOLOv8n and the bench models within noise.
//!
//! Only pools of two threads spin (the CI machine's and the measured case; see
//! `with_spinning_workers` for why not more), and only one run at a time: a spinner stops when its run ends or when another
//! run starts anywhere in the process (`--jobs N` evaluations run side by side, and a spinner
//! that a worker picked up while waiting inside another run would hold that run up until it
//! stopped). Nothing here changes what a kernel computes.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Runs under way in the process.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
/// Changes whenever a run starts or ends: a spinner spins while it is the value it was given.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Runs `f` (a run, on a thread of the pool) with the pool's other workers spinning.
pub(super) fn with_spinning_workers<R>(f: impl FnOnce() -> R) -> R {
    struct End;
    impl Drop for End {
        fn drop(&mut self) {
            GENERATION.fetch_add(1, Ordering::SeqCst);
            ACTIVE.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let alone = ACTIVE.fetch_add(1, Ordering::SeqCst) == 0;
    let generation = GENERATION.fetch_add(1, Ordering::SeqCst) + 1;
    let _end = End;
    let starter = rayon::current_thread_index();
    if alone && starter.is_some() && rayon::current_num_threads() == 2 {
        // Pushed onto the starter's own deque before any of the run's work: the other thread
        // steals the oldest job first, so it takes the spinner before any job of the run and
        // runs it from its idle loop, never nested inside a job the run waits for (which
        // would deadlock: the spinner waits for the run, the run for that job). A broadcast
        // job gives no such order — a worker runs it from inside whatever it is waiting on —
        // and with three or more threads a worker can steal a job of the run from another
        // worker before the spinner, so only two-thread pools spin. Taken by the starter
        // itself, it returns at once.
        rayon::spawn(move || {
            if rayon::current_thread_index() != starter {
                spin(generation)
            }
        });
    }
    f()
}

/// Takes the pool's work as it comes until the run that started it ends or another starts.
fn spin(generation: u64) {
    while GENERATION.load(Ordering::Relaxed) == generation && ACTIVE.load(Ordering::Relaxed) == 1 {
        if rayon::yield_now() != Some(rayon::Yield::Executed) {
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    fn work() -> u64 {
        (0..100_000u64).into_par_iter().map(|x| x % 7).sum()
    }

    /// Runs one after another, side by side (`--jobs`) and nested give their results, and a
    /// spinner stops once its run is over: the pool then runs other work on every thread.
    #[test]
    fn spinning_runs_finish_side_by_side_and_release_the_workers() {
        let expected: u64 = (0..100_000u64).map(|x| x % 7).sum();
        for threads in [2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                for _ in 0..20 {
                    assert_eq!(with_spinning_workers(work), expected);
                }
                let (a, b) = rayon::join(
                    || with_spinning_workers(work),
                    || with_spinning_workers(|| with_spinning_workers(work)),
                );
                assert_eq!((a, b), (expected, expected));
            });
            assert_eq!(pool.broadcast(|ctx| ctx.index()).len(), threads);
        }
    }

    /// Many short runs of nested parallel loops in a two-thread pool (the shape of a model's
    /// run: a few dozen parallel kernels, each a tree of joins) all finish. The first
    /// version's hang (a broadcast spinner run from inside one of the run's own jobs, seen
    /// once in ~10⁴ model runs) is a race this test does not reproduce reliably: the ordering
    /// argument in `with_spinning_workers` is what rules it out.
    #[test]
    fn back_to_back_runs_of_nested_loops_finish() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        // Each leaf a microsecond or so of work, as a kernel's task is: the other thread must
        // have time to steal while the starter works.
        let leaf = |j: u64| (0..300u64).fold(j, |a, k| std::hint::black_box(a ^ k)) & 1;
        let expected: u64 = (0..48u64).map(|i| (0..i).map(leaf).sum::<u64>()).sum();
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            pool.install(|| {
                for _ in 0..3000 {
                    let run = || {
                        (0..48u64)
                            .into_par_iter()
                            .map(|i| (0..i).into_par_iter().map(leaf).sum::<u64>())
                            .sum::<u64>()
                    };
                    assert_eq!(with_spinning_workers(run), expected);
                }
            });
            done.send(()).unwrap();
        });
        finished
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("every run finished");
    }

    /// A spinner returns when the generation it was given is over.
    #[test]
    fn a_spinner_stops_when_its_run_ends() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let generation = GENERATION.load(Ordering::SeqCst);
        let (done, stopped) = std::sync::mpsc::channel();
        pool.spawn(move || {
            spin(generation);
            done.send(()).unwrap();
        });
        GENERATION.fetch_add(1, Ordering::SeqCst);
        stopped
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the spinner stopped");
    }
}
