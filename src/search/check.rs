//! The external oracle (Polygraphy's `--check`): each candidate is written as a
//! mixed-precision ONNX model and handed to a user command; its exit status (and optionally a
//! regex over its output) decides pass or fail. This is how a user with real TensorRT drives
//! the search: with TensorRT 11 (strongly typed only) `--check trtexec --onnx={model}
//! --stronglyTyped ...` or `--check polygraphy run {model} --trt --strongly-typed ...`; with
//! TensorRT <= 10 also `--check trtexec --onnx=model.onnx --fp16
//! --layerPrecisions={trtexec_layer_precisions} --precisionConstraints=obey ...`.
//!
//! Placeholders in the command's arguments:
//! - `{model}`: the candidate as an ONNX file (Casts / Q-DQ as `mixprec convert` writes them),
//!   exported anew for each candidate from the low plan with the marked layers in the high
//!   precision: its own types are the candidate's precisions;
//! - `{layer_precisions}`: `name:float32` items for `polygraphy run --layer-precisions`; an
//!   argument that is exactly this placeholder becomes one argument per marked layer;
//! - `{trtexec_layer_precisions}`: `name:fp32,name2:fp32` for `trtexec --layerPrecisions=`;
//! - `{iteration}` and `{marked_count}`.
//!
//! Each command runs in its own process group ([`crate::process`]): the group is judged (the
//! check is over when its first process exited and its output closed), ended at
//! `--check-timeout` or on Ctrl-C/SIGTERM, and its output kept up to [`OUTPUT_LIMIT`] bytes a
//! stream. With `--jobs` the commands of a batch are waited for together.
//!
//! A check may instead be a function of the caller's ([`UserCheck`], the Python API's
//! `check=callable`): it is given each candidate as a [`Candidate`] (its model, which it can
//! write exactly as `{model}` would be, and its layers' precisions) and answers pass or fail.
//! It runs in this process, one candidate at a time in the batch's order, so its calls are
//! those of a serial search whatever `--jobs` is.

use super::space::CandidateModel;
use super::{Evaluation, Oracle};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::export::write_model;
use crate::graph::Graph;
use crate::onnx::proto::ModelProto;
use crate::precision::Precision;
use crate::process::{Ending, Finished, Run, OUTPUT_LIMIT};
use regex::Regex;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// A candidate as a [`UserCheck`] sees it.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// 1-based count of the candidates this oracle judged (`{iteration}`).
    pub iteration: usize,
    /// The layers in the high precision (the marked ones), by name.
    pub marked: Vec<String>,
    /// Every layer the search decides, by name, with the precision it runs in (`float16`,
    /// `int8`, ...), in the order the search lists them (`plan`: group by group).
    pub layer_precisions: Vec<(String, String)>,
    /// The candidate's strongly typed mixed-precision model: what `{model}` names.
    pub model: Arc<ModelProto>,
}

impl Candidate {
    /// Writes the candidate's model to `path` as `{model}` is written: all or nothing (a
    /// temporary file renamed into place; a model over 2 GiB with its weights in
    /// `<file name>.data` beside it).
    pub fn export(&self, path: &Path) -> Result<()> {
        write_model(path, &self.model)
    }

    /// The candidate's model as ONNX bytes (weights inline, so at most 2 GiB).
    pub fn model_bytes(&self) -> Result<Vec<u8>> {
        use prost::Message;
        let len = self.model.encoded_len();
        if len > crate::export::external::PROTOBUF_LIMIT {
            return Err(Error::Invalid(format!(
                "the candidate's model is {len} bytes, over protobuf's 2 GiB limit: write it with export(path) instead"
            )));
        }
        Ok(self.model.encode_to_vec())
    }
}

/// The function of a [`UserCheck`].
pub type CheckFn = dyn Fn(&Candidate) -> Result<bool> + Send + Sync;

