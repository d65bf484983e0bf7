//! A user command that judges candidates (`--check` and the options that go with it), as the
//! jobs that take one (`debug precision`, `plan`) validate and build it: the options as given,
//! their checked form, the directory candidates are written to and the oracle
//! ([`crate::search::check::CheckOracle`]). The check is a command or the caller's function
//! ([`UserCheck`]), never both.

use crate::error::{Error, Result};
use crate::event::Event;
use crate::graph::Graph;
use crate::precision::Precision;
use crate::search::check::{CheckOracle, UserCheck};
use crate::search::space::CandidateModel;
use std::path::PathBuf;
use std::time::Duration;

/// A user command that judges each candidate (`--check` and the options that go with it).
#[derive(Clone, Debug, Default)]
pub struct CheckOptions {
    /// The command and its arguments, with placeholders (`{model}`, ...); empty with `user`.
    pub command: Vec<String>,
    /// The caller's function that judges each candidate instead of a command.
    pub user: Option<UserCheck>,
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
    /// A function takes none of the command's options.
    pub fn validate(&self, jobs: usize) -> Result<CheckLimits> {
        if self.user.is_some() {
            return self.validate_user();
        }
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

impl CheckOptions {
    /// A check given as a function: no command beside it, and none of the options that
    /// belong to a command.
    fn validate_user(&self) -> Result<CheckLimits> {
        if !self.command.is_empty() {
            return Err(Error::Invalid(format!(
                "check: both a function and a command ('{}') given; give one",
                self.command.join(" ")
            )));
        }
        let command_only = [
            (
                self.timeout.is_some(),
                "check_timeout (a function running in this process cannot be killed; put the timeout inside the function, or give a command, whose process group is ended at the timeout)",
            ),
            (self.fail_regex.is_some(), "fail_regex (a function answers pass or fail itself)"),
            (
                self.iter_artifact.is_some() || !self.artifacts.is_empty(),
                "iter_artifact/artifacts (a function writes the candidate where it wants with candidate.export(path))",
            ),
        ];
        if let Some((_, what)) = command_only.iter().find(|(given, _)| *given) {
            return Err(Error::Invalid(format!("check: a function takes no {what}")));
        }
        Ok(CheckLimits::default())
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

/// The `--check` oracle of `c` over `candidate`s, writing them under `workdir`; `decided` is
/// every layer a marked set decides with its precision when not marked.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_oracle<'a>(
    c: &CheckOptions,
    limits: &CheckLimits,
    graph: &'a Graph,
    high: Precision,
    candidate: CandidateModel<'a>,
    decided: Vec<(usize, String)>,
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
        user: c.user.clone(),
        decided,
        fail_regex: limits.fail_regex.clone(),
        timeout: limits.timeout,
        workdir,
        jobs,
        verbose,
        evaluations: 0,
        iter_artifact: c.iter_artifact.clone().or_else(|| {
            (c.user.is_none() && !c.command.iter().any(|a| a.contains("{model}")))
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

    #[test]
    fn a_check_function_takes_no_command_and_none_of_its_options() {
        let user = CheckOptions {
            user: Some(UserCheck(std::sync::Arc::new(|_| Ok(true)))),
            artifacts_dir: "polygraphy_artifacts".into(),
            ..Default::default()
        };
        assert!(user.validate(4).is_ok());
        let err = |c: CheckOptions| c.validate(1).unwrap_err().to_string();
        let both = CheckOptions {
            command: vec!["trtexec".into(), "--onnx={model}".into()],
            ..user.clone()
        };
        assert_eq!(
            err(both),
            "check: both a function and a command ('trtexec --onnx={model}') given; give one"
        );
        let timeout = CheckOptions {
            timeout: Some(60.0),
            ..user.clone()
        };
        let e = err(timeout);
        assert!(
            e.starts_with("check: a function takes no check_timeout")
                && e.contains("cannot be killed"),
            "{e}"
        );
        let regex = CheckOptions {
            fail_regex: Some("FAIL".into()),
            ..user.clone()
        };
        assert!(err(regex).contains("takes no fail_regex"));
        let artifacts = CheckOptions {
            artifacts: vec![PathBuf::from("log.txt")],
            ..user.clone()
        };
        assert!(err(artifacts).contains("takes no iter_artifact/artifacts"));
    }
}
