//! MatMul, Gemm and Einsum, on the `gemm` crate.
//!
//! All f32 products go through [`sgemm`]: it is the one place where accumulation happens
//! (f32, inside the gemm micro-kernels), so reduced-precision accumulation can be modelled there.

use super::attrs::{boxed, opset_free, AttrError, Attrs};
use super::util::{broadcast_shapes, input, opt_input};
use super::{OpCtx, OpError, OpResult, Registry};
use crate::numeric::Accumulator;
use crate::tensor::{strides_of, DType, Tensor};
use gemm::Parallelism;

pub fn register(r: &mut Registry) {
    r.add("MatMul", matmul_op);
    r.add("Gemm", gemm_op);
    r.add("Einsum", einsum_op);
    use super::InputRole::{Bias, Data};
    r.def_mut("MatMul")
        .rounds_weights(&[1])
        .quantized(&[0, 1], |_, i, rank| match i {
            1 => Some(rank - 1),
            _ if rank >= 2 => Some(rank - 2),
            _ => Some(0),
        })
        .infer(matmul_facts)
        .flops(|_, ins, outs| {
            let out = outs
                .first()
                .map_or(0, |s| s.iter().product::<usize>() as u64);
            let k = ins
                .first()
                .cloned()
                .flatten()
                .and_then(|s| s.last().copied());
            2 * out * k.unwrap_or(0) as u64
        })
        .epilogue(matmul_epilogue_shape);
    r.def_mut("Gemm")
        .parse(|n, _| boxed(GemmAttrs::parse(n)))
        .roles(&[Data, Data, Bias])
        .quantized(&[0, 1], |node, i, _| {
            let a = opset_free::<GemmAttrs>(node)?;
            Some(match i {
                0 => a.trans_a as usize,
                _ => !a.trans_b as usize,
            })
        })
        .infer(gemm_facts)
        .flops(|node, ins, outs| {
            let out = outs
                .first()
                .map_or(0, |s| s.iter().product::<usize>() as u64);
            let a = ins.first().cloned().flatten().unwrap_or_default();
            let k = if opset_free::<GemmAttrs>(node).is_some_and(|g| g.trans_a) {
                a.first()
            } else {
                a.last()
            };
            let has_bias = ins.get(2).is_some_and(|s| s.is_some());
            2 * out * k.copied().unwrap_or(0) as u64 + if has_bias { out } else { 0 }
        });
    r.def_mut("Einsum")
        .parse(|n, _| boxed(EinsumAttrs::parse(n)))
        .infer(einsum_facts)
        .flops(einsum_flops);
}

/// Gemm's attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmAttrs {
    pub trans_a: bool,
    pub trans_b: bool,
    pub alpha: f32,
    pub beta: f32,
}

impl GemmAttrs {
    fn parse(node: &crate::graph::Node) -> Result<GemmAttrs, AttrError> {
        let a = Attrs::new(node);
        Ok(GemmAttrs {
            trans_a: a.flag("transA", false)?,
            trans_b: a.flag("transB", false)?,
            alpha: a.float_or("alpha", 1.0)?,
            beta: a.float_or("beta", 1.0)?,
        })
    }
}

/// Einsum's equation, without whitespace.
#[derive(Clone, Debug, PartialEq)]
pub struct EinsumAttrs {
    pub equation: String,
}

impl EinsumAttrs {
    fn parse(node: &crate::graph::Node) -> Result<EinsumAttrs, AttrError> {
        let eq = Attrs::new(node)
            .string("equation")?
            .ok_or_else(|| AttrError::new("equation", "missing (the op needs it)"))?;
        let equation: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
        if let Some(c) = equation
            .chars()
            .find(|c| !(c.is_ascii_alphabetic() || matches!(c, ',' | '-' | '>' | '.')))
        {
            return Err(AttrError::new(
                "equation",
                format!("'{eq}': '{c}' is not a letter, ',', '->' or '...'"),
            ));
        }
        if equation.matches("->").count() > 1 {
            return Err(AttrError::new(
                "equation",
                format!("'{eq}' has more than one '->'"),
            ));
        }
        Ok(EinsumAttrs { equation })
    }
}

use super::shape::{fact, FactsResult};
use super::InferCtx;
use crate::graph::fact::{DimFact, Fact};

/// NumPy matmul: 1-D operands promoted and the added axis removed, batch dims broadcast.
pub(crate) fn matmul_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let (a, b) = (fact(ins, 0)?, fact(ins, 1)?);
    let (Some(sa), Some(sb)) = (&a.shape, &b.shape) else {
        return Ok(vec![Fact::new(a.dtype, None)]);
    };
    if sa.is_empty() || sb.is_empty() {
        return Err(OpError("MatMul operands must have rank >= 1".into()));
    }
    let one = DimFact::known(1);
    let a2: Vec<DimFact> = if sa.len() == 1 {
        vec![one.clone(), sa[0].clone()]
    } else {
        sa.clone()
    };
    let b2: Vec<DimFact> = if sb.len() == 1 {
        vec![sb[0].clone(), one]
    } else {
        sb.clone()
    };
    let (m, k) = (&a2[a2.len() - 2], &a2[a2.len() - 1]);
    let (k2, n) = (&b2[b2.len() - 2], &b2[b2.len() - 1]);
    if let (Some(x), Some(y)) = (k.as_known(), k2.as_known()) {
        if x != y {
            return Err(OpError(format!(
                "inner dimensions differ: A {} x B {}",
                a.shape_string(),
                b.shape_string()
            )));
        }
    }
    let batch = super::shape::broadcast(
        ctx,
        &[
            Some(&a2[..a2.len() - 2].to_vec()),
            Some(&b2[..b2.len() - 2].to_vec()),
        ],
    )?
    .unwrap_or_default();
    let mut out = batch;
    if sa.len() > 1 {
        out.push(m.clone());
    }
    if sb.len() > 1 {
        out.push(n.clone());
    }
    Ok(vec![Fact::new(a.dtype, Some(out))])
}

fn gemm_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let (a, b) = (fact(ins, 0)?, fact(ins, 1)?);
    let g = ctx.attrs::<GemmAttrs>()?;
    let (ta, tb) = (g.trans_a, g.trans_b);
    for f in [a, b] {
        if f.rank().is_some_and(|r| r != 2) {
            return Err(OpError(format!(
                "Gemm needs 2-D A and B, got {} and {}",
                a.shape_string(),
                b.shape_string()
            )));
        }
    }
    let pick = |f: &Fact, i: usize| {
        f.shape
            .as_ref()
            .map_or_else(|| ctx.unknown_dim(), |s| s[i].clone())
    };
    let (m, k) = if ta {
        (pick(a, 1), pick(a, 0))
    } else {
        (pick(a, 0), pick(a, 1))
    };
    let (k2, n) = if tb {
        (pick(b, 1), pick(b, 0))
    } else {
        (pick(b, 0), pick(b, 1))
    };
    if let (Some(x), Some(y)) = (k.as_known(), k2.as_known()) {
        if x != y {
            return Err(OpError(format!(
                "inner dimensions differ: A {} (transA={}) x B {} (transB={})",
                a.shape_string(),
                ta as u8,
                b.shape_string(),
                tb as u8
            )));
        }
    }
    Ok(vec![Fact::new(a.dtype, Some(vec![m, n]))])
}

