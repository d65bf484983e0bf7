//! Typed op attributes, parsed and validated once per node.
//!
//! An op with attributes registers a parser ([`super::OpDef::parse`]) that turns a node's
//! attributes into the op's own struct (`ConvAttrs`, `ReduceAttrs`, ...; each lives in its
//! family's file): enums for string attributes, lengths checked against each other, values
//! in range. The loader parses every node of a model (subgraph bodies included) through
//! [`parse_graph`], so a bad attribute is a load error naming node, op and attribute; the
//! interpreter and the shape inference parse again any node not parsed yet (a node built in
//! code), and [`of`], which kernels and shape rules read through `ctx.attrs::<T>()`, parses
//! on first use: no kernel runs on unparsed attributes.
//!
//! Type rules: an attribute of the wrong type (an int where a float list is required) is an
//! error. An empty list is accepted for any list type (files that omit the attribute type
//! cannot tell an empty int list from an empty float list). Attributes an op does not define
//! are ignored, unlike ONNX's checker: files from old exporters carry attributes that later
//! schemas dropped (`is_test`, `consumed_inputs`, `spatial`) and that change nothing mixprec
//! computes.

use super::OpError;
use crate::error::Error;
use crate::graph::{Attribute, Graph, Node};
use crate::tensor::{DType, Tensor};
use std::any::Any;
use std::sync::Arc;

/// An op's parsed attributes, type-erased for storage on the node.
pub type Parsed = Arc<dyn Any + Send + Sync>;

/// An op's attribute parser: the node and the opset of its domain.
pub type ParseFn = fn(&Node, i64) -> Result<Parsed, AttrError>;

/// A rejected attribute: which one, and why.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("attribute '{attr}': {msg}")]
pub struct AttrError {
    pub attr: String,
    pub msg: String,
}

impl AttrError {
    pub fn new(attr: &str, msg: impl Into<String>) -> AttrError {
        AttrError {
            attr: attr.to_string(),
            msg: msg.into(),
        }
    }
}

impl From<AttrError> for OpError {
    fn from(e: AttrError) -> OpError {
        OpError(e.to_string())
    }
}

/// Wraps a parser's typed result for storage (`.parse(|n, o| boxed(MyAttrs::parse(n, o)))`).
pub fn boxed<T: Any + Send + Sync>(r: Result<T, AttrError>) -> Result<Parsed, AttrError> {
    r.map(|v| Arc::new(v) as Parsed)
}

/// What an attribute holds, in words.
fn kind(a: &Attribute) -> &'static str {
    match a {
        Attribute::Float(_) => "a float",
        Attribute::Int(_) => "an int",
        Attribute::String(_) => "a string",
        Attribute::Tensor(_) => "a tensor",
        Attribute::Floats(_) => "a list of floats",
        Attribute::Ints(_) => "a list of ints",
        Attribute::Strings(_) => "a list of strings",
        Attribute::Graph(_) => "a graph",
        Attribute::Graphs(_) => "a list of graphs",
        Attribute::Unsupported(k) => k,
    }
}

fn is_empty_list(a: &Attribute) -> bool {
    match a {
        Attribute::Floats(v) => v.is_empty(),
        Attribute::Ints(v) => v.is_empty(),
        Attribute::Strings(v) => v.is_empty(),
        Attribute::Graphs(v) => v.is_empty(),
        _ => false,
    }
}

/// Reads a node's attributes with their types checked.
pub struct Attrs<'a> {
    node: &'a Node,
}

