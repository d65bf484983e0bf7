//! Shape and type inference over a whole graph, before anything runs.
//!
//! Every value gets a [`Fact`]: element type, shape with static or symbolic dimensions, and,
//! for small constants and what is computed from them, the value itself. Each op answers for
//! its own outputs ([`crate::ops::OpDef::infer`]); a node whose inputs are all known constants
//! is folded by running its kernel, which is how shape arithmetic (`Shape → Gather → Concat →
//! Reshape`) resolves. An op's rule rejecting its inputs is an error naming the node: the same
//! run would have failed inside the kernel.

use crate::error::{Error, Result};
use crate::graph::fact::{DimFact, Fact, ShapeFact};
use crate::graph::{Dim, Graph};
use crate::ops::{InferCtx, OpCtx, Registry};
use crate::tensor::{DType, Tensor};
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Values with at most this many elements are kept (and folded through kernels) during
/// inference; larger ones keep only their type and shape.
pub const FOLD_LIMIT: usize = 1 << 16;

/// The facts of every value of a graph.
#[derive(Clone, Debug, Default)]
pub struct GraphFacts {
    pub values: HashMap<String, Fact>,
}

impl GraphFacts {
    pub fn get(&self, name: &str) -> Option<&Fact> {
        self.values.get(name)
    }

    /// The static shape of a value, when every dimension is known.
    pub fn known_shape(&self, name: &str) -> Option<Vec<usize>> {
        self.get(name).and_then(Fact::known_shape)
    }
}

/// Input facts from the model's declarations: fixed dims static, named dims symbolic, unknown
/// dims fresh symbols; `shapes` (from `--input-shapes`) override the declared shape.
pub fn declared_input_facts(
    graph: &Graph,
    shapes: &BTreeMap<String, Vec<usize>>,
) -> BTreeMap<String, Fact> {
    let mut unknown = 0u64;
    graph
        .inputs
        .iter()
        .map(|vi| {
            let shape = match shapes.get(&vi.name) {
                Some(s) => Some(s.iter().map(|&d| DimFact::known(d)).collect()),
                None => vi.shape.as_ref().map(|dims| {
                    declared_shape(dims, &mut || {
                        unknown += 1;
                        DimFact::symbol(&format!("unk__{unknown}"))
                    })
                }),
            };
            (vi.name.clone(), Fact::new(vi.dtype, shape))
        })
        .collect()
}

/// A declared shape as facts: fixed dims static, named dims symbolic, unknown dims from
/// `unknown` (a fresh symbol each).
fn declared_shape(dims: &[Dim], unknown: &mut dyn FnMut() -> DimFact) -> ShapeFact {
    dims.iter()
        .map(|d| match d {
            Dim::Fixed(n) => DimFact::known(*n),
            Dim::Param(p) => DimFact::symbol(p),
            Dim::Unknown => unknown(),
        })
        .collect()
}

