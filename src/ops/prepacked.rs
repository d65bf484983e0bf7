//! Forms of a constant input that a kernel derives once and keeps: a convolution's weights
//! packed into the panels its product reads (ONNX Runtime's PrePack). The interpreter hands a
//! kernel one [`Prepacked`] per input whose values are the same on every run (a graph
//! initializer, or a weight a precision plan converted in advance), and none for any other
//! input, so a kept form can never outlive or mismatch the values it was derived from.

use std::any::Any;

/// The tags of the kept forms, in one place so that no two kernels' forms of one input collide.
pub mod tag {
    /// A convolution's weights packed as `conv::weight_panels` packs them.
    pub const GATHERED_WEIGHTS: u64 = 1;
    /// Integer weight codes minus their zero points as f32 (`integer::FloatWeights`).
    pub const FLOAT_WEIGHTS: u64 = 2;
    /// A DynamicQuantizeLSTM weight's `QuantSet`.
    pub const QUANTIZED_WEIGHTS: u64 = 3;
    /// A quantized MatMul/Gemm operand's integer codes as f32, by operand (`exec/qdq.rs`).
    pub const QDQ_OPERAND_CODES: [u64; 2] = [4, 5];
    /// A MatMul's or Gemm's constant B packed whole into panels (`sgemm::PackedB`), as
    /// stored and as stored transposed (Gemm's `transB`).
    pub const PACKED_B: u64 = 6;
    pub const PACKED_B_TRANSPOSED: u64 = 7;
    /// Depthwise weights tap by tap, every channel's weight of a tap together
    /// (`conv::depthwise::TapMajor`).
    pub const DEPTHWISE_TAP_MAJOR: u64 = 8;
    /// A recurrent layer's W or R, each direction's `[gates·hidden, K]` transposed to
    /// `[K, gates·hidden]` (`recurrent::Weights::Float`).
    pub const RECURRENT_TRANSPOSED: u64 = 9;
    /// A MatMul's constant B packed whole as [`PACKED_B`] after rounding to float16 or
    /// bfloat16 (`ops::matmul`: a plan's rounded weight, packed from the stored one).
    pub const PACKED_B_ROUNDED: [u64; 2] = [10, 11];
    /// A MatMulInteger's constant B minus its zero points, packed for the pair-product
    /// kernel (`int_gemm::PackedIntB`).
    pub const INTEGER_B: u64 = 12;
    /// A ConvTranspose's weights packed as `conv::transposed_weight_panels` packs them.
    pub const TRANSPOSED_CONV_WEIGHTS: u64 = 13;
    /// A convolution's weights in tiles of output channels (`conv::planar::ChannelTiles`).
    pub const PLANAR_WEIGHTS: u64 = 14;
}
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Derived forms of one constant input, by the tag of the kernel's layout.
#[derive(Default)]
pub struct Prepacked(Mutex<HashMap<u64, Arc<dyn Any + Send + Sync>>>);

impl Prepacked {
    /// The form kept under `tag`, made by `make` the first time. A `make` that fails keeps
    /// nothing; a form of another type under the same tag is made afresh and not kept.
    pub fn get_or_try_insert<T, E>(
        &self,
        tag: u64,
        make: impl FnOnce() -> Result<T, E>,
    ) -> Result<Arc<T>, E>
    where
        T: Any + Send + Sync,
    {
        // One kernel makes the form while any other waits for it (a poisoned lock only means
        // a panic elsewhere: the map itself is never left half-written).
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(form) = kept.get(&tag) {
            if let Ok(form) = Arc::clone(form).downcast::<T>() {
                return Ok(form);
            }
            return make().map(Arc::new);
        }
        let form = Arc::new(make()?);
        kept.insert(tag, form.clone());
        Ok(form)
    }

    /// The form kept under `tag`, made by `make` the first time (see
    /// [`get_or_try_insert`](Self::get_or_try_insert)).
    pub fn get_or_insert<T: Any + Send + Sync>(
        &self,
        tag: u64,
        make: impl FnOnce() -> T,
    ) -> Arc<T> {
        match self.get_or_try_insert::<T, std::convert::Infallible>(tag, || Ok(make())) {
            Ok(form) => form,
            Err(never) => match never {},
        }
    }

    /// How many forms are kept.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `make`'s value, kept in `kept` under `tag` when the input has such a place (a constant),
/// made afresh otherwise.
pub fn kept_or_made<T: Any + Send + Sync>(
    kept: Option<&Prepacked>,
    tag: u64,
    make: impl FnOnce() -> T,
) -> Arc<T> {
    match kept {
        Some(kept) => kept.get_or_insert(tag, make),
        None => Arc::new(make()),
    }
}

impl std::fmt::Debug for Prepacked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Prepacked({} forms)", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_is_made_once_per_tag_and_a_failure_keeps_nothing() {
        let kept = Prepacked::default();
        let mut made = 0;
        for _ in 0..3 {
            let v = kept
                .get_or_try_insert::<_, ()>(1, || {
                    made += 1;
                    Ok(vec![1.0f32, 2.0])
                })
                .unwrap();
            assert_eq!(*v, [1.0, 2.0]);
        }
        assert_eq!(made, 1);
        assert!(kept
            .get_or_try_insert::<Vec<f32>, _>(2, || Err("bad"))
            .is_err());
        assert_eq!(kept.len(), 1);
        // Another type under a kept tag: made, not kept, the kept form untouched.
        assert_eq!(*kept.get_or_try_insert::<_, ()>(1, || Ok(7u8)).unwrap(), 7);
        assert_eq!(kept.len(), 1);
    }
}
