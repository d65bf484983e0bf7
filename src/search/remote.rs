//! Candidates judged somewhere else: other processes or other machines, each holding the
//! model and the prepared plans of the same job (the Python API's `executor=`: a
//! `concurrent.futures` executor or a Ray cluster, docs/scale-out.md). The driver's search
//! is unchanged: a batch of candidates (the one the search needs and the ones it evaluates
//! with it, `--jobs`) goes to [`Remote::evaluate_batch`] and comes back as one result per
//! candidate, in the batch's order, whatever order the workers finished in; so the answer
//! and the trials are those of the local search. Two jobs send candidates out:
//!
//! - `debug precision`: a candidate is a marked set ([`MarkedSet`], judged by
//!   [`RemoteOracle`]); a worker's side is [`crate::jobs::search_worker::Worker`].
//! - `plan`: a candidate is a point of the format walk ([`PlanPoint`], judged by
//!   [`RemotePlanJudge`]); a worker's side is [`crate::jobs::plan_worker::PlanWorker`].
//!
//! The library knows nothing of how candidates travel: the caller implements [`Remote`]
//! (python/src/lib.rs over python/mixprec/_scale.py).

use super::formats::PlanJudge;
use super::{Evaluation, Oracle};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::precision::plan::PrecisionPlan;
use crate::precision::Precision;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A `debug precision` candidate: its marked node indices, ascending.
pub type MarkedSet = Vec<usize>;

/// Judges batches of candidates (`C`: a [`MarkedSet`] or a [`PlanPoint`]) elsewhere.
pub trait Remote<C>: Send + Sync {
    /// Judges `candidates` at the same time; one result per candidate, in order, each also
    /// told to `done` (its position, the result) as soon as it is known, in whatever order
    /// the workers finish (the debug replay saves each then). A candidate whose workers died
    /// more often than the remote retries is an error.
    fn evaluate_batch(
        &self,
        candidates: &[C],
        done: &mut dyn FnMut(usize, &Result<Evaluation>),
    ) -> Vec<Result<Evaluation>>;
}

/// `remote`'s results for `candidates`, checked to be one per candidate; each error names its
/// candidate (`named`).
fn in_order<C>(
    remote: &dyn Remote<C>,
    candidates: &[C],
    done: &mut dyn FnMut(usize, &Result<Evaluation>),
    named: &dyn Fn(&C, Error) -> Error,
) -> Vec<Result<Evaluation>> {
    let results = remote.evaluate_batch(candidates, done);
    if results.len() != candidates.len() {
        let n = results.len();
        return candidates
            .iter()
            .map(|c| {
                Err(named(
                    c,
                    Error::Invalid(format!(
                        "the remote workers answered {n} result(s) for a batch of {}",
                        candidates.len()
                    )),
                ))
            })
            .collect();
    }
    results
        .into_iter()
        .zip(candidates)
        .map(|(r, c)| r.map_err(|e| named(c, e)))
        .collect()
}

/// A [`Remote`] of marked sets shared by `debug precision`'s configuration and its search.
#[derive(Clone)]
pub struct RemoteJudge(pub Arc<dyn Remote<MarkedSet>>);

impl std::fmt::Debug for RemoteJudge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RemoteJudge(..)")
    }
}

/// The driver's oracle over a [`Remote`]: it evaluates batches at the same time (so the
/// search speculates with `--jobs` > 1) and names a failed candidate's layers in its error.
pub struct RemoteOracle<'a> {
    pub remote: Arc<dyn Remote<MarkedSet>>,
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
        in_order(&*self.remote, sets, done, &|s, e| self.named(s, e))
    }

    fn parallel(&self) -> bool {
        true
    }
}

/// A `plan` candidate as it travels: the layers whose precision is not the high one, with
/// their precision (ascending by node index; every other layer is in the high precision),
/// whether to judge it outside the worker's value cache (the chosen point's verification),
/// and whether the check judges it instead of the emulation (`plan`'s `--check` on the
/// front's points: the worker exports the point and runs the check on it). Never a model:
/// the worker builds the plan over its own copy of the graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanPoint {
    pub layers: Vec<(usize, Precision)>,
    pub uncached: bool,
    pub check: bool,
}

