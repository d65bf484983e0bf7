//! com.microsoft MatMulNBits: `Y = A × dequantize(B)ᵀ (+ bias)` with B stored as 4- or 8-bit
//! codes in blocks of `block_size` along K, the weight format of ONNX Runtime GenAI's model
//! builder and of ORT's `MatMulNBitsQuantizer`.
//!
//! Layout (contrib op schema, `matmul_nbits_helper.h`): B is `[N, k_blocks, blob_size]` uint8,
//! `k_blocks = ceil(K / block_size)`, `blob_size = block_size · bits / 8`, 4-bit codes two per
//! byte, the even element in the low nibble; `scales` `[N, k_blocks]` (or flat); `zero_points`
//! packed uint8 `[N, ceil(k_blocks · bits / 8)]` (low nibble first) or of the scales' float type
//! `[N, k_blocks]`, default `2^(bits−1)`; `g_idx` `[K]` (or padded to whole blocks) maps each k
//! to its block (act-order); `bias` `[N]`.
//!
//! ONNX Runtime 1.32's CPU kernel (`contrib_ops/cpu/quantization/matmul_nbits.cc`) takes one of
//! three paths, and this file takes the same one:
//! - g_idx or float zero points (4-bit only, `matmul_nbits_impl.cc`): each weight is
//!   `q·s + (−s·zp)` in f32; with g_idx, packed uint8 zero points are read but not used — the
//!   default 8 applies (measured against ORT 1.32; docs/numerics.md).
//! - `accuracy_level = 4` with B an initializer (ORT prepacks only constant B): MLAS's
//!   `SQNBIT_CompInt8`. Each row of A is quantized per block of K to int8 as
//!   `QuantizeARow_CompInt8_avx2` does (`scale = amax/127`, codes `round(a·(127/amax))` half to
//!   even, saturated; amax by MAXPS lanes, so a NaN can be dropped as x86 drops it), the block
//!   products are exact integer sums, scaled by `scale_a·scale_b` in f32, and the zero point
//!   enters as `(scale_a·Σq_a)·(−zp·scale_b)` per block (MLAS's "BlkSum").
//! - otherwise (`accuracy_level` 0–3, or B computed at run time): B dequantized to f32 as
//!   `(q − zp)·s` and an f32 product, the bias added as the product's initial value.
//!
//! Under a float16/bfloat16 plan A, the scales, float zero points and the bias arrive rounded
//! to the layer's type, the weights are dequantized to it (`(q − zp)·s` rounded once, as
//! ONNX Runtime's CUDA kernel dequantizes B into a float16 buffer for its GEMM) and the
//! product runs in f32 with the layer's accumulator: a GPU's arithmetic. ONNX Runtime's x86
//! CPU kernel computes a float16 layer as float32 instead (int8 path included) and only
//! narrows the output (docs/numerics.md, "Weight-only quantized ops").

use super::super::attrs::{boxed, AttrError, Attrs};
use super::super::matmul::sgemm;
use super::super::shape::{fact, FactsResult};
use super::super::util::{float_slice, in_dtype, input, opt_input};
use super::super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use super::MS_DOMAIN;
use crate::graph::fact::{DimFact, Fact};
use crate::graph::Node;
use crate::tensor::{DType, Tensor, TensorData};
use rayon::prelude::*;

pub fn register(r: &mut Registry) {
    use InputRole::{Bias, Data, Param, WeightScale};
    // The scales and float zero points are T1, A's type: they follow the layer's precision
    // (packed uint8 zero points are integers and keep theirs).
    r.add_in(MS_DOMAIN, "MatMulNBits", matmul_nbits)
        .parse(|n, _| boxed(NBitsAttrs::parse(n)))
        .roles(&[Data, Param, WeightScale, WeightScale, Param, Bias])
        .infer(nbits_facts)
        .flops(nbits_flops);
}

/// MatMulNBits' attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct NBitsAttrs {
    pub k: usize,
    pub n: usize,
    pub bits: usize,
    pub block_size: usize,
    pub accuracy_level: i64,
}

impl NBitsAttrs {
    fn parse(node: &Node) -> Result<NBitsAttrs, AttrError> {
        let a = Attrs::new(node);
        let positive = |name: &str| -> Result<usize, AttrError> {
            match a.int(name)? {
                Some(v) if v > 0 => Ok(v as usize),
                Some(v) => Err(AttrError::new(name, format!("must be positive, got {v}"))),
                None => Err(AttrError::new(name, "is required")),
            }
        };
        let (k, n) = (positive("K")?, positive("N")?);
        let bits = a.int_or("bits", 4)?;
        if bits != 4 && bits != 8 {
            return Err(AttrError::new(
                "bits",
                format!("must be 4 or 8, got {bits}"),
            ));
        }
        let block_size = positive("block_size")?;
        if block_size < 16 || !block_size.is_power_of_two() {
            return Err(AttrError::new(
                "block_size",
                format!("must be a power of 2 and at least 16, got {block_size}"),
            ));
        }
        Ok(NBitsAttrs {
            k,
            n,
            bits: bits as usize,
            block_size,
            accuracy_level: a.int_or("accuracy_level", 0)?,
        })
    }

    fn k_blocks(&self) -> usize {
        self.k.div_ceil(self.block_size)
    }

