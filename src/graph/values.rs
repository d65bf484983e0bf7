//! Values by id: every value name of a graph numbered once, with who produces and who reads it.
//!
//! The interpreter (slots, lifetimes, epilogue chains), fusion regions, Q/DQ tracing, plan
//! checks, rankings, folding and export ask the same questions — which node writes this value,
//! which nodes read it, is it a graph output — so one [`ValueIndex`] answers them for a graph,
//! built on first use and kept with it ([`Graph::values`]). A graph's `nodes` are a public
//! field, so the kept index is checked against the nodes on every use (names compared exactly,
//! no allocation) and rebuilt when they changed: a stale index is never handed out.

use super::Graph;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A value of one graph: an index into its [`ValueIndex`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// The node writing a value, and at which of its outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Producer {
    pub node: usize,
    pub output: usize,
}

/// A node reading a value: at input `input`, or (None) through one of its subgraphs, which
/// refer to the value by name ([`Node::implicit_inputs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Consumer {
    pub node: usize,
    pub input: Option<usize>,
}

/// Where a value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Node(Producer),
    /// A graph input the user feeds (or a subgraph's formal parameter).
    Input,
    Initializer,
    /// Defined by nothing in this graph: for a subgraph, a value of an enclosing graph.
    Outer,
}

/// Every value of one graph by id: its name, origin, readers and whether it is a graph output;
/// per node, the ids of its inputs, outputs and implicit (subgraph) inputs. Node numbers are
/// indices into `graph.nodes`.
#[derive(Debug, Default)]
pub struct ValueIndex {
    names: Vec<Box<str>>,
    ids: HashMap<Box<str>, ValueId>,
    origin: Vec<Origin>,
    consumers: Vec<Vec<Consumer>>,
    graph_output: Vec<bool>,
    graph_outputs: Vec<ValueId>,
    graph_inputs: Vec<ValueId>,
    initializers: usize,
    /// Per node: its inputs (None for an omitted optional input, ""), its outputs (None for an
    /// omitted output) and the names its subgraphs read from this graph's scope.
    node_inputs: Vec<Vec<Option<ValueId>>>,
    node_outputs: Vec<Vec<Option<ValueId>>>,
    node_implicit: Vec<Vec<ValueId>>,
}

impl ValueIndex {
    /// Indexes `graph` (its nodes in their current order). A value written by two nodes (not
    /// valid ONNX) has the later one as producer.
    pub fn new(graph: &Graph) -> ValueIndex {
        let mut ix = ValueIndex::default();
        // Ids in a fixed order: graph inputs, node values in node order, graph outputs, then
        // initializers no node reads (sorted by name, so ids never depend on hashing).
        for v in &graph.inputs {
            let id = ix.intern(&v.name, Origin::Input);
            ix.graph_inputs.push(id);
        }
        for (j, node) in graph.nodes.iter().enumerate() {
            let implicit = node.implicit_inputs();
            let mut inputs = Vec::with_capacity(node.inputs.len());
            for (k, name) in node.inputs.iter().enumerate() {
                let id = ix.read(graph, name);
                if let Some(id) = id {
                    ix.consumers[id.index()].push(Consumer {
                        node: j,
                        input: Some(k),
                    });
                }
                inputs.push(id);
            }
            let mut implicit_ids = Vec::with_capacity(implicit.len());
            for name in &implicit {
                if let Some(id) = ix.read(graph, name) {
                    ix.consumers[id.index()].push(Consumer {
                        node: j,
                        input: None,
                    });
                    implicit_ids.push(id);
                }
            }
            let mut outputs = Vec::with_capacity(node.outputs.len());
            for (k, name) in node.outputs.iter().enumerate() {
                if name.is_empty() {
                    outputs.push(None);
                    continue;
                }
                let producer = Origin::Node(Producer { node: j, output: k });
                let id = ix.intern(name, producer);
                ix.origin[id.index()] = producer;
                outputs.push(Some(id));
            }
            ix.node_inputs.push(inputs);
            ix.node_outputs.push(outputs);
            ix.node_implicit.push(implicit_ids);
        }
        for v in &graph.outputs {
            let id = match ix.id(&v.name) {
                Some(id) => id,
                None => {
                    let origin = ix.origin_by_scope(graph, &v.name);
                    ix.intern(&v.name, origin)
                }
            };
            ix.graph_output[id.index()] = true;
            ix.graph_outputs.push(id);
        }
        let mut unread: Vec<&String> = graph
            .initializers
            .keys()
            .filter(|k| !k.is_empty() && !ix.ids.contains_key(k.as_str()))
            .collect();
        unread.sort_unstable();
        for name in unread {
            ix.intern(name, Origin::Initializer);
        }
        ix.initializers = graph.initializers.len();
        ix
    }