impl<'a> Attrs<'a> {
    pub fn new(node: &'a Node) -> Attrs<'a> {
        Attrs { node }
    }

    fn wrong(name: &str, expected: &str, got: &Attribute) -> AttrError {
        AttrError::new(name, format!("expected {expected}, got {}", kind(got)))
    }

    pub fn has(&self, name: &str) -> bool {
        self.node.attrs.contains_key(name)
    }

    pub fn int(&self, name: &str) -> Result<Option<i64>, AttrError> {
        match self.node.attr(name) {
            None => Ok(None),
            Some(Attribute::Int(i)) => Ok(Some(*i)),
            Some(a) => Err(Self::wrong(name, "an int", a)),
        }
    }

    pub fn int_or(&self, name: &str, default: i64) -> Result<i64, AttrError> {
        Ok(self.int(name)?.unwrap_or(default))
    }

    /// An int flag: 0 is false, anything else true.
    pub fn flag(&self, name: &str, default: bool) -> Result<bool, AttrError> {
        Ok(self.int(name)?.map_or(default, |v| v != 0))
    }

    pub fn float(&self, name: &str) -> Result<Option<f32>, AttrError> {
        match self.node.attr(name) {
            None => Ok(None),
            Some(Attribute::Float(f)) => Ok(Some(*f)),
            Some(a) => Err(Self::wrong(name, "a float", a)),
        }
    }

    pub fn float_or(&self, name: &str, default: f32) -> Result<f32, AttrError> {
        Ok(self.float(name)?.unwrap_or(default))
    }

    pub fn ints(&self, name: &str) -> Result<Option<Vec<i64>>, AttrError> {
        match self.node.attr(name) {
            None => Ok(None),
            Some(Attribute::Ints(v)) => Ok(Some(v.clone())),
            Some(a) if is_empty_list(a) => Ok(Some(Vec::new())),
            Some(a) => Err(Self::wrong(name, "a list of ints", a)),
        }
    }

    /// A list of ints that must each be >= `min`.
    pub fn ints_at_least(&self, name: &str, min: i64) -> Result<Option<Vec<i64>>, AttrError> {
        let v = self.ints(name)?;
        if let Some(v) = &v {
            if v.iter().any(|&x| x < min) {
                return Err(AttrError::new(
                    name,
                    format!("every value must be >= {min}, got {v:?}"),
                ));
            }
        }
        Ok(v)
    }

    pub fn floats(&self, name: &str) -> Result<Option<Vec<f32>>, AttrError> {
        match self.node.attr(name) {
            None => Ok(None),
            Some(Attribute::Floats(v)) => Ok(Some(v.clone())),
            Some(a) if is_empty_list(a) => Ok(Some(Vec::new())),
            Some(a) => Err(Self::wrong(name, "a list of floats", a)),
        }
    }

    pub fn string(&self, name: &str) -> Result<Option<&'a str>, AttrError> {
        match self.node.attr(name) {
            None => Ok(None),
            Some(Attribute::String(s)) => Ok(Some(s)),
            Some(a) => Err(Self::wrong(name, "a string", a)),
        }
    }

    pub fn strings(&self, name: &str) -> Result<Option<&'a [String]>, AttrError> {
        match self.node.attr(name) {
            None => Ok(None),
            Some(Attribute::Strings(v)) => Ok(Some(v)),
            Some(a) if is_empty_list(a) => Ok(Some(&[])),
            Some(a) => Err(Self::wrong(name, "a list of strings", a)),
        }
    }

    pub fn tensor(&self, name: &str) -> Result<Option<&'a Tensor>, AttrError> {
        match self.node.attr(name) {
            None => Ok(None),
            Some(Attribute::Tensor(t)) => Ok(Some(t)),
            Some(a) => Err(Self::wrong(name, "a tensor", a)),
        }
    }

    /// A graph attribute (If/Loop/Scan bodies): present with the right type, when required.
    pub fn graph(&self, name: &str, required: bool) -> Result<(), AttrError> {
        match self.node.attr(name) {
            None if required => Err(AttrError::new(name, "missing (the op needs it)")),
            None | Some(Attribute::Graph(_)) => Ok(()),
            Some(a) => Err(Self::wrong(name, "a graph", a)),
        }
    }

    /// A string attribute that names one of `choices`; `default` when absent.
    pub fn choice<E: Copy>(
        &self,
        name: &str,
        default: E,
        choices: &[(&str, E)],
    ) -> Result<E, AttrError> {
        let Some(s) = self.string(name)? else {
            return Ok(default);
        };
        choices
            .iter()
            .find(|(k, _)| *k == s)
            .map(|(_, v)| *v)
            .ok_or_else(|| {
                let names: Vec<String> = choices.iter().map(|(k, _)| format!("'{k}'")).collect();
                AttrError::new(name, format!("'{s}' is not one of {}", names.join(", ")))
            })
    }

    /// An ONNX element-type code that mixprec knows.
    pub fn dtype(&self, name: &str) -> Result<Option<DType>, AttrError> {
        match self.int(name)? {
            None => Ok(None),
            Some(code) => i32::try_from(code)
                .ok()
                .and_then(DType::from_onnx)
                .map(Some)
                .ok_or_else(|| {
                    AttrError::new(name, format!("{code} is not an element type mixprec knows"))
                }),
        }
    }

    /// A required int.
    pub fn required_int(&self, name: &str) -> Result<i64, AttrError> {
        self.int(name)?
            .ok_or_else(|| AttrError::new(name, "missing (the op needs it)"))
    }
}

