//! com.microsoft MRotaryEmbedding (multimodal rotary embedding, M-RoPE: Qwen2-VL, Qwen2.5-VL,
//! Qwen3-VL text models in ONNX Runtime GenAI's layout) as ONNX Runtime 1.32's CPU kernel
//! computes it (contrib_ops/cpu/bert/mrotary_embedding.cc, mrotary_embedding_helper.h).
//!
//! Each token has three positions (temporal, height, width: `position_ids` `[3, B, S]`), each
//! a row of the same cos/sin caches. Column `c` of the token's rotation angles comes from the
//! stream that `mrope_section` and `mrope_layout` assign to `c`: contiguous sections T, H, W
//! (layout 0), or T everywhere with H at columns 1, 4, 7, … below `3·section_h` and W at
//! 2, 5, 8, … below `3·section_w` (layout 1). The gathered values are multiplied by `scale`
//! and rounded to the input's type, then the rotation is RotaryEmbedding's (MLAS's kernel,
//! [`rotate`]); features past the rotary dimension are copied.

use super::super::attention::{rotary_caches, rotate, RotaryInput};
use super::super::attrs::{boxed, AttrError, Attrs};
use super::super::util::{input, input_i64s};
use super::super::{InputRole, OpCtx, OpError, OpResult, Registry};
use super::MS_DOMAIN;
use crate::graph::Node;
use crate::tensor::Tensor;

pub fn register(r: &mut Registry) {
    use InputRole::{Data, Param};
    r.add_in(MS_DOMAIN, "MRotaryEmbedding", mrotary_embedding)
        .parse(|n, _| boxed(MRotaryAttrs::parse(n)))
        .roles(&[Data, Param, Data, Data])
        .infer(super::super::shape::same_as_input);
}

/// How the three position streams share the rotary columns (`mrope_layout`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum MRopeLayout {
    /// Contiguous sections: T, then H, then W.
    Sectioned,
    /// T everywhere; H and W every third column from 1 and 2.
    Interleaved,
}

#[derive(Clone, Debug, PartialEq)]
struct MRotaryAttrs {
    /// 0: not given.
    num_heads: usize,
    /// 0: the whole head.
    rotary_dim: usize,
    interleaved: bool,
    packed_batching: bool,
    scale: f32,
    /// Columns of the T, H and W streams.
    section: [usize; 3],
    layout: MRopeLayout,
}

impl MRotaryAttrs {
    fn parse(node: &Node) -> Result<MRotaryAttrs, AttrError> {
        let a = Attrs::new(node);
        let nonneg = |name: &str| -> Result<usize, AttrError> {
            let v = a.int_or(name, 0)?;
            usize::try_from(v).map_err(|_| AttrError::new(name, format!("must be >= 0, got {v}")))
        };
        let num_heads = nonneg("num_heads")?;
        let rotary_dim = nonneg("rotary_embedding_dim")?;
        if rotary_dim > 0 && num_heads == 0 {
            return Err(AttrError::new(
                "num_heads",
                "must be given (> 0) with rotary_embedding_dim",
            ));
        }
        let section = a
            .ints("mrope_section")?
            .ok_or_else(|| AttrError::new("mrope_section", "missing (the op needs it)"))?;
        let section: [usize; 3] = match section[..] {
            [t, h, w] if t >= 0 && h >= 0 && w >= 0 => [t as usize, h as usize, w as usize],
            _ => {
                return Err(AttrError::new(
                    "mrope_section",
                    format!("must be 3 non-negative sizes (T, H, W), got {section:?}"),
                ))
            }
        };
        let layout = match a.int_or("mrope_layout", 0)? {
            0 => MRopeLayout::Sectioned,
            1 => MRopeLayout::Interleaved,
            v => {
                return Err(AttrError::new(
                    "mrope_layout",
                    format!("must be 0 (sectioned) or 1 (interleaved), got {v}"),
                ))
            }
        };
        Ok(MRotaryAttrs {
            num_heads,
            rotary_dim,
            interleaved: a.flag("interleaved", false)?,
            packed_batching: a.flag("is_packed_batching", false)?,
            scale: a.float_or("scale", 1.0)?,
            section,
            layout,
        })
    }
}

/// The stream (0 T, 1 H, 2 W) each of the `half` rotary columns takes its angles from.
fn column_streams(section: [usize; 3], layout: MRopeLayout, half: usize) -> Vec<usize> {
    let mut streams = vec![0; half];
    match layout {
        MRopeLayout::Sectioned => {
            let owners = (0..3).flat_map(|s| std::iter::repeat_n(s, section[s]));
            for (slot, s) in streams.iter_mut().zip(owners) {
                *slot = s;
            }
        }
        MRopeLayout::Interleaved => {
            for (s, &len) in section.iter().enumerate().skip(1) {
                for c in (s..(3 * len).min(half)).step_by(3) {
                    streams[c] = s;
                }
            }
        }
    }
    streams
}