impl PlanPoint {
    /// `plan`'s layers below `high`. A plan with more than one precision per layer (subgraph
    /// precisions, fusion regions) is refused: a point could not carry it. Its fusion model
    /// is not a point's but the run's, which every worker has from the settings and sets on
    /// the plans it builds (their regions derived there from the point's precisions).
    pub fn of(plan: &PrecisionPlan, high: Precision, uncached: bool) -> Result<PlanPoint> {
        if !plan.inner.is_empty() || !plan.regions.is_empty() {
            return Err(Error::Invalid(
                "a plan with subgraph precisions or fusion regions cannot be judged by remote \
                 workers (a point carries one precision per layer)"
                    .into(),
            ));
        }
        Ok(PlanPoint {
            layers: plan
                .layers
                .iter()
                .enumerate()
                .filter(|&(_, &p)| p != high)
                .map(|(i, &p)| (i, p))
                .collect(),
            uncached,
            check: false,
        })
    }

    /// The plan of a graph of `nodes` layers this point describes, or the error that names
    /// a layer it does not have.
    pub fn plan(&self, nodes: usize, high: Precision) -> Result<PrecisionPlan> {
        let mut layers = vec![high; nodes];
        for &(i, p) in &self.layers {
            *layers.get_mut(i).ok_or_else(|| {
                Error::Invalid(format!(
                    "a plan point names layer {i} of a graph with {nodes} (a worker of another model?)"
                ))
            })? = p;
        }
        Ok(PrecisionPlan::from_layers(layers))
    }
}

/// Starts `plan`'s workers once the driver has calibrated: each worker is given the driver's
/// ranges (`amax`), so no worker calibrates again.
pub trait PlanWorkers: Send + Sync {
    fn start(&self, amax: Option<&BTreeMap<String, f32>>) -> Result<Arc<dyn Remote<PlanPoint>>>;
}

/// The [`PlanWorkers`] of `plan`'s configuration.
#[derive(Clone)]
pub struct RemotePlanWorkers(pub Arc<dyn PlanWorkers>);

impl std::fmt::Debug for RemotePlanWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RemotePlanWorkers(..)")
    }
}

/// `plan`'s judge over a [`Remote`]: every point (the sensitivity pass's, the walk's, the
/// baselines') is judged by a worker, and so are the chosen point's verification (outside
/// that worker's cache) and the check's points ([`RemotePlanJudge::check`]); a failed
/// point's error names its layers.
pub struct RemotePlanJudge<'a> {
    pub remote: Arc<dyn Remote<PlanPoint>>,
    pub graph: &'a Graph,
    pub high: Precision,
}

