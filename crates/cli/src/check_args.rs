//! `--check` and the options that go with it (Polygraphy's `debug` subtool options), shared
//! by `debug precision` and `plan`.

use anyhow::{bail, Result};
use clap::Args;
use mixprec::jobs::check::CheckOptions;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// Judge candidates with this command (must be the last option: everything after it
    /// belongs to the command). Placeholders: {model} (the candidate as a mixed-precision ONNX
    /// file, written for each candidate: TensorRT 11 builds it as typed, `--check trtexec
    /// --onnx={model} --stronglyTyped`), {layer_precisions} (name:float32 items for polygraphy
    /// run --layer-precisions), {trtexec_layer_precisions} (name:fp32,... for TensorRT <= 10's
    /// trtexec --layerPrecisions=), {iteration}, {marked_count}. Exit status 0 = pass.
    #[arg(long, num_args = 1.., allow_hyphen_values = true, value_name = "CMD")]
    pub check: Vec<String>,
    /// With --check: a candidate also fails when the command's output matches this regex.
    #[arg(long = "fail-regex", value_name = "REGEX")]
    pub fail_regex: Option<String>,
    /// With --check: seconds before the command is killed and the candidate counted as failing.
    #[arg(long = "check-timeout", value_name = "SECS")]
    pub check_timeout: Option<f64>,
    /// With --check: where each candidate model is written (Polygraphy's iteration artifact);
    /// default `polygraphy_debug.onnx` when the command has no {model} placeholder.
    #[arg(
        long = "iter-artifact",
        alias = "intermediate-artifact",
        value_name = "FILE"
    )]
    pub iter_artifact: Option<PathBuf>,
    /// Keep the iteration artifact between candidates (by default it is removed after each).
    #[arg(long = "no-remove-intermediate")]
    pub no_remove_intermediate: bool,
    /// With --check: files the command writes, moved after each candidate into
    /// `<artifacts-dir>/good` or `/bad` with the start time and iteration in their name.
    #[arg(long, num_args = 1.., value_name = "FILE")]
    pub artifacts: Vec<PathBuf>,
    /// Where --artifacts are sorted (default polygraphy_artifacts).
    #[arg(
        long = "artifacts-dir",
        alias = "art-dir",
        default_value = "polygraphy_artifacts",
        value_name = "DIR"
    )]
    pub artifacts_dir: PathBuf,
    /// Print the --check command's output for passing candidates too.
    #[arg(long = "show-output", conflicts_with = "hide_fail_output")]
    pub show_output: bool,
    /// Do not print the --check command's output for failing candidates (printed by default).
    #[arg(long = "hide-fail-output")]
    pub hide_fail_output: bool,
}

impl CheckArgs {
    /// The job's check options; the flags that apply to `--check` only are refused without it.
    pub fn options(&self) -> Result<Option<CheckOptions>> {
        if self.check.is_empty() {
            if self.fail_regex.is_some()
                || self.check_timeout.is_some()
                || self.iter_artifact.is_some()
                || !self.artifacts.is_empty()
                || self.show_output
                || self.hide_fail_output
            {
                bail!("--fail-regex, --check-timeout, --iter-artifact, --artifacts, --show-output and --hide-fail-output apply to --check, which is not given");
            }
            return Ok(None);
        }
        Ok(Some(CheckOptions {
            command: self.check.clone(),
            user: None,
            fail_regex: self.fail_regex.clone(),
            timeout: self.check_timeout,
            iter_artifact: self.iter_artifact.clone(),
            keep_iter_artifact: self.no_remove_intermediate,
            artifacts: self.artifacts.clone(),
            artifacts_dir: self.artifacts_dir.clone(),
            show_output: self.show_output,
            hide_fail_output: self.hide_fail_output,
        }))
    }
}
