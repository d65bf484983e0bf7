//! Layers that play the same role in repeated blocks: answers that read as rules, and a
//! search over roles (`--group roles`).
//!
//! Exporters name a node by the module path that made it: `/model/layers.12/self_attn/q_proj/
//! MatMul` (PyTorch, Optimum), `/model/layers.5/input_layernorm/SkipLayerNorm` (ONNX Runtime
//! GenAI's builder), `/encoder/layer.2/attention/self/MatMul_1` (BERT), `/encoder/block.4/
//! layer.0/...` (T5), `/blocks.7/attn/...` (ViT), `model/block_3/conv2d/Conv2D` (tf2onnx). A
//! *block index* is an integer inside a scope segment of that path (never in the last segment,
//! the node's own name, where exporters put per-scope counters such as `MatMul_1`, or global
//! ones such as `Conv_123`) that varies across names otherwise identical. Layers whose names
//! differ only in it, with the same op and the same output types and shapes (as far as shape
//! inference knows them), form a *role*: [`roles`]. A layer without such a partner is a role
//! of its own.
//!
//! [`rules`] turns an answer into one line per role and set of blocks —
//! `input_layernorm/{Pow,ReduceMean,Add,Sqrt} in /model/layers 2–29` — each with an anchored
//! regular expression that names exactly its layers, checked against every node of the graph
//! (`--layer-precisions 're:REGEX:float32'`, ModelOpt's `--nodes_to_exclude REGEX`).
//! [`phased`] searches over roles first, then inside the roles that are needed.

pub mod phased;

use crate::graph::Graph;
use crate::infer::GraphFacts;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

pub use phased::{search_as_grouped, search_by_roles};

/// How the search treats candidate layers (`--group`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Grouping {
    /// Every candidate layer on its own (the search as it always was).
    #[default]
    None,
    /// Each role one candidate first, then the layers inside the roles that are needed
    /// ([`phased::search_by_roles`]).
    Roles,
}

impl Grouping {
    pub fn name(self) -> &'static str {
        match self {
            Grouping::None => "none",
            Grouping::Roles => "roles",
        }
    }

    pub fn parse(s: &str) -> crate::error::Result<Grouping> {
        match s {
            "none" => Ok(Grouping::None),
            "roles" => Ok(Grouping::Roles),
            _ => Err(crate::error::Error::Invalid(format!(
                "--group '{s}': expected roles or none"
            ))),
        }
    }
}

/// Where a role's block index sits in its layers' names: a name is `prefix`, the index in
/// decimal, then `suffix`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Template {
    pub prefix: String,
    pub suffix: String,
}

impl Template {
    /// The scope the blocks live in: the prefix without its trailing separator
    /// (`/model/layers.` → `/model/layers`).
    pub fn scope(&self) -> &str {
        self.prefix.trim_end_matches(['.', '_', '-'])
    }

    /// What the layer does inside its block: the suffix without its leading `/`
    /// (`/input_layernorm/Pow` → `input_layernorm/Pow`).
    pub fn role(&self) -> &str {
        self.suffix.strip_prefix('/').unwrap_or(&self.suffix)
    }

    /// The suffix up to its last `/` (the scope of the layer inside the block) and the last
    /// segment (the node's own name).
    fn parent_and_leaf(&self) -> (&str, &str) {
        match self.suffix.rfind('/') {
            Some(k) => (&self.suffix[..=k], &self.suffix[k + 1..]),
            None => ("", &self.suffix),
        }
    }
}

/// One role: a layer in each of several blocks, or a layer of its own.
#[derive(Clone, Debug, PartialEq)]
pub struct RoleGroup {
    /// The names' template; None for a layer of its own.
    pub template: Option<Template>,
    pub op: String,
    /// Node indices, ascending (topological order).
    pub layers: Vec<usize>,
    /// The block index of each layer (same order); empty for a layer of its own.
    pub blocks: Vec<u64>,
}

/// A set of layers partitioned into roles.
#[derive(Clone, Debug, Default)]
pub struct Roles {
    /// In topological order of their first layer.
    pub groups: Vec<RoleGroup>,
    /// Node index → position in `groups`.
    group_of: HashMap<usize, usize>,
}

impl Roles {
    /// The role of `layer`, if it is one of the grouped layers.
    pub fn group_of(&self, layer: usize) -> Option<&RoleGroup> {
        self.group_of.get(&layer).map(|&g| &self.groups[g])
    }