fn mrotary_embedding(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<MRotaryAttrs>()?;
    let x = input(inputs, 0)?;
    // (batch, sequence, head size) and the heads of a 3-D input.
    let (b, s, head_size, num_heads) = match *x.shape() {
        [b, s, d] => {
            let n = attrs.num_heads;
            if n == 0 || d % n != 0 {
                return Err(OpError(format!(
                    "input {:?}: hidden size {d} does not split into num_heads={n} heads (a 3-D \
                     input needs num_heads > 0 dividing it)",
                    x.shape()
                )));
            }
            (b, s, d / n, Some(n))
        }
        [b, _, s, h] => (b, s, h, None),
        _ => {
            return Err(OpError(format!(
                "input {:?} must be [B, S, D] or [B, N, S, H]",
                x.shape()
            )))
        }
    };
    let pos_t = input(inputs, 1)?;
    if pos_t.shape() != [3, b, s] {
        return Err(OpError(format!(
            "position_ids {:?} must be [3, {b}, {s}] (T, H, W positions per token)",
            pos_t.shape()
        )));
    }
    let pos = input_i64s(inputs, 1)?;
    let (cos, sin, half) = rotary_caches(input(inputs, 2)?, input(inputs, 3)?, 2)?;
    let max_pos = input(inputs, 2)?.shape()[0];
    let rd = if attrs.rotary_dim > 0 {
        attrs.rotary_dim
    } else {
        head_size
    };
    if rd > head_size || rd % 2 != 0 || rd / 2 != half {
        return Err(OpError(format!(
            "rotary dimension {rd} must be even, at most the head size {head_size} and twice \
             the caches' width {half}"
        )));
    }
    let total: usize = attrs.section.iter().sum();
    if total != half {
        return Err(OpError(format!(
            "mrope_section {:?} sums to {total}, not the rotary dimension's half {half}",
            attrs.section
        )));
    }
    if !attrs.packed_batching && s > max_pos {
        return Err(OpError(format!(
            "sequence length {s} exceeds the caches' {max_pos} rows (ONNX Runtime does not \
             extend them)"
        )));
    }
    if let Some((i, p)) = pos
        .iter()
        .enumerate()
        .find(|&(_, &p)| usize::try_from(p).map_or(true, |p| p >= max_pos))
    {
        return Err(OpError(format!(
            "position_ids value {p} (stream {}) is outside the caches' {max_pos} rows",
            ["T", "H", "W"][i / (b * s).max(1)]
        )));
    }
    // The kernel gathers the angles in the input's type: a scale other than 1 is rounded to
    // it (float16 under a precision plan, whose caches arrive rounded).
    let rounding = super::type_rounding(ctx, x.dtype());
    let scaled = |v: f32| {
        let v = v * attrs.scale;
        rounding.map_or(v, |r| r.round(v))
    };
    let streams = column_streams(attrs.section, attrs.layout, half);
    let tokens = b * s;
    let mut token_cos = vec![0f32; tokens * half];
    let mut token_sin = vec![0f32; tokens * half];
    for t in 0..tokens {
        for (c, &stream) in streams.iter().enumerate() {
            let row = pos[stream * tokens + t] as usize;
            token_cos[t * half + c] = scaled(cos[row * half + c]);
            token_sin[t * half + c] = scaled(sin[row * half + c]);
        }
    }
    let r = RotaryInput {
        x,
        num_heads,
        rotary_dim: rd,
        interleaved: attrs.interleaved,
        cos: &token_cos,
        sin: &token_sin,
        half,
    };
    Ok(vec![rotate(&r, |bi, si, s| Ok(bi * s + si))?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::node_with;
    use crate::graph::Attribute;

    fn node(attrs: &[(&str, Attribute)]) -> Node {
        let mut n = node_with("MRotaryEmbedding", attrs);
        n.domain = MS_DOMAIN.into();
        n
    }

    fn run(node: &Node, inputs: &[&Tensor]) -> Result<Tensor, OpError> {
        crate::ops::attrs::parse_node(node, 1).map_err(|e| OpError(e.to_string()))?;
        let k = Registry::global()
            .get(MS_DOMAIN, "MRotaryEmbedding")
            .unwrap();
        let inputs: Vec<Option<&Tensor>> = inputs.iter().map(|&t| Some(t)).collect();
        k(&OpCtx::new(node, 1), &inputs).map(|mut v| v.remove(0))
    }

    fn section(t: i64, h: i64, w: i64) -> (&'static str, Attribute) {
        ("mrope_section", Attribute::Ints(vec![t, h, w]))
    }

    #[test]
    fn columns_follow_the_sections_or_every_third_column() {
        assert_eq!(
            column_streams([2, 1, 3], MRopeLayout::Sectioned, 6),
            [0, 0, 1, 2, 2, 2]
        );
        // Qwen3-VL: H at 1, 4 (below 3·2), W at 2 (below 3·1); T elsewhere.
        assert_eq!(
            column_streams([3, 2, 1], MRopeLayout::Interleaved, 6),
            [0, 1, 2, 0, 1, 0]
        );
        assert_eq!(
            column_streams([1, 2, 3], MRopeLayout::Interleaved, 6),
            [0, 1, 2, 0, 1, 2]
        );
    }

    /// One head of 4 features (2 columns), one token: column 0 takes the T position's angle,
    /// column 1 the H position's (sections [1, 1, 0]).
    #[test]
    fn each_column_rotates_by_its_streams_position() {
        let n = node(&[("num_heads", Attribute::Int(1)), section(1, 1, 0)]);
        let x = Tensor::from_f32(vec![1, 1, 4], vec![1.0, 2.0, 3.0, 4.0]);
        // T = 0 (no rotation), H = 1 (90°), W = 0.
        let pos = Tensor::from_i64(vec![3, 1, 1], vec![0, 1, 0]);
        let cos = Tensor::from_f32(vec![2, 2], vec![1.0, 1.0, 0.0, 0.0]);
        let sin = Tensor::from_f32(vec![2, 2], vec![0.0, 0.0, 1.0, 1.0]);
        let y = run(&n, &[&x, &pos, &cos, &sin]).unwrap();
        // Pair (x0, x2) unrotated; pair (x1, x3) = (2, 4) by 90°: (-4, 2).
        assert_eq!(y.as_f32().unwrap(), &[1.0, -4.0, 3.0, 2.0]);
        // The scale multiplies the gathered angles.
        let n = node(&[
            ("num_heads", Attribute::Int(1)),
            section(1, 1, 0),
            ("scale", Attribute::Float(2.0)),
        ]);
        let y = run(&n, &[&x, &pos, &cos, &sin]).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[2.0, -8.0, 6.0, 4.0]);
    }

    #[test]
    fn bad_inputs_and_attributes_are_named() {
        let x = Tensor::from_f32(vec![1, 2, 8], vec![0.5; 16]);
        let pos = Tensor::from_i64(vec![3, 1, 2], vec![0, 1, 0, 1, 0, 1]);
        let c = Tensor::from_f32(vec![4, 4], vec![1.0; 16]);
        let ok = node(&[("num_heads", Attribute::Int(1)), section(2, 1, 1)]);
        assert!(run(&ok, &[&x, &pos, &c, &c]).is_ok());
        let err = |n: &Node, ins: &[&Tensor]| run(n, ins).unwrap_err().0;
        let e = err(&node(&[section(2, 1, 1)]), &[&x, &pos, &c, &c]);
        assert!(e.contains("num_heads=0"), "{e}");
        let e = err(
            &node(&[("num_heads", Attribute::Int(1)), section(2, 2, 1)]),
            &[&x, &pos, &c, &c],
        );
        assert!(e.contains("mrope_section [2, 2, 1] sums to 5"), "{e}");
        let flat = Tensor::from_i64(vec![1, 2], vec![0, 1]);
        let e = err(&ok, &[&x, &flat, &c, &c]);
        assert!(e.contains("position_ids [1, 2] must be [3, 1, 2]"), "{e}");
        let far = Tensor::from_i64(vec![3, 1, 2], vec![0, 1, 0, 4, 0, 1]);
        let e = err(&ok, &[&x, &far, &c, &c]);
        assert!(e.contains("value 4 (stream H)"), "{e}");
        let narrow = Tensor::from_f32(vec![4, 3], vec![1.0; 12]);
        let e = err(&ok, &[&x, &pos, &narrow, &narrow]);
        assert!(e.contains("caches' width 3"), "{e}");
        let e = err(
            &ok,
            &[&Tensor::from_f32(vec![16], vec![0.0; 16]), &pos, &c, &c],
        );
        assert!(e.contains("must be [B, S, D] or [B, N, S, H]"), "{e}");
        for (attrs, what) in [
            (vec![section(2, 1, -1)], "mrope_section"),
            (
                vec![("mrope_section", Attribute::Ints(vec![4]))],
                "mrope_section",
            ),
            (
                vec![section(2, 1, 1), ("mrope_layout", Attribute::Int(2))],
                "mrope_layout",
            ),
            (
                vec![
                    section(2, 1, 1),
                    ("rotary_embedding_dim", Attribute::Int(8)),
                ],
                "num_heads",
            ),
            (vec![], "mrope_section"),
        ] {
            let e = err(&node(&attrs), &[&x, &pos, &c, &c]);
            assert!(e.contains(&format!("attribute '{what}'")), "{e}");
        }
    }
}
