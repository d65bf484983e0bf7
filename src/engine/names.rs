//! Mapping TensorRT layer names back to ONNX nodes.
//!
//! TensorRT names an engine layer after the network layers it runs, and the ONNX parser names
//! network layers after ONNX nodes. What the names look like (docs/verify-engine.md):
//! - one node: `conv1`; fused nodes: `conv1 + bn1 + relu1`; merged layers: `conv1 || conv2`;
//! - pointwise fusions: `PWN(relu1, add1)`, nested `PWN(PWN(a), PWN(b))`, and mixed:
//!   `conv + PWN(PWN(PWN(sig), PWN(mul)), PWN(add))`, `PWN(clip + (Unnamed Layer* 16) [Shuffle], mul)`;
//! - Myelin regions: `{ForeignNode[first...last]}`: every node from `first` to `last` in
//!   topological order;
//! - reformat (copy) layers: `Reformatting CopyNode for Input Tensor 0 to conv1`: no node of
//!   their own, noted in the report;
//! - names TensorRT derives: `[profile N]` suffixes of multi-profile engines, Myelin kernels
//!   `name_myl3_12` (with `.` written `_`), and its own layers (`(Unnamed Layer* 4) [Shuffle]`,
//!   `ONNXTRT_...`, `__myl_...`) that name no node;
//! - since TensorRT 8.6 the layer's `Metadata` lists its nodes: `[ONNX Layer: conv1]`, entries
//!   separated by `\x1e` or `\x1f`; when present it is used first.

use crate::graph::{Graph, ValueIndex};
use std::collections::HashMap;

/// What an engine layer is, as far as names tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayerRole {
    /// Runs the listed ONNX nodes (indices into `graph.nodes`).
    Nodes(Vec<usize>),
    /// A reformat/copy layer TensorRT inserted for the named layer's input or output.
    Reformat { target: String },
}

/// The result of mapping one layer name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub role: LayerRole,
    /// Parts of the name that name no ONNX node.
    pub unmapped: Vec<String>,
}

/// Looks names up in a graph.
pub struct NameIndex<'a> {
    graph: &'a Graph,
    by_name: HashMap<&'a str, usize>,
    /// The graph's values: a layer may be named by the value its node writes.
    values: std::sync::Arc<ValueIndex>,
    /// Names with `.` and `/`... kept, but `.` as `_` (Myelin's kernel names).
    by_myelin: HashMap<String, usize>,
    myl_suffix: regex::Regex,
    profile_suffix: regex::Regex,
    reformat: regex::Regex,
    metadata_entry: regex::Regex,
}

