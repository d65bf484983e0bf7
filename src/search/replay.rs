//! Debug replays (Polygraphy's `--save-debug-replay` / `--load-debug-replay`): the verdict of
//! every evaluated candidate, written after each evaluation, so an interrupted or crashed
//! search resumes without evaluating a known candidate again.
//!
//! The file is JSON: `{"mixprec_debug_replay": 1, "model": {...}, "settings": {...},
//! "evaluations": [{"marked": [layer names], "passed", "error", "summary"}]}`. `model` identifies
//! the model file (size and FNV-1a hash of its bytes) and `settings` holds everything that
//! decides a verdict (precisions, criterion, inputs, golden file, check command), as given by
//! the caller; a replay recorded for another model or with other settings is refused, naming
//! what differs. The search strategy is not a setting: a verdict holds for any strategy.

use super::{Evaluation, Oracle};
use crate::error::{Error, Result};
use crate::graph::Graph;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

const FORMAT_VERSION: u32 = 1;

/// Which model a replay belongs to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelId {
    pub bytes: u64,
    /// FNV-1a 64 of the file's bytes, hex.
    pub fnv1a: String,
}

impl ModelId {
    pub fn of_file(path: &Path) -> Result<ModelId> {
        let data = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in &data {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        Ok(ModelId {
            bytes: data.len() as u64,
            fnv1a: format!("{h:016x}"),
        })
    }
}

/// One recorded evaluation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    /// Marked layers by name, in node order.
    pub marked: Vec<String>,
    pub passed: bool,
    /// None when unknown (an external --check).
    pub error: Option<f64>,
    pub summary: String,
}

/// A debug replay: the model, the settings and the evaluations so far.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DebugReplay {
    pub mixprec_debug_replay: u32,
    pub model: ModelId,
    pub settings: BTreeMap<String, String>,
    pub evaluations: Vec<Record>,
}

impl DebugReplay {
    pub fn new(model: ModelId, settings: BTreeMap<String, String>) -> DebugReplay {
        DebugReplay {
            mixprec_debug_replay: FORMAT_VERSION,
            model,
            settings,
            evaluations: Vec::new(),
        }
    }

    /// Reads a replay and checks it belongs to `model` with `settings`.
    pub fn load(
        path: &Path,
        model: &ModelId,
        settings: &BTreeMap<String, String>,
    ) -> Result<DebugReplay> {
        let text = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let r: DebugReplay = serde_json::from_slice(&text)
            .map_err(|e| Error::data(path, format!("not a mixprec debug replay: {e}")))?;
        if r.mixprec_debug_replay != FORMAT_VERSION {
            return Err(Error::data(
                path,
                format!(
                    "debug replay format {} (this mixprec reads {FORMAT_VERSION})",
                    r.mixprec_debug_replay
                ),
            ));
        }
        if &r.model != model {
            return Err(Error::data(
                path,
                format!(
                    "the replay was recorded for another model ({} bytes, hash {}; this one: {} bytes, hash {})",
                    r.model.bytes, r.model.fnv1a, model.bytes, model.fnv1a
                ),
            ));
        }
        let mut diffs = Vec::new();
        for key in r.settings.keys().chain(settings.keys()) {
            let (a, b) = (r.settings.get(key), settings.get(key));
            if a != b
                && !diffs
                    .iter()
                    .any(|d: &String| d.starts_with(&format!("{key}:")))
            {
                diffs.push(format!(
                    "{key}: recorded '{}', now '{}'",
                    a.map_or("(none)", String::as_str),
                    b.map_or("(none)", String::as_str)
                ));
            }
        }
        if !diffs.is_empty() {
            return Err(Error::data(
                path,
                format!(
                    "the replay was recorded with other settings: {}",
                    diffs.join("; ")
                ),
            ));
        }
        Ok(r)
    }

    /// Writes the replay (temporary file + rename).
    pub fn save(&self, path: &Path) -> Result<()> {
        let json = serde_json::to_vec_pretty(self).map_err(|e| Error::data(path, e.to_string()))?;
        crate::data::write_atomic(path, &json)
    }
}

/// An oracle that answers known candidates from a replay and records new ones, saving the
/// replay after every evaluation.
pub struct ReplayOracle<'a> {
    inner: &'a mut dyn Oracle,
    graph: &'a Graph,
    replay: DebugReplay,
    known: HashMap<Vec<usize>, Evaluation>,
    save_to: Option<PathBuf>,
    /// Candidates answered from the replay.
    pub replayed: usize,
    /// The search's stop flag: verdicts that come in after it is set are not recorded.
    stop: Option<&'a std::sync::atomic::AtomicBool>,
}

