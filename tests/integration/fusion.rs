//! `--fusion tensorrt` end to end: the seed's needs_constraints model (Polygraphy example 08),
//! the generated CNN (Conv+BatchNormalization+Relu+Add) and a decomposed LayerNorm block
//! (scripts/gen_models.py), and a search whose fused answer re-runs as passing.

use crate::common::{example, mixprec, text};
use crate::models::models_dir;
use half::f16;
use mixprec::exec::{PlanOptions, PreparedPlan, RunOptions};
use mixprec::precision::fusion::FusionModel;
use mixprec::precision::plan::{FusionRegion, PrecisionPlan};
use mixprec::precision::Precision;
use mixprec::{load_model, Graph, Interpreter};
use std::collections::HashSet;

const SEED_CHECK: [&str; 11] = [
    "--trt",
    "--fp16",
    "--onnxrt",
    "--val-range",
    "x:[1,2]",
    "--check-error-stat",
    "median",
    "--atol",
    "1e-2",
    "--rtol",
    "1e-2",
];

fn run_seed(extra: &[&str]) -> (bool, String) {
    let m = example("needs_constraints.onnx");
    let mut args = vec!["run", m.as_str()];
    args.extend(SEED_CHECK);
    args.extend(extra);
    let o = mixprec(&args);
    (o.status.success(), text(&o))
}

#[test]
fn seed_model_all_float16_passes_with_tensorrt_fusion_and_fails_without() {
    let (ok, log) = run_seed(&[]);
    assert!(!ok, "unfused all-float16 must fail (Add overflows): {log}");
    let (ok, log) = run_seed(&["--fusion", "none"]);
    assert!(!ok, "--fusion none is the default: {log}");
    let (ok, log) = run_seed(&["--fusion", "tensorrt"]);
    assert!(ok, "MatMul+Add+Sub fused keeps 65504+x in f32: {log}");
    assert!(
        log.contains("Fusion (tensorrt): 1 region(s) of 3 layer(s)"),
        "{log}"
    );
    // Add:float16, Sub:float32: a precision boundary splits the region, Add's output is
    // rounded to float16 and the error is back (the seed's point).
    let (ok, log) = run_seed(&[
        "--fusion",
        "tensorrt",
        "--layer-precisions",
        "Add:float16",
        "Sub:float32",
    ]);
    assert!(!ok, "the split region must fail: {log}");
    // -v lists the regions.
    let (_, log) = run_seed(&["--fusion", "tensorrt", "-v"]);
    assert!(
        log.contains("region MatMul..Sub (float16): MatMul, Add, Sub"),
        "{log}"
    );
    // A bad model name is a clear error.
    let (ok, log) = run_seed(&["--fusion", "xla"]);
    assert!(!ok && log.contains("--fusion 'xla'"), "{log}");
}

/// Runs `graph` with every layer in float16 under the TensorRT model and checks what
/// regions mean: values passed inside a region are not rounded (some are no float16 value),
/// values leaving it are (every one is a float16 value). Returns the regions as node names.
fn check_region_semantics(graph: &Graph, feeds: &mixprec::exec::Feeds) -> Vec<Vec<String>> {
    let mut plan = PrecisionPlan::uniform(graph, Precision::Float16);
    plan.fusion = FusionModel::TensorRt;
    let prepared = PreparedPlan::new(graph, &plan, &PlanOptions::default()).unwrap();
    let regions = prepared.derived_regions().to_vec();
    assert!(!regions.is_empty());
    // The derived regions pass the checks a plan file's regions get (one precision, convex,
    // no node twice).
    let mut explicit = PrecisionPlan::uniform(graph, Precision::Float16);
    explicit.regions = regions
        .iter()
        .map(|r| FusionRegion {
            name: r.name.clone(),
            nodes: r
                .nodes
                .iter()
                .map(|&i| graph.nodes[i].name.clone())
                .collect(),
        })
        .collect();
    assert_eq!(
        explicit.resolve_regions(graph).unwrap().len(),
        regions.len()
    );
    let r = Interpreter::new(graph)
        .unwrap()
        .run_plan(
            feeds,
            &RunOptions {
                keep_intermediates: true,
            },
            &prepared,
        )
        .unwrap();
    let is_f16 = |v: f32| !v.is_finite() || f16::from_f32(v).to_f32() == v;
    let mut internal_not_f16 = 0;
    for reg in &regions {
        let members: HashSet<usize> = reg.nodes.iter().copied().collect();
        for &i in &reg.nodes {
            for o in &graph.nodes[i].outputs {
                let leaves = graph.outputs.iter().any(|v| v.name == *o)
                    || graph
                        .nodes
                        .iter()
                        .enumerate()
                        .any(|(j, n)| !members.contains(&j) && n.inputs.contains(o));
                let v = r
                    .intermediates
                    .get(o)
                    .or_else(|| r.output(o))
                    .unwrap_or_else(|| panic!("value {o}"))
                    .to_f32_vec()
                    .unwrap();
                if leaves {
                    assert!(
                        v.iter().all(|&x| is_f16(x)),
                        "{o} leaves region {} and must be rounded to float16",
                        reg.name
                    );
                } else if v.iter().any(|&x| !is_f16(x)) {
                    internal_not_f16 += 1;
                }
            }
        }
    }
    assert!(
        internal_not_f16 > 0,
        "values inside regions stay f32: some must not be float16 values"
    );
    regions
        .iter()
        .map(|r| {
            r.nodes
                .iter()
                .map(|&i| graph.nodes[i].name.clone())
                .collect()
        })
        .collect()
}

