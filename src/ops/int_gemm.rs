//! The exact integer product of 8-bit codes by a constant weight: `c = a · b` in i32, where
//! `a` and `b` are codes minus their zero points (at most 255 in magnitude). The weight is
//! packed once into panels of 16 columns with k in groups, and the kernels add the products
//! of a group into an i32 lane, then the lanes in i32, wrapping as the hardware accumulator
//! does. Integer sums are the same in any order, so every path (any kernel, any thread
//! count) gives the same bits as [`super::integer::igemm`]:
//!
//! - AVX-VNNI / AVX512-VNNI (`vpdpbusd`), where the weight's codes fit int8: groups of four
//!   products of an unsigned byte of A by a signed byte of B. A row's values are taken as
//!   `lo + u` with `lo` the row's least value and `u` in 0..=255 (one zero point per row: its
//!   codes span at most 255), and `Σ a·b = Σ u·b + lo · Σ b` with B's column sums kept.
//!   ONNX Runtime's u8s8 kernels do the same on these CPUs.
//! - AVX2 (`vpmaddwd`): groups of two products of 16-bit values, the weight stored as bytes
//!   where its codes fit int8 and as 16-bit values otherwise. ONNX Runtime's u8s8 kernel on
//!   AVX2 without VNNI sums byte pairs with `vpmaddubsw`, which saturates in 16 bits
//!   (docs/export.md); this one reads the same bytes per weight and never saturates.
//! - portable code otherwise.

use rayon::prelude::*;

/// Columns of one panel: two 256-bit registers of eight i32 lanes.
const NR: usize = 16;
/// Rows of A computed together (each row's group broadcast against the same loaded panel).
const MR: usize = 4;
/// The 512-bit VNNI kernel's tile: this many rows of A by two panels (16 accumulators of the
/// 32 registers; each panel load serves 8 rows, each broadcast 2 panels).
const WIDE_ROWS: usize = 8;
const WIDE_COLUMNS: usize = 2 * NR;
/// How many groups of four rows of B ahead the 512-bit kernel prefetches its panels: a
/// kept weight is read once per call, most of it from L3 or memory.
const PREFETCH_QUADS: usize = 16;
/// Products (m·k·16) from which a panel range is worth a task of its own.
const TASK_WORK: usize = 1 << 16;

/// A k×n weight's shifted codes packed for [`PackedIntB::product`]: panel `p` holds columns
/// `16p..16p+16`, and for group `q` of `g` rows (2 or 4) the values `b[g·q + h, j]`, `h` in
/// `0..g`, for each of its 16 columns in turn (zero past k and n).
pub struct PackedIntB {
    k: usize,
    n: usize,
    data: Panels,
}

/// The packed values and the kernel that reads them.
enum Panels {
    /// Pairs of bytes (every shifted code fits int8: symmetric weights, the usual dynamic
    /// quantization), for `vpmaddwd`.
    I8(Vec<i8>),
    /// Pairs of 16-bit values, for `vpmaddwd`.
    I16(Vec<i16>),
    /// Groups of four bytes for `vpdpbusd`, with each column's sum of codes.
    Quads {
        data: Vec<i8>,
        column_sums: Vec<i32>,
    },
}

