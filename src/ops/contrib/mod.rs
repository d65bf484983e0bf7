//! Ops of the `com.microsoft` domain (and the few ONNX Runtime adds to the default domain) that
//! ONNX Runtime's transformer optimizer and graph optimizations write into saved models: fused
//! activations, fused Conv/MatMul, the skip/simplified layer normalizations, attention
//! (GroupQueryAttention and SparseAttention too), rotary embeddings (MRotaryEmbedding too), GatedAdd and the mixtures of experts (MoE, QMoE), the causal convolutions (CausalConvWithState, VarlenCausalConvWithState) and GatedRMSNorm. Each computes what
//! ONNX Runtime's CPU kernel computes (`onnxruntime/contrib_ops/cpu/`); tests compare them with
//! ONNX Runtime (tests/integration/contrib.rs).
//!
//! Under a precision plan a contrib op is one layer like any other: its inputs are rounded to
//! the layer's type, it computes in f32 (the fused steps are not materialized, as in ONNX
//! Runtime's and TensorRT's fused kernels), its outputs are rounded (docs/numerics.md,
//! "Contrib ops").

mod activation;
mod attention;
mod causal_conv;
pub(crate) mod dynamic_quantize_lstm;
mod fused;
mod gated_add;
mod gated_rms_norm;
mod gather_block_quantized;
mod group_query_attention;
mod linear_attention;
pub(crate) mod matmul_nbits;
mod moe;
mod mrotary;
mod norm;
pub(crate) mod qlinear;
mod qlinear_binary;
mod qlinear_pool;
mod sparse_attention;

use super::Registry;

/// The `com.microsoft` domain's name.
pub const MS_DOMAIN: &str = "com.microsoft";

pub fn register(r: &mut Registry) {
    activation::register(r);
    attention::register(r);
    dynamic_quantize_lstm::register(r);
    fused::register(r);
    gated_add::register(r);
    group_query_attention::register(r);
    gather_block_quantized::register(r);
    linear_attention::register(r);
    matmul_nbits::register(r);
    moe::register(r);
    mrotary::register(r);
    norm::register(r);
    qlinear::register(r);
    qlinear_binary::register(r);
    qlinear_pool::register(r);
    sparse_attention::register(r);
    causal_conv::register(r);
    gated_rms_norm::register(r);
}

/// What a kernel rounds its in-kernel values of the input's type to, where ONNX Runtime's
/// kernel keeps them in that type (MRotaryEmbedding's scaled angles, GatedAdd's product): the
/// layer's float16/bfloat16 under a precision plan, else a float16/bfloat16 input's own type,
/// else none (float32).
fn type_rounding(
    ctx: &super::OpCtx,
    dtype: crate::tensor::DType,
) -> Option<crate::numeric::Rounding> {
    use crate::numeric::Rounding;
    use crate::tensor::DType;
    ctx.round_to.or(match dtype {
        DType::F16 => Some(Rounding::F16),
        DType::BF16 => Some(Rounding::BF16),
        _ => None,
    })
}

/// The last dimension of `x`, which a 1-D `bias` of a fused op must have; an error naming the
/// bias otherwise.
fn check_bias(x: &[usize], bias: &[usize], what: &str) -> Result<usize, super::OpError> {
    let c = x.last().copied().unwrap_or(1);
    if bias != [c] {
        return Err(super::OpError(format!(
            "{what} {bias:?} must be 1-D with the input's last dimension {c} (input {x:?})"
        )));
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every contrib op has a shape rule and is found only under its domain.
    #[test]
    fn contrib_ops_are_registered_under_their_domain() {
        let r = Registry::global();
        let ms = r.op_types_in(MS_DOMAIN);
        for op in [
            "FusedConv",
            "FusedMatMul",
            "Gelu",
            "FastGelu",
            "BiasGelu",
            "QuickGelu",
            "BiasAdd",
            "SkipLayerNormalization",
            "SkipSimplifiedLayerNormalization",
            "Attention",
            "MultiHeadAttention",
            "RotaryEmbedding",
            "GroupQueryAttention",
            "QLinearSigmoid",
            "QLinearLeakyRelu",
            "QLinearConcat",
            "QLinearAdd",
            "QLinearMul",
            "QLinearGlobalAveragePool",
            "QLinearAveragePool",
            "DynamicQuantizeLSTM",
            "MatMulNBits",
            "GatherBlockQuantized",
            "MoE",
            "QMoE",
            "MRotaryEmbedding",
            "GatedAdd",
            "SparseAttention",
            "CausalConvWithState",
            "VarlenCausalConvWithState",
            "GatedRMSNorm",
            "LinearAttentionGate",
            "LinearAttention",
            "GatedDeltaNet",
        ] {
            assert!(ms.contains(&op), "{op} is missing from {ms:?}");
        }
        for op in &ms {
            let d = r.def(MS_DOMAIN, op).unwrap();
            assert!(d.infer.is_some(), "{op} has no shape rule");
        }
        assert!(r.def("", "FusedConv").is_none());
        assert!(r.def("", "SimplifiedLayerNormalization").is_some());
    }

    #[test]
    fn a_bias_must_match_the_last_dimension() {
        assert_eq!(check_bias(&[2, 3, 4], &[4], "bias").unwrap(), 4);
        let e = check_bias(&[2, 3, 4], &[3], "bias").unwrap_err();
        assert!(e.0.contains("bias [3]") && e.0.contains('4'), "{e}");
    }
}
