//! com.microsoft GatherBlockQuantized: Gather on block-quantized data, dequantized on the way
//! out — the embedding table of ONNX Runtime GenAI's int4 models.
//!
//! As ONNX Runtime's CPU kernel (`contrib_ops/cpu/quantization/gather_block_quantized.cc`):
//! `data` is uint4 or int4 (bits 4), or uint8 holding `8/bits` codes per byte along the last
//! axis (low nibble first), in which case `gather_axis` must be 0 and `quantize_axis` the last
//! axis and the output's last dimension is the packed one times `8/bits`. `scales` has data's
//! rank, `ceil(dim/block_size)` blocks along `quantize_axis` and data's dimensions elsewhere;
//! `zero_points` the scales' shape (uint8 with 4 bits: packed two per byte along the quantize
//! axis), default `2^(bits−1)` for uint8 and 0 for uint4/int4. Each output value is
//! `f32(q − zp)·scale` in f32, then the scales' type (float32 or float16). An index outside
//! `[−dim, dim)` gives a block of zeros, as in ONNX Runtime (no error).

use super::super::attrs::{boxed, AttrError, Attrs};
use super::super::shape::{fact, FactsResult};
use super::super::util::{float_slice, in_dtype, input, norm_axis, opt_input};
use super::super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use super::MS_DOMAIN;
use crate::graph::fact::{DimFact, Fact};
use crate::graph::Node;
use crate::tensor::{DType, Tensor, TensorData};

pub fn register(r: &mut Registry) {
    use InputRole::{Param, WeightScale, ZeroPoint};
    // The scales are T2, the output's type: they follow the layer's precision (ONNX Runtime's
    // float16 kernel computes `f32(q − zp)·f32(scale)` and narrows it, as this one does).
    r.add_in(MS_DOMAIN, "GatherBlockQuantized", gather_block_quantized)
        .parse(|n, _| boxed(GbqAttrs::parse(n)))
        .roles(&[Param, Param, WeightScale, ZeroPoint])
        .own_output_type()
        .infer(gbq_facts);
}

/// GatherBlockQuantized's attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct GbqAttrs {
    pub gather_axis: i64,
    pub quantize_axis: i64,
    pub block_size: usize,
    pub bits: usize,
}

impl GbqAttrs {
    fn parse(node: &Node) -> Result<GbqAttrs, AttrError> {
        let a = Attrs::new(node);
        let block_size = a.int_or("block_size", 128)?;
        if block_size < 16 || (block_size & (block_size - 1)) != 0 {
            return Err(AttrError::new(
                "block_size",
                format!("must be a power of 2 and at least 16, got {block_size}"),
            ));
        }
        let bits = a.int_or("bits", 4)?;
        if bits != 4 && bits != 8 {
            return Err(AttrError::new(
                "bits",
                format!("must be 4 or 8, got {bits}"),
            ));
        }
        Ok(GbqAttrs {
            gather_axis: a.int_or("gather_axis", 0)?,
            quantize_axis: a.int_or("quantize_axis", 1)?,
            block_size: block_size as usize,
            bits: bits as usize,
        })
    }
}

/// Codes per stored element: `8/bits` for uint8 data, 1 for uint4/int4.
fn components(attrs: &GbqAttrs, data: DType) -> Result<usize, OpError> {
    match data {
        DType::U8 => Ok(8 / attrs.bits),
        DType::U4 | DType::I4 if attrs.bits == 4 => Ok(1),
        DType::U4 | DType::I4 => Err(OpError(format!(
            "{data} data needs bits=4, got bits={}",
            attrs.bits
        ))),
        other => Err(OpError(format!(
            "data has dtype {other}, expected uint8, uint4 or int4"
        ))),
    }
}

/// The normalized gather and quantize axes, checked against the data type's constraints.
fn axes(attrs: &GbqAttrs, data: DType, rank: usize) -> Result<(usize, usize), OpError> {
    let g = norm_axis(attrs.gather_axis, rank)?;
    let q = norm_axis(attrs.quantize_axis, rank)?;
    if data == DType::U8 && (g != 0 || q + 1 != rank) {
        return Err(OpError(format!(
            "uint8 data needs gather_axis 0 and quantize_axis the last axis ({}), got {g} and {q}",
            rank - 1
        )));
    }
    Ok((g, q))
}