/// Whether the CPU has `vpdpbusd` (AVX-VNNI's 256-bit one, or AVX512-VNNI's).
fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avxvnni")
            || (std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("avx512f"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

impl PackedIntB {
    /// Packs the row-major k×n `codes` (each within ±255: 8-bit codes minus zero points)
    /// for the fastest kernel the CPU has.
    pub fn new(codes: &[i32], k: usize, n: usize) -> PackedIntB {
        Self::with_groups(codes, k, n, has_vnni())
    }

    fn with_groups(codes: &[i32], k: usize, n: usize, quads: bool) -> PackedIntB {
        let bytes = codes[..k * n].iter().all(|&v| i8::try_from(v).is_ok());
        let data = match (bytes, quads) {
            (true, true) => {
                // Zeros past n, to a whole panel: the kernels read them 16 at a time.
                let mut column_sums = vec![0i32; n.div_ceil(NR) * NR];
                for row in codes[..k * n].chunks_exact(n.max(1)) {
                    for (s, &v) in column_sums.iter_mut().zip(row) {
                        *s = s.wrapping_add(v);
                    }
                }
                Panels::Quads {
                    data: pack(codes, k, n, 4),
                    column_sums,
                }
            }
            (true, false) => Panels::I8(pack(codes, k, n, 2)),
            (false, _) => Panels::I16(pack(codes, k, n, 2)),
        };
        PackedIntB { k, n, data }
    }

    fn group(&self) -> usize {
        match self.data {
            Panels::Quads { .. } => 4,
            _ => 2,
        }
    }

    /// Panel `p`'s values.
    fn panel(&self, p: usize) -> Panel<'_> {
        let len = self.k.div_ceil(self.group()) * self.group() * NR;
        let range = p * len..(p + 1) * len;
        match &self.data {
            Panels::I8(v) => Panel::I8(&v[range]),
            Panels::I16(v) => Panel::I16(&v[range]),
            Panels::Quads { data, .. } => Panel::I8(&data[range]),
        }
    }

    /// `c[m, n] = Σ_k a[m, k] · b[k, n]` for the m×k rows `a`, summed exactly in i32
    /// (wrapping beyond 2^31, as the hardware accumulator), written to `out` as the sums or
    /// as float32 scaled.
    pub fn product(&self, m: usize, a: RowsOfA, out: ProductOut) {
        let kernel = match self.data {
            Panels::Quads { .. } => Kernel::best_quads(),
            _ => Kernel::best_pairs(),
        };
        self.product_with(kernel, m, a, out)
    }

    /// [`Self::product`] with `kernel` (one the CPU has, for these panels).
    fn product_with(&self, kernel: Kernel, m: usize, a: RowsOfA, out: ProductOut) {
        let (k, n) = (self.k, self.n);
        assert!(a.len() >= m * k && out.len() >= m * n, "operand sizes");
        if let ProductOut::Scaled { scale, .. } = &out {
            assert!(
                scale.len() == 1 || scale.len() == n,
                "one scale or one per column"
            );
        }
        let g = self.group();
        let groups = k.div_ceil(g);
        // Uint8 codes by quads need no shifted copy: `u` is the code itself and `lo` minus
        // the zero point. Any other pairing reads the codes minus the zero point.
        let shifted;
        let a = match (a, &self.data) {
            (RowsOfA::Codes { codes, zero_point }, Panels::Quads { .. }) => RowsOfA::Codes {
                codes: &codes[..m * k],
                zero_point,
            },
            (RowsOfA::Codes { codes, zero_point }, _) => {
                shifted = codes[..m * k]
                    .iter()
                    .map(|&c| i32::from(c) - zero_point)
                    .collect::<Vec<i32>>();
                RowsOfA::Shifted(&shifted)
            }
            (RowsOfA::Shifted(a), _) => RowsOfA::Shifted(&a[..m * k]),
        };
        // A's rows as the kernel broadcasts them (each group of g values one i32), and for
        // the quads, each row's offset `lo`.
        let (a_groups, offsets, kernel, a) = match (a, kernel, &self.data) {
            (RowsOfA::Codes { codes, zero_point }, _, _) => {
                let kernel = if kernel == Kernel::Portable {
                    Kernel::PortableQuads
                } else {
                    kernel
                };
                let lows = vec![zero_point.wrapping_neg(); m];
                (code_quads(codes, m, k), Some(lows), kernel, &[][..])
            }
            (RowsOfA::Shifted(a), _, Panels::Quads { .. }) => match quad_rows(a, m, k) {
                Some((quads, lows)) if kernel == Kernel::Portable => {
                    (quads, Some(lows), Kernel::PortableQuads, a)
                }
                Some((quads, lows)) => (quads, Some(lows), kernel, a),
                // A row spanning more than 255 (not one zero point's codes): no bytes.
                None => (Vec::new(), None, Kernel::Portable, a),
            },
            (RowsOfA::Shifted(a), Kernel::Portable, _) => (Vec::new(), None, Kernel::Portable, a),
            (RowsOfA::Shifted(a), _, _) => (pair_rows(a, k), None, kernel, a),
        };
        let (tile_rows, tile_panels) = kernel.tile();
        let panels = n.div_ceil(NR);
        let per_panel = m * groups * g * NR;
        let threads = rayon::current_num_threads();
        let per_task = if per_panel * panels < TASK_WORK * 2 || threads == 1 {
            panels
        } else {
            panels
                .div_ceil(threads * 4)
                .max(TASK_WORK.div_ceil(per_panel))
        }
        .next_multiple_of(tile_panels)
        .max(1);
        let panel_len = groups * g * NR;
        // Each task computes a range of panels, the columns of c under them: per tile of
        // panels, every row tile in turn, so the panels stay in L1 while A's rows pass.
        let c = match out {
            ProductOut::Sums(c) => OutPtr::Sums(c.as_mut_ptr()),
            ProductOut::Scaled {
                out,
                scale,
                rounding,
            } => OutPtr::Scaled(out.as_mut_ptr(), scale, rounding),
        };
        (0..panels.div_ceil(per_task))
            .into_par_iter()
            .for_each(|t| {
                let (p0, p1) = (t * per_task, ((t + 1) * per_task).min(panels));
                for p in (p0..p1).step_by(tile_panels) {
                    let np = tile_panels.min(p1 - p);
                    for r0 in (0..m).step_by(tile_rows) {
                        let rows = tile_rows.min(m - r0);
                        let (j0, cols) = (p * NR, (np * NR).min(n - p * NR));
                        // The tile's rows (row r at tile[r · stride..]) into c.
                        let store = |tile: &[i32], stride: usize| {
                            // SAFETY: rows r0..r0 + rows < m, columns j0..j0 + cols <= n of c
                            // (m×n, asserted above); only this task writes these panels'
                            // columns.
                            match &c {
                                OutPtr::Sums(c) => {
                                    for (r, lanes) in tile.chunks(stride).take(rows).enumerate() {
                                        let at = (r0 + r) * n + j0;
                                        unsafe { std::slice::from_raw_parts_mut(c.add(at), cols) }
                                            .copy_from_slice(&lanes[..cols])
                                    }
                                }
                                OutPtr::Scaled(y, scale, rounding) => unsafe {
                                    scale_tile(
                                        y.add(r0 * n + j0),
                                        n,
                                        (tile, stride),
                                        [rows, cols],
                                        (scale, j0),
                                        *rounding,
                                    )
                                },
                            }
                        };
                        match kernel {
                            #[cfg(target_arch = "x86_64")]
                            Kernel::Avx512Vnni => {
                                let Panels::Quads { data, column_sums } = &self.data else {
                                    unreachable!("the 512-bit kernel reads quads")
                                };
                                let b = &data[p * panel_len..(p + np) * panel_len];
                                // The accumulators start at lo · Σ b (Σ a·b = Σ u·b + lo · Σ b).
                                let start = offsets.as_ref().map(|lows| {
                                    (&lows[r0..r0 + rows], &column_sums[p * NR..(p + np) * NR])
                                });
                                let a = &a_groups[r0 * groups..];
                                let mut acc = [[0i32; WIDE_COLUMNS]; WIDE_ROWS];
                                wide_tile(rows, np, a, groups, b, start, &mut acc);
                                store(acc.as_flattened(), WIDE_COLUMNS);
                            }
                            _ => {
                                let mut narrow = [[0i32; NR]; MR];
                                let panel = self.panel(p);
                                match kernel {
                                    Kernel::Portable => panel_rows_portable(
                                        rows,
                                        &a[r0 * k..],
                                        k,
                                        g,
                                        panel,
                                        &mut narrow,
                                    ),
                                    Kernel::PortableQuads => quads_portable(
                                        rows,
                                        &a_groups[r0 * groups..],
                                        groups,
                                        panel,
                                        &mut narrow,
                                    ),
                                    _ => panel_rows(
                                        kernel,
                                        rows,
                                        &a_groups[r0 * groups..],
                                        groups,
                                        panel,
                                        &mut narrow,
                                    ),
                                }
                                if let (Panels::Quads { column_sums, .. }, Some(lows)) =
                                    (&self.data, &offsets)
                                {
                                    // Σ a·b = Σ u·b + lo · Σ b.
                                    let sums = &column_sums[p * NR..(p + 1) * NR];
                                    for (lanes, &lo) in narrow.iter_mut().zip(&lows[r0..r0 + rows])
                                    {
                                        for (lane, &sum) in lanes.iter_mut().zip(sums) {
                                            *lane = lane.wrapping_add(lo.wrapping_mul(sum));
                                        }
                                    }
                                }
                                store(narrow.as_flattened(), NR);
                            }
                        }
                    }
                }
            });
    }
}

/// A's m×k rows.
#[derive(Clone, Copy)]
pub enum RowsOfA<'a> {
    /// Codes minus their zero points, row-major, each within ±255.
    Shifted(&'a [i32]),
    /// Uint8 codes, row-major, and their one zero point.
    Codes { codes: &'a [u8], zero_point: i32 },
}

impl RowsOfA<'_> {
    fn len(&self) -> usize {
        match self {
            RowsOfA::Shifted(a) => a.len(),
            RowsOfA::Codes { codes, .. } => codes.len(),
        }
    }
}

/// Where a product's m×n values go, row-major.
pub enum ProductOut<'a> {
    /// The sums.
    Sums(&'a mut [i32]),
    /// Each sum converted to float32 (to nearest, as Cast) times its column's scale (one
    /// value for all, or one per column), as Cast then Mul compute it; a float16/bfloat16
    /// Mul's roundings (`rounding`) applied as each tile's row is stored.
    Scaled {
        out: &'a mut [f32],
        scale: &'a [f32],
        rounding: super::ScaledRounding,
    },
}

impl ProductOut<'_> {
    fn len(&self) -> usize {
        match self {
            ProductOut::Sums(c) => c.len(),
            ProductOut::Scaled { out, .. } => out.len(),
        }
    }
}

