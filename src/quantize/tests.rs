use super::*;
use crate::exec::{PlanOptions, PreparedPlan, RunOptions};
use crate::onnx::model_from_proto;
use crate::tensor::Tensor;
use crate::{Feeds, Interpreter};

use crate::onnx::testing::node;

fn vi(name: &str, dims: &[i64]) -> proto::ValueInfoProto {
    crate::onnx::testing::vi(name, DType::F32, dims)
}

fn weight(k: usize, n: usize, seed: u32) -> Tensor {
    let v = (0..k * n)
        .map(|i| (((i as u32 * 2654435761u32) ^ seed) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    Tensor::from_f32(vec![k, n], v)
}

/// x[2,32] -> MatMul mm1 (W1[32,32]) -> Relu -> MatMul mm2 (W2[32,8]) -> Softmax -> y;
/// mm3 reads W1 too (x -> mm3 -> z).
fn mlp(nodes_extra: Vec<proto::NodeProto>, opset: i64) -> Model {
    let mut nodes = vec![
        node("MatMul", "mm1", &["x", "W1"], &["h"]),
        node("Relu", "relu", &["h"], &["r"]),
        node("MatMul", "mm2", &["r", "W2"], &["l"]),
        node("Softmax", "softmax", &["l"], &["y"]),
        node("MatMul", "mm3", &["x", "W1"], &["z"]),
    ];
    nodes.extend(nodes_extra);
    crate::onnx::testing::load(crate::onnx::testing::model_proto(
        nodes,
        vec![("W1", weight(32, 32, 1)), ("W2", weight(32, 8, 2))],
        &[("x", &[2, 32])],
        &[("y", &[2, 8]), ("z", &[2, 32])],
        opset,
    ))
}

fn names(graph: &Graph, idx: &[usize]) -> Vec<String> {
    idx.iter().map(|&k| graph.nodes[k].name.clone()).collect()
}

fn feeds() -> Feeds {
    let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
    [("x".to_string(), Tensor::from_f32(vec![2, 32], x))]
        .into_iter()
        .collect()
}

fn bits(ts: &[(String, Tensor)]) -> Vec<Vec<u32>> {
    ts.iter()
        .map(|(_, t)| t.as_f32().unwrap().iter().map(|x| x.to_bits()).collect())
        .collect()
}

fn reload(q: &Quantized) -> Model {
    model_from_proto(q.model.clone(), Path::new("q.onnx"), Path::new(".")).unwrap()
}

#[test]
fn int8_selects_the_quantizable_layers_and_each_exclusion_kind() {
    let m = mlp(vec![], 17);
    let g = &m.graph;
    let opts = QuantizeOptions::new(Scheme::Int8);
    let s = select(g, &opts).unwrap();
    assert_eq!(names(g, &s.quantized), ["mm1", "mm2", "mm3"]);
    assert!(s.excluded.is_empty() && s.notes.is_empty());

    let mut o = opts.clone();
    o.exclude_nodes = vec!["^mm2$".into()];
    let s = select(g, &o).unwrap();
    assert_eq!(names(g, &s.quantized), ["mm1", "mm3"]);
    assert_eq!(s.excluded.len(), 1);
    assert!(s.excluded[0].reason.contains("'^mm2$'"));

    // A regex matches anywhere in the name.
    let mut o = opts.clone();
    o.exclude_nodes = vec!["m[13]".into()];
    assert_eq!(names(g, &select(g, &o).unwrap().quantized), ["mm2"]);

    let mut o = opts.clone();
    o.exclude_op_types = vec!["MatMul".into(), "Softmax".into()];
    let s = select(g, &o).unwrap();
    assert!(s.quantized.is_empty());
    assert_eq!(s.excluded.len(), 3);
    assert!(
        s.notes.iter().any(|n| n.contains("Softmax")),
        "{:?}",
        s.notes
    );

    let mut o = opts.clone();
    o.exclude_names = vec!["mm3".into(), "relu".into()];
    o.exclude_names_source = "r.json".into();
    let s = select(g, &o).unwrap();
    assert_eq!(names(g, &s.quantized), ["mm1", "mm2"]);
    assert!(s.excluded[0].reason.contains("r.json"));
    assert!(
        s.notes.iter().any(|n| n.contains("'relu'")),
        "{:?}",
        s.notes
    );
}

#[test]
fn bad_exclusions_are_errors_naming_what_is_wrong() {
    let m = mlp(vec![], 17);
    let mut o = QuantizeOptions::new(Scheme::Int8);
    o.exclude_op_types = vec!["Matmul".into()];
    let e = select(&m.graph, &o).unwrap_err().to_string();
    assert!(e.contains("unknown op type 'Matmul'"), "{e}");

    let mut o = QuantizeOptions::new(Scheme::Int8);
    o.exclude_nodes = vec!["mm(".into()];
    let e = select(&m.graph, &o).unwrap_err().to_string();
    assert!(e.contains("--exclude-nodes 'mm('"), "{e}");

    let mut o = QuantizeOptions::new(Scheme::Int8);
    o.exclude_names = vec!["mm1".into(), "/encoder/MatMul_7".into()];
    o.exclude_names_source = "other.json".into();
    let e = select(&m.graph, &o).unwrap_err().to_string();
    assert!(
        e.contains("other.json") && e.contains("'/encoder/MatMul_7'") && !e.contains("'mm1'"),
        "{e}"
    );

    // Everything excluded: nothing to write.
    let mut o = QuantizeOptions::new(Scheme::Int8);
    o.exclude_op_types = vec!["MatMul".into()];
    let s = select(&m.graph, &o).unwrap();
    let e = quantize(&m, Scheme::Int8, &s, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("nothing to quantize"), "{e}");
}

#[test]
fn an_already_quantized_model_is_refused_naming_its_nodes() {
    let extra = vec![
        node("QuantizeLinear", "q_in", &["x", "s"], &["xq"]),
        node("DequantizeLinear", "dq_in", &["xq", "s"], &["xd"]),
    ];
    let mut m = mlp(vec![], 17);
    // Add the Q/DQ pair (with its scale) to the proto and reload.
    let mut p = (*m.proto).clone();
    let g = p.graph.as_mut().unwrap();
    g.node.extend(extra);
    g.initializer
        .push(tensor_to_proto("s", &Tensor::scalar_f32(0.1)));
    g.output.push(vi("xd", &[2, 32]));
    m = model_from_proto(p, Path::new("t.onnx"), Path::new(".")).unwrap();
    let e = check_not_quantized(&m.graph).unwrap_err().to_string();
    assert!(
        e.contains("already quantized")
            && e.contains("'q_in' (QuantizeLinear)")
            && e.contains("'dq_in' (DequantizeLinear)"),
        "{e}"
    );
    let s = select(&m.graph, &QuantizeOptions::new(Scheme::Int8)).unwrap();
    assert!(quantize(&m, Scheme::Int8, &s, None).is_err());
}

#[test]
fn int8_output_equals_the_emulated_plan_bit_for_bit() {
    let m = mlp(vec![], 17);
    let interp = Interpreter::new(&m.graph).unwrap();
    let f = feeds();
    let res = interp
        .run_with(
            &f,
            &RunOptions {
                keep_intermediates: true,
            },
        )
        .unwrap();
    let mut amax = BTreeMap::new();
    for (n, t) in f.iter().chain(res.intermediates.iter()) {
        if let Some(v) = t.as_f32() {
            amax.insert(n.clone(), v.iter().fold(0f32, |a, x| a.max(x.abs())));
        }
    }
    for scheme in [Scheme::Int8, Scheme::Fp8] {
        let mut o = QuantizeOptions::new(scheme);
        o.exclude_nodes = vec!["mm2".into()];
        let s = select(&m.graph, &o).unwrap();
        let q = quantize(&m, scheme, &s, Some(&amax)).unwrap();
        let qm = reload(&q);
        // mm2 keeps its float weight: no DequantizeLinear feeds it.
        let mm2 = qm.graph.nodes.iter().find(|n| n.name == "mm2").unwrap();
        assert_eq!(mm2.inputs, ["r", "W2"]);
        let got = Interpreter::new(&qm.graph).unwrap().run(&f).unwrap();
        let p = plan(&m.graph, &s, scheme).unwrap();
        let prepared = PreparedPlan::new(
            &m.graph,
            &p,
            &PlanOptions {
                amax: Some(&amax),
                ..Default::default()
            },
        )
        .unwrap();
        let emu = interp
            .run_plan(&f, &RunOptions::default(), &prepared)
            .unwrap();
        assert_eq!(bits(&got.outputs), bits(&emu.outputs), "{scheme:?}");
        assert_ne!(bits(&got.outputs), bits(&res.outputs), "{scheme:?}");
    }
}

/// The original model with `w` replaced by `values` for the nodes named in `readers`.
fn with_weight(m: &Model, w: &str, values: &[f32], readers: &[&str]) -> Model {
    let mut p = (*m.proto).clone();
    let g = p.graph.as_mut().unwrap();
    let t = m.graph.initializers[w].clone();
    let name = format!("{w}_replaced");
    g.initializer.push(tensor_to_proto(
        &name,
        &Tensor::from_f32(t.shape().to_vec(), values.to_vec()),
    ));
    for n in &mut g.node {
        if readers.contains(&n.name.as_deref().unwrap_or("")) {
            for i in &mut n.input {
                if i == w {
                    *i = name.clone();
                }
            }
        }
    }
    model_from_proto(p, Path::new("t.onnx"), Path::new(".")).unwrap()
}

#[test]
fn weight_only_outputs_compute_the_block_quantized_weights() {
    let m = mlp(vec![], 17);
    let f = feeds();
    for (scheme, opset) in [
        (Scheme::Int4Weights { block_size: 16 }, 21),
        (Scheme::Nvfp4Weights { block_size: 16 }, 23),
    ] {
        // mm3 shares W1 with mm1 but is excluded: it keeps the float W1.
        let mut o = QuantizeOptions::new(scheme);
        o.exclude_nodes = vec!["mm3".into()];
        let s = select(&m.graph, &o).unwrap();
        assert_eq!(names(&m.graph, &s.quantized), ["mm1", "mm2"]);
        let q = quantize(&m, scheme, &s, None).unwrap();
        assert_eq!(q.quantized_weights, 2);
        assert_eq!(q.model.opset_import[0].version, Some(opset));
        let qm = reload(&q);
        assert!(qm.graph.initializers.contains_key("W1"));
        assert!(
            !qm.graph.initializers.contains_key("W2"),
            "W2 is unused now"
        );
        let got = Interpreter::new(&qm.graph).unwrap().run(&f).unwrap();

        let quant = |w: &str| {
            let t = &m.graph.initializers[w];
            match scheme {
                Scheme::Nvfp4Weights { block_size } => {
                    weights::quantize_nvfp4(w, t.as_f32().unwrap(), t.shape(), 0, block_size)
                }
                _ => weights::quantize_int4(w, t.as_f32().unwrap(), t.shape(), 0, 16),
            }
            .unwrap()
            .dequantized
        };
        let m1 = with_weight(&m, "W1", &quant("W1"), &["mm1"]);
        let m2 = with_weight(&m1, "W2", &quant("W2"), &["mm2"]);
        let want = Interpreter::new(&m2.graph).unwrap().run(&f).unwrap();
        assert_eq!(bits(&got.outputs), bits(&want.outputs), "{scheme:?}");
        let float = Interpreter::new(&m.graph).unwrap().run(&f).unwrap();
        // The excluded mm3 computes exactly what the float model computes.
        assert_eq!(bits(&got.outputs)[1], bits(&float.outputs)[1]);
        assert_ne!(bits(&got.outputs)[0], bits(&float.outputs)[0]);
    }
}

#[test]
fn weight_only_skips_layers_without_a_weight() {
    // mm4 multiplies two activations (attention-like): no weight to quantize.
    let m = mlp(vec![node("MatMul", "mm4", &["h", "r"], &["u"])], 21);
    let s = select(
        &m.graph,
        &QuantizeOptions::new(Scheme::Int4Weights { block_size: 8 }),
    )
    .unwrap();
    assert_eq!(names(&m.graph, &s.quantized), ["mm1", "mm2", "mm3"]);
    assert_eq!(s.skipped.len(), 1);
    assert!(
        s.skipped[0].reason.contains("not an initializer"),
        "{:?}",
        s.skipped
    );
    // int8 quantizes it (both operands are activations).
    let s = select(&m.graph, &QuantizeOptions::new(Scheme::Int8)).unwrap();
    assert_eq!(s.quantized.len(), 4);
}

#[test]
fn raising_the_opset_refuses_ops_that_changed_meaning() {
    let mut m = mlp(vec![], 18);
    let mut p = (*m.proto).clone();
    let g = p.graph.as_mut().unwrap();
    g.node.push(node(
        "GroupNormalization",
        "gn",
        &["h", "gs", "gb"],
        &["gn_out"],
    ));
    g.initializer.push(tensor_to_proto(
        "gs",
        &Tensor::from_f32(vec![2], vec![1.0, 1.0]),
    ));
    g.initializer.push(tensor_to_proto(
        "gb",
        &Tensor::from_f32(vec![2], vec![0.0, 0.0]),
    ));
    g.node[5].attribute.push(schema::int_attr("num_groups", 2));
    m = model_from_proto(p, Path::new("t.onnx"), Path::new(".")).unwrap();
    let s = select(
        &m.graph,
        &QuantizeOptions::new(Scheme::Int4Weights { block_size: 8 }),
    )
    .unwrap();
    let e = quantize(&m, Scheme::Int4Weights { block_size: 8 }, &s, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("'gn'") && e.contains("GroupNormalization changed meaning at opset 21"),
        "{e}"
    );
}

#[test]
fn result_files_give_their_top_level_layer_names() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r.json");
    std::fs::write(
        &p,
        r#"{"model": "m.onnx", "layers": [{"index": 0, "name": "mm1", "op": "MatMul", "flops": 1}],
            "with_fusion": {"layers": [{"index": 2, "name": "mm2"}]}}"#,
    )
    .unwrap();
    assert_eq!(result_file_layers(&p).unwrap(), ["mm1"]);
    std::fs::write(&p, r#"{"model": "m.onnx"}"#).unwrap();
    let e = result_file_layers(&p).unwrap_err().to_string();
    assert!(e.contains("r.json") && e.contains("'layers'"), "{e}");
    std::fs::write(&p, "{").unwrap();
    assert!(result_file_layers(&p)
        .unwrap_err()
        .to_string()
        .contains("not JSON"));
    let e = result_file_layers(&dir.path().join("missing.json")).unwrap_err();
    assert!(e.to_string().contains("missing.json"));
}

#[test]
fn default_op_types_are_the_ops_the_int8_emulation_quantizes() {
    // `mixprec run --int8` puts exactly the ops with a quantized kernel in int8; the
    // bit-equality of `quantize --int8` with it needs the same set.
    let mut with_kernel: Vec<&str> = crate::ops::Registry::global()
        .op_types()
        .into_iter()
        .filter(|op| {
            crate::precision::has_quantized_kernel(&crate::graph::testing::node("n", op, &[], &[]))
        })
        .collect();
    with_kernel.sort_unstable();
    let mut ours = DEFAULT_OP_TYPES.to_vec();
    ours.sort_unstable();
    assert_eq!(with_kernel, ours);
}
