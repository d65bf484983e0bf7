//! What the ONNX operator schemas allow: float16/bfloat16 inputs per op version (table
//! generated from the `onnx` package, `schemas.rs`), and raising a model's opset (for
//! QuantizeLinear/DequantizeLinear with per-axis scales or float8 types) where that is safe.

use super::schemas::SCHEMAS;
use crate::error::{Error, Result};
use crate::onnx::proto;
use crate::tensor::DType;

/// One schema version of an operator.
#[derive(Clone, Copy, Debug)]
pub struct OpVersion {
    pub since: i64,
    /// Bit i: formal input i accepts tensor(float16).
    pub f16: u32,
    /// Bit i: formal input i accepts tensor(bfloat16).
    pub bf16: u32,
    /// Number of formal inputs.
    pub inputs: u32,
    /// The last formal input is variadic (repeats for every further input).
    pub variadic: bool,
}

/// Constructor used by the generated table.
pub const fn v(since: i64, f16: u32, bf16: u32, inputs: u32, variadic: bool) -> OpVersion {
    OpVersion {
        since,
        f16,
        bf16,
        inputs,
        variadic,
    }
}

fn versions(op: &str) -> Option<&'static [OpVersion]> {
    SCHEMAS
        .binary_search_by(|(name, _)| (*name).cmp(op))
        .ok()
        .map(|i| SCHEMAS[i].1)
}

/// The schema of a default-domain op in effect at `opset` (None: unknown op, or the op did not
/// exist yet).
pub fn schema_at(op: &str, opset: i64) -> Option<OpVersion> {
    versions(op)?
        .iter()
        .rev()
        .find(|v| v.since <= opset)
        .copied()
}

/// Whether input `index` of a default-domain op accepts `dtype` (float16 or bfloat16) at
/// `opset`. float32 and every other type are not checked (they are what the model had).
pub fn input_accepts(op: &str, opset: i64, index: usize, dtype: DType) -> bool {
    let Some(s) = schema_at(op, opset) else {
        return false;
    };
    let mask = match dtype {
        DType::F16 => s.f16,
        DType::BF16 => s.bf16,
        _ => return true,
    };
    let formal = if s.variadic && s.inputs > 0 {
        index.min(s.inputs as usize - 1)
    } else {
        index
    };
    formal < 32 && mask & (1 << formal) != 0
}

/// The smallest IR version a model of this default-domain opset needs.
pub fn min_ir_version(opset: i64) -> i64 {
    match opset {
        ..=8 => 3,
        9 => 4,
        10 => 5,
        11 => 6,
        12..=14 => 7,
        15..=18 => 8,
        19..=20 => 9,
        21..=22 => 10,
        _ => 11,
    }
}

/// Reduce ops whose `axes` attribute became an input in opset 18.
const AXES_TO_INPUT_18: [&str; 9] = [
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSumSquare",
];

/// The oldest opset the upgrade knows how to raise from. From 11 on the changes of meaning
/// have adapters here (Dropout's `ratio` became an input at 12; at 13 `split`, `axes` of
/// Squeeze/Unsqueeze/ReduceSum became inputs and Softmax/LogSoftmax/Hardmax stopped coercing
/// to 2-D); before 11 Resize/Upsample, Clip's bounds and Pad's pads changed too.
pub const MIN_UPGRADE_FROM: i64 = 11;

/// Ops whose `axes` attribute became an input in opset 13.
const AXES_TO_INPUT_13: [&str; 3] = ["Squeeze", "Unsqueeze", "ReduceSum"];