/// Einsum without ellipses: every letter's size from the operands, the output's letters from
/// the equation (or, implicitly, the letters seen once, sorted).
fn einsum_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let first = fact(ins, 0)?;
    let eq = &ctx.attrs::<EinsumAttrs>()?.equation;
    if eq.contains("...") {
        return Ok(vec![Fact::new(first.dtype, None)]);
    }
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r.to_string())),
        None => (eq.as_str(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != ins.len() {
        return Err(OpError(format!(
            "equation '{eq}' has {} operands, node has {}",
            terms.len(),
            ins.len()
        )));
    }
    let mut sizes: std::collections::HashMap<char, DimFact> = Default::default();
    let mut count: std::collections::BTreeMap<char, usize> = Default::default();
    for (term, f) in terms.iter().zip(ins) {
        let f = f.ok_or_else(|| OpError("an operand is missing".into()))?;
        if let Some(s) = &f.shape {
            if s.len() != term.len() {
                return Err(OpError(format!(
                    "term '{term}' has {} letters for an operand of rank {}",
                    term.len(),
                    s.len()
                )));
            }
            for (c, d) in term.chars().zip(s) {
                let e = sizes.entry(c).or_insert_with(|| d.clone());
                if !e.is_known() || e.is(1) {
                    *e = d.clone();
                }
            }
        }
        for c in term.chars() {
            *count.entry(c).or_default() += 1;
        }
    }
    let out_letters: String = rhs.unwrap_or_else(|| {
        count
            .iter()
            .filter(|(_, &n)| n == 1)
            .map(|(c, _)| *c)
            .collect()
    });
    let shape: Vec<DimFact> = out_letters
        .chars()
        .map(|c| sizes.get(&c).cloned().unwrap_or_else(|| ctx.unknown_dim()))
        .collect();
    Ok(vec![Fact::new(first.dtype, Some(shape))])
}

/// 2 × the product of every index's size (each index's size read from the operands).
fn einsum_flops(node: &crate::graph::Node, ins: &[Option<Vec<usize>>], _: &[Vec<usize>]) -> u64 {
    let Some(EinsumAttrs { equation: eq }) = opset_free(node) else {
        return 0;
    };
    let lhs = eq.split("->").next().unwrap_or("");
    let mut sizes: std::collections::HashMap<char, u64> = Default::default();
    for (term, shape) in lhs.split(',').zip(ins) {
        let Some(shape) = shape else { continue };
        let letters: Vec<char> = term.trim().chars().filter(|c| c.is_alphabetic()).collect();
        // Letters bind to the trailing dims when an ellipsis takes the leading ones.
        let off = shape.len().saturating_sub(letters.len());
        for (i, c) in letters.iter().enumerate() {
            if let Some(&d) = shape.get(off + i) {
                sizes.insert(*c, d as u64);
            }
        }
    }
    2 * sizes.values().product::<u64>()
}

/// Work (m·n·k) above which a product is split over threads.
const PARALLEL_WORK: usize = 1 << 18;

fn parallelism(m: usize, n: usize, k: usize) -> Parallelism {
    if m * n * k >= PARALLEL_WORK && rayon::current_num_threads() > 1 {
        Parallelism::Rayon(rayon::current_num_threads())
    } else {
        Parallelism::None
    }
}

/// Row-major `C[m×n] = beta·C + A·B` with optional transposes (`A` is `m×k`, or `k×m` when
/// `trans_a`; `B` is `k×n`, or `n×k` when `trans_b`). `accumulate` false overwrites C.
/// Products accumulate in `acc` (the layer's accumulator, from the kernel's context).
#[allow(clippy::too_many_arguments)]
pub fn sgemm(
    acc: Accumulator,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    trans_a: bool,
    b: &[f32],
    trans_b: bool,
    c: &mut [f32],
    accumulate: bool,
) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    if acc == Accumulator::F16 {
        return hgemm_f16_accumulate(m, n, k, a, trans_a, b, trans_b, c, accumulate);
    }
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            c[..m * n].fill(0.0);
        }
        return;
    }
    let (a_rs, a_cs) = if trans_a {
        (1, m as isize)
    } else {
        (k as isize, 1)
    };
    let (b_rs, b_cs) = if trans_b {
        (1, k as isize)
    } else {
        (n as isize, 1)
    };
    // SAFETY: the asserts above bound every index the strides can reach; the slices do not alias.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.as_ptr(),
            a_cs,
            a_rs,
            b.as_ptr(),
            b_cs,
            b_rs,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            parallelism(m, n, k),
        );
    }
}

/// Most bytes of a weight kept packed a second time (see [`keeps_packed_b`]).
const MAX_PACKED_B_BYTES: usize = 16 << 20;

/// Whether a product of `rows` rows by a constant k×n weight keeps the weight packed, as ONNX
/// Runtime's prepacking keeps one:
/// - a weight read from a file map (`mapped`), whatever its size or the rows: its packed
///   panels replace it, since the map's pages are given back once packed
///   ([`crate::mapped`]), so the run still holds the weight once — and every product
///   reads panels, the fastest form for the tiles and, streamed, for one row (a decode step);
/// - any other (a weight copied at load, folded at load or converted by a plan) by more than
///   one row where the copy is at most [`MAX_PACKED_B_BYTES`] ([`packs_small_b`]);
/// - and a wide B (rows of at least `sgemm::STREAMED_ROW_VALUES`: a tied lm_head, the
///   Transpose of the embedding folded at load) by one row or a few: a prefill would pack it
///   band by band on every run, and a decode step reads rows that far apart at about two
///   thirds of the rate of its panels; a copy the size of that weight.
///
/// Any other weight by one row (a decode step) is streamed in rows by bands, and keeps no
/// copy.
fn keeps_packed_b(rows: usize, k: usize, n: usize, mapped: bool) -> bool {
    mapped
        || packs_small_b(rows, k, n)
        || ((1..=super::sgemm::FEW_ROWS).contains(&rows) && n >= super::sgemm::STREAMED_ROW_VALUES)
}

/// Whether a product of more than one row keeps a copy of a weight of at most
/// [`MAX_PACKED_B_BYTES`] packed (see [`keeps_packed_b`]). Many rows would pack it on every
/// run anyway; a few (a short sequence through an encoder, a prefill) read packed panels
/// 1.4–2.2× as fast as B's rows in place, whose 64 bytes per row a tile reads a row apart
/// (examples/skinny_gemm.rs, 4–48 rows, cold weights, Zen 3). The copy costs memory: a
/// run holds such weights twice (ONNX Runtime's prepacking drops the original instead).
fn packs_small_b(rows: usize, k: usize, n: usize) -> bool {
    rows >= 2 && k * n * std::mem::size_of::<f32>() <= MAX_PACKED_B_BYTES
}

/// Whether a weight's values are the bytes of a file map (see [`keeps_packed_b`]).
fn is_mapped(b: &[f32]) -> bool {
    crate::mapped::is_mapped(as_bytes(b))
}