fn gather_block_quantized(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<GbqAttrs>()?;
    let (data, indices, scales) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    let rank = data.rank();
    if rank == 0 {
        return Err(OpError("data must have rank >= 1".into()));
    }
    let comp = components(attrs, data.dtype())?;
    let (ga, qa) = axes(attrs, data.dtype(), rank)?;
    if !matches!(indices.dtype(), DType::I32 | DType::I64) {
        return Err(OpError(format!(
            "indices has dtype {}, expected int32 or int64",
            indices.dtype()
        )));
    }
    if !matches!(scales.dtype(), DType::F32 | DType::F16) {
        return Err(OpError(format!(
            "scales has dtype {}, expected float32 or float16",
            scales.dtype()
        )));
    }
    // The logical (unpacked) data shape and the scales' shape it implies.
    let mut dims = data.shape().to_vec();
    dims[rank - 1] *= comp;
    let mut want_scales = dims.clone();
    want_scales[qa] = dims[qa].div_ceil(attrs.block_size);
    if scales.shape() != want_scales {
        return Err(OpError(format!(
            "scales {:?} must be {want_scales:?} (data {dims:?} in blocks of {} along axis {qa})",
            scales.shape(),
            attrs.block_size
        )));
    }
    let s = float_slice(scales, "scales")?;
    let q: Vec<i32> = match data.data() {
        TensorData::U8(v) if comp == 2 => v
            .iter()
            .flat_map(|&b| [(b & 0x0F) as i32, (b >> 4) as i32])
            .collect(),
        _ => data
            .to_i64_vec()
            .unwrap_or_default()
            .into_iter()
            .map(|x| x as i32)
            .collect(),
    };
    let scale_count = s.len();
    let zp: Option<Vec<i32>> = match opt_input(inputs, 3) {
        None => None,
        Some(z) => {
            let mut want = want_scales.clone();
            if comp == 2 {
                want[qa] = want[qa].div_ceil(2);
            }
            if z.dtype() != data.dtype() || z.shape() != want {
                return Err(OpError(format!(
                    "zero_points is {} {:?}, expected {} {want:?}",
                    z.dtype(),
                    z.shape(),
                    data.dtype()
                )));
            }
            Some(match z.data() {
                TensorData::U8(v) if comp == 2 => {
                    // Packed along the (last) quantize axis: each row of scales holds
                    // `blocks` values in `ceil(blocks/2)` bytes.
                    let blocks = want_scales[qa];
                    (0..scale_count)
                        .map(|i| {
                            let (row, b) = (i / blocks, i % blocks);
                            let byte = v[row * blocks.div_ceil(2) + b / 2];
                            ((byte >> (4 * (b & 1))) & 0x0F) as i32
                        })
                        .collect()
                }
                _ => z
                    .to_i64_vec()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|x| x as i32)
                    .collect(),
            })
        }
    };
    let default_zp = if data.dtype() == DType::U8 {
        1 << (attrs.bits - 1)
    } else {
        0
    };
    let idx = indices.to_i64_vec().unwrap_or_default();
    // Data as [gather_m, gather_dim, gather_block]; scales as [x, blocks, quantize_n].
    let gather_dim = dims[ga];
    let gather_m: usize = dims[..ga].iter().product();
    let gather_block: usize = dims[ga + 1..].iter().product();
    let quantize_dim = dims[qa];
    let quantize_n: usize = dims[qa + 1..].iter().product();
    let blocks = quantize_dim.div_ceil(attrs.block_size);
    let mut out = Vec::with_capacity(gather_m * idx.len() * gather_block);
    for m in 0..gather_m {
        for &i in &idx {
            let g = gather_dim as i64;
            if i < -g || i >= g {
                out.extend(std::iter::repeat_n(0.0, gather_block));
                continue;
            }
            let i = if i < 0 { i + g } else { i } as usize;
            let base = (m * gather_dim + i) * gather_block;
            for (d, &qd) in q.iter().enumerate().skip(base).take(gather_block) {
                let (x, y, z) = (
                    d / (quantize_dim * quantize_n),
                    d % (quantize_dim * quantize_n) / quantize_n,
                    d % quantize_n,
                );
                let si = (x * blocks + y / attrs.block_size) * quantize_n + z;
                let zp = zp.as_ref().map_or(default_zp, |z| z[si]);
                out.push((qd - zp) as f32 * s[si]);
            }
        }
    }
    let mut shape = dims[..ga].to_vec();
    shape.extend_from_slice(indices.shape());
    shape.extend_from_slice(&dims[ga + 1..]);
    Ok(vec![in_dtype(Tensor::from_f32(shape, out), scales.dtype())])
}

