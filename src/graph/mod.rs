//! The graph IR: nodes in topological order, initializers, graph inputs and outputs.
//!
//! It is independent of protobuf: `onnx/` builds it from a file, and everything downstream
//! (interpreter, search, export) works on it.

pub mod fact;
#[cfg(test)]
pub(crate) mod testing;
pub mod values;

pub use values::{Consumer, Origin, Producer, ValueId, ValueIndex};

use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

/// A node attribute.
#[derive(Clone, Debug, PartialEq)]
pub enum Attribute {
    Float(f32),
    Int(i64),
    String(String),
    Tensor(Tensor),
    Floats(Vec<f32>),
    Ints(Vec<i64>),
    Strings(Vec<String>),
    /// A subgraph (the body of If, Loop, Scan): sorted, named, its outer-scope references
    /// checked at load (see [`Graph::outer_refs`]).
    Graph(Arc<Graph>),
    Graphs(Vec<Arc<Graph>>),
    /// A tensors or type attribute: present but not interpreted.
    Unsupported(&'static str),
}

/// One layer: an ONNX node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Node {
    /// Stable id, unique in the model: nodes are numbered in protobuf order, depth first (a
    /// node before the nodes of its subgraphs). Sorting and folding never change it. Nodes
    /// not loaded from a file (tests, hand-made graphs) have id 0.
    pub id: usize,
    /// Position in its graph's protobuf node list (`GraphProto.node`); None when the node was
    /// not loaded from a file. Export maps layers back to protobuf nodes through it.
    pub pos: Option<usize>,
    pub name: String,
    pub op_type: String,
    pub domain: String,
    /// Input value names; an empty string is an omitted optional input.
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub attrs: BTreeMap<String, Attribute>,
    /// The attributes parsed into the op's typed value (`ops::attrs`), once: at load, or on
    /// first use for a node built in code.
    pub parsed: ParsedAttrs,
}

/// A node's attributes as its op's typed value, filled once (at load or on first use). It is
/// derived from `attrs`: equality ignores it, and a node whose `attrs` change after it was used
/// must get a fresh `ParsedAttrs::default()`.
#[derive(Clone, Default)]
pub struct ParsedAttrs(std::sync::OnceLock<Arc<dyn std::any::Any + Send + Sync>>);

impl ParsedAttrs {
    pub fn get(&self) -> Option<&(dyn std::any::Any + Send + Sync)> {
        self.0.get().map(|a| &**a)
    }

    /// Stores the parsed value; a value stored first (by another thread) wins.
    pub fn set(&self, value: Arc<dyn std::any::Any + Send + Sync>) {
        let _ = self.0.set(value);
    }
}

impl std::fmt::Debug for ParsedAttrs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "parsed"
        } else {
            "unparsed"
        })
    }
}

impl PartialEq for ParsedAttrs {
    fn eq(&self, _: &ParsedAttrs) -> bool {
        true
    }
}

impl Node {
    pub fn attr(&self, name: &str) -> Option<&Attribute> {
        self.attrs.get(name)
    }

    pub fn attr_int(&self, name: &str) -> Option<i64> {
        match self.attrs.get(name) {
            Some(Attribute::Int(i)) => Some(*i),
            _ => None,
        }
    }

    pub fn attr_int_or(&self, name: &str, default: i64) -> i64 {
        self.attr_int(name).unwrap_or(default)
    }

    pub fn attr_float(&self, name: &str) -> Option<f32> {
        match self.attrs.get(name) {
            Some(Attribute::Float(f)) => Some(*f),
            _ => None,
        }
    }

    pub fn attr_float_or(&self, name: &str, default: f32) -> f32 {
        self.attr_float(name).unwrap_or(default)
    }

    pub fn attr_ints(&self, name: &str) -> Option<&[i64]> {
        match self.attrs.get(name) {
            Some(Attribute::Ints(v)) => Some(v),
            _ => None,
        }
    }