fn as_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: any f32 slice is also a valid byte slice of 4× its length.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// A constant k×n B (`b` holds it transposed, n×k, when `transposed`) packed whole into the
/// product's panels, once: kept with the weight (one tag per orientation, since one weight
/// may be read both ways). A B read from a file map gives its pages back once packed.
fn packed_b(
    kept: &super::prepacked::Prepacked,
    b: &[f32],
    k: usize,
    n: usize,
    transposed: bool,
) -> std::sync::Arc<super::sgemm::PackedB> {
    use super::prepacked::tag::{PACKED_B, PACKED_B_TRANSPOSED};
    let tag = if transposed {
        PACKED_B_TRANSPOSED
    } else {
        PACKED_B
    };
    kept.get_or_insert(tag, || {
        let (rs, cs) = if transposed { (1, k) } else { (n, 1) };
        let strided = super::sgemm::StridedB { data: b, n, rs, cs };
        pack_releasing(k, n, &strided, b, !transposed)
    })
}

/// Bytes of a weight's rows packed before they are given back (see [`pack_releasing`]).
const RELEASED_BAND_BYTES: usize = 8 << 20;

/// `b_packs` (a k×n B whose values are `b`) packed whole; where `b` lies in a file map, its
/// pages are given back: band by band as they are packed where `b` is in rows (`in_rows`), so
/// that the weight is held about once, not twice, even while it is packed (a 113 MB lm_head
/// would otherwise add its size to the run's peak), else once packed.
fn pack_releasing(
    k: usize,
    n: usize,
    b_packs: &dyn super::sgemm::PackB,
    b: &[f32],
    in_rows: bool,
) -> super::sgemm::PackedB {
    use crate::mapped::release_pages;
    if !in_rows || !is_mapped(b) {
        let packed = super::sgemm::PackedB::new(k, n, b_packs);
        release_pages(as_bytes(b));
        return packed;
    }
    let band_rows = (RELEASED_BAND_BYTES / (n.max(1) * std::mem::size_of::<f32>())).max(1);
    let packed = super::sgemm::PackedB::new_in_bands(k, n, b_packs, band_rows, &|rows| {
        release_pages(as_bytes(&b[rows.start * n..rows.end * n]));
    });
    // The pages the bands shared at their ends.
    release_pages(as_bytes(b));
    packed
}

/// [`packed_b`] of a k×n B stored as is and read rounded (kept under the rounding's own tag,
/// beside the unrounded form a float32 plan keeps of the same weight): for products of many
/// rows, whose tiles would otherwise round each value once per A panel.
fn packed_rounded_b(
    kept: &super::prepacked::Prepacked,
    b: &[f32],
    k: usize,
    n: usize,
    rounding: crate::numeric::Rounding,
) -> std::sync::Arc<super::sgemm::PackedB> {
    use super::prepacked::tag::PACKED_B_ROUNDED;
    let tag = PACKED_B_ROUNDED[matches!(rounding, crate::numeric::Rounding::BF16) as usize];
    kept.get_or_insert(tag, || {
        pack_releasing(k, n, &rounded_b(b, n, rounding), b, true)
    })
}

/// A row-major k×n B read rounded.
fn rounded_b(
    b: &[f32],
    n: usize,
    rounding: crate::numeric::Rounding,
) -> super::sgemm::RoundedB<'_> {
    super::sgemm::RoundedB {
        b: super::sgemm::StridedB {
            data: b,
            n,
            rs: n,
            cs: 1,
        },
        rounding,
    }
}

/// A product whose running sum is an f16 register: each step is one fused multiply-add rounded
/// to f16 (the product of two f16 values is exact in f64, so the sum is rounded once per step),
/// as fp16-accumulating GPU kernels compute. Scalar and slow; used only with `--accumulate f16`.
#[allow(clippy::too_many_arguments)]
fn hgemm_f16_accumulate(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    trans_a: bool,
    b: &[f32],
    trans_b: bool,
    c: &mut [f32],
    accumulate: bool,
) {
    use half::f16;
    use rayon::prelude::*;
    if m == 0 || n == 0 {
        return;
    }
    c[..m * n]
        .par_chunks_mut(n)
        .enumerate()
        .for_each(|(i, row)| {
            for (j, out) in row.iter_mut().enumerate() {
                let mut sum = if accumulate {
                    f16::from_f32(*out)
                } else {
                    f16::ZERO
                };
                for p in 0..k {
                    let av = if trans_a { a[p * m + i] } else { a[i * k + p] };
                    let bv = if trans_b { b[j * k + p] } else { b[p * n + j] };
                    sum = f16::from_f64(sum.to_f64() + av as f64 * bv as f64);
                }
                *out = sum.to_f32();
            }
        });
}

fn f32_or_convert(t: &Tensor) -> Result<std::borrow::Cow<'_, [f32]>, OpError> {
    match t.as_f32() {
        Some(v) => Ok(std::borrow::Cow::Borrowed(v)),
        None if t.dtype().is_float() || t.dtype().is_int() => {
            Ok(std::borrow::Cow::Owned(t.to_f32_vec().expect("numeric")))
        }
        None => Err(OpError(format!("dtype {} is not supported", t.dtype()))),
    }
}

/// Converts an f32 result back to the inputs' dtype (integer and f64/f16 matmuls compute in f32/f64).
fn to_dtype(shape: Vec<usize>, v: Vec<f32>, dtype: DType) -> Tensor {
    let t = Tensor::from_f32(shape, v);
    if dtype == DType::F32 {
        t
    } else {
        super::cast::cast_tensor(&t, dtype)
    }
}

/// NumPy matmul semantics: 1-D operands are promoted and the added dim removed afterwards;
/// batch dims broadcast.
pub fn matmul(acc: Accumulator, a: &Tensor, b: &Tensor) -> Result<Tensor, OpError> {
    matmul_kept(acc, a, b, None, None)
}

