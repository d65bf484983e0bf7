//! `PrecisionPlan`: one precision per layer, built from global flags and `--layer-precisions`.

use super::Precision;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::ops::is_data_movement;
use serde::Serialize;

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

/// The precision of every layer (node) of a graph, by node index.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PrecisionPlan {
    pub layers: Vec<Precision>,
}

impl PrecisionPlan {
    /// Every layer in one precision.
    pub fn uniform(graph: &Graph, p: Precision) -> PrecisionPlan {
        PrecisionPlan {
            layers: vec![p; graph.nodes.len()],
        }
    }

    /// Applies `--layer-precisions` overrides in order (later items win). Returns the patterns
    /// that matched no layer, so the caller can warn about each by name.
    pub fn apply_overrides(
        &mut self,
        graph: &Graph,
        overrides: &[(LayerPattern, Precision)],
    ) -> Vec<String> {
        let mut unmatched = Vec::new();
        for (pat, p) in overrides {
            let mut hit = false;
            for (i, node) in graph.nodes.iter().enumerate() {
                if pat.matches(&node.name) {
                    self.layers[i] = *p;
                    hit = true;
                }
            }
            if !hit {
                unmatched.push(pat.text.clone());
            }
        }
        unmatched
    }

    /// Indices of the layers whose precision can matter (not pure data movement).
    pub fn candidates(graph: &Graph) -> Vec<usize> {
        graph
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| !is_data_movement(&n.op_type))
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
}