/// Checks that every node of the default domain (subgraphs included) keeps its meaning when the
/// model's opset goes from `from` to `to`, following the ONNX version converter's adapters
/// (onnx/version_converter/convert.h): type-only changes are compatible, the few that are not
/// are rewritten by [`upgrade_node`] or refused here.
pub fn check_upgrade(nodes: &[proto::NodeProto], from: i64, to: i64) -> Result<()> {
    if from >= to {
        return Ok(());
    }
    if from < MIN_UPGRADE_FROM {
        return Err(Error::Invalid(format!(
            "the model uses ONNX opset {from}; its quantized layers need QuantizeLinear/DequantizeLinear of opset {to}, \
             and mixprec raises opsets only from {MIN_UPGRADE_FROM} on (many ops changed meaning before). \
             Upgrade the model first: onnx.version_converter.convert_version(model, {to})"
        )));
    }
    let mut problems = Vec::new();
    visit(nodes, &mut |n| {
        let domain = n.domain.as_deref().unwrap_or("");
        if !(domain.is_empty() || domain == "ai.onnx") {
            return;
        }
        let op = n.op_type.as_deref().unwrap_or("");
        let name = n.name.as_deref().unwrap_or("");
        if schema_at(op, from).is_none() || schema_at(op, to).is_none() {
            problems.push(format!(
                "node '{name}': op '{op}' is unknown to ONNX at opset {from} or {to}"
            ));
            return;
        }
        let crosses = |v: i64| from < v && v <= to;
        // Changed meaning without an adapter mixprec applies: DFT's axis became an input and
        // GridSample's modes were renamed (20); GroupNormalization's scale and bias went from
        // per group to per channel (21).
        let changed = match op {
            "DFT" | "GridSample" => crosses(20).then_some(20),
            "GroupNormalization" => crosses(21).then_some(21),
            _ => None,
        };
        if let Some(v) = changed {
            problems.push(format!("node '{name}': {op} changed meaning at opset {v}"));
        }
        if op == "BatchNormalization" && crosses(14) && n.output.len() > 3 {
            problems.push(format!(
                "node '{name}': BatchNormalization with {} outputs has no opset-14 form",
                n.output.len()
            ));
        }
    });
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "cannot raise the model's opset from {from} to {to} (needed for its QuantizeLinear/DequantizeLinear): {}. \
             Upgrade the model first with onnx.version_converter.convert_version(model, {to})",
            problems.join("; ")
        )))
    }
}

fn visit(nodes: &[proto::NodeProto], f: &mut dyn FnMut(&proto::NodeProto)) {
    for n in nodes {
        f(n);
        for a in &n.attribute {
            if let Some(g) = &a.g {
                visit(&g.node, f);
            }
            for g in &a.graphs {
                visit(&g.node, f);
            }
        }
    }
}

