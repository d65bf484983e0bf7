//! `mixprec plan`'s exported model (`-o`) in ONNX Runtime: the chosen plan of the planted model
//! of plan.rs (fp8, int8 and float16 layers) and of a real CNN of the corpus (PP-OCR's angle
//! classifier), exported as `plan` writes it, run by ORT (CPU, graph optimizations disabled) and
//! compared with (a) mixprec's emulation of the chosen plan (the outputs `plan` judged) and
//! (b) mixprec running the exported file itself (`mixprec run mixed.onnx`: the model's own Casts
//! and Q/DQ decide). docs/plan.md, "What ONNX Runtime runs", says what holds and why.

use crate::common::{mixprec, python, repo_root, text};
use crate::plan::uniform;
use mixprec::data::polygraphy::{load_run_results, save_inputs};
use mixprec::event::NoProgress;
use mixprec::exec::{feed_shapes, RunOptions};
use mixprec::export::write_model;
use mixprec::jobs::options::{CalibOptions, CompareOptions, Inputs, PrecisionOptions};
use mixprec::jobs::plan::{run, Config};
use mixprec::onnx::proto::*;
use mixprec::onnx::{model_from_proto, read_tensor_file, tensor_to_proto};
use mixprec::precision::plan::PrecisionPlan;
use mixprec::{load_model, Feeds, Interpreter, Tensor};
use prost::Message;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;

/// Bit equality of two tensors of one element type (NaN equals NaN; -0 is not +0).
fn same_bits(a: &Tensor, b: &Tensor) -> bool {
    if a.dtype() != b.dtype() || a.shape() != b.shape() {
        return false;
    }
    match (a.to_f64_vec(), b.to_f64_vec()) {
        (Some(x), Some(y)) => x
            .iter()
            .zip(&y)
            .all(|(p, q)| p.to_bits() == q.to_bits() || p.is_nan() && q.is_nan()),
        _ => a.to_i64_vec() == b.to_i64_vec(),
    }
}

/// How far `got` is from `want`: max |diff|, that over max |want|, and the elements whose bits
/// differ.
#[derive(Default, Clone, Copy, Debug)]
struct Diff {
    max_abs: f64,
    rel: f64,
    differ: usize,
    len: usize,
}

fn diff(got: &Tensor, want: &Tensor) -> Diff {
    assert_eq!(got.shape(), want.shape());
    let (a, b) = (got.to_f64_vec().unwrap(), want.to_f64_vec().unwrap());
    let scale = b.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-30);
    let mut d = Diff {
        len: a.len(),
        ..Default::default()
    };
    for (x, y) in a.iter().zip(&b) {
        if x.to_bits() != y.to_bits() && !(x.is_nan() && y.is_nan()) {
            d.differ += 1;
            d.max_abs = d.max_abs.max(if (x - y).is_nan() {
                f64::INFINITY
            } else {
                (x - y).abs()
            });
        }
    }
    d.rel = d.max_abs / scale;
    d
}

fn worst(ds: impl IntoIterator<Item = Diff>) -> Diff {
    ds.into_iter().fold(Diff::default(), |w, d| Diff {
        max_abs: w.max_abs.max(d.max_abs),
        rel: w.rel.max(d.rel),
        differ: w.differ + d.differ,
        len: w.len + d.len,
    })
}

/// ONNX Runtime's run of one input set: the outputs, and every value of a second session in
/// which every node output is a graph output (scripts/ort_run.py --values).
struct OrtRun {
    outputs: Vec<Tensor>,
    values: HashMap<String, Tensor>,
}

fn onnxruntime(model: &Path, graph: &mixprec::Graph, feeds: &Feeds, dir: &Path) -> OrtRun {
    let (inputs, out, values) = (dir.join("inputs"), dir.join("ort"), dir.join("values"));
    std::fs::create_dir_all(&inputs).unwrap();
    for (k, vi) in graph.inputs.iter().enumerate() {
        let bytes = tensor_to_proto(&vi.name, &feeds[&vi.name]).encode_to_vec();
        std::fs::write(inputs.join(format!("input_{k}.pb")), bytes).unwrap();
    }
    let o = Command::new(python())
        .arg(repo_root().join("scripts/ort_run.py"))
        .arg(model)
        .args(["--opt-level", "disable", "--inputs"])
        .arg(&inputs)
        .arg("--out")
        .arg(&out)
        .arg("--values")
        .arg(&values)
        .output()
        .expect("run scripts/ort_run.py");
    assert!(o.status.success(), "ort_run.py: {}", text(&o));
    let read_all = |dir: &Path, stem: &str| -> Vec<(String, Tensor)> {
        (0..)
            .map(|k| dir.join(format!("{stem}_{k}.pb")))
            .take_while(|p| p.exists())
            .map(|p| read_tensor_file(&p).unwrap())
            .collect()
    };
    OrtRun {
        outputs: read_all(&out, "output")
            .into_iter()
            .map(|(_, t)| t)
            .collect(),
        values: read_all(&values, "value").into_iter().collect(),
    }
}

