//! The exported mixed-precision model is ready for a strongly typed engine (TensorRT 11,
//! `trtexec --stronglyTyped`), where the graph's types alone decide every layer's precision:
//! - every float16/bfloat16 layer reads its float inputs and weights in that type and writes
//!   its outputs in it; every float32 layer reads float32;
//! - Casts appear only at precision boundaries (a Cast never keeps its input's type), and no
//!   Cast pair cancels (a Cast to A whose only reader casts back to the original type);
//! - every int8/fp8 layer reads its quantized operands from DequantizeLinear of int8/float8
//!   data (QuantizeLinear for activations, stored int8/float8 weights), and outputs float32.
//!
//! Types are checked with mixprec's shape/type inference of the exported file.

use crate::models::models_dir;
use mixprec::export::{export, write_model, ExportOptions};
use mixprec::infer::{declared_input_facts, infer_graph};
use mixprec::precision::plan::PrecisionPlan;
use mixprec::precision::quant::is_quantized_operand;
use mixprec::precision::{has_quantized_kernel, input_follows_layer_precision, Precision};
use mixprec::tensor::DType;
use mixprec::{load_model, Graph};
use std::collections::{BTreeMap, HashMap};

use Precision::*;

fn dtype_of(p: Precision) -> DType {
    match p {
        Float32 => DType::F32,
        Float16 => DType::F16,
        BFloat16 => DType::BF16,
        Int8 => DType::I8,
        Fp8E4M3 => DType::F8E4M3FN,
        Fp8E5M2 => DType::F8E5M2,
    }
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
}

