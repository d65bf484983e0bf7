use super::*;
use crate::exec::Interpreter;
use crate::tensor::{Feeds, TensorData};

pub(crate) use crate::onnx::testing::{node, with_int};

/// A model with input x [2, 4] and outputs [2, 3] (every name in `outputs`).
pub(crate) fn model(
    nodes: Vec<proto::NodeProto>,
    inits: Vec<(&str, Tensor)>,
    outputs: &[&str],
) -> Model {
    let outs: Vec<(&str, &[i64])> = outputs.iter().map(|o| (*o, &[2i64, 3][..])).collect();
    crate::onnx::testing::load(crate::onnx::testing::model_proto(
        nodes,
        inits,
        &[("x", &[2, 4])],
        &outs,
        19,
    ))
}

pub(crate) fn i8s(shape: &[usize], v: Vec<i8>) -> Tensor {
    Tensor::from_parts(shape.to_vec(), TensorData::I8(v.into()))
}

pub(crate) fn u8s(shape: &[usize], v: Vec<u8>) -> Tensor {
    Tensor::from_parts(shape.to_vec(), TensorData::U8(v.into()))
}

fn w_int8() -> Tensor {
    i8s(
        &[4, 3],
        vec![10, -20, 30, 40, 50, -60, 70, 80, 90, -100, 110, 127],
    )
}

pub(crate) fn x_feed() -> Feeds {
    let mut f = Feeds::new();
    f.insert(
        "x".into(),
        Tensor::from_f32(vec![2, 4], vec![0.5, -1.0, 0.25, 2.0, 1.5, 0.75, -0.5, 0.1]),
    );
    f
}

fn run(m: &Model, out: &str) -> Vec<f32> {
    let r = Interpreter::new(&m.graph).unwrap().run(&x_feed()).unwrap();
    r.output(out).unwrap().to_f32_vec().unwrap()
}

fn ops(m: &Model) -> Vec<String> {
    m.proto
        .graph
        .as_ref()
        .unwrap()
        .node
        .iter()
        .map(|n| n.op_type.clone().unwrap_or_default())
        .collect()
}

pub(crate) fn index(m: &Model, name: &str) -> usize {
    m.graph.nodes.iter().position(|n| n.name == name).unwrap()
}

/// ORT `quantize_static` (QDQ format): uint8 activations with a zero point, int8 per-channel
/// weights (axis 1 of a MatMul weight), an int32 bias through its own DequantizeLinear.
fn ort_style() -> Model {
    model(
        vec![
            node("QuantizeLinear", "x_q", &["x", "xs", "xz"], &["xq"]),
            node("DequantizeLinear", "x_dq", &["xq", "xs", "xz"], &["xd"]),
            with_int(
                node("DequantizeLinear", "w_dq", &["w", "ws", "wz"], &["wd"]),
                "axis",
                1,
            ),
            node("DequantizeLinear", "b_dq", &["b", "bs"], &["bd"]),
            node("MatMul", "mm", &["xd", "wd"], &["h"]),
            node("Add", "add", &["h", "bd"], &["y"]),
        ],
        vec![
            ("xs", Tensor::scalar_f32(0.02)),
            ("xz", u8s(&[], vec![128])),
            ("w", w_int8()),
            ("ws", Tensor::from_f32(vec![3], vec![0.01, 0.02, 0.005])),
            ("wz", i8s(&[3], vec![0, 0, 0])),
            (
                "b",
                Tensor::from_parts(vec![3], TensorData::I32(vec![5, -7, 9].into())),
            ),
            ("bs", Tensor::scalar_f32(0.001)),
        ],
        &["y"],
    )
}