/// Infers the facts of every value of `graph` from the facts of its inputs.
pub fn infer_graph(graph: &Graph, inputs: &BTreeMap<String, Fact>) -> Result<GraphFacts> {
    let registry = Registry::global();
    let next_unknown = Cell::new(1_000_000u64);
    let mut values: HashMap<String, Fact> = HashMap::new();
    for (name, f) in inputs {
        values.insert(name.clone(), f.clone());
    }
    let init_fact = |t: &Tensor| -> Fact {
        if t.len() <= FOLD_LIMIT {
            Fact::of_tensor(Arc::new(t.clone()))
        } else {
            Fact::of_shape(t)
        }
    };
    for node in &graph.nodes {
        let opset = graph.opset_of(&node.domain);
        // Facts of the inputs: values produced earlier, initializers, graph inputs.
        let mut owned: Vec<Option<Fact>> = Vec::with_capacity(node.inputs.len());
        for name in &node.inputs {
            if name.is_empty() {
                owned.push(None);
            } else if let Some(f) = values.get(name) {
                owned.push(Some(f.clone()));
            } else if let Some(t) = graph.initializers.get(name) {
                let f = init_fact(t);
                values.insert(name.clone(), f.clone());
                owned.push(Some(f));
            } else {
                owned.push(Some(Fact::default()));
            }
        }
        let ins: Vec<Option<&Fact>> = owned.iter().map(|f| f.as_ref()).collect();
        let def = registry.def(&node.domain, &node.op_type);
        let op_err = |msg: String| Error::Op {
            node: node.name.clone(),
            op: node.op_type.clone(),
            msg,
        };
        let mut outs: Vec<Fact> = match def {
            None => Vec::new(),
            Some(def) => {
                crate::ops::attrs::parse_node(node, opset)?;
                let ruled = match def.infer {
                    Some(rule) => {
                        let ctx = InferCtx::new(node, opset, &next_unknown);
                        Some(
                            rule(&ctx, &ins)
                                .map_err(|e| op_err(format!("shape inference: {}", e.0)))?,
                        )
                    }
                    None => None,
                };
                // Fold when every input is known and the outputs are small (as far as the rule
                // can tell): large constants (ConstantOfShape of a big shape) stay facts.
                // A node with subgraphs also reads what its bodies read: never folded.
                let all_known =
                    !node.has_subgraphs() && ins.iter().flatten().all(|f| f.value.is_some());
                let small = ruled.as_ref().is_none_or(|outs| {
                    outs.iter().all(|f| {
                        f.shape.as_ref().is_none_or(|s| {
                            s.iter()
                                .try_fold(1usize, |acc, d| {
                                    d.as_known().map(|n| acc.saturating_mul(n))
                                })
                                .is_none_or(|n| n <= FOLD_LIMIT)
                        })
                    })
                });
                if all_known && small {
                    let args: Vec<Option<&Tensor>> = ins
                        .iter()
                        .map(|f| f.and_then(|f| f.value.as_deref()))
                        .collect();
                    let ctx = OpCtx::new(node, opset);
                    let tensors = (def.kernel)(&ctx, &args).map_err(|e| op_err(e.0))?;
                    tensors
                        .into_iter()
                        .map(|t| {
                            if t.len() <= FOLD_LIMIT {
                                Fact::of_tensor(Arc::new(t))
                            } else {
                                Fact::of_shape(&t)
                            }
                        })
                        .collect()
                } else {
                    ruled.unwrap_or_default()
                }
            }
        };
        outs.resize_with(node.outputs.len(), Fact::default);
        for (name, mut f) in node.outputs.iter().zip(outs) {
            if name.is_empty() {
                continue;
            }
            complete(&mut f, graph, name);
            values.insert(name.clone(), f);
        }
    }
    Ok(GraphFacts { values })
}

/// Fills what a rule left open from the model's declarations, and makes a value of dims that
/// are all static.
fn complete(f: &mut Fact, graph: &Graph, name: &str) {
    let declared = graph
        .value_info
        .get(name)
        .or_else(|| graph.outputs.iter().find(|v| v.name == name));
    if let Some(vi) = declared {
        if f.dtype.is_none() {
            f.dtype = vi.dtype;
        }
        if f.shape.is_none() {
            f.shape = vi.shape.as_ref().map(|dims| {
                // Each unknown dim its own symbol: two unknown dims are not equal.
                let mut k = 0;
                declared_shape(dims, &mut || {
                    k += 1;
                    DimFact::symbol(&format!("{name}?{k}"))
                })
            });
        }
    }
    if f.value.is_none() {
        if let Some(dims) = &f.dims {
            if let Some(v) = dims
                .iter()
                .map(DimFact::as_known)
                .collect::<Option<Vec<_>>>()
            {
                let dtype = f.dtype.unwrap_or(DType::I64);
                let scalar = f.rank() == Some(0);
                let shape = if scalar { vec![] } else { vec![v.len()] };
                let v: Vec<i64> = v.into_iter().map(|x| x as i64).collect();
                if let Some(t) = int_tensor(shape, v, dtype) {
                    f.value = Some(Arc::new(t));
                }
            }
        }
    }
}

