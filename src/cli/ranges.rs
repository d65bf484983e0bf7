//! Activation ranges for int8/fp8 plans (`crate::jobs::ranges`), with the calibration's
//! progress bar and notes on stderr.

use super::precision_args::PrecisionArgs;
use super::progress::{print_event, Bar};
use crate::exec::Feeds;
use crate::precision::plan::PrecisionPlan;
use crate::Interpreter;
use anyhow::Result;
use std::collections::BTreeMap;
use std::io::IsTerminal;

/// None when the plan has no quantized layer.
pub fn ranges_for_plan(
    interp: &Interpreter,
    plan: &PrecisionPlan,
    args: &PrecisionArgs,
    feeds: &[Feeds],
) -> Result<Option<BTreeMap<String, f32>>> {
    let bar = Bar::calibration(std::io::stderr().is_terminal());
    Ok(crate::jobs::ranges::ranges_for_plan(
        interp,
        plan,
        &args.options(),
        feeds,
        &mut print_event,
        &bar,
    )?)
}