    pub fn attr_floats(&self, name: &str) -> Option<&[f32]> {
        match self.attrs.get(name) {
            Some(Attribute::Floats(v)) => Some(v),
            _ => None,
        }
    }

    pub fn attr_str(&self, name: &str) -> Option<&str> {
        match self.attrs.get(name) {
            Some(Attribute::String(s)) => Some(s),
            _ => None,
        }
    }

    pub fn attr_strings(&self, name: &str) -> Option<&[String]> {
        match self.attrs.get(name) {
            Some(Attribute::Strings(v)) => Some(v),
            _ => None,
        }
    }

    pub fn attr_tensor(&self, name: &str) -> Option<&Tensor> {
        match self.attrs.get(name) {
            Some(Attribute::Tensor(t)) => Some(t),
            _ => None,
        }
    }

    pub fn attr_graph(&self, name: &str) -> Option<&Graph> {
        match self.attrs.get(name) {
            Some(Attribute::Graph(g)) => Some(g),
            _ => None,
        }
    }

    /// The name used in messages and reports: the node name, or `op_type#index` when unnamed.
    pub fn display_name(&self) -> &str {
        &self.name
    }

    /// The node's subgraph attributes (attribute name, graph), in attribute-name order; a
    /// `graphs` attribute yields one entry per graph under the same name.
    pub fn subgraphs(&self) -> impl Iterator<Item = (&str, &Graph)> {
        self.attrs.iter().flat_map(|(k, a)| {
            let gs: Vec<&Graph> = match a {
                Attribute::Graph(g) => vec![&**g],
                Attribute::Graphs(gs) => gs.iter().map(|g| &**g).collect(),
                _ => Vec::new(),
            };
            gs.into_iter().map(move |g| (k.as_str(), g))
        })
    }

    pub fn has_subgraphs(&self) -> bool {
        self.subgraphs().next().is_some()
    }

    /// Values of the enclosing graph that the node's subgraphs read by name (ONNX outer-scope
    /// references): dependencies of the node as real as its inputs. Sorted, each once.
    pub fn implicit_inputs(&self) -> Vec<String> {
        let mut out = BTreeSet::new();
        for (_, g) in self.subgraphs() {
            out.extend(g.outer_refs());
        }
        out.into_iter().collect()
    }
}

/// One dimension of a declared shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dim {
    Fixed(usize),
    /// A named dynamic dimension (`batch`).
    Param(String),
    /// Unknown (`-1` or no value).
    Unknown,
}

impl std::fmt::Display for Dim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dim::Fixed(d) => write!(f, "{d}"),
            Dim::Param(p) => write!(f, "{p}"),
            Dim::Unknown => write!(f, "?"),
        }
    }
}

/// Declared type and shape of a graph input, output or intermediate value.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueInfo {
    pub name: String,
    pub dtype: Option<DType>,
    /// None when the model declares no shape at all.
    pub shape: Option<Vec<Dim>>,
}