/// data's shape with the gather axis replaced by the indices' shape (the last dimension
/// unpacked for uint8 data), the scales' type.
fn gbq_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let attrs = ctx.attrs::<GbqAttrs>()?;
    let (data, indices, scales) = (fact(ins, 0)?, fact(ins, 1)?, fact(ins, 2)?);
    let shape = match (&data.shape, &indices.shape, data.dtype) {
        (Some(d), Some(ix), Some(dt)) if !d.is_empty() => {
            let comp = components(attrs, dt)?;
            let (ga, _) = axes(attrs, dt, d.len())?;
            let mut d = d.clone();
            let last = d.len() - 1;
            if comp > 1 {
                d[last] = d[last].mul(&DimFact::known(comp));
            }
            let mut s = d[..ga].to_vec();
            s.extend(ix.iter().cloned());
            s.extend(d[ga + 1..].iter().cloned());
            Some(s)
        }
        _ => None,
    };
    Ok(vec![Fact::new(scales.dtype, shape)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::node_with;
    use crate::graph::Attribute;
    use crate::lowbit::{I4, U4};

    fn ms_node(attrs: &[(&str, i64)]) -> Node {
        let a: Vec<(&str, Attribute)> =
            attrs.iter().map(|&(k, v)| (k, Attribute::Int(v))).collect();
        let mut n = node_with("GatherBlockQuantized", &a);
        n.domain = MS_DOMAIN.into();
        n
    }

    fn run(node: &Node, inputs: &[Option<&Tensor>]) -> Result<Tensor, OpError> {
        let k = Registry::global()
            .get(MS_DOMAIN, "GatherBlockQuantized")
            .unwrap();
        k(&OpCtx::new(node, 1), inputs).map(|mut v| v.remove(0))
    }

    fn u8s(shape: Vec<usize>, v: Vec<u8>) -> Tensor {
        Tensor::from_parts(shape, TensorData::U8(v.into()))
    }

    fn i64s(shape: Vec<usize>, v: Vec<i64>) -> Tensor {
        Tensor::from_parts(shape, TensorData::I64(v.into()))
    }

    /// uint8 data holds two codes per byte, low nibble first; zero points default to 8 and
    /// pack the same way; an out-of-range index gives zeros.
    #[test]
    fn packed_uint8_rows_dequantize() {
        let node = ms_node(&[("block_size", 16), ("bits", 4)]);
        // 2 rows of 32 codes (16 bytes each): row r, code c = (c + r) % 16.
        let bytes: Vec<u8> = (0..2)
            .flat_map(|r| {
                (0..16).map(move |j| (((2 * j + r) % 16) | (((2 * j + 1 + r) % 16) << 4)) as u8)
            })
            .collect();
        let data = u8s(vec![2, 16], bytes);
        let scales = Tensor::from_f32(vec![2, 2], vec![1.0, 2.0, 0.5, 0.25]);
        let idx = i64s(vec![3], vec![1, -2, 5]);
        let y = run(&node, &[Some(&data), Some(&idx), Some(&scales)]).unwrap();
        assert_eq!(y.shape(), &[3, 32]);
        let v = y.as_f32().unwrap();
        assert_eq!(v[0], (1 - 8) as f32 * 0.5);
        assert_eq!(v[16], (((16 + 1) % 16) - 8) as f32 * 0.25);
        assert_eq!(v[32 + 3], (3 - 8) as f32);
        assert!(v[64..].iter().all(|&x| x == 0.0));
        // Zero points: row 0 blocks (1, 2) → 0x21, row 1 (3, 4) → 0x43.
        let zp = u8s(vec![2, 1], vec![0x21, 0x43]);
        let y = run(&node, &[Some(&data), Some(&idx), Some(&scales), Some(&zp)]).unwrap();
        assert_eq!(y.as_f32().unwrap()[16], (1 - 4) as f32 * 0.25);
    }

    /// int4 data along gather_axis 1, quantize_axis 0; uint4 zero points; float16 scales give
    /// a float16 output.
    #[test]
    fn int4_gathers_along_any_axis() {
        let node = ms_node(&[("gather_axis", 1), ("quantize_axis", 0), ("block_size", 16)]);
        let vals: Vec<I4> = (0..32 * 3)
            .map(|i| I4::wrapping((i % 16) as i64 - 8))
            .collect();
        let data = Tensor::from_parts(vec![32, 3], TensorData::I4(vals.into()));
        let scales = Tensor::from_f32(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let idx = i64s(vec![1], vec![2]);
        let y = run(&node, &[Some(&data), Some(&idx), Some(&scales)]).unwrap();
        assert_eq!(y.shape(), &[32, 1]);
        let v = y.as_f32().unwrap();
        // Element (r, 2) = ((3r + 2) % 16 − 8) · scales[r / 16, 2].
        for r in 0..32 {
            let q = ((3 * r + 2) % 16) as f32 - 8.0;
            assert_eq!(v[r], q * [3.0, 6.0][r / 16], "row {r}");
        }
        let uvals: Vec<U4> = (0..32 * 3).map(|i| U4::wrapping(i as i64 % 16)).collect();
        let udata = Tensor::from_parts(vec![32, 3], TensorData::U4(uvals.into()));
        let zp = Tensor::from_parts(vec![2, 3], TensorData::U4(vec![U4::wrapping(1); 6].into()));
        let s16 = crate::ops::cast::cast_tensor(&scales, DType::F16);
        let y = run(&node, &[Some(&udata), Some(&idx), Some(&s16), Some(&zp)]).unwrap();
        assert_eq!(y.dtype(), DType::F16);
        assert_eq!(y.to_f32_vec().unwrap()[1], (5 - 1) as f32 * 3.0);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let node = ms_node(&[("block_size", 16)]);
        let data = u8s(vec![2, 16], vec![0; 32]);
        let idx = i64s(vec![1], vec![0]);
        let e = run(
            &node,
            &[
                Some(&data),
                Some(&idx),
                Some(&Tensor::from_f32(vec![2, 1], vec![1.0; 2])),
            ],
        )
        .unwrap_err();
        assert!(e.0.contains("scales [2, 1] must be [2, 2]"), "{e}");
        let n1 = ms_node(&[("block_size", 16), ("gather_axis", 1)]);
        let s = Tensor::from_f32(vec![2, 2], vec![1.0; 4]);
        let e = run(&n1, &[Some(&data), Some(&idx), Some(&s)]).unwrap_err();
        assert!(e.0.contains("gather_axis 0"), "{e}");
        let zp = u8s(vec![2, 2], vec![0; 4]);
        let e = run(&node, &[Some(&data), Some(&idx), Some(&s), Some(&zp)]).unwrap_err();
        assert!(e.0.contains("zero_points") && e.0.contains("[2, 1]"), "{e}");
        let f = Tensor::from_f32(vec![2, 16], vec![0.0; 32]);
        let e = run(&node, &[Some(&f), Some(&idx), Some(&s)]).unwrap_err();
        assert!(e.0.contains("uint8, uint4 or int4"), "{e}");
        for (attrs, what) in [
            (vec![("bits", 2)], "bits"),
            (vec![("block_size", 8)], "block_size"),
        ] {
            let e = GbqAttrs::parse(&ms_node(&attrs)).unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        }
    }
}