/// [`matmul`], with a constant B's packed panels kept in `kept` (made on the first run), and
/// B's values rounded to `b_rounding` first (a float16/bfloat16 layer's weight handed over as
/// stored, [`super::OpCtx::weight_rounding`]).
pub fn matmul_kept(
    acc: Accumulator,
    a: &Tensor,
    b: &Tensor,
    kept: Option<&super::prepacked::Prepacked>,
    b_rounding: Option<crate::numeric::Rounding>,
) -> Result<Tensor, OpError> {
    if a.rank() == 0 || b.rank() == 0 {
        return Err(OpError("MatMul operands must have rank >= 1".into()));
    }
    if a.dtype() == DType::F64
        || b.dtype() == DType::F64
        || (a.dtype().is_int() && a.dtype() != DType::I8 && a.dtype() != DType::U8)
    {
        return matmul_exact(a, b);
    }
    let MatMulDims {
        m,
        k,
        n,
        a1,
        b1,
        batch,
        batch_a,
        batch_b,
    } = matmul_dims(a.shape(), b.shape())?;
    let (batch_a, batch_b) = (batch_a.as_slice(), batch_b.as_slice());
    let nb: usize = batch.iter().product();
    let av = f32_or_convert(a)?;
    let bv = f32_or_convert(b)?;
    // A B shared by the whole batch with A contiguous is one big product (m·batch rows).
    let one_product = batch_b.iter().product::<usize>() == 1 && batch_a == batch.as_slice();
    // A rounded B is rounded as its panels are packed in that product (mixprec's kernel, the
    // in-order chain); any other product reads a rounded copy.
    let rounded_in_packing = b_rounding.filter(|_| one_product && acc == Accumulator::F32);
    let bv = match b_rounding {
        Some(r) if rounded_in_packing.is_none() => {
            let mut v = bv.into_owned();
            r.round_slice(&mut v);
            std::borrow::Cow::Owned(v)
        }
        _ => bv,
    };
    // The output is not zeroed first: every product below overwrites its m×n block
    // (`accumulate` false) and the blocks cover it.
    let total = nb * m * n;
    let mut out: Vec<f32> = Vec::with_capacity(total);
    // SAFETY: written whole before read (above); set_len below, once the products are done.
    let out_values = unsafe { super::util::assume_written(&mut out.spare_capacity_mut()[..total]) };
    let sa = super::util::broadcast_strides(batch_a, &batch);
    let sb = super::util::broadcast_strides(batch_b, &batch);
    let bst = strides_of(&batch);
    // Only a B borrowed from the tensor can lie in a file map; asked only where a packed form
    // may be kept (the registry takes a lock).
    let mapped = kept.is_some() && matches!(bv, std::borrow::Cow::Borrowed(v) if is_mapped(v));
    if let Some(r) = rounded_in_packing {
        match kept.filter(|_| keeps_packed_b(nb * m, k, n, mapped)) {
            // A small weight: a rounded packed copy (its tiles read each value once per A
            // panel); not a mapped one by a few rows (a prefill), below.
            Some(kept)
                if packs_small_b(nb * m, k, n) && !(mapped && nb * m <= super::sgemm::FEW_ROWS) =>
            {
                let packed = packed_rounded_b(kept, &bv, k, n, r);
                super::sgemm::gemm(nb * m, n, k, &av, k, 1, &*packed, out_values, n, false);
            }
            // Otherwise (a mapped weight: a prefill's or a decode step's): the panels a float32
            // plan keeps, rounded as the kernel reads them, so the run holds the weight once
            // (a rounded copy would leave the map's pages beside it).
            Some(kept) => {
                let packed = packed_b(kept, &bv, k, n, false);
                let rounded = super::sgemm::RoundedPackedB {
                    packed: &packed,
                    rounding: r,
                };
                super::sgemm::gemm(nb * m, n, k, &av, k, 1, &rounded, out_values, n, false);
            }
            None => {
                let rounded = rounded_b(&bv, n, r);
                super::sgemm::gemm(nb * m, n, k, &av, k, 1, &rounded, out_values, n, false);
            }
        }
    } else if one_product {
        match kept.filter(|_| acc == Accumulator::F32 && keeps_packed_b(nb * m, k, n, mapped)) {
            Some(kept) => {
                let packed = packed_b(kept, &bv, k, n, false);
                super::sgemm::gemm(nb * m, n, k, &av, k, 1, &*packed, out_values, n, false);
            }
            // A few rows (prefill) or one (a decode step, streamed by bands): mixprec's kernel
            // reading B where it lies, its chain.
            None if acc == Accumulator::F32 => {
                let b = super::sgemm::StridedB {
                    data: &bv,
                    n,
                    rs: n,
                    cs: 1,
                };
                super::sgemm::gemm(nb * m, n, k, &av, k, 1, &b, out_values, n, false);
            }
            None => sgemm(acc, nb * m, n, k, &av, false, &bv, false, out_values, false),
        }
    } else if m * n > 0 {
        // Products of more than one row panel run mixprec's kernel (the in-order chain, the
        // same bits however they are split); the `gemm` crate keeps the few-row ones, where it
        // was faster. The choice depends on the shape only, never on the thread count.
        let own_kernel = acc == Accumulator::F32 && m > super::sgemm::MR;
        // The batch's products in parallel, one per task: where each is too small to split
        // or the batch alone fills the threads (attention's heads).
        let threads = rayon::current_num_threads();
        let split_batch = nb > 1
            && nb * m * n * k >= PARALLEL_WORK
            && (m * n * k < PARALLEL_WORK || (own_kernel && nb >= 2 * threads));
        let run = |i: usize, dst: &mut [f32]| {
            let (mut oa, mut ob) = (0, 0);
            let mut rem = i;
            for d in 0..batch.len() {
                let idx = rem / bst[d];
                rem %= bst[d];
                oa += idx * sa[d];
                ob += idx * sb[d];
            }
            let (a, b) = (&av[oa * m * k..], &bv[ob * k * n..]);
            if own_kernel {
                let b = super::sgemm::StridedB {
                    data: b,
                    n,
                    rs: n,
                    cs: 1,
                };
                super::sgemm::gemm_threads(m, n, k, a, k, 1, &b, dst, n, false, !split_batch);
            } else {
                sgemm(acc, m, n, k, a, false, b, false, dst, false);
            }
        };
        if split_batch {
            use rayon::prelude::*;
            out_values
                .par_chunks_mut(m * n)
                .enumerate()
                .for_each(|(i, dst)| run(i, dst));
        } else {
            for (i, dst) in out_values.chunks_mut(m * n).enumerate() {
                run(i, dst);
            }
        }
    }
    // SAFETY: the products wrote all `total` values (an empty block writes none and has none).
    unsafe { out.set_len(total) };
    let mut shape = batch;
    if !a1 {
        shape.push(m);
    }
    if !b1 {
        shape.push(n);
    }
    Ok(to_dtype(shape, out, a.dtype()))
}

/// A numpy-style matmul's dimensions: 1-D operands promoted (`a1`/`b1`: the added axis is
/// dropped from the output), inner dimensions checked, batch axes broadcast. Shared by the
/// float, exact and integer (`ops/integer.rs`) products.
pub(crate) struct MatMulDims {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub a1: bool,
    pub b1: bool,
    pub batch: Vec<usize>,
    pub batch_a: Vec<usize>,
    pub batch_b: Vec<usize>,
}

pub(crate) fn matmul_dims(a_shape: &[usize], b_shape: &[usize]) -> Result<MatMulDims, OpError> {
    if a_shape.is_empty() || b_shape.is_empty() {
        return Err(OpError("MatMul operands must have rank >= 1".into()));
    }
    let mut ash = a_shape.to_vec();
    let mut bsh = b_shape.to_vec();
    let (a1, b1) = (ash.len() == 1, bsh.len() == 1);
    if a1 {
        ash.insert(0, 1);
    }
    if b1 {
        bsh.push(1);
    }
    let (m, k) = (ash[ash.len() - 2], ash[ash.len() - 1]);
    let (k2, n) = (bsh[bsh.len() - 2], bsh[bsh.len() - 1]);
    if k != k2 {
        return Err(OpError(format!(
            "inner dimensions differ: {a_shape:?} x {b_shape:?}"
        )));
    }
    let batch_a = ash[..ash.len() - 2].to_vec();
    let batch_b = bsh[..bsh.len() - 2].to_vec();
    let batch = broadcast_shapes(&[&batch_a, &batch_b])?;
    Ok(MatMulDims {
        m,
        k,
        n,
        a1,
        b1,
        batch,
        batch_a,
        batch_b,
    })
}