#[test]
fn finds_the_quantized_layers_of_an_ort_style_model() {
    let m = ort_style();
    let layers = quantized_layers(&m.graph).unwrap();
    let names: Vec<&str> = layers
        .iter()
        .map(|l| m.graph.nodes[l.node].name.as_str())
        .collect();
    // The Add reads a dequantized bias (a weight): a quantized layer too.
    assert_eq!(names, ["mm", "add"]);
    let mm = &layers[0];
    assert_eq!(mm.inputs.len(), 2);
    assert_eq!(
        mm.inputs[0].kind,
        QdqKind::Activation {
            q: index(&m, "x_q"),
            source: "x".into()
        }
    );
    assert_eq!(mm.inputs[1].kind, QdqKind::Weight);
    assert_eq!(mm.inputs[1].slot, 1);
    assert!(has_qdq(&m.graph));
}

#[test]
fn stripping_a_layer_rewires_it_and_dequantizes_its_weight_per_channel() {
    let m = ort_style();
    let s = strip(&m, &[index(&m, "mm")], Precision::Float32).unwrap();
    assert_eq!((s.activations, s.weights), (1, 1));
    // x_q, x_dq, w_dq gone; b_dq still read by the Add.
    assert_eq!(ops(&s.model), ["DequantizeLinear", "MatMul", "Add"]);
    let mm = &s.model.graph.nodes[index(&s.model, "mm")];
    assert_eq!(mm.inputs[0], "x");
    let w = s.model.graph.initializers[&mm.inputs[1]]
        .as_f32()
        .unwrap()
        .to_vec();
    // Column c is scaled by ws[c] (axis 1).
    let ws = [0.01f32, 0.02, 0.005];
    let wi = [10, -20, 30, 40, 50, -60, 70, 80, 90, -100, 110, 127];
    let want: Vec<f32> = wi
        .iter()
        .enumerate()
        .map(|(k, &v)| v as f32 * ws[k % 3])
        .collect();
    assert_eq!(w, want);
    // The int8 weight and the activation's scale and zero point went with their nodes.
    let inits = &s.model.graph.initializers;
    assert!(!inits.contains_key("w") && !inits.contains_key("xz"));
    assert!(inits.contains_key("b"));
    // The stripped layer computes on the float input: equal to the float computation.
    let y = run(&s.model, "y");
    let x = x_feed()["x"].as_f32().unwrap().to_vec();
    for i in 0..2 {
        for c in 0..3 {
            let dot: f32 = (0..4).map(|k| x[i * 4 + k] * want[k * 3 + c]).sum();
            let b = [5.0f32, -7.0, 9.0][c] * 0.001;
            assert!((y[i * 3 + c] - (dot + b)).abs() < 1e-6, "{y:?}");
        }
    }
    // Unstripped it differs (x is quantized to 0.02 steps).
    assert_ne!(run(&m, "y"), y);
}

#[test]
fn strip_all_removes_every_pair_and_keeps_nodes() {
    let m = ort_style();
    let s = strip_all(&m).unwrap();
    assert_eq!(ops(&s.model), ["MatMul", "Add"]);
    assert!(!has_qdq(&s.model.graph));
    let one = strip(&m, &[index(&m, "mm"), index(&m, "add")], Precision::Float32).unwrap();
    assert_eq!(run(&s.model, "y"), run(&one.model, "y"));
}

