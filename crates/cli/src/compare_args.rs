//! The pass criterion's options, shared by `run` and `debug precision`.

use clap::Args;
use mixprec::jobs::options::CompareOptions;

/// Tolerances, the checked error statistic and extra metrics (Polygraphy's comparator options).
#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// Absolute tolerance: a value, or `output:value` per output (default 1e-5).
    #[arg(long, num_args = 1.., value_name = "TOL")]
    pub atol: Vec<String>,
    /// Relative tolerance: a value, or `output:value` per output (default 1e-5).
    #[arg(long, num_args = 1.., value_name = "TOL")]
    pub rtol: Vec<String>,
    /// Statistic checked against the tolerances: elemwise, max, mean, median, quantile (or
    /// `output:stat`).
    #[arg(long = "check-error-stat", num_args = 1.., value_name = "STAT")]
    pub check_error_stat: Vec<String>,
    /// With `--check-error-stat quantile`: the quantile of the errors checked, in [0, 1]
    /// (default 0.99; 0.5 is the median), or `output:q` per output.
    #[arg(long = "error-quantile", num_args = 1.., value_name = "Q")]
    pub error_quantile: Vec<String>,
    /// Extra pass criteria, checked in addition to the tolerances: `cosine:MIN`, `snr:MIN_DB`,
    /// `topk:K:MIN` (top-K agreement along the last axis), `max-rel-above:FLOOR:MAX` (max
    /// relative error over elements with |ref| > FLOOR); prefix `output:` for one output.
    /// See docs/compare.md.
    #[arg(long = "metric", num_args = 1.., value_name = "SPEC")]
    pub metric: Vec<String>,
}

impl CompareArgs {
    /// These options as the library holds them.
    pub fn options(&self) -> CompareOptions {
        CompareOptions {
            atol: self.atol.clone(),
            rtol: self.rtol.clone(),
            check_error_stat: self.check_error_stat.clone(),
            error_quantile: self.error_quantile.clone(),
            metric: self.metric.clone(),
        }
    }
}
