//! Reduced-precision emulation on whole models: the seed's FP16 overflow example
//! (Polygraphy's `needs_constraints.onnx`) must reproduce the numbers of the seed log.

use crate::common::{mixprec, repo_root, text};
use mixprec::compare::median_of;
use mixprec::data::loader::{generate, DataLoaderConfig};
use mixprec::exec::{PlanOptions, PreparedPlan, RunOptions};
use mixprec::precision::plan::{
    parse_layer_precisions, GlobalPrecision, PrecisionConstraints, PrecisionPlan,
};
use mixprec::{load_model, Interpreter};

fn fp16_with(overrides: &[&str]) -> (Vec<f32>, Vec<f32>, f64) {
    fp16_fused(overrides, &[])
}

/// `--fp16` with `overrides` and the fusion regions `regions` (node names).
fn fp16_fused(overrides: &[&str], regions: &[&[&str]]) -> (Vec<f32>, Vec<f32>, f64) {
    let model = load_model(repo_root().join("examples/needs_constraints.onnx")).unwrap();
    let g = &model.graph;
    let mut cfg = DataLoaderConfig::default();
    cfg.val_ranges.per_input.insert("x".into(), (1.0, 2.0));
    let (feeds, _) = generate(&g.inputs, &cfg).unwrap();
    let interp = Interpreter::new(g).unwrap();
    let keep = RunOptions {
        keep_intermediates: true,
    };
    let golden = interp.run_with(&feeds[0], &keep).unwrap();
    let items: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    let (plan, warnings) = PrecisionPlan::resolve(
        g,
        &GlobalPrecision {
            fp16: true,
            ..Default::default()
        },
        &parse_layer_precisions(&items).unwrap(),
        PrecisionConstraints::Prefer,
    )
    .unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let mut plan = plan;
    for (i, r) in regions.iter().enumerate() {
        plan.regions.push(mixprec::precision::plan::FusionRegion {
            name: format!("region_{i}"),
            nodes: r.iter().map(|n| n.to_string()).collect(),
        });
    }
    let prepared = PreparedPlan::new(g, &plan, &PlanOptions::default()).unwrap();
    let low = interp.run_plan(&feeds[0], &keep, &prepared).unwrap();
    let f = |r: &mixprec::RunResult, n: &str| r.intermediates[n].as_f32().unwrap().to_vec();
    let out = f(&low, "output");
    let gold = f(&golden, "output");
    let abs: Vec<f64> = out
        .iter()
        .zip(&gold)
        .map(|(a, b)| (a - b).abs() as f64)
        .collect();
    (f(&low, "add_out"), f(&low, "sub_out"), median_of(&abs))
}

#[test]
fn seed_fp16_overflow_reproduces() {
    // --fp16 --layer-precisions Add:float16 Sub:float32: x + 65504 rounds to 65504 in fp16,
    // so the Sub (in fp32) returns 0 and the output loses x entirely (median |err| = 1.5).
    let (add, sub, median) = fp16_with(&["Add:float16", "Sub:float32"]);
    assert!(
        add.iter().all(|&v| v == 65504.0),
        "add_out must saturate at 65504"
    );
    assert!(sub.iter().all(|&v| v == 0.0), "sub_out must be 0");
    assert!(
        (median - 1.5).abs() < 1e-3,
        "median abs error {median}, seed log says 1.5"
    );
    // Both in fp32: the error is fp16 rounding noise of x (< 2^-10 relative to values in [1, 2]).
    let (_, sub, median) = fp16_with(&["Add:float32", "Sub:float32"]);
    assert!(sub.iter().all(|&v| (1.0..=2.0).contains(&v)));
    assert!(median < 2e-3, "median abs error {median}");
}

#[test]
fn seed_overflow_vanishes_when_add_and_sub_are_one_float16_kernel() {
    // All float16, unfused: x + 65504 rounds to 65504 and the output loses x (the seed's
    // overflow). Add and Sub fused into one float16 kernel (what TensorRT does when they share
    // a precision): the sum stays in f32 inside it, only Sub's output is rounded.
    let (add, _, median) = fp16_fused(&[], &[]);
    assert!(add.iter().all(|&v| v == 65504.0));
    assert!((median - 1.5).abs() < 1e-3, "{median}");
    let (add, sub, median) = fp16_fused(&[], &[&["Add", "Sub"]]);
    assert!(add.iter().all(|&v| v > 65504.0), "the intermediate is f32");
    assert!(sub.iter().all(|&v| (1.0..=2.0).contains(&v)));
    assert!(median < 2e-3, "median abs error {median}");
    // A precision boundary inside the region is an error naming it.
    let model = load_model(repo_root().join("examples/needs_constraints.onnx")).unwrap();
    let mut plan = PrecisionPlan::uniform(&model.graph, mixprec::precision::Precision::Float16);
    plan.layers[2] = mixprec::precision::Precision::Float32;
    plan.regions.push(mixprec::precision::plan::FusionRegion {
        name: "add_sub".into(),
        nodes: vec!["Add".into(), "Sub".into()],
    });
    let e = PreparedPlan::new(&model.graph, &plan, &PlanOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("'add_sub'") && e.contains("Sub float32"), "{e}");
}