impl<'a> ReplayOracle<'a> {
    /// `replay` holds the known evaluations (a loaded one, or a new empty one); a marked name
    /// the graph lacks is an error.
    pub fn new(
        inner: &'a mut dyn Oracle,
        graph: &'a Graph,
        replay: DebugReplay,
        save_to: Option<PathBuf>,
    ) -> Result<ReplayOracle<'a>> {
        let index: HashMap<&str, usize> = graph
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i))
            .collect();
        let mut known = HashMap::new();
        for r in &replay.evaluations {
            let mut key = Vec::with_capacity(r.marked.len());
            for n in &r.marked {
                key.push(*index.get(n.as_str()).ok_or_else(|| {
                    Error::Invalid(format!("debug replay: layer '{n}' is not in the model"))
                })?);
            }
            key.sort_unstable();
            known.insert(
                key,
                Evaluation {
                    passed: r.passed,
                    error: r.error.unwrap_or(f64::NAN),
                    summary: format!("(replayed) {}", r.summary),
                },
            );
        }
        Ok(ReplayOracle {
            inner,
            graph,
            replay,
            known,
            save_to,
            replayed: 0,
            stop: None,
        })
    }

    /// Records nothing once `stop` is set: an evaluation running when the user interrupts
    /// may have been cut short (Ctrl-C reaches a `--check` command too, which then fails),
    /// and a resumed search would trust its verdict. The search drops it too.
    pub fn stopping_on(mut self, stop: &'a std::sync::atomic::AtomicBool) -> Self {
        self.stop = Some(stop);
        self
    }

    fn interrupted(&self) -> bool {
        stopped(self.stop)
    }

    /// The replay with every evaluation so far.
    pub fn replay(&self) -> &DebugReplay {
        &self.replay
    }
}

impl ReplayOracle<'_> {
    /// Records a new evaluation of `key` (sorted), unless the search was interrupted.
    fn record(&mut self, key: Vec<usize>, e: &Evaluation) {
        if self.interrupted() {
            return;
        }
        record_into(self.graph, &mut self.replay, &mut self.known, key, e);
    }

    fn save(&self) -> Result<()> {
        match &self.save_to {
            Some(p) => self.replay.save(p),
            None => Ok(()),
        }
    }
}

fn stopped(stop: Option<&std::sync::atomic::AtomicBool>) -> bool {
    stop.is_some_and(|s| s.load(std::sync::atomic::Ordering::SeqCst))
}

/// Adds the evaluation of `key` (sorted) to the replay and to the known ones.
fn record_into(
    graph: &Graph,
    replay: &mut DebugReplay,
    known: &mut HashMap<Vec<usize>, Evaluation>,
    key: Vec<usize>,
    e: &Evaluation,
) {
    replay.evaluations.push(Record {
        marked: key.iter().map(|&i| graph.nodes[i].name.clone()).collect(),
        passed: e.passed,
        error: e.error.is_finite().then_some(e.error),
        summary: e.summary.clone(),
    });
    known.insert(key, e.clone());
}

fn sorted(marked: &[usize]) -> Vec<usize> {
    let mut key = marked.to_vec();
    key.sort_unstable();
    key
}

