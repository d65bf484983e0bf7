//! The precision search on the benchmark-size planted models (scripts/gen_models.py --size
//! bench): for each mode, candidate evaluations, layer executions with the incremental cache
//! and without it (the peer: every candidate re-run in full, same run), wall time of both, and
//! wall time as a multiple of one FP32 inference.
//!
//! Usage: cargo bench --bench search -- DIR NAME [NAME...]   (bench/search.sh prepares DIR)

/// The allocator the `mixprec` binary runs with (crates/cli/src/main.rs says why).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use mixprec::compare::{Criterion, ErrorStat, PerOutput};
use mixprec::exec::{Interpreter, ValueCache};
use mixprec::load_model;
use mixprec::onnx::read_input_set;
use mixprec::precision::plan::PrecisionPlan;
use mixprec::precision::{Accumulator, Precision};
use mixprec::search::builtin::BuiltinOracle;
use mixprec::search::{search, Direction, Mode, Objective, Outcome, Ranking, SearchOptions};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

fn main() {
    // What the mixprec binary runs with (src/threads.rs).
    mixprec::threads::run_kernels_on_the_calling_thread(None).expect("the kernels' pool");
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let Some((dir, names)) = args.split_first() else {
        eprintln!("usage: search DIR NAME [NAME...]");
        std::process::exit(2);
    };
    let dir = PathBuf::from(dir);
    let criterion = Criterion {
        atol: PerOutput::new(1e-2),
        rtol: PerOutput::new(1e-2),
        stat: PerOutput::new(ErrorStat::Median),
        ..Default::default()
    };
    println!(
        "{:<20} {:<20} {:>5} {:>8} {:>10} {:>10} {:>7} {:>9} {:>9} {:>8} {:>9}",
        "model",
        "mode",
        "evals",
        "marked",
        "execs",
        "no-cache",
        "ratio",
        "wall s",
        "nocache s",
        "speedup",
        "x FP32"
    );
    for name in names {
        let model = load_model(dir.join(format!("{name}.onnx"))).expect("load model");
        let graph = &model.graph;
        let interp = Interpreter::new(graph).expect("supported model");
        let feeds = vec![read_input_set(graph, &dir.join(name)).expect("input")];
        // One FP32 inference: median of 5 after a warm-up.
        interp.run(&feeds[0]).expect("run");
        let mut times: Vec<f64> = (0..5)
            .map(|_| {
                let t = Instant::now();
                interp.run(&feeds[0]).expect("run");
                t.elapsed().as_secs_f64()
            })
            .collect();
        times.sort_by(|a, b| a.total_cmp(b));
        let fp32 = times[2];
        let low = PrecisionPlan::uniform(graph, Precision::Float16);
        for (mode, dir_) in [
            (Mode::Bisect, Direction::Forward),
            (Mode::Bisect, Direction::Reverse),
            (Mode::Linear, Direction::Reverse),
            (Mode::WorstFirst, Direction::Forward),
            (Mode::Minimal, Direction::Forward),
        ] {
            let run = |budget: usize| {
                let t = Instant::now();
                let mut oracle = BuiltinOracle::new(
                    &interp,
                    &feeds,
                    criterion.clone(),
                    low.clone(),
                    Precision::Float32,
                    Accumulator::F32,
                    None,
                    ValueCache::new(budget),
                )
                .expect("oracle");
                let golden = oracle.reference_outputs().expect("reference");
                oracle.set_golden(golden).expect("golden");
                let space = oracle
                    .search_space(mode.needs_ranking().then_some(Ranking::Sensitivity))
                    .expect("space");
                let result = search(
                    &space,
                    &SearchOptions {
                        mode,
                        direction: dir_,
                        objective: Objective::Layers,
                        ranking: Ranking::Sensitivity,
                        jobs: 1,
                        group: mixprec::search::Grouping::None,
                    },
                    &mut oracle,
                    &mut |_| {},
                    &AtomicBool::new(false),
                )
                .expect("search");
                let marked = match &result.outcome {
                    Outcome::Found(m) => m.len(),
                    other => panic!("{name} {mode:?}: {other:?}"),
                };
                let executed = if budget == 0 {
                    oracle.full_executions
                } else {
                    oracle.cache.stats.executed
                };
                (
                    result.trials.len(),
                    marked,
                    executed,
                    oracle.full_executions,
                    t.elapsed().as_secs_f64(),
                )
            };
            let (evals, marked, execs, full, wall) = run(2 << 30);
            let (_, marked0, _, _, wall0) = run(0);
            assert_eq!(marked, marked0, "the cache must not change the answer");
            let label = if mode.is_contiguous() {
                format!("{} {:?}", mode.name(), dir_).to_lowercase()
            } else {
                mode.name().to_string()
            };
            println!(
                "{name:<20} {label:<20} {evals:>5} {marked:>8} {execs:>10} {full:>10} {:>7.2} {wall:>9.3} {wall0:>9.3} {:>8.2} {:>9.1}",
                execs as f64 / full as f64,
                wall0 / wall,
                wall / fp32
            );
        }
        println!("{name}: one FP32 inference = {:.2} ms", fp32 * 1e3);
    }
}
