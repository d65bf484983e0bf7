//! (to be filled) softmax kernels.

use super::Registry;

pub fn register(_r: &mut Registry) {}
