//! The RMS normalization that T5 and Llama-style exports write as plain layers — `Pow(x, 2)`
//! (or `Mul(x, x)`), `ReduceMean` over the last axis, `Add ε`, `Sqrt`, then `Div(1, ·)` (or
//! `Reciprocal`) and `Mul(x, ·)`, or `Div(x, ·)`, and perhaps a `Mul` by a weight per column —
//! computed row by row in one pass, with the bits of those layers run one by one: each
//! layer's float32 operation in the same order, the mean as `ReduceMean`'s float32 kernel
//! sums (each row's f64 chain in order from its first term, divided by the width, rounded to
//! float32: `reduce::trailing_f32_sums`), and under a 16-bit plan each layer's roundings of
//! what it reads and writes. ONNX Runtime fuses the same layers into one kernel
//! (`SimplifiedLayerNormalization`); here they were six to eight layers of a few thousand
//! values each, per normalization (`exec::rms` finds them).

use super::vector::{map_in_place, zip_in_place};
use crate::numeric::Rounding;
use rayon::prelude::*;

/// Rows whose f64 chains are summed side by side (`ReduceMean`'s kernel does the same: one
/// chain alone waits on each addition).
const ROWS_AT_ONCE: usize = 8;
/// Tensors with fewer values run on the calling thread.
const PARALLEL_VALUES: usize = 1 << 16;

/// What a layer of one activation input rounds (None: nothing, float32): that input as it
/// reads it, and its output.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Rounds {
    pub reads: Option<Rounding>,
    pub writes: Option<Rounding>,
}

/// What a layer of two activation inputs rounds: the row's value `x` and the row's scale.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Rounds2 {
    pub reads_x: Option<Rounding>,
    pub reads_scale: Option<Rounding>,
    pub writes: Option<Rounding>,
}

/// How each value is divided by its row's root mean square.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Scale {
    /// `r = one / root` (`Div(one, root)`, or `Reciprocal`: one = 1), then `x · r`.
    Reciprocal {
        one: f32,
        reciprocal: Rounds,
        mul: Rounds2,
    },
    /// `x / root`.
    Divide(Rounds2),
}

/// The layers of one decomposed RMS normalization, as the kernel runs them: each constant as
/// its layer reads it (rounded already where the layer rounds it).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RmsLayers<'a> {
    /// `x · x`.
    pub square: Rounds,
    pub mean: Rounds,
    /// `mean + epsilon`.
    pub epsilon: f32,
    pub add: Rounds,
    pub sqrt: Rounds,
    pub scale: Scale,
    /// `y · weight[column]`, one weight per column of a row.
    pub weight: Option<(std::borrow::Cow<'a, [f32]>, Rounds)>,
}

impl RmsLayers<'_> {
    /// These layers without the roundings of values already on that grid (a rounding's
    /// second application changes nothing): x's where it is on `x_on`'s, and what a layer
    /// reads where the layer before wrote it so. Each of them is a pass over the values.
    pub(crate) fn without_repeated_roundings(mut self, x_on: Option<Rounding>) -> Self {
        let repeated = |reads: &mut Option<Rounding>, on: Option<Rounding>| {
            if reads.is_some() && *reads == on {
                *reads = None;
            }
        };
        repeated(&mut self.square.reads, x_on);
        repeated(&mut self.mean.reads, self.square.writes);
        let scaled = match &mut self.scale {
            Scale::Reciprocal { mul, .. } => mul,
            Scale::Divide(div) => div,
        };
        repeated(&mut scaled.reads_x, x_on);
        let written = scaled.writes;
        if let Some((_, by)) = &mut self.weight {
            repeated(&mut by.reads, written);
        }
        self
    }

    fn rounds_anything(&self) -> bool {
        let one = |r: &Rounds| r.reads.is_some() || r.writes.is_some();
        let two =
            |r: &Rounds2| r.reads_x.is_some() || r.reads_scale.is_some() || r.writes.is_some();
        one(&self.square)
            || one(&self.mean)
            || one(&self.add)
            || one(&self.sqrt)
            || match &self.scale {
                Scale::Reciprocal {
                    reciprocal, mul, ..
                } => one(reciprocal) || two(mul),
                Scale::Divide(d) => two(d),
            }
            || self.weight.as_ref().is_some_and(|(_, r)| one(r))
    }
}