/// f64 and wide-integer matmul, computed exactly in their own type via f64/i64 (small sizes only
/// appear in practice: shape arithmetic and conformance tests).
fn matmul_exact(a: &Tensor, b: &Tensor) -> Result<Tensor, OpError> {
    let is_int = a.dtype().is_int();
    let MatMulDims {
        m,
        k,
        n,
        a1,
        b1,
        batch,
        batch_a,
        batch_b,
    } = matmul_dims(a.shape(), b.shape())?;
    let (batch_a, batch_b) = (batch_a.as_slice(), batch_b.as_slice());
    let nb: usize = batch.iter().product();
    let sa = super::util::broadcast_strides(batch_a, &batch);
    let sb = super::util::broadcast_strides(batch_b, &batch);
    let bst = strides_of(&batch);
    let mut shape = batch.clone();
    if !a1 {
        shape.push(m);
    }
    if !b1 {
        shape.push(n);
    }
    macro_rules! compute {
        ($av:expr, $bv:expr, $zero:expr) => {{
            let (av, bv) = ($av, $bv);
            let mut out = vec![$zero; nb * m * n];
            for i in 0..nb {
                let (mut oa, mut ob, mut rem) = (0, 0, i);
                for d in 0..batch.len() {
                    let idx = rem / bst[d];
                    rem %= bst[d];
                    oa += idx * sa[d];
                    ob += idx * sb[d];
                }
                for r in 0..m {
                    for c in 0..n {
                        let mut acc = $zero;
                        for p in 0..k {
                            acc += av[oa * m * k + r * k + p] * bv[ob * k * n + p * n + c];
                        }
                        out[i * m * n + r * n + c] = acc;
                    }
                }
            }
            out
        }};
    }
    if is_int {
        let av = a
            .to_i64_vec()
            .ok_or_else(|| OpError("non-numeric input".into()))?;
        let bv = b
            .to_i64_vec()
            .ok_or_else(|| OpError("non-numeric input".into()))?;
        let out: Vec<i64> = compute!(av, bv, 0i64);
        let t = Tensor::from_i64(shape, out);
        Ok(super::cast::cast_tensor(&t, a.dtype()))
    } else {
        let av = a
            .to_f64_vec()
            .ok_or_else(|| OpError("non-numeric input".into()))?;
        let bv = b
            .to_f64_vec()
            .ok_or_else(|| OpError("non-numeric input".into()))?;
        let out: Vec<f64> = compute!(av, bv, 0f64);
        Ok(super::cast::cast_tensor(
            &Tensor::from_f64(shape, out),
            a.dtype(),
        ))
    }
}

fn matmul_op(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let mut y = matmul_kept(
        ctx.accumulate,
        input(inputs, 0)?,
        input(inputs, 1)?,
        ctx.prepacked(1),
        ctx.weight_rounding(1),
    )?;
    apply_epilogue_by_rows(ctx, &mut y);
    Ok(vec![y])
}

/// The epilogue of a matrix product (its columns are the channels) applied to each row of its
/// float32 output `y`, where the run has one for it.
pub(crate) fn apply_epilogue_by_rows(ctx: &OpCtx, y: &mut Tensor) {
    use rayon::prelude::*;
    let Some(&n) = y.shape().last() else {
        return;
    };
    let Some(epilogue) = ctx.epilogue_for(y.shape()) else {
        return;
    };
    if let (Some(v), true) = (y.as_f32_mut(), n > 0) {
        // Rows (a column is a channel), at most about 64 KiB per task and at least two tasks
        // a thread where there are the rows: an epilogue costs a few operations per value (a
        // GELU a few dozen), so even the 16 Ki values of a 16-token prompt's projection split.
        let m = v.len() / n;
        let per_thread = m.div_ceil(2 * rayon::current_num_threads());
        let rows = (1usize << 14).div_ceil(n).min(per_thread).max(1);
        v.par_chunks_mut(rows * n)
            .enumerate()
            .for_each(|(b, block)| {
                for (r, row) in block.chunks_mut(n).enumerate() {
                    epilogue(super::Piece::row(0, (b * rows + r) * n, 1), row);
                }
            });
        ctx.epilogue_applied();
    }
}

/// The output of a MatMul of two operands of rank >= 2, for its epilogue: its columns are the
/// channels.
pub(crate) fn matmul_epilogue_shape(inputs: &[Option<&Tensor>]) -> Option<super::ChainShape> {
    let (a, b) = (inputs.first()?.as_ref()?, inputs.get(1)?.as_ref()?);
    if a.rank() < 2 || b.rank() < 2 {
        return None;
    }
    let rank = a.rank().max(b.rank());
    Some(super::ChainShape {
        rank,
        channels: b.shape()[b.rank() - 1],
        axis: rank - 1,
    })
}

fn gemm_op(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let a = input(inputs, 0)?;
    let b = input(inputs, 1)?;
    let c = opt_input(inputs, 2);
    let &GemmAttrs {
        trans_a: ta,
        trans_b: tb,
        alpha,
        beta,
    } = ctx.attrs::<GemmAttrs>()?;
    if a.rank() != 2 || b.rank() != 2 {
        return Err(OpError(format!(
            "Gemm needs 2-D A and B, got {:?} and {:?}",
            a.shape(),
            b.shape()
        )));
    }
    let (m, k) = if ta {
        (a.shape()[1], a.shape()[0])
    } else {
        (a.shape()[0], a.shape()[1])
    };
    let (k2, n) = if tb {
        (b.shape()[1], b.shape()[0])
    } else {
        (b.shape()[0], b.shape()[1])
    };
    if k != k2 {
        return Err(OpError(format!(
            "inner dimensions differ: A {:?} (transA={}) x B {:?} (transB={})",
            a.shape(),
            ta as u8,
            b.shape(),
            tb as u8
        )));
    }
    let av = f32_or_convert(a)?;
    let bv = f32_or_convert(b)?;
    // SAFETY: the product (`accumulate` false) overwrites all m×n values.
    let mut out = unsafe {
        super::util::unzeroed_f32(m * n, |o| {
            let o = super::util::assume_written(o);
            // Not by whether B is mapped, as MatMul: the unkept product below is the `gemm`
            // crate's order, so the choice must not depend on where B's bytes lie (an exported
            // model's mapped weight and the emulation's converted one give the same bits).
            match ctx
                .prepacked(1)
                .filter(|_| ctx.accumulate == Accumulator::F32 && packs_small_b(m, k, n))
            {
                // A constant B (a weight) packed once, in its orientation.
                Some(kept) => {
                    let packed = packed_b(kept, &bv, k, n, tb);
                    let (a_rs, a_cs) = if ta { (1, m) } else { (k, 1) };
                    super::sgemm::gemm(m, n, k, &av, a_rs, a_cs, &*packed, o, n, false)
                }
                None => sgemm(ctx.accumulate, m, n, k, &av, ta, &bv, tb, o, false),
            }
        })
    };
    if alpha != 1.0 {
        out.iter_mut().for_each(|x| *x *= alpha);
    }
    if let Some(c) = c {
        if beta != 0.0 {
            let cv = f32_or_convert(c)?;
            if broadcast_shapes(&[c.shape(), &[m, n]])? != vec![m, n] {
                return Err(OpError(format!(
                    "C of shape {:?} does not broadcast to [{m}, {n}]",
                    c.shape()
                )));
            }
            let full = super::util::broadcast_to(&cv, c.shape(), &[m, n]);
            out.iter_mut().zip(full).for_each(|(o, c)| *o += beta * c);
        }
    }
    Ok(vec![to_dtype(vec![m, n], out, a.dtype())])
}