fn feeds_of(graph: &Graph) -> mixprec::exec::Feeds {
    let mut feeds = mixprec::exec::Feeds::new();
    for vi in &graph.inputs {
        let shape: Vec<usize> = vi
            .shape
            .as_ref()
            .unwrap()
            .iter()
            .map(|d| match d {
                mixprec::graph::Dim::Fixed(n) => *n,
                _ => 1,
            })
            .collect();
        let n: usize = shape.iter().product();
        let v = (0..n)
            .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
            .collect();
        feeds.insert(vi.name.clone(), mixprec::Tensor::from_f32(shape, v));
    }
    feeds
}

#[test]
fn convert_records_the_assumed_regions_and_exports_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let m = example("needs_constraints.onnx");
    let plain = dir.path().join("plain.onnx");
    let fused = dir.path().join("fused.onnx");
    let o = mixprec(&["convert", &m, "--fp16", "-o", plain.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains("Fusion"), "{}", text(&o));
    let o = mixprec(&[
        "convert",
        &m,
        "--fp16",
        "--fusion",
        "tensorrt",
        "-v",
        "-o",
        fused.to_str().unwrap(),
    ]);
    let log = text(&o);
    assert!(o.status.success(), "{log}");
    assert!(
        log.contains("Fusion (tensorrt): 1 region(s) of 3 layer(s)"),
        "{log}"
    );
    assert!(log.contains("cannot state fusion"), "{log}");
    assert!(
        log.contains("region MatMul..Sub (float16): MatMul, Add, Sub"),
        "{log}"
    );
    // An ONNX file cannot state fusion: the export is the same.
    assert_eq!(
        std::fs::read(&plain).unwrap(),
        std::fs::read(&fused).unwrap()
    );
}

#[test]
fn cnn_conv_batchnorm_relu_add_regions_keep_f32_inside_and_round_outputs_once() {
    let m = load_model(models_dir().join("cnn.onnx")).unwrap();
    let g = &m.graph;
    let regions = check_region_semantics(g, &feeds_of(g));
    let ops = |r: &Vec<String>| -> Vec<String> {
        r.iter()
            .map(|n| {
                g.nodes
                    .iter()
                    .find(|x| x.name == *n)
                    .unwrap()
                    .op_type
                    .clone()
            })
            .collect()
    };
    // The residual blocks: Conv → BatchNormalization → Add → Relu as one epilogue, and the
    // stem and first convs as Conv → BatchNormalization → Relu.
    assert!(
        regions
            .iter()
            .any(|r| ops(r) == ["Conv", "BatchNormalization", "Add", "Relu"]),
        "{regions:?}"
    );
    assert!(
        regions
            .iter()
            .any(|r| ops(r) == ["Conv", "BatchNormalization", "Relu"]),
        "{regions:?}"
    );
}

#[test]
fn decomposed_layernorm_is_one_region_with_f32_statistics() {
    let m = load_model(models_dir().join("decomposed_layernorm.onnx")).unwrap();
    let g = &m.graph;
    let regions = check_region_semantics(g, &feeds_of(g));
    assert_eq!(
        regions,
        vec![vec![
            "ln_mean", "ln_sub", "ln_pow", "ln_var", "ln_eps", "ln_sqrt", "ln_div", "ln_gamma",
            "ln_beta"
        ]]
    );
}

