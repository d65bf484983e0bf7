//! Golden outputs: a Polygraphy RunResults file (`--save-outputs` of `polygraphy run` or
//! `mixprec run`) loaded and checked once, in one place, for every command that compares
//! against one (`run --load-outputs`, `debug precision --golden`).

use crate::data::polygraphy::{self, RunResults};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::tensor::{fmt_shape, Tensor};
use std::path::{Path, PathBuf};

/// One input set's outputs by name, in the model's order.
pub type Outputs = Vec<(String, Tensor)>;

/// A loaded golden file: at least one runner, and every runner has at least one iteration.
#[derive(Clone, Debug)]
pub struct GoldenFile {
    pub path: PathBuf,
    pub results: RunResults,
}

impl GoldenFile {
    /// Reads and checks a golden file before any (possibly long) run: a file, or a directory
    /// of per-iteration files, that holds no runner or a runner without iterations is an
    /// error naming the file.
    pub fn load(path: &Path) -> Result<GoldenFile> {
        let results = polygraphy::load_run_results(path)?;
        GoldenFile::new(path, results)
    }

    /// [`load`](Self::load)'s checks on results already read.
    pub fn new(path: &Path, results: RunResults) -> Result<GoldenFile> {
        if results.runners.is_empty() {
            return Err(Error::data(path, "the RunResults file holds no runner"));
        }
        if let Some((runner, _)) = results.runners.iter().find(|(_, it)| it.is_empty()) {
            return Err(Error::data(
                path,
                format!("runner '{runner}' has no iterations"),
            ));
        }
        Ok(GoldenFile {
            path: path.to_path_buf(),
            results,
        })
    }

    /// The first runner's iterations as the reference of a search, checked against the
    /// model's outputs (`model_outputs`, one input set's): every golden output must be an
    /// output of the model with the same shape. Model outputs without golden data are
    /// reported to `events` as a warning (they are not compared).
    pub fn reference_for(
        &self,
        model_outputs: &Outputs,
        events: &mut dyn FnMut(Event),
    ) -> Result<Vec<Outputs>> {
        let path = &self.path;
        let iters = &self.results.runners[0].1;
        let names: Vec<&str> = model_outputs.iter().map(|(n, _)| n.as_str()).collect();
        for it in iters {
            let unknown: Vec<&str> = it
                .outputs
                .iter()
                .map(|(n, _)| n.as_str())
                .filter(|n| !names.contains(n))
                .collect();
            if !unknown.is_empty() {
                return Err(Error::data(
                    path,
                    format!(
                        "golden output(s) {} are not outputs of the model (its outputs: {})",
                        unknown.join(", "),
                        names.join(", ")
                    ),
                ));
            }
            for (n, t) in &it.outputs {
                let ours = &model_outputs
                    .iter()
                    .find(|(m, _)| m == n)
                    .expect("checked")
                    .1;
                if ours.shape() != t.shape() {
                    return Err(Error::data(
                        path,
                        format!(
                            "golden output '{n}' has shape {}, the model's {}",
                            fmt_shape(t.shape()),
                            fmt_shape(ours.shape())
                        ),
                    ));
                }
            }
        }
        let missing: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| !iters[0].outputs.iter().any(|(m, _)| m == n))
            .collect();
        if !missing.is_empty() {
            events(Event::Warning(format!(
                "{}: no golden data for output(s) {}: they are not compared",
                path.display(),
                missing.join(", ")
            )));
        }
        Ok(iters.iter().map(|it| it.outputs.clone()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::polygraphy::IterationResult;

    fn iteration(outputs: &[(&str, Vec<usize>)]) -> IterationResult {
        IterationResult {
            outputs: outputs
                .iter()
                .map(|(n, s)| {
                    let len = s.iter().product();
                    (n.to_string(), Tensor::from_f32(s.clone(), vec![0.0; len]))
                })
                .collect(),
            runtime: 0.0,
            runner_name: "r".into(),
        }
    }

    fn results(runners: Vec<(&str, Vec<IterationResult>)>) -> RunResults {
        RunResults {
            runners: runners
                .into_iter()
                .map(|(n, it)| (n.to_string(), it))
                .collect(),
        }
    }

    #[test]
    fn malformed_files_are_errors_naming_the_file() {
        let p = Path::new("gold.json");
        let e = GoldenFile::new(p, results(vec![])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "gold.json: the RunResults file holds no runner"
        );
        // A later runner without iterations is as wrong as the first.
        let r = results(vec![
            ("a", vec![iteration(&[("y", vec![2])])]),
            ("b", vec![]),
        ]);
        let e = GoldenFile::new(p, r).unwrap_err();
        assert_eq!(e.to_string(), "gold.json: runner 'b' has no iterations");
    }

    #[test]
    fn reference_is_checked_against_the_model_outputs() {
        let p = Path::new("gold.json");
        let model = iteration(&[("y", vec![2]), ("z", vec![3])]).outputs;
        let mut events = Vec::new();
        let g =
            GoldenFile::new(p, results(vec![("a", vec![iteration(&[("y", vec![2])])])])).unwrap();
        let reference = g.reference_for(&model, &mut |e| events.push(e)).unwrap();
        assert_eq!(reference.len(), 1);
        assert_eq!(
            events,
            [Event::Warning(
                "gold.json: no golden data for output(s) z: they are not compared".into()
            )]
        );
        let g =
            GoldenFile::new(p, results(vec![("a", vec![iteration(&[("y", vec![5])])])])).unwrap();
        let e = g.reference_for(&model, &mut |_| {}).unwrap_err();
        assert_eq!(
            e.to_string(),
            "gold.json: golden output 'y' has shape (5,), the model's (2,)"
        );
        let g =
            GoldenFile::new(p, results(vec![("a", vec![iteration(&[("w", vec![2])])])])).unwrap();
        let e = g.reference_for(&model, &mut |_| {}).unwrap_err();
        assert!(
            e.to_string().contains("golden output(s) w are not outputs"),
            "{e}"
        );
    }
}