/// Rewrites one node (and its subgraphs) for an opset raised from `from` to `to`, as the ONNX
/// version converter does: `axes` attributes of Reduce ops become an int64 input (opset 18),
/// Split gets `num_outputs` when it has no `split` input (18), RoiAlign keeps its old
/// coordinate mode (16). New constant inputs are returned as initializers to add (subgraph
/// nodes get a Constant node instead, so the value stays in scope).
pub fn upgrade_nodes(
    nodes: &mut Vec<proto::NodeProto>,
    from: i64,
    to: i64,
    fresh: &mut dyn FnMut(&str) -> String,
    initializers: Option<&mut Vec<proto::TensorProto>>,
) {
    let crosses = |v: i64| from < v && v <= to;
    let mut out = Vec::with_capacity(nodes.len());
    let mut inits = initializers;
    for mut n in std::mem::take(nodes) {
        for a in &mut n.attribute {
            if let Some(g) = a.g.as_mut() {
                upgrade_nodes(&mut g.node, from, to, fresh, None);
            }
            for g in &mut a.graphs {
                upgrade_nodes(&mut g.node, from, to, fresh, None);
            }
        }
        let domain = n.domain.clone().unwrap_or_default();
        if !(domain.is_empty() || domain == "ai.onnx") {
            out.push(n);
            continue;
        }
        let op = n.op_type.clone().unwrap_or_default();
        let base = n.name.clone().unwrap_or_else(|| op.clone());
        // Dropout-12: `ratio` is an input (float scalar), no longer an attribute.
        if crosses(12) && op == "Dropout" {
            if let Some(pos) = n
                .attribute
                .iter()
                .position(|a| a.name.as_deref() == Some("ratio"))
            {
                let a = n.attribute.remove(pos);
                let name = fresh(&format!("{base}_ratio"));
                let t = proto::TensorProto {
                    data_type: Some(DType::F32.onnx_code()),
                    name: Some(name.clone()),
                    float_data: vec![a.f.unwrap_or(0.5)],
                    ..Default::default()
                };
                attr_to_input(&mut n, t, &mut inits, &mut out, fresh, &base);
            }
        }
        if crosses(13) && (AXES_TO_INPUT_13.contains(&op.as_str()) || op == "Split") {
            let attr = if op == "Split" { "split" } else { "axes" };
            ints_attr_to_input(&mut n, attr, &mut inits, &mut out, fresh, &base);
        }
        // Softmax-13 normalizes along one axis; before, it coerced the input to 2-D at `axis`
        // (default 1) and normalized each row. As the ONNX version converter
        // (adapters/softmax_12_13.h): Flatten at `axis`, Softmax over the last axis, Reshape
        // back to the input's shape. An explicit `axis = -1` means the same in both.
        if crosses(13) && matches!(op.as_str(), "Softmax" | "LogSoftmax" | "Hardmax") {
            let pos = n
                .attribute
                .iter()
                .position(|a| a.name.as_deref() == Some("axis"));
            let axis = pos.and_then(|p| n.attribute[p].i).unwrap_or(1);
            if axis != -1 && !n.input.is_empty() && !n.output.is_empty() {
                if let Some(p) = pos {
                    n.attribute.remove(p);
                }
                n.attribute.push(int_attr("axis", -1));
                let x = n.input[0].clone();
                let y = n.output[0].clone();
                let shape = fresh(&format!("{base}_input_shape"));
                let flat = fresh(&format!("{base}_flattened"));
                let rows = fresh(&format!("{base}_2d"));
                out.push(proto::NodeProto {
                    name: Some(fresh(&format!("{base}_Shape"))),
                    op_type: Some("Shape".into()),
                    input: vec![x.clone()],
                    output: vec![shape.clone()],
                    ..Default::default()
                });
                out.push(proto::NodeProto {
                    name: Some(fresh(&format!("{base}_Flatten"))),
                    op_type: Some("Flatten".into()),
                    input: vec![x],
                    output: vec![flat.clone()],
                    attribute: vec![int_attr("axis", axis)],
                    ..Default::default()
                });
                n.input[0] = flat;
                n.output[0] = rows.clone();
                out.push(n);
                out.push(proto::NodeProto {
                    name: Some(fresh(&format!("{base}_Reshape"))),
                    op_type: Some("Reshape".into()),
                    input: vec![rows, shape],
                    output: vec![y],
                    ..Default::default()
                });
                continue;
            }
        }
        if crosses(18) && AXES_TO_INPUT_18.contains(&op.as_str()) {
            ints_attr_to_input(&mut n, "axes", &mut inits, &mut out, fresh, &base);
        }
        if crosses(18)
            && op == "Split"
            && n.input.get(1).is_none_or(|s| s.is_empty())
            && !n
                .attribute
                .iter()
                .any(|a| a.name.as_deref() == Some("num_outputs"))
        {
            n.input.truncate(1);
            n.attribute
                .push(int_attr("num_outputs", n.output.len() as i64));
        }
        if crosses(16)
            && op == "RoiAlign"
            && !n
                .attribute
                .iter()
                .any(|a| a.name.as_deref() == Some("coordinate_transformation_mode"))
        {
            n.attribute.push(proto::AttributeProto {
                name: Some("coordinate_transformation_mode".into()),
                r#type: Some(proto::attribute_proto::AttributeType::String as i32),
                s: Some(b"output_half_pixel".to_vec()),
                ..Default::default()
            });
        }
        out.push(n);
    }
    *nodes = out;
}

/// Moves the ints attribute `attr` of `n`, when present, to input slot 1 as an int64 tensor
/// (`axes` of Reduce*/Squeeze/Unsqueeze, Split's `split`).
fn ints_attr_to_input(
    n: &mut proto::NodeProto,
    attr: &str,
    inits: &mut Option<&mut Vec<proto::TensorProto>>,
    out: &mut Vec<proto::NodeProto>,
    fresh: &mut dyn FnMut(&str) -> String,
    base: &str,
) {
    let Some(pos) = n
        .attribute
        .iter()
        .position(|a| a.name.as_deref() == Some(attr))
    else {
        return;
    };
    let a = n.attribute.remove(pos);
    let t = proto::TensorProto {
        dims: vec![a.ints.len() as i64],
        data_type: Some(DType::I64.onnx_code()),
        name: Some(fresh(&format!("{base}_{attr}"))),
        int64_data: a.ints,
        ..Default::default()
    };
    attr_to_input(n, t, inits, out, fresh, base);
}

