//! com.microsoft SparseAttention (Phi-3-small's block-sparse attention in ONNX Runtime GenAI's
//! layout) as ONNX Runtime 1.32's CPU kernel computes it (contrib_ops/cpu/sparse/
//! sparse_attention.cc, sparse_attention_base.h, sparse_attention_helper.h).
//!
//! Inputs: `query [B, S, N·H]` with `key`/`value [B, S, N_kv·H]`, or packed QKV `[B, S,
//! (N + 2·N_kv)·H]`; `past_key`/`past_value [B, N_kv, M, H]` (a buffer of M rows that ONNX
//! Runtime updates in place: present is past with the new rows written); the block mask in CSR
//! form per layout, `block_row_indices [L, max_blocks + 1]` and `block_col_indices [L, nnz]`
//! (head n uses layout `n mod L`); `total_sequence_length` (int32, one value) and
//! `key_total_sequence_lengths [B]` (int32); `cos_cache`/`sin_cache [rows, r/2]` with
//! `do_rotary`.
//!
//! - The prompt is `S == total_sequence_length` (new rows at positions 0..S); otherwise the S
//!   new rows are the last of the batch's T keys, at `T − S`. They are written into present at
//!   those positions; rotary (Q and K, MLAS's kernel, `r` = twice the caches' width) rotates
//!   them by those positions.
//! - Query row at absolute position p sees keys `[0, p]`. In a layout whose block count is
//!   below the full lower triangle's, a row whose block row `⌊p/bs⌋` holds fewer blocks than
//!   `⌊p/bs⌋ + 1` sees only the keys of its listed column blocks: the others' scores are set
//!   to the lowest float before the softmax (a dense layout masks nothing, whatever its rows).
//! - Scores are `scale·q·kᵀ` (`1/√H` unless given), the softmax runs over `[0, p]`, and the
//!   output is the probabilities times V, heads concatenated; key/value head `n / (N/N_kv)`.
//!
//! ONNX Runtime 1.32's kernel writes each head's probabilities at an offset sized by
//! `total_sequence_length` and reads them back at one sized by the batch's own key length, so
//! its output is garbage (NaN, measured) unless every `key_total_sequence_lengths` equals
//! `total_sequence_length`: other lengths are refused here. So are column blocks outside the
//! mask, which ONNX Runtime writes out of bounds.

use super::super::attention::{rotary_caches, Heads};
use super::super::attrs::{boxed, AttrError, Attrs};
use super::super::shape::{fact, opt_fact, FactsResult};
use super::super::softmax::{mlas_softmax_row, softmax_row};
use super::super::util::{checked_len, float_values, in_dtype, input, opt_input};
use super::super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use super::group_query_attention::{
    head_scores, head_values, int32_values, rotate_heads, split_qkv,
};
use super::MS_DOMAIN;
use crate::graph::fact::{DimFact, Fact};
use crate::graph::Node;
use crate::numeric::Accumulator;
use crate::tensor::{DType, Tensor};
use rayon::prelude::*;

pub fn register(r: &mut Registry) {
    use InputRole::{Data, Param};
    r.add_in(MS_DOMAIN, "SparseAttention", sparse_attention)
        .parse(|n, _| boxed(SparseAttrs::parse(n)))
        .roles(&[
            Data, Data, Data, Data, Data, Param, Param, Param, Param, Data, Data,
        ])
        .infer(sparse_facts);
}

#[derive(Clone, Debug, PartialEq)]
struct SparseAttrs {
    num_heads: usize,
    kv_num_heads: usize,
    /// 0: `1/√head_size`.
    scale: f32,
    do_rotary: bool,
    rotary_interleaved: bool,
    block_size: usize,
}

