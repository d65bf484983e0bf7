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