    fn blob_size(&self) -> usize {
        self.block_size * self.bits / 8
    }

    /// Bytes of packed uint8 zero points per column n.
    fn zp_blob(&self) -> usize {
        (self.k_blocks() * self.bits).div_ceil(8)
    }
}

/// The zero points of B, as the kernel reads them.
enum ZeroPoints<'a> {
    /// None given: `2^(bits−1)`.
    Default,
    /// Packed uint8, `zp_blob` bytes per column.
    Packed(&'a [u8]),
    /// Of the scales' float type, one per block.
    Float(Vec<f32>),
}

/// The quantized weight code `i` (along the padded K of column `n`'s blocks) from B's bytes.
#[inline]
fn code(b: &[u8], bits: usize, col_bytes: usize, n: usize, i: usize) -> u8 {
    let row = &b[n * col_bytes..];
    if bits == 8 {
        row[i]
    } else {
        (row[i / 2] >> (4 * (i & 1))) & 0x0F
    }
}

/// The packed uint8 zero point of column `n`, block `blk`.
#[inline]
fn packed_zp(z: &[u8], bits: usize, zp_blob: usize, n: usize, blk: usize) -> u8 {
    let row = &z[n * zp_blob..];
    if bits == 8 {
        row[blk]
    } else {
        (row[blk / 2] >> (4 * (blk & 1))) & 0x0F
    }
}

/// Checks every input against the attributes (ONNX Runtime's `CheckInputs`), each error naming
/// the input and the shape it must have.
struct Checked<'a> {
    b: &'a [u8],
    scales: Vec<f32>,
    zp: ZeroPoints<'a>,
    g_idx: Option<Vec<usize>>,
    bias: Option<Vec<f32>>,
}

fn check<'a>(attrs: &NBitsAttrs, inputs: &[Option<&'a Tensor>]) -> Result<Checked<'a>, OpError> {
    let (k, n, kb) = (attrs.k, attrs.n, attrs.k_blocks());
    let a = input(inputs, 0)?;
    if !a.dtype().is_float() {
        return Err(OpError(format!(
            "A has dtype {}, expected a float type",
            a.dtype()
        )));
    }
    if a.rank() == 0 || a.shape()[a.rank() - 1] != k {
        return Err(OpError(format!(
            "A {:?} contradicts K={k}: its last dimension must be K",
            a.shape()
        )));
    }
    let bt = input(inputs, 1)?;
    let want_b = [n, kb, attrs.blob_size()];
    let b = match bt.data() {
        TensorData::U8(v) if bt.shape() == want_b => &v[..],
        _ => {
            return Err(OpError(format!(
                "B is {} {:?}, expected uint8 {want_b:?} (N, ceil(K/block_size), block_size·bits/8 for K={k}, N={n}, bits={}, block_size={})",
                bt.dtype(),
                bt.shape(),
                attrs.bits,
                attrs.block_size
            )))
        }
    };
    let st = input(inputs, 2)?;
    let flat_or_2d = |t: &Tensor, cols: usize| t.shape() == [n * cols] || t.shape() == [n, cols];
    if !st.dtype().is_float() || !flat_or_2d(st, kb) {
        return Err(OpError(format!(
            "scales is {} {:?}, expected a float [{n}, {kb}] (N, ceil(K/block_size)) or [{}]",
            st.dtype(),
            st.shape(),
            n * kb
        )));
    }
    let scales = float_slice(st, "scales")?.into_owned();
    let zp = match opt_input(inputs, 3) {
        None => ZeroPoints::Default,
        Some(z) => match z.data() {
            TensorData::U8(v) => {
                let zb = attrs.zp_blob();
                if !flat_or_2d(z, zb) {
                    return Err(OpError(format!(
                        "zero_points is uint8 {:?}, expected [{n}, {zb}] (packed {} bits per block) or [{}]",
                        z.shape(),
                        attrs.bits,
                        n * zb
                    )));
                }
                ZeroPoints::Packed(&v[..])
            }
            // (ORT wants the scales' type; a plan may hold one of them narrowed, the other
            // widened, with the same values.)
            _ if z.dtype().is_float() && flat_or_2d(z, kb) => {
                ZeroPoints::Float(float_slice(z, "zero_points")?.into_owned())
            }
            _ => {
                return Err(OpError(format!(
                "zero_points is {} {:?}, expected packed uint8 or the scales' type {} [{n}, {kb}]",
                z.dtype(),
                z.shape(),
                st.dtype()
            )))
            }
        },
    };
    let g_idx = match opt_input(inputs, 4) {
        None => None,
        Some(g) => {
            let padded = kb * attrs.block_size;
            let ok_shape = g.shape() == [k] || g.shape() == [padded];
            let vals = match (g.dtype(), ok_shape) {
                (DType::I32, true) => g.to_i64_vec().unwrap_or_default(),
                _ => {
                    return Err(OpError(format!(
                        "g_idx is {} {:?}, expected int32 [{k}] (K) or [{padded}]",
                        g.dtype(),
                        g.shape()
                    )))
                }
            };
            if let Some((i, v)) = vals
                .iter()
                .enumerate()
                .find(|(_, &v)| v < 0 || v >= kb as i64)
            {
                return Err(OpError(format!(
                    "g_idx[{i}] is {v}, outside the blocks [0, {kb})"
                )));
            }
            Some(vals.into_iter().map(|v| v as usize).collect())
        }
    };
    let bias = match opt_input(inputs, 5) {
        None => None,
        Some(t) if t.dtype().is_float() && t.shape() == [n] => {
            Some(float_slice(t, "bias")?.into_owned())
        }
        Some(t) => {
            return Err(OpError(format!(
                "bias is {} {:?}, expected a float [{n}] (N)",
                t.dtype(),
                t.shape()
            )))
        }
    };
    Ok(Checked {
        b,
        scales,
        zp,
        g_idx,
        bias,
    })
}

