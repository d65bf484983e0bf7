//! An oracle with a known answer, for the tests of the strategies and of the grouped search.

use super::{Evaluation, Oracle, Scores};
use crate::error::Result;
use std::sync::atomic::{AtomicBool, Ordering};

/// Passes when every layer of `needed` is marked (a monotone criterion); error = the number
/// of needed layers missing. Ranks by sensitivity through its own evaluations, as the
/// built-in oracle does (one run per layer of `candidates`, counted in `calls`). With
/// `stop_after` (n, flag) it raises the flag at its n-th evaluation, as Ctrl-C would.
pub(crate) struct Planted {
    pub needed: Vec<usize>,
    pub candidates: Vec<usize>,
    pub calls: usize,
    pub parallel: bool,
    pub stop_after: Option<(usize, &'static AtomicBool)>,
}

impl Planted {
    pub fn new(needed: &[usize], candidates: &[usize]) -> Planted {
        Planted {
            needed: needed.to_vec(),
            candidates: candidates.to_vec(),
            calls: 0,
            parallel: false,
            stop_after: None,
        }
    }
}

impl Oracle for Planted {
    fn evaluate(&mut self, marked: &[usize]) -> Result<Evaluation> {
        self.calls += 1;
        if let Some((n, flag)) = self.stop_after {
            if self.calls >= n {
                flag.store(true, Ordering::SeqCst);
            }
        }
        let missing = self.needed.iter().filter(|n| !marked.contains(n)).count();
        Ok(Evaluation {
            passed: missing == 0,
            error: missing as f64,
            summary: format!("{missing} missing"),
        })
    }

    fn parallel(&self) -> bool {
        self.parallel
    }

    fn rank(&mut self) -> Result<Scores> {
        let mut scores = Scores::default();
        for &l in &self.candidates.clone() {
            let plan: Vec<usize> = self
                .candidates
                .iter()
                .copied()
                .filter(|&c| c != l)
                .collect();
            let e = self.evaluate(&plan)?;
            scores.by_layer.insert(l, e.error);
            if !e.passed {
                scores.failing_alone.push(l);
            }
        }
        Ok(scores)
    }
}
