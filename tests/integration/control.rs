//! Control flow end to end on the generated `control_flow` model (scripts/gen_models.py: two
//! If nodes whose branches have outputs of different shapes and read the outer Conv output
//! and weights, a Loop whose body reads outer values and holds an If reading the main graph two
//! levels up): FP32 against ONNX Runtime, reduced precision, `inspect`; and a subgraph reading
//! a value no graph defines.

use crate::common::{mixprec, text};
use crate::models::{models_dir, scaled_error};
use mixprec::exec::{PlanOptions, PreparedPlan, RunOptions};
use mixprec::onnx::{proto, read_input_set};
use mixprec::precision::plan::PrecisionPlan;
use mixprec::precision::Precision;
use mixprec::{load_model, Interpreter};
use prost::Message;

#[test]
fn control_flow_matches_onnxruntime() {
    let err = scaled_error("control_flow", "control_flow");
    assert!(err <= 1e-5, "{err:.3e}");
}

#[test]
fn control_flow_runs_in_float16_deterministically() {
    let dir = models_dir();
    let m = load_model(dir.join("control_flow.onnx")).unwrap();
    let feeds = read_input_set(&m.graph, &dir.join("control_flow")).unwrap();
    let interp = Interpreter::new(&m.graph).unwrap();
    let fp32 = interp.run(&feeds).unwrap();
    let plan = PrecisionPlan::uniform(&m.graph, Precision::Float16);
    let prepared = PreparedPlan::new(&m.graph, &plan, &PlanOptions::default()).unwrap();
    let a = interp
        .run_plan(&feeds, &RunOptions::default(), &prepared)
        .unwrap();
    let b = interp
        .run_plan(&feeds, &RunOptions::default(), &prepared)
        .unwrap();
    let bits = |r: &mixprec::exec::RunResult| -> Vec<Vec<u32>> {
        r.outputs
            .iter()
            .map(|(_, t)| t.as_f32().unwrap().iter().map(|x| x.to_bits()).collect())
            .collect()
    };
    assert_eq!(bits(&a), bits(&b), "two float16 runs differ");
    assert_ne!(bits(&a), bits(&fp32), "float16 changed nothing");
    for ((name, got), (_, want)) in a.outputs.iter().zip(&fp32.outputs) {
        assert_eq!(got.shape(), want.shape(), "{name}");
        let (g, w) = (got.as_f32().unwrap(), want.as_f32().unwrap());
        let scale = w.iter().fold(0f32, |m, x| m.max(x.abs()));
        let err = g.iter().zip(w).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale;
        assert!(err <= 1e-2, "{name}: float16 error {err:.3e}");
        // Every value a float16 layer produced is a float16 value.
        assert!(
            g.iter()
                .all(|&x| half::f16::from_f32(x).to_f32().to_bits() == x.to_bits()),
            "{name}"
        );
    }
}