fn matmul_nbits(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<NBitsAttrs>()?;
    let c = check(attrs, inputs)?;
    let (k, n) = (attrs.k, attrs.n);
    let at = input(inputs, 0)?;
    let a = float_slice(at, "A")?;
    let m = a.len() / k;
    let mut out_shape = at.shape()[..at.rank() - 1].to_vec();
    out_shape.push(n);
    let reordered = c.g_idx.is_some() || matches!(c.zp, ZeroPoints::Float(_));
    if reordered && attrs.bits != 4 {
        return Err(OpError(format!(
            "g_idx and float zero_points need bits=4 (ONNX Runtime's CPU kernel), got bits={}",
            attrs.bits
        )));
    }
    // The int8 path is ORT's CPU kernel's; a float16/bfloat16 layer dequantizes to its type.
    let int8 = attrs.accuracy_level == 4
        && !reordered
        && attrs.block_size <= 256
        && ctx.prepacked(1).is_some()
        && ctx.round_to.is_none();
    let y = if int8 {
        int8_product(attrs, &c, &a, m)
    } else {
        let mut w = dequantize(attrs, &c);
        ctx.rounder()(&mut w);
        let mut y = vec![0f32; m * n];
        if let Some(bias) = &c.bias {
            y.par_chunks_mut(n)
                .for_each(|row| row.copy_from_slice(bias));
        }
        sgemm(
            ctx.accumulate,
            m,
            n,
            k,
            &a,
            false,
            &w,
            true,
            &mut y,
            c.bias.is_some(),
        );
        y
    };
    Ok(vec![in_dtype(Tensor::from_f32(out_shape, y), at.dtype())])
}

/// MLAS's `SQNBIT_CompInt8` product `a·dequantize(B)ᵀ (+ bias)` of `a` (`[m, k]`) and B's
/// codes `[n, k/block_size, block_size·bits/8]` (k a whole number of blocks), scales
/// `[n, k/block_size]` and packed zero points, as MatMulNBits' int8 path computes it: QMoE's
/// CPU kernel runs its constant experts through the same MLAS kernels (`moe.rs`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn int8_matmul(
    (k, n, bits, block_size): (usize, usize, usize, usize),
    b: &[u8],
    scales: &[f32],
    zero_points: Option<&[u8]>,
    bias: Option<&[f32]>,
    a: &[f32],
    m: usize,
) -> Vec<f32> {
    let attrs = NBitsAttrs {
        k,
        n,
        bits,
        block_size,
        accuracy_level: 4,
    };
    let c = Checked {
        b,
        scales: scales.to_vec(),
        zp: zero_points.map_or(ZeroPoints::Default, ZeroPoints::Packed),
        g_idx: None,
        bias: bias.map(<[f32]>::to_vec),
    };
    int8_product(&attrs, &c, a, m)
}

/// B as f32 `[N, K]`: `(q − zp)·s`, or on the reordered path (g_idx or float zero points)
/// `q·s + (−s·zp)` with the block of each k from g_idx.
fn dequantize(attrs: &NBitsAttrs, c: &Checked) -> Vec<f32> {
    let (k, bs, bits, kb) = (attrs.k, attrs.block_size, attrs.bits, attrs.k_blocks());
    let col_bytes = kb * attrs.blob_size();
    let zp_blob = attrs.zp_blob();
    let default_zp = (1u32 << (bits - 1)) as f32;
    let reordered = c.g_idx.is_some() || matches!(c.zp, ZeroPoints::Float(_));
    let mut w = vec![0f32; attrs.n * k];
    w.par_chunks_mut(k).enumerate().for_each(|(col, row)| {
        for (i, w) in row.iter_mut().enumerate() {
            let q = code(c.b, bits, col_bytes, col, i) as f32;
            if reordered {
                let blk = c.g_idx.as_ref().map_or(i / bs, |g| g[i]);
                let s = c.scales[col * kb + blk];
                // With g_idx, ORT 1.32 reads packed uint8 zero points into a variable it never
                // uses: the default applies.
                let zp = match &c.zp {
                    ZeroPoints::Float(z) => z[col * kb + blk],
                    _ => default_zp,
                };
                *w = q * s + -s * zp;
            } else {
                let blk = i / bs;
                let zp = match c.zp {
                    ZeroPoints::Packed(z) => packed_zp(z, bits, zp_blob, col, blk) as f32,
                    _ => default_zp,
                };
                *w = (q - zp) * c.scales[col * kb + blk];
            }
        }
    });
    w
}