    /// Roles of more than one layer.
    pub fn repeated(&self) -> usize {
        self.groups.iter().filter(|g| g.layers.len() > 1).count()
    }

    /// Each role's layers, in the order of `groups`.
    pub fn layer_sets(&self) -> Vec<Vec<usize>> {
        self.groups.iter().map(|g| g.layers.clone()).collect()
    }
}

/// The block-index candidates of a name: the byte ranges of the decimal numbers inside its
/// scope segments (everything before the last `/`). A number with a leading zero (`05`) or of
/// more than 9 digits is not an index: its decimal spelling would not give the name back.
fn index_positions(name: &str) -> Vec<(usize, usize, u64)> {
    let Some(scope_end) = name.rfind('/') else {
        return Vec::new();
    };
    let bytes = name.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i < scope_end {
        if !bytes[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < scope_end && bytes[i].is_ascii_digit() {
            i += 1;
        }
        let digits = &name[start..i];
        if digits.len() <= 9 && (digits == "0" || !digits.starts_with('0')) {
            if let Ok(v) = digits.parse::<u64>() {
                found.push((start, i, v));
            }
        }
    }
    found
}

/// What the graph knows of a node's outputs: element type and shape per output, unknown
/// dimensions as `?` (symbolic ones too: blocks share them, and a fresh symbol per block
/// would keep equal blocks apart).
fn output_signature(graph: &Graph, facts: Option<&GraphFacts>, node: usize) -> String {
    let Some(facts) = facts else {
        return String::new();
    };
    let mut sig = String::new();
    for out in &graph.nodes[node].outputs {
        match facts.get(out) {
            Some(f) => {
                sig.push_str(f.dtype.map_or("?", |d| d.name()));
                match &f.shape {
                    Some(dims) => {
                        sig.push('[');
                        for d in dims {
                            match d.as_known() {
                                Some(n) => sig.push_str(&n.to_string()),
                                None => sig.push('?'),
                            }
                            sig.push(',');
                        }
                        sig.push(']');
                    }
                    None => sig.push_str("[*]"),
                }
            }
            None => sig.push('?'),
        }
        sig.push(';');
    }
    sig
}

/// The facts shape inference gives from the model's declared inputs; None where it cannot
/// (roles are then confirmed by op type alone).
pub fn shape_facts(graph: &Graph) -> Option<GraphFacts> {
    let inputs = crate::infer::declared_input_facts(graph, &BTreeMap::new());
    crate::infer::infer_graph(graph, &inputs).ok()
}

/// Partitions `layers` (node indices) into roles. A name may hold several numbers that vary
/// (`/encoder/block.4/layer.0/...`: the block and the sub-layer); each layer joins the largest
/// role it can (ties: the first such layer in the graph, then the outermost number), so the
/// index that repeats most is taken as the block index.
pub fn roles(graph: &Graph, facts: Option<&GraphFacts>, layers: &[usize]) -> Roles {
    let mut layers: Vec<usize> = layers.to_vec();
    layers.sort_unstable();
    layers.dedup();
    type Key = (Template, String, String);
    let mut candidates: HashMap<Key, Vec<(usize, u64)>> = HashMap::new();
    for &l in &layers {
        let Some(node) = graph.nodes.get(l) else {
            continue;
        };
        let positions = index_positions(&node.name);
        if positions.is_empty() {
            continue;
        }
        let op = format!("{}::{}", node.domain, node.op_type);
        let sig = output_signature(graph, facts, l);
        for (start, end, value) in positions {
            let template = Template {
                prefix: node.name[..start].to_string(),
                suffix: node.name[end..].to_string(),
            };
            candidates
                .entry((template, op.clone(), sig.clone()))
                .or_default()
                .push((l, value));
        }
    }
    let mut keyed: Vec<(Key, Vec<(usize, u64)>)> = candidates
        .into_iter()
        .filter(|(_, members)| members.len() > 1)
        .collect();
    keyed.sort_by(|(ka, a), (kb, b)| {
        b.len()
            .cmp(&a.len())
            .then(a[0].0.cmp(&b[0].0))
            .then(ka.0.prefix.len().cmp(&kb.0.prefix.len()))
            .then(ka.cmp(kb))
    });
    let mut assigned: HashSet<usize> = HashSet::new();
    let mut groups: Vec<RoleGroup> = Vec::new();
    for ((template, _, _), members) in keyed {
        let free: Vec<(usize, u64)> = members
            .into_iter()
            .filter(|(l, _)| !assigned.contains(l))
            .collect();
        let distinct: BTreeSet<u64> = free.iter().map(|&(_, b)| b).collect();
        if distinct.len() < 2 {
            continue;
        }
        assigned.extend(free.iter().map(|&(l, _)| l));
        groups.push(RoleGroup {
            template: Some(template),
            op: graph.nodes[free[0].0].op_type.clone(),
            layers: free.iter().map(|&(l, _)| l).collect(),
            blocks: free.iter().map(|&(_, b)| b).collect(),
        });
    }
    for &l in &layers {
        if l < graph.nodes.len() && !assigned.contains(&l) {
            groups.push(RoleGroup {
                template: None,
                op: graph.nodes[l].op_type.clone(),
                layers: vec![l],
                blocks: Vec::new(),
            });
        }
    }
    groups.sort_by_key(|g| g.layers[0]);
    let group_of = groups
        .iter()
        .enumerate()
        .flat_map(|(k, g)| g.layers.iter().map(move |&l| (l, k)))
        .collect();
    Roles { groups, group_of }
}

/// One line of an answer: a role (or several that share a scope and the same blocks) in some
/// blocks, or a layer of its own.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rule {
    /// What the layers do in each block, the roles' last segments in braces when several
    /// share the rest (`input_layernorm/{Pow,ReduceMean,Add,Sqrt}`); for a layer of its own,
    /// its name.
    pub role: String,
    /// Where the blocks live (`/model/layers`); empty for a layer of its own.
    pub scope: String,
    /// The blocks (ascending); empty for a layer of its own.
    pub block_indices: Vec<u64>,
    /// The blocks as ranges (`2–29`, `2, 5, 7–9`).
    pub blocks: String,
    /// The layers' op types, in the order of `role`'s braces.
    pub ops: Vec<String>,
    /// The layers' names, in topological order.
    pub layers: Vec<String>,
    /// Their node indices (same order).
    pub indices: Vec<usize>,
    /// An anchored regular expression that matches exactly these layers' names among the
    /// graph's nodes (Rust's `regex` and Python's `re` read it alike): `--layer-precisions
    /// 're:REGEX:float32'`, ModelOpt's `--nodes_to_exclude REGEX`.
    pub regex: String,
}