/// ModelOpt style: int8 activations (zero point 0), per-channel int8 Conv weights on axis 0.
#[test]
fn finds_modelopt_style_conv_and_strips_it() {
    let x_q = node("QuantizeLinear", "x_q", &["x4", "s", "z"], &["xq"]);
    let m = model(
        vec![
            node("Reshape", "r", &["x", "shape"], &["x4"]),
            x_q,
            node("DequantizeLinear", "x_dq", &["xq", "s", "z"], &["xd"]),
            with_int(
                node("DequantizeLinear", "w_dq", &["w", "ws"], &["wd"]),
                "axis",
                0,
            ),
            node("Conv", "conv", &["xd", "wd"], &["c"]),
            node("Reshape", "r2", &["c", "shape2"], &["y"]),
        ],
        vec![
            ("shape", Tensor::from_i64(vec![4], vec![1, 2, 2, 2])),
            ("shape2", Tensor::from_i64(vec![2], vec![2, 3])),
            ("s", Tensor::scalar_f32(0.05)),
            ("z", i8s(&[], vec![0])),
            ("w", i8s(&[3, 2, 1, 1], vec![10, 20, -30, 40, 50, 60])),
            ("ws", Tensor::from_f32(vec![3], vec![0.1, 0.2, 0.3])),
        ],
        &["y"],
    );
    let layers = quantized_layers(&m.graph).unwrap();
    assert_eq!(layers.len(), 1);
    assert_eq!(m.graph.nodes[layers[0].node].name, "conv");
    let s = strip(&m, &[layers[0].node], Precision::Float32).unwrap();
    assert_eq!(ops(&s.model), ["Reshape", "Conv", "Reshape"]);
    let w = &s.model.graph.initializers[&s.model.graph.nodes[1].inputs[1]];
    assert_eq!(w.shape(), &[3, 2, 1, 1]);
    let got = w.as_f32().unwrap();
    let want = [1.0f32, 2.0, -6.0, 8.0, 15.0, 18.0];
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "{got:?}");
    }
}

/// One Q/DQ pair read by two layers; one int8 weight DequantizeLinear read by two layers.
fn shared() -> Model {
    model(
        vec![
            node("QuantizeLinear", "x_q", &["x", "s", "z"], &["xq"]),
            node("DequantizeLinear", "x_dq", &["xq", "s", "z"], &["xd"]),
            node("DequantizeLinear", "w_dq", &["w", "ws"], &["wd"]),
            node("MatMul", "mm1", &["xd", "wd"], &["a"]),
            node("MatMul", "mm2", &["xd", "wd"], &["b"]),
            node("Add", "add", &["a", "b"], &["y"]),
        ],
        vec![
            ("s", Tensor::scalar_f32(0.03)),
            ("z", i8s(&[], vec![0])),
            ("w", w_int8()),
            ("ws", Tensor::scalar_f32(0.01)),
        ],
        &["y"],
    )
}

#[test]
fn a_shared_pair_is_rewired_only_for_the_marked_reader() {
    let m = shared();
    let layers = quantized_layers(&m.graph).unwrap();
    assert_eq!(layers.len(), 2, "the Add reads no dequantized value");
    let s = strip(&m, &[index(&m, "mm1")], Precision::Float32).unwrap();
    let g = &s.model.graph;
    assert_eq!(g.nodes[index(&s.model, "mm1")].inputs[0], "x");
    assert_eq!(g.nodes[index(&s.model, "mm2")].inputs, ["xd", "wd"]);
    // Both pairs are still read by mm2: nothing is dropped, the int8 weight stays.
    assert_eq!(s.removed_nodes, 0);
    assert!(g.initializers.contains_key("w"));
    let both = strip(
        &m,
        &[index(&m, "mm1"), index(&m, "mm2")],
        Precision::Float32,
    )
    .unwrap();
    assert_eq!(ops(&both.model), ["MatMul", "MatMul", "Add"]);
    let g = &both.model.graph;
    // The weight read by both is dequantized once.
    let (w1, w2) = (
        &g.nodes[index(&both.model, "mm1")].inputs[1],
        &g.nodes[index(&both.model, "mm2")].inputs[1],
    );
    assert_eq!(w1, w2);
    assert_eq!(g.initializers.len(), 1);
    assert_eq!(both.removed_nodes, 3);
}

#[test]
fn float16_layers_read_casts_and_store_float16_weights() {
    let m = ort_style();
    let s = strip(&m, &[index(&m, "mm")], Precision::Float16).unwrap();
    let g = &s.model.graph;
    let mm = &g.nodes[index(&s.model, "mm")];
    // The activation through a Cast to float16, the weight stored in float16.
    let cast = g
        .nodes
        .iter()
        .find(|n| n.outputs[0] == mm.inputs[0])
        .unwrap();
    assert_eq!(cast.op_type, "Cast");
    assert_eq!(cast.inputs[0], "x");
    assert_eq!(g.initializers[&mm.inputs[1]].dtype(), DType::F16);
    // It runs, and its output stays close to the float32 strip.
    let y16 = run(&s.model, "y");
    let y32 = run(
        &strip(&m, &[index(&m, "mm")], Precision::Float32)
            .unwrap()
            .model,
        "y",
    );
    for (a, b) in y16.iter().zip(&y32) {
        assert!((a - b).abs() < 1e-2, "{y16:?} {y32:?}");
    }
    assert!(strip(&m, &[index(&m, "mm")], Precision::Int8).is_err());
}

