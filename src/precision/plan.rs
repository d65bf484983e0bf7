//! `PrecisionPlan`: one precision per layer, built from global flags and `--layer-precisions`.

use super::fusion::FusionModel;
use super::{has_quantized_kernel, Precision};
use crate::error::{Error, Result};
use crate::graph::{Graph, Node};
use crate::ops::{computes_in_integers, is_data_movement};
use serde::Serialize;
use std::collections::BTreeMap;

/// A layer-name pattern from `--layer-precisions NAME:dtype`.
///
/// `NAME` is an exact layer name, a glob (`*`, `?`; e.g. `'*Softmax*'`, `'/encoder/layer.3/*'`),
/// or a regular expression after `re:` (`'re:^Conv_[0-9]+$'`). An exact name always matches,
/// so names that contain `*` or start with `re:` still work.
#[derive(Clone, Debug)]
pub struct LayerPattern {
    pub text: String,
    kind: PatternKind,
}

#[derive(Clone, Debug)]
enum PatternKind {
    Glob(regex::Regex),
    Regex(regex::Regex),
}

impl LayerPattern {
    pub fn parse(text: &str) -> Result<LayerPattern> {
        let kind = if let Some(expr) = text.strip_prefix("re:") {
            let re = regex::Regex::new(expr).map_err(|e| {
                Error::Invalid(format!(
                    "--layer-precisions: bad regular expression '{text}': {e}"
                ))
            })?;
            PatternKind::Regex(re)
        } else {
            let mut re = String::from("^");
            for c in text.chars() {
                match c {
                    '*' => re.push_str(".*"),
                    '?' => re.push('.'),
                    c => re.push_str(&regex::escape(&c.to_string())),
                }
            }
            re.push('$');
            PatternKind::Glob(regex::Regex::new(&re).expect("escaped glob is a valid regex"))
        };
        Ok(LayerPattern {
            text: text.to_string(),
            kind,
        })
    }

    pub fn matches(&self, name: &str) -> bool {
        name == self.text
            || match &self.kind {
                PatternKind::Glob(re) | PatternKind::Regex(re) => re.is_match(name),
            }
    }
}

/// Parses `NAME:dtype` items (the dtype after the last colon, so names may contain colons).
pub fn parse_layer_precisions(items: &[String]) -> Result<Vec<(LayerPattern, Precision)>> {
    items
        .iter()
        .map(|item| {
            let (name, dtype) = item.rsplit_once(':').ok_or_else(|| {
                Error::Invalid(format!(
                    "--layer-precisions: '{item}' is not NAME:dtype (e.g. Add:float16)"
                ))
            })?;
            if name.is_empty() {
                return Err(Error::Invalid(format!(
                    "--layer-precisions: '{item}' has an empty layer name"
                )));
            }
            let p = Precision::parse(dtype)
                .map_err(|e| Error::Invalid(format!("--layer-precisions '{item}': {e}")))?;
            Ok((LayerPattern::parse(name)?, p))
        })
        .collect()
}

/// The global precision flags (`--fp16 --bf16 --int8 --fp8`), combinable as in TensorRT.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GlobalPrecision {
    pub fp16: bool,
    pub bf16: bool,
    pub int8: bool,
    pub fp8: bool,
}

impl GlobalPrecision {
    /// The precision of layers without a quantized kernel: float16 with `--fp16`, bfloat16 with
    /// `--bf16` (fp16 wins when both are given: it is the faster kernel on GPUs that have
    /// both), float32 otherwise.
    pub fn float_precision(&self) -> Precision {
        if self.fp16 {
            Precision::Float16
        } else if self.bf16 {
            Precision::BFloat16
        } else {
            Precision::Float32
        }
    }

    /// The precision of Conv/ConvTranspose/MatMul/Gemm layers when quantization is on.
    pub fn quantized_precision(&self) -> Result<Option<Precision>> {
        match (self.int8, self.fp8) {
            (true, true) => Err(Error::Invalid(
                "--int8 and --fp8 cannot be combined: choose one quantized precision".into(),
            )),
            (true, false) => Ok(Some(Precision::Int8)),
            (false, true) => Ok(Some(Precision::Fp8E4M3)),
            (false, false) => Ok(None),
        }
    }

