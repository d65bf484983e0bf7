//! Precision options shared by `run`, `convert` and `debug precision`.

use clap::Args;
use mixprec::jobs::options::{CalibOptions, PrecisionOptions};
use mixprec::precision::plan::GlobalPrecision;
use std::path::PathBuf;

#[derive(Args, Debug, Clone, Default)]
pub struct PrecisionArgs {
    /// Run layers in float16 (layers without another request).
    #[arg(long)]
    pub fp16: bool,
    /// Run layers in bfloat16 (--fp16 wins if both are given).
    #[arg(long)]
    pub bf16: bool,
    /// Run Conv/ConvTranspose/MatMul/Gemm in int8; other layers fall back to float32, or to
    /// float16/bfloat16 with --fp16/--bf16 (as TensorRT does).
    #[arg(long)]
    pub int8: bool,
    /// Run Conv/ConvTranspose/MatMul/Gemm in fp8 (e4m3), with the same fallback as --int8.
    #[arg(long)]
    pub fp8: bool,
    /// Per-layer precisions: NAME:dtype, NAME an exact layer name, a glob ('*Softmax*') or a
    /// regex ('re:^Conv_[0-9]+$'); dtype one of float32, float16, bfloat16, fp8e4m3, fp8e5m2,
    /// int8. Later items win. Nodes inside If/Loop/Scan bodies are named by path
    /// (If_0/then_branch/Conv_3).
    #[arg(long = "layer-precisions", num_args = 1.., value_name = "NAME:DTYPE")]
    pub layer_precisions: Vec<String>,
    /// obey: per-layer requests are applied and a request without a kernel is an error;
    /// prefer: such a request falls back with a warning; none: per-layer requests are ignored.
    #[arg(
        long = "precision-constraints",
        default_value = "prefer",
        value_name = "MODE"
    )]
    pub precision_constraints: String,
    /// Accumulator of matmul/conv products in reduced-precision layers: f32 or f16.
    #[arg(long, default_value = "f32", value_name = "TYPE")]
    pub accumulate: String,
    /// Kernel fusion the emulation assumes: none (every layer rounds its outputs, as ONNX
    /// Runtime, PyTorch eager and TensorRT without fusion do: the conservative default) or
    /// tensorrt (TensorRT's fusions: values passed inside a fused kernel stay in f32, only its
    /// outputs are rounded; layers in different precisions are never fused).
    #[arg(long, default_value = "none", value_name = "MODEL")]
    pub fusion: String,
    /// TensorRT calibration cache with activation scales for int8/fp8 layers.
    #[arg(long = "calibration-cache", value_name = "FILE")]
    pub calibration_cache: Option<PathBuf>,
    #[command(flatten)]
    pub calib: CalibAlgoArgs,
}

/// How activation ranges are calibrated when no cache holds them: mixprec's algorithm names
/// or Polygraphy's TensorRT calibrator classes.
#[derive(Args, Debug, Clone, Default)]
pub struct CalibAlgoArgs {
    /// Calibration algorithm: entropy (TensorRT's EntropyCalibration2, the default), minmax,
    /// or percentile.
    #[arg(long = "calibration-algo", value_name = "ALGO")]
    pub calibration_algo: Option<String>,
    /// Polygraphy's TensorRT calibrator class: IInt8EntropyCalibrator2 (entropy),
    /// IInt8MinMaxCalibrator (minmax), IInt8EntropyCalibrator (entropy), IInt8LegacyCalibrator
    /// (percentile at --quantile).
    #[arg(
        long = "calibration-base-class",
        alias = "calib-base-cls",
        value_name = "CLASS"
    )]
    pub base_class: Option<String>,
    /// IInt8LegacyCalibrator's quantile, in (0, 1].
    #[arg(long, value_name = "Q")]
    pub quantile: Option<f64>,
    /// IInt8LegacyCalibrator's regression cutoff (no counterpart: accepted and ignored).
    #[arg(long = "regression-cutoff", value_name = "F")]
    pub regression_cutoff: Option<f64>,
}

impl CalibAlgoArgs {
    /// These options as the library holds them.
    pub fn options(&self) -> CalibOptions {
        CalibOptions {
            calibration_algo: self.calibration_algo.clone(),
            base_class: self.base_class.clone(),
            quantile: self.quantile,
            regression_cutoff: self.regression_cutoff,
        }
    }
}

impl PrecisionArgs {
    /// These options as the library holds them.
    pub fn options(&self) -> PrecisionOptions {
        PrecisionOptions {
            fp16: self.fp16,
            bf16: self.bf16,
            int8: self.int8,
            fp8: self.fp8,
            layer_precisions: self.layer_precisions.clone(),
            precision_constraints: self.precision_constraints.clone(),
            accumulate: self.accumulate.clone(),
            fusion: self.fusion.clone(),
            calibration_cache: self.calibration_cache.clone(),
            calib: self.calib.options(),
        }
    }

    pub fn global(&self) -> GlobalPrecision {
        self.options().global()
    }
}