#[inline(always)]
fn round(r: Option<Rounding>, v: f32) -> f32 {
    match r {
        Some(r) => r.round(v),
        None => v,
    }
}

/// `x` normalized row by row (rows of `width` values) into `out`, as the layers of `layers`
/// compute it.
pub(crate) fn rms_rows(x: &[f32], width: usize, layers: &RmsLayers<'_>, out: &mut [f32]) {
    assert_eq!(x.len(), out.len());
    assert!(width > 0 && x.len().is_multiple_of(width));
    if let Some((w, _)) = &layers.weight {
        assert_eq!(w.len(), width, "one weight per column");
    }
    let exact = !layers.rounds_anything();
    let group = width * ROWS_AT_ONCE;
    let run = |(xs, os): (&[f32], &mut [f32])| rows(xs, os, width, layers, exact);
    if x.len() >= PARALLEL_VALUES {
        x.par_chunks(group)
            .zip(out.par_chunks_mut(group))
            .for_each(run);
    } else {
        x.chunks(group).zip(out.chunks_mut(group)).for_each(run);
    }
}

/// The sums of `term` over each row of `x` (up to ROWS_AT_ONCE rows of `width`), each row's f64
/// chain in order from its first term, the rows' chains side by side in registers (a count of
/// rows fixed at compile time: with a count known only at run time the sums stayed in memory
/// and each addition waited on a store, 16 µs for 16 rows of 512).
fn sums(x: &[f32], width: usize, term: impl Fn(f32) -> f64 + Copy) -> [f64; ROWS_AT_ONCE] {
    fn side_by_side<const N: usize>(
        x: &[f32],
        width: usize,
        term: impl Fn(f32) -> f64 + Copy,
        into: &mut [f64; ROWS_AT_ONCE],
    ) {
        let rows: [&[f32]; N] = std::array::from_fn(|r| &x[r * width..(r + 1) * width]);
        let mut s: [f64; N] = std::array::from_fn(|r| term(rows[r][0]));
        // Column k of every row: the N chains advance together.
        #[allow(clippy::needless_range_loop)]
        for k in 1..width {
            for r in 0..N {
                s[r] += term(rows[r][k]);
            }
        }
        into[..N].copy_from_slice(&s);
    }
    let mut into = [0f64; ROWS_AT_ONCE];
    match x.len() / width {
        8 => side_by_side::<8>(x, width, term, &mut into),
        7 => side_by_side::<7>(x, width, term, &mut into),
        6 => side_by_side::<6>(x, width, term, &mut into),
        5 => side_by_side::<5>(x, width, term, &mut into),
        4 => side_by_side::<4>(x, width, term, &mut into),
        3 => side_by_side::<3>(x, width, term, &mut into),
        2 => side_by_side::<2>(x, width, term, &mut into),
        _ => side_by_side::<1>(x, width, term, &mut into),
    }
    into
}