#[test]
fn debug_precision_reports_both_answers_and_the_fused_one_reruns_as_passing() {
    let dir = tempfile::tempdir().unwrap();
    let result = dir.path().join("result.json");
    let model = models_dir().join("planted_cnn.onnx");
    let m = model.to_str().unwrap();
    let criterion = [
        "--val-range",
        "[-1,1]",
        "--check-error-stat",
        "median",
        "--atol",
        "1e-2",
        "--rtol=1e-2",
    ];
    let mut args = vec!["debug", "precision", m, "--fp16", "--fusion", "tensorrt"];
    args.extend(criterion);
    args.extend(["--save-result", result.to_str().unwrap()]);
    let o = mixprec(&args);
    let log = text(&o);
    assert!(o.status.success(), "{log}");
    assert!(log.contains("==== Answer safe on any engine"), "{log}");
    assert!(log.contains("==== Answer with TensorRT fusion"), "{log}");
    assert!(
        log.lines()
            .any(|l| l.contains("mixprec convert") && l.contains("--fusion tensorrt")),
        "{log}"
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
    assert_eq!(
        v["fusion"], "none",
        "the top level is the answer without fusion"
    );
    assert_eq!(v["with_fusion"]["fusion"], "tensorrt");
    let names = |x: &serde_json::Value| -> Vec<String> {
        x["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["name"].as_str().unwrap().to_string())
            .collect()
    };
    let fused = names(&v["with_fusion"]);
    assert!(!names(&v).is_empty() && !fused.is_empty(), "{v}");
    // The fused answer re-runs as passing under the same model, and the plan without it fails.
    let items: Vec<String> = fused.iter().map(|n| format!("{n}:float32")).collect();
    let mut rerun = vec![
        "run", m, "--trt", "--fp16", "--onnxrt", "--fusion", "tensorrt",
    ];
    rerun.extend(criterion);
    let o = mixprec(&rerun);
    assert!(!o.status.success(), "all float16 must fail: {}", text(&o));
    rerun.push("--layer-precisions");
    rerun.extend(items.iter().map(String::as_str));
    let o = mixprec(&rerun);
    assert!(o.status.success(), "{}", text(&o));
}

/// A Q/DQ model (`convert --int8` of the generated CNN) under `run --fusion tensorrt`: every
/// quantized Conv/Gemm runs as TensorRT's integer kernel (`-v` lists them), the outputs differ
/// from `--fusion none` (plain ONNX semantics) by f32 noise only, and no precision flag is
/// needed (docs/numerics.md, "Q/DQ under TensorRT").
#[test]
fn qdq_export_runs_integer_kernels_under_tensorrt_and_differs_from_none_by_f32_noise() {
    let dir = tempfile::tempdir().unwrap();
    let cnn = models_dir().join("cnn.onnx");
    let q = dir.path().join("cnn_int8.onnx");
    let o = mixprec(&[
        "convert",
        cnn.to_str().unwrap(),
        "--int8",
        "-o",
        q.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let outputs = |fusion: &str| -> (Vec<f32>, String) {
        let out = dir.path().join(format!("{fusion}.json"));
        let o = mixprec(&[
            "run",
            q.to_str().unwrap(),
            "--fusion",
            fusion,
            "--seed",
            "1",
            "-v",
            "--save-outputs",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", text(&o));
        let golden = mixprec::golden::GoldenFile::load(&out).unwrap();
        let t = golden.results.runners[0].1[0].outputs[0].1.clone();
        (t.to_f32_vec().unwrap(), text(&o))
    };
    let (none, log_none) = outputs("none");
    let (trt, log_trt) = outputs("tensorrt");
    assert!(!log_none.contains("quantized kernel"), "{log_none}");
    let kernels = log_trt.matches("runs as a quantized kernel").count();
    assert_eq!(kernels, 13, "every Conv and the Gemm: {log_trt}");
    assert!(!log_trt.contains("runs unfused"), "{log_trt}");
    assert_ne!(none, trt, "the integer accumulation is visible");
    let scale = none.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (a, b) in none.iter().zip(&trt) {
        assert!((a - b).abs() <= 1e-5 * scale, "{a} vs {b}");
    }
}

/// A strongly typed float16 model (what TensorRT 11 builds, here `convert --fp16`'s export)
/// is fused as the float32 model under a float16 plan is: the same regions, and the outputs
/// equal bit for bit — its nodes compute in the type they declare, and inside a region in
/// f32 (docs/numerics.md, "Strongly typed 16-bit models"). Without `--fusion` the export
/// rounds every node's output, and on the seed's model that overflows.
#[test]
fn a_float16_export_is_fused_as_the_float16_plan_is_and_gives_the_same_bits() {
    let dir = tempfile::tempdir().unwrap();
    let models = [
        example("needs_constraints.onnx"),
        example("transformer.onnx"),
        models_dir().join("cnn.onnx").to_string_lossy().into_owned(),
        models_dir()
            .join("decomposed_layernorm.onnx")
            .to_string_lossy()
            .into_owned(),
    ];
    for (k, m) in models.iter().enumerate() {
        let exported = dir.path().join(format!("m{k}_fp16.onnx"));
        let o = mixprec(&["convert", m, "--fp16", "-o", exported.to_str().unwrap()]);
        assert!(o.status.success(), "{}", text(&o));
        let original = load_model(m).unwrap();
        let native = load_model(&exported).unwrap();
        let feeds = if k == 0 {
            // The seed's inputs are in [1, 2].
            let mut f = feeds_of(&original.graph);
            for t in f.values_mut() {
                let v: Vec<f32> = t
                    .to_f32_vec()
                    .unwrap()
                    .iter()
                    .map(|x| 1.5 + x / 2.0)
                    .collect();
                *t = mixprec::Tensor::from_f32(t.shape().to_vec(), v);
            }
            f
        } else {
            feeds_of(&original.graph)
        };
        let run = |g: &Graph, p: Precision, fusion: FusionModel| {
            let mut plan = PrecisionPlan::uniform(g, p);
            plan.fusion = fusion;
            let prepared = PreparedPlan::new(g, &plan, &PlanOptions::default()).unwrap();
            let regions: Vec<Vec<String>> = prepared
                .derived_regions()
                .iter()
                .map(|r| r.nodes.iter().map(|&i| g.nodes[i].name.clone()).collect())
                .collect();
            let r = Interpreter::new(g)
                .unwrap()
                .run_plan(&feeds, &RunOptions::default(), &prepared)
                .unwrap();
            let outs: Vec<Vec<u32>> = r
                .outputs
                .iter()
                .map(|(_, t)| {
                    t.to_f32_vec()
                        .unwrap()
                        .iter()
                        .map(|v| v.to_bits())
                        .collect()
                })
                .collect();
            (regions, outs)
        };
        let (want_regions, want) = run(&original.graph, Precision::Float16, FusionModel::TensorRt);
        let (regions, got) = run(&native.graph, Precision::Float32, FusionModel::TensorRt);
        assert!(!want_regions.is_empty(), "{m}");
        assert_eq!(regions, want_regions, "{m}: the same regions");
        assert!(
            got == want,
            "{m}: the fused export must equal the fused float16 plan"
        );
        // Unfused, the export equals the unfused plan, and the regions made a difference.
        let (_, unfused) = run(&native.graph, Precision::Float32, FusionModel::None);
        let (_, plan_unfused) = run(&original.graph, Precision::Float16, FusionModel::None);
        assert!(
            unfused == plan_unfused,
            "{m}: unfused export = unfused plan"
        );
        assert!(unfused != got, "{m}: fusion changes the export's result");
        // Only values that stay inside a region are f32 tensors; every value that leaves one
        // is stored in its declared float16 type.
        let g = &native.graph;
        let region_of: std::collections::HashMap<&str, usize> = regions
            .iter()
            .enumerate()
            .flat_map(|(k, r)| r.iter().map(move |n| (n.as_str(), k)))
            .collect();
        let values = |fusion: FusionModel| {
            let mut plan = PrecisionPlan::uniform(g, Precision::Float32);
            plan.fusion = fusion;
            let prepared = PreparedPlan::new(g, &plan, &PlanOptions::default()).unwrap();
            let opts = RunOptions {
                keep_intermediates: true,
            };
            Interpreter::new(g)
                .unwrap()
                .run_plan(&feeds, &opts, &prepared)
                .unwrap()
                .intermediates
        };
        let (fused, plain) = (values(FusionModel::TensorRt), values(FusionModel::None));
        let mut inside = 0;
        for n in &g.nodes {
            for o in &n.outputs {
                let (Some(a), Some(b)) = (fused.get(o), plain.get(o)) else {
                    continue;
                };
                let stays = region_of.get(n.name.as_str()).is_some_and(|&k| {
                    !g.outputs.iter().any(|v| v.name == *o)
                        && g.nodes
                            .iter()
                            .filter(|r| r.inputs.contains(o))
                            .all(|r| region_of.get(r.name.as_str()) == Some(&k))
                });
                if stays {
                    inside += 1;
                    assert_eq!(a.dtype(), mixprec::DType::F32, "{m}: {o} stays inside");
                } else {
                    assert_eq!(a.dtype(), b.dtype(), "{m}: {o} leaves in its declared type");
                }
            }
        }
        assert!(inside > 0, "{m}");
    }
}