impl Rule {
    /// The rule in words: `input_layernorm/{Pow,ReduceMean,Add,Sqrt} in /model/layers 2–29`,
    /// or a layer's name.
    pub fn describe(&self) -> String {
        if self.scope.is_empty() && self.block_indices.is_empty() {
            self.role.clone()
        } else {
            format!("{} in {} {}", self.role, self.scope, self.blocks)
        }
    }

    /// Whether the rule stands for more than one layer.
    pub fn is_group(&self) -> bool {
        self.layers.len() > 1
    }
}

/// The rules of an answer: `marked` (node indices) split by `roles`, roles with the same
/// scope, the same path inside the block up to the node's own name, and the same blocks
/// merged into one rule. Layers outside `roles` are rules of their own. Rules are in
/// topological order of their first layer.
pub fn rules(graph: &Graph, roles: &Roles, marked: &[usize]) -> Vec<Rule> {
    let mut marked: Vec<usize> = marked
        .iter()
        .copied()
        .filter(|&l| l < graph.nodes.len())
        .collect();
    marked.sort_unstable();
    marked.dedup();
    // (prefix, parent, blocks) → the roles' last segments.
    type MergeKey = (String, String, Vec<u64>);
    let mut merged: Vec<(MergeKey, Vec<Leaf>)> = Vec::new();
    let mut singles: Vec<usize> = Vec::new();
    let mut done: HashSet<usize> = HashSet::new();
    for &l in &marked {
        let Some(group) = roles.group_of(l) else {
            singles.push(l);
            continue;
        };
        let Some(template) = &group.template else {
            singles.push(l);
            continue;
        };
        if !done.insert(group.layers[0]) {
            continue;
        }
        let mut members: Vec<(usize, u64)> = group
            .layers
            .iter()
            .zip(&group.blocks)
            .filter(|(m, _)| marked.binary_search(m).is_ok())
            .map(|(&m, &b)| (m, b))
            .collect();
        members.sort_unstable();
        let mut blocks: Vec<u64> = members.iter().map(|&(_, b)| b).collect();
        blocks.sort_unstable();
        blocks.dedup();
        let (parent, leaf) = template.parent_and_leaf();
        let key = (template.prefix.clone(), parent.to_string(), blocks);
        let entry = Leaf {
            name: leaf.to_string(),
            op: group.op.clone(),
            layers: members.iter().map(|&(m, _)| m).collect(),
        };
        match merged.iter_mut().find(|(k, _)| *k == key) {
            Some((_, leaves)) => leaves.push(entry),
            None => merged.push((key, vec![entry])),
        }
    }
    let mut rules: Vec<Rule> = merged
        .into_iter()
        .map(|((prefix, parent, blocks), leaves)| {
            block_rule(graph, &prefix, &parent, blocks, leaves)
        })
        .collect();
    rules.extend(singles.into_iter().map(|l| single_rule(graph, l)));
    rules.sort_by_key(|r| r.indices.first().copied().unwrap_or(usize::MAX));
    rules
}