impl SparseAttrs {
    fn parse(node: &Node) -> Result<SparseAttrs, AttrError> {
        let a = Attrs::new(node);
        let positive = |name: &str| -> Result<usize, AttrError> {
            let v = a.required_int(name)?;
            usize::try_from(v)
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| AttrError::new(name, format!("must be > 0, got {v}")))
        };
        let num_heads = positive("num_heads")?;
        let kv_num_heads = positive("kv_num_heads")?;
        if num_heads % kv_num_heads != 0 {
            return Err(AttrError::new(
                "kv_num_heads",
                format!("{kv_num_heads} does not divide num_heads {num_heads}"),
            ));
        }
        Ok(SparseAttrs {
            num_heads,
            kv_num_heads,
            scale: a.float_or("scale", 0.0)?,
            do_rotary: a.flag("do_rotary", false)?,
            rotary_interleaved: a.flag("rotary_interleaved", false)?,
            block_size: positive("sparse_block_size")?,
        })
    }
}

/// The block mask of every layout, checked: `row[l]` has `max_blocks + 1` offsets into
/// `col[l]`.
struct BlockMask {
    layouts: usize,
    max_blocks: usize,
    rows: Vec<i64>,
    cols: Vec<i64>,
    nnz: usize,
    /// Whether the layout has fewer blocks than the full lower triangle (ONNX Runtime masks
    /// rows only in such a layout).
    sparse: Vec<bool>,
}

impl BlockMask {
    fn new(row_t: &Tensor, col_t: &Tensor, num_heads: usize) -> Result<BlockMask, OpError> {
        let (rs, cs) = (row_t.shape(), col_t.shape());
        let &[layouts, stride] = rs else {
            return Err(OpError(format!(
                "block_row_indices {rs:?} must be [num_layout, max_blocks + 1]"
            )));
        };
        if layouts == 0 || stride < 2 || !num_heads.is_multiple_of(layouts) {
            return Err(OpError(format!(
                "block_row_indices {rs:?} must be [num_layout, max_blocks + 1] with num_heads \
                 {num_heads} a multiple of num_layout and max_blocks >= 1"
            )));
        }
        let max_blocks = stride - 1;
        let nnz = match *cs {
            [l, nnz] if l == layouts && nnz <= max_blocks * max_blocks => nnz,
            _ => {
                return Err(OpError(format!(
                    "block_col_indices {cs:?} must be [num_layout, nnz] = [{layouts}, at most \
                     {}]",
                    max_blocks * max_blocks
                )))
            }
        };
        let rows = int32_values(row_t, "block_row_indices")?;
        let cols = int32_values(col_t, "block_col_indices")?;
        for l in 0..layouts {
            let r = &rows[l * stride..(l + 1) * stride];
            if r[0] < 0 || r.windows(2).any(|w| w[1] < w[0]) || r[max_blocks] > nnz as i64 {
                return Err(OpError(format!(
                    "block_row_indices of layout {l} ({r:?}) must not fall and stay within [0, \
                     nnz {nnz}]"
                )));
            }
        }
        let triangle = (max_blocks * (max_blocks + 1) / 2) as i64;
        let sparse = (0..layouts)
            .map(|l| rows[l * stride + max_blocks] < triangle)
            .collect();
        Ok(BlockMask {
            layouts,
            max_blocks,
            rows,
            cols,
            nnz,
            sparse,
        })
    }

    /// The column blocks block row `r` of layout `l` lists, or None where the row sees every
    /// causal key (a dense layout, or a row of all `r + 1` blocks).
    fn row_blocks(&self, l: usize, r: usize) -> Result<Option<Vec<bool>>, OpError> {
        let row = &self.rows[l * (self.max_blocks + 1)..];
        let (from, to) = (row[r] as usize, row[r + 1] as usize);
        if !self.sparse[l] || to - from == r + 1 {
            return Ok(None);
        }
        let mut seen = vec![false; self.max_blocks];
        for &c in &self.cols[l * self.nnz + from..l * self.nnz + to] {
            let c = usize::try_from(c)
                .ok()
                .filter(|&c| c < self.max_blocks)
                .ok_or_else(|| {
                    OpError(format!(
                        "block_col_indices of layout {l}, block row {r}: column block {c} is \
                         outside [0, {})",
                        self.max_blocks
                    ))
                })?;
            seen[c] = true;
        }
        Ok(Some(seen))
    }
}

/// One value of an int32 input given as a scalar or one-element vector.
fn one_int32(t: &Tensor, what: &str) -> Result<i64, OpError> {
    match int32_values(t, what)?.as_slice() {
        &[v] => Ok(v),
        v => Err(OpError(format!("{what} must hold one value, got {v:?}"))),
    }
}

