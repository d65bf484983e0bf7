//! No panic anywhere in load → inspect (shape inference) → run (FP32 and an emulated float16
//! plan) → convert, on mutated valid models: flipped, inserted and dropped bytes, truncation,
//! random attribute values, random input shapes and feeds (NaN, ±inf, ±0, subnormals, empty
//! dims). Errors are fine; a panic fails the test and prints the case to replay.
//!
//! The seeds are the ONNX conformance models mixprec supports and the bundled examples.
//! `MIXPREC_FUZZ_CASES=N` sets the case count (default 10,000; a longer run:
//! `MIXPREC_FUZZ_CASES=1000000 cargo test --release --test integration fuzz -- --nocapture`),
//! `MIXPREC_FUZZ_SEED=S` the seed.

use crate::common::{onnx_node_dir, repo_root};
use mixprec::exec::{Feeds, PlanOptions, PreparedPlan, RunOptions};
use mixprec::infer::{declared_input_facts, feed_facts, infer_graph};
use mixprec::onnx::proto::{attribute_proto::AttributeType, ModelProto};
use mixprec::onnx::{decode_model, model_from_proto};
use mixprec::precision::{plan::PrecisionPlan, Precision};
use mixprec::{DType, Graph, Interpreter, Tensor};
use prost::Message;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

/// Values with more elements than this are not run (the inference sees them coming).
const RUN_LIMIT: usize = 1 << 20;

/// xorshift64*: deterministic on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
    fn small_int(&mut self) -> i64 {
        self.below(10) as i64 - 3
    }
    fn float(&mut self) -> f32 {
        match self.below(12) {
            0 => f32::NAN,
            1 => f32::INFINITY,
            2 => f32::NEG_INFINITY,
            3 => -0.0,
            4 => 1e-40, // subnormal
            5 => 70000.0,
            _ => (self.below(2001) as f32 - 1000.0) / 250.0,
        }
    }
}

fn seeds() -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for name in ["needs_constraints.onnx", "mlp.onnx", "transformer.onnx"] {
        let p = repo_root().join("examples").join(name);
        out.push((p.clone(), std::fs::read(&p).unwrap()));
    }
    let root = onnx_node_dir();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.path().join("model.onnx"))
        .filter(|p| p.exists())
        .collect();
    dirs.sort();
    for p in dirs {
        let bytes = std::fs::read(&p).unwrap();
        // Only models mixprec loads: mutations of those reach the deep code.
        let ok = decode_model(&bytes, &p)
            .and_then(|m| model_from_proto(m, &p, p.parent().unwrap()))
            .is_ok_and(|m| Interpreter::new(&m.graph).is_ok());
        if ok {
            out.push((p, bytes));
        }
    }
    out
}

/// One mutation of a decoded model: an attribute gets a random value.
fn mutate_attribute(m: &mut ModelProto, rng: &mut Rng) -> String {
    let Some(g) = m.graph.as_mut() else {
        return "no graph".into();
    };
    if g.node.is_empty() {
        return "no nodes".into();
    }
    let ni = rng.below(g.node.len());
    let node = &mut g.node[ni];
    if node.attribute.is_empty() {
        return format!("node {ni} has no attributes");
    }
    let ai = rng.below(node.attribute.len());
    let a = &mut node.attribute[ai];
    let what = format!("node {ni} attribute {:?}", a.name());
    match a.r#type() {
        AttributeType::Int => a.i = Some(rng.small_int()),
        AttributeType::Ints => {
            let n = rng.below(6);
            a.ints = (0..n).map(|_| rng.small_int()).collect();
        }
        AttributeType::Float => a.f = Some(rng.float()),
        AttributeType::Floats => {
            let n = rng.below(6);
            a.floats = (0..n).map(|_| rng.float()).collect();
        }
        AttributeType::String => {
            a.s = Some(
                [
                    "",
                    "NOTSET",
                    "SAME_UPPER",
                    "VALID",
                    "constant",
                    "reflect",
                    "xyz",
                    "CRD",
                ][rng.below(8)]
                .as_bytes()
                .to_vec(),
            )
        }
        _ => a.i = Some(rng.small_int()),
    }
    what
}

