//! A user command that judges candidates (`--check` and the options that go with it), as the
//! jobs that take one (`debug precision`, `plan`) validate and build it: the options as given,
//! their checked form, the directory candidates are written to and the oracle
//! ([`crate::search::check::CheckOracle`]).

use crate::error::{Error, Result};
use crate::event::Event;
use crate::graph::Graph;
use crate::precision::Precision;
use crate::search::check::CheckOracle;
use crate::search::space::CandidateModel;
use std::path::PathBuf;
use std::time::Duration;

/// A user command that judges each candidate (`--check` and the options that go with it).
#[derive(Clone, Debug, Default)]
pub struct CheckOptions {
    /// The command and its arguments, with placeholders (`{model}`, ...).
    pub command: Vec<String>,
    pub fail_regex: Option<String>,
    /// Seconds before the command is killed and the candidate counted as failing.
    pub timeout: Option<f64>,
    pub iter_artifact: Option<PathBuf>,
    pub keep_iter_artifact: bool,
    pub artifacts: Vec<PathBuf>,
    pub artifacts_dir: PathBuf,
    pub show_output: bool,
    pub hide_fail_output: bool,
}

/// What [`CheckOptions::validate`] parsed: `--fail-regex` and `--check-timeout`.
#[derive(Clone, Debug, Default)]
pub struct CheckLimits {
    pub fail_regex: Option<regex::Regex>,
    pub timeout: Option<Duration>,
}

impl CheckOptions {
    /// Checks the command, `--fail-regex`, `--check-timeout` and, when `jobs` commands run at
    /// once, that no file they write is named by an absolute path; an error names the option.
    pub fn validate(&self, jobs: usize) -> Result<CheckLimits> {
        if self.command.is_empty() {
            return Err(Error::Invalid("--check: no command given".into()));
        }
        let fail_regex = match &self.fail_regex {
            Some(r) => Some(
                regex::Regex::new(r)
                    .map_err(|e| Error::Invalid(format!("--fail-regex '{r}': {e}")))?,
            ),
            None => None,
        };
        let timeout = match self.timeout {
            Some(s) if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
            Some(s) => {
                return Err(Error::Invalid(format!(
                    "--check-timeout {s}: expected a positive number of seconds"
                )))
            }
            None => None,
        };
        if jobs > 1 {
            // Commands running at the same time each work in their own directory; a file
            // named by an absolute path would be written by all of them.
            if let Some(p) = self
                .iter_artifact
                .iter()
                .chain(&self.artifacts)
                .find(|p| p.is_absolute())
            {
                return Err(Error::Invalid(format!(
                    "--jobs {jobs}: {} is an absolute path, which every command running at once would write; give it relative to the command's working directory (each job has its own)",
                    p.display()
                )));
            }
        }
        Ok(CheckLimits {
            fail_regex,
            timeout,
        })
    }
}

/// A temporary directory removed on drop (candidate models for `--check`).
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new() -> Result<TempDir> {
        let base = std::env::temp_dir();
        for k in 0..1000 {
            let p = base.join(format!("mixprec-check-{}-{k}", std::process::id()));
            if std::fs::create_dir(&p).is_ok() {
                return Ok(TempDir(p));
            }
        }
        Err(Error::Invalid(format!(
            "cannot create a temporary directory in {}",
            base.display()
        )))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `--check` oracle of `c` over `candidate`s, writing them under `workdir`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_oracle<'a>(
    c: &CheckOptions,
    limits: &CheckLimits,
    graph: &'a Graph,
    high: Precision,
    candidate: CandidateModel<'a>,
    workdir: PathBuf,
    jobs: usize,
    verbose: bool,
    events: Box<dyn FnMut(Event) + 'a>,
) -> CheckOracle<'a> {
    CheckOracle {
        graph,
        high,
        candidate,
        command: c.command.clone(),
        fail_regex: limits.fail_regex.clone(),
        timeout: limits.timeout,
        workdir,
        jobs,
        verbose,
        evaluations: 0,
        iter_artifact: c.iter_artifact.clone().or_else(|| {
            (!c.command.iter().any(|a| a.contains("{model}")))
                .then(|| PathBuf::from("polygraphy_debug.onnx"))
        }),
        keep_iter_artifact: c.keep_iter_artifact,
        artifacts: c.artifacts.clone(),
        artifacts_dir: c.artifacts_dir.clone(),
        artifact_stamp: crate::data::polygraphy::runner_stamp().replace(['/', ':'], "-"),
        show_output: c.show_output,
        hide_fail_output: c.hide_fail_output,
        events,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_check_options_name_the_option() {
        let ok = CheckOptions {
            command: vec!["true".into()],
            ..Default::default()
        };
        assert!(ok.validate(1).is_ok());
        let err = |c: CheckOptions, jobs| c.validate(jobs).unwrap_err().to_string();
        assert!(err(CheckOptions::default(), 1).contains("no command"));
        let regex = CheckOptions {
            fail_regex: Some("(".into()),
            ..ok.clone()
        };
        assert!(err(regex, 1).contains("--fail-regex '('"));
        for t in [0.0, -1.0, f64::NAN] {
            let timeout = CheckOptions {
                timeout: Some(t),
                ..ok.clone()
            };
            assert!(err(timeout, 1).contains("--check-timeout"));
        }
        let absolute = CheckOptions {
            artifacts: vec![PathBuf::from("/tmp/log.txt")],
            ..ok.clone()
        };
        assert!(absolute.validate(1).is_ok());
        assert!(err(absolute, 2).contains("--jobs 2: /tmp/log.txt is an absolute path"));
    }
}