/// Einsum via transposes and a batched matmul: every operand is permuted to
/// (batch, free, contracted) order, summed over letters that appear in it alone, multiplied,
/// and the result permuted to the output order.
fn einsum_op(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let eq: String = ctx.attrs::<EinsumAttrs>()?.equation.clone();
    let ops: Vec<&Tensor> = (0..inputs.len())
        .map(|i| input(inputs, i))
        .collect::<Result<_, _>>()?;
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != ops.len() {
        return Err(OpError(format!(
            "equation '{eq}' has {} operands, node has {}",
            terms.len(),
            ops.len()
        )));
    }
    // Every term's letters must fit its operand's rank (an ellipsis takes the rest).
    for (t, x) in terms.iter().zip(&ops) {
        let letters = t.replace("...", "").chars().count();
        let fits = if t.contains("...") {
            letters <= x.rank() && t.matches("...").count() == 1
        } else {
            letters == x.rank()
        };
        if !fits
            || !t
                .replace("...", "")
                .chars()
                .all(|c| c.is_ascii_alphabetic())
        {
            return Err(OpError(format!(
                "term '{t}' of equation '{eq}' does not fit an operand of shape {:?}",
                x.shape()
            )));
        }
    }
    // Expand ellipses into fresh upper-case letters.
    let max_ell = terms
        .iter()
        .zip(&ops)
        .map(|(t, x)| {
            if t.contains("...") {
                x.rank() + 3 - t.len()
            } else {
                0
            }
        })
        .max()
        .unwrap_or(0);
    let ell: String = (0..max_ell).map(|i| (b'A' + i as u8) as char).collect();
    let mut subs: Vec<Vec<char>> = Vec::new();
    for (t, x) in terms.iter().zip(&ops) {
        let s: Vec<char> = if t.contains("...") {
            let n = x.rank() + 3 - t.len();
            t.replace("...", &ell[max_ell - n..]).chars().collect()
        } else {
            t.chars().collect()
        };
        if s.len() != x.rank() {
            return Err(OpError(format!(
                "term '{t}' does not match an operand of rank {}",
                x.rank()
            )));
        }
        subs.push(s);
    }
    let out_subs: Vec<char> = match rhs {
        Some(r) => r.replace("...", &ell).chars().collect(),
        None => {
            // Implicit output: ellipsis dims, then letters seen once, alphabetically.
            let mut counts = std::collections::BTreeMap::new();
            for s in &subs {
                for &c in s {
                    if c.is_ascii_lowercase() {
                        *counts.entry(c).or_insert(0) += 1;
                    }
                }
            }
            ell.chars()
                .chain(counts.into_iter().filter(|(_, n)| *n == 1).map(|(c, _)| c))
                .collect()
        }
    };
    let mut sizes = std::collections::HashMap::new();
    for (s, x) in subs.iter().zip(&ops) {
        for (&c, &d) in s.iter().zip(x.shape()) {
            let e = sizes.entry(c).or_insert(d);
            if *e == 1 {
                *e = d;
            } else if d != 1 && *e != d {
                return Err(OpError(format!("letter '{c}' has sizes {e} and {d}")));
            }
        }
    }
    // Start from the first operand (diagonals removed), fold in the rest pairwise.
    let dtype = ops[0].dtype();
    let mut acc_subs = subs[0].clone();
    let mut acc = take_diagonals(&mut acc_subs, &to_f32_tensor(ops[0])?)?;
    for (i, x) in ops.iter().enumerate().skip(1) {
        let mut s = subs[i].clone();
        let t = take_diagonals(&mut s, &to_f32_tensor(x)?)?;
        let later: Vec<char> = subs[i + 1..]
            .iter()
            .flatten()
            .copied()
            .chain(out_subs.iter().copied())
            .collect();
        let (r, rs) = contract_pair(ctx.accumulate, &acc, &acc_subs, &t, &s, &later, &sizes)?;
        acc = r;
        acc_subs = rs;
    }
    // Sum letters not in the output, then permute to the output order.
    let keep: Vec<char> = acc_subs
        .iter()
        .copied()
        .filter(|c| out_subs.contains(c))
        .collect();
    let acc = sum_out(&acc, &acc_subs, &keep);
    let perm: Vec<usize> = out_subs
        .iter()
        .map(|c| {
            keep.iter()
                .position(|k| k == c)
                .ok_or_else(|| OpError(format!("output letter '{c}' is not in any input")))
        })
        .collect::<Result<_, _>>()?;
    let out = permute(&acc, &perm);
    Ok(vec![if dtype == DType::F32 {
        out
    } else {
        super::cast::cast_tensor(&out, dtype)
    }])
}

fn to_f32_tensor(t: &Tensor) -> Result<Tensor, OpError> {
    Ok(Tensor::from_f32(
        t.shape().to_vec(),
        f32_or_convert(t)?.into_owned(),
    ))
}

/// Removes repeated letters within one operand by taking the diagonal.
fn take_diagonals(subs: &mut Vec<char>, t: &Tensor) -> Result<Tensor, OpError> {
    let mut t = t.clone();
    loop {
        let dup = (0..subs.len()).find_map(|i| {
            ((i + 1)..subs.len())
                .find(|&j| subs[j] == subs[i])
                .map(|j| (i, j))
        });
        let Some((i, j)) = dup else { return Ok(t) };
        let shape = t.shape().to_vec();
        let st = strides_of(&shape);
        let mut new_shape = shape.clone();
        new_shape.remove(j);
        let v = t.as_f32().expect("f32");
        let nst = strides_of(&new_shape);
        let n: usize = new_shape.iter().product();
        let mut out = Vec::with_capacity(n);
        for flat in 0..n {
            let mut rem = flat;
            let mut off = 0;
            for (d, &s) in nst.iter().enumerate() {
                let idx = rem / s;
                rem %= s;
                let od = if d >= j { d + 1 } else { d };
                off += idx * st[od];
                if od == i {
                    off += idx * st[j];
                }
            }
            out.push(v[off]);
        }
        subs.remove(j);
        t = Tensor::from_f32(new_shape, out);
    }
}