/// The node's typed attributes as `T`, parsed on first use (the loader has parsed them
/// already for a loaded model).
pub fn of<T: Any>(node: &Node, opset: i64) -> Result<&T, OpError> {
    if node.parsed.get().is_none() {
        node.parsed.set(parse_fresh(node, opset)?);
    }
    node.parsed
        .get()
        .and_then(|p| p.downcast_ref::<T>())
        .ok_or_else(|| {
            OpError(format!(
                "internal: the attributes of {} are not a {}",
                node.op_type,
                std::any::type_name::<T>()
            ))
        })
}

/// The typed attributes of a node whose op parses them the same at every opset, for callers
/// that know no opset (FLOPs, weight channel axes); None when they are bad.
pub fn opset_free<T: Any>(node: &Node) -> Option<&T> {
    of::<T>(node, 0).ok()
}

fn parse_fresh(node: &Node, opset: i64) -> Result<Parsed, AttrError> {
    match super::Registry::global()
        .def(&node.domain, &node.op_type)
        .and_then(|d| d.parse)
    {
        Some(parse) => parse(node, opset),
        None => Err(AttrError::new(
            "",
            format!("internal: op {} has no attribute parser", node.op_type),
        )),
    }
}

/// Parses the node's attributes when its op has a parser and they are not parsed yet.
pub fn parse_node(node: &Node, opset: i64) -> Result<(), Error> {
    if node.parsed.get().is_some() {
        return Ok(());
    }
    let Some(parse) = super::Registry::global()
        .def(&node.domain, &node.op_type)
        .and_then(|d| d.parse)
    else {
        return Ok(());
    };
    let parsed = parse(node, opset).map_err(|e| Error::Attr {
        node: node.name.clone(),
        op: node.op_type.clone(),
        attr: e.attr,
        msg: e.msg,
    })?;
    node.parsed.set(parsed);
    Ok(())
}