#[test]
fn mixprecs_own_int8_export_is_a_qdq_model_with_its_layers() {
    let m = model(
        vec![
            node("MatMul", "mm", &["x", "w"], &["h"]),
            node("Relu", "relu", &["h"], &["y"]),
        ],
        vec![(
            "w",
            Tensor::from_f32(vec![4, 3], (0..12).map(|i| i as f32 * 0.1 - 0.5).collect()),
        )],
        &["y"],
    );
    let plan = PrecisionPlan::from_layers(vec![Precision::Int8, Precision::Float32]);
    let amax: BTreeMap<String, f32> = [("x".to_string(), 2.0f32)].into();
    let e = export(&m, &plan, Some(&amax), &ExportOptions::default()).unwrap();
    let q = reload(&m, e.model).unwrap();
    let layers = quantized_layers(&q.graph).unwrap();
    assert_eq!(layers.len(), 1);
    assert_eq!(q.graph.nodes[layers[0].node].name, "mm");
    let kinds: Vec<bool> = layers[0]
        .inputs
        .iter()
        .map(|i| matches!(i.kind, QdqKind::Activation { .. }))
        .collect();
    assert_eq!(kinds, [true, false]);
    // Stripped, it is the float model again (the weight's int8 rounding aside).
    let s = strip_all(&q).unwrap();
    assert!(!has_qdq(&s.model.graph));
    let (a, b) = (run(&s.model, "y"), run(&m, "y"));
    for (a, b) in a.iter().zip(&b) {
        assert!((a - b).abs() < 2e-2, "{a} {b}");
    }
}

fn bad(scale: Tensor, zp: Option<Tensor>, w_scale: Tensor, axis: i64) -> Result<Vec<QdqLayer>> {
    let mut nodes = vec![
        node("QuantizeLinear", "x_q", &["x", "s", "qz"], &["xq"]),
        node(
            "DequantizeLinear",
            "x_dq",
            &["xq", "s", if zp.is_some() { "dz" } else { "" }],
            &["xd"],
        ),
        with_int(
            node("DequantizeLinear", "w_dq", &["w", "ws"], &["wd"]),
            "axis",
            axis,
        ),
        node("MatMul", "mm", &["xd", "wd"], &["y"]),
    ];
    nodes[1].input.retain(|i| !i.is_empty());
    let mut inits = vec![
        ("s", scale),
        ("qz", u8s(&[], vec![128])),
        ("w", w_int8()),
        ("ws", w_scale),
    ];
    if let Some(z) = zp {
        inits.push(("dz", z));
    }
    let m = model(nodes, inits, &["y"]);
    quantized_layers(&m.graph)
}

#[test]
fn inconsistent_quantization_is_an_error_naming_the_node() {
    let ok = |s: f32| Tensor::scalar_f32(s);
    let per_col = || Tensor::from_f32(vec![3], vec![0.1, 0.2, 0.3]);
    assert!(bad(ok(0.1), Some(u8s(&[], vec![128])), per_col(), 1).is_ok());
    let e = bad(ok(0.0), None, per_col(), 1).unwrap_err().to_string();
    assert!(
        e.contains("'x_q'") && e.contains("positive and finite"),
        "{e}"
    );
    let e = bad(ok(f32::NAN), None, per_col(), 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("'x_q'") && e.contains("NaN"), "{e}");
    let e = bad(
        ok(0.1),
        None,
        Tensor::from_f32(vec![3], vec![0.1, -0.2, 0.3]),
        1,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("'w_dq'") && e.contains("element 1"), "{e}");
    // The DequantizeLinear's zero point is int8, the QuantizeLinear writes uint8.
    let e = bad(ok(0.1), Some(i8s(&[], vec![0])), per_col(), 1)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("'x_dq'") && e.contains("int8") && e.contains("'x_q'"),
        "{e}"
    );
    // Three scales along axis 0 of a [4, 3] weight.
    let e = bad(ok(0.1), None, per_col(), 0).unwrap_err().to_string();
    assert!(e.contains("'w_dq'") && e.contains("axis 0"), "{e}");
    let e = bad(ok(0.1), None, per_col(), 5).unwrap_err().to_string();
    assert!(e.contains("'w_dq'"), "{e}");
}