/// One row of A quantized per block as MLAS's `QuantizeARow_CompInt8_avx2`: codes (the block
/// padded with zeros), the block scales and `scale·Σcodes` per block.
fn quantize_row(row: &[f32], bs: usize) -> (Vec<i8>, Vec<f32>, Vec<f32>) {
    let kb = row.len().div_ceil(bs);
    let mut codes = vec![0i8; kb * bs];
    let (mut scales, mut sums) = (Vec::with_capacity(kb), Vec::with_capacity(kb));
    let i8s = super::qlinear::CodeType {
        lo: -128,
        hi: 127,
        dtype: DType::I8,
    };
    for (blk, vals) in row.chunks(bs).enumerate() {
        let amax = x86_abs_max(vals);
        let scale = amax / 127.0;
        let inv = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in codes[blk * bs..].iter_mut().zip(vals) {
            *q = i8s.convert_saturate(v * inv) as i8;
            sum += *q as i32;
        }
        scales.push(scale);
        sums.push(scale * sum as f32);
    }
    (codes, scales, sums)
}

/// `max |v|` as MLAS computes it: MAXPS over 8 lanes (element `j` of every group of 8 in lane
/// `j`), then the lanes folded 8 → 4 → 2 → 1. MAXPS returns its second operand when either is
/// NaN, so a NaN survives only as the last value of lane 3 (the fold keeps the low lanes' NaN
/// first, then drops lanes 0–2's).
fn x86_abs_max(vals: &[f32]) -> f32 {
    let maxps = |a: f32, b: f32| if a > b { a } else { b };
    let mut lanes = [0f32; 8];
    for group in vals.chunks(8) {
        for (l, &v) in lanes.iter_mut().zip(group) {
            *l = maxps(*l, v.abs());
        }
        // Lanes past a short group load zeros.
        for l in lanes.iter_mut().skip(group.len()) {
            *l = maxps(*l, 0.0);
        }
    }
    let m4: Vec<f32> = (0..4).map(|j| maxps(lanes[4 + j], lanes[j])).collect();
    let m2 = [maxps(m4[0], m4[2]), maxps(m4[1], m4[3])];
    maxps(m2[0], m2[1])
}

/// ORT's `SQNBIT_CompInt8` product: per block, the exact integer sum of A's int8 codes times
/// B's unsigned codes scaled by `scale_a·scale_b`, plus `(scale_a·Σq_a)·(−zp·scale_b)`, then the
/// bias. 4-bit blocks of 32 follow MLAS's AVX2 kernels operation for operation
/// ([`int8_product_blk32`]); other widths and block sizes sum the block terms in order.
fn int8_product(attrs: &NBitsAttrs, c: &Checked, a: &[f32], m: usize) -> Vec<f32> {
    if attrs.bits == 4 && attrs.block_size == 32 {
        return int8_product_blk32(attrs, c, a, m);
    }
    let (k, n, bs, bits, kb) = (
        attrs.k,
        attrs.n,
        attrs.block_size,
        attrs.bits,
        attrs.k_blocks(),
    );
    let col_bytes = kb * attrs.blob_size();
    let zp_blob = attrs.zp_blob();
    let default_zp = (1u32 << (bits - 1)) as f32;
    // B's codes unpacked once, and −zp·scale per block.
    let mut qb = vec![0u8; n * kb * bs];
    qb.par_chunks_mut(kb * bs)
        .enumerate()
        .for_each(|(col, row)| {
            for (i, q) in row.iter_mut().enumerate() {
                *q = code(c.b, bits, col_bytes, col, i);
            }
        });
    let zp_scaled: Vec<f32> = (0..n * kb)
        .map(|i| {
            let (col, blk) = (i / kb, i % kb);
            let zp = match c.zp {
                ZeroPoints::Packed(z) => packed_zp(z, bits, zp_blob, col, blk) as f32,
                _ => default_zp,
            };
            -zp * c.scales[i]
        })
        .collect();
    let mut y = vec![0f32; m * n];
    y.par_chunks_mut(n).enumerate().for_each(|(row, out)| {
        let (qa, sa, suma) = quantize_row(&a[row * k..(row + 1) * k], bs);
        for (col, y) in out.iter_mut().enumerate() {
            let qcol = &qb[col * kb * bs..(col + 1) * kb * bs];
            let mut zp_part = 0f32;
            let mut dot_part = 0f32;
            for blk in 0..kb {
                let range = blk * bs..(blk + 1) * bs;
                let dot: i32 = qa[range.clone()]
                    .iter()
                    .zip(&qcol[range])
                    .map(|(&x, &w)| x as i32 * w as i32)
                    .sum();
                zp_part += suma[blk] * zp_scaled[col * kb + blk];
                dot_part += (sa[blk] * c.scales[col * kb + blk]) * dot as f32;
            }
            let bias = c.bias.as_ref().map_or(0.0, |b| b[col]);
            *y = zp_part + dot_part + bias;
        }
    });
    y
}

