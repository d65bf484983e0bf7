//! Numeric settings shared by the kernels (`ops`) and the precision plans (`precision`): kept
//! in their own small module so that `ops` does not depend on `precision`.

use crate::error::{Error, Result};
use serde::Serialize;

/// Accumulator type of matmul and conv kernels (`--accumulate`): f32 models the usual
/// tensor-core kernels, f16 models fp16-accumulating kernels (HGEMM with an f16 accumulator).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Accumulator {
    #[default]
    F32,
    F16,
}

impl Accumulator {
    pub fn parse(s: &str) -> Result<Accumulator> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Ok(Accumulator::F32),
            "f16" | "fp16" | "float16" => Ok(Accumulator::F16),
            _ => Err(Error::Invalid(format!(
                "--accumulate '{s}': valid choices are f32, f16"
            ))),
        }
    }
}

/// The float type a layer keeps its state in between the steps of a multi-step kernel (a
/// recurrent layer's hidden and cell state): the layer's own type under a float16/bfloat16
/// plan, f32 otherwise. Rounding is to nearest, ties to even, overflow to ±inf (as
/// `precision::round_value`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StateType {
    #[default]
    F32,
    F16,
    BF16,
}

impl StateType {
    /// `x` rounded to the state type.
    pub fn round(self, x: f32) -> f32 {
        match self {
            StateType::F32 => x,
            StateType::F16 => half::f16::from_f32(x).to_f32(),
            StateType::BF16 => half::bf16::from_f32(x).to_f32(),
        }
    }
}