/// Parses the attributes of every node of `graph` and of its subgraphs (at load): the first
/// bad attribute is an error naming node (by path inside a subgraph), op and attribute.
pub fn parse_graph(graph: &Graph) -> Result<(), Error> {
    for node in &graph.nodes {
        parse_node(node, graph.opset_of(&node.domain))?;
        for (attr, g) in node.subgraphs() {
            parse_graph(g).map_err(|e| e.in_subgraph(&node.name, attr))?;
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod testing {
    use crate::graph::{Attribute, Graph};

    /// A node of `op` with `attrs`, in a graph at `opset`, parsed as the loader does; the
    /// load error's message when it is rejected.
    pub fn load_error(op: &str, attrs: &[(&str, Attribute)], opset: i64) -> Option<String> {
        let mut n = crate::graph::testing::node("bad", op, &[], &[]);
        n.attrs = attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        let mut g = Graph {
            nodes: vec![n],
            ..Graph::default()
        };
        g.opsets.insert(String::new(), opset);
        super::parse_graph(&g).err().map(|e| e.to_string())
    }

    /// Asserts that `op` with `attrs` is rejected at load naming the attribute, with a
    /// message containing `what`.
    pub fn assert_rejected(op: &str, attrs: &[(&str, Attribute)], attr: &str, what: &str) {
        assert_rejected_at(op, attrs, 21, attr, what)
    }

    /// [`assert_rejected`] at `opset`.
    pub fn assert_rejected_at(
        op: &str,
        attrs: &[(&str, Attribute)],
        opset: i64,
        attr: &str,
        what: &str,
    ) {
        let e =
            load_error(op, attrs, opset).unwrap_or_else(|| panic!("{op} {attrs:?} was accepted"));
        let head = format!("node 'bad' ({op}): attribute '{attr}': ");
        assert!(e.starts_with(&head), "{e}");
        assert!(e.contains(what), "{e}");
    }
}

#[cfg(test)]
mod tests {
    use super::testing::load_error;
    use crate::graph::Attribute;

    #[test]
    fn wrong_types_are_named() {
        let e = load_error("Conv", &[("pads", Attribute::Int(3))], 17).unwrap();
        assert_eq!(
            e,
            "node 'bad' (Conv): attribute 'pads': expected a list of ints, got an int"
        );
        assert!(load_error("Conv", &[("pads", Attribute::Floats(vec![]))], 17).is_none());
        assert!(load_error("Conv", &[("is_test", Attribute::Int(1))], 17).is_none());
    }

    fn graph(nodes: Vec<crate::graph::Node>) -> crate::graph::Graph {
        let mut g = crate::graph::Graph {
            nodes,
            ..Default::default()
        };
        g.opsets.insert(String::new(), 17);
        g
    }

    fn bad_conv() -> crate::graph::Node {
        let mut conv = crate::graph::testing::node("conv", "Conv", &["x", "w"], &["y"]);
        conv.attrs.insert("group".into(), Attribute::Int(0));
        conv
    }

    #[test]
    fn a_bad_attribute_in_a_subgraph_is_named_by_its_path() {
        use std::sync::Arc;
        let mut iff = crate::graph::testing::node("if0", "If", &["c"], &["y"]);
        iff.attrs.insert(
            "then_branch".into(),
            Attribute::Graph(Arc::new(graph(vec![bad_conv()]))),
        );
        iff.attrs.insert(
            "else_branch".into(),
            Attribute::Graph(Arc::new(graph(vec![]))),
        );
        let e = super::parse_graph(&graph(vec![iff])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "node 'if0/then_branch/conv' (Conv): attribute 'group': must be >= 1, got 0"
        );
        let mut lone_if = crate::graph::testing::node("if1", "If", &["c"], &["y"]);
        lone_if
            .attrs
            .insert("then_branch".into(), Attribute::Int(1));
        let e = super::parse_graph(&graph(vec![lone_if])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "node 'if1' (If): attribute 'then_branch': expected a graph, got an int"
        );
    }

    /// Graphs built in code are parsed by the interpreter and the inference; a kernel called
    /// on its own parses on first use.
    #[test]
    fn every_path_parses_before_a_kernel_runs() {
        let g = graph(vec![bad_conv()]);
        let e = crate::exec::Interpreter::new(&g).err().expect("rejected");
        assert!(matches!(e, crate::error::Error::Attr { .. }), "{e}");
        let e = crate::infer::infer_graph(&g, &Default::default()).expect_err("rejected");
        assert!(matches!(e, crate::error::Error::Attr { .. }), "{e}");

        let mut ok = crate::graph::testing::node("g", "Gemm", &[], &[]);
        ok.attrs.insert("transB".into(), Attribute::Int(1));
        assert!(ok.parsed.get().is_none());
        let ctx = crate::ops::OpCtx::new(&ok, 17);
        assert!(
            ctx.attrs::<crate::ops::matmul::GemmAttrs>()
                .unwrap()
                .trans_b
        );
        assert!(ok.parsed.get().is_some(), "parsed once, kept on the node");
        let wrong = ctx.attrs::<crate::ops::conv::ConvAttrs>().unwrap_err();
        assert!(wrong.0.contains("internal"), "{wrong}");
    }
}