/// Per node: the element type of its first output as the model declares it (inferred from
/// the declared inputs; None where unknown). A node whose output is float16 or bfloat16
/// computes in that type whatever precision plan runs it (a strongly typed 16-bit model).
pub fn declared_output_types(graph: &Graph) -> Vec<Option<DType>> {
    let facts = infer_graph(graph, &declared_input_facts(graph, &BTreeMap::new())).ok();
    graph
        .nodes
        .iter()
        .map(|n| {
            let out = n.outputs.first()?;
            facts.as_ref()?.get(out)?.dtype
        })
        .collect()
}

/// The facts of concrete feeds: types and static shapes (not values: a feed changes from run
/// to run, so nothing computed from it is folded).
pub fn feed_facts(feeds: &BTreeMap<String, Tensor>) -> BTreeMap<String, Fact> {
    feeds
        .iter()
        .map(|(n, t)| (n.clone(), Fact::of_shape(t)))
        .collect()
}

/// An integer tensor of `dtype` (int64 or int32: the types shapes are held in).
fn int_tensor(shape: Vec<usize>, v: Vec<i64>, dtype: DType) -> Option<Tensor> {
    match dtype {
        DType::I64 => Some(Tensor::from_i64(shape, v)),
        DType::I32 => Tensor::new(
            shape,
            crate::tensor::TensorData::I32(v.into_iter().map(|x| x as i32).collect()),
        )
        .ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::{graph, node, vi};
    use crate::graph::{Attribute, ValueInfo};

    fn sym_input(name: &str, dims: &[&str]) -> ValueInfo {
        ValueInfo {
            name: name.into(),
            dtype: Some(DType::F32),
            shape: Some(
                dims.iter()
                    .map(|d| match d.parse::<usize>() {
                        Ok(n) => Dim::Fixed(n),
                        Err(_) => Dim::Param(d.to_string()),
                    })
                    .collect(),
            ),
        }
    }

    /// `Shape → Gather → Unsqueeze → Concat → Reshape` (how exporters flatten a dynamic batch)
    /// keeps the symbolic batch; with `--input-shapes` every dim is static.
    #[test]
    fn symbolic_shape_arithmetic_resolves_reshape() {
        let mut gather = node("g", "Gather", &["s", "zero"], &["b"]);
        gather.attrs.insert("axis".into(), Attribute::Int(0));
        let mut concat = node("c", "Concat", &["b1", "minus1"], &["target"]);
        concat.attrs.insert("axis".into(), Attribute::Int(0));
        let g = graph(
            vec![
                node("shape", "Shape", &["x"], &["s"]),
                gather,
                node("u", "Unsqueeze", &["b", "axes0"], &["b1"]),
                concat,
                node("r", "Reshape", &["x", "target"], &["y"]),
                node("t", "Transpose", &["y"], &["z"]),
            ],
            vec![sym_input("x", &["batch", "3", "4", "5"])],
            vec![vi("z", &[])],
            vec![
                ("zero", Tensor::scalar_i64(0)),
                ("axes0", Tensor::from_i64(vec![1], vec![0])),
                ("minus1", Tensor::from_i64(vec![1], vec![-1])),
            ],
        );
        let facts = infer_graph(&g, &declared_input_facts(&g, &BTreeMap::new())).unwrap();
        assert_eq!(facts.get("y").unwrap().shape_string(), "[batch, 60]");
        assert_eq!(facts.get("z").unwrap().shape_string(), "[60, batch]");
        let mut shapes = BTreeMap::new();
        shapes.insert("x".to_string(), vec![2, 3, 4, 5]);
        let facts = infer_graph(&g, &declared_input_facts(&g, &shapes)).unwrap();
        assert_eq!(facts.known_shape("z"), Some(vec![60, 2]));
        // Shape arithmetic folded to a constant once every dim is static.
        assert_eq!(facts.get("target").unwrap().int_values(), Some(vec![2, -1]));
    }

    #[test]
    fn contradicting_shapes_name_the_node() {
        let g = graph(
            vec![node("mm", "MatMul", &["x", "w"], &["y"])],
            vec![sym_input("x", &["batch", "8"])],
            vec![vi("y", &[])],
            vec![("w", Tensor::from_f32(vec![7, 2], vec![0.0; 14]))],
        );
        let e = infer_graph(&g, &declared_input_facts(&g, &BTreeMap::new()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("'mm'") && e.contains("inner dimensions"), "{e}");
    }

    #[test]
    fn broadcasting_symbolic_against_static_dims() {
        let g = graph(
            vec![
                node("a", "Add", &["x", "y"], &["s"]),
                node("e", "Equal", &["s", "x"], &["m"]),
            ],
            vec![
                sym_input("x", &["batch", "1", "4"]),
                sym_input("y", &["3", "seq", "1"]),
            ],
            vec![vi("m", &[])],
            vec![],
        );
        let facts = infer_graph(&g, &declared_input_facts(&g, &BTreeMap::new())).unwrap();
        let s = facts.get("s").unwrap();
        assert_eq!(s.shape_string(), "[3, seq, 4]");
        let m = facts.get("m").unwrap();
        assert_eq!(m.dtype, Some(DType::Bool));
        let bad = graph(
            vec![node("a", "Add", &["x", "y"], &["s"])],
            vec![vi("x", &[2, 3]), vi("y", &[4, 3])],
            vec![vi("s", &[])],
            vec![],
        );
        let e = infer_graph(&bad, &declared_input_facts(&bad, &BTreeMap::new()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'a'") && e.contains("cannot be broadcast"),
            "{e}"
        );
    }

    /// A feed of a different shape than the model was checked for is checked again, and a
    /// contradiction is an error before any kernel runs.
    #[test]
    fn run_checks_node_shapes_before_kernels() {
        let g = graph(
            vec![node("mm", "MatMul", &["x", "w"], &["y"])],
            vec![ValueInfo {
                name: "x".into(),
                dtype: Some(DType::F32),
                shape: None,
            }],
            vec![vi("y", &[])],
            vec![("w", Tensor::from_f32(vec![4, 2], vec![1.0; 8]))],
        );
        let interp = crate::Interpreter::new(&g).unwrap();
        let mut feeds = crate::Feeds::new();
        feeds.insert("x".into(), Tensor::from_f32(vec![3, 4], vec![1.0; 12]));
        assert_eq!(interp.run(&feeds).unwrap().outputs[0].1.shape(), &[3, 2]);
        feeds.insert("x".into(), Tensor::from_f32(vec![3, 5], vec![1.0; 15]));
        let e = interp.run(&feeds).unwrap_err().to_string();
        assert!(e.contains("'mm'") && e.contains("shape inference"), "{e}");
    }

    /// An op mixprec has no rule for takes the model's declared shape; its unknown dims stay
    /// distinct, so a later op does not take them for equal.
    #[test]
    fn declared_unknown_dims_are_distinct() {
        let mut g = graph(
            vec![node("n", "NoSuchOp", &["x"], &["y"])],
            vec![vi("x", &[2])],
            vec![vi("y", &[])],
            vec![],
        );
        g.value_info.insert(
            "y".into(),
            ValueInfo {
                name: "y".into(),
                dtype: Some(DType::F32),
                shape: Some(vec![Dim::Unknown, Dim::Unknown]),
            },
        );
        let facts = infer_graph(&g, &declared_input_facts(&g, &BTreeMap::new())).unwrap();
        let s = facts.get("y").unwrap().shape.clone().unwrap();
        assert_ne!(s[0], s[1]);
    }
}
