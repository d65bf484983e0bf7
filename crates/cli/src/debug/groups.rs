//! How `debug precision` prints an answer's layers: as rules, one line per role and set of
//! blocks (`input_layernorm/{Pow,ReduceMean,Add,Sqrt} in /model/layers 2–29`), with the
//! `--layer-precisions` item and ModelOpt's `--nodes_to_exclude` pattern that name them.

use super::Printer;
use mixprec::precision::Precision;
use mixprec::search::groups::{answer_rules, Rule};
use mixprec::search::report::{layer_precisions_item, names, shell_word};
use mixprec::search::SearchSpace;
use mixprec::Graph;

/// Prints the `Layers:` part of an answer. Without a role of several layers it is the list of
/// names, as it always was; else one line per rule, each followed by its `--layer-precisions`
/// item (with `high`: a float search; None for a Q/DQ search, whose answer leaves
/// quantization), then ModelOpt's spelling of the whole answer.
pub(super) fn print_layers(
    p: &Printer,
    graph: &Graph,
    space: &SearchSpace,
    marked: &[usize],
    high: Option<Precision>,
) {
    let rules = answer_rules(graph, &space.candidates, marked);
    if !rules.iter().any(Rule::is_group) {
        out!(p, "[I]     Layers: {}", names(graph, marked));
        return;
    }
    out!(
        p,
        "[I]     Layers, by role ({} rule(s) for {} layer(s); a role is the same layer in each block, the block index abstracted):",
        rules.len(),
        marked.len()
    );
    for rule in &rules {
        if rule.is_group() {
            out!(
                p,
                "[I]       {} ({} layers)",
                rule.describe(),
                rule.layers.len()
            );
        } else {
            out!(p, "[I]       {}", rule.describe());
        }
        if let Some(high) = high {
            out!(
                p,
                "[I]         --layer-precisions {}",
                shell_word(&layer_precisions_item(rule, high))
            );
        }
    }
    let patterns: Vec<String> = rules.iter().map(|r| shell_word(&r.regex)).collect();
    out!(
        p,
        "[I]     ModelOpt (AutoCast, quantize; regex patterns): --nodes_to_exclude {}",
        patterns.join(" ")
    );
}