/// Sums over the axes whose letters are not in `keep` (keeps the order of the rest).
fn sum_out(t: &Tensor, subs: &[char], keep: &[char]) -> Tensor {
    let axes: Vec<usize> = (0..subs.len())
        .filter(|&i| !keep.contains(&subs[i]))
        .collect();
    if axes.is_empty() {
        return t.clone();
    }
    let shape = t.shape();
    let out_shape: Vec<usize> = (0..shape.len())
        .filter(|i| !axes.contains(i))
        .map(|i| shape[i])
        .collect();
    let ost = strides_of(&out_shape);
    let st = strides_of(shape);
    let v = t.as_f32().expect("f32");
    let mut out = vec![0f32; out_shape.iter().product()];
    let kept: Vec<usize> = (0..shape.len()).filter(|i| !axes.contains(i)).collect();
    for (flat, &x) in v.iter().enumerate() {
        let mut o = 0;
        for (k, &d) in kept.iter().enumerate() {
            o += (flat / st[d]) % shape[d] * ost[k];
        }
        out[o] += x;
    }
    Tensor::from_f32(out_shape, out)
}

/// Transposes an f32 tensor: output axis i is input axis perm[i].
pub fn permute(t: &Tensor, perm: &[usize]) -> Tensor {
    let shape = t.shape();
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return t.clone();
    }
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let v = t.as_f32().expect("f32");
    Tensor::from_f32(
        out_shape,
        super::movement::permute::permute_f32(v, shape, perm),
    )
}