    /// The id of `name`, made when it is new with `origin`.
    fn intern(&mut self, name: &str, origin: Origin) -> ValueId {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = ValueId(self.names.len() as u32);
        self.names.push(name.into());
        self.ids.insert(name.into(), id);
        self.origin.push(origin);
        self.consumers.push(Vec::new());
        self.graph_output.push(false);
        id
    }

    /// The id of a value a node reads (None for ""), made on first sight: its origin is
    /// what the graph's scope says until a node turns out to write it.
    fn read(&mut self, graph: &Graph, name: &str) -> Option<ValueId> {
        if name.is_empty() {
            return None;
        }
        if let Some(&id) = self.ids.get(name) {
            return Some(id);
        }
        let origin = self.origin_by_scope(graph, name);
        Some(self.intern(name, origin))
    }

    fn origin_by_scope(&self, graph: &Graph, name: &str) -> Origin {
        if graph.inputs.iter().any(|v| v.name == name) {
            Origin::Input
        } else if graph.initializers.contains_key(name) {
            Origin::Initializer
        } else {
            // A node later in the list may still write it (an unsorted graph): its output
            // sets the origin then.
            Origin::Outer
        }
    }

    /// Whether this index still describes `graph`: the same nodes reading and writing the same
    /// names, the same graph inputs, outputs and initializer count.
    fn describes(&self, graph: &Graph) -> bool {
        let same_names = |ids: &[Option<ValueId>], names: &[String]| {
            ids.len() == names.len()
                && ids.iter().zip(names).all(|(id, name)| match id {
                    Some(id) => *self.names[id.index()] == **name,
                    None => name.is_empty(),
                })
        };
        let same_values = |ids: &[ValueId], names: &mut dyn Iterator<Item = &str>| {
            let mut ids = ids.iter();
            for name in names {
                match ids.next() {
                    Some(id) if *self.names[id.index()] == *name => {}
                    _ => return false,
                }
            }
            ids.next().is_none()
        };
        graph.nodes.len() == self.node_inputs.len()
            && graph.initializers.len() == self.initializers
            && same_values(
                &self.graph_inputs,
                &mut graph.inputs.iter().map(|v| v.name.as_str()),
            )
            && same_values(
                &self.graph_outputs,
                &mut graph.outputs.iter().map(|v| v.name.as_str()),
            )
            && graph
                .initializers
                .keys()
                .all(|k| k.is_empty() || self.ids.contains_key(k.as_str()))
            && graph.nodes.iter().enumerate().all(|(j, node)| {
                same_names(&self.node_inputs[j], &node.inputs)
                    && same_names(&self.node_outputs[j], &node.outputs)
                    && (!node.has_subgraphs()
                        || same_values(
                            &self.node_implicit[j],
                            &mut node.implicit_inputs().iter().map(|s| s.as_str()),
                        ))
            })
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Every value's id, in id order.
    pub fn ids(&self) -> impl Iterator<Item = ValueId> {
        (0..self.names.len() as u32).map(ValueId)
    }

    /// The id of a value name (None for "" and for names the graph does not mention).
    pub fn id(&self, name: &str) -> Option<ValueId> {
        self.ids.get(name).copied()
    }

    pub fn name(&self, id: ValueId) -> &str {
        &self.names[id.index()]
    }

    pub fn origin(&self, id: ValueId) -> Origin {
        self.origin[id.index()]
    }

    /// The node writing `id` (None: a graph input, an initializer or an outer value).
    pub fn producer(&self, id: ValueId) -> Option<Producer> {
        match self.origin[id.index()] {
            Origin::Node(p) => Some(p),
            _ => None,
        }
    }

    /// Whether the graph makes the value `name` itself, as a graph input or a node's output
    /// (not a weight, not a value of an enclosing graph).
    pub fn defines(&self, name: &str) -> bool {
        self.id(name)
            .is_some_and(|id| matches!(self.origin(id), Origin::Input | Origin::Node(_)))
    }

    /// The values the graph reads without defining them (as input, initializer or node
    /// output): for a subgraph, those of enclosing graphs it refers to.
    pub fn outer(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.ids().filter(|&id| self.origin(id) == Origin::Outer)
    }

    /// The node writing the value `name` (None also for a name the graph does not mention).
    pub fn producer_node(&self, name: &str) -> Option<usize> {
        self.producer(self.id(name)?).map(|p| p.node)
    }

    /// The nodes reading `id`, in node order (a node's direct inputs before its subgraphs).
    pub fn consumers(&self, id: ValueId) -> &[Consumer] {
        &self.consumers[id.index()]
    }

    pub fn is_graph_output(&self, id: ValueId) -> bool {
        self.graph_output[id.index()]
    }

    /// The graph's inputs, in order.
    pub fn graph_inputs(&self) -> &[ValueId] {
        &self.graph_inputs
    }

    /// The graph's outputs, in order.
    pub fn graph_outputs(&self) -> &[ValueId] {
        &self.graph_outputs
    }

    /// Node `node`'s inputs in order (None: an omitted optional input).
    pub fn node_inputs(&self, node: usize) -> &[Option<ValueId>] {
        &self.node_inputs[node]
    }

    /// Node `node`'s outputs in order (None: an omitted output).
    pub fn node_outputs(&self, node: usize) -> &[Option<ValueId>] {
        &self.node_outputs[node]
    }

    /// The values node `node`'s subgraphs read from this graph's scope, sorted by name.
    pub fn node_implicit_inputs(&self, node: usize) -> &[ValueId] {
        &self.node_implicit[node]
    }

    /// The nodes producing node `node`'s inputs, per input (None: a graph input, weight,
    /// outer value or omitted input).
    pub fn input_producers(&self, node: usize) -> impl Iterator<Item = Option<usize>> + '_ {
        self.node_inputs[node]
            .iter()
            .map(|id| id.and_then(|id| self.producer(id)).map(|p| p.node))
    }
}