/// The rules of an answer over a search's candidates: [`roles`] of `candidates` (confirmed by
/// the shapes inference gives), then [`rules`] of `marked`.
pub fn answer_rules(graph: &Graph, candidates: &[usize], marked: &[usize]) -> Vec<Rule> {
    let facts = shape_facts(graph);
    let mut layers = candidates.to_vec();
    // An answer holds candidates only; should it not, its other layers still get a rule.
    layers.extend_from_slice(marked);
    let roles = roles(graph, facts.as_ref(), &layers);
    rules(graph, &roles, marked)
}

fn single_rule(graph: &Graph, l: usize) -> Rule {
    let node = &graph.nodes[l];
    Rule {
        role: node.name.clone(),
        scope: String::new(),
        block_indices: Vec::new(),
        blocks: String::new(),
        ops: vec![node.op_type.clone()],
        layers: vec![node.name.clone()],
        indices: vec![l],
        regex: checked_regex(graph, format!("^{}$", regex::escape(&node.name)), &[l]),
    }
}

/// One role of a rule: the last segment of its names, its op and the answer's layers of it.
struct Leaf {
    name: String,
    op: String,
    layers: Vec<usize>,
}

fn block_rule(
    graph: &Graph,
    prefix: &str,
    parent: &str,
    blocks: Vec<u64>,
    mut leaves: Vec<Leaf>,
) -> Rule {
    leaves.sort_by_key(|leaf| leaf.layers[0]);
    let mut names: Vec<&str> = Vec::new();
    for leaf in &leaves {
        if !names.contains(&leaf.name.as_str()) {
            names.push(&leaf.name);
        }
    }
    let leaf_text = if names.len() == 1 {
        names[0].to_string()
    } else {
        format!("{{{}}}", names.join(","))
    };
    let leaf_regex = if names.len() == 1 {
        regex::escape(names[0])
    } else {
        let alternatives: Vec<String> = names.iter().map(|n| regex::escape(n)).collect();
        format!("(?:{})", alternatives.join("|"))
    };
    let index_regex = match blocks.as_slice() {
        [one] => one.to_string(),
        _ => format!("(?:{})", index_set_regex(&blocks)),
    };
    let mut indices: Vec<usize> = leaves.iter().flat_map(|l| l.layers.clone()).collect();
    indices.sort_unstable();
    let template = Template {
        prefix: prefix.to_string(),
        suffix: format!("{parent}{leaf_text}"),
    };
    let regex = format!(
        "^{}{}{}{}$",
        regex::escape(prefix),
        index_regex,
        regex::escape(parent),
        leaf_regex
    );
    Rule {
        role: template.role().to_string(),
        scope: template.scope().to_string(),
        blocks: ranges(&blocks),
        block_indices: blocks,
        ops: leaves.iter().map(|l| l.op.clone()).collect(),
        layers: indices
            .iter()
            .map(|&l| graph.nodes[l].name.clone())
            .collect(),
        regex: checked_regex(graph, regex, &indices),
        indices,
    }
}

