//! (to be filled) elementwise kernels.

use super::Registry;

pub fn register(_r: &mut Registry) {}