/// A graph's kept [`ValueIndex`] ([`Graph::value_index`]). It is derived from the graph:
/// equality ignores it, a clone shares it (checked against the clone's nodes on use like the
/// original's), and `Default` keeps none.
#[derive(Default)]
pub struct ValueIndexCache(Mutex<Option<Arc<ValueIndex>>>);

impl ValueIndexCache {
    /// The index of `graph`: the kept one while it still describes the graph, else a new one.
    pub(crate) fn get(&self, graph: &Graph) -> Arc<ValueIndex> {
        let mut kept = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(ix) = kept.as_ref() {
            if ix.describes(graph) {
                return Arc::clone(ix);
            }
        }
        let ix = Arc::new(ValueIndex::new(graph));
        *kept = Some(Arc::clone(&ix));
        ix
    }

    /// Drops the kept index (the nodes were reordered or changed).
    pub(crate) fn clear(&mut self) {
        *self
            .0
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
    }
}

impl Clone for ValueIndexCache {
    fn clone(&self) -> Self {
        let kept = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        ValueIndexCache(Mutex::new(kept.clone()))
    }
}

impl std::fmt::Debug for ValueIndexCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self.0.lock().map(|k| k.is_some()).unwrap_or(false);
        f.write_str(if kept { "indexed" } else { "not indexed" })
    }
}

impl PartialEq for ValueIndexCache {
    fn eq(&self, _: &ValueIndexCache) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::{graph, node, vi};
    use crate::graph::{Attribute, Graph, ValueInfo};
    use crate::tensor::Tensor;

    fn ids(ix: &ValueIndex, names: &[&str]) -> Vec<Option<ValueId>> {
        names.iter().map(|n| ix.id(n)).collect()
    }

    /// x → a(Relu) → b(Add a, w) → y; an If whose branch reads `a` from outside; a node with
    /// an omitted optional input.
    fn sample() -> Graph {
        let branch = Graph {
            nodes: vec![node("inner", "Neg", &["a"], &["z"])],
            outputs: vec![vi("z", &[2])],
            ..Default::default()
        };
        let mut cond = node("if", "If", &["c"], &["o"]);
        cond.attrs.insert(
            "then_branch".into(),
            Attribute::Graph(Arc::new(branch.clone())),
        );
        cond.attrs
            .insert("else_branch".into(), Attribute::Graph(Arc::new(branch)));
        graph(
            vec![
                node("a", "Relu", &["x"], &["a"]),
                node("b", "Add", &["a", "w"], &["y"]),
                cond,
                node("clip", "Clip", &["a", "", "hi"], &["clipped", ""]),
            ],
            vec![vi("x", &[2]), vi("c", &[])],
            vec![vi("y", &[2]), vi("o", &[2])],
            vec![
                ("w", Tensor::from_f32(vec![2], vec![1.0, 2.0])),
                ("hi", Tensor::from_f32(vec![], vec![6.0])),
                ("unused", Tensor::from_f32(vec![], vec![0.0])),
            ],
        )
    }