/// The output's values, shared by tasks that write disjoint columns.
enum OutPtr<'a> {
    Sums(*mut i32),
    Scaled(*mut f32, &'a [f32], super::ScaledRounding),
}
// SAFETY: each task writes only its own panels' columns (see `product_with`).
unsafe impl Send for OutPtr<'_> {}
unsafe impl Sync for OutPtr<'_> {}

/// Rows of a tile of sums scaled into the output: for r < rows, j < cols,
/// `y[r · y_stride + j] = (float)tile[r · stride + j] · scale` (`scale`: one value, or one per
/// column of the whole output, whose columns here start at `j0`), with a reduced-precision
/// Mul's roundings ([`scale_in_place`]).
///
/// # Safety
/// `y` points to rows × cols values (row r at `r · y_stride`) that nothing else reads or
/// writes meanwhile; `tile` holds `rows` rows of `stride` >= cols values.
unsafe fn scale_tile(
    y: *mut f32,
    y_stride: usize,
    (tile, stride): (&[i32], usize),
    [rows, cols]: [usize; 2],
    (scale, j0): (&[f32], usize),
    rounding: super::ScaledRounding,
) {
    assert!(
        tile.len() >= rows * stride && stride >= cols,
        "the tile's rows"
    );
    assert!(scale.len() == 1 || scale.len() >= j0 + cols, "the scales");
    if rounding != super::ScaledRounding::default() {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has the feature the function was compiled for; the caller
            // vouches for `y`.
            return unsafe {
                scale_tile_avx512(
                    y,
                    y_stride,
                    (tile, stride),
                    [rows, cols],
                    (scale, j0),
                    rounding,
                )
            };
        }
    }
    for (r, sums) in tile.chunks(stride).take(rows).enumerate() {
        // SAFETY: row r of the rows the caller vouches for.
        let y = unsafe { std::slice::from_raw_parts_mut(y.add(r * y_stride), cols) };
        let sums = &sums[..cols];
        if rounding != super::ScaledRounding::default() {
            for (y, &v) in y.iter_mut().zip(sums) {
                *y = v as f32;
            }
            scale_in_place(y, scale, j0, rounding);
            continue;
        }
        match scale {
            [s] => {
                for (y, &v) in y.iter_mut().zip(sums) {
                    *y = v as f32 * s;
                }
            }
            _ => {
                for ((y, &v), s) in y.iter_mut().zip(sums).zip(&scale[j0..]) {
                    *y = v as f32 * s;
                }
            }
        }
    }
}