impl ValueInfo {
    /// The declared shape as text: `[batch, 3, 224, 224]`.
    pub fn shape_string(&self) -> String {
        match &self.shape {
            None => "unknown".to_string(),
            Some(dims) => format!(
                "[{}]",
                dims.iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// The weight (initializer or folded value) that enclosing graphs (outermost first) hold under
/// `name`, looking from the innermost out; None where the innermost graph that knows the name
/// computes it or takes it as an input.
pub fn enclosing_weight<'g>(enclosing: &[&'g Graph], name: &str) -> Option<&'g Tensor> {
    for g in enclosing.iter().rev() {
        if let Some(t) = g.weight(name) {
            return Some(t);
        }
        if g.values().defines(name) {
            return None;
        }
    }
    None
}

/// A model's main graph, or a subgraph (then `inputs` are its formal parameters, in order).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    pub name: String,
    /// Nodes in topological order.
    pub nodes: Vec<Node>,
    pub initializers: HashMap<String, Tensor>,
    /// Initializers the file also lists as graph inputs: ONNX (IR ≥ 4) lets a runtime feed
    /// another value for them, so they are not constants (see [`Graph::constant_initializer`]).
    pub overridable: HashSet<String>,
    /// Inputs the user feeds (graph inputs that have no initializer).
    pub inputs: Vec<ValueInfo>,
    pub outputs: Vec<ValueInfo>,
    pub value_info: HashMap<String, ValueInfo>,
    /// Values of weight-only nodes, computed once at load (`fold::fold_weights`): weights like
    /// the initializers. Their nodes stay in `nodes` (see [`Graph::is_folded`]).
    pub folded: HashMap<String, Tensor>,
    /// Opset version per domain ("" is the default ONNX domain).
    pub opsets: BTreeMap<String, i64>,
    pub ir_version: i64,
    /// The [`ValueIndex`] of the nodes as they are, kept between uses ([`Graph::values`]).
    pub value_index: values::ValueIndexCache,
}

impl Graph {
    /// Every value of this graph by id, with its producer and readers: built on first use and
    /// kept until the nodes, inputs or outputs change (then rebuilt on the next call).
    pub fn values(&self) -> Arc<ValueIndex> {
        self.value_index.get(self)
    }

    /// Opset of the default ONNX domain.
    pub fn opset(&self) -> i64 {
        self.opset_of("")
    }

    pub fn opset_of(&self, domain: &str) -> i64 {
        let d = if domain == "ai.onnx" { "" } else { domain };
        self.opsets.get(d).copied().unwrap_or(0)
    }

    /// A weight: an initializer or a folded value.
    pub fn weight(&self, name: &str) -> Option<&Tensor> {
        self.initializers
            .get(name)
            .or_else(|| self.folded.get(name))
    }

    /// A constant of the file: an initializer of this graph that no graph input overrides, or
    /// the value of a `Constant` node (ONNX defines it as an initializer written as a node;
    /// TensorRT's parser imports both as weights). The export stores it converted to a
    /// layer's precision, as TensorRT's builder converts weights. None for overridable
    /// initializers and values computed from weights (both converted at run time, through a
    /// Cast).
    pub fn constant_initializer(&self, name: &str) -> Option<&Tensor> {
        if let Some(t) = self.initializers.get(name) {
            return (!self.overridable.contains(name)).then_some(t);
        }
        let t = self.folded.get(name)?;
        let producer = self.values().producer_node(name)?;
        let node = &self.nodes[producer];
        (node.op_type == "Constant" && (node.domain.is_empty() || node.domain == "ai.onnx"))
            .then_some(t)
    }

    /// Whether `node` only computes folded weights: it runs untouched under every precision
    /// plan (no layer of its own) and is never a search candidate.
    pub fn is_folded(&self, node: &Node) -> bool {
        !self.folded.is_empty()
            && node.outputs.iter().any(|o| !o.is_empty())
            && node
                .outputs
                .iter()
                .all(|o| o.is_empty() || self.folded.contains_key(o))
    }

    pub fn input(&self, name: &str) -> Option<&ValueInfo> {
        self.inputs.iter().find(|v| v.name == name)
    }

    /// Names this graph reads without defining them (as input, initializer or node output):
    /// for a subgraph, the values of enclosing graphs it refers to — its nodes' inputs, its
    /// outputs, and what its own subgraphs read from outside. Sorted, each once.
    pub fn outer_refs(&self) -> Vec<String> {
        let values = self.values();
        let mut out: Vec<String> = values.outer().map(|id| values.name(id).into()).collect();
        out.sort_unstable();
        out
    }

    /// Puts the nodes in topological order, keeping the file's order wherever it is already
    /// valid (so layer indices match what Netron and Polygraphy show for sorted files).
    /// A node with subgraphs depends on what they read from this graph as on its inputs.
    pub fn sort_topologically(&mut self) -> Result<()> {
        self.sort_topologically_in(&HashSet::new())
    }

