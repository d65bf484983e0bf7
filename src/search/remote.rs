//! Candidates judged somewhere else: other processes or other machines, each holding the
//! model and the prepared plans of the same search (the Python API's `executor=`: a
//! `concurrent.futures` executor or a Ray cluster, docs/scale-out.md). The driver's search
//! is unchanged: a batch of marked sets (the one the strategy needs and the ones it
//! speculates on, `--jobs`) goes to [`Remote::evaluate_batch`] and comes back as one result
//! per set, in the batch's order, whatever order the workers finished in; so the answer and
//! the trials are those of the local search. The library knows nothing of how the sets
//! travel: the caller implements [`Remote`] (python/src/lib.rs over python/mixprec/_scale.py);
//! a worker's side is [`crate::jobs::search_worker::Worker`].

use super::{Evaluation, Oracle};
use crate::error::{Error, Result};
use crate::graph::Graph;
use std::sync::Arc;

/// Judges batches of marked sets elsewhere.
pub trait Remote: Send + Sync {
    /// Judges `sets` (marked node indices, ascending) at the same time; one result per set,
    /// in order, each also told to `done` (its position, the result) as soon as it is known,
    /// in whatever order the workers finish (the debug replay saves each then). A set whose
    /// workers died more often than the remote retries is an error.
    fn evaluate_batch(
        &self,
        sets: &[Vec<usize>],
        done: &mut dyn FnMut(usize, &Result<Evaluation>),
    ) -> Vec<Result<Evaluation>>;
}

/// A [`Remote`] shared by the job's configuration and its search.
#[derive(Clone)]
pub struct RemoteJudge(pub Arc<dyn Remote>);

impl std::fmt::Debug for RemoteJudge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RemoteJudge(..)")
    }
}

/// The driver's oracle over a [`Remote`]: it evaluates batches at the same time (so the
/// search speculates with `--jobs` > 1) and names a failed candidate's layers in its error.
pub struct RemoteOracle<'a> {
    pub remote: Arc<dyn Remote>,
    pub graph: &'a Graph,
    /// Whether the workers judge as the local oracle would (the built-in comparison or the
    /// user's criterion); false when they run a `--check` command, whose verdicts the local
    /// sensitivity ranking's cannot stand for.
    pub same_criterion: bool,
}

impl RemoteOracle<'_> {
    fn named(&self, marked: &[usize], e: Error) -> Error {
        let layers = if marked.is_empty() {
            "no layer".to_string()
        } else {
            super::report::names(self.graph, marked)
        };
        Error::Invalid(format!(
            "the candidate with {} marked layer(s) ({layers}): {e}",
            marked.len()
        ))
    }
}

impl Oracle for RemoteOracle<'_> {
    fn evaluate(&mut self, marked: &[usize]) -> Result<Evaluation> {
        let mut results = self.evaluate_batch(&[marked.to_vec()]);
        results.pop().unwrap_or_else(|| {
            Err(Error::Invalid(
                "the remote workers answered no result".into(),
            ))
        })
    }

    fn evaluate_batch(&mut self, sets: &[Vec<usize>]) -> Vec<Result<Evaluation>> {
        self.evaluate_batch_each(sets, &mut |_, _| {})
    }

    fn evaluate_batch_each(
        &mut self,
        sets: &[Vec<usize>],
        done: &mut dyn FnMut(usize, &Result<Evaluation>),
    ) -> Vec<Result<Evaluation>> {
        let results = self.remote.evaluate_batch(sets, done);
        if results.len() != sets.len() {
            let n = results.len();
            return sets
                .iter()
                .map(|s| {
                    Err(self.named(
                        s,
                        Error::Invalid(format!(
                            "the remote workers answered {n} result(s) for a batch of {}",
                            sets.len()
                        )),
                    ))
                })
                .collect();
        }
        results
            .into_iter()
            .zip(sets)
            .map(|(r, s)| r.map_err(|e| self.named(s, e)))
            .collect()
    }

    fn parallel(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::{graph, node, vi};
    use std::sync::Mutex;

    /// Answers in reverse completion order (the last set first), as a pool of workers may.
    struct Reversed {
        batches: Mutex<Vec<usize>>,
    }

    impl Remote for Reversed {
        fn evaluate_batch(
            &self,
            sets: &[Vec<usize>],
            done: &mut dyn FnMut(usize, &Result<Evaluation>),
        ) -> Vec<Result<Evaluation>> {
            self.batches.lock().unwrap().push(sets.len());
            let mut done: Vec<(usize, Result<Evaluation>)> = sets
                .iter()
                .enumerate()
                .rev()
                .map(|(k, s)| {
                    let r = if s == &[1, 2] {
                        Err(Error::Invalid("worker lost 3 times".into()))
                    } else {
                        Ok(Evaluation {
                            passed: s.len() >= 2,
                            error: s.len() as f64,
                            summary: format!("{} marked", s.len()),
                        })
                    };
                    done(k, &r);
                    (k, r)
                })
                .collect();
            // Results are keyed by position, never by completion order.
            done.sort_by_key(|(k, _)| *k);
            done.into_iter().map(|(_, r)| r).collect()
        }
    }

    #[test]
    fn results_come_back_in_the_batch_order_and_errors_name_the_layers() {
        let g = graph(
            vec![
                node("a", "Relu", &["x"], &["y0"]),
                node("b", "Relu", &["y0"], &["y1"]),
                node("c", "Relu", &["y1"], &["y"]),
            ],
            vec![vi("x", &[1])],
            vec![vi("y", &[1])],
            vec![],
        );
        let remote = Arc::new(Reversed {
            batches: Mutex::new(Vec::new()),
        });
        let mut oracle = RemoteOracle {
            remote: remote.clone(),
            graph: &g,
            same_criterion: true,
        };
        assert!(oracle.parallel());
        let mut finished = Vec::new();
        let r = oracle.evaluate_batch_each(&[vec![0], vec![0, 1], vec![0, 1, 2]], &mut |k, _| {
            finished.push(k)
        });
        // Each verdict as it finished; the results in the batch's order.
        assert_eq!(finished, vec![2, 1, 0]);
        let passed: Vec<bool> = r.iter().map(|e| e.as_ref().unwrap().passed).collect();
        assert_eq!(passed, vec![false, true, true]);
        assert_eq!(r[2].as_ref().unwrap().summary, "3 marked");
        let e = oracle.evaluate(&[1, 2]).unwrap_err().to_string();
        assert!(
            e.contains("2 marked layer(s) (b, c)") && e.contains("worker lost 3 times"),
            "{e}"
        );
        assert_eq!(*remote.batches.lock().unwrap(), vec![3, 1]);
    }
}