#[test]
fn an_activation_scale_that_does_not_fit_is_an_error_naming_the_node() {
    // Per-axis scale of 3 values along axis 1 of x [2, 4].
    let m = model(
        vec![
            with_int(
                node("QuantizeLinear", "x_q", &["x", "s"], &["xq"]),
                "axis",
                1,
            ),
            with_int(
                node("DequantizeLinear", "x_dq", &["xq", "s"], &["xd"]),
                "axis",
                1,
            ),
            node("MatMul", "mm", &["xd", "w"], &["y"]),
        ],
        vec![
            ("s", Tensor::from_f32(vec![3], vec![0.1, 0.1, 0.1])),
            ("w", Tensor::from_f32(vec![4, 3], vec![0.5; 12])),
        ],
        &["y"],
    );
    let e = quantized_layers(&m.graph).unwrap_err().to_string();
    assert!(e.contains("'x_q'") || e.contains("'x_dq'"), "{e}");
    assert!(e.contains("axis 1"), "{e}");
}

#[test]
fn marking_a_layer_that_is_not_quantized_is_an_error() {
    let m = shared();
    let e = strip(&m, &[index(&m, "add")], Precision::Float32)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("'add'") && e.contains("not a quantized layer"),
        "{e}"
    );
}

/// ONNX Runtime drops a Relu whose output a uint8 pair with zero point 0 quantizes (the pair
/// clamps at 0): removing the pair puts a Relu back.
#[test]
fn a_pair_that_clamps_at_zero_leaves_a_relu() {
    let m = model(
        vec![
            node("QuantizeLinear", "x_q", &["x", "s"], &["xq"]),
            node("DequantizeLinear", "x_dq", &["xq", "s"], &["xd"]),
            node("MatMul", "mm", &["xd", "w"], &["y"]),
        ],
        vec![
            ("s", Tensor::scalar_f32(0.01)),
            ("w", Tensor::from_f32(vec![4, 3], vec![0.5; 12])),
        ],
        &["y"],
    );
    for s in [
        strip(&m, &[index(&m, "mm")], Precision::Float32).unwrap(),
        strip_all(&m).unwrap(),
    ] {
        assert_eq!(ops(&s.model), ["Relu", "MatMul"]);
        assert_eq!(s.relus, 1);
        let x = x_feed()["x"].as_f32().unwrap().to_vec();
        let y = run(&s.model, "y");
        let want: f32 = x[..4].iter().map(|v| v.max(0.0) * 0.5).sum();
        assert!((y[0] - want).abs() < 1e-6, "{y:?} {want}");
    }
}

/// ORT `quantize_dynamic` (operator style): x → DynamicQuantizeLinear → MatMulInteger (int8
/// weight) → Cast → Mul by the scale product, then a float MatMul whose weight is dequantized
/// from an int8 initializer (weight-only).
fn dynamic_hybrid() -> Model {
    model(
        vec![
            node("DynamicQuantizeLinear", "dql", &["x"], &["xq", "xs", "xz"]),
            node("MatMulInteger", "mmi", &["xq", "wq", "xz", "wz"], &["acc"]),
            node("Mul", "scale", &["xs", "ws"], &["s"]),
            with_int(node("Cast", "cast", &["acc"], &["accf"]), "to", 1),
            node("Mul", "deq", &["accf", "s"], &["h"]),
            node("DequantizeLinear", "w2_dq", &["w2", "ws"], &["w2d"]),
            node("MatMul", "mm2", &["h", "w2d"], &["y"]),
        ],
        vec![
            ("wq", w_int8()),
            ("wz", i8s(&[], vec![0])),
            ("ws", Tensor::scalar_f32(0.01)),
            ("w2", i8s(&[3, 3], vec![1, 2, 3, 4, 5, 6, 7, 8, 9])),
        ],
        &["y"],
    )
}