/// [`scale_tile`] with a Mul's roundings, 16 values at a time in registers: the conversion,
/// the roundings and the product in one pass (as [`scale_in_place`]'s three passes over the
/// rows, the float16 run of the dynamically quantized Flan-T5 encoder spent 10 % more on its
/// scaled products than its float32 run), a tile (not a row) a call and each pair of
/// roundings its own loop (a call per row and a choice of rounding per vector were a third
/// of what the roundings cost). The same IEEE steps: `vcvtdq2ps` rounds to nearest even as
/// `as f32` does, and [`crate::numeric::f16_x16`] / [`crate::numeric::bf16_x16`] round as
/// `Rounding::round`.
///
/// # Safety
/// As [`scale_tile`]'s, and the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scale_tile_avx512(
    y: *mut f32,
    y_stride: usize,
    tile: (&[i32], usize),
    shape: [usize; 2],
    scale: (&[f32], usize),
    rounding: super::ScaledRounding,
) {
    use crate::numeric::grid::{self, BF16 as B, F16 as H, NONE as N};
    // SAFETY (each arm): as this function's.
    unsafe {
        match (grid::of(rounding.cast), grid::of(rounding.output)) {
            (N, N) => scaled_rows::<N, N>(y, y_stride, tile, shape, scale),
            (N, H) => scaled_rows::<N, H>(y, y_stride, tile, shape, scale),
            (N, _) => scaled_rows::<N, B>(y, y_stride, tile, shape, scale),
            (H, N) => scaled_rows::<H, N>(y, y_stride, tile, shape, scale),
            (H, H) => scaled_rows::<H, H>(y, y_stride, tile, shape, scale),
            (H, _) => scaled_rows::<H, B>(y, y_stride, tile, shape, scale),
            (_, N) => scaled_rows::<B, N>(y, y_stride, tile, shape, scale),
            (_, H) => scaled_rows::<B, H>(y, y_stride, tile, shape, scale),
            (_, _) => scaled_rows::<B, B>(y, y_stride, tile, shape, scale),
        }
    }
}

/// [`scale_tile_avx512`]'s loop for one pair of roundings (`CAST`, `OUTPUT`: each a
/// [`crate::numeric::grid`] constant), column block by column block (its scales loaded once), row by row.
///
/// # Safety
/// As [`scale_tile_avx512`]'s.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scaled_rows<const CAST: u8, const OUTPUT: u8>(
    y: *mut f32,
    y_stride: usize,
    (tile, stride): (&[i32], usize),
    [rows, cols]: [usize; 2],
    (scale, j0): (&[f32], usize),
) {
    use crate::numeric::{lanes16, rounded_x16 as rounded};
    use std::arch::x86_64::*;
    for at in (0..cols).step_by(16) {
        let mask = lanes16(at, cols);
        // SAFETY: the mask covers columns at..min(at + 16, cols) of each row of `tile`
        // (stride >= cols) and of `y` (the caller's), and per column `scale` from j0 (it holds
        // the whole output's columns: asserted by `scale_tile`); masked-off lanes are neither
        // read nor written.
        unsafe {
            let s = match scale {
                [s] => _mm512_set1_ps(*s),
                _ => _mm512_maskz_loadu_ps(mask, scale.as_ptr().add(j0 + at)),
            };
            for r in 0..rows {
                let sums = _mm512_maskz_loadu_epi32(mask, tile.as_ptr().add(r * stride + at));
                let product = _mm512_mul_ps(rounded::<CAST>(_mm512_cvtepi32_ps(sums)), s);
                _mm512_mask_storeu_ps(y.add(r * y_stride + at), mask, rounded::<OUTPUT>(product));
            }
        }
    }
}

/// What a Mul by `scale` (one value, or one per column of the whole output; `y` its columns
/// from `j0`) computes on the Cast's float32 values `y`, each step rounded where `rounding`
/// says: the Cast's value as the Mul reads it, then the product as the Mul's output.
pub(crate) fn scale_in_place(
    y: &mut [f32],
    scale: &[f32],
    j0: usize,
    rounding: super::ScaledRounding,
) {
    if let Some(r) = rounding.cast {
        r.round_slice(y);
    }
    match scale {
        [s] => y.iter_mut().for_each(|v| *v *= s),
        _ => y.iter_mut().zip(&scale[j0..]).for_each(|(v, s)| *v *= s),
    }
    if let Some(r) = rounding.output {
        r.round_slice(y);
    }
}

/// Uint8 codes' `rows` rows of k in groups of four, each group one i32 (the bytes in order,
/// zeros past k).
fn code_quads(codes: &[u8], rows: usize, k: usize) -> Vec<i32> {
    let quads = k.div_ceil(4);
    // Appended row by row (not zeroed first and overwritten).
    let mut out = Vec::with_capacity(rows * quads);
    for row in codes.chunks(k.max(1)).take(rows) {
        let full = row.chunks_exact(4);
        let tail = full.remainder();
        out.extend(full.map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])));
        if !tail.is_empty() {
            let mut word = [0u8; 4];
            word[..tail.len()].copy_from_slice(tail);
            out.push(i32::from_le_bytes(word));
        }
    }
    // Rows past the codes (none where `codes` holds rows·k values) as zeros.
    out.resize(rows * quads, 0);
    out
}

