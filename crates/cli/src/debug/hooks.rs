//! How `debug precision` shows a running search: the header, a line per evaluation, a spinner.

use super::report::report;
use super::{answer_label, install_interrupt_handler, Printer, SearchArgs};
use crate::progress::print_event;
use mixprec::compare::Criterion;
use mixprec::event::Event;
use mixprec::inspect::si;
use mixprec::jobs::debug_precision::{Hooks, SearchPass};
use mixprec::onnx::Model;
use mixprec::precision::fusion::FusionModel;
use mixprec::precision::plan::ResolvedRegion;
use mixprec::precision::summary::{fusion_line, fusion_table};
use mixprec::precision::Precision;
use mixprec::search::driver::SearchHooks;
use mixprec::search::report::percent;
use mixprec::search::{Direction, Mode, Ranking, SearchSpace, Trial};
use mixprec::Graph;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

/// How `debug precision` shows a running search: the header once the search space is known,
/// a line per evaluation (and a spinner on a terminal), events on stderr.
pub(super) struct CliHooks<'a> {
    pub(super) p: &'a Printer,
    pub(super) args: &'a SearchArgs,
    /// The model's layer names, by node index.
    pub(super) layers: Vec<String>,
    pub(super) feeds: usize,
    pub(super) criterion: &'a Criterion,
    pub(super) high: Precision,
    pub(super) mode: Mode,
    pub(super) direction: Direction,
    pub(super) say: bool,
    pub(super) bar: indicatif::ProgressBar,
    pub(super) best: Option<usize>,
    /// Searching a Q/DQ model's quantized layers.
    pub(super) qdq: bool,
    /// The exit code of the last search's report.
    pub(super) code: ExitCode,
}

impl Hooks for CliHooks<'_> {
    fn model_loaded(&mut self, graph: &Graph) {
        self.layers = graph.nodes.iter().map(|n| n.name.clone()).collect();
    }

    fn inputs_ready(&mut self, sets: usize) {
        self.feeds = sets;
    }

    fn search_starting(&mut self, qdq: bool) {
        self.qdq = qdq;
        install_interrupt_handler();
    }

    fn section(
        &mut self,
        graph: &Graph,
        fusion: FusionModel,
        regions: &[ResolvedRegion],
        events: Vec<Event>,
    ) {
        let p = self.p;
        out!(p, "[I] ==== {} ====", answer_label(fusion));
        if let Some(line) = fusion_line(graph, fusion, regions) {
            out!(p, "[I] {line}, in the plan with no layer marked");
        }
        if self.args.verbose {
            print!("{}", fusion_table(graph, regions));
            for e in events {
                print_event(e);
            }
        }
    }

    fn finished(&mut self, model: &Model, s: &SearchPass) -> mixprec::Result<()> {
        self.bar.finish_and_clear();
        self.bar = indicatif::ProgressBar::hidden();
        let stat = self.criterion.stat.default.name();
        self.code = report(
            self.p,
            self.args,
            model,
            s,
            (self.high, self.direction),
            stat,
        )
        .map_err(|e| mixprec::Error::Invalid(format!("{e:#}")))?;
        Ok(())
    }

    fn calibration_progress(&self) -> Box<dyn mixprec::event::Progress + '_> {
        Box::new(crate::progress::Bar::calibration(
            std::io::stderr().is_terminal(),
        ))
    }
}