impl RemotePlanJudge<'_> {
    fn named(&self, point: &PlanPoint, e: Error) -> Error {
        let layers = if point.layers.is_empty() {
            "none".to_string()
        } else {
            point
                .layers
                .iter()
                .map(|&(i, p)| format!("{}: {}", self.graph.nodes[i].name, p.name()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        Error::Invalid(format!(
            "the plan point with {} layer(s) below {} ({layers}): {e}",
            point.layers.len(),
            self.high.name()
        ))
    }

    /// The check's verdicts on `plans` (`plan`'s `--check` or the caller's function), each
    /// run by a worker on the point it exports with the driver's ranges.
    pub fn check(&self, plans: &[PrecisionPlan]) -> Vec<Result<Evaluation>> {
        self.send(plans, false, true)
    }

    fn send(
        &self,
        plans: &[PrecisionPlan],
        uncached: bool,
        check: bool,
    ) -> Vec<Result<Evaluation>> {
        let mut points = Vec::with_capacity(plans.len());
        for plan in plans {
            match PlanPoint::of(plan, self.high, uncached) {
                Ok(p) => points.push(PlanPoint { check, ..p }),
                Err(e) => {
                    return plans
                        .iter()
                        .map(|_| Err(Error::Invalid(e.to_string())))
                        .collect()
                }
            }
        }
        in_order(&*self.remote, &points, &mut |_, _| {}, &|p, e| {
            self.named(p, e)
        })
    }
}

impl PlanJudge for RemotePlanJudge<'_> {
    fn judge(&mut self, plans: &[PrecisionPlan]) -> Vec<Result<Evaluation>> {
        self.send(plans, false, false)
    }

    fn verify(&mut self, plan: &PrecisionPlan) -> Result<Evaluation> {
        self.send(std::slice::from_ref(plan), true, false)
            .pop()
            .unwrap_or_else(|| {
                Err(Error::Invalid(
                    "the remote workers answered no result".into(),
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::precision::fusion::FusionModel;
    use std::sync::Mutex;

    /// Answers in reverse completion order (the last set first), as a pool of workers may.
    struct Reversed {
        batches: Mutex<Vec<usize>>,
    }

    impl Remote<MarkedSet> for Reversed {
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
        let g = crate::search::check::tests::three_layers();
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

    /// Answers every point by how many layers it lowers, failing the one named `lost`.
    struct Points {
        seen: Mutex<Vec<PlanPoint>>,
    }

    impl Remote<PlanPoint> for Points {
        fn evaluate_batch(
            &self,
            points: &[PlanPoint],
            done: &mut dyn FnMut(usize, &Result<Evaluation>),
        ) -> Vec<Result<Evaluation>> {
            self.seen.lock().unwrap().extend(points.iter().cloned());
            points
                .iter()
                .enumerate()
                .map(|(k, p)| {
                    let r = if p.layers.len() == 2 {
                        Err(Error::Invalid("3 worker(s) died evaluating it".into()))
                    } else {
                        Ok(Evaluation {
                            passed: p.layers.len() < 2,
                            error: p.layers.len() as f64,
                            summary: String::new(),
                        })
                    };
                    done(k, &r);
                    r
                })
                .collect()
        }
    }

    #[test]
    fn a_plan_point_carries_the_layers_below_the_high_precision_and_back() {
        use Precision::*;
        let plan = PrecisionPlan::from_layers(vec![Float32, Int8, Float32, Float16]);
        let point = PlanPoint::of(&plan, Float32, false).unwrap();
        assert_eq!(point.layers, vec![(1, Int8), (3, Float16)]);
        assert_eq!(point.plan(4, Float32).unwrap(), plan);
        let e = point.plan(2, Float32).unwrap_err().to_string();
        assert!(e.contains("layer 3 of a graph with 2"), "{e}");
        // The fusion model is the run's, not the point's: each worker sets its own.
        let mut fused = plan.clone();
        fused.fusion = FusionModel::TensorRt;
        assert_eq!(PlanPoint::of(&fused, Float32, false).unwrap(), point);
    }

    #[test]
    fn plan_points_go_out_with_their_verification_flag_and_errors_name_them() {
        use Precision::*;
        let g = crate::search::check::tests::three_layers();
        let remote = Arc::new(Points {
            seen: Mutex::new(Vec::new()),
        });
        let mut judge = RemotePlanJudge {
            remote: remote.clone(),
            graph: &g,
            high: Float32,
        };
        let one = PrecisionPlan::from_layers(vec![Float16, Float32, Float32]);
        let two = PrecisionPlan::from_layers(vec![Float32, Int8, Float16]);
        let r = judge.judge(&[one.clone(), two]);
        assert!(r[0].as_ref().unwrap().passed);
        let e = r[1].as_ref().unwrap_err().to_string();
        assert!(
            e.contains("the plan point with 2 layer(s) below float32 (b: int8, c: float16)")
                && e.contains("worker(s) died evaluating it"),
            "{e}"
        );
        assert!(judge.verify(&one).unwrap().passed);
        let checked = judge.check(std::slice::from_ref(&one));
        assert!(checked[0].as_ref().unwrap().passed);
        let seen = remote.seen.lock().unwrap();
        let flags: Vec<(bool, bool)> = seen.iter().map(|p| (p.uncached, p.check)).collect();
        assert_eq!(
            flags,
            vec![(false, false), (false, false), (true, false), (false, true)]
        );
        assert_eq!(seen[3].layers, vec![(0, Float16)]);
    }
}