/// Puts the constant `t` (an attribute's value) in input slot 1 of `n`: as an initializer of
/// the main graph, or a Constant node in front of `n` inside a subgraph (so the value stays in
/// scope).
fn attr_to_input(
    n: &mut proto::NodeProto,
    t: proto::TensorProto,
    inits: &mut Option<&mut Vec<proto::TensorProto>>,
    out: &mut Vec<proto::NodeProto>,
    fresh: &mut dyn FnMut(&str) -> String,
    base: &str,
) {
    let name = t.name.clone().unwrap_or_default();
    match inits.as_deref_mut() {
        Some(list) => list.push(t),
        None => out.push(constant_node(fresh(&format!("{base}_Constant")), t)),
    }
    while n.input.is_empty() {
        // The op always has its data input; keep the new input in slot 1 regardless.
        n.input.push(String::new());
    }
    n.input.truncate(1);
    n.input.push(name);
}

pub(crate) fn constant_node(name: String, t: proto::TensorProto) -> proto::NodeProto {
    let output = t.name.clone().unwrap_or_default();
    proto::NodeProto {
        name: Some(name),
        op_type: Some("Constant".into()),
        output: vec![output],
        attribute: vec![proto::AttributeProto {
            name: Some("value".into()),
            r#type: Some(proto::attribute_proto::AttributeType::Tensor as i32),
            t: Some(t),
            ..Default::default()
        }],
        ..Default::default()
    }
}