    /// The precision most layers run in (for messages): the quantized one if any.
    pub fn low_precision(&self) -> Precision {
        self.quantized_precision()
            .ok()
            .flatten()
            .unwrap_or_else(|| self.float_precision())
    }
}

/// `--precision-constraints`, with Polygraphy's meaning: `obey` applies per-layer requests and
/// fails when a layer has no kernel for its request, `prefer` falls back with a warning, `none`
/// ignores per-layer requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrecisionConstraints {
    Obey,
    #[default]
    Prefer,
    None,
}

impl PrecisionConstraints {
    pub fn parse(s: &str) -> Result<PrecisionConstraints> {
        match s {
            "obey" => Ok(PrecisionConstraints::Obey),
            "prefer" => Ok(PrecisionConstraints::Prefer),
            "none" => Ok(PrecisionConstraints::None),
            _ => Err(Error::Invalid(format!(
                "--precision-constraints '{s}': valid choices are obey, prefer, none"
            ))),
        }
    }
}

/// The precision of every layer (node) of a graph, by node index.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PrecisionPlan {
    pub layers: Vec<Precision>,
    /// Precisions of nodes inside subgraphs, by path (`If_0/then_branch/Conv_3`; nested
    /// subgraphs add segments). A node not listed runs in the precision of the control-flow
    /// layer that holds it (docs/numerics.md).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub inner: BTreeMap<String, Precision>,
    /// Fusion regions: groups of nodes that run as one kernel (docs/numerics.md, "Fusion
    /// regions"). Nodes are named as in `inner`: top-level nodes by name, nodes inside
    /// subgraphs by path; the nodes of one region belong to one graph.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<FusionRegion>,
    /// The engine fusion the emulation assumes besides `regions` (`--fusion`): with
    /// `tensorrt`, regions are derived from the graph and these precisions when the plan is
    /// prepared (`exec::fusion`), so every plan a search builds gets its own.
    #[serde(skip_serializing_if = "FusionModel::is_none")]
    pub fusion: FusionModel,
}

/// A group of nodes that runs as one kernel: values computed and consumed inside it stay in
/// f32 (the accumulator type); only the values that leave it are materialized in its precision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FusionRegion {
    /// A name for messages (`conv1+relu1`, `region_3`...).
    pub name: String,
    /// The region's nodes, by name (top level) or path (inside subgraphs).
    pub nodes: Vec<String>,
}

/// A fusion region checked against one graph: its nodes by index and its precision.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedRegion {
    /// Index in [`PrecisionPlan::regions`] of the plan it was resolved from.
    pub index: usize,
    pub name: String,
    /// Node indices, ascending.
    pub nodes: Vec<usize>,
    /// The precision its compute (non-data-movement) nodes share; float32 when it has none.
    /// For an [`upcast_attention`](Self::upcast_attention) region: float16, the kernel's type
    /// (the plan keeps its nodes float32).
    pub precision: Precision,
    /// TensorRT 11.3's FP16 fused attention with FP32 accumulation: an attention graph the
    /// plan keeps float32 whose query, key and value are float16 values cast up to it and
    /// whose output is cast down again (docs/numerics.md, "Fusion rules", row "attention,
    /// upcast"). It runs as one float16 kernel that accumulates in f32 whatever
    /// `--accumulate` says and rounds the probabilities to float16 for the second product.
    pub upcast_attention: bool,
}