    #[test]
    fn producers_consumers_and_graph_outputs() {
        let g = sample();
        let ix = ValueIndex::new(&g);
        let a = ix.id("a").unwrap();
        assert_eq!(ix.name(a), "a");
        assert_eq!(ix.producer(a), Some(Producer { node: 0, output: 0 }));
        assert_eq!(
            ix.consumers(a),
            [
                Consumer {
                    node: 1,
                    input: Some(0)
                },
                Consumer {
                    node: 2,
                    input: None
                },
                Consumer {
                    node: 3,
                    input: Some(0)
                },
            ]
        );
        assert_eq!(ix.node_implicit_inputs(2), [a]);
        assert_eq!(ix.origin(ix.id("x").unwrap()), Origin::Input);
        assert_eq!(ix.origin(ix.id("w").unwrap()), Origin::Initializer);
        assert_eq!(ix.origin(ix.id("unused").unwrap()), Origin::Initializer);
        assert!(ix.consumers(ix.id("unused").unwrap()).is_empty());
        assert!(ix.is_graph_output(ix.id("y").unwrap()));
        assert!(ix.is_graph_output(ix.id("o").unwrap()));
        assert!(!ix.is_graph_output(a));
        assert_eq!(ix.graph_outputs(), ids(&ix, &["y", "o"]).concat_ids());
        assert_eq!(ix.producer_node("y"), Some(1));
        assert_eq!(ix.producer_node("x"), None);
        assert_eq!(ix.producer_node("nothing"), None);
        assert_eq!(ix.input_producers(1).collect::<Vec<_>>(), [Some(0), None]);
    }

    #[test]
    fn omitted_inputs_and_outputs_have_no_id() {
        let g = sample();
        let ix = ValueIndex::new(&g);
        assert_eq!(ix.id(""), None);
        assert_eq!(ix.node_inputs(3), ids(&ix, &["a", "", "hi"]));
        assert_eq!(ix.node_outputs(3), [ix.id("clipped"), None]);
        // "" is no value: every name once, and no empty one.
        assert!((0..ix.len()).all(|i| !ix.names[i].is_empty()));
        let mut names: Vec<&str> = (0..ix.len()).map(|i| &*ix.names[i]).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            ["a", "c", "clipped", "hi", "o", "unused", "w", "x", "y"]
        );
    }

    #[test]
    fn a_subgraph_indexes_what_it_reads_from_outside_as_outer() {
        let g = sample();
        let Some(Attribute::Graph(branch)) = g.nodes[2].attr("then_branch") else {
            panic!("the If has a branch");
        };
        let ix = branch.values();
        let a = ix.id("a").unwrap();
        assert_eq!(ix.origin(a), Origin::Outer);
        assert_eq!(
            ix.consumers(a),
            [Consumer {
                node: 0,
                input: Some(0)
            }]
        );
        assert_eq!(ix.producer_node("z"), Some(0));
    }

    #[test]
    fn an_unsorted_graph_gets_the_later_producer() {
        let mut g = graph(
            vec![
                node("b", "Relu", &["a"], &["y"]),
                node("a", "Relu", &["x"], &["a"]),
            ],
            vec![vi("x", &[1])],
            vec![vi("y", &[1])],
            vec![],
        );
        let ix = g.values();
        assert_eq!(ix.producer_node("a"), Some(1));
        assert_eq!(
            ix.consumers(ix.id("a").unwrap()),
            [Consumer {
                node: 0,
                input: Some(0)
            }]
        );
        g.sort_topologically().unwrap();
        let sorted = g.values();
        assert_eq!(sorted.producer_node("a"), Some(0));
        assert_eq!(
            sorted.consumers(sorted.id("a").unwrap()),
            [Consumer {
                node: 1,
                input: Some(0)
            }]
        );
    }

    #[test]
    fn the_kept_index_is_rebuilt_when_the_nodes_change() {
        let mut g = sample();
        let first = g.values();
        assert!(Arc::ptr_eq(&first, &g.values()), "kept while unchanged");
        let copy = g.clone();
        assert!(Arc::ptr_eq(&first, &copy.values()), "a clone shares it");
        // Renaming an input in place, adding a node, changing outputs: each is seen.
        g.nodes[1].inputs[1] = "hi".into();
        let renamed = g.values();
        assert!(!Arc::ptr_eq(&first, &renamed));
        assert_eq!(renamed.input_producers(1).count(), 2);
        assert!(renamed.consumers(renamed.id("w").unwrap()).is_empty());
        g.nodes.push(node("n", "Neg", &["y"], &["ny"]));
        assert_eq!(g.values().producer_node("ny"), Some(4));
        g.outputs.push(vi("ny", &[2]));
        assert!(g.values().is_graph_output(g.values().id("ny").unwrap()));
        g.inputs.push(ValueInfo {
            name: "extra".into(),
            dtype: None,
            shape: None,
        });
        assert_eq!(
            g.values().origin(g.values().id("extra").unwrap()),
            Origin::Input
        );
        // The clone still has its own (unchanged) index.
        assert_eq!(copy.values().producer_node("ny"), None);
        assert_eq!(copy, copy.clone());
    }

    trait ConcatIds {
        fn concat_ids(self) -> Vec<ValueId>;
    }

    impl ConcatIds for Vec<Option<ValueId>> {
        fn concat_ids(self) -> Vec<ValueId> {
            self.into_iter().flatten().collect()
        }
    }
}