#[test]
fn only_activation_qdq_pairs_make_a_model_qdq_quantized() {
    // Activation pairs (and weight DQs beside them): Q/DQ-quantized.
    assert!(is_qdq_quantized(&ort_style().graph));
    // Dynamic quantization's integer ops and a weight-only DequantizeLinear: a float model.
    let h = dynamic_hybrid();
    assert!(!is_qdq_quantized(&h.graph));
    assert!(
        has_qdq(&h.graph),
        "it holds a (weight-only) DequantizeLinear"
    );
    assert!(h.graph.nodes.iter().any(is_operator_quantized));
    // Weight-only DequantizeLinear alone: a float model too.
    let w = model(
        vec![
            node("DequantizeLinear", "w_dq", &["w", "ws"], &["wd"]),
            node("MatMul", "mm", &["x", "wd"], &["y"]),
        ],
        vec![("w", w_int8()), ("ws", Tensor::scalar_f32(0.01))],
        &["y"],
    );
    assert!(!is_qdq_quantized(&w.graph));
    // A QuantizeLinear whose codes no DequantizeLinear reads is not a pair.
    let q = model(
        vec![
            node("QuantizeLinear", "x_q", &["x", "xs"], &["xq"]),
            with_int(node("Cast", "c", &["xq"], &["xc"]), "to", 1),
            node("MatMul", "mm", &["xc", "w"], &["y"]),
        ],
        vec![
            ("xs", Tensor::scalar_f32(0.02)),
            ("w", Tensor::from_f32(vec![4, 3], vec![0.5; 12])),
        ],
        &["y"],
    );
    assert!(!is_qdq_quantized(&q.graph));
}

#[test]
fn a_float_plan_leaves_integer_ops_as_written_and_rounds_the_float_rest() {
    use crate::precision::plan::{GlobalPrecision, PrecisionConstraints};
    let m = dynamic_hybrid();
    let g = &m.graph;
    let flags = GlobalPrecision {
        fp16: true,
        ..Default::default()
    };
    let (plan, _) =
        PrecisionPlan::resolve(g, &flags, &[], PrecisionConstraints::default()).unwrap();
    let at = |name: &str| plan.layers[index(&m, name)];
    assert_eq!(at("dql"), Precision::Float32);
    assert_eq!(at("mmi"), Precision::Float32);
    assert_eq!(at("deq"), Precision::Float16);
    assert_eq!(at("mm2"), Precision::Float16);
    let cands: Vec<&str> = PrecisionPlan::candidates(g)
        .into_iter()
        .map(|i| g.nodes[i].name.as_str())
        .collect();
    assert_eq!(cands, ["scale", "deq", "mm2"]);
    // The export keeps the integer ops' types and casts around the float16 layers; it runs.
    let e = export(
        &m,
        &PrecisionPlan::uniform(g, Precision::Float16),
        None,
        &Default::default(),
    )
    .unwrap();
    let out = crate::onnx::testing::load(e.model);
    let r = Interpreter::new(&out.graph)
        .unwrap()
        .run(&x_feed())
        .unwrap();
    let got = r.output("y").unwrap().to_f32_vec().unwrap();
    let want = run(&m, "y");
    for (a, b) in got.iter().zip(&want) {
        assert!(
            (a - b).abs() <= 2e-3 * b.abs().max(1.0),
            "{got:?} vs {want:?}"
        );
    }
}
