//! `mixprec inspect`: the layer table (op, output shapes, FLOPs, parameters) and what the
//! weights cost in each precision.
//!
//! Shapes come from a real run on generated inputs (the interpreter is the shape inference:
//! it cannot disagree with what `run` does), so FLOPs are exact for the given input shapes.

use crate::exec::RunResult;
use crate::graph::{Graph, Node};
use crate::ops::is_data_movement;
use serde::Serialize;
use std::collections::HashMap;

/// One row of the layer table.
#[derive(Clone, Debug, Serialize)]
pub struct LayerInfo {
    pub index: usize,
    pub name: String,
    pub op: String,
    pub output_shapes: Vec<Vec<usize>>,
    pub flops: u64,
    pub params: u64,
    /// False for pure data movement (Reshape, Transpose...): never a precision candidate.
    pub computes: bool,
}

/// Everything `inspect` reports.
#[derive(Clone, Debug, Serialize)]
pub struct ModelSummary {
    pub layers: Vec<LayerInfo>,
    pub total_flops: u64,
    pub total_params: u64,
    /// Bytes of float weights stored as float32 / float16 / int8.
    pub weight_bytes_fp32: u64,
    pub weight_bytes_fp16: u64,
    pub weight_bytes_int8: u64,
}

/// Builds the layer table from a run that kept intermediates.
pub fn summarize(graph: &Graph, run: &RunResult) -> ModelSummary {
    let shape_of = |name: &str| -> Option<Vec<usize>> {
        run.intermediates
            .get(name)
            .or_else(|| run.output(name))
            .or_else(|| graph.initializers.get(name))
            .map(|t| t.shape().to_vec())
    };
    let mut counted: HashMap<&str, ()> = HashMap::new();
    let mut layers = Vec::with_capacity(graph.nodes.len());
    let mut weight_elems = 0u64;
    for (index, node) in graph.nodes.iter().enumerate() {
        let in_shapes: Vec<Option<Vec<usize>>> = node
            .inputs
            .iter()
            .map(|n| if n.is_empty() { None } else { shape_of(n) })
            .collect();
        let out_shapes: Vec<Vec<usize>> = node
            .outputs
            .iter()
            .map(|n| shape_of(n).unwrap_or_default())
            .collect();
        let mut params = 0u64;
        for inp in &node.inputs {
            if let Some(t) = graph.initializers.get(inp) {
                if t.dtype().is_float() {
                    params += t.len() as u64;
                    if counted.insert(inp.as_str(), ()).is_none() {
                        weight_elems += t.len() as u64;
                    }
                }
            }
        }
        layers.push(LayerInfo {
            index,
            name: node.name.clone(),
            op: node.op_type.clone(),
            flops: node_flops(node, &in_shapes, &out_shapes),
            output_shapes: out_shapes,
            params,
            computes: !is_data_movement(&node.op_type),
        });
    }
    ModelSummary {
        total_flops: layers.iter().map(|l| l.flops).sum(),
        total_params: layers.iter().map(|l| l.params).sum(),
        weight_bytes_fp32: weight_elems * 4,
        weight_bytes_fp16: weight_elems * 2,
        weight_bytes_int8: weight_elems,
        layers,
    }
}

fn elems(s: &[usize]) -> u64 {
    s.iter().product::<usize>() as u64
}