/// A's rows as i16 pairs, each pair one i32 (the lane a broadcast repeats).
fn pair_rows(a: &[i32], k: usize) -> Vec<i32> {
    let pairs = k.div_ceil(2);
    let mut out = vec![0i32; a.len() / k.max(1) * pairs];
    for (row, dst) in a.chunks(k.max(1)).zip(out.chunks_mut(pairs.max(1))) {
        for (q, d) in dst.iter_mut().enumerate() {
            let lo = row[2 * q] as i16 as u16 as u32;
            let hi = row.get(2 * q + 1).map_or(0, |&v| v as i16 as u16 as u32);
            *d = (lo | hi << 16) as i32;
        }
    }
    out
}

/// A's `rows` rows as unsigned bytes `u = a − lo` (lo the row's least value) in groups of
/// four, each group one i32, and each row's `lo`; None if a row spans more than 255.
fn quad_rows(a: &[i32], rows: usize, k: usize) -> Option<(Vec<i32>, Vec<i32>)> {
    let quads = k.div_ceil(4);
    let mut out = vec![0i32; rows * quads];
    let mut lows = vec![0i32; rows];
    for ((row, dst), low) in a
        .chunks(k.max(1))
        .zip(out.chunks_mut(quads.max(1)))
        .zip(lows.iter_mut())
    {
        let lo = row.iter().copied().min().unwrap_or(0);
        let hi = row.iter().copied().max().unwrap_or(0);
        if i64::from(hi) - i64::from(lo) > 255 {
            return None;
        }
        *low = lo;
        let byte = |v: i32, h: usize| ((v - lo) as u32) << (8 * h);
        let full = row.chunks_exact(4);
        let tail = full.remainder();
        for (d, c) in dst.iter_mut().zip(full) {
            *d = (byte(c[0], 0) | byte(c[1], 1) | byte(c[2], 2) | byte(c[3], 3)) as i32;
        }
        if !tail.is_empty() {
            let word = tail.iter().enumerate().fold(0, |w, (h, &v)| w | byte(v, h));
            dst[quads - 1] = word as i32;
        }
    }
    Some((out, lows))
}

/// The panels of [`PackedIntB`] in `T` (every code fits it), k in groups of `g`.
fn pack<T: Copy + Default + Send + TryFrom<i32>>(
    codes: &[i32],
    k: usize,
    n: usize,
    g: usize,
) -> Vec<T> {
    let groups = k.div_ceil(g);
    let panels = n.div_ceil(NR);
    let mut data = vec![T::default(); panels * groups * g * NR];
    data.par_chunks_mut((groups * g * NR).max(1))
        .enumerate()
        .for_each(|(p, panel)| {
            for q in 0..groups {
                for jj in 0..NR.min(n - p * NR) {
                    let j = p * NR + jj;
                    for h in 0..g {
                        let row = g * q + h;
                        if row < k {
                            panel[q * g * NR + g * jj + h] =
                                T::try_from(codes[row * n + j]).unwrap_or_default();
                        }
                    }
                }
            }
        });
    data
}

/// One panel's values, in either width.
#[derive(Clone, Copy)]
enum Panel<'a> {
    I8(&'a [i8]),
    I16(&'a [i16]),
}

impl Panel<'_> {
    fn get(&self, i: usize) -> i32 {
        match self {
            Panel::I8(v) => i32::from(v[i]),
            Panel::I16(v) => i32::from(v[i]),
        }
    }
}

/// Which kernel a product runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kernel {
    /// A read as it is (any panels).
    Portable,
    /// A's unsigned bytes by quad panels, as the VNNI kernels compute (where the CPU has
    /// none), offsets added after.
    PortableQuads,
    #[cfg(target_arch = "x86_64")]
    Avx2Pairs,
    #[cfg(target_arch = "x86_64")]
    AvxVnni,
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
}

/// The instruction set the integer products run with on this CPU (`ops::isa`'s report).
pub(crate) fn instruction_set() -> &'static str {
    let kernel = if has_vnni() {
        Kernel::best_quads()
    } else {
        Kernel::best_pairs()
    };
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512Vnni => "avx512-vnni",
        #[cfg(target_arch = "x86_64")]
        Kernel::AvxVnni => "avx-vnni",
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2Pairs => "avx2",
        _ => "portable",
    }
}

impl Kernel {
    fn best_pairs() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            return Kernel::Avx2Pairs;
        }
        Kernel::Portable
    }

    fn best_quads() -> Kernel {
        *Kernel::quad_kernels().last().expect("the portable one")
    }

    /// The kernels for quad panels this CPU runs, the fastest last.
    fn quad_kernels() -> Vec<Kernel> {
        let mut kernels = vec![Kernel::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avxvnni") {
                kernels.push(Kernel::AvxVnni);
            }
            if std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("avx512f")
            {
                kernels.push(Kernel::Avx512Vnni);
            }
        }
        kernels
    }

    /// The rows of A and the panels one call of the kernel computes.
    fn tile(self) -> (usize, usize) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni => (WIDE_ROWS, 2),
            _ => (MR, 1),
        }
    }
}