/// What one plan's exported model computes in ONNX Runtime against mixprec.
struct Measured {
    /// The chosen format of every candidate layer.
    chosen: BTreeMap<String, String>,
    /// ORT (optimizations disabled) against the emulation of the plan, by output name (the
    /// worst over the input sets).
    ort_vs_emulation: BTreeMap<String, Diff>,
    /// ORT against `mixprec run` of the exported file, per output.
    ort_vs_file: Vec<Diff>,
    /// The same, ORT with every value a graph output (every Cast kept: see ort_run.py).
    ort_every_value_vs_file: Vec<Diff>,
    /// Each node run alone on ORT's inputs, against ORT's output, by (op type, output type):
    /// nodes run, nodes whose output differs, the worst difference.
    nodes: BTreeMap<(String, String), (usize, usize, Diff)>,
}

fn plan_in_onnxruntime(
    tag: &str,
    model: &Path,
    sets: Vec<Feeds>,
    formats: &str,
    metric: &[&str],
) -> Measured {
    let dir = repo_root().join("target/test-models/plan_ort").join(tag);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = Config {
        model: model.to_path_buf(),
        inputs: Inputs::Feeds(sets.clone()),
        formats: vec![formats.into()],
        compare: CompareOptions {
            atol: vec!["1e30".into()],
            metric: metric.iter().map(|m| m.to_string()).collect(),
            ..Default::default()
        },
        calib: CalibOptions {
            calibration_algo: Some("minmax".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let o = run(
        config.validate().unwrap(),
        &mut |_| {},
        &NoProgress,
        &AtomicBool::new(false),
    )
    .unwrap();
    let plan = o.chosen_plan().expect("a point passed").clone();
    let graph = &o.model.graph;
    let chosen: BTreeMap<String, String> = PrecisionPlan::candidates(graph)
        .into_iter()
        .map(|i| (graph.nodes[i].name.clone(), plan.layers[i].to_string()))
        .collect();
    // The model `plan -o` writes.
    let mixed = dir.join("mixed.onnx");
    write_model(&mixed, &o.export().unwrap().unwrap().model).unwrap();
    // (a) the emulation of the chosen plan, as plan judged it.
    let prepared = PrecisionOptions::default()
        .prepare(graph, &plan, o.amax.as_ref(), &feed_shapes(&sets[0]))
        .unwrap();
    let interp = Interpreter::new(graph).unwrap();
    let emulated: Vec<Vec<(String, Tensor)>> = sets
        .iter()
        .map(|f| {
            interp
                .run_plan(f, &RunOptions::default(), &prepared)
                .unwrap()
                .outputs
        })
        .collect();
    // (b) `mixprec run mixed.onnx` on the same inputs (and its every value, in-process).
    let (inputs_json, outputs_json) = (dir.join("inputs.json"), dir.join("outputs.json"));
    save_inputs(&inputs_json, &sets).unwrap();
    let r = mixprec(&[
        "run",
        mixed.to_str().unwrap(),
        "--load-inputs",
        inputs_json.to_str().unwrap(),
        "--save-outputs",
        outputs_json.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", text(&r));
    let results = load_run_results(&outputs_json).unwrap();
    let file_runs = &results.runners[0].1;
    assert_eq!(file_runs.len(), sets.len());
    let exported = load_model(&mixed).unwrap();
    let proto = ModelProto::decode(std::fs::read(&mixed).unwrap().as_slice()).unwrap();
    let mut m = Measured {
        chosen,
        ort_vs_emulation: BTreeMap::new(),
        ort_vs_file: vec![],
        ort_every_value_vs_file: vec![],
        nodes: BTreeMap::new(),
    };
    for (i, f) in sets.iter().enumerate() {
        let file = &file_runs[i].outputs;
        // The exported file in mixprec computes what plan emulated, bit for bit.
        for ((name, a), (_, b)) in file.iter().zip(&emulated[i]) {
            assert!(
                same_bits(a, b),
                "{tag} set {i} {name}: mixprec on the exported model differs from the emulated plan ({:?})",
                diff(a, b)
            );
        }
        let ort = onnxruntime(&mixed, &exported.graph, f, &dir.join(format!("set{i}")));
        assert_eq!(ort.outputs.len(), file.len());
        for (k, (name, t)) in file.iter().enumerate() {
            let e = m.ort_vs_emulation.entry(name.clone()).or_default();
            *e = worst([*e, diff(&ort.outputs[k], &emulated[i][k].1)]);
            m.ort_vs_file.push(diff(&ort.outputs[k], t));
            m.ort_every_value_vs_file.push(diff(&ort.values[name], t));
        }
        // Node by node: each node of the exported model run alone by mixprec on the values
        // ORT gave its inputs, against ORT's value of its output.
        node_by_node(&proto, f, &ort.values, &mut m.nodes);
    }
    m
}

/// Runs every node of `model` (but Constant) alone in mixprec, on ORT's values of its inputs
/// (initializers as stored), and records how its output compares with ORT's.
fn node_by_node(
    model: &ModelProto,
    feeds: &Feeds,
    ort: &HashMap<String, Tensor>,
    into: &mut BTreeMap<(String, String), (usize, usize, Diff)>,
) {
    let g = model.graph.as_ref().unwrap();
    let inits: HashMap<&str, &TensorProto> = g
        .initializer
        .iter()
        .map(|t| (t.name.as_deref().unwrap_or(""), t))
        .collect();
    let typed = |name: &str, t: &Tensor| ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(t.dtype().onnx_code()),
                shape: Some(TensorShapeProto {
                    dim: t
                        .shape()
                        .iter()
                        .map(|&d| tensor_shape_proto::Dimension {
                            value: Some(tensor_shape_proto::dimension::Value::DimValue(d as i64)),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    };
    for n in &g.node {
        let op = n.op_type.as_deref().unwrap_or("");
        let Some(out) = n.output.first() else {
            continue;
        };
        let Some(want) = ort.get(out.as_str()) else {
            continue;
        };
        if op == "Constant" {
            continue;
        }
        let (mut inputs, mut initializer, mut node_feeds) = (vec![], vec![], Feeds::new());
        let mut seen = HashSet::new();
        for v in n.input.iter().filter(|v| !v.is_empty()) {
            if !seen.insert(v.as_str()) {
                continue;
            }
            if let Some(t) = inits.get(v.as_str()) {
                initializer.push((*t).clone());
                continue;
            }
            let t = ort
                .get(v.as_str())
                .or_else(|| feeds.get(v.as_str()))
                .unwrap_or_else(|| panic!("no value of '{v}'"));
            inputs.push(typed(v, t));
            node_feeds.insert(v.clone(), t.clone());
        }
        let one = ModelProto {
            ir_version: model.ir_version,
            opset_import: model.opset_import.clone(),
            graph: Some(GraphProto {
                name: Some("one".into()),
                node: vec![n.clone()],
                initializer,
                input: inputs,
                output: vec![typed(out, want)],
                ..Default::default()
            }),
            ..Default::default()
        };
        let m = model_from_proto(one, Path::new("one.onnx"), Path::new("."))
            .unwrap_or_else(|e| panic!("{op} '{out}' alone: {e}"));
        let got = Interpreter::new(&m.graph)
            .and_then(|i| i.run(&node_feeds))
            .unwrap_or_else(|e| panic!("{op} '{out}' alone: {e}"));
        let got = &got.outputs[0].1;
        let e = into
            .entry((op.to_string(), want.dtype().name().to_string()))
            .or_default();
        e.0 += 1;
        if !same_bits(got, want) {
            e.1 += 1;
            e.2 = worst([e.2, diff(got, want)]);
        }
    }
}

fn print(tag: &str, m: &Measured) {
    let formats: std::collections::BTreeSet<&str> = m.chosen.values().map(|s| s.as_str()).collect();
    println!("{tag}: chosen formats {formats:?}");
    for (name, d) in &m.ort_vs_emulation {
        println!("{tag}: ORT (disabled) vs emulation, {name}: {d:?}");
    }
    println!(
        "{tag}: ORT (disabled) vs mixprec run of the file {:?}",
        worst(m.ort_vs_file.clone())
    );
    println!(
        "{tag}: ORT (every value an output) vs mixprec run of the file {:?}",
        worst(m.ort_every_value_vs_file.clone())
    );
    for ((op, ty), (n, differ, d)) in &m.nodes {
        println!(
            "{tag}: {op} -> {ty}: {differ} of {n} node runs differ from ORT (max |diff| {:.3e}, {:.2e} of max |ORT|, {} of {} values)",
            d.max_abs, d.rel, d.differ, d.len
        );
    }
}

/// What holds node by node (docs/plan.md, "What ONNX Runtime runs"): every QuantizeLinear,
/// DequantizeLinear and Cast, and every other node with a float32 output but the
/// sum-of-products ones, computes ORT's bits from ORT's inputs; Conv, MatMul, Gemm and
/// BatchNormalization in float32 differ by summation order (≤ 1e-6 of the output's range);
/// float16 nodes ORT upcasts read the float32 value before the Cast to float16 that ORT
/// removed (a float16 rounding step apart, ≤ 2e-3).
fn assert_node_by_node(tag: &str, m: &Measured) {
    for q in ["QuantizeLinear", "DequantizeLinear", "Cast"] {
        assert!(
            m.nodes.keys().any(|(op, _)| op == q),
            "{tag}: no {q} node was checked"
        );
    }
    for ((op, ty), (n, differ, d)) in &m.nodes {
        let allowed = match (op.as_str(), ty.as_str()) {
            ("QuantizeLinear" | "DequantizeLinear" | "Cast", _) => 0.0,
            ("Conv" | "MatMul" | "Gemm" | "BatchNormalization", "float32") => 1e-6,
            (_, "float16") => 2e-3,
            _ => 0.0,
        };
        assert!(
            if allowed == 0.0 {
                *differ == 0
            } else {
                d.rel <= allowed
            },
            "{tag}: {op} -> {ty}: {differ} of {n} nodes differ from ORT ({d:?}), allowed {allowed:e}"
        );
    }
}

#[test]
fn plan_export_in_onnxruntime_planted() {
    let dir = repo_root().join("target/test-models/plan_ort");
    std::fs::create_dir_all(&dir).unwrap();
    let model = PathBuf::from(crate::plan::planted(&dir));
    let sets: Vec<Feeds> = (0..2u64)
        .map(|set| {
            ["xa", "xb", "xc"]
                .iter()
                .enumerate()
                .map(|(j, name)| {
                    let t = Tensor::from_f32(vec![1, 64], uniform(100 + 10 * set + j as u64, 64));
                    (name.to_string(), t)
                })
                .collect()
        })
        .collect();
    let m = plan_in_onnxruntime(
        "planted",
        &model,
        sets,
        "fp8,int8,fp16",
        &["ya:snr:25", "yb:snr:38", "yc:snr:25"],
    );
    print("planted", &m);
    assert_eq!(
        m.chosen.values().collect::<std::collections::BTreeSet<_>>(),
        ["float16", "fp8e4m3", "int8"]
            .iter()
            .map(|s| s.to_string())
            .collect::<std::collections::BTreeSet<_>>()
            .iter()
            .collect(),
        "{:?}",
        m.chosen
    );
    assert_node_by_node("planted", &m);
    // ya and yb (fp8 and int8 MatMuls on the graph inputs): summation order only.
    for out in ["ya", "yb"] {
        assert!(
            m.ort_vs_emulation[out].rel <= 1e-6,
            "{out}: {:?}",
            m.ort_vs_emulation[out]
        );
    }
    // yc reads Scale's float16 output through fp8: ORT computes Scale in float32 (its Cast
    // pair removed), so an fp8 code may flip (measured 5.9e-3 of yc's range, one input set).
    assert!(
        m.ort_vs_emulation["yc"].rel <= 1e-2,
        "{:?}",
        m.ort_vs_emulation["yc"]
    );
}

#[test]
fn plan_export_in_onnxruntime_ppocr_classifier() {
    let entry = crate::real_models::corpus()
        .iter()
        .find(|m| m.name == "ppocr-mobile-v2-cls")
        .unwrap();
    let model = crate::real_models::corpus_dir().join(&entry.file);
    let sets = vec![Feeds::from([(
        "x".to_string(),
        Tensor::from_f32(vec![1, 3, 48, 192], uniform(7, 3 * 48 * 192)),
    )])];
    let m = plan_in_onnxruntime("ppocr_cls", &model, sets, "fp8,int8,fp16", &["snr:30"]);
    print("ppocr_cls", &m);
    // The chosen point mixes Casts and Q/DQ (the planted test above covers int8 and fp8
    // both; here the descent from all-float16 lowers Convs to fp8).
    let has = |f: &str| m.chosen.values().any(|c| c == f);
    assert!(
        has("float16") && (has("fp8e4m3") || has("int8")),
        "{:?}",
        m.chosen
    );
    assert_node_by_node("ppocr_cls", &m);
    // The class probabilities: float16 rounding that ORT leaves out, and fp8 Convs reading
    // those float16 values, whose codes then flip (measured 1.3e-2 of the range, as the
    // planted model's yc).
    for (name, d) in &m.ort_vs_emulation {
        assert!(d.rel <= 2e-2, "{name}: {d:?}");
    }
}