fn sparse_attention(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<SparseAttrs>()?;
    let (n, nk) = (attrs.num_heads, attrs.kv_num_heads);
    let dtype = input(inputs, 0)?.dtype();
    let (mut q, mut k, v) = split_qkv(inputs, (n, nk))?;
    let (b, s, h) = (q.b, q.len, q.h);
    if h % 8 != 0 {
        return Err(OpError(format!(
            "head size {h} must be a multiple of 8 (ONNX Runtime's rule)"
        )));
    }
    let total = one_int32(input(inputs, 7)?, "total_sequence_length")?;
    let total = usize::try_from(total)
        .ok()
        .filter(|&t| t >= s)
        .ok_or_else(|| {
            OpError(format!(
                "total_sequence_length {total} must be at least the sequence length {s}"
            ))
        })?;
    let mask = BlockMask::new(input(inputs, 5)?, input(inputs, 6)?, n)?;
    if mask.max_blocks * attrs.block_size < total {
        return Err(OpError(format!(
            "the block mask covers {} positions ({} blocks of {}), fewer than \
             total_sequence_length {total}",
            mask.max_blocks * attrs.block_size,
            mask.max_blocks,
            attrs.block_size
        )));
    }
    let (pk_t, pv_t) = (input(inputs, 3)?, input(inputs, 4)?);
    let m = pk_t.shape().get(2).copied().unwrap_or(0);
    let want = [b, nk, m, h];
    if pk_t.shape() != want || pv_t.shape() != want || m < total {
        return Err(OpError(format!(
            "past_key {:?} and past_value {:?} must both be [B, N_kv, M, H] = [{b}, {nk}, M, \
             {h}] with M >= total_sequence_length {total}",
            pk_t.shape(),
            pv_t.shape()
        )));
    }
    let lens_t = input(inputs, 8)?;
    if lens_t.shape() != [b] {
        return Err(OpError(format!(
            "key_total_sequence_lengths {:?} must be [B] = [{b}]",
            lens_t.shape()
        )));
    }
    let lens = int32_values(lens_t, "key_total_sequence_lengths")?;
    if lens.iter().any(|&t| t != total as i64) {
        return Err(OpError(format!(
            "key_total_sequence_lengths {lens:?} must all equal total_sequence_length {total}: \
             ONNX Runtime 1.32's CPU kernel misplaces the probabilities of other lengths"
        )));
    }
    // Every batch's new rows start here (the prompt: 0; else the last S of its T keys).
    let past = total - s;
    if attrs.do_rotary {
        let (Some(cos), Some(sin)) = (opt_input(inputs, 9), opt_input(inputs, 10)) else {
            return Err(OpError("do_rotary needs cos_cache and sin_cache".into()));
        };
        let (cos, sin, half) = rotary_caches(cos, sin, 2)?;
        let rows = cos.len() / half.max(1);
        if h % 16 != 0 || half % 8 != 0 || half == 0 || half > h / 16 * 8 || rows < total {
            return Err(OpError(format!(
                "rotary caches [{rows}, {half}] with head size {h}: the head size must be a \
                 multiple of 16, the width a positive multiple of 8 up to half the head, the \
                 rows at least total_sequence_length {total} (ONNX Runtime's rules)"
            )));
        }
        rotate_heads(
            [&mut q, &mut k],
            attrs.rotary_interleaved,
            (&cos, &sin, half),
            &|_, si, _| Ok(past + si),
        )?;
    }
    // Present: the past buffer with the new rows written at `past..past + S`.
    let write = |t: &Tensor, new: &Heads, what: &str| -> Result<Vec<f32>, OpError> {
        let mut buf = float_values(t, what)?;
        for bk in 0..b * nk {
            buf[(bk * m + past) * h..][..s * h].copy_from_slice(&new.v[bk * s * h..][..s * h]);
        }
        Ok(buf)
    };
    let pk = write(pk_t, &k, "past_key")?;
    let pv = write(pv_t, &v, "past_value")?;
    checked_len(&[b, n, s, total])?;
    let scale = if attrs.scale == 0.0 {
        1.0 / (h as f32).sqrt()
    } else {
        attrs.scale
    };
    // Each block row's visible column blocks per layout, once.
    let first_row = past / attrs.block_size;
    let last_row = (total - 1) / attrs.block_size;
    let blocks: Vec<Vec<Option<Vec<bool>>>> = (0..mask.layouts)
        .map(|l| {
            (first_row..=last_row)
                .map(|r| mask.row_blocks(l, r))
                .collect()
        })
        .collect::<Result<_, _>>()?;
    let acc = ctx.accumulate;
    // ONNX Runtime's arithmetic (MLAS's GEMM and softmax), bit for bit, for a float32 layer
    // outside a precision plan.
    let exact = dtype == DType::F32 && ctx.round_to.is_none() && acc == Accumulator::F32;
    let (t, group) = (total, n / nk);
    let per_head: Vec<Vec<f32>> = (0..b * n)
        .into_par_iter()
        .map(|bn| {
            let (bi, ni) = (bn / n, bn % n);
            let kv = (bi * nk + ni / group) * m * h;
            let (qh, kh, vh) = (&q.v[bn * s * h..(bn + 1) * s * h], &pk[kv..], &pv[kv..]);
            let mut probs = head_scores(exact, acc, (s, t, h), scale, qh, kh);
            let layout = &blocks[ni % mask.layouts];
            for (si, row) in probs.chunks_mut(t).enumerate() {
                let pos = past + si;
                let window = &mut row[..=pos];
                if !exact {
                    window.iter_mut().for_each(|x| *x *= scale);
                }
                if let Some(seen) = &layout[pos / attrs.block_size - first_row] {
                    for (j, x) in window.iter_mut().enumerate() {
                        if !seen[j / attrs.block_size] {
                            *x = f32::MIN;
                        }
                    }
                }
                if exact {
                    mlas_softmax_row(window);
                } else {
                    softmax_row(window);
                }
                row[pos + 1..].fill(0.0);
            }
            head_values(exact, acc, (s, t, h), &probs, vh)
        })
        .collect();
    let out = Heads {
        b,
        n,
        len: s,
        h,
        v: per_head.concat(),
    };
    let present = |v: Vec<f32>| in_dtype(Tensor::from_f32(vec![b, nk, m, h], v), dtype);
    Ok(vec![
        in_dtype(Tensor::from_f32(vec![b, s, n * h], out.merged()), dtype),
        present(pk),
        present(pv),
    ])
}