    /// [`sort_topologically`](Self::sort_topologically) for a subgraph: `outer` are the values
    /// of enclosing graphs, available from the start.
    pub fn sort_topologically_in(&mut self, outer: &HashSet<String>) -> Result<()> {
        let mut available: HashSet<&str> = self.initializers.keys().map(|s| s.as_str()).collect();
        for i in &self.inputs {
            available.insert(&i.name);
        }
        available.extend(outer.iter().map(|s| s.as_str()));
        let values = self.values();
        let n = self.nodes.len();
        let mut indeg = vec![0usize; n];
        let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, node) in self.nodes.iter().enumerate() {
            let mut seen = HashSet::new();
            let reads = values.node_inputs(i).iter().flatten();
            for &id in reads.chain(values.node_implicit_inputs(i)) {
                let inp = values.name(id);
                if available.contains(inp) {
                    continue;
                }
                match values.producer(id) {
                    Some(p) => {
                        if seen.insert(p.node) {
                            indeg[i] += 1;
                            users[p.node].push(i);
                        }
                    }
                    None => {
                        let who = if node.name.is_empty() {
                            format!("node #{i}")
                        } else {
                            format!("node '{}'", node.name)
                        };
                        let scope = if outer.is_empty() {
                            ""
                        } else {
                            " (nor any enclosing graph)"
                        };
                        return Err(Error::Invalid(format!(
                            "{who} ({}) reads '{inp}', which no node, initializer or graph input{scope} produces",
                            node.op_type
                        )));
                    }
                }
            }
        }
        // Kahn's algorithm with a min-heap on the original index: stable and deterministic.
        let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> = (0..n)
            .filter(|&i| indeg[i] == 0)
            .map(std::cmp::Reverse)
            .collect();
        let mut order = Vec::with_capacity(n);
        while let Some(std::cmp::Reverse(i)) = ready.pop() {
            order.push(i);
            for &u in &users[i] {
                indeg[u] -= 1;
                if indeg[u] == 0 {
                    ready.push(std::cmp::Reverse(u));
                }
            }
        }
        if order.len() != n {
            let stuck: Vec<&str> = (0..n)
                .filter(|&i| indeg[i] > 0)
                .take(5)
                .map(|i| self.nodes[i].name.as_str())
                .collect();
            return Err(Error::Invalid(format!(
                "the graph has a cycle (involving nodes {stuck:?})"
            )));
        }
        drop(values);
        if order.iter().enumerate().all(|(at, &i)| at == i) {
            return Ok(()); // Already sorted: the kept value index stays valid.
        }
        self.value_index.clear();
        let mut old: Vec<Option<Node>> = std::mem::take(&mut self.nodes)
            .into_iter()
            .map(Some)
            .collect();
        self.nodes = order
            .into_iter()
            .map(|i| old[i].take().expect("each index once"))
            .collect();
        Ok(())
    }

    /// Gives every unnamed node a unique name (`Conv_3`) so reports and `--layer-precisions`
    /// can always address it.
    pub fn name_unnamed_nodes(&mut self) {
        let mut used: HashSet<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        for (i, node) in self.nodes.iter_mut().enumerate() {
            if node.name.is_empty() {
                let mut name = format!("{}_{}", node.op_type, i);
                let mut k = 0;
                while used.contains(&name) {
                    k += 1;
                    name = format!("{}_{}_{}", node.op_type, i, k);
                }
                used.insert(name.clone());
                node.name = name;
            }
        }
    }
}

