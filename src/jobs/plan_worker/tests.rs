//! `plan` with its points judged by workers (in-process [`PlanWorker`]s standing in for an
//! executor's) against the same plan judged locally.

use super::*;
use crate::error::Error;
use crate::jobs::plan::tests::{planted_model, run_plan, tempdir};
use crate::precision::Precision;
use crate::search::remote::{PlanWorkers, Remote, RemotePlanWorkers};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The plan tests' planted model set-up, with its three formats.
fn config(model: PathBuf) -> Config {
    crate::jobs::plan::tests::config(model, "fp8,int8,fp16")
}

/// Workers of one process: the k-th point of a batch on worker k % n, all at once, each
/// verdict told as it finishes, in reverse order (as a pool may finish them).
struct Pool {
    workers: Vec<PlanWorker>,
    /// Per worker, the points it judged (uncached ones counted apart).
    judged: Mutex<Vec<(usize, usize)>>,
}

impl Remote<PlanPoint> for Pool {
    fn evaluate_batch(
        &self,
        points: &[PlanPoint],
        done: &mut dyn FnMut(usize, &Result<Evaluation>),
    ) -> Vec<Result<Evaluation>> {
        let n = self.workers.len();
        let mut results: Vec<(usize, Result<Evaluation>)> = std::thread::scope(|s| {
            let handles: Vec<_> = points
                .iter()
                .enumerate()
                .map(|(k, p)| {
                    let w = &self.workers[k % n];
                    s.spawn(move || (k, w.evaluate_batch(vec![p.clone()]).pop().unwrap()))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut judged = self.judged.lock().unwrap();
        for (k, p) in points.iter().enumerate() {
            let slot = &mut judged[k % n];
            if p.uncached {
                slot.1 += 1;
            } else {
                slot.0 += 1;
            }
        }
        for (k, r) in results.iter().rev() {
            done(*k, r);
        }
        results.sort_by_key(|(k, _)| *k);
        results.into_iter().map(|(_, r)| r).collect()
    }
}

/// Starts `n` workers from the driver's configuration and ranges; keeps what it started.
struct Starter {
    config: Config,
    n: usize,
    ranges: Mutex<Vec<Option<BTreeMap<String, f32>>>>,
    pool: Mutex<Option<Arc<Pool>>>,
}

impl PlanWorkers for Starter {
    fn start(&self, amax: Option<&BTreeMap<String, f32>>) -> Result<Arc<dyn Remote<PlanPoint>>> {
        self.ranges.lock().unwrap().push(amax.cloned());
        let workers = (0..self.n)
            .map(|_| {
                let v = worker_config(self.config.clone()).validate()?;
                PlanWorker::start(v, amax.cloned())
            })
            .collect::<Result<Vec<_>>>()?;
        let pool = Arc::new(Pool {
            workers,
            judged: Mutex::new(vec![(0, 0); self.n]),
        });
        *self.pool.lock().unwrap() = Some(pool.clone());
        Ok(pool)
    }
}

#[test]
fn points_judged_by_workers_give_the_local_plan() {
    let dir = tempdir("same");
    let model = planted_model(&dir);
    let local = run_plan(config(model.clone()));
    let local_jobs = run_plan(Config {
        jobs: 3,
        ..config(model.clone())
    });
    assert_eq!(
        local.result_json().unwrap(),
        local_jobs.result_json().unwrap()
    );
    for (n, jobs) in [(1, 1), (3, 3), (2, 4)] {
        let starter = Arc::new(Starter {
            config: config(model.clone()),
            n,
            ranges: Mutex::new(Vec::new()),
            pool: Mutex::new(None),
        });
        let remote = run_plan(Config {
            jobs,
            remote: Some(RemotePlanWorkers(starter.clone())),
            ..config(model.clone())
        });
        assert_eq!(
            String::from_utf8(remote.result_json().unwrap()).unwrap(),
            String::from_utf8(local.result_json().unwrap()).unwrap(),
            "{n} worker(s), jobs {jobs}"
        );
        // Started once, with the driver's own ranges (the ones its export uses).
        let ranges = starter.ranges.lock().unwrap();
        assert_eq!(ranges.len(), 1);
        assert!(ranges[0].is_some());
        assert_eq!(ranges[0], remote.amax);
        // Every evaluation ran on a worker: the sensitivity pass, the baselines, the walk,
        // the descent and the verification (outside the cache).
        let pool = starter.pool.lock().unwrap().clone().unwrap();
        let judged = pool.judged.lock().unwrap();
        let cached: usize = judged.iter().map(|j| j.0).sum();
        let uncached: usize = judged.iter().map(|j| j.1).sum();
        assert_eq!(uncached, 1, "{judged:?}");
        assert_eq!(cached + uncached, remote.front.evaluations);
        assert!(judged.iter().all(|j| j.0 > 0), "{judged:?}");
    }
}

#[test]
fn a_worker_judges_with_the_ranges_it_is_given() {
    let dir = tempdir("ranges");
    let model = planted_model(&dir);
    let local = run_plan(config(model.clone()));
    let amax = local.amax.clone().unwrap();
    // The chosen point's plan passes with the driver's ranges; ranges 1000 times too wide
    // round its int8/fp8 layers' inputs to nothing and fail it.
    let chosen = PlanPoint::of(local.chosen_plan().unwrap(), Precision::Float32, false).unwrap();
    assert!(chosen
        .layers
        .iter()
        .any(|&(_, p)| p == Precision::Int8 || p == Precision::Fp8E4M3));
    let judge = |amax: BTreeMap<String, f32>| {
        let v = worker_config(config(model.clone())).validate().unwrap();
        let w = PlanWorker::start(v, Some(amax)).unwrap();
        w.evaluate_batch(vec![chosen.clone()])
            .pop()
            .unwrap()
            .unwrap()
    };
    assert!(judge(amax.clone()).passed);
    let wide = amax.iter().map(|(k, v)| (k.clone(), v * 1000.0)).collect();
    assert!(!judge(wide).passed);
}

#[test]
fn a_worker_that_cannot_prepare_says_why_and_a_foreign_point_is_an_error() {
    let dir = tempdir("errors");
    let v = worker_config(config(dir.join("missing.onnx")))
        .validate()
        .unwrap();
    let e = PlanWorker::start(v, None).err().unwrap().to_string();
    assert!(e.contains("missing.onnx"), "{e}");
    let model = planted_model(&dir);
    let v = worker_config(config(model)).validate().unwrap();
    let w = PlanWorker::start(v, None).unwrap();
    let foreign = PlanPoint {
        layers: vec![(99, Precision::Float16)],
        uncached: false,
        check: false,
    };
    let r: Result<Evaluation> = w.evaluate_batch(vec![foreign]).pop().unwrap();
    let e = r.unwrap_err();
    assert!(
        matches!(e, Error::Invalid(_)) && e.to_string().contains("layer 99"),
        "{e}"
    );
}

/// The plan set-up with a check function that fails every point with an fp8 layer and
/// records the thread each of its calls ran on.
fn checked(model: PathBuf, calls: Arc<Mutex<Vec<String>>>) -> Config {
    use crate::search::check::{Candidate, UserCheck};
    Config {
        check: Some(crate::jobs::check::CheckOptions {
            user: Some(UserCheck(Arc::new(move |c: &Candidate| {
                let thread = std::thread::current().name().unwrap_or("").to_string();
                calls.lock().unwrap().push(thread);
                // The point's model is the one `plan -o` would write for it.
                assert!(!c.model_bytes()?.is_empty());
                Ok(!c.layer_precisions.iter().any(|(_, p)| p == "fp8e4m3"))
            }))),
            ..Default::default()
        }),
        ..config(model)
    }
}

#[test]
fn the_check_runs_on_the_workers_and_gives_the_local_verdicts() {
    let dir = tempdir("check");
    let model = planted_model(&dir);
    let local_calls: Arc<Mutex<Vec<String>>> = Arc::default();
    let local = run_plan(checked(model.clone(), local_calls.clone()));
    let verdicts: Vec<bool> = local
        .front
        .points
        .iter()
        .filter_map(|p| p.check.as_ref().map(|c| c.passed))
        .collect();
    assert!(!verdicts.is_empty());
    assert_eq!(local_calls.lock().unwrap().len(), verdicts.len());
    assert!(local_calls
        .lock()
        .unwrap()
        .iter()
        .all(|t| t != "mixprec-plan-worker"));
    for (n, jobs) in [(1, 1), (2, 3)] {
        let calls: Arc<Mutex<Vec<String>>> = Arc::default();
        let starter = Arc::new(Starter {
            config: checked(model.clone(), calls.clone()),
            n,
            ranges: Mutex::new(Vec::new()),
            pool: Mutex::new(None),
        });
        let remote = run_plan(Config {
            jobs,
            remote: Some(RemotePlanWorkers(starter.clone())),
            ..checked(model.clone(), calls.clone())
        });
        assert_eq!(
            String::from_utf8(remote.result_json().unwrap()).unwrap(),
            String::from_utf8(local.result_json().unwrap()).unwrap(),
            "{n} worker(s), jobs {jobs}"
        );
        // Every check ran on a worker's thread, once per checked point.
        let calls = calls.lock().unwrap();
        assert_eq!(calls.len(), verdicts.len(), "{calls:?}");
        assert!(
            calls.iter().all(|t| t == "mixprec-plan-worker"),
            "{calls:?}"
        );
    }
}