/// output `[B, S, N·H]` (H from the query's width, packed or not), present as past.
fn sparse_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let attrs = ctx.attrs::<SparseAttrs>()?;
    let q = fact(ins, 0)?;
    let packed = opt_fact(ins, 1).is_none();
    let heads = if packed {
        attrs.num_heads + 2 * attrs.kv_num_heads
    } else {
        attrs.num_heads
    };
    let (batch, seq, width) = match q.shape.as_deref() {
        Some([b, s, d]) => (b.clone(), s.clone(), d.as_known()),
        Some(sh) => {
            return Err(OpError(format!(
                "query has rank {}, expected [B, S, D]",
                sh.len()
            )))
        }
        None => (ctx.unknown_dim(), ctx.unknown_dim(), None),
    };
    if let Some(d) = width.filter(|d| d % heads != 0) {
        return Err(OpError(format!(
            "query width {d} does not split into {heads} heads"
        )));
    }
    let out = match width {
        Some(d) => DimFact::known(d / heads * attrs.num_heads),
        None => ctx.unknown_dim(),
    };
    let past = |i: usize| {
        let p = fact(ins, i)?;
        Ok::<Fact, OpError>(Fact::new(q.dtype, p.shape.clone()))
    };
    Ok(vec![
        Fact::new(q.dtype, Some(vec![batch, seq, out])),
        past(3)?,
        past(4)?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::node_with;
    use crate::graph::Attribute;

    fn node(n: i64, nk: i64, extra: &[(&str, Attribute)]) -> Node {
        let mut attrs = vec![
            ("num_heads", Attribute::Int(n)),
            ("kv_num_heads", Attribute::Int(nk)),
            ("sparse_block_size", Attribute::Int(2)),
        ];
        attrs.extend(extra.iter().cloned());
        let mut node = node_with("SparseAttention", &attrs);
        node.domain = MS_DOMAIN.into();
        node.outputs = vec!["y".into(), "pk".into(), "pv".into()];
        node
    }

    fn run(node: &Node, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        crate::ops::attrs::parse_node(node, 1).map_err(|e| OpError(e.to_string()))?;
        let k = Registry::global()
            .get(MS_DOMAIN, "SparseAttention")
            .unwrap();
        k(&OpCtx::new(node, 1), inputs)
    }

    fn i32s(shape: &[usize], v: &[i32]) -> Tensor {
        Tensor::from_parts(
            shape.to_vec(),
            crate::tensor::TensorData::I32(v.to_vec().into()),
        )
    }

    fn f(shape: &[usize], v: impl Fn(usize) -> f32) -> Tensor {
        let len = shape.iter().product();
        Tensor::from_f32(shape.to_vec(), (0..len).map(v).collect())
    }

    /// The problem of the tests: one head of 8, a prompt of 6 in blocks of 2 (3 block rows);
    /// block row 2 lists blocks 0 and 2 only (block 1 masked), a sparse layout.
    struct Case {
        q: Tensor,
        k: Tensor,
        v: Tensor,
        past: Tensor,
        row: Tensor,
        col: Tensor,
        total: Tensor,
        lens: Tensor,
    }

    fn case() -> Case {
        Case {
            q: f(&[1, 6, 8], |i| ((i * 7) % 11) as f32 * 0.1 - 0.5),
            k: f(&[1, 6, 8], |i| ((i * 5) % 13) as f32 * 0.1 - 0.6),
            v: f(&[1, 6, 8], |i| i as f32),
            past: f(&[1, 1, 8, 8], |_| 9.0),
            row: i32s(&[1, 5], &[0, 1, 3, 5, 5]),
            col: i32s(&[1, 5], &[0, 0, 1, 0, 2]),
            total: i32s(&[1], &[6]),
            lens: i32s(&[1], &[6]),
        }
    }

    impl Case {
        fn inputs(&self) -> Vec<Option<&Tensor>> {
            vec![
                Some(&self.q),
                Some(&self.k),
                Some(&self.v),
                Some(&self.past),
                Some(&self.past),
                Some(&self.row),
                Some(&self.col),
                Some(&self.total),
                Some(&self.lens),
            ]
        }
    }

    /// Rows 4 and 5 (block row 2) average only the keys of blocks 0 and 2 under causality;
    /// rows 0–3 attend causally to all keys; present holds the new rows, past's after.
    #[test]
    fn masked_blocks_get_no_weight() {
        let c = case();
        let out = run(&node(1, 1, &[]), &c.inputs()).unwrap();
        let y = out[0].as_f32().unwrap();
        let (q, k, v) = (
            c.q.as_f32().unwrap(),
            c.k.as_f32().unwrap(),
            c.v.as_f32().unwrap(),
        );
        let scale = 1.0 / 8f32.sqrt();
        for si in 0..6 {
            let keys: Vec<usize> = (0..=si).filter(|&j| si < 4 || j / 2 != 1).collect();
            let scores: Vec<f32> = keys
                .iter()
                .map(|&j| (0..8).map(|d| q[si * 8 + d] * k[j * 8 + d]).sum::<f32>() * scale)
                .collect();
            let mx = scores.iter().cloned().fold(f32::MIN, f32::max);
            let e: Vec<f32> = scores.iter().map(|x| (x - mx).exp()).collect();
            let sum: f32 = e.iter().sum();
            for d in 0..8 {
                let want: f32 = keys
                    .iter()
                    .zip(&e)
                    .map(|(&j, w)| w / sum * v[j * 8 + d])
                    .sum();
                let got = y[si * 8 + d];
                assert!(
                    (got - want).abs() < 1e-4,
                    "row {si} col {d}: {got} vs {want}"
                );
            }
        }
        let pk = out[1].as_f32().unwrap();
        assert_eq!(out[1].shape(), [1, 1, 8, 8]);
        assert_eq!(&pk[..48], k);
        assert!(pk[48..].iter().all(|&x| x == 9.0));
    }

    /// A dense layout (as many blocks as the full lower triangle) masks nothing, even a row
    /// listing fewer blocks than its own; the same rows in a sparse layout are masked.
    #[test]
    fn a_dense_layout_is_causal() {
        let mut c = case();
        // Block rows list 2, 1 and 3 blocks: 6, the triangle of 3 block rows.
        c.row = i32s(&[1, 4], &[0, 2, 3, 6]);
        c.col = i32s(&[1, 6], &[0, 1, 1, 0, 1, 2]);
        let dense = run(&node(1, 1, &[]), &c.inputs()).unwrap().remove(0);
        // Every block row listing all its blocks.
        c.row = i32s(&[1, 4], &[0, 1, 3, 6]);
        c.col = i32s(&[1, 6], &[0, 0, 1, 0, 1, 2]);
        let plain = run(&node(1, 1, &[]), &c.inputs()).unwrap().remove(0);
        assert_eq!(dense, plain);
        // A fourth (empty) block row makes the layout sparse: block row 1 (rows 2 and 3)
        // then sees block 1 only.
        c.row = i32s(&[1, 5], &[0, 2, 3, 6, 6]);
        c.col = i32s(&[1, 6], &[0, 1, 1, 0, 1, 2]);
        let sparse = run(&node(1, 1, &[]), &c.inputs()).unwrap().remove(0);
        let (p, sp) = (plain.as_f32().unwrap(), sparse.as_f32().unwrap());
        assert_eq!(p[..16], sp[..16]);
        assert_ne!(p[16..32], sp[16..32]);
    }

    #[test]
    fn bad_inputs_are_named() {
        let c = case();
        let err = |n: &Node, ins: &[Option<&Tensor>]| run(n, ins).unwrap_err().0;
        let mut ins = c.inputs();
        let uneven = i32s(&[1], &[5]);
        ins[8] = Some(&uneven);
        let e = err(&node(1, 1, &[]), &ins);
        assert!(e.contains("must all equal total_sequence_length 6"), "{e}");
        let mut ins = c.inputs();
        let short = f(&[1, 1, 4, 8], |_| 0.0);
        ins[3] = Some(&short);
        ins[4] = Some(&short);
        let e = err(&node(1, 1, &[]), &ins);
        assert!(e.contains("M >= total_sequence_length 6"), "{e}");
        let mut ins = c.inputs();
        let wide = i32s(&[1, 5], &[0, 1, 3, 5, 5]);
        let far = i32s(&[1, 5], &[0, 0, 1, 0, 7]);
        ins[5] = Some(&wide);
        ins[6] = Some(&far);
        let e = err(&node(1, 1, &[]), &ins);
        assert!(e.contains("column block 7 is outside [0, 4)"), "{e}");
        // Two query heads of 8 cannot cycle through 3 layouts.
        let mut ins = c.inputs();
        let q2 = f(&[1, 6, 16], |i| i as f32 * 0.01);
        let three_layouts = i32s(&[3, 5], &[0, 1, 3, 5, 5, 0, 1, 3, 5, 5, 0, 1, 3, 5, 5]);
        ins[0] = Some(&q2);
        ins[5] = Some(&three_layouts);
        let e = err(&node(2, 1, &[]), &ins);
        assert!(e.contains("block_row_indices [3, 5]"), "{e}");
        let e = err(
            &node(1, 1, &[("do_rotary", Attribute::Int(1))]),
            &c.inputs(),
        );
        assert!(e.contains("do_rotary needs cos_cache"), "{e}");
        let e = err(&node(2, 2, &[]), &c.inputs());
        assert!(e.contains("head size 4 must be a multiple of 8"), "{e}");
        for (n, nk, what) in [
            (0, 1, "num_heads"),
            (2, 0, "kv_num_heads"),
            (3, 2, "kv_num_heads"),
        ] {
            let e = err(&node(n, nk, &[]), &c.inputs());
            assert!(e.contains(&format!("attribute '{what}'")), "{e}");
        }
    }
}