impl<'a> NameIndex<'a> {
    pub fn new(graph: &'a Graph) -> NameIndex<'a> {
        let mut by_name = HashMap::new();
        let mut by_myelin = HashMap::new();
        for (i, n) in graph.nodes.iter().enumerate() {
            by_name.entry(n.name.as_str()).or_insert(i);
            by_myelin.entry(n.name.replace('.', "_")).or_insert(i);
        }
        NameIndex {
            graph,
            by_name,
            values: graph.values(),
            by_myelin,
            myl_suffix: regex::Regex::new(r"_myl\d+_\d+$").expect("valid regex"),
            profile_suffix: regex::Regex::new(r"\s*\[profile \d+\]$").expect("valid regex"),
            reformat: regex::Regex::new(
                r"^Reformatting CopyNode for (?:Input|Output) Tensor \d+ to (.+)$",
            )
            .expect("valid regex"),
            metadata_entry: regex::Regex::new(r"\[ONNX Layer: ([^\x1e\x1f]*?)\](?:[\x1e\x1f]|$)")
                .expect("valid regex"),
        }
    }

    /// The node one atom (a name with no fusion syntax) stands for.
    pub fn resolve(&self, atom: &str) -> Option<usize> {
        let a = self.profile_suffix.replace(atom.trim(), "");
        let a = a.as_ref();
        if let Some(&i) = self.by_name.get(a) {
            return Some(i);
        }
        if let Some(i) = self.values.producer_node(a) {
            return Some(i);
        }
        let stripped = self.myl_suffix.replace(a, "");
        if stripped != a {
            if let Some(&i) = self.by_name.get(stripped.as_ref()) {
                return Some(i);
            }
            if let Some(&i) = self.by_myelin.get(stripped.as_ref()) {
                return Some(i);
            }
        }
        None
    }

    /// Maps a layer name (and its `Metadata`, when the file has one) to ONNX nodes.
    pub fn map(&self, name: &str, layer_type: Option<&str>, metadata: Option<&str>) -> Mapping {
        let name = self.profile_suffix.replace(name.trim(), "").into_owned();
        if let Some(c) = self.reformat.captures(&name) {
            return Mapping {
                role: LayerRole::Reformat {
                    target: c[1].to_string(),
                },
                unmapped: Vec::new(),
            };
        }
        if layer_type == Some("Reformat") {
            return Mapping {
                role: LayerRole::Reformat {
                    target: name.clone(),
                },
                unmapped: Vec::new(),
            };
        }
        let mut nodes = Vec::new();
        let mut unmapped = Vec::new();
        let from_metadata: Vec<String> = metadata
            .map(|m| {
                self.metadata_entry
                    .captures_iter(m)
                    .map(|c| c[1].to_string())
                    .collect()
            })
            .unwrap_or_default();
        if !from_metadata.is_empty() {
            for n in from_metadata {
                match self.resolve(&n) {
                    Some(i) => nodes.push(i),
                    None => unmapped.push(n),
                }
            }
        } else {
            self.map_expr(&name, &mut nodes, &mut unmapped);
        }
        let mut seen = std::collections::HashSet::new();
        nodes.retain(|i| seen.insert(*i));
        Mapping {
            role: LayerRole::Nodes(nodes),
            unmapped,
        }
    }

    fn map_expr(&self, expr: &str, nodes: &mut Vec<usize>, unmapped: &mut Vec<String>) {
        let expr = expr.trim();
        if let Some(i) = self.resolve(expr) {
            nodes.push(i);
            return;
        }
        // `a + b` (fused) and `a || b` (horizontally merged layers).
        let parts: Vec<&str> = split_top(expr, " || ")
            .into_iter()
            .flat_map(|p| split_top(p, " + "))
            .collect();
        if parts.len() > 1 {
            for p in parts {
                self.map_expr(p, nodes, unmapped);
            }
            return;
        }
        if let Some(inner) = expr.strip_prefix("PWN(").and_then(|s| s.strip_suffix(')')) {
            for p in split_top(inner, ",") {
                self.map_expr(p, nodes, unmapped);
            }
            return;
        }
        if let Some(inner) = expr
            .strip_prefix("{ForeignNode[")
            .and_then(|s| s.strip_suffix("]}"))
        {
            self.map_range(inner, nodes, unmapped);
            return;
        }
        unmapped.push(expr.to_string());
    }

    /// `first...last`: every node between the two in topological order. Names may contain
    /// dots, so each `...` is tried until both sides name nodes.
    fn map_range(&self, inner: &str, nodes: &mut Vec<usize>, unmapped: &mut Vec<String>) {
        let mut at = 0;
        while let Some(k) = inner[at..].find("...") {
            let split = at + k;
            let (a, b) = (&inner[..split], &inner[split + 3..]);
            if let (Some(i), Some(j)) = (self.resolve(a), self.resolve(b)) {
                let (lo, hi) = (i.min(j), i.max(j));
                nodes.extend(lo..=hi);
                return;
            }
            at = split + 1;
        }
        match self.resolve(inner) {
            Some(i) => nodes.push(i),
            None => unmapped.push(format!("{{ForeignNode[{inner}]}}")),
        }
    }

    pub fn graph(&self) -> &Graph {
        self.graph
    }
}

/// Splits on `sep` outside parentheses and brackets.
fn split_top<'s>(s: &'s str, sep: &str) -> Vec<&'s str> {
    let mut out = Vec::new();
    let (mut depth, mut start, mut i) = (0i32, 0, 0);
    let b = s.as_bytes();
    while i < b.len() {
        match b[i] {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            _ => {}
        }
        if depth == 0 && s[i..].starts_with(sep) {
            out.push(&s[start..i]);
            i += sep.len();
            start = i;
            continue;
        }
        i += 1;
    }
    out.push(&s[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Node;

    fn graph(names: &[&str]) -> Graph {
        let mut g = Graph::default();
        for (i, n) in names.iter().enumerate() {
            g.nodes.push(Node {
                name: n.to_string(),
                op_type: "Relu".into(),
                inputs: vec![format!("t{i}")],
                outputs: vec![format!("t{}", i + 1)],
                ..Default::default()
            });
        }
        g
    }

    fn nodes(m: Mapping) -> Vec<usize> {
        match m.role {
            LayerRole::Nodes(n) => n,
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn fused_pwn_myelin_reformat_and_suffixes() {
        let g = graph(&["conv1", "relu1", "/m.0/add", "/m.0/Sub", "mul", "out"]);
        let ix = NameIndex::new(&g);
        assert_eq!(nodes(ix.map("conv1 + relu1", None, None)), vec![0, 1]);
        assert_eq!(
            nodes(ix.map("PWN(PWN(relu1, /m.0/add), /m.0/Sub)", None, None)),
            vec![1, 2, 3]
        );
        assert_eq!(
            nodes(ix.map("{ForeignNode[relu1.../m.0/Sub]}", None, None)),
            vec![1, 2, 3]
        );
        // Names as TensorRT 8.6-10 print them (trtexec --verbose, --dumpProfile).
        let g2 = graph(&[
            "/m.2/conv/Conv",
            "/m.2/act/Sigmoid",
            "/m.2/act/Mul",
            "/m.2/Add",
            "/m.3/Conv",
        ]);
        let ix2 = NameIndex::new(&g2);
        assert_eq!(
            nodes(ix2.map(
                "/m.2/conv/Conv + PWN(PWN(PWN(/m.2/act/Sigmoid), PWN(/m.2/act/Mul)), PWN(/m.2/Add))",
                None,
                None
            )),
            vec![0, 1, 2, 3]
        );
        assert_eq!(
            nodes(ix2.map("/m.2/conv/Conv || /m.3/Conv", None, None)),
            vec![0, 4]
        );
        let m = ix2.map(
            "PWN(/m.2/Add + (Unnamed Layer* 16) [Shuffle], /m.2/act/Mul)",
            None,
            None,
        );
        assert_eq!(
            m.unmapped,
            vec!["(Unnamed Layer* 16) [Shuffle]".to_string()]
        );
        assert_eq!(nodes(m), vec![3, 2]);
        // A tensor name stands for its producer; Myelin kernel suffixes and profiles go.
        assert_eq!(nodes(ix.map("t5", None, None)), vec![4]);
        assert_eq!(nodes(ix.map("/m_0/add_myl3_7", None, None)), vec![2]);
        assert_eq!(nodes(ix.map("mul [profile 1]", None, None)), vec![4]);
        let r = ix.map(
            "Reformatting CopyNode for Input Tensor 0 to conv1 + relu1",
            None,
            None,
        );
        assert_eq!(
            r.role,
            LayerRole::Reformat {
                target: "conv1 + relu1".into()
            }
        );
        // Metadata wins over the name.
        let m = ix.map(
            "__myl_AddSub",
            Some("kgen"),
            Some("[ONNX Layer: /m.0/add]\u{1e}[ONNX Layer: /m.0/Sub]"),
        );
        assert_eq!(nodes(m), vec![2, 3]);
        // Names that map to nothing are reported, the rest still maps.
        let m = ix.map("conv1 + (Unnamed Layer* 3) [Shuffle]", None, None);
        assert_eq!(m.unmapped, vec!["(Unnamed Layer* 3) [Shuffle]".to_string()]);
        assert_eq!(nodes(m), vec![0]);
        let m = ix.map("{ForeignNode[nope...out]}", None, None);
        assert_eq!(m.unmapped.len(), 1);
    }
}
