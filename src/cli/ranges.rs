//! Activation ranges for int8/fp8 plans: from `--calibration-cache`, or calibrated on the fly.

use super::precision_args::PrecisionArgs;
use crate::exec::Feeds;
use crate::precision::plan::PrecisionPlan;
use crate::Interpreter;
use anyhow::{bail, Result};
use std::collections::BTreeMap;

/// None when the plan has no quantized layer.
pub fn ranges_for_plan(
    _interp: &Interpreter,
    plan: &PrecisionPlan,
    _args: &PrecisionArgs,
    _feeds: &[Feeds],
) -> Result<Option<BTreeMap<String, f32>>> {
    if !PrecisionArgs::needs_ranges(plan) {
        return Ok(None);
    }
    bail!("int8/fp8 layers need calibration, which this build does not have yet")
}
