//! Small graphs for unit tests (built in code, no ONNX file).

use super::{Dim, Graph, Node, ValueInfo};
use crate::tensor::{DType, Tensor};
use std::collections::{BTreeMap, HashMap};

/// A node of the default domain without attributes.
pub fn node(name: &str, op: &str, inputs: &[&str], outputs: &[&str]) -> Node {
    Node {
        name: name.into(),
        op_type: op.into(),
        domain: String::new(),
        inputs: inputs.iter().map(|s| s.to_string()).collect(),
        outputs: outputs.iter().map(|s| s.to_string()).collect(),
        attrs: BTreeMap::new(),
        ..Default::default()
    }
}

/// A default-domain node `n` of `op` with `attrs` and one output `y`, for kernel unit tests.
pub fn node_with(op: &str, attrs: &[(&str, super::Attribute)]) -> Node {
    Node {
        attrs: attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        ..node("n", op, &[], &["y"])
    }
}

/// An f32 value of fixed shape.
pub fn vi(name: &str, shape: &[usize]) -> ValueInfo {
    ValueInfo {
        name: name.into(),
        dtype: Some(DType::F32),
        shape: Some(shape.iter().map(|&d| Dim::Fixed(d)).collect()),
    }
}

/// A graph at opset 17.
pub fn graph(
    nodes: Vec<Node>,
    inputs: Vec<ValueInfo>,
    outputs: Vec<ValueInfo>,
    inits: Vec<(&str, Tensor)>,
) -> Graph {
    let mut opsets = BTreeMap::new();
    opsets.insert(String::new(), 17);
    Graph {
        nodes,
        inputs,
        outputs,
        initializers: inits
            .into_iter()
            .map(|(n, t)| (n.to_string(), t))
            .collect::<HashMap<_, _>>(),
        opsets,
        ..Default::default()
    }
}

/// A chain `x → (Mul w_i → Add b_i → Tanh)×blocks → y` over `n` values: `3·blocks` layers
/// whose errors accumulate, for search and cache tests.
pub fn chain(n: usize, blocks: usize) -> Graph {
    let mut nodes = Vec::new();
    let mut inits = Vec::new();
    let mut prev = "x".to_string();
    for b in 0..blocks {
        let (w, bias) = (format!("w{b}"), format!("b{b}"));
        let (m, a, t) = (format!("m{b}"), format!("a{b}"), format!("t{b}"));
        let out = if b + 1 == blocks {
            "y".to_string()
        } else {
            t.clone()
        };
        nodes.push(node(&format!("mul{b}"), "Mul", &[&prev, &w], &[&m]));
        nodes.push(node(&format!("add{b}"), "Add", &[&m, &bias], &[&a]));
        nodes.push(node(&format!("tanh{b}"), "Tanh", &[&a], &[&out]));
        let wv: Vec<f32> = (0..n)
            .map(|i| 1.1 + 0.013 * ((i * 7 + b) % 11) as f32)
            .collect();
        let bv: Vec<f32> = (0..n).map(|i| 0.01 * ((i + 3 * b) % 5) as f32).collect();
        inits.push((w, Tensor::from_f32(vec![n], wv)));
        inits.push((bias, Tensor::from_f32(vec![n], bv)));
        prev = out;
    }
    let inits: Vec<(&str, Tensor)> = inits.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    graph(nodes, vec![vi("x", &[n])], vec![vi("y", &[n])], inits)
}
