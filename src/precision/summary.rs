//! A plan described in text for logs: the layer counts per precision, every layer's precision,
//! the fusion regions. Shared by `run`, `convert` and `debug precision` (the CLI prints these
//! lines; the Python package returns them).

use crate::precision::fusion::FusionModel;
use crate::precision::plan::{PrecisionPlan, ResolvedRegion};
use crate::precision::Precision;
use crate::Graph;

/// One line: the fusion regions a plan runs with (None when it has none and assumes
/// no fusion model).
pub fn fusion_line(
    graph: &Graph,
    model: FusionModel,
    regions: &[ResolvedRegion],
) -> Option<String> {
    if model.is_none() && regions.is_empty() {
        return None;
    }
    let layers: usize = regions
        .iter()
        .map(|r| {
            r.nodes
                .iter()
                .filter(|&&i| {
                    let n = &graph.nodes[i];
                    !crate::ops::is_data_movement(n) && !graph.is_folded(n)
                })
                .count()
        })
        .sum();
    Some(format!(
        "Fusion ({model}): {} region(s) of {layers} layer(s); values passed inside a region stay in f32, only its outputs are rounded{}",
        regions.len(),
        if model.is_none() {
            ""
        } else {
            " (regions derived per plan; -v lists them and the nodes left unfused)"
        }
    ))
}

/// Every fusion region of a plan, one per line: name, precision, nodes.
pub fn fusion_table(graph: &Graph, regions: &[ResolvedRegion]) -> String {
    let mut s = String::new();
    for r in regions {
        let nodes: Vec<&str> = r
            .nodes
            .iter()
            .map(|&i| graph.nodes[i].name.as_str())
            .collect();
        // TensorRT 11.3's FP32-accumulating float16 attention: the plan keeps it float32.
        let kind = if r.upcast_attention {
            " kernel, float32 accumulation: Q/K/V cast up around it"
        } else {
            ""
        };
        s.push_str(&format!(
            "    region {} ({}{kind}): {}\n",
            r.name,
            r.precision.name(),
            nodes.join(", ")
        ));
    }
    s
}

/// One line: how many compute layers run in each precision.
pub fn precision_counts_line(graph: &Graph, plan: &PrecisionPlan) -> String {
    // Layers the plan leaves in float32 but the model declares in a 16-bit type compute in it.
    let declared = declared_16bit(graph, plan);
    let mut parts: Vec<String> = Vec::new();
    let mut total = 0;
    for (p, n) in plan.counts(graph) {
        let native = |q: Precision| declared.iter().filter(|d| **d == Some(q)).count();
        let n = if p == Precision::Float32 {
            n - native(Precision::Float16) - native(Precision::BFloat16)
        } else {
            n
        };
        total += n;
        if n > 0 {
            parts.push(format!("{n} {}", p.name()));
        }
    }
    for q in [Precision::Float16, Precision::BFloat16] {
        let n = declared.iter().filter(|d| **d == Some(q)).count();
        total += n;
        if n > 0 {
            parts.push(format!("{n} {} (declared in the model)", q.name()));
        }
    }
    let inner = if plan.inner.is_empty() {
        String::new()
    } else {
        let set: Vec<String> = plan
            .inner
            .iter()
            .map(|(path, p)| format!("{path}:{}", p.name()))
            .collect();
        format!("; inside subgraphs: {}", set.join(" "))
    };
    format!(
        "Layer precisions: {} ({} compute layers; data-movement layers carry their input's precision{inner})",
        parts.join(", "),
        total
    )
}

/// Per node: the 16-bit float type a compute layer the plan leaves in float32 is declared
/// in by the model (it computes in that type: a strongly typed float16/bfloat16 model).
fn declared_16bit(graph: &Graph, plan: &PrecisionPlan) -> Vec<Option<Precision>> {
    let types = crate::infer::declared_output_types(graph);
    graph
        .nodes
        .iter()
        .zip(&plan.layers)
        .zip(types)
        .map(|((node, &p), d)| {
            if p != Precision::Float32
                || crate::ops::is_data_movement(node)
                || graph.is_folded(node)
            {
                return None;
            }
            d.and_then(Precision::of_16bit_dtype)
        })
        .collect()
}

/// A table of every layer and the precision it ran in.
pub fn precision_table(graph: &Graph, plan: &PrecisionPlan) -> String {
    let name_w = graph
        .nodes
        .iter()
        .map(|n| n.name.len())
        .max()
        .unwrap_or(4)
        .clamp(4, 60);
    let mut s = format!(
        "{:>5}  {:<name_w$}  {:<22}  precision\n",
        "#", "layer", "op"
    );
    let declared = declared_16bit(graph, plan);
    for (i, (node, p)) in graph.nodes.iter().zip(&plan.layers).enumerate() {
        let prec = if crate::ops::is_data_movement(node) {
            "(carries its input's)".to_string()
        } else if let Some(d) = declared[i] {
            format!("{} (declared)", d.name())
        } else {
            p.name().to_string()
        };
        s.push_str(&format!(
            "{i:>5}  {:<name_w$}  {:<22}  {prec}\n",
            node.name, node.op_type
        ));
    }
    s
}