/// The eight lanes of an AVX register added as MLAS's `hsum_float_8` does: high half onto low
/// half, lanes 2–3 onto 0–1, lane 1 onto lane 0.
fn hsum8(l: &[f32; 8]) -> f32 {
    let r = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// One column's eight lanes as MLAS's `FoldAccumulators` reduces them (the columns of a group
/// of four): each 128-bit half in order, then the two halves.
fn fold4(l: &[f32; 8]) -> f32 {
    (((l[0] + l[1]) + l[2]) + l[3]) + (((l[4] + l[5]) + l[6]) + l[7])
}

/// MLAS's `SQNBIT_CompInt8` product for 4-bit blocks of 32 on an AVX2 CPU
/// (`sqnbitgemm_kernel_avx2.cpp`, `sqnbitgemm_kernel_avx2_int8_blklen32.h`), bit for bit.
///
/// Each output keeps eight f32 lanes; every step adds `fma(isum, scale_a·scale_b, lane)` to a
/// lane, `isum` an exact integer sum of code products:
/// - M > 1 (`MlasQ4Int8GemmKernelBlkLen32Avx2`): B's unsigned codes; a pair of blocks j, j+1
///   gives lane l the 8 elements from `16·(l≥4) + 8·(l odd)` of block `j + (l>>1 & 1)`; a last
///   odd block gives lane l its elements 4l..4l+3. The lanes are folded (`FoldAccumulators` for
///   the columns in whole groups of four, `hsum_float_8` for the rest), the bias added, and
///   then `GemmFloatKernel` adds the zero points: `y = (Σ_blk fma chain of (scale_a·Σq_a) ·
///   (−scale_b·zp), from 0) + y`.
/// - M = 1 (`MlasQ4Int8GemmM1KernelBlkLen32Avx2`): B's codes minus the zero point in the
///   products; without zero points (8) the lanes as above, with them each block of a pair
///   gives lane l its elements 4l..4l+3 (block j, then block j+1); fold, bias; no second pass.
///
/// ONNX Runtime splits M into ranges of 128 rows when it runs with a thread pool, and a range of
/// one row takes the M = 1 kernel: this models one range (an ORT session with one intra-op
/// thread, or M ≢ 1 mod 128).
fn int8_product_blk32(attrs: &NBitsAttrs, c: &Checked, a: &[f32], m: usize) -> Vec<f32> {
    const BS: usize = 32;
    let (k, n, kb) = (attrs.k, attrs.n, attrs.k_blocks());
    let col_bytes = kb * attrs.blob_size();
    let zp_blob = attrs.zp_blob();
    let explicit_zp = matches!(c.zp, ZeroPoints::Packed(_));
    let zp = |col: usize, blk: usize| -> i32 {
        match c.zp {
            ZeroPoints::Packed(z) => packed_zp(z, 4, zp_blob, col, blk) as i32,
            _ => 8,
        }
    };
    let mut qb = vec![0u8; n * kb * BS];
    qb.par_chunks_mut(kb * BS)
        .enumerate()
        .for_each(|(col, row)| {
            for (i, q) in row.iter_mut().enumerate() {
                *q = code(c.b, 4, col_bytes, col, i);
            }
        });
    let signed = m == 1;
    let whole_groups = n / 4 * 4;
    let mut y = vec![0f32; m * n];
    y.par_chunks_mut(n).enumerate().for_each(|(row, out)| {
        let (qa, sa, suma) = quantize_row(&a[row * k..(row + 1) * k], BS);
        for (col, y) in out.iter_mut().enumerate() {
            let qcol = &qb[col * kb * BS..(col + 1) * kb * BS];
            let sb = &c.scales[col * kb..(col + 1) * kb];
            // B's code at element e of block blk, minus the zero point on the M = 1 path.
            let w = |blk: usize, e: usize| -> i32 {
                let q = qcol[blk * BS + e] as i32;
                if signed {
                    q - zp(col, blk)
                } else {
                    q
                }
            };
            let isum = |blk: usize, from: usize, len: usize| -> f32 {
                (from..from + len)
                    .map(|e| qa[blk * BS + e] as i32 * w(blk, e))
                    .sum::<i32>() as f32
            };
            let mut lanes = [0f32; 8];
            let mut j = 0;
            while j + 1 < kb {
                if signed && explicit_zp {
                    for blk in [j, j + 1] {
                        let s = sa[blk] * sb[blk];
                        for (l, lane) in lanes.iter_mut().enumerate() {
                            *lane = isum(blk, 4 * l, 4).mul_add(s, *lane);
                        }
                    }
                } else {
                    let s = [sa[j] * sb[j], sa[j + 1] * sb[j + 1]];
                    for (l, lane) in lanes.iter_mut().enumerate() {
                        let half = (l >> 1) & 1;
                        let from = if l >= 4 { 16 } else { 0 } + (l & 1) * 8;
                        *lane = isum(j + half, from, 8).mul_add(s[half], *lane);
                    }
                }
                j += 2;
            }
            if j < kb {
                let s = sa[j] * sb[j];
                for (l, lane) in lanes.iter_mut().enumerate() {
                    *lane = isum(j, 4 * l, 4).mul_add(s, *lane);
                }
            }
            let mut v = if col < whole_groups {
                fold4(&lanes)
            } else {
                hsum8(&lanes)
            };
            if let Some(b) = &c.bias {
                v += b[col];
            }
            if !signed {
                let mut t = 0f32;
                for blk in 0..kb {
                    t = suma[blk].mul_add(-sb[blk] * zp(col, blk) as f32, t);
                }
                v += t;
            }
            *y = v;
        }
    });
    y
}

/// A's shape with the last dimension N, A's type.
fn nbits_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let attrs = ctx.attrs::<NBitsAttrs>()?;
    let a = fact(ins, 0)?;
    let shape = match &a.shape {
        Some(s) if !s.is_empty() => {
            if let Some(last) = s[s.len() - 1].as_known() {
                if last != attrs.k {
                    return Err(OpError(format!(
                        "A's last dimension {last} contradicts K={}",
                        attrs.k
                    )));
                }
            }
            let mut d = s[..s.len() - 1].to_vec();
            d.push(DimFact::known(attrs.n));
            Some(d)
        }
        _ => None,
    };
    Ok(vec![Fact::new(a.dtype, shape)])
}