/// Checks the export of `plan` of `original`; returns the problems found, one line each.
/// `kept_f32`: layers the export kept in float32 (its notes: the op has no such type at the
/// model's opset, `ExportOptions::fallback`).
fn problems(
    original: &Graph,
    plan: &PrecisionPlan,
    exported: &Graph,
    kept_f32: &std::collections::HashSet<String>,
) -> Vec<String> {
    let facts = infer_graph(exported, &declared_input_facts(exported, &BTreeMap::new()))
        .expect("the exported model infers");
    let ty = |v: &str| -> Option<DType> {
        facts
            .get(v)
            .and_then(|f| f.dtype)
            .or_else(|| exported.weight(v).map(|t| t.dtype()))
            .or_else(|| exported.initializers.get(v).map(|t| t.dtype()))
    };
    let orig_ty = {
        let f = infer_graph(original, &declared_input_facts(original, &BTreeMap::new())).unwrap();
        move |v: &str| f.get(v).and_then(|f| f.dtype)
    };
    let producer: HashMap<&str, &mixprec::Node> = exported
        .nodes
        .iter()
        .flat_map(|n| n.outputs.iter().map(move |o| (o.as_str(), n)))
        .collect();
    let mut readers: HashMap<&str, Vec<&mixprec::Node>> = HashMap::new();
    for n in &exported.nodes {
        for i in &n.inputs {
            readers.entry(i.as_str()).or_default().push(n);
        }
    }
    let by_name: HashMap<&str, &mixprec::Node> = exported
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n))
        .collect();
    let original_names: std::collections::HashSet<&str> =
        original.nodes.iter().map(|n| n.name.as_str()).collect();
    let mut bad = Vec::new();
    for (node, &p) in original.nodes.iter().zip(&plan.layers) {
        if mixprec::ops::is_data_movement(node) || original.is_folded(node) {
            continue;
        }
        let Some(e) = by_name.get(node.name.as_str()) else {
            bad.push(format!("layer {} is missing from the export", node.name));
            continue;
        };
        let quant = p.is_scaled() && has_quantized_kernel(node);
        for (k, x) in e.inputs.iter().enumerate() {
            if x.is_empty() || !input_follows_layer_precision(node, k) {
                continue;
            }
            let Some(orig) = node.inputs.get(k).and_then(|v| orig_ty(v)) else {
                continue;
            };
            if !is_float(orig) {
                continue;
            }
            let got = ty(x);
            if quant && is_quantized_operand(node, k) {
                let dq = producer.get(x.as_str());
                let ok = dq.is_some_and(|dq| {
                    dq.op_type == "DequantizeLinear"
                        && dq.inputs.first().and_then(|q| ty(q)) == Some(dtype_of(p))
                        && ty(x) == Some(DType::F32)
                });
                if !ok {
                    bad.push(format!(
                        "{} layer {} ({}): input {k} '{x}' does not come from a DequantizeLinear of {:?} data",
                        p.name(),
                        node.name,
                        node.op_type,
                        dtype_of(p)
                    ));
                }
                continue;
            }
            let fell_back = kept_f32.contains(&node.name);
            let want = if p.is_scaled() || fell_back {
                DType::F32
            } else {
                dtype_of(p)
            };
            if got != Some(want) {
                bad.push(format!(
                    "{} layer {} ({}): input {k} '{x}' is {got:?}, expected {want:?}",
                    p.name(),
                    node.name,
                    node.op_type
                ));
            }
        }
        if !p.is_scaled() {
            for o in &e.outputs {
                if let (Some(got), Some(orig)) = (ty(o), orig_ty(o)) {
                    let want = if kept_f32.contains(&node.name) {
                        DType::F32
                    } else {
                        dtype_of(p)
                    };
                    if is_float(orig) && got != want {
                        bad.push(format!(
                            "{} layer {}: output '{o}' is {got:?}",
                            p.name(),
                            node.name
                        ));
                    }
                }
            }
        }
    }
    for c in exported.nodes.iter().filter(|n| n.op_type == "Cast") {
        if original_names.contains(c.name.as_str()) {
            continue;
        }
        let (from, to) = (ty(&c.inputs[0]), ty(&c.outputs[0]));
        if from == to {
            bad.push(format!("Cast {} keeps its input's type {from:?}", c.name));
        }
        // A pair that cancels: x:T -> Cast A (read only by the next Cast) -> Cast T.
        if let Some(first) = producer.get(c.inputs[0].as_str()) {
            let only_reader = readers.get(c.inputs[0].as_str()).map_or(0, Vec::len) == 1;
            let into_quantize = readers
                .get(c.outputs[0].as_str())
                .is_some_and(|r| r.iter().all(|n| n.op_type == "QuantizeLinear"));
            if first.op_type == "Cast"
                && only_reader
                && !into_quantize
                && ty(&first.inputs[0]) == to
            {
                bad.push(format!(
                    "Casts {} and {} cancel: {:?} -> {:?} -> {:?}",
                    first.name,
                    c.name,
                    to,
                    ty(&first.outputs[0]),
                    to
                ));
            }
        }
    }
    bad
}

fn plans(graph: &Graph) -> Vec<(&'static str, PrecisionPlan)> {
    let by = |f: &dyn Fn(usize, &mixprec::Node) -> Precision| {
        PrecisionPlan::from_layers(
            graph
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| f(i, n))
                .collect(),
        )
    };
    let q = |p: Precision, rest: Precision| {
        by(&|_, n: &mixprec::Node| {
            if has_quantized_kernel(n) {
                p
            } else {
                rest
            }
        })
    };
    vec![
        ("fp16", by(&|_, _| Float16)),
        (
            "fp16 with every third layer fp32",
            by(&|i, _| if i % 3 == 0 { Float32 } else { Float16 }),
        ),
        (
            "bf16 and fp16 alternating",
            by(&|i, _| if i % 2 == 0 { BFloat16 } else { Float16 }),
        ),
        ("int8 + fp16", q(Int8, Float16)),
        ("int8 + fp32", q(Int8, Float32)),
        ("fp8e4m3 + bf16", q(Fp8E4M3, BFloat16)),
        ("fp8e5m2 + fp16, odd layers fp32", {
            let mut p = q(Fp8E5M2, Float16);
            for (i, l) in p.layers.iter_mut().enumerate() {
                if i % 2 == 1 && !l.is_scaled() {
                    *l = Float32;
                }
            }
            p
        }),
    ]
}