/// A check given as a function: `Ok(true)` passes the candidate, `Ok(false)` fails it, an
/// error stops the search as itself.
#[derive(Clone)]
pub struct UserCheck(pub Arc<CheckFn>);

impl std::fmt::Debug for UserCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UserCheck(..)")
    }
}

/// A candidate given as a model ([`CheckOracle::evaluate_models`]: a `plan` front's point).
#[derive(Clone, Debug)]
pub struct ModelCandidate {
    /// The layers it runs in the high precision (for the layer-precision placeholders).
    pub high_layers: Vec<usize>,
    /// Every layer the search decides, with its precision.
    pub layers: Vec<(usize, Precision)>,
    pub model: Arc<ModelProto>,
}

/// trtexec's spelling of a precision in `--layerPrecisions`.
pub fn trtexec_precision(p: Precision) -> &'static str {
    match p {
        Precision::Float32 => "fp32",
        Precision::Float16 => "fp16",
        Precision::BFloat16 => "bf16",
        Precision::Fp8E4M3 | Precision::Fp8E5M2 => "fp8",
        Precision::Int8 => "int8",
    }
}

/// `name:float32` items (Polygraphy's `--layer-precisions`).
pub fn polygraphy_items(graph: &Graph, marked: &[usize], high: Precision) -> Vec<String> {
    marked
        .iter()
        .map(|&i| format!("{}:{}", graph.nodes[i].name, high.name()))
        .collect()
}

/// `name:fp32,name2:fp32` (trtexec's `--layerPrecisions`).
pub fn trtexec_spec(graph: &Graph, marked: &[usize], high: Precision) -> String {
    marked
        .iter()
        .map(|&i| format!("{}:{}", graph.nodes[i].name, trtexec_precision(high)))
        .collect::<Vec<_>>()
        .join(",")
}

/// Evaluates candidates with a user command.
pub struct CheckOracle<'a> {
    pub graph: &'a Graph,
    /// The precision marked layers run in (for the layer-precision placeholders).
    pub high: Precision,
    /// Each candidate as the model `{model}` names, from its space
    /// ([`super::plans::plan_candidates`], [`super::qdq::qdq_candidates`]).
    pub candidate: CandidateModel<'a>,
    /// The command and its arguments, with placeholders (empty with `user`).
    pub command: Vec<String>,
    /// The caller's function that judges each candidate instead of a command.
    pub user: Option<UserCheck>,
    /// Every layer a marked set decides, with the precision it runs in when not marked (for
    /// [`Candidate::layer_precisions`]).
    pub decided: Vec<(usize, String)>,
    pub fail_regex: Option<Regex>,
    pub timeout: Option<Duration>,
    /// Where candidate models are written.
    pub workdir: PathBuf,
    /// Candidates judged at the same time (`--jobs`). Above 1, the k-th command of a batch
    /// runs in its own working directory `workdir/job<k>`, where its candidate model,
    /// a relative `iter_artifact` and relative `artifacts` are too.
    pub jobs: usize,
    /// Report each command and its output.
    pub verbose: bool,
    pub evaluations: usize,
    /// Polygraphy's `--iter-artifact`: the candidate is written here (and `{model}` names it)
    /// instead of inside `workdir`.
    pub iter_artifact: Option<PathBuf>,
    /// Keep the iteration artifact after each evaluation (Polygraphy's
    /// `--no-remove-intermediate`); by default it is removed, as Polygraphy does.
    pub keep_iter_artifact: bool,
    /// Polygraphy's `--artifacts`: files moved after each evaluation into
    /// `artifacts_dir/good` or `artifacts_dir/bad`, named `<stem>_<stamp>_N<iteration><ext>`.
    pub artifacts: Vec<PathBuf>,
    pub artifacts_dir: PathBuf,
    /// The start date and time in artifact names (Polygraphy's `%x-%X` with `-`).
    pub artifact_stamp: String,
    /// Polygraphy's `--show-output` (print the command's output for passing candidates too)
    /// and `--hide-fail-output` (not even for failing ones).
    pub show_output: bool,
    pub hide_fail_output: bool,
    /// Receives the command echo (`verbose`), the command's output, a timeout warning and
    /// the artifact notes; the library prints nothing.
    pub events: Box<dyn FnMut(Event) + 'a>,
}

