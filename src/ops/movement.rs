//! (to be filled) movement kernels.

use super::Registry;

pub fn register(_r: &mut Registry) {}