/// Floating-point operations of one node (a multiply-add counts 2), from its shapes.
pub fn node_flops(node: &Node, ins: &[Option<Vec<usize>>], outs: &[Vec<usize>]) -> u64 {
    let out = outs.first().map(|s| elems(s)).unwrap_or(0);
    let in0 = ins.first().cloned().flatten().unwrap_or_default();
    let in1 = ins.get(1).cloned().flatten().unwrap_or_default();
    let has_bias = ins.get(2).map(|s| s.is_some()).unwrap_or(false);
    match node.op_type.as_str() {
        "Conv" => {
            // Each output element: Cin/group * prod(kernel) multiply-adds.
            let per_out: u64 = in1.iter().skip(1).map(|&d| d as u64).product();
            2 * out * per_out + if has_bias { out } else { 0 }
        }
        "ConvTranspose" => {
            // Weight is [Cin, Cout/group, k...]: each input element feeds Cout/group * k outputs.
            let cout_per_group: u64 = in1.get(1).copied().unwrap_or(0) as u64;
            let kernel: u64 = in1.iter().skip(2).map(|&d| d as u64).product();
            2 * elems(&in0) * cout_per_group * kernel
        }
        "MatMul" => 2 * out * in0.last().copied().unwrap_or(0) as u64,
        "Gemm" => {
            let k = if node.attr_int_or("transA", 0) != 0 {
                in0.first()
            } else {
                in0.last()
            };
            2 * out * k.copied().unwrap_or(0) as u64 + if has_bias { out } else { 0 }
        }
        "Einsum" => einsum_flops(node, ins),
        "MaxPool" | "AveragePool" | "LpPool" => {
            let k: u64 = node
                .attr_ints("kernel_shape")
                .map(|k| k.iter().map(|&d| d.max(1) as u64).product())
                .unwrap_or(1);
            out * k
        }
        "BatchNormalization" => 2 * out,
        "LayerNormalization" | "InstanceNormalization" | "GroupNormalization" => 8 * out,
        "Softmax" | "LogSoftmax" => 5 * out,
        "GlobalAveragePool" | "GlobalMaxPool" | "ReduceMean" | "ReduceSum" | "ReduceMax"
        | "ReduceMin" | "ReduceProd" | "ReduceL1" | "ReduceL2" | "ReduceSumSquare"
        | "ReduceLogSum" | "ReduceLogSumExp" | "ArgMax" | "ArgMin" | "TopK" => elems(&in0),
        "Gelu" | "Erf" | "Sigmoid" | "Tanh" | "HardSwish" | "Mish" | "Softplus" => 4 * out,
        op if is_data_movement(op) => 0,
        _ => out,
    }
}

fn einsum_flops(node: &Node, ins: &[Option<Vec<usize>>]) -> u64 {
    let Some(eq) = node.attr_str("equation") else {
        return 0;
    };
    let lhs = eq.split("->").next().unwrap_or("");
    let mut sizes: HashMap<char, u64> = HashMap::new();
    for (term, shape) in lhs.split(',').zip(ins) {
        let Some(shape) = shape else { continue };
        let letters: Vec<char> = term.trim().chars().filter(|c| c.is_alphabetic()).collect();
        // Letters bind to the trailing dims when an ellipsis takes the leading ones.
        let off = shape.len().saturating_sub(letters.len());
        for (i, c) in letters.iter().enumerate() {
            if let Some(&d) = shape.get(off + i) {
                sizes.insert(*c, d as u64);
            }
        }
    }
    2 * sizes.values().product::<u64>()
}

/// Formats a FLOP or byte count with an SI suffix (`1.23 G`).
pub fn si(x: u64) -> String {
    let x = x as f64;
    for (div, suffix) in [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")] {
        if x >= div {
            return format!("{:.2} {suffix}", x / div);
        }
    }
    format!("{x:.0} ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn node(op: &str, attrs: BTreeMap<String, crate::graph::Attribute>) -> Node {
        Node {
            name: "n".into(),
            op_type: op.into(),
            domain: String::new(),
            inputs: vec![],
            outputs: vec![],
            attrs,
        }
    }

    #[test]
    fn conv_and_matmul_flops() {
        // 3x3 conv 64->64 on 56x56: 2 * 64*56*56 * 64*9
        let f = node_flops(
            &node("Conv", BTreeMap::new()),
            &[Some(vec![1, 64, 56, 56]), Some(vec![64, 64, 3, 3])],
            &[vec![1, 64, 56, 56]],
        );
        assert_eq!(f, 2 * 64 * 56 * 56 * 64 * 9);
        let f = node_flops(
            &node("MatMul", BTreeMap::new()),
            &[Some(vec![2, 8, 16]), Some(vec![16, 4])],
            &[vec![2, 8, 4]],
        );
        assert_eq!(f, 2 * 2 * 8 * 4 * 16);
        assert_eq!(
            node_flops(&node("Reshape", BTreeMap::new()), &[], &[vec![10]]),
            0
        );
    }

    #[test]
    fn einsum_counts_every_index() {
        let mut a = BTreeMap::new();
        a.insert(
            "equation".into(),
            crate::graph::Attribute::String("bij,bjk->bik".into()),
        );
        let f = einsum_flops(
            &node("Einsum", a),
            &[Some(vec![2, 3, 4]), Some(vec![2, 4, 5])],
        );
        assert_eq!(f, 2 * 2 * 3 * 4 * 5);
    }
}