impl CheckOracle<'_> {
    /// Moves every `--artifacts` file into `good/` or `bad/`; returns what happened, a line
    /// per file.
    fn sort_artifacts(&self, passed: bool, dir: Option<&Path>, iteration: usize) -> Vec<String> {
        let sub = self.artifacts_dir.join(if passed { "good" } else { "bad" });
        let mut notes = Vec::new();
        for art in &self.artifacts {
            let art = &in_dir(dir, art);
            let stem = art
                .file_stem()
                .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
            let ext = art
                .extension()
                .map_or_else(String::new, |e| format!(".{}", e.to_string_lossy()));
            let dest = sub.join(format!(
                "{stem}_{}_N{}{ext}",
                self.artifact_stamp, iteration
            ));
            if !art.exists() {
                notes.push(format!(
                    "artifact {} does not exist, skipping (was the --check command supposed to write it?)",
                    art.display()
                ));
                continue;
            }
            if dest.exists() {
                notes.push(format!(
                    "{} already exists; not overwriting it, artifact {} skipped",
                    dest.display(),
                    art.display()
                ));
                continue;
            }
            let moved = std::fs::create_dir_all(&sub).and_then(|_| {
                std::fs::rename(art, &dest)
                    .or_else(|_| std::fs::copy(art, &dest).and_then(|_| std::fs::remove_file(art)))
            });
            notes.push(match moved {
                Ok(()) => format!("moved {} to {}", art.display(), dest.display()),
                Err(e) => format!("cannot move {} to {}: {e}", art.display(), dest.display()),
            });
        }
        notes
    }
}

impl CheckOracle<'_> {
    fn arguments(&self, model: &Path, marked: &[usize], iteration: usize) -> Vec<String> {
        let items = polygraphy_items(self.graph, marked, self.high);
        let trt = trtexec_spec(self.graph, marked, self.high);
        let mut out = Vec::new();
        for arg in &self.command[1..] {
            if arg == "{layer_precisions}" {
                out.extend(items.iter().cloned());
                continue;
            }
            out.push(
                arg.replace("{model}", &model.display().to_string())
                    .replace("{layer_precisions}", &items.join(" "))
                    .replace("{trtexec_layer_precisions}", &trt)
                    .replace("{iteration}", &iteration.to_string())
                    .replace("{marked_count}", &marked.len().to_string()),
            );
        }
        out
    }
}

/// `path` inside a job's directory when it is relative (and there is one).
fn in_dir(dir: Option<&Path>, path: &Path) -> PathBuf {
    match dir {
        Some(d) if path.is_relative() => d.join(path),
        _ => path.to_path_buf(),
    }
}

/// A command started for one candidate.
struct Launched {
    run: Run,
    /// The candidate's model file.
    model: PathBuf,
    /// The job's working directory (`--jobs` > 1).
    dir: Option<PathBuf>,
    iteration: usize,
}