pub fn int_attr(name: &str, v: i64) -> proto::AttributeProto {
    proto::AttributeProto {
        name: Some(name.into()),
        r#type: Some(proto::attribute_proto::AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_knows_type_support() {
        assert!(SCHEMAS.windows(2).all(|w| w[0].0 < w[1].0));
        // Conv accepts bfloat16 only from opset 22; float16 always.
        assert!(!input_accepts("Conv", 17, 0, DType::BF16));
        assert!(input_accepts("Conv", 22, 1, DType::BF16));
        assert!(input_accepts("Conv", 11, 0, DType::F16));
        // Add: bfloat16 from 13.
        assert!(!input_accepts("Add", 12, 0, DType::BF16));
        assert!(input_accepts("Add", 13, 1, DType::BF16));
        // Concat is variadic: every input follows the last formal one.
        assert!(input_accepts("Concat", 13, 5, DType::BF16));
        // Resize scales are float32 only.
        assert!(!input_accepts("Resize", 19, 2, DType::F16));
        assert!(schema_at("NoSuchOp", 19).is_none());
        assert_eq!(schema_at("LayerNormalization", 16).map(|s| s.since), None);
        assert_eq!(schema_at("Reshape", 17).map(|s| s.since), Some(14));
    }

    fn node(op: &str, inputs: &[&str], outputs: &[&str]) -> proto::NodeProto {
        proto::NodeProto {
            name: Some(format!("{op}_n")),
            op_type: Some(op.into()),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn upgrade_moves_axes_and_sets_num_outputs() {
        let mut rm = node("ReduceMean", &["x"], &["y"]);
        rm.attribute.push(proto::AttributeProto {
            name: Some("axes".into()),
            r#type: Some(proto::attribute_proto::AttributeType::Ints as i32),
            ints: vec![-1],
            ..Default::default()
        });
        let split = node("Split", &["y"], &["a", "b"]);
        let mut nodes = vec![rm, split];
        check_upgrade(&nodes, 17, 19).unwrap();
        let mut inits = Vec::new();
        let mut k = 0;
        let mut fresh = |b: &str| {
            k += 1;
            format!("{b}{k}")
        };
        upgrade_nodes(&mut nodes, 17, 19, &mut fresh, Some(&mut inits));
        assert_eq!(nodes[0].input.len(), 2);
        assert!(nodes[0].attribute.is_empty());
        assert_eq!(inits[0].int64_data, vec![-1]);
        assert_eq!(inits[0].name.as_deref(), Some(nodes[0].input[1].as_str()));
        assert_eq!(nodes[1].attribute[0].i, Some(2));
    }

    #[test]
    fn old_opsets_and_training_batchnorm_are_refused() {
        let e = check_upgrade(&[node("Relu", &["x"], &["y"])], 10, 13)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("opset 10") && e.contains("convert_version"),
            "{e}"
        );
        let bn = node("BatchNormalization", &["x"], &["y", "m", "v", "sm", "sv"]);
        let e = check_upgrade(&[bn], 13, 19).unwrap_err().to_string();
        assert!(e.contains("BatchNormalization"), "{e}");
    }

    /// Every op whose meaning changed between opsets 11 and 13, run before and after the
    /// upgrade: the same bits (the interpreter's kernels follow each opset's semantics).
    #[test]
    fn upgrade_from_11_to_13_keeps_every_changed_op_meaning() {
        use crate::onnx::testing::{
            load, model_proto, node as named, with_float, with_int, with_ints,
        };
        use crate::tensor::Tensor;
        let nodes = vec![
            with_int(named("Softmax", "sm", &["x"], &["s"]), "axis", 1),
            with_ints(
                with_int(named("Split", "split", &["s"], &["a", "b"]), "axis", 2),
                "split",
                &[1, 3],
            ),
            with_ints(named("Squeeze", "sq", &["a"], &["q"]), "axes", &[2]),
            with_ints(named("Unsqueeze", "unsq", &["q"], &["u"]), "axes", &[0]),
            with_ints(
                with_int(named("ReduceSum", "rs", &["b"], &["r"]), "keepdims", 1),
                "axes",
                &[2],
            ),
            with_float(named("Dropout", "drop", &["r"], &["d"]), "ratio", 0.3),
            named("LogSoftmax", "lsm", &["x"], &["l"]),
            with_int(named("Hardmax", "hm", &["x"], &["h"]), "axis", -1),
        ];
        let outputs: [(&str, &[i64]); 4] = [
            ("u", &[1, 2, 3]),
            ("d", &[2, 3, 1]),
            ("l", &[2, 3, 4]),
            ("h", &[2, 3, 4]),
        ];
        let old = model_proto(nodes, vec![], &[("x", &[2, 3, 4])], &outputs, 11);
        let x: Vec<f32> = (0..24).map(|i| (i as f32 * 0.71).sin() * 3.0).collect();
        let feeds: crate::tensor::Feeds = [("x".to_string(), Tensor::from_f32(vec![2, 3, 4], x))]
            .into_iter()
            .collect();
        let run = |p: proto::ModelProto| {
            let m = load(p);
            let r = crate::exec::Interpreter::new(&m.graph)
                .unwrap()
                .run(&feeds)
                .unwrap();
            r.outputs
                .iter()
                .map(|(n, t)| {
                    (
                        n.clone(),
                        t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect(),
                    )
                })
                .collect::<Vec<(String, Vec<u32>)>>()
        };
        let before = run(old.clone());

        let mut new = old;
        let g = new.graph.as_mut().unwrap();
        check_upgrade(&g.node, 11, 13).unwrap();
        let mut inits = Vec::new();
        let mut k = 0;
        let mut fresh = |b: &str| {
            k += 1;
            format!("{b}_{k}")
        };
        upgrade_nodes(&mut g.node, 11, 13, &mut fresh, Some(&mut inits));
        g.initializer.extend(inits);
        new.opset_import[0].version = Some(13);
        let ops: Vec<&str> = g
            .node
            .iter()
            .map(|n| n.op_type.as_deref().unwrap())
            .collect();
        // Softmax(axis=1) and LogSoftmax (default axis 1) went through Flatten/Reshape;
        // Hardmax(axis=-1) means the same at both opsets and stays alone.
        assert_eq!(
            ops.iter().filter(|o| **o == "Flatten").count(),
            2,
            "{ops:?}"
        );
        for n in &g.node {
            let op = n.op_type.as_deref().unwrap();
            if matches!(
                op,
                "Split" | "Squeeze" | "Unsqueeze" | "ReduceSum" | "Dropout"
            ) {
                assert_eq!(n.input.len(), 2, "{op}: the attribute became input 1");
                assert!(n
                    .attribute
                    .iter()
                    .all(|a| !matches!(a.name.as_deref(), Some("split" | "axes" | "ratio"))));
            }
        }
        assert_eq!(run(new), before);

        let e = check_upgrade(&[node("Upsample", &["x"], &["y"])], 10, 13).unwrap_err();
        assert!(e.to_string().contains("opset 10"), "{e}");
    }
}