/// Up to ROWS_AT_ONCE rows.
fn rows(x: &[f32], out: &mut [f32], width: usize, l: &RmsLayers<'_>, exact: bool) {
    // The squares' sums, each row's chain in order from its first term. Under roundings the
    // squares are made in `out` first, each rounding a vector pass over the rows rather than
    // a scalar rounding per value (docs/performance-history.md, "Decomposed RMS
    // normalizations as one kernel"); the rows are written over them below, after the sums.
    let sums = if exact {
        sums(x, width, |v| (v * v) as f64)
    } else {
        if !one_pass::squares(x, out, l) {
            out.copy_from_slice(x);
            round_slice(l.square.reads, out);
            map_in_place(out, |v| v * v);
            round_slice(l.square.writes, out);
            round_slice(l.mean.reads, out);
        }
        sums(out, width, |v| v as f64)
    };
    for ((sum, row), out) in sums
        .iter()
        .zip(x.chunks_exact(width))
        .zip(out.chunks_exact_mut(width))
    {
        let mean = round(l.mean.writes, (sum / width as f64) as f32);
        let shifted = round(l.add.writes, round(l.add.reads, mean) + l.epsilon);
        let root = round(l.sqrt.writes, round(l.sqrt.reads, shifted).sqrt());
        // The row's scale as the layer that scales reads it: Div's divisor, or the Mul's
        // reciprocal as its layer writes it and the Mul reads it.
        let scale = match l.scale {
            Scale::Reciprocal {
                one,
                reciprocal,
                mul,
            } => round(
                mul.reads_scale,
                round(reciprocal.writes, one / round(reciprocal.reads, root)),
            ),
            Scale::Divide(div) => round(div.reads_scale, root),
        };
        if !exact && one_pass::scaled_row(row, scale, l, out) {
            continue;
        }
        // The row copied, then scaled in AVX2 loops where the CPU has them (`vector`: the same
        // operations in every lane width).
        out.copy_from_slice(row);
        match (l.scale, &l.weight, exact) {
            // Float32 throughout: one pass.
            (Scale::Reciprocal { .. }, Some((w, _)), true) => {
                zip_in_place(out, w, move |v, w| v * scale * w);
            }
            (Scale::Reciprocal { .. }, None, true) => map_in_place(out, move |v| v * scale),
            (Scale::Divide(_), Some((w, _)), true) => {
                zip_in_place(out, w, move |v, w| v / scale * w);
            }
            (Scale::Divide(_), None, true) => map_in_place(out, move |v| v / scale),
            // Each layer's roundings, a pass each.
            (_, weight, false) => {
                match l.scale {
                    Scale::Reciprocal { mul, .. } => {
                        round_slice(mul.reads_x, out);
                        map_in_place(out, move |v| v * scale);
                        round_slice(mul.writes, out);
                    }
                    Scale::Divide(div) => {
                        round_slice(div.reads_x, out);
                        map_in_place(out, move |v| v / scale);
                        round_slice(div.writes, out);
                    }
                }
                if let Some((w, by)) = weight {
                    round_slice(by.reads, out);
                    zip_in_place(out, w, |v, w| v * w);
                    round_slice(by.writes, out);
                }
            }
        }
    }
}

/// The squares and each row's scaling of a 16-bit plan in one pass each, every rounding in
/// registers (AVX-512F; the float16 Flan-T5 encoder's normalizations took 1.5× their float32
/// time as a pass per rounding), where each layer reads what the one before wrote as it is
/// (its roundings of what it reads gone: [`RmsLayers::without_repeated_roundings`]). Each
/// returns false, having written nothing, where that does not hold or the CPU lacks the
/// instructions: the passes then run.
mod one_pass {
    use super::{RmsLayers, Scale};

    /// `out[i]` = x[i]·x[i] as the square's layer writes it (and the mean reads it).
    pub(super) fn squares(x: &[f32], out: &mut [f32], l: &RmsLayers<'_>) -> bool {
        #[cfg(target_arch = "x86_64")]
        if l.square.reads.is_none()
            && l.mean.reads.is_none()
            && std::arch::is_x86_feature_detected!("avx512f")
        {
            use crate::numeric::grid::{self, BF16, F16, NONE};
            // SAFETY: the CPU has the feature the functions were compiled for.
            unsafe {
                match grid::of(l.square.writes) {
                    NONE => avx512::squares::<NONE>(x, out),
                    F16 => avx512::squares::<F16>(x, out),
                    _ => avx512::squares::<BF16>(x, out),
                }
            }
            return true;
        }
        let _ = (x, out, l);
        false
    }