impl CheckOracle<'_> {
    /// Writes the candidate and starts the command on it, in its own process group
    /// ([`crate::process`]), in the job's own directory when `slot` is given (`--jobs` > 1).
    fn launch(
        &mut self,
        marked: &[usize],
        candidate: &crate::onnx::proto::ModelProto,
        slot: Option<usize>,
    ) -> Result<Launched> {
        self.evaluations += 1;
        let iteration = self.evaluations;
        let dir = match slot {
            Some(k) => {
                let d = self.workdir.join(format!("job{k}"));
                std::fs::create_dir_all(&d).map_err(|e| Error::io(&d, e))?;
                Some(d)
            }
            None => None,
        };
        let model = match &self.iter_artifact {
            Some(a) => in_dir(dir.as_deref(), a),
            None => dir
                .as_deref()
                .unwrap_or(&self.workdir)
                .join("mixprec_candidate.onnx"),
        };
        write_model(&model, candidate)?;
        let program = &self.command[0];
        let args = self.arguments(&model, marked, iteration);
        if self.verbose {
            let place = dir
                .as_ref()
                .map_or_else(String::new, |d| format!(" (in {})", d.display()));
            (self.events)(Event::Verbose(format!(
                "--check: {program} {}{place}",
                args.join(" ")
            )));
        }
        let mut command = Command::new(program);
        command.args(&args);
        if let Some(d) = &dir {
            command.current_dir(d);
        }
        let run = Run::spawn(
            &mut command,
            self.timeout,
            OUTPUT_LIMIT,
            self.fail_regex.as_ref(),
        )
        .map_err(|e| {
            Error::Invalid(if e.kind() == std::io::ErrorKind::NotFound {
                format!("--check: command '{program}' not found")
            } else {
                format!("--check: cannot run '{program}': {e}")
            })
        })?;
        Ok(Launched {
            run,
            model,
            dir,
            iteration,
        })
    }

    /// Waits for the launched commands together (each ended at its timeout, all of them on
    /// Ctrl-C or SIGTERM) and judges them in order; a launch that failed keeps its error.
    fn conclude_all(&mut self, launched: Vec<Result<Launched>>) -> Vec<Result<Evaluation>> {
        let mut runs = Vec::new();
        let mut rest = Vec::new();
        for l in launched {
            match l {
                Ok(l) => {
                    runs.push(l.run);
                    rest.push(Ok((l.model, l.dir, l.iteration)));
                }
                Err(e) => rest.push(Err(e)),
            }
        }
        let mut finished = Run::wait_all(runs, &crate::process::stop_requested).into_iter();
        rest.into_iter()
            .map(|r| {
                let (model, dir, iteration) = r?;
                let f = finished.next().expect("one finished run per launch");
                Ok(self.judge(f, &model, dir.as_deref(), iteration))
            })
            .collect()
    }

    /// The verdict on a finished command; reports its output and the artifact notes.
    fn judge(
        &mut self,
        f: Finished,
        model: &Path,
        dir: Option<&Path>,
        iteration: usize,
    ) -> Evaluation {
        let text = format!("{}{}", f.stdout.text("stdout"), f.stderr.text("stderr"));
        let (passed, summary) = match f.ending {
            Ending::Interrupted => (
                false,
                "--check stopped by Ctrl-C or SIGTERM (its process group was ended): no verdict"
                    .to_string(),
            ),
            Ending::TimedOut(d) => (
                false,
                format!(
                    "--check timed out after {:.1} s: its process group was killed; counted as failing",
                    d.as_secs_f64()
                ),
            ),
            Ending::Exited(status) => match Finished::failure(status) {
                Some(why) => (false, format!("--check {why}")),
                None => match self.fail_match(&f) {
                    None => (true, "--check exited with status 0".to_string()),
                    Some(m) => (false, format!("--check output matched --fail-regex: '{m}'")),
                },
            },
        };
        let interrupted = f.ending == Ending::Interrupted;
        if !interrupted
            && (self.verbose || (passed && self.show_output) || (!passed && !self.hide_fail_output))
        {
            (self.events)(Event::Output(text));
        }
        if matches!(f.ending, Ending::TimedOut(_)) {
            (self.events)(Event::Warning(summary.clone()));
        }
        if self.iter_artifact.is_some() && !self.keep_iter_artifact {
            let _ = std::fs::remove_file(model);
        }
        if !interrupted {
            for note in self.sort_artifacts(passed, dir, iteration) {
                (self.events)(Event::Info(note));
            }
        }
        Evaluation {
            passed,
            error: f64::NAN,
            summary,
        }
    }

    /// `--fail-regex`'s match in the command's output: over all of it (stdout then stderr)
    /// when it was kept whole, else its first match in what was dropped, then in what was
    /// kept.
    fn fail_match(&self, f: &Finished) -> Option<String> {
        let re = self.fail_regex.as_ref()?;
        let kept = format!(
            "{}{}",
            String::from_utf8_lossy(&f.stdout.bytes),
            String::from_utf8_lossy(&f.stderr.bytes)
        );
        let in_kept = || re.find(&kept).map(|m| m.as_str().to_string());
        if f.stdout.dropped == 0 && f.stderr.dropped == 0 {
            return in_kept();
        }
        f.stdout
            .dropped_match
            .clone()
            .or_else(|| f.stderr.dropped_match.clone())
            .or_else(in_kept)
    }
}