/// A profiled run lists the layers inside If and Loop bodies by path, every body iteration
/// summed into one row, and times the control nodes without them: the times add up.
#[test]
fn a_profile_lists_subgraph_layers_by_path() {
    let dir = models_dir();
    let m = load_model(dir.join("control_flow.onnx")).unwrap();
    let feeds = read_input_set(&m.graph, &dir.join("control_flow")).unwrap();
    let interp = Interpreter::new(&m.graph).unwrap();
    let (r, times) = interp.run_profiled(&feeds, None).unwrap();
    let plain = interp.run(&feeds).unwrap();
    assert_eq!(r.outputs, plain.outputs);
    let nested: Vec<&mixprec::exec::LayerTime> =
        times.iter().filter(|t| !t.scope.is_empty()).collect();
    assert!(!nested.is_empty(), "{times:?}");
    for t in &nested {
        // The scope names the control node and its subgraph attribute, outermost first.
        let owner = t.scope.split('/').next().unwrap();
        assert!(
            m.graph
                .nodes
                .iter()
                .any(|n| n.name == owner && n.has_subgraphs()),
            "{t:?}"
        );
        assert!(t.scope.ends_with('/'), "{t:?}");
    }
    // The Loop's body holds an If: a path two subgraphs deep.
    assert!(
        nested.iter().any(|t| t.scope.matches('/').count() >= 4),
        "{times:?}"
    );
    // Top-level rows are the main graph's nodes, each executed once.
    let top: Vec<usize> = times
        .iter()
        .filter(|t| t.scope.is_empty())
        .map(|t| t.node)
        .collect();
    let mut unique = top.clone();
    unique.dedup();
    assert_eq!(top, unique);
    assert!(times.iter().all(|t| t.seconds >= 0.0));
    // The CLI prints the paths.
    let model = dir.join("control_flow.onnx");
    let o = mixprec(&["run", model.to_str().unwrap(), "--profile", "--seed", "1"]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let path = format!("{}{}", nested[0].scope, nested[0].name);
    assert!(t.contains(&path), "{path} not in:\n{t}");
}

#[test]
fn control_flow_cli_run_fp16_and_inspect() {
    let model = models_dir().join("control_flow.onnx");
    let model = model.to_str().unwrap();
    let o = mixprec(&["run", model, "--fp16", "--seed", "1", "--atol", "1e-2"]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("output 'hs' (dtype=float32, shape=(3, 1, 4))"),
        "{t}"
    );
    let o = mixprec(&["inspect", model]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("loop") && t.contains("Loop"), "{t}");
}

fn node(op: &str, name: &str, ins: &[&str], outs: &[&str]) -> proto::NodeProto {
    proto::NodeProto {
        op_type: Some(op.into()),
        name: Some(name.into()),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn vi(name: &str, elem: i32) -> proto::ValueInfoProto {
    proto::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(proto::TypeProto {
            value: Some(proto::type_proto::Value::TensorType(
                proto::type_proto::Tensor {
                    elem_type: Some(elem),
                    shape: None,
                },
            )),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn a_subgraph_reading_an_unknown_value_is_a_one_line_error() {
    let branch = |out: &str, reads: &str| proto::GraphProto {
        name: Some(format!("{out}_g")),
        node: vec![node("Relu", &format!("{out}_relu"), &[reads], &[out])],
        output: vec![vi(out, 1)],
        ..Default::default()
    };
    let graph_attr = |name: &str, g: proto::GraphProto| proto::AttributeProto {
        name: Some(name.into()),
        r#type: Some(proto::attribute_proto::AttributeType::Graph as i32),
        g: Some(g),
        ..Default::default()
    };
    let mut iff = node("If", "the_if", &["c"], &["y"]);
    iff.attribute = vec![
        graph_attr("then_branch", branch("a", "x")),
        graph_attr("else_branch", branch("b", "ghost")),
    ];
    let model = proto::ModelProto {
        ir_version: Some(8),
        opset_import: vec![proto::OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(proto::GraphProto {
            name: Some("bad".into()),
            node: vec![iff],
            input: vec![vi("c", 9), vi("x", 1)],
            output: vec![vi("y", 1)],
            ..Default::default()
        }),
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.onnx");
    std::fs::write(&path, model.encode_to_vec()).unwrap();
    let o = mixprec(&["run", path.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    let err = err.trim();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("'the_if'") && err.contains("'else_branch'") && err.contains("'ghost'"),
        "{err}"
    );
}

#[test]
fn control_flow_search_and_paths_into_subgraphs() {
    let model = models_dir().join("control_flow.onnx");
    let model = model.to_str().unwrap();
    // The search (incremental cache: a control-flow layer's signature covers the outer values
    // its subgraphs read) treats If and Loop as one candidate each.
    let o = mixprec(&[
        "debug",
        "precision",
        model,
        "--fp16",
        "--check-error-stat",
        "median",
        "--atol",
        "1e-4",
        "--mode",
        "bisect",
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("To achieve acceptable accuracy"), "{t}");
    // Nodes inside subgraphs by path; a path that names nothing is a warning naming it.
    let o = mixprec(&[
        "run",
        model,
        "--fp16",
        "--layer-precisions",
        "loop/body/body_if/then_branch/inner_add:float32",
        "if_pos/else_branch/*:float32",
        "loop/body/missing:float32",
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("inside subgraphs: if_pos/else_branch/else_add:float32 if_pos/else_branch/else_mean:float32 if_pos/else_branch/else_mul:float32 loop/body/body_if/then_branch/inner_add:float32"),
        "{t}"
    );
    assert!(
        t.contains("pattern 'loop/body/missing' matches no layer"),
        "{t}"
    );
    // int8 inside a body: calibration collects the range of the body's `h` by path.
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("calib.cache");
    let o = mixprec(&[
        "run",
        model,
        "--fp16",
        "--layer-precisions",
        "loop/body/body_matmul_h:int8",
        "--calibration-cache",
        cache.to_str().unwrap(),
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("Calibrating"), "{t}");
    let saved = std::fs::read_to_string(&cache).unwrap();
    assert!(
        saved.lines().any(|l| l.starts_with("loop/body/h:")),
        "{saved}"
    );
    // A cache without it is refused, naming the path.
    let stripped: String = saved
        .lines()
        .filter(|l| !l.starts_with("loop/body/h:"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&cache, stripped).unwrap();
    let o = mixprec(&[
        "run",
        model,
        "--fp16",
        "--layer-precisions",
        "loop/body/body_matmul_h:int8",
        "--calibration-cache",
        cache.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("loop/body/h"), "{err}");
}