    /// `out` = the row scaled (`x · scale` or `x / scale`, as the scaling layer writes it),
    /// then times the weights as their layer writes it.
    pub(super) fn scaled_row(x: &[f32], scale: f32, l: &RmsLayers<'_>, out: &mut [f32]) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let (divides, by) = match l.scale {
                Scale::Reciprocal { mul, .. } => (false, mul),
                Scale::Divide(div) => (true, div),
            };
            let weight = (l.weight.as_ref()).map(|(w, r)| (&w[..], r.reads, r.writes));
            // What the weights' layer rounds: nothing, or (reading the scaled values as they
            // are, so in the same precision) what the scaling layer rounds.
            let by_weight = weight.map(|(.., r)| r);
            if by.reads_x.is_none()
                && weight.is_none_or(|(_, reads, _)| reads.is_none())
                && by_weight.is_none_or(|r| r.is_none() || r == by.writes)
                && std::arch::is_x86_feature_detected!("avx512f")
            {
                use crate::numeric::grid::{self, BF16 as B, F16 as H, NONE as N};
                let w = weight.map(|(w, ..)| w);
                let (a, b) = (grid::of(by.writes), grid::of(by_weight.flatten()));
                // SAFETY (each arm): the CPU has the feature the functions were compiled for.
                unsafe {
                    match (divides, a, b) {
                        (false, N, _) => avx512::scaled::<false, N, N>(x, scale, w, out),
                        (false, H, N) => avx512::scaled::<false, H, N>(x, scale, w, out),
                        (false, H, _) => avx512::scaled::<false, H, H>(x, scale, w, out),
                        (false, _, N) => avx512::scaled::<false, B, N>(x, scale, w, out),
                        (false, _, _) => avx512::scaled::<false, B, B>(x, scale, w, out),
                        (true, N, _) => avx512::scaled::<true, N, N>(x, scale, w, out),
                        (true, H, N) => avx512::scaled::<true, H, N>(x, scale, w, out),
                        (true, H, _) => avx512::scaled::<true, H, H>(x, scale, w, out),
                        (true, _, N) => avx512::scaled::<true, B, N>(x, scale, w, out),
                        (true, _, _) => avx512::scaled::<true, B, B>(x, scale, w, out),
                    }
                }
                return true;
            }
        }
        let _ = (x, scale, l, out);
        false
    }

    #[cfg(target_arch = "x86_64")]
    mod avx512 {
        use crate::numeric::{lanes16 as lanes, rounded_x16 as rounded};
        use std::arch::x86_64::*;

        /// # Safety
        /// The CPU has AVX-512F.
        #[target_feature(enable = "avx512f")]
        pub(super) unsafe fn squares<const W: u8>(x: &[f32], out: &mut [f32]) {
            let n = x.len().min(out.len());
            for at in (0..n).step_by(16) {
                let mask = lanes(at, n);
                // SAFETY: the mask covers values at..min(at + 16, n) of both; masked-off
                // lanes are neither read nor written.
                unsafe {
                    let v = _mm512_maskz_loadu_ps(mask, x.as_ptr().add(at));
                    let sq = rounded::<W>(_mm512_mul_ps(v, v));
                    _mm512_mask_storeu_ps(out.as_mut_ptr().add(at), mask, sq);
                }
            }
        }

        /// `out` = x·scale (x/scale where DIVIDES) rounded as `S` says, then times `w` (one
        /// per value) rounded as `W` says.
        ///
        /// # Safety
        /// The CPU has AVX-512F.
        #[target_feature(enable = "avx512f")]
        pub(super) unsafe fn scaled<const DIVIDES: bool, const S: u8, const W: u8>(
            x: &[f32],
            scale: f32,
            w: Option<&[f32]>,
            out: &mut [f32],
        ) {
            let n = x.len().min(out.len());
            assert!(w.is_none_or(|w| w.len() >= n), "a weight per value");
            let s = _mm512_set1_ps(scale);
            for at in (0..n).step_by(16) {
                let mask = lanes(at, n);
                // SAFETY: the mask covers values at..min(at + 16, n) of x, out and w (at
                // least n values, asserted); masked-off lanes are neither read nor written.
                unsafe {
                    let v = _mm512_maskz_loadu_ps(mask, x.as_ptr().add(at));
                    let mut y = rounded::<S>(match DIVIDES {
                        true => _mm512_div_ps(v, s),
                        false => _mm512_mul_ps(v, s),
                    });
                    if let Some(w) = w {
                        let wv = _mm512_maskz_loadu_ps(mask, w.as_ptr().add(at));
                        y = rounded::<W>(_mm512_mul_ps(y, wv));
                    }
                    _mm512_mask_storeu_ps(out.as_mut_ptr().add(at), mask, y);
                }
            }
        }
    }
}

/// `v` rounded where `r` says.
fn round_slice(r: Option<Rounding>, v: &mut [f32]) {
    if let Some(r) = r {
        r.round_slice(v);
    }
}