impl Oracle for ReplayOracle<'_> {
    fn evaluate(&mut self, marked: &[usize]) -> Result<Evaluation> {
        let key = sorted(marked);
        if let Some(e) = self.known.get(&key) {
            self.replayed += 1;
            return Ok(e.clone());
        }
        let e = self.inner.evaluate(marked)?;
        self.record(key, &e);
        self.save()?;
        Ok(e)
    }

    /// Known sets are answered from the replay, the others go to the inner oracle as one
    /// batch; the replay is saved after each new verdict, as it arrives (workers elsewhere
    /// answer one by one: a driver that dies mid-batch keeps what they finished).
    fn evaluate_batch(&mut self, sets: &[Vec<usize>]) -> Vec<Result<Evaluation>> {
        let mut out: Vec<Option<Result<Evaluation>>> = Vec::with_capacity(sets.len());
        let mut unknown = Vec::new();
        for s in sets {
            match self.known.get(&sorted(s)) {
                Some(e) => {
                    self.replayed += 1;
                    out.push(Some(Ok(e.clone())));
                }
                None => {
                    unknown.push(s.clone());
                    out.push(None);
                }
            }
        }
        if unknown.is_empty() {
            return out.into_iter().flatten().collect();
        }
        // Each new verdict is recorded and the replay saved as it arrives.
        let ReplayOracle {
            inner,
            graph,
            replay,
            known,
            save_to,
            stop,
            ..
        } = self;
        let mut saved = Ok(());
        let fresh = inner.evaluate_batch_each(&unknown, &mut |k, r| {
            if let (Ok(e), Some(set), true) = (r, unknown.get(k), saved.is_ok()) {
                if !stopped(*stop) {
                    record_into(graph, replay, known, sorted(set), e);
                    if let Some(p) = save_to.as_deref() {
                        saved = replay.save(p);
                    }
                }
            }
        });
        let mut fresh = fresh.into_iter();
        for slot in out.iter_mut().filter(|o| o.is_none()) {
            let r = fresh
                .next()
                .unwrap_or_else(|| Err(Error::Invalid("an oracle answered a batch short".into())));
            *slot = Some(r);
        }
        if let Err(e) = saved {
            // Without a saved replay the search must not go on as if it had one: the error
            // goes to the needed (first) set, which ends the search.
            let mut e = Some(e);
            return (0..sets.len())
                .map(|_| {
                    Err(e.take().unwrap_or_else(|| {
                        Error::Invalid("the debug replay could not be saved".into())
                    }))
                })
                .collect();
        }
        out.into_iter().flatten().collect()
    }

    fn parallel(&self) -> bool {
        self.inner.parallel()
    }

    fn rank(&mut self) -> Result<super::Scores> {
        self.inner.rank()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::chain;

    struct Counting {
        calls: usize,
    }

    impl Oracle for Counting {
        fn evaluate(&mut self, marked: &[usize]) -> Result<Evaluation> {
            self.calls += 1;
            Ok(Evaluation {
                passed: marked.len() >= 2,
                error: marked.len() as f64,
                summary: format!("{} marked", marked.len()),
            })
        }
    }

    fn settings(fp: &str) -> BTreeMap<String, String> {
        [("precision".to_string(), fp.to_string())].into()
    }

    #[test]
    fn known_candidates_are_not_evaluated_again_and_others_are_refused() {
        let g = chain(4, 2);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replay.json");
        let id = ModelId {
            bytes: 10,
            fnv1a: "ab".into(),
        };
        let mut inner = Counting { calls: 0 };
        {
            let r = DebugReplay::new(id.clone(), settings("--fp16"));
            let mut o = ReplayOracle::new(&mut inner, &g, r, Some(path.clone())).unwrap();
            o.evaluate(&[0, 1]).unwrap();
            o.evaluate(&[2]).unwrap();
        }
        assert_eq!(inner.calls, 2);
        let loaded = DebugReplay::load(&path, &id, &settings("--fp16")).unwrap();
        assert_eq!(loaded.evaluations.len(), 2);
        let mut inner2 = Counting { calls: 0 };
        let mut o = ReplayOracle::new(&mut inner2, &g, loaded, None).unwrap();
        let e = o.evaluate(&[1, 0]).unwrap();
        assert!(e.passed && e.summary.starts_with("(replayed)"));
        assert!(!o.evaluate(&[2]).unwrap().passed);
        o.evaluate(&[3]).unwrap();
        assert_eq!(o.replayed, 2);
        drop(o);
        assert_eq!(inner2.calls, 1);

        let e = DebugReplay::load(&path, &id, &settings("--int8"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("precision: recorded '--fp16', now '--int8'"),
            "{e}"
        );
        let other = ModelId {
            bytes: 11,
            fnv1a: "ab".into(),
        };
        let e = DebugReplay::load(&path, &other, &settings("--fp16"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("another model"), "{e}");
    }

    #[test]
    fn nothing_is_recorded_after_an_interrupt() {
        let g = chain(4, 2);
        let mut inner = Counting { calls: 0 };
        let id = ModelId {
            bytes: 1,
            fnv1a: "0".into(),
        };
        let stop = std::sync::atomic::AtomicBool::new(false);
        let replay = DebugReplay::new(id, settings("a"));
        let mut o = ReplayOracle::new(&mut inner, &g, replay, None)
            .unwrap()
            .stopping_on(&stop);
        o.evaluate(&[0]).unwrap();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        o.evaluate(&[1]).unwrap();
        o.evaluate_batch(&[vec![2], vec![3]]);
        assert_eq!(o.replay().evaluations.len(), 1);
    }

    #[test]
    fn batches_are_answered_from_the_replay_and_recorded() {
        let g = chain(4, 2);
        let mut inner = Counting { calls: 0 };
        let id = ModelId {
            bytes: 1,
            fnv1a: "0".into(),
        };
        let mut replay = DebugReplay::new(id, settings("a"));
        replay.evaluations.push(Record {
            marked: vec![g.nodes[1].name.clone()],
            passed: true,
            error: None,
            summary: "known".into(),
        });
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replay.json");
        let mut o = ReplayOracle::new(&mut inner, &g, replay, Some(path.clone())).unwrap();
        let r = o.evaluate_batch(&[vec![0], vec![1], vec![2, 3]]);
        assert_eq!(r.len(), 3);
        assert!(r[1].as_ref().unwrap().summary.contains("(replayed) known"));
        assert_eq!(o.replayed, 1);
        assert_eq!(o.replay().evaluations.len(), 3);
        drop(o);
        assert_eq!(inner.calls, 2);
        let saved = std::fs::read_to_string(&path).unwrap();
        assert!(saved.contains(&g.nodes[3].name), "{saved}");
    }
}