impl CheckOracle<'_> {
    /// The user's verdict on one candidate (`marked` in the high precision, `layers` every
    /// decided layer's precision).
    fn by_user(
        &mut self,
        user: &UserCheck,
        marked: &[usize],
        layers: Vec<(usize, String)>,
        model: Arc<ModelProto>,
    ) -> Result<Evaluation> {
        self.evaluations += 1;
        let name = |i: usize| self.graph.nodes[i].name.clone();
        let candidate = Candidate {
            iteration: self.evaluations,
            marked: marked.iter().map(|&i| name(i)).collect(),
            layer_precisions: layers.into_iter().map(|(i, p)| (name(i), p)).collect(),
            model,
        };
        let passed = (user.0)(&candidate)?;
        Ok(Evaluation {
            passed,
            error: f64::NAN,
            summary: format!("check returned {}", if passed { "True" } else { "False" }),
        })
    }

    /// `marked`'s candidate judged by the user's function.
    fn evaluate_by_user(&mut self, user: &UserCheck, marked: &[usize]) -> Result<Evaluation> {
        let model = (self.candidate)(marked)?;
        let layers = self
            .decided
            .iter()
            .map(|(i, low)| {
                let p = if marked.contains(i) {
                    self.high.name().to_string()
                } else {
                    low.clone()
                };
                (*i, p)
            })
            .collect();
        self.by_user(user, marked, layers, model)
    }
}

/// Results for a batch judged one at a time: after an error, the rest are not judged (a
/// user's function that failed has its error reported once, as the search's).
fn in_turn<T>(
    items: &[T],
    mut judge: impl FnMut(&T) -> Result<Evaluation>,
) -> Vec<Result<Evaluation>> {
    let mut failed = false;
    items
        .iter()
        .map(|item| {
            if failed {
                return Err(Error::Invalid(
                    "not judged: the check failed on an earlier candidate of the batch".into(),
                ));
            }
            let r = judge(item);
            failed = r.is_err();
            r
        })
        .collect()
}

impl Oracle for CheckOracle<'_> {
    fn evaluate(&mut self, marked: &[usize]) -> Result<Evaluation> {
        if let Some(user) = self.user.clone() {
            return self.evaluate_by_user(&user, marked);
        }
        let candidate = (self.candidate)(marked)?;
        let slot = (self.jobs > 1).then_some(0);
        let launched = self.launch(marked, &candidate, slot);
        self.conclude_all(vec![launched])
            .pop()
            .expect("one evaluation per launch")
    }

    /// Judges several candidates at once, each command in its own working directory; the
    /// commands' output and notes are reported in batch order.
    fn evaluate_batch(&mut self, sets: &[Vec<usize>]) -> Vec<Result<Evaluation>> {
        if let Some(user) = self.user.clone() {
            return in_turn(sets, |marked| self.evaluate_by_user(&user, marked));
        }
        let launched: Vec<Result<Launched>> = sets
            .iter()
            .enumerate()
            .map(|(k, marked)| {
                let candidate = (self.candidate)(marked)?;
                self.launch(marked, &candidate, Some(k))
            })
            .collect();
        self.conclude_all(launched)
    }

    /// A user's function runs one candidate at a time here: judging ahead would only call
    /// it for candidates the serial search never needs.
    fn parallel(&self) -> bool {
        self.jobs > 1 && self.user.is_none()
    }
}