impl SearchHooks for CliHooks<'_> {
    fn event(&mut self, e: Event) {
        self.bar.suspend(|| print_event(e));
    }

    fn log(&mut self, line: String) {
        let p = self.p;
        self.bar.suspend(|| out!(p, "{line}"));
    }

    fn started(&mut self, space: &SearchSpace) {
        self.best = None;
        let (p, args, criterion, high) = (self.p, self.args, self.criterion, self.high);
        if self.say && self.qdq {
            out!(p,
                "[I] Q/DQ model: {} quantized layer(s) of {} are the candidates; a marked layer loses its input Q/DQ pairs and runs in {} | mode {}{} | {} input set(s)",
                space.candidates.len(),
                self.layers.len(),
                high.name(),
                self.mode.name(),
                if self.mode.is_contiguous() {
                    match self.direction {
                        Direction::Forward => ", forward",
                        Direction::Reverse => ", reverse",
                    }
                } else {
                    ""
                },
                self.feeds
            );
        }
        if self.say && !self.qdq {
            out!(p,
                "[I] Using {} as higher precision | mode {}{} | {} candidate layer(s) of {} (data-movement layers and layers already in {} are not candidates) | {} input set(s)",
                high.name(),
                self.mode.name(),
                if self.mode.is_contiguous() {
                    format!(
                        ", {}",
                        match self.direction {
                            Direction::Forward => "forward",
                            Direction::Reverse => "reverse",
                        }
                    )
                } else {
                    String::new()
                },
                space.candidates.len(),
                self.layers.len(),
                high.name(),
                self.feeds
            );
        }
        if self.say {
            out!(
                p,
                "[I] Pass criterion: {}{}",
                if args.check.check.is_empty() {
                    format!(
                        "{} error within atol {} or rtol {}",
                        criterion.stat.default.name(),
                        mixprec::compare::fmt_g(criterion.atol.default, 5),
                        mixprec::compare::fmt_g(criterion.rtol.default, 5),
                    )
                } else {
                    format!("--check {}", args.check.check.join(" "))
                },
                if criterion.metrics.is_empty() || !args.check.check.is_empty() {
                    String::new()
                } else {
                    format!(
                        " and {}",
                        criterion
                            .metrics
                            .iter()
                            .map(|m| m.kind.label())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                },
            );
            if let Some(n) = args.decode.filter(|_| args.check.check.is_empty()) {
                out!(
                    p,
                    "[I] On generations of {n} token(s): {}",
                    mixprec::decode::judged_outputs(criterion)
                );
            }
        }
        if self.say && std::io::stderr().is_terminal() {
            let b = indicatif::ProgressBar::new_spinner();
            b.set_style(
                indicatif::ProgressStyle::with_template("{spinner} [{elapsed}] {msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            b.enable_steady_tick(Duration::from_millis(120));
            self.bar = b;
        }
    }

    fn trial(&mut self, space: &SearchSpace, t: &Trial) {
        if t.passed {
            self.best = Some(self.best.map_or(t.marked.len(), |b| b.min(t.marked.len())));
        }
        self.bar.set_message(format!(
            "iteration {} | best so far: {}",
            t.iteration,
            self.best
                .map_or("none".to_string(), |b| format!("{b} layer(s)"))
        ));
        if self.say {
            let line = trial_line(&self.layers, t, space.total_flops(), self.args.verbose);
            let p = self.p;
            self.bar.suspend(|| out!(p, "{line}"));
        }
        // The deferred ranking runs next (by sensitivity about half an inference per candidate):
        // say so, or a long ranking looks like a stalled search.
        // With --group roles the roles are ranked instead, each by an evaluation of its own
        // (its `rank-roles` line says so).
        let by_layer = self.args.group == mixprec::search::Grouping::None;
        if t.phase == "check-none"
            && !t.passed
            && space.deferred
            && self.mode.needs_ranking()
            && by_layer
        {
            let n = space.candidates.len();
            let ranking = self.args.ranking();
            self.bar.set_message(format!(
                "ranking {n} candidate layer(s) by {}",
                ranking.name()
            ));
            if self.say && ranking == Ranking::Sensitivity {
                let p = self.p;
                self.bar.suspend(|| {
                    out!(p,
                        "[I] Ranking {n} candidate layer(s) by sensitivity: each alone in low precision, judged under the criterion (emulated)"
                    )
                });
            }
        }
    }
}

pub(super) fn trial_line(layers: &[String], t: &Trial, total_flops: u64, verbose: bool) -> String {
    let mut s = format!(
        "[{}] Iteration {:>3} ({}) | {} layer(s) in high precision ({}FLOP, {}) | {} | {}",
        if t.passed { "I" } else { "W" },
        t.iteration,
        t.phase,
        t.marked.len(),
        si(t.marked_flops),
        percent(t.marked_flops, total_flops),
        if t.passed { "PASSED" } else { "FAILED" },
        t.summary
    );
    if verbose {
        let marked: Vec<&str> = t.marked.iter().map(|&i| layers[i].as_str()).collect();
        s.push_str(&format!("\n[V]     marked: {}", marked.join(", ")));
    }
    s
}