/// `rows` (≤ MR) rows of A (their groups at `a_groups`, `groups` apart) by one panel with
/// `kernel` (not [`Kernel::Portable`]): the 16 column sums of each row in `acc`.
fn panel_rows(
    kernel: Kernel,
    rows: usize,
    a_groups: &[i32],
    groups: usize,
    panel: Panel,
    acc: &mut [[i32; NR]; MR],
) {
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! by_rows {
            ($f:ident, $t:ty, $b:expr) => {
                // SAFETY: `kernel` was chosen for a CPU feature it has; the slices hold
                // `rows` rows of `groups` groups and `groups` panel steps (asserted in the
                // kernel).
                unsafe {
                    match rows {
                        1 => $f::<1, $t>(a_groups, groups, $b, acc),
                        2 => $f::<2, $t>(a_groups, groups, $b, acc),
                        3 => $f::<3, $t>(a_groups, groups, $b, acc),
                        _ => $f::<4, $t>(a_groups, groups, $b, acc),
                    }
                }
            };
        }
        match (kernel, panel) {
            (Kernel::Avx2Pairs, Panel::I8(b)) => by_rows!(pairs_avx2, i8, b),
            (Kernel::Avx2Pairs, Panel::I16(b)) => by_rows!(pairs_avx2, i16, b),
            (Kernel::AvxVnni, Panel::I8(b)) => by_rows!(quads_avx_vnni, i8, b),
            _ => unreachable!("no kernel reads these panels"),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (kernel, rows, a_groups, groups, panel, acc);
        unreachable!("only the portable kernel runs here");
    }
}

/// Any panel by `rows` rows of A read as they are (`a`, rows `k` apart): the sums the
/// kernels compute, in the portable way.
fn panel_rows_portable(
    rows: usize,
    a: &[i32],
    k: usize,
    g: usize,
    panel: Panel,
    acc: &mut [[i32; NR]; MR],
) {
    for (r, lanes) in acc.iter_mut().enumerate().take(rows) {
        for p in 0..k {
            let (q, h) = (p / g, p % g);
            let x = a[r * k + p];
            for (j, lane) in lanes.iter_mut().enumerate() {
                let y = panel.get(q * g * NR + g * j + h);
                *lane = lane.wrapping_add(x.wrapping_mul(y));
            }
        }
    }
}

/// What the VNNI kernels compute, in portable code: `rows` rows of A's unsigned-byte quads
/// by a quad panel.
fn quads_portable(
    rows: usize,
    a_quads: &[i32],
    quads: usize,
    panel: Panel,
    acc: &mut [[i32; NR]; MR],
) {
    for (r, lanes) in acc.iter_mut().enumerate().take(rows) {
        for q in 0..quads {
            let word = a_quads[r * quads + q] as u32;
            for (j, lane) in lanes.iter_mut().enumerate() {
                let four: i32 = (0..4)
                    .map(|h| ((word >> (8 * h)) & 0xff) as i32 * panel.get(q * 4 * NR + 4 * j + h))
                    .sum();
                *lane = lane.wrapping_add(four);
            }
        }
    }
}

/// A panel value type the AVX2 pair kernel widens to 16 bits as it loads.
#[cfg(target_arch = "x86_64")]
trait Widen: Copy {
    /// Sixteen values from `p` as 16 i16 lanes.
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m256i;
}

#[cfg(target_arch = "x86_64")]
impl Widen for i8 {
    #[inline(always)]
    unsafe fn load16(p: *const i8) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        _mm256_cvtepi8_epi16(_mm_loadu_si128(p as *const __m128i))
    }
}