/// Contracts two operands: letters in both and needed later are batch, letters in both and not
/// needed later are contracted, the rest are free (letters only in one operand and not needed
/// later are summed out first).
fn contract_pair(
    accumulator: Accumulator,
    a: &Tensor,
    asub: &[char],
    b: &Tensor,
    bsub: &[char],
    later: &[char],
    sizes: &std::collections::HashMap<char, usize>,
) -> Result<(Tensor, Vec<char>), OpError> {
    let a_keep: Vec<char> = asub
        .iter()
        .copied()
        .filter(|c| bsub.contains(c) || later.contains(c))
        .collect();
    let b_keep: Vec<char> = bsub
        .iter()
        .copied()
        .filter(|c| asub.contains(c) || later.contains(c))
        .collect();
    let a = sum_out(a, asub, &a_keep);
    let b = sum_out(b, bsub, &b_keep);
    let batch: Vec<char> = a_keep
        .iter()
        .copied()
        .filter(|c| b_keep.contains(c) && later.contains(c))
        .collect();
    let contr: Vec<char> = a_keep
        .iter()
        .copied()
        .filter(|c| b_keep.contains(c) && !later.contains(c))
        .collect();
    let a_free: Vec<char> = a_keep
        .iter()
        .copied()
        .filter(|c| !b_keep.contains(c))
        .collect();
    let b_free: Vec<char> = b_keep
        .iter()
        .copied()
        .filter(|c| !a_keep.contains(c))
        .collect();
    let pos = |subs: &[char], c: char| subs.iter().position(|&x| x == c).expect("letter present");
    let a_perm: Vec<usize> = batch
        .iter()
        .chain(&a_free)
        .chain(&contr)
        .map(|&c| pos(&a_keep, c))
        .collect();
    let b_perm: Vec<usize> = batch
        .iter()
        .chain(&contr)
        .chain(&b_free)
        .map(|&c| pos(&b_keep, c))
        .collect();
    // Broadcast size-1 dims of batch/contracted letters to the full size.
    let expand = |t: Tensor, subs: &[char]| -> Tensor {
        let target: Vec<usize> = subs.iter().map(|c| sizes[c]).collect();
        if t.shape() == target.as_slice() {
            t
        } else {
            let full = super::util::broadcast_to(t.as_f32().expect("f32"), t.shape(), &target);
            Tensor::from_f32(target, full)
        }
    };
    let a = expand(a, &a_keep);
    let b = expand(b, &b_keep);
    let at = permute(&a, &a_perm);
    let bt = permute(&b, &b_perm);
    let prod = |cs: &[char]| cs.iter().map(|c| sizes[c]).product::<usize>();
    let (nb, m, k, n) = (prod(&batch), prod(&a_free), prod(&contr), prod(&b_free));
    let av = at.as_f32().expect("f32");
    let bv = bt.as_f32().expect("f32");
    let mut out = vec![0f32; nb * m * n];
    for i in 0..nb {
        sgemm(
            accumulator,
            m,
            n,
            k,
            &av[i * m * k..],
            false,
            &bv[i * k * n..],
            false,
            &mut out[i * m * n..],
            false,
        );
    }
    let subs: Vec<char> = batch
        .iter()
        .chain(&a_free)
        .chain(&b_free)
        .copied()
        .collect();
    let shape: Vec<usize> = subs.iter().map(|c| sizes[c]).collect();
    Ok((Tensor::from_f32(shape, out), subs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_f32(shape.to_vec(), v.to_vec())
    }

    #[test]
    fn matmul_2d_and_1d() {
        let a = t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
        let b = t(&[3, 2], &[1., 0., 0., 1., 1., 1.]);
        let c = matmul(Accumulator::F32, &a, &b).unwrap();
        assert_eq!(c.shape(), &[2, 2]);
        assert_eq!(c.as_f32().unwrap(), &[4., 5., 10., 11.]);
        let v = t(&[3], &[1., 1., 1.]);
        let c = matmul(Accumulator::F32, &a, &v).unwrap();
        assert_eq!(c.shape(), &[2]);
        assert_eq!(c.as_f32().unwrap(), &[6., 15.]);
    }

    #[test]
    fn matmul_broadcasts_batches() {
        let a = t(&[2, 1, 1, 2], &[1., 2., 3., 4.]);
        let b = t(&[3, 2, 1], &[1., 1., 2., 2., 3., 3.]);
        let c = matmul(Accumulator::F32, &a, &b).unwrap();
        assert_eq!(c.shape(), &[2, 3, 1, 1]);
        assert_eq!(c.as_f32().unwrap(), &[3., 6., 9., 7., 14., 21.]);
    }

    /// A batched product with a computed B of more than one row panel (attention's heads) is
    /// the in-order chain of fused multiply-adds per output, on one thread or split over the
    /// batch or within each product.
    #[test]
    fn batched_products_are_the_in_order_chain_for_any_thread_count() {
        // Serial products; small products split over the batch; large ones over the batch
        // (1 or 2 threads) or each within itself (3 or 11 threads).
        for (batch, m, k, n) in [(5, 13, 37, 21), (5, 40, 64, 50), (5, 70, 67, 64)] {
            let values = |len: usize, seed: u32| -> Vec<f32> {
                (0..len as u32)
                    .map(|i| ((i.wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 250.0 - 2.0)
                    .collect()
            };
            let (av, bv) = (values(batch * m * k, 7), values(batch * k * n, 11));
            let a = t(&[batch, m, k], &av);
            let b = t(&[batch, k, n], &bv);
            let mut expected = vec![];
            for h in 0..batch {
                for i in 0..m {
                    for j in 0..n {
                        expected.push((0..k).fold(0f32, |c, p| {
                            av[(h * m + i) * k + p].mul_add(bv[(h * k + p) * n + j], c)
                        }));
                    }
                }
            }
            for threads in [1, 2, 3, 11] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let c = pool.install(|| matmul(Accumulator::F32, &a, &b).unwrap());
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(c.as_f32().unwrap()),
                    bits(&expected),
                    "{threads} threads"
                );
            }
        }
    }

    /// A small constant weight is packed a second time for a product of more than one row,
    /// not for one (a decode step streams its rows); the products agree either way.
    #[test]
    fn a_small_weight_is_kept_packed_for_more_than_one_row() {
        let (k, n) = (40, 48);
        let b = Tensor::from_f32(
            vec![k, n],
            (0..k * n)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
                .collect(),
        );
        let rows = |m: usize| {
            Tensor::from_f32(
                vec![m, k],
                (0..m * k)
                    .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.2)
                    .collect(),
            )
        };
        for (m, packed) in [(1, false), (2, true), (16, true), (73, true), (200, true)] {
            let kept = crate::ops::prepacked::Prepacked::default();
            let y = matmul_kept(Accumulator::F32, &rows(m), &b, Some(&kept), None).unwrap();
            assert_eq!(kept.len(), packed as usize, "{m} rows");
            let want = matmul(Accumulator::F32, &rows(m), &b).unwrap();
            for (a, w) in y.as_f32().unwrap().iter().zip(want.as_f32().unwrap()) {
                assert!(
                    (a - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "{m} rows: {a} vs {w}"
                );
            }
        }
        // A weight of more than 16 MiB is not copied, whatever the rows.
        assert!(keeps_packed_b(1000, 2048, 2048, false));
        assert!(!keeps_packed_b(1000, 2048, 2049, false));
        assert!(keeps_packed_b(2, 16, 16, false));
        assert!(!keeps_packed_b(1, 16, 16, false));
        assert!(keeps_packed_b(1, 4096, 4096, true));
        // A wide weight (a tied lm_head) by a prefill's rows and by a decode step's.
        assert!(keeps_packed_b(16, 576, 49152, false));
        assert!(keeps_packed_b(1, 576, 49152, false));
        assert!(!keeps_packed_b(1, 576, 16383, false));
        // ... as stored only: a float16/bfloat16 plan reads those panels rounded, no copy.
        assert!(!packs_small_b(16, 576, 49152));
    }

    /// A weight read from a file map is kept packed whatever the rows (a decode step's one,
    /// a prefill's few), the map's pages are given back once it is packed, and the products
    /// (as stored and read rounded to float16 or bfloat16) give the bits of the same product
    /// over a heap copy of the weight, which is kept packed only where the product packs it
    /// anyway.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_mapped_weight_is_kept_packed_and_its_pages_given_back() {
        use crate::numeric::Rounding;
        use crate::tensor::{Buf, TensorData};
        let (k, n) = (300, 2048);
        let w: Vec<f32> = (0..k * n)
            .map(|i| ((i * 7 % 23) as f32 - 11.0) * 0.013)
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.bin");
        std::fs::write(&path, as_bytes(&w)).unwrap();
        let bytes = crate::onnx::map_file(&path).unwrap();
        let buf = Buf::<f32>::from_le_bytes(bytes).unwrap();
        assert!(buf.is_borrowed());
        let mapped = Tensor::from_parts(vec![k, n], TensorData::F32(buf));
        let heap = Tensor::from_f32(vec![k, n], w.clone());
        let start = mapped.as_f32().unwrap().as_ptr() as usize;
        let rss = || crate::mapped::mapping_rss(start);
        for m in [1, 16, 80] {
            let a = Tensor::from_f32(
                vec![m, k],
                (0..m * k)
                    .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.2)
                    .collect(),
            );
            for rounding in [None, Some(Rounding::F16), Some(Rounding::BF16)] {
                let kept = crate::ops::prepacked::Prepacked::default();
                let y = matmul_kept(Accumulator::F32, &a, &mapped, Some(&kept), rounding).unwrap();
                assert_eq!(kept.len(), 1, "{m} rows, {rounding:?}: kept packed");
                assert_eq!(
                    rss(),
                    0,
                    "{m} rows, {rounding:?}: the map's pages given back"
                );
                let heap_kept = crate::ops::prepacked::Prepacked::default();
                let want =
                    matmul_kept(Accumulator::F32, &a, &heap, Some(&heap_kept), rounding).unwrap();
                assert_eq!(
                    heap_kept.len(),
                    usize::from(m > 1),
                    "a heap weight is kept packed only by more than one row ({m})"
                );
                let bits = |t: &Tensor| {
                    t.as_f32()
                        .unwrap()
                        .iter()
                        .map(|x| x.to_bits())
                        .collect::<Vec<_>>()
                };
                assert_eq!(bits(&y), bits(&want), "{m} rows, {rounding:?}");
                // Run again: the kept panels, not the (given back) map.
                let again =
                    matmul_kept(Accumulator::F32, &a, &mapped, Some(&kept), rounding).unwrap();
                assert_eq!(bits(&again), bits(&want), "{m} rows, {rounding:?}, again");
            }
        }
        // The map's pages read again unchanged.
        assert!(is_mapped(mapped.as_f32().unwrap()));
        assert_eq!(mapped.as_f32().unwrap(), &w[..]);
        assert_eq!(rss(), 4 * k * n);
    }

    /// Every output value is written by a product (the output is not zeroed first): empty
    /// blocks, k = 0 (zeros) and batches of either kind, checked against a direct sum.
    #[test]
    fn every_output_value_is_written() {
        let direct = |a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize)| -> Vec<f32> {
            let mut c = vec![0.0f32; m * n];
            for i in 0..m {
                for j in 0..n {
                    c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
                }
            }
            c
        };
        for (m, k, n) in [(3, 4, 5), (2, 0, 3), (0, 3, 2), (3, 2, 0)] {
            let a: Vec<f32> = (0..2 * m * k).map(|v| v as f32 * 0.5 - 1.0).collect();
            let b: Vec<f32> = (0..2 * k * n).map(|v| 2.0 - v as f32 * 0.25).collect();
            // B shared by the batch (one product), then a batch of B (one product each).
            let shared = matmul(
                Accumulator::F32,
                &t(&[2, m, k], &a),
                &t(&[k, n], &b[..k * n]),
            );
            let shared = shared.unwrap();
            assert_eq!(shared.shape(), &[2, m, n]);
            let want: Vec<f32> = (0..2)
                .flat_map(|i| direct(&a[i * m * k..], &b[..k * n], (m, k, n)))
                .collect();
            assert_eq!(shared.as_f32().unwrap(), &want[..], "{m}x{k}x{n} shared");
            let each = matmul(Accumulator::F32, &t(&[2, m, k], &a), &t(&[2, k, n], &b)).unwrap();
            assert_eq!(each.shape(), &[2, m, n]);
            let want: Vec<f32> = (0..2)
                .flat_map(|i| direct(&a[i * m * k..], &b[i * k * n..], (m, k, n)))
                .collect();
            assert_eq!(each.as_f32().unwrap(), &want[..], "{m}x{k}x{n} batched");
        }
    }

    #[test]
    fn transposed_sgemm() {
        // A^T with A = [[1,2],[3,4]] (k×m), B^T with B = [[1,0],[0,1]] -> A^T.
        let mut c = vec![0.0; 4];
        sgemm(
            Accumulator::F32,
            2,
            2,
            2,
            &[1., 2., 3., 4.],
            true,
            &[1., 0., 0., 1.],
            true,
            &mut c,
            false,
        );
        assert_eq!(c, vec![1., 3., 2., 4.]);
    }
}