/// `regex` when it matches exactly the names of `layers` among the graph's nodes; else (a
/// node elsewhere with one of these names, or one the pattern catches besides) the names
/// themselves as an anchored alternation.
fn checked_regex(graph: &Graph, regex: String, layers: &[usize]) -> String {
    let wanted: HashSet<usize> = layers.iter().copied().collect();
    let named: HashSet<&str> = layers
        .iter()
        .map(|&l| graph.nodes[l].name.as_str())
        .collect();
    // Every layer matches; no other node does, unless it shares a layer's name (no pattern
    // can tell those apart).
    let exact = |re: &regex::Regex| {
        graph.nodes.iter().enumerate().all(|(i, n)| {
            let hit = re.is_match(&n.name);
            if wanted.contains(&i) {
                hit
            } else {
                !hit || named.contains(n.name.as_str())
            }
        })
    };
    if regex::Regex::new(&regex).is_ok_and(|re| exact(&re)) {
        return regex;
    }
    let names: Vec<String> = layers
        .iter()
        .map(|&l| regex::escape(&graph.nodes[l].name))
        .collect();
    format!("^(?:{})$", names.join("|"))
}

/// Block indices as ranges: `2–29`, `2, 5, 7–9` (ascending, en dashes).
pub fn ranges(indices: &[u64]) -> String {
    runs(indices)
        .iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}–{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Maximal runs of consecutive values of `indices` (sorted and deduplicated first).
fn runs(indices: &[u64]) -> Vec<(u64, u64)> {
    let mut v = indices.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for x in v {
        match out.last_mut() {
            Some((_, b)) if *b + 1 == x => *b = x,
            _ => out.push((x, x)),
        }
    }
    out
}

/// A regular expression (alternatives, no anchors or group) matching exactly the decimal
/// spellings of `indices` (no leading zeros): each run of consecutive values as digit ranges,
/// `2–29` → `[2-9]|[1-2][0-9]`.
pub fn index_set_regex(indices: &[u64]) -> String {
    let mut pieces = Vec::new();
    for (lo, hi) in runs(indices) {
        range_pieces(lo, hi, &mut pieces);
    }
    pieces.join("|")
}

/// The pieces matching `lo..=hi`, split by the number of digits.
fn range_pieces(lo: u64, hi: u64, out: &mut Vec<String>) {
    let digits = |x: u64| x.to_string().len();
    for d in digits(lo)..=digits(hi) {
        let first = if d == 1 { 0 } else { 10u64.pow(d as u32 - 1) };
        let last = 10u64.pow(d as u32) - 1;
        let (a, b) = (lo.max(first), hi.min(last));
        if a <= b {
            out.extend(same_width(&a.to_string(), &b.to_string()));
        }
    }
}

/// Pieces matching every string of digits from `a` to `b` (same width, leading zeros part of
/// the width).
fn same_width(a: &str, b: &str) -> Vec<String> {
    if a == b {
        return vec![a.to_string()];
    }
    let (a0, ar) = (a.as_bytes()[0], &a[1..]);
    let (b0, br) = (b.as_bytes()[0], &b[1..]);
    let class = |lo: u8, hi: u8| {
        if lo == hi {
            (lo as char).to_string()
        } else {
            format!("[{}-{}]", lo as char, hi as char)
        }
    };
    if ar.is_empty() {
        return vec![class(a0, b0)];
    }
    if a0 == b0 {
        return same_width(ar, br)
            .into_iter()
            .map(|p| format!("{}{p}", a0 as char))
            .collect();
    }
    let n = ar.len();
    let any = if n == 1 {
        "[0-9]".to_string()
    } else {
        format!("[0-9]{{{n}}}")
    };
    let mut out = Vec::new();
    let from_zero = ar.bytes().all(|c| c == b'0');
    let to_nine = br.bytes().all(|c| c == b'9');
    let mut first = a0;
    if !from_zero {
        let nines = "9".repeat(n);
        out.extend(
            same_width(ar, &nines)
                .into_iter()
                .map(|p| format!("{}{p}", a0 as char)),
        );
        first = a0 + 1;
    }
    let last = if to_nine { b0 } else { b0 - 1 };
    if first <= last {
        out.push(format!("{}{any}", class(first, last)));
    }
    if !to_nine {
        let zeros = "0".repeat(n);
        out.extend(
            same_width(&zeros, br)
                .into_iter()
                .map(|p| format!("{}{p}", b0 as char)),
        );
    }
    out
}

#[cfg(test)]
mod tests;