#[cfg(target_arch = "x86_64")]
impl Widen for i16 {
    #[inline(always)]
    unsafe fn load16(p: *const i16) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        _mm256_loadu_si256(p as *const __m256i)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn pairs_avx2<const R: usize, T: Widen>(
    a_pairs: &[i32],
    pairs: usize,
    panel: &[T],
    acc: &mut [[i32; NR]; MR],
) {
    use std::arch::x86_64::*;
    assert!(a_pairs.len() >= R * pairs && panel.len() >= pairs * 2 * NR);
    let mut sums = [[_mm256_setzero_si256(); 2]; R];
    let b = panel.as_ptr();
    for q in 0..pairs {
        // SAFETY: q < pairs, so both loads lie inside the panel (asserted above).
        let b0 = T::load16(b.add(q * 2 * NR));
        let b1 = T::load16(b.add(q * 2 * NR + NR));
        for (r, s) in sums.iter_mut().enumerate() {
            let a = _mm256_set1_epi32(*a_pairs.get_unchecked(r * pairs + q));
            s[0] = _mm256_add_epi32(s[0], _mm256_madd_epi16(a, b0));
            s[1] = _mm256_add_epi32(s[1], _mm256_madd_epi16(a, b1));
        }
    }
    for (r, s) in sums.iter().enumerate() {
        _mm256_storeu_si256(acc[r].as_mut_ptr() as *mut __m256i, s[0]);
        _mm256_storeu_si256(acc[r].as_mut_ptr().add(8) as *mut __m256i, s[1]);
    }
}

/// The quad kernel's body: `$dot(acc, a, b)` is the CPU's 256-bit `vpdpbusd`.
#[cfg(target_arch = "x86_64")]
macro_rules! quads_body {
    ($dot:path, $a_quads:ident, $quads:ident, $panel:ident, $acc:ident, $r:ident) => {{
        use std::arch::x86_64::*;
        assert!($a_quads.len() >= $r * $quads && $panel.len() >= $quads * 4 * NR);
        let mut sums = [[_mm256_setzero_si256(); 2]; $r];
        let b = $panel.as_ptr();
        for q in 0..$quads {
            // SAFETY: q < quads, so both loads lie inside the panel (asserted above).
            let b0 = _mm256_loadu_si256(b.add(q * 4 * NR) as *const __m256i);
            let b1 = _mm256_loadu_si256(b.add(q * 4 * NR + 2 * NR) as *const __m256i);
            for (r, s) in sums.iter_mut().enumerate() {
                let a = _mm256_set1_epi32(*$a_quads.get_unchecked(r * $quads + q));
                s[0] = $dot(s[0], a, b0);
                s[1] = $dot(s[1], a, b1);
            }
        }
        for (r, s) in sums.iter().enumerate() {
            _mm256_storeu_si256($acc[r].as_mut_ptr() as *mut __m256i, s[0]);
            _mm256_storeu_si256($acc[r].as_mut_ptr().add(8) as *mut __m256i, s[1]);
        }
    }};
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn quads_avx_vnni<const R: usize, T>(
    a_quads: &[i32],
    quads: usize,
    panel: &[T],
    acc: &mut [[i32; NR]; MR],
) {
    quads_body!(_mm256_dpbusd_avx_epi32, a_quads, quads, panel, acc, R)
}

/// `rows` (≤ WIDE_ROWS) rows of A's unsigned-byte quads by `np` (1 or 2) consecutive quad
/// panels `b` with the 512-bit `vpdpbusd`: the 16·np column sums of each row in `acc`, each
/// row's sums started at `lo · column sum` where `start` gives the rows' `lo` and the panels'
/// column sums.
#[cfg(target_arch = "x86_64")]
fn wide_tile(
    rows: usize,
    np: usize,
    a_quads: &[i32],
    quads: usize,
    b: &[i8],
    start: Option<(&[i32], &[i32])>,
    acc: &mut [[i32; WIDE_COLUMNS]; WIDE_ROWS],
) {
    macro_rules! by_rows {
        ($p:literal) => {
            // SAFETY: chosen only where the CPU has AVX512F and AVX512-VNNI
            // (`Kernel::quad_kernels`); the slices' lengths are asserted in the kernel.
            unsafe {
                match rows {
                    1 => quads_avx512::<1, $p>(a_quads, quads, b, start, acc),
                    2 => quads_avx512::<2, $p>(a_quads, quads, b, start, acc),
                    3 => quads_avx512::<3, $p>(a_quads, quads, b, start, acc),
                    4 => quads_avx512::<4, $p>(a_quads, quads, b, start, acc),
                    5 => quads_avx512::<5, $p>(a_quads, quads, b, start, acc),
                    6 => quads_avx512::<6, $p>(a_quads, quads, b, start, acc),
                    7 => quads_avx512::<7, $p>(a_quads, quads, b, start, acc),
                    _ => quads_avx512::<8, $p>(a_quads, quads, b, start, acc),
                }
            }
        };
    }
    if np == 1 {
        by_rows!(1)
    } else {
        by_rows!(2)
    }
}

/// `R` rows by `P` panels (each 16 columns of quads, one 512-bit register per group of four
/// rows of B), `vpdpbusd` per row and panel.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn quads_avx512<const R: usize, const P: usize>(
    a_quads: &[i32],
    quads: usize,
    b: &[i8],
    start: Option<(&[i32], &[i32])>,
    acc: &mut [[i32; WIDE_COLUMNS]; WIDE_ROWS],
) {
    use std::arch::x86_64::*;
    let panel_len = quads * 4 * NR;
    assert!(R <= WIDE_ROWS && P * NR <= WIDE_COLUMNS);
    assert!(a_quads.len() >= R * quads && b.len() >= P * panel_len);
    let mut sums = [[_mm512_setzero_si512(); P]; R];
    if let Some((lows, column_sums)) = start {
        assert!(lows.len() >= R && column_sums.len() >= P * NR);
        for (s, &lo) in sums.iter_mut().zip(lows) {
            for (pi, sum) in s.iter_mut().enumerate() {
                // SAFETY: pi < P, inside the P·16 column sums (asserted above).
                let column =
                    _mm512_loadu_si512(column_sums.as_ptr().add(pi * NR) as *const __m512i);
                // The low 32 bits of the product: `wrapping_mul`.
                *sum = _mm512_mullo_epi32(_mm512_set1_epi32(lo), column);
            }
        }
    }
    let b = b.as_ptr();
    for q in 0..quads {
        let mut panel = [_mm512_setzero_si512(); P];
        for pi in 0..P {
            // A hint PREFETCH_QUADS groups ahead (past a panel's end: the next panel's start,
            // or beyond the weight, where it is dropped).
            let ahead = b.wrapping_add(pi * panel_len + (q + PREFETCH_QUADS) * 4 * NR);
            _mm_prefetch::<_MM_HINT_T0>(ahead);
        }
        for (pi, v) in panel.iter_mut().enumerate() {
            // SAFETY: q < quads and pi < P: inside the P panels (asserted above).
            *v = _mm512_loadu_si512(b.add(pi * panel_len + q * 4 * NR) as *const __m512i);
        }
        for (r, s) in sums.iter_mut().enumerate() {
            let a = _mm512_set1_epi32(*a_quads.get_unchecked(r * quads + q));
            for (sum, &bv) in s.iter_mut().zip(&panel) {
                *sum = _mm512_dpbusd_epi32(*sum, a, bv);
            }
        }
    }
    for (r, s) in sums.iter().enumerate() {
        for (pi, sum) in s.iter().enumerate() {
            _mm512_storeu_si512(acc[r].as_mut_ptr().add(pi * NR) as *mut __m512i, *sum);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numeric::Rounding;
    use crate::ops::integer::tests::codes;

    /// Every path equals the i64 sum wrapped to i32: pairs of bytes and of 16-bit values,
    /// quads (the VNNI kernel where the CPU has it, the portable code elsewhere), odd k, n
    /// not a multiple of 16, row counts around MR and WIDE_ROWS, odd panel counts, extreme codes (±255, whose sums of 40,000
    /// products wrap), rows of A spanning more than 255 (no bytes: the portable code), one
    /// and two threads; A's rows as shifted codes and as uint8 codes with a zero point; the
    /// sums, and the sums as float32 times one scale or one per column.
    #[test]
    fn packed_integer_product_equals_the_wrapped_exact_sum() {
        for (i, &(m, k, n, (alo, ahi), (blo, bhi))) in [
            (1, 1, 1, (-255, 255), (-128, 127)),
            (3, 0, 5, (0, 0), (0, 0)),
            (3, 7, 17, (-255, 0), (-255, 255)),
            (4, 64, 16, (-128, 127), (-128, 127)),
            (5, 33, 40, (0, 255), (0, 255)),
            (9, 129, 100, (-120, 135), (-128, 127)),
            (6, 1030, 33, (-255, 0), (-128, 127)),
            (16, 512, 96, (0, 255), (-128, 127)),
            (17, 61, 48, (-30, 200), (-128, 127)),
            (8, 4, 32, (0, 255), (-128, 127)),
            (13, 300, 80, (-255, 0), (-128, 127)),
            (2, 40_000, 3, (255, 255), (-128, 127)),
            (2, 40_000, 3, (-255, 255), (-255, 255)),
        ]
        .iter()
        .enumerate()
        {
            let a = codes(m * k, 3 + i as u64, alo, ahi);
            let b = codes(k * n, 5 + i as u64, blo, bhi);
            let want: Vec<i32> = (0..m * n)
                .map(|o| {
                    let (r, j) = (o / n, o % n);
                    (0..k)
                        .map(|p| i64::from(a[r * k + p]) * i64::from(b[p * n + j]))
                        .sum::<i64>() as i32
                })
                .collect();
            for quads in [false, true] {
                let packed = PackedIntB::with_groups(&b, k, n, quads);
                let bytes = b.iter().all(|v| (-128..=127).contains(v));
                assert_eq!(
                    matches!(packed.data, Panels::Quads { .. }),
                    quads && bytes,
                    "case {i}"
                );
                let kernels = match packed.data {
                    Panels::Quads { .. } => Kernel::quad_kernels(),
                    _ => vec![Kernel::Portable, Kernel::best_pairs()],
                };
                // A's rows also as uint8 codes and a zero point, where they span at most 255.
                let zero_point = (-alo).max(0);
                let a_codes: Option<Vec<u8>> = a
                    .iter()
                    .map(|&v| u8::try_from(v + zero_point).ok())
                    .collect();
                let column_scales: Vec<f32> = (0..n).map(|j| 1e-3 * (j as f32 + 0.7)).collect();
                // Infinite and NaN scales: inf · 0 and NaN propagate as IEEE says.
                let odd_scales: Vec<f32> = (0..n)
                    .map(|j| match j % 5 {
                        0 => f32::INFINITY,
                        1 => f32::NAN,
                        _ => 3e4 * (j as f32 + 0.7),
                    })
                    .collect();
                for (kernel, threads) in kernels.into_iter().flat_map(|k| [(k, 1), (k, 2)]) {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    let tile = kernel.tile();
                    let what = format!("case {i}, quads {quads}, tile {tile:?}, {threads} threads");
                    let mut rows = vec![RowsOfA::Shifted(&a)];
                    if let Some(codes) = &a_codes {
                        rows.push(RowsOfA::Codes { codes, zero_point });
                    }
                    for a in rows {
                        let mut c = vec![7i32; m * n];
                        pool.install(|| {
                            packed.product_with(kernel, m, a, ProductOut::Sums(&mut c))
                        });
                        assert_eq!(c, want, "{what}");
                        // Scaled: what Cast to float32 then Mul by the scale give, the Mul
                        // in float32 or rounding what it reads and writes: every pair of
                        // none, float16 and bfloat16 (each its own loop in the AVX-512 store).
                        let grids = [None, Some(Rounding::F16), Some(Rounding::BF16)];
                        let roundings = grids.into_iter().flat_map(|cast| {
                            grids.map(|output| crate::ops::ScaledRounding { cast, output })
                        });
                        for (scale, rounding) in [&[0.37f32][..], &column_scales, &odd_scales]
                            .into_iter()
                            .flat_map(|s| roundings.clone().map(move |r| (s, r)))
                        {
                            let mut y = vec![f32::NAN; m * n];
                            let out = ProductOut::Scaled {
                                out: &mut y,
                                scale,
                                rounding,
                            };
                            pool.install(|| packed.product_with(kernel, m, a, out));
                            let round = |r: Option<Rounding>, v: f32| r.map_or(v, |r| r.round(v));
                            let expected = want.iter().enumerate().map(|(o, &v)| {
                                let read = round(rounding.cast, v as f32);
                                let product = read * scale[(o % n) % scale.len()];
                                round(rounding.output, product).to_bits()
                            });
                            assert!(
                                y.iter().map(|v| v.to_bits()).eq(expected),
                                "{what}, {} scales, {rounding:?}",
                                scale.len()
                            );
                        }
                    }
                }
                let rows = m.min(MR);
                let mut portable = [[0i32; NR]; MR];
                panel_rows_portable(rows, &a, k, packed.group(), packed.panel(0), &mut portable);
                for r in 0..rows {
                    for j in 0..NR.min(n) {
                        assert_eq!(portable[r][j], want[r * n + j], "case {i}, portable");
                    }
                }
            }
        }
    }
}