/// Checks a tensor against a declared value: dtype, rank and every fixed dimension.
pub fn check_against(vi: &ValueInfo, t: &Tensor) -> Result<()> {
    if let Some(dt) = vi.dtype {
        if dt != t.dtype() {
            return Err(Error::input(
                &vi.name,
                format!("expected dtype {dt}, got {}", t.dtype()),
            ));
        }
    }
    if let Some(dims) = &vi.shape {
        let bad = dims.len() != t.rank()
            || dims
                .iter()
                .zip(t.shape())
                .any(|(d, &s)| matches!(d, Dim::Fixed(f) if *f != s));
        if bad {
            return Err(Error::input(
                &vi.name,
                format!(
                    "expected shape {}, got {}",
                    vi.shape_string(),
                    crate::tensor::fmt_shape(t.shape())
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, inputs: &[&str], outputs: &[&str]) -> Node {
        Node {
            name: name.into(),
            op_type: "Relu".into(),
            domain: String::new(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            attrs: BTreeMap::new(),
            ..Default::default()
        }
    }

    fn graph(nodes: Vec<Node>) -> Graph {
        Graph {
            nodes,
            inputs: vec![ValueInfo {
                name: "x".into(),
                dtype: Some(DType::F32),
                shape: None,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn sorts_unsorted_nodes() {
        let mut g = graph(vec![
            node("b", &["a_out"], &["b_out"]),
            node("a", &["x"], &["a_out"]),
        ]);
        g.sort_topologically().unwrap();
        let names: Vec<_> = g.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn keeps_sorted_order() {
        let mut g = graph(vec![
            node("a", &["x"], &["a_out"]),
            node("c", &["x"], &["c_out"]),
            node("b", &["a_out", "c_out"], &["b_out"]),
        ]);
        g.sort_topologically().unwrap();
        let names: Vec<_> = g.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["a", "c", "b"]);
    }

    #[test]
    fn reports_cycles_and_dangling_inputs() {
        let mut g = graph(vec![
            node("a", &["b_out"], &["a_out"]),
            node("b", &["a_out"], &["b_out"]),
        ]);
        assert!(g
            .sort_topologically()
            .unwrap_err()
            .to_string()
            .contains("cycle"));
        let mut g = graph(vec![node("a", &["nope"], &["a_out"])]);
        let e = g.sort_topologically().unwrap_err().to_string();
        assert!(e.contains("'nope'"), "{e}");
    }

    #[test]
    fn outer_references_order_the_nodes_that_read_them() {
        // A subgraph reading `a_out` (and, nested one level deeper, `x`) makes its node a
        // reader of `a_out`: sorted after `a` although the file lists it first.
        let inner = Graph {
            nodes: vec![node("deep", &["x"], &["deep_out"])],
            outputs: vec![ValueInfo {
                name: "deep_out".into(),
                dtype: None,
                shape: None,
            }],
            ..Default::default()
        };
        let mut mid = node("mid", &["a_out"], &["mid_out"]);
        mid.attrs
            .insert("g".into(), Attribute::Graph(Arc::new(inner)));
        let body = Graph {
            nodes: vec![mid],
            outputs: vec![ValueInfo {
                name: "mid_out".into(),
                dtype: None,
                shape: None,
            }],
            ..Default::default()
        };
        assert_eq!(body.outer_refs(), ["a_out", "x"]);
        let mut cf = node("cf", &[], &["cf_out"]);
        cf.attrs
            .insert("body".into(), Attribute::Graph(Arc::new(body)));
        assert_eq!(cf.implicit_inputs(), ["a_out", "x"]);
        let mut g = graph(vec![cf, node("a", &["x"], &["a_out"])]);
        g.sort_topologically().unwrap();
        let names: Vec<_> = g.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["a", "cf"]);
        assert!(g.outer_refs().is_empty());
    }

    #[test]
    fn names_unnamed_nodes_uniquely() {
        let mut g = graph(vec![
            node("", &["x"], &["a"]),
            node("Relu_1", &["a"], &["b"]),
            node("", &["b"], &["c"]),
        ]);
        g.name_unnamed_nodes();
        assert_eq!(g.nodes[0].name, "Relu_0");
        assert_eq!(g.nodes[2].name, "Relu_2");
    }
}