impl CheckOracle<'_> {
    /// Judges candidates given as models (a `plan` front's points, whose layers take several
    /// formats); with `jobs` > 1 the commands run at once, each in its own directory, and a
    /// user's function judges them one at a time, in order.
    pub fn evaluate_models(&mut self, candidates: &[ModelCandidate]) -> Vec<Result<Evaluation>> {
        if let Some(user) = self.user.clone() {
            return in_turn(candidates, |c| {
                let layers = c
                    .layers
                    .iter()
                    .map(|&(i, p)| (i, p.name().to_string()))
                    .collect();
                self.by_user(&user, &c.high_layers, layers, c.model.clone())
            });
        }
        let many = self.jobs > 1;
        let launched = candidates
            .iter()
            .enumerate()
            .map(|(k, c)| self.launch(&c.high_layers, &c.model, many.then_some(k)))
            .collect();
        self.conclude_all(launched)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::graph::testing::{graph, node, vi};
    use std::sync::Mutex;

    /// Three Relus in a chain, a, b and c.
    pub(crate) fn three_layers() -> Graph {
        graph(
            vec![
                node("a", "Relu", &["x"], &["y0"]),
                node("b", "Relu", &["y0"], &["y1"]),
                node("c", "Relu", &["y1"], &["y"]),
            ],
            vec![vi("x", &[1])],
            vec![vi("y", &[1])],
            vec![],
        )
    }

    /// A stand-in candidate model that names its marked set (so each candidate's bytes are
    /// its own).
    fn named_model(marked: &[usize]) -> Arc<ModelProto> {
        Arc::new(ModelProto {
            producer_name: Some(format!("marked {marked:?}")),
            ir_version: Some(8),
            ..Default::default()
        })
    }

    fn oracle<'a>(g: &'a Graph, dir: PathBuf, jobs: usize) -> CheckOracle<'a> {
        CheckOracle {
            graph: g,
            high: Precision::Float32,
            candidate: Box::new(|marked: &[usize]| Ok(named_model(marked))),
            command: Vec::new(),
            user: None,
            decided: vec![
                (0, "float16".into()),
                (1, "int8".into()),
                (2, "float16".into()),
            ],
            fail_regex: None,
            timeout: None,
            workdir: dir.clone(),
            jobs,
            verbose: false,
            evaluations: 0,
            iter_artifact: None,
            keep_iter_artifact: false,
            artifacts: Vec::new(),
            artifacts_dir: dir,
            artifact_stamp: String::new(),
            show_output: false,
            hide_fail_output: false,
            events: Box::new(|_| {}),
        }
    }

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mixprec-check-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_user_check_judges_each_candidate_in_order_and_stops_at_its_error() {
        let g = three_layers();
        let dir = tempdir("user");
        let seen: Arc<Mutex<Vec<Candidate>>> = Arc::default();
        let log = seen.clone();
        let mut o = oracle(&g, dir.clone(), 4);
        o.user = Some(UserCheck(Arc::new(move |c: &Candidate| {
            log.lock().unwrap().push(c.clone());
            if c.marked.len() == 3 {
                return Err(Error::Invalid("the user's check raised".into()));
            }
            Ok(c.marked.len() >= 2)
        })));
        // One candidate at a time, even with jobs 4: the search never judges ahead for it.
        assert!(!o.parallel());
        let r = o.evaluate_batch(&[vec![1], vec![0, 2], vec![0, 1, 2], vec![]]);
        let verdicts: Vec<_> = r
            .iter()
            .map(|e| e.as_ref().map(|e| e.passed).map_err(|e| e.to_string()))
            .collect();
        assert_eq!(verdicts[0], Ok(false));
        assert_eq!(verdicts[1], Ok(true));
        assert!(verdicts[2]
            .as_ref()
            .unwrap_err()
            .contains("the user's check raised"));
        // After the error, the rest is not judged.
        assert!(verdicts[3].as_ref().unwrap_err().contains("not judged"));
        assert_eq!(r[1].as_ref().unwrap().summary, "check returned True");
        let calls = seen.lock().unwrap();
        assert_eq!(calls.len(), 3);
        let iterations: Vec<usize> = calls.iter().map(|c| c.iteration).collect();
        assert_eq!(iterations, vec![1, 2, 3]);
        assert_eq!(calls[1].marked, vec!["a", "c"]);
        let precisions = |c: &Candidate| {
            c.layer_precisions
                .iter()
                .map(|(n, p)| format!("{n}:{p}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(precisions(&calls[0]), "a:float16 b:float32 c:float16");
        assert_eq!(precisions(&calls[1]), "a:float32 b:int8 c:float32");
        assert_eq!(calls[1].model, named_model(&[0, 2]));
        drop(calls);
        // Models given whole (plan's points): the layers and formats as given.
        let r = o.evaluate_models(&[ModelCandidate {
            high_layers: vec![0, 1],
            layers: vec![
                (0, Precision::Float32),
                (1, Precision::Float32),
                (2, Precision::Fp8E4M3),
            ],
            model: named_model(&[0, 1]),
        }]);
        assert!(r[0].as_ref().unwrap().passed);
        let last = seen.lock().unwrap().last().cloned().unwrap();
        assert_eq!(last.iteration, 4);
        assert_eq!(last.marked, vec!["a", "b"]);
        assert_eq!(
            last.layer_precisions[2],
            ("c".to_string(), "fp8e4m3".to_string())
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_candidate_exports_what_the_command_is_given_as_its_model() {
        let g = three_layers();
        let dir = tempdir("export");
        let copies = dir.join("copies");
        std::fs::create_dir_all(&copies).unwrap();
        // The command keeps each {model} it is given.
        let mut command = oracle(&g, dir.join("work"), 1);
        std::fs::create_dir_all(dir.join("work")).unwrap();
        command.command = vec![
            "cp".into(),
            "{model}".into(),
            format!("{}/{{iteration}}.onnx", copies.display()),
        ];
        let sets = [vec![2], vec![0, 1]];
        for s in &sets {
            assert!(command.evaluate(s).unwrap().passed);
        }
        let exported = dir.join("exported");
        let written: Arc<Mutex<Vec<PathBuf>>> = Arc::default();
        let log = written.clone();
        let out = exported.clone();
        let mut user = oracle(&g, dir.join("work"), 1);
        user.user = Some(UserCheck(Arc::new(move |c: &Candidate| {
            let path = out.join(format!("{}.onnx", c.iteration));
            c.export(&path)?;
            assert_eq!(c.model_bytes()?, std::fs::read(&path).unwrap());
            log.lock().unwrap().push(path);
            Ok(true)
        })));
        // A missing directory is the export's error, naming the path.
        let e = user.evaluate(&sets[0]).unwrap_err().to_string();
        assert!(e.contains("exported"), "{e}");
        std::fs::create_dir_all(&exported).unwrap();
        user.evaluations = 0;
        for s in &sets {
            assert!(user.evaluate(s).unwrap().passed);
        }
        for (k, path) in written.lock().unwrap().iter().enumerate() {
            let by_command = std::fs::read(copies.join(format!("{}.onnx", k + 1))).unwrap();
            assert_eq!(std::fs::read(path).unwrap(), by_command);
        }
        assert_eq!(written.lock().unwrap().len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