fn mutate_bytes(bytes: &[u8], rng: &mut Rng) -> (Vec<u8>, String) {
    let mut b = bytes.to_vec();
    if b.is_empty() {
        return (b, "empty".into());
    }
    match rng.below(4) {
        0 => {
            let n = 1 + rng.below(8);
            for _ in 0..n {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            (b, format!("{n} bit flips"))
        }
        1 => {
            let at = rng.below(b.len());
            b.truncate(at);
            (b, format!("truncated at {at}"))
        }
        2 => {
            let i = rng.below(b.len());
            let v = rng.next() as u8;
            b[i] = v;
            (b, format!("byte {i} = {v}"))
        }
        _ => {
            let i = rng.below(b.len());
            let n = 1 + rng.below(4).min(b.len() - i - 1);
            b.drain(i..i + n);
            (b, format!("dropped {n} bytes at {i}"))
        }
    }
}

fn random_tensor(dtype: DType, shape: Vec<usize>, rng: &mut Rng) -> Tensor {
    let n: usize = shape.iter().product();
    let f = Tensor::from_f32(shape.clone(), (0..n).map(|_| rng.float()).collect());
    match dtype {
        DType::F32 => f,
        DType::Bool => Tensor::from_bool(shape, (0..n).map(|_| rng.chance(50)).collect()),
        d if d.is_int() => mixprec::ops::cast::cast_tensor(
            &Tensor::from_i64(shape, (0..n).map(|_| rng.small_int()).collect()),
            d,
        ),
        DType::Str => Tensor::from_parts(
            shape,
            mixprec::TensorData::Str((0..n).map(|i| format!("s{i}")).collect()),
        ),
        d => mixprec::ops::cast::cast_tensor(&f, d),
    }
}

/// Feeds of the declared types, with the declared shape or (sometimes) a random one.
fn random_feeds(g: &Graph, rng: &mut Rng) -> Feeds {
    let mut feeds = Feeds::new();
    for vi in &g.inputs {
        let declared = vi.shape.as_ref();
        let rank = match declared {
            Some(d) if !rng.chance(15) => d.len(),
            _ => rng.below(5),
        };
        let shape: Vec<usize> = (0..rank)
            .map(|i| match declared.and_then(|d| d.get(i)) {
                Some(mixprec::graph::Dim::Fixed(n)) if !rng.chance(10) => *n,
                _ => [0, 1, 1, 2, 3, 4][rng.below(6)],
            })
            .collect();
        if shape.iter().product::<usize>() > RUN_LIMIT {
            continue;
        }
        feeds.insert(
            vi.name.clone(),
            random_tensor(vi.dtype.unwrap_or(DType::F32), shape, rng),
        );
    }
    feeds
}

/// Load → inspect → run (FP32 and float16) → convert on one (possibly broken) model.
fn pipeline(path: &Path, model: ModelProto, rng: &mut Rng) {
    let base = path.parent().unwrap_or(Path::new("."));
    let Ok(m) = model_from_proto(model, path, base) else {
        return;
    };
    let g = &m.graph;
    let _ = infer_graph(g, &declared_input_facts(g, &BTreeMap::new()));
    let Ok(interp) = Interpreter::new(g) else {
        return;
    };
    let feeds = random_feeds(g, rng);
    if std::env::var("MIXPREC_FUZZ_VERBOSE").is_ok() {
        for (n, t) in &feeds {
            eprintln!("  feed {n}: {:?} {}", t.shape(), t.dtype());
        }
    }
    // The inference sees every static size; skip runs that would allocate too much.
    if let Ok(facts) = infer_graph(g, &feed_facts(&feeds)) {
        let too_big = facts.values.values().any(|f| {
            f.known_shape().is_some_and(|s| {
                s.iter()
                    .try_fold(1usize, |a, &d| a.checked_mul(d))
                    .is_none_or(|n| n > RUN_LIMIT)
            })
        });
        if too_big {
            return;
        }
    }
    let _ = interp.run_with(
        &feeds,
        &RunOptions {
            keep_intermediates: rng.chance(20),
        },
    );
    let plan = PrecisionPlan::uniform(g, Precision::Float16);
    if let Ok(prepared) = PreparedPlan::new(g, &plan, &PlanOptions::default()) {
        let _ = interp.run_plan(&feeds, &RunOptions::default(), &prepared);
    }
    if rng.chance(25) {
        let _ =
            mixprec::export::export(&m, &plan, None, &mixprec::export::ExportOptions::default());
    }
}

thread_local! {
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

#[test]
fn no_panic_on_mutated_models() {
    let cases: usize = std::env::var("MIXPREC_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let seed: u64 = std::env::var("MIXPREC_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x6d69_7870);
    let seeds = seeds();
    assert!(seeds.len() > 500, "only {} seed models", seeds.len());
    // Panics on this thread are recorded, not printed; other threads keep the default hook.
    let default_hook = std::panic::take_hook();
    let fuzz_thread = std::thread::current().id();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().id() == fuzz_thread {
            let loc = info.location().map(|l| l.to_string()).unwrap_or_default();
            let msg = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let trace = if std::env::var("MIXPREC_FUZZ_VERBOSE").is_ok() {
                format!("\n{}", std::backtrace::Backtrace::force_capture())
            } else {
                String::new()
            };
            LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{msg} at {loc}{trace}")));
        } else {
            default_hook(info);
        }
    }));
    let mut panics = Vec::new();
    let verbose = std::env::var("MIXPREC_FUZZ_VERBOSE").is_ok();
    let only: Option<usize> = std::env::var("MIXPREC_FUZZ_ONLY")
        .ok()
        .and_then(|v| v.parse().ok());
    for case in 0..cases {
        if only.is_some_and(|o| o != case) {
            continue;
        }
        let mut rng = Rng(seed ^ (case as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        rng.next();
        let (path, bytes) = &seeds[rng.below(seeds.len())];
        let mut what = String::new();
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let decoded = match rng.below(3) {
                0 => {
                    let (b, w) = mutate_bytes(bytes, &mut rng);
                    what = w;
                    decode_model(&b, path).ok()
                }
                1 => decode_model(bytes, path).ok().map(|mut m| {
                    what = mutate_attribute(&mut m, &mut rng);
                    m
                }),
                _ => {
                    what = "random feeds".into();
                    decode_model(bytes, path).ok()
                }
            };
            if let Some(m) = decoded {
                if verbose {
                    eprintln!("case {case}: {} {what}", path.display());
                }
                pipeline(path, m, &mut rng);
            }
        }));
        if result.is_err() {
            let msg = LAST_PANIC
                .with(|p| p.borrow_mut().take())
                .unwrap_or_default();
            panics.push(format!(
                "case {case} ({}: {what}): {msg}",
                path.parent().and_then(|p| p.file_name()).map_or_else(
                    || path.display().to_string(),
                    |n| n.to_string_lossy().into_owned()
                )
            ));
        }
    }
    let _ = std::panic::take_hook();
    // Re-encoding a seed gives the same model: the mutations start from what is on disk.
    let (p, b) = &seeds[0];
    assert_eq!(decode_model(b, p).unwrap().encode_to_vec().len(), b.len());
    println!(
        "fuzz: {cases} cases over {} seed models, {} panics",
        seeds.len(),
        panics.len()
    );
    for p in panics.iter().take(30) {
        eprintln!("PANIC {p}");
    }
    assert!(
        panics.is_empty(),
        "{} cases panicked (see above)",
        panics.len()
    );
}