#[test]
fn seed_commands_on_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let model = repo_root().join("examples/needs_constraints.onnx");
    let model = model.to_str().unwrap();
    let inp = tmp.path().join("in.json");
    let gold = tmp.path().join("gold.json");
    let (inp, gold) = (inp.to_str().unwrap(), gold.to_str().unwrap());
    let o = mixprec(&[
        "run",
        model,
        "--val-range",
        "x:[1,2]",
        "--save-inputs",
        inp,
        "--save-outputs",
        gold,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let run = |extra: &[&str]| {
        let mut a = vec![
            "run",
            model,
            "--fp16",
            "--load-inputs",
            inp,
            "--load-outputs",
            gold,
            "--check-error-stat",
            "median",
        ];
        a.extend_from_slice(extra);
        mixprec(&a)
    };
    let o = run(&[
        "--layer-precisions",
        "Add:float16",
        "Sub:float32",
        "--precision-constraints",
        "prefer",
        "--verbose",
    ]);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(
        t.contains("Minimum Required Tolerance: median error | [abs=1.5] OR [rel=1]"),
        "{t}"
    );
    assert!(t.contains("1 float32, 3 float16"), "{t}");
    assert!(
        t.lines()
            .any(|l| l.contains(" Sub ") && l.trim_end().ends_with("float32")),
        "{t}"
    );
    let o = run(&["--layer-precisions", "Add:float32", "Sub:float32"]);
    assert!(o.status.success(), "{}", text(&o));
    // Bad input: an unknown dtype is an error naming the item; a pattern that matches nothing
    // is a warning naming the pattern.
    let o = run(&["--layer-precisions", "Add:float64"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("Add:float64"), "{}", text(&o));
    let o = run(&[
        "--layer-precisions",
        "*Softmax*:float32",
        "Add:float32",
        "Sub:float32",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("warning: --layer-precisions: pattern '*Softmax*' matches no layer"),
        "{}",
        text(&o)
    );
    // int8 on an Add with obey is an error naming the layer.
    let o = run(&[
        "--layer-precisions",
        "Add:int8",
        "--precision-constraints",
        "obey",
    ]);
    assert!(!o.status.success());
    assert!(text(&o).contains("'Add'"), "{}", text(&o));
}

#[test]
fn convert_and_int8_runs_on_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let p = |n: &str| tmp.path().join(n).to_string_lossy().into_owned();
    let model = repo_root().join("examples/transformer.onnx");
    let model = model.to_str().unwrap();
    // int8 without a cache: calibrates on the fly and saves the cache; the next run reads it.
    let cache = p("t.cache");
    let o = mixprec(&[
        "run",
        model,
        "--int8",
        "--fp16",
        "--calibration-cache",
        &cache,
        "--val-range",
        "[-1,1]",
        "--iterations",
        "2",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("Saved calibration cache"), "{}", text(&o));
    assert!(text(&o).contains("35 float16, 16 int8"), "{}", text(&o));
    let first = std::fs::read_to_string(&cache).unwrap();
    assert!(
        first.starts_with("TRT-8601-EntropyCalibration2\n"),
        "{first}"
    );
    let o = mixprec(&[
        "run",
        model,
        "--int8",
        "--calibration-cache",
        &cache,
        "--val-range",
        "[-1,1]",
    ]);
    assert!(
        o.status.success() && !text(&o).contains("Calibrating"),
        "{}",
        text(&o)
    );

    // convert writes a model ONNX Runtime loads and runs.
    let out = p("t_int8.onnx");
    let o = mixprec(&[
        "convert",
        model,
        "--int8",
        "--fp16",
        "--calibration-cache",
        &cache,
        "-o",
        &out,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let py = crate::common::python();
    let check = std::process::Command::new(py)
        .args(["-c", "import sys, numpy as np, onnxruntime as ort; s = ort.InferenceSession(sys.argv[1]); i = s.get_inputs()[0]; y = s.run(None, {i.name: np.zeros([1, 32, 64], np.float32)}); assert np.isfinite(y[0]).all()", &out])
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", text(&check));

    // A cache from another model: warns about foreign tensors, fails on missing ones, and
    // writes nothing.
    let foreign = p("foreign.cache");
    std::fs::write(
        &foreign,
        "TRT-8601-EntropyCalibration2\nsome_other_tensor: 3c010204\n",
    )
    .unwrap();
    let out2 = p("never.onnx");
    let o = mixprec(&[
        "convert",
        model,
        "--int8",
        "--calibration-cache",
        &foreign,
        "-o",
        &out2,
    ]);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(
        t.contains("some_other_tensor") && t.contains("foreign.cache"),
        "{t}"
    );
    assert!(t.contains("no range for"), "{t}");
    assert!(!std::path::Path::new(&out2).exists());
    // A malformed cache line names the file and line.
    std::fs::write(&foreign, "TRT-8601-EntropyCalibration2\ntokens 3c010204\n").unwrap();
    let o = mixprec(&["run", model, "--int8", "--calibration-cache", &foreign]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(err.contains("foreign.cache") && err.contains('2'), "{err}");
}

/// The seed's comparison (docs: seeds/004): FP16 with Add in float16 and Sub in float32 against
/// the FP32 golden, checked on the median. The output's lines follow Polygraphy's layout.
#[test]
fn seed_comparison_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let model = repo_root().join("examples/needs_constraints.onnx");
    let model = model.to_str().unwrap();
    let gold = tmp.path().join("gold.json");
    let gold = gold.to_str().unwrap();
    let o = mixprec(&[
        "run",
        model,
        "--val-range",
        "x:[1,2]",
        "--save-outputs",
        gold,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = mixprec(&[
        "run",
        model,
        "--fp16",
        "--layer-precisions",
        "Add:float16",
        "Sub:float32",
        "--val-range",
        "x:[1,2]",
        "--check-error-stat",
        "median",
        "--load-outputs",
        gold,
    ]);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    let lines: Vec<&str> = t.lines().collect();
    let find = |prefix: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting with {prefix:?} in\n{t}"))
    };
    let cmp = find("[I]     Comparing Output: 'output' (dtype=float32, shape=(1, 1, 256, 256)) with 'output' (dtype=float32, shape=(1, 1, 256, 256))");
    assert_eq!(
        lines[cmp + 1],
        "[I]         Tolerance: [abs=1e-05, rel=1e-05] | Checking median error"
    );
    assert!(lines[cmp + 2].starts_with("[I]         mixprec-float16-runner: output | Stats: mean=0, std-dev=0, var=0, median=0, min=0 at (0, 0, 0, 0), max=0 at (0, 0, 0, 0), avg-magnitude=0, p90=0"), "{t}");
    assert!(lines.iter().any(|l| l.starts_with("[I]         mixprec-fp32-runner: output | Stats: mean=1.4995, std-dev=0.28889, var=0.083457, median=1.5, min=1 at ")), "{t}");
    find("[I]         Error Metrics: output");
    find("[I]             Minimum Required Tolerance: median error | [abs=1.5] OR [rel=1]");
    let abs = find("[I]             Absolute Difference | Stats: mean=1.4995, std-dev=0.28889");
    assert_eq!(lines[abs + 1], "[I]                 ---- Histogram ----");
    assert_eq!(
        lines[abs + 2],
        "                    Bin Range  |  Num Elems | Visualization"
    );
    assert!(
        lines[abs + 3].starts_with("                    (1  , 1.1) | "),
        "{t}"
    );
    assert!(
        lines[abs + 12].starts_with("                    (1.9, 2  ) | "),
        "{t}"
    );
    let counts: u64 = lines[abs + 3..abs + 13]
        .iter()
        .map(|l| l.split('|').nth(1).unwrap().trim().parse::<u64>().unwrap())
        .sum();
    assert_eq!(counts, 65536);
    let rel = find("[I]             Relative Difference | Stats: mean=1, std-dev=0, var=0, median=1, min=1 at (0, 0, 0, 0)");
    assert!(
        lines[rel + 8].starts_with("                    (1  , 1.1) |      65536 | ####"),
        "{t}"
    );
    find("[E]         FAILED | Output: 'output' | Difference exceeds tolerance (rel=1e-05, abs=1e-05)");
    find("[E]     FAILED | Mismatched outputs: ['output']");
    find("[E] Accuracy Summary | mixprec-float16-runner vs. mixprec-fp32-runner | Passed: 0/1 iterations | Pass Rate: 0.00%");
}

#[test]
fn mark_all_shows_where_the_error_starts() {
    let model = repo_root().join("examples/needs_constraints.onnx");
    let o = mixprec(&[
        "run",
        model.to_str().unwrap(),
        "--fp16",
        "--layer-precisions",
        "Add:float16",
        "Sub:float32",
        "--val-range",
        "x:[1,2]",
        "--mark-all",
        "--check-error-stat",
        "median",
        "--atol",
        "1e-3",
    ]);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    // MatMul's fp16 noise passes atol 1e-3; the Add (65504 + x in fp16) is the first failure and
    // carries all the growth (about 1.5).
    let row = |name: &str| {
        t.lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("no row for {name}: {t}"))
            .to_string()
    };
    assert!(row("MatMul").contains("PASSED"), "{t}");
    let add = row("Add");
    assert!(
        add.contains("FAILED") && add.contains("first failing layer"),
        "{t}"
    );
    let growth: f64 = add.split_whitespace().nth(6).unwrap().parse().unwrap();
    assert!((growth - 1.5).abs() < 0.01, "{add}");
    assert!(t.contains("First failing layer: #1 'Add'"), "{t}");
}