/// Two per multiply-add: the output's elements times K.
fn nbits_flops(node: &Node, _: &[Option<Vec<usize>>], outs: &[Vec<usize>]) -> u64 {
    let k = super::super::attrs::opset_free::<NBitsAttrs>(node).map_or(0, |a| a.k as u64);
    2 * k
        * outs
            .first()
            .map_or(0, |s| s.iter().product::<usize>() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::node_with;
    use crate::graph::Attribute;

    fn ms_node(attrs: &[(&str, i64)]) -> Node {
        let a: Vec<(&str, Attribute)> =
            attrs.iter().map(|&(k, v)| (k, Attribute::Int(v))).collect();
        let mut n = node_with("MatMulNBits", &a);
        n.domain = MS_DOMAIN.into();
        n
    }

    /// Packs `codes` ([N, K] in 0..2^bits) as B: [N, k_blocks, blob], low nibble first.
    fn pack(codes: &[Vec<u8>], bits: usize, bs: usize) -> Tensor {
        let n = codes.len();
        let kb = codes[0].len().div_ceil(bs);
        let blob = bs * bits / 8;
        let mut b = vec![0u8; n * kb * blob];
        for (col, row) in codes.iter().enumerate() {
            for (i, &q) in row.iter().enumerate() {
                let base = col * kb * blob;
                if bits == 8 {
                    b[base + i] = q;
                } else {
                    b[base + i / 2] |= q << (4 * (i & 1));
                }
            }
        }
        Tensor::from_parts(vec![n, kb, blob], TensorData::U8(b.into()))
    }

    fn run(node: &Node, inputs: &[Option<&Tensor>]) -> Result<Tensor, OpError> {
        let k = Registry::global().get(MS_DOMAIN, "MatMulNBits").unwrap();
        k(&OpCtx::new(node, 1), inputs).map(|mut v| v.remove(0))
    }

    /// Codes unpack low nibble first; the default zero point is 8 (4-bit) or 128 (8-bit);
    /// packed zero points are per block, low nibble first; K need not fill the last block.
    #[test]
    fn dequantizes_packed_codes_and_zero_points() {
        // K=20, block 16: two blocks, the second with 4 elements.
        let codes: Vec<Vec<u8>> = vec![(0..20).map(|i| (i % 16) as u8).collect(), vec![9; 20]];
        let b = pack(&codes, 4, 16);
        assert_eq!(b.shape(), &[2, 2, 8]);
        let s = Tensor::from_f32(vec![2, 2], vec![1.0, 0.5, 2.0, 0.25]);
        let a = Tensor::from_f32(
            vec![1, 20],
            (0..20).map(|i| if i == 17 { 1.0 } else { 0.0 }).collect(),
        );
        let node = ms_node(&[("K", 20), ("N", 2), ("bits", 4), ("block_size", 16)]);
        let y = run(&node, &[Some(&a), Some(&b), Some(&s)]).unwrap();
        // Column 0, k=17: code 1, block 1: (1 − 8)·0.5; column 1: (9 − 8)·0.25.
        assert_eq!(y.as_f32().unwrap(), &[-3.5, 0.25]);
        // Packed zero points: column 0 blocks (3, 5) → byte 0x53; column 1 (0, 9) → 0x90.
        let z = Tensor::from_parts(vec![2, 1], TensorData::U8(vec![0x53u8, 0x90].into()));
        let y = run(&node, &[Some(&a), Some(&b), Some(&s), Some(&z)]).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[(1.0 - 5.0) * 0.5, 0.0]);
        // 8-bit: one byte per code, default zero point 128.
        let codes8: Vec<Vec<u8>> = vec![(0..20).map(|i| 120 + i as u8).collect()];
        let b8 = pack(&codes8, 8, 16);
        let s8 = Tensor::from_f32(vec![2], vec![1.0, 2.0]);
        let node8 = ms_node(&[("K", 20), ("N", 1), ("bits", 8), ("block_size", 16)]);
        let y = run(&node8, &[Some(&a), Some(&b8), Some(&s8)]).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[(137.0 - 128.0) * 2.0]);
        // A 3-D A keeps its leading dimensions; the bias is added.
        let a3 = Tensor::from_f32(
            vec![2, 1, 20],
            [a.as_f32().unwrap(), a.as_f32().unwrap()].concat(),
        );
        let bias = Tensor::from_f32(vec![2], vec![10.0, 20.0]);
        let y = run(
            &node,
            &[Some(&a3), Some(&b), Some(&s), None, None, Some(&bias)],
        )
        .unwrap();
        assert_eq!(y.shape(), &[2, 1, 2]);
        assert_eq!(y.as_f32().unwrap(), &[6.5, 20.25, 6.5, 20.25]);
    }

    /// g_idx picks each k's block; float zero points apply per block; with g_idx, packed
    /// uint8 zero points are ignored as ONNX Runtime 1.32 ignores them.
    #[test]
    fn g_idx_and_float_zero_points_follow_onnxruntime() {
        let codes: Vec<Vec<u8>> = vec![vec![10; 32]];
        let b = pack(&codes, 4, 16);
        let s = Tensor::from_f32(vec![1, 2], vec![1.0, 3.0]);
        let a = Tensor::from_f32(
            vec![1, 32],
            (0..32).map(|i| if i == 0 { 1.0 } else { 0.0 }).collect(),
        );
        let node = ms_node(&[("K", 32), ("N", 1), ("bits", 4), ("block_size", 16)]);
        // k=0 belongs to block 1.
        let mut g: Vec<i32> = (0..32).map(|i| i / 16).collect();
        g[0] = 1;
        let g = Tensor::from_parts(vec![32], TensorData::I32(g.into()));
        let y = run(&node, &[Some(&a), Some(&b), Some(&s), None, Some(&g)]).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[(10.0 - 8.0) * 3.0]);
        let z = Tensor::from_parts(vec![1, 1], TensorData::U8(vec![0x00u8].into()));
        let y = run(&node, &[Some(&a), Some(&b), Some(&s), Some(&z), Some(&g)]).unwrap();
        assert_eq!(
            y.as_f32().unwrap(),
            &[6.0],
            "uint8 zero points ignored with g_idx"
        );
        let zf = Tensor::from_f32(vec![1, 2], vec![0.0, 9.5]);
        let y = run(&node, &[Some(&a), Some(&b), Some(&s), Some(&zf), Some(&g)]).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[10.0 * 3.0 - 3.0 * 9.5]);
        // 8 bits have no such path in ONNX Runtime.
        let node8 = ms_node(&[("K", 32), ("N", 1), ("bits", 8), ("block_size", 16)]);
        let b8 = pack(&[vec![0u8; 32]], 8, 16);
        let e = run(&node8, &[Some(&a), Some(&b8), Some(&s), None, Some(&g)]).unwrap_err();
        assert!(e.0.contains("bits=4"), "{e}");
    }

    /// A is quantized per block as MLAS's AVX2 code does: amax/127, codes rounded half to
    /// even, a NaN dropped by MAXPS unless last in lane 3.
    #[test]
    fn a_quantizes_to_int8_per_block_as_mlas() {
        let row: Vec<f32> = (0..20).map(|i| i as f32 - 10.0).collect();
        let (q, s, sums) = quantize_row(&row, 16);
        assert_eq!(s, vec![10.0 / 127.0, 9.0 / 127.0]);
        assert_eq!(q.len(), 32);
        assert_eq!(q[0], -127);
        assert_eq!(q[5], (-5.0f32 * (127.0 / 10.0)).round_ties_even() as i8);
        assert_eq!(&q[16..20], &[85, 99, 113, 127].map(|v: i32| v as i8)[..]);
        assert!(q[20..].iter().all(|&v| v == 0), "padding is zero");
        let total: i32 = q[..16].iter().map(|&v| v as i32).sum();
        assert_eq!(sums[0], s[0] * total as f32);
        // NaN followed by a number in its lane is forgotten; last in its lane, it stays.
        let mut v = vec![1.0f32; 16];
        v[0] = f32::NAN;
        assert_eq!(x86_abs_max(&v), 1.0);
        v[0] = 1.0;
        v[8] = f32::NAN;
        assert_eq!(x86_abs_max(&v), 1.0, "lane 0's NaN is dropped by the fold");
        v[8] = 1.0;
        v[11] = f32::NAN;
        assert!(x86_abs_max(&v).is_nan(), "only lane 3's survives the fold");
        assert_eq!(x86_abs_max(&[0.0; 16]), 0.0);
        let (q, s, _) = quantize_row(&[0.0; 16], 16);
        assert!(q.iter().all(|&v| v == 0) && s == vec![0.0]);
    }

    /// 4-bit blocks of 32 with accuracy_level 4 take MLAS's AVX2 kernels: column 4 repeats
    /// column 0 but folds its lanes as `hsum_float_8` (a fifth column), column 0 as
    /// `FoldAccumulators`; M = 1 subtracts the zero point in the products, M > 1 adds it in a
    /// second pass. The bits are those of a numpy model of the kernels that reproduces ORT
    /// 1.32 on SmolLM2's layers (and the contrib cases `nbits_exact_*`).
    #[test]
    fn int4_blocks_of_32_follow_the_avx2_kernels() {
        let k = 96; // a pair of blocks and a last odd one
        let col0: Vec<u8> = (0..k).map(|i| ((i * 7 + 3) % 16) as u8).collect();
        let codes: Vec<Vec<u8>> = (0..5)
            .map(|c| {
                if c % 4 == 0 {
                    col0.clone()
                } else {
                    (0..k).map(|i| ((i * 5 + c * 3) % 16) as u8).collect()
                }
            })
            .collect();
        let b = pack(&codes, 4, 32);
        let scales: Vec<f32> = (0..5)
            .flat_map(|c| {
                (0..3).map(move |blk| (0.01 + ((c % 4) * 3 + blk) as f64 * 0.0037) as f32)
            })
            .collect();
        let s = Tensor::from_f32(vec![5, 3], scales);
        let row: Vec<f32> = (0..k)
            .map(|i| ((((i * 37) % 101) as f64 - 50.0) * 0.013) as f32)
            .collect();
        let node = ms_node(&[
            ("K", k as i64),
            ("N", 5),
            ("bits", 4),
            ("block_size", 32),
            ("accuracy_level", 4),
        ]);
        let attrs = NBitsAttrs::parse(&node).unwrap();
        let bits = |m: usize| -> Vec<u32> {
            let a = Tensor::from_f32(vec![m, k], row.repeat(m));
            let c = check(&attrs, &[Some(&a), Some(&b), Some(&s)]).unwrap();
            let y = int8_product_blk32(&attrs, &c, &row.repeat(m), m);
            y[..5].iter().map(|v| v.to_bits()).collect()
        };
        assert_eq!(
            bits(1),
            [0x3deb70c3, 0x3d1e50c8, 0x3eaab976, 0x3d3bd7b0, 0x3deb70c4]
        );
        assert_eq!(
            bits(2),
            [0x3deb70c6, 0x3d1e50c8, 0x3eaab976, 0x3d3bd7bc, 0x3deb70c4]
        );
    }

    /// Bad inputs are one-line errors naming the input and the expected shape; bad attributes
    /// name the attribute.
    #[test]
    fn bad_inputs_are_errors() {
        let node = ms_node(&[("K", 32), ("N", 2), ("bits", 4), ("block_size", 16)]);
        let a = Tensor::from_f32(vec![3, 32], vec![0.0; 96]);
        let b = Tensor::from_parts(vec![2, 2, 8], TensorData::U8(vec![0u8; 32].into()));
        let s = Tensor::from_f32(vec![2, 2], vec![1.0; 4]);
        let err = |ins: &[Option<&Tensor>]| run(&node, ins).unwrap_err().0;
        let short = Tensor::from_parts(vec![2, 2, 7], TensorData::U8(vec![0u8; 28].into()));
        let e = err(&[Some(&a), Some(&short), Some(&s)]);
        assert!(
            e.starts_with("B is uint8 [2, 2, 7], expected uint8 [2, 2, 8]"),
            "{e}"
        );
        let e = err(&[
            Some(&a),
            Some(&b),
            Some(&Tensor::from_f32(vec![2, 3], vec![1.0; 6])),
        ]);
        assert!(e.contains("scales") && e.contains("[2, 3]"), "{e}");
        let a31 = Tensor::from_f32(vec![3, 31], vec![0.0; 93]);
        let e = err(&[Some(&a31), Some(&b), Some(&s)]);
        assert!(e.contains("contradicts K=32"), "{e}");
        let z = Tensor::from_parts(vec![2, 2], TensorData::U8(vec![0u8; 4].into()));
        let e = err(&[Some(&a), Some(&b), Some(&s), Some(&z)]);
        assert!(e.contains("zero_points") && e.contains("[2, 1]"), "{e}");
        let g = Tensor::from_parts(vec![32], TensorData::I32(vec![2i32; 32].into()));
        let e = err(&[Some(&a), Some(&b), Some(&s), None, Some(&g)]);
        assert!(e.contains("g_idx[0] is 2"), "{e}");
        let bias = Tensor::from_f32(vec![3], vec![0.0; 3]);
        let e = err(&[Some(&a), Some(&b), Some(&s), None, None, Some(&bias)]);
        assert!(e.contains("bias") && e.contains("[2]"), "{e}");
        assert!(!e.contains('\n'));
        for (attrs, what) in [
            (
                vec![("K", 32), ("N", 2), ("bits", 3), ("block_size", 16)],
                "bits",
            ),
            (
                vec![("K", 32), ("N", 2), ("bits", 4), ("block_size", 24)],
                "block_size",
            ),
            (
                vec![("K", 0), ("N", 2), ("bits", 4), ("block_size", 16)],
                "K",
            ),
            (vec![("N", 2), ("bits", 4), ("block_size", 16)], "K"),
        ] {
            let e = NBitsAttrs::parse(&ms_node(&attrs)).unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        }
    }

    /// Under a float16 plan the dequantized weights are float16 values (the int8 path of
    /// accuracy_level 4 is the CPU kernel's: not taken).
    #[test]
    fn weights_round_to_the_plans_type() {
        let node = ms_node(&[("K", 16), ("N", 1), ("bits", 4), ("block_size", 16)]);
        let b = pack(&[vec![9u8; 16]], 4, 16);
        let s = Tensor::from_f32(vec![1], vec![0.1]);
        let a = Tensor::from_f32(
            vec![1, 16],
            (0..16).map(|i| if i == 0 { 1.0 } else { 0.0 }).collect(),
        );
        let mut ctx = OpCtx::new(&node, 1);
        ctx.round_to = Some(crate::numeric::Rounding::F16);
        let y = matmul_nbits(&ctx, &[Some(&a), Some(&b), Some(&s)]).unwrap();
        let want = half::f16::from_f32(0.1).to_f32();
        assert_eq!(y[0].as_f32().unwrap(), &[want]);
        let ctx = OpCtx::new(&node, 1);
        let y = matmul_nbits(&ctx, &[Some(&a), Some(&b), Some(&s)]).unwrap();
        assert_eq!(y[0].as_f32().unwrap(), &[0.1]);
    }
}