/// Every node inside the subgraphs of `graph`'s nodes, nested ones included, with its path
/// (`node/attribute/inner_node`...).
pub fn inner_nodes(graph: &Graph) -> Vec<(String, &Node)> {
    fn walk<'g>(g: &'g Graph, prefix: &str, out: &mut Vec<(String, &'g Node)>) {
        for n in &g.nodes {
            for (attr, sg) in n.subgraphs() {
                let base = format!("{prefix}{}/{attr}/", n.name);
                for inner in &sg.nodes {
                    out.push((format!("{base}{}", inner.name), inner));
                }
                walk(sg, &base, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(graph, "", &mut out);
    out
}

/// Fails when a path leaves the region `nodes` (indices, ascending, of `graph`'s topologically
/// ordered nodes) and comes back into it: such a group cannot run as one kernel.
fn check_convex(graph: &Graph, nodes: &[usize]) -> std::result::Result<(), String> {
    let mut in_region = vec![false; graph.nodes.len()];
    for &i in nodes {
        in_region[i] = true;
    }
    let values = graph.values();
    // For a node outside the region reached from it: (the region node the path starts at,
    // the first outside node on it).
    let mut reached: Vec<Option<(usize, usize)>> = vec![None; graph.nodes.len()];
    for (j, node) in graph.nodes.iter().enumerate() {
        let reads = values.node_inputs(j).iter().flatten();
        for &input in reads.chain(values.node_implicit_inputs(j)) {
            // Only earlier nodes count: a value written later (not sorted) leads nowhere.
            let Some(u) = values.producer(input).map(|p| p.node).filter(|&u| u < j) else {
                continue;
            };
            if in_region[j] {
                if let Some((start, first)) = reached[u] {
                    return Err(format!(
                        "it is not convex: a path leaves it at '{}' through '{}' and comes back at '{}' (add the nodes between to the region or split it)",
                        graph.nodes[start].name, graph.nodes[first].name, node.name
                    ));
                }
            } else if reached[j].is_none() {
                reached[j] = if in_region[u] {
                    Some((u, j))
                } else {
                    reached[u]
                };
            }
        }
    }
    Ok(())
}

impl PrecisionPlan {
    /// A plan from one precision per layer (none inside subgraphs).
    pub fn from_layers(layers: Vec<Precision>) -> PrecisionPlan {
        PrecisionPlan {
            layers,
            inner: BTreeMap::new(),
            regions: Vec::new(),
            fusion: FusionModel::None,
        }
    }

    /// Every layer in one precision.
    pub fn uniform(graph: &Graph, p: Precision) -> PrecisionPlan {
        PrecisionPlan::from_layers(vec![p; graph.nodes.len()])
    }

    /// The plan of the subgraph `attr` of layer `node` whose own precision is `body`: every
    /// node in `body` except those this plan sets by path.
    pub fn subgraph_plan(
        &self,
        node: &Node,
        attr: &str,
        g: &Graph,
        body: Precision,
    ) -> PrecisionPlan {
        let mut plan = PrecisionPlan::uniform(g, body);
        let prefix = format!("{}/{attr}/", node.name);
        // Regions whose nodes all lie in this subgraph (or deeper), with the prefix removed.
        for r in &self.regions {
            let rest: Option<Vec<String>> = r
                .nodes
                .iter()
                .map(|n| n.strip_prefix(&prefix).map(str::to_string))
                .collect();
            if let Some(nodes) = rest.filter(|v| !v.is_empty()) {
                plan.regions.push(FusionRegion {
                    name: r.name.clone(),
                    nodes,
                });
            }
        }
        if self.inner.is_empty() {
            return plan;
        }
        for (path, &p) in self.inner.range(prefix.clone()..) {
            let Some(rest) = path.strip_prefix(&prefix) else {
                break;
            };
            match g.nodes.iter().position(|n| n.name == rest) {
                Some(i) => plan.layers[i] = p,
                None => {
                    plan.inner.insert(rest.to_string(), p);
                }
            }
        }
        plan
    }

    /// The fusion regions of this plan that lie in `graph` itself (regions inside its
    /// subgraphs are resolved with the subgraph's plan, see [`subgraph_plan`]), checked: every
    /// node exists and is named once, no node is in two regions or has subgraphs, the compute
    /// nodes of a region share one precision, and a region is convex (no path leaves it and
    /// comes back). Each failure is an error naming the region and the nodes.
    ///
    /// [`subgraph_plan`]: PrecisionPlan::subgraph_plan
    pub fn resolve_regions(&self, graph: &Graph) -> Result<Vec<ResolvedRegion>> {
        if self.regions.is_empty() {
            return Ok(Vec::new());
        }
        let bad = |r: &FusionRegion, msg: String| {
            Error::Invalid(format!("fusion region '{}': {msg}", r.name))
        };
        let inner: BTreeMap<String, String> = inner_nodes(graph)
            .into_iter()
            .map(|(path, n)| {
                let scope = path[..path.len() - n.name.len()].to_string();
                (path, scope)
            })
            .collect();
        let mut owner: Vec<Option<usize>> = vec![None; graph.nodes.len()];
        let mut out = Vec::new();
        for (k, r) in self.regions.iter().enumerate() {
            if r.nodes.is_empty() {
                return Err(bad(r, "it has no nodes".into()));
            }
            let mut top = Vec::new();
            let mut scopes = Vec::new();
            for name in &r.nodes {
                let idx: Vec<usize> = (0..graph.nodes.len())
                    .filter(|&i| graph.nodes[i].name == *name)
                    .collect();
                match (idx.as_slice(), inner.get(name)) {
                    ([i], _) => top.push(*i),
                    ([], Some(scope)) => scopes.push(scope.clone()),
                    ([], None) => {
                        return Err(bad(r, format!("the model has no node '{name}'")));
                    }
                    (_, _) => {
                        return Err(bad(r, format!("{} nodes are named '{name}'", idx.len())));
                    }
                }
            }
            scopes.sort();
            scopes.dedup();
            if !scopes.is_empty() {
                if !top.is_empty() || scopes.len() > 1 {
                    return Err(bad(
                        r,
                        "its nodes belong to different graphs (a region lies in one graph: the main graph or one subgraph)".into(),
                    ));
                }
                continue; // Resolved by the subgraph's own plan.
            }
            top.sort_unstable();
            if let Some(w) = top.windows(2).find(|w| w[0] == w[1]) {
                return Err(bad(
                    r,
                    format!("node '{}' is listed twice", graph.nodes[w[0]].name),
                ));
            }
            for &i in &top {
                let n = &graph.nodes[i];
                if let Some(other) = owner[i] {
                    return Err(bad(
                        r,
                        format!(
                            "node '{}' is also in region '{}' (a node belongs to one region)",
                            n.name, self.regions[other].name
                        ),
                    ));
                }
                if n.has_subgraphs() {
                    return Err(bad(
                        r,
                        format!(
                            "node '{}' ({}) has subgraphs and cannot be fused",
                            n.name, n.op_type
                        ),
                    ));
                }
                owner[i] = Some(k);
            }
            // One precision for the compute nodes (data movement carries its input's).
            let compute: Vec<usize> = top
                .iter()
                .copied()
                .filter(|&i| !is_data_movement(&graph.nodes[i]))
                .collect();
            let precision = compute
                .first()
                .map_or(Precision::Float32, |&i| self.layers[i]);
            if compute.iter().any(|&i| self.layers[i] != precision) {
                let list: Vec<String> = compute
                    .iter()
                    .map(|&i| format!("{} {}", graph.nodes[i].name, self.layers[i]))
                    .collect();
                return Err(bad(
                    r,
                    format!(
                        "its nodes must share one precision, the plan gives {} (a precision boundary splits a fused kernel)",
                        list.join(", ")
                    ),
                ));
            }
            check_convex(graph, &top).map_err(|msg| bad(r, msg))?;
            out.push(ResolvedRegion {
                index: k,
                name: r.name.clone(),
                nodes: top,
                precision,
                upcast_attention: false,
            });
        }
        Ok(out)
    }

    /// Reads a plan saved as JSON (what serializing a plan writes): `layers` (one precision
    /// per node, in graph order), optional `inner` (path → precision) and `regions`
    /// (`[{"name": ..., "nodes": [...]}]`) and `fusion` (`"none"`, `"tensorrt"`). Precisions take every name `--layer-precisions`
    /// accepts. The plan is checked against `graph`: layer count, inner paths and regions.
    pub fn from_json(text: &str, graph: &Graph) -> Result<PrecisionPlan> {
        let bad = |m: String| Error::Invalid(format!("precision plan: {m}"));
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let prec = |x: &serde_json::Value, at: &str| -> Result<Precision> {
            let s = x
                .as_str()
                .ok_or_else(|| bad(format!("{at}: expected a precision name, got {x}")))?;
            Precision::parse(s).map_err(|e| bad(format!("{at}: {e}")))
        };
        let layers = v
            .get("layers")
            .and_then(|l| l.as_array())
            .ok_or_else(|| bad("'layers' (a list of precisions, one per node) is missing".into()))?
            .iter()
            .enumerate()
            .map(|(i, x)| prec(x, &format!("layers[{i}]")))
            .collect::<Result<Vec<_>>>()?;
        if layers.len() != graph.nodes.len() {
            return Err(bad(format!(
                "'layers' has {} entries, the model {} nodes",
                layers.len(),
                graph.nodes.len()
            )));
        }
        let mut plan = PrecisionPlan::from_layers(layers);
        if let Some(f) = v.get("fusion") {
            let name = f.as_str().ok_or_else(|| {
                bad(format!(
                    "'fusion' must be a string (none, tensorrt), got {f}"
                ))
            })?;
            plan.fusion = FusionModel::parse(name).map_err(|e| bad(e.to_string()))?;
        }
        if let Some(inner) = v.get("inner") {
            let obj = inner
                .as_object()
                .ok_or_else(|| bad("'inner' must be an object of path: precision".into()))?;
            let known: Vec<String> = inner_nodes(graph).into_iter().map(|(p, _)| p).collect();
            for (path, x) in obj {
                if !known.contains(path) {
                    return Err(bad(format!(
                        "inner: the model has no subgraph node '{path}'"
                    )));
                }
                plan.inner
                    .insert(path.clone(), prec(x, &format!("inner '{path}'"))?);
            }
        }
        if let Some(regions) = v.get("regions") {
            let list = regions
                .as_array()
                .ok_or_else(|| bad("'regions' must be a list".into()))?;
            for (i, r) in list.iter().enumerate() {
                let name = match r.get("name") {
                    None => format!("region_{i}"),
                    Some(n) => n
                        .as_str()
                        .ok_or_else(|| bad(format!("regions[{i}].name must be a string")))?
                        .to_string(),
                };
                let nodes = r
                    .get("nodes")
                    .and_then(|n| n.as_array())
                    .ok_or_else(|| bad(format!("regions[{i}] ('{name}') has no 'nodes' list")))?
                    .iter()
                    .map(|n| {
                        n.as_str().map(str::to_string).ok_or_else(|| {
                            bad(format!("regions[{i}] ('{name}'): node names are strings"))
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                plan.regions.push(FusionRegion { name, nodes });
            }
        }
        plan.check_regions(graph)?;
        Ok(plan)
    }

    /// The plan as JSON, the format [`from_json`](Self::from_json) reads.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a plan serializes")
    }

    /// Checks the regions of this plan in `graph` and in every subgraph, recursively.
    pub fn check_regions(&self, graph: &Graph) -> Result<()> {
        self.resolve_regions(graph)?;
        for (i, node) in graph.nodes.iter().enumerate() {
            for (attr, g) in node.subgraphs() {
                let body = if self.layers[i].is_scaled() {
                    Precision::Float32
                } else {
                    self.layers[i]
                };
                self.subgraph_plan(node, attr, g, body)
                    .check_regions(g)
                    .map_err(|e| e.in_subgraph(&node.name, attr))?;
            }
        }
        Ok(())
    }

    /// This plan with the layers `marked` (node indices) in precision `p`.
    pub fn marking(&self, marked: &[usize], p: Precision) -> PrecisionPlan {
        let mut plan = self.clone();
        for &i in marked {
            plan.layers[i] = p;
        }
        plan
    }

    /// Applies `--layer-precisions` overrides in order (later items win). Returns the patterns
    /// that matched no layer, so the caller can warn about each by name.
    pub fn apply_overrides(
        &mut self,
        graph: &Graph,
        overrides: &[(LayerPattern, Precision)],
    ) -> Vec<String> {
        let mut unmatched = Vec::new();
        let inner = inner_nodes(graph);
        for (pat, p) in overrides {
            let mut hit = false;
            for (i, node) in graph.nodes.iter().enumerate() {
                if pat.matches(&node.name) {
                    self.layers[i] = *p;
                    hit = true;
                }
            }
            for (path, node) in &inner {
                if pat.matches(path) && !is_data_movement(node) {
                    self.inner.insert(path.clone(), *p);
                    hit = true;
                }
            }
            if !hit {
                unmatched.push(pat.text.clone());
            }
        }
        unmatched
    }

    /// Resolves global flags and `--layer-precisions` into the precision every layer runs in,
    /// as TensorRT would: quantized precisions only where an integer/fp8 kernel exists, the
    /// float precision of the global flags elsewhere. Returns the plan and warnings to show.
    pub fn resolve(
        graph: &Graph,
        flags: &GlobalPrecision,
        overrides: &[(LayerPattern, Precision)],
        constraints: PrecisionConstraints,
    ) -> Result<(PrecisionPlan, Vec<String>)> {
        let float = flags.float_precision();
        let quant = flags.quantized_precision()?;
        let mut warnings = Vec::new();
        let mut layers: Vec<Precision> = graph
            .nodes
            .iter()
            .map(|n| match quant {
                // Integer ops of operator-style quantization run as written.
                _ if computes_in_integers(n) => Precision::Float32,
                Some(q) if has_quantized_kernel(n) => q,
                _ => float,
            })
            .collect();
        if constraints == PrecisionConstraints::None {
            if !overrides.is_empty() {
                warnings.push(
                    "--precision-constraints none: --layer-precisions is ignored (use prefer or obey to apply it)"
                        .into(),
                );
            }
            return Ok((PrecisionPlan::from_layers(layers), warnings));
        }
        let inner = inner_nodes(graph);
        let mut inner_set = BTreeMap::new();
        for (pat, p) in overrides {
            let mut hit = false;
            // Top-level layers by index, then nodes inside subgraphs by path.
            let matched = graph
                .nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| pat.matches(&n.name))
                .map(|(i, n)| (Some(i), n.name.clone(), n))
                .chain(
                    inner
                        .iter()
                        .filter(|(path, _)| pat.matches(path))
                        .map(|(path, n)| (None, path.clone(), *n)),
                )
                .collect::<Vec<_>>();
            for (index, name, node) in matched {
                hit = true;
                let mut set = |q: Precision| match index {
                    Some(i) => layers[i] = q,
                    None => {
                        inner_set.insert(name.clone(), q);
                    }
                };
                let folded = index.is_some() && graph.is_folded(node);
                if is_data_movement(node) || folded {
                    // Exact names only: a glob that sweeps over Reshapes is not worth a warning.
                    if pat.text == name {
                        let what = if folded {
                            "computes a weight from initializers (folded at load): the layers reading it set its precision"
                        } else {
                            "only moves data and carries its input's precision"
                        };
                        warnings.push(format!(
                            "--layer-precisions '{}': layer '{}' ({}) {what}",
                            pat.text, name, node.op_type
                        ));
                    }
                    continue;
                }
                if p.is_scaled() && !has_quantized_kernel(node) {
                    let msg = format!(
                        "layer '{}' ({}) has no {} kernel (only Conv, ConvTranspose, MatMul and Gemm do)",
                        name, node.op_type, p
                    );
                    if constraints == PrecisionConstraints::Obey {
                        return Err(Error::Invalid(format!(
                            "{msg}; with --precision-constraints obey this is an error (use prefer to fall back)"
                        )));
                    }
                    warnings.push(format!("{msg}: running it in {float}"));
                    set(float);
                    continue;
                }
                set(*p);
            }
            if !hit {
                warnings.push(format!(
                    "--layer-precisions: pattern '{}' matches no layer",
                    pat.text
                ));
            }
        }
        Ok((
            PrecisionPlan {
                layers,
                inner: inner_set,
                regions: Vec::new(),
                fusion: FusionModel::None,
            },
            warnings,
        ))
    }

    /// How many compute layers run in each precision.
    pub fn counts(&self, graph: &Graph) -> Vec<(Precision, usize)> {
        Precision::ALL
            .iter()
            .map(|&p| {
                let n = graph
                    .nodes
                    .iter()
                    .zip(&self.layers)
                    .filter(|(node, &q)| {
                        q == p && !is_data_movement(node) && !graph.is_folded(node)
                    })
                    .count();
                (p, n)
            })
            .filter(|&(_, n)| n > 0)
            .collect()
    }

    /// Indices of the layers whose precision can matter (not pure data movement, not the
    /// integer ops of operator-style quantization, which run as written).
    pub fn candidates(graph: &Graph) -> Vec<usize> {
        graph
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| {
                !is_data_movement(n) && !graph.is_folded(n) && !computes_in_integers(n)
            })
            .map(|(i, _)| i)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Node;
    use std::collections::BTreeMap;

    fn graph(names: &[(&str, &str)]) -> Graph {
        Graph {
            nodes: names
                .iter()
                .map(|(n, op)| Node {
                    name: n.to_string(),
                    op_type: op.to_string(),
                    domain: String::new(),
                    inputs: vec![],
                    outputs: vec![],
                    attrs: BTreeMap::new(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn globs_regexes_and_exact_names() {
        assert!(LayerPattern::parse("*Softmax*")
            .unwrap()
            .matches("/layer.0/attn/Softmax_1"));
        assert!(!LayerPattern::parse("*Softmax")
            .unwrap()
            .matches("Softmax_1"));
        assert!(LayerPattern::parse("/encoder/layer.3/*")
            .unwrap()
            .matches("/encoder/layer.3/Add"));
        assert!(!LayerPattern::parse("/encoder/layer.3/*")
            .unwrap()
            .matches("/encoder/layer.30/Add"));
        assert!(LayerPattern::parse("re:^Conv_[0-9]+$")
            .unwrap()
            .matches("Conv_12"));
        assert!(LayerPattern::parse("a.b").unwrap().matches("a.b"));
        assert!(!LayerPattern::parse("a.b").unwrap().matches("axb"));
    }

    #[test]
    fn overrides_apply_in_order_and_report_unmatched() {
        let g = graph(&[
            ("MatMul", "MatMul"),
            ("Add", "Add"),
            ("Sub", "Sub"),
            ("Reshape", "Reshape"),
        ]);
        let mut plan = PrecisionPlan::uniform(&g, Precision::Float16);
        let o = parse_layer_precisions(&[
            "Add:float16".into(),
            "Sub:float32".into(),
            "Nope:fp32".into(),
        ])
        .unwrap();
        let unmatched = plan.apply_overrides(&g, &o);
        assert_eq!(plan.layers[2], Precision::Float32);
        assert_eq!(plan.layers[1], Precision::Float16);
        assert_eq!(unmatched, vec!["Nope".to_string()]);
        assert_eq!(PrecisionPlan::candidates(&g), vec![0, 1, 2]);
    }

    #[test]
    fn resolve_follows_tensorrt_flag_rules() {
        let g = graph(&[
            ("conv", "Conv"),
            ("relu", "Relu"),
            ("reshape", "Reshape"),
            ("mm", "MatMul"),
        ]);
        let flags = GlobalPrecision {
            int8: true,
            fp16: true,
            ..Default::default()
        };
        let (plan, w) =
            PrecisionPlan::resolve(&g, &flags, &[], PrecisionConstraints::Prefer).unwrap();
        assert_eq!(plan.layers[0], Precision::Int8);
        assert_eq!(plan.layers[1], Precision::Float16);
        assert_eq!(plan.layers[3], Precision::Int8);
        assert!(w.is_empty());
        // int8 requested for a Relu: prefer falls back with a warning, obey is an error.
        let o = parse_layer_precisions(&["relu:int8".into(), "mm:float32".into()]).unwrap();
        let (plan, w) =
            PrecisionPlan::resolve(&g, &flags, &o, PrecisionConstraints::Prefer).unwrap();
        assert_eq!(plan.layers[1], Precision::Float16);
        assert_eq!(plan.layers[3], Precision::Float32);
        assert!(w[0].contains("'relu'"), "{w:?}");
        let e = PrecisionPlan::resolve(&g, &flags, &o, PrecisionConstraints::Obey).unwrap_err();
        assert!(e.to_string().contains("'relu'"), "{e}");
        // none ignores per-layer requests.
        let (plan, w) = PrecisionPlan::resolve(&g, &flags, &o, PrecisionConstraints::None).unwrap();
        assert_eq!(plan.layers[3], Precision::Int8);
        assert_eq!(w.len(), 1);
        let both = GlobalPrecision {
            int8: true,
            fp8: true,
            ..Default::default()
        };
        assert!(PrecisionPlan::resolve(&g, &both, &[], PrecisionConstraints::Prefer).is_err());
    }

    #[test]
    fn bad_items_are_errors() {
        assert!(parse_layer_precisions(&["Add".into()]).is_err());
        let e = parse_layer_precisions(&["Add:float64".into()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("Add:float64") && e.contains("unknown precision"),
            "{e}"
        );
    }

    #[test]
    fn patterns_address_nodes_inside_subgraphs_by_path() {
        use crate::graph::Attribute;
        use std::sync::Arc;
        let node = |name: &str, op: &str| Node {
            name: name.into(),
            op_type: op.into(),
            domain: String::new(),
            inputs: vec![],
            outputs: vec![],
            attrs: BTreeMap::new(),
            ..Default::default()
        };
        let inner = Graph {
            nodes: vec![node("conv", "Conv"), node("reshape", "Reshape")],
            ..Default::default()
        };
        let mut nested_if = node("if", "If");
        nested_if
            .attrs
            .insert("then_branch".into(), Attribute::Graph(Arc::new(inner)));
        let body = Graph {
            nodes: vec![node("add", "Add"), nested_if],
            ..Default::default()
        };
        let mut lp = node("loop", "Loop");
        lp.attrs
            .insert("body".into(), Attribute::Graph(Arc::new(body.clone())));
        let g = Graph {
            nodes: vec![node("relu", "Relu"), lp],
            ..Default::default()
        };
        let paths: Vec<String> = inner_nodes(&g).into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            paths,
            [
                "loop/body/add",
                "loop/body/if",
                "loop/body/if/then_branch/conv",
                "loop/body/if/then_branch/reshape"
            ]
        );
        let flags = GlobalPrecision {
            fp16: true,
            ..Default::default()
        };
        let ov = parse_layer_precisions(&[
            "loop/body/add:float32".into(),
            "*conv:float32".into(),
            "loop/body/nothing:float32".into(),
        ])
        .unwrap();
        let (plan, warnings) =
            PrecisionPlan::resolve(&g, &flags, &ov, PrecisionConstraints::Prefer).unwrap();
        assert_eq!(plan.layers, [Precision::Float16, Precision::Float16]);
        let set: Vec<(&str, Precision)> =
            plan.inner.iter().map(|(k, &v)| (k.as_str(), v)).collect();
        assert_eq!(
            set,
            [
                ("loop/body/add", Precision::Float32),
                ("loop/body/if/then_branch/conv", Precision::Float32)
            ]
        );
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("'loop/body/nothing'"), "{warnings:?}");
        // The body's plan: its own nodes by index, deeper ones by the rest of their path.
        let sub = plan.subgraph_plan(&g.nodes[1], "body", &body, Precision::Float16);
        assert_eq!(sub.layers, [Precision::Float32, Precision::Float16]);
        assert_eq!(
            sub.inner.keys().collect::<Vec<_>>(),
            ["if/then_branch/conv"]
        );
    }
}