#[test]
fn exports_are_ready_for_strongly_typed_engines() {
    let dir = models_dir();
    let out = dir.join("strongly_typed");
    std::fs::create_dir_all(&out).unwrap();
    let mut all = Vec::new();
    let mut checked = 0;
    let (mut casts, mut dequantized) = (0, 0);
    for name in ["cnn", "transformer", "mlp", "needs_constraints"] {
        let path = dir.join(format!("{name}.onnx"));
        let model = load_model(&path).unwrap();
        let graph = &model.graph;
        let amax: BTreeMap<String, f32> = graph
            .nodes
            .iter()
            .flat_map(|n| n.inputs.iter().chain(&n.outputs))
            .chain(graph.inputs.iter().map(|v| &v.name))
            .map(|v| (v.clone(), 1.0))
            .collect();
        for (label, plan) in plans(graph) {
            let e = export(
                &model,
                &plan,
                Some(&amax),
                &ExportOptions {
                    fallback: true,
                    ..Default::default()
                },
            )
            .unwrap_or_else(|err| panic!("{name} {label}: {err}"));
            let file = out.join(format!("{name}-{}.onnx", label.replace([' ', ','], "_")));
            write_model(&file, &e.model).unwrap();
            let exported = load_model(&file).unwrap();
            for n in &exported.graph.nodes {
                casts += usize::from(n.op_type == "Cast");
                dequantized += usize::from(n.op_type == "DequantizeLinear");
            }
            let kept_f32 = e
                .notes
                .iter()
                .filter(|n| n.contains("stays float32"))
                .filter_map(|n| n.strip_prefix("layer '")?.split("' (").next())
                .map(str::to_string)
                .collect();
            for p in problems(graph, &plan, &exported.graph, &kept_f32) {
                all.push(format!("{name} ({label}): {p}"));
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 28);
    // The checks saw boundaries and quantized layers.
    assert!(
        casts > 100 && dequantized > 50,
        "{casts} Casts, {dequantized} DequantizeLinear"
    );
    assert!(
        all.is_empty(),
        "{} problem(s):\n{}",
        all.len(),
        all.join("\n")
    );
}

/// The checker finds what it looks for: a cancelling Cast pair, a Cast that changes nothing
/// and a float16 layer reading float32 are reported.
#[test]
fn the_strongly_typed_check_can_fail() {
    use mixprec::graph::{Node, ValueInfo};
    let node = |name: &str, op: &str, i: &[&str], o: &[&str]| Node {
        name: name.into(),
        op_type: op.into(),
        inputs: i.iter().map(|s| s.to_string()).collect(),
        outputs: o.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let cast = |name: &str, i: &str, o: &str, to: i64| {
        let mut n = node(name, "Cast", &[i], &[o]);
        n.attrs
            .insert("to".into(), mixprec::graph::Attribute::Int(to));
        n
    };
    let vi = |name: &str| ValueInfo {
        name: name.into(),
        dtype: Some(DType::F32),
        shape: Some(vec![mixprec::graph::Dim::Fixed(4)]),
    };
    let mut original = Graph {
        inputs: vec![vi("x")],
        outputs: vec![vi("y")],
        nodes: vec![node("relu", "Relu", &["x"], &["y"])],
        ..Default::default()
    };
    original.opsets.insert(String::new(), 17);
    let mut exported = original.clone();
    exported.nodes = vec![
        cast("c1", "x", "x16", 10),
        cast("c2", "x16", "x32", 1),
        cast("c3", "x32", "x32b", 1),
        node("relu", "Relu", &["x32b"], &["y"]),
    ];
    let plan = PrecisionPlan::from_layers(vec![Float16]);
    let found = problems(&original, &plan, &exported, &Default::default());
    let text = found.join("\n");
    assert!(text.contains("Casts c1 and c2 cancel"), "{text}");
    assert!(text.contains("Cast c3 keeps its input's type"), "{text}");
    assert!(
        text.contains("float16 layer relu (Relu): input 0 'x32b' is Some(F32)"),
        "{text}"
    );
}
