//! Which engine's kernel fusion a plan's emulation assumes (`--fusion`, docs/numerics.md
//! "Fusion rules"). The rules themselves read the graph's facts and live in `exec::fusion`.

use crate::error::{Error, Result};
use serde::Serialize;

/// The fusion model of a plan: which groups of layers run as one kernel, so that the values
/// they pass each other stay in f32 (docs/numerics.md, "Fusion regions").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FusionModel {
    /// No fusion: every layer materializes its outputs in its precision. What ONNX Runtime,
    /// PyTorch eager and TensorRT with fusion off compute; the conservative default.
    #[default]
    None,
    /// TensorRT's fusions (convolution/GEMM epilogues, pointwise groups, normalizations,
    /// softmax, attention), derived per plan: layers in different precisions never share a
    /// region.
    #[serde(rename = "tensorrt")]
    TensorRt,
}

impl FusionModel {
    pub fn parse(s: &str) -> Result<FusionModel> {
        match s.to_ascii_lowercase().as_str() {
            "none" => Ok(FusionModel::None),
            "tensorrt" | "trt" => Ok(FusionModel::TensorRt),
            _ => Err(Error::Invalid(format!(
                "--fusion '{s}': valid choices are none, tensorrt"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FusionModel::None => "none",
            FusionModel::TensorRt => "tensorrt",
        }
    }

    pub fn is_none(&self) -> bool {
        *self == FusionModel::None
    }
}

impl std::fmt::Display for FusionModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_serialize() {
        assert_eq!(
            FusionModel::parse("tensorrt").unwrap(),
            FusionModel::TensorRt
        );
        assert_eq!(FusionModel::parse("TRT").unwrap(), FusionModel::TensorRt);
        assert_eq!(FusionModel::parse("none").unwrap(), FusionModel::None);
        let e = FusionModel::parse("xla").unwrap_err().to_string();
        assert!(e.contains("'xla'") && e.contains("tensorrt"), "{e}");
        assert_eq!(
            serde_json::to_string(&FusionModel::TensorRt).unwrap(),
            "\"tensorrt\""
        );
        assert_eq!(FusionModel::default(), FusionModel::None);
    }
}
