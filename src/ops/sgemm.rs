//! The f32 matrix product every float kernel runs on (MatMul, Gemm, Conv, the recurrent and
//! attention ops): `C (+)= A·B` over packed panels and a 6×16 register tile, AVX2 + FMA where
//! the CPU has them, a scalar loop of fused multiply-adds elsewhere; both the plain and the
//! gathered product (convolutions) take two full panels at once in a 6×32 AVX-512 tile where
//! the CPU has AVX-512F. A B packed whole once ([`PackedB`]: a convolution's or a MatMul's
//! weights) is read where its panels lie.
//!
//! **Every output element is one chain of fused multiply-adds over k in order**, starting from
//! +0 (or from C's value when accumulating): `c = fma(a[k-1], b[k-1], … fma(a[0], b[0], 0))`.
//! Tiling, k blocking (a partial sum stored to C and loaded again is exact), the panel a
//! column falls in and the thread that computes it change nothing, so the result is the same
//! bits for any thread count, on every code path and every machine (docs/numerics.md,
//! "Summation order"). The B operand comes through [`PackB`], so a convolution packs its
//! panels straight from the image (no im2col buffer).

use rayon::prelude::*;

/// Rows of the register tile (A panel height).
pub const MR: usize = 6;
/// Columns of the register tile (B panel width): two 8-lane vectors.
pub const NR: usize = 16;
/// Depth of one k block: a 16-column B panel of KC rows (16 KiB) stays in L1.
const KC: usize = 256;
/// The gathered product's k block on Intel's AVX-512 cores ([`Kernel::l1_blocks`]) where k
/// exceeds KC: 128 rows of four panels are 32 KiB, in L1 (48 KiB on Golden Cove) beside A's
/// rows.
const FULL_WIDTH_KC: usize = 128;
/// A panels up to which a B in rows is read in place rather than packed: packing pays only
/// when enough A panels reuse the packed copy (measured with examples of Conv and MatMul
/// shapes: in place is faster for m <= 64, packed for m >= 128).
pub const DIRECT_B_PANELS: usize = 12;
/// Rows of A up to which a B in rows is read in place: `DIRECT_B_PANELS` panels of `MR` rows.
pub const FEW_ROWS: usize = DIRECT_B_PANELS * MR;
/// Work (m·n·k) above which a product is split over threads.
const PARALLEL_WORK: usize = 1 << 18;

/// Where B's panels come from: a strided matrix ([`StridedB`]) or a convolution's image.
pub trait PackB: Sync {
    /// Writes rows `p0..p0 + kc` of B's columns `j0..j0 + NR` into `dst` (`kc × NR`, row p at
    /// `dst[(p - p0)·NR..]`), zeros in the columns at or past n.
    fn pack(&self, j0: usize, p0: usize, kc: usize, dst: &mut [f32]);

    /// B as rows in memory (element (p, j) at `data[p·stride + j]`), when it is: a product
    /// with a single A panel reads such a B in place instead of packing it.
    fn rows(&self) -> Option<(&[f32], usize)> {
        None
    }

    /// B already packed whole ([`PackedB`], a constant weight packed once): its panels are
    /// read where they lie.
    fn packed(&self) -> Option<&PackedB> {
        None
    }

    /// B as rows in memory whose values are read rounded ([`RoundedB`]): a product of one row
    /// rounds each row's piece as it streams it instead of packing B.
    fn rounded_rows(&self) -> Option<(&[f32], usize, crate::numeric::Rounding)> {
        None
    }

    /// B packed whole and read rounded ([`RoundedPackedB`]): where the kernel rounds as it
    /// loads, its panels are read where they lie.
    fn rounded_packed(&self) -> Option<(&PackedB, crate::numeric::Rounding)> {
        None
    }
}

/// B as a strided matrix: element (p, j) at `data[p·rs + j·cs]`.
pub struct StridedB<'a> {
    pub data: &'a [f32],
    pub n: usize,
    pub rs: usize,
    pub cs: usize,
}

impl PackB for StridedB<'_> {
    fn rows(&self) -> Option<(&[f32], usize)> {
        (self.cs == 1).then_some((self.data, self.rs))
    }

    fn pack(&self, j0: usize, p0: usize, kc: usize, dst: &mut [f32]) {
        let cols = NR.min(self.n - j0);
        if self.cs == 1 && cols == NR {
            for (p, d) in (p0..p0 + kc).zip(dst.chunks_exact_mut(NR)) {
                copy_panel_row(d, &self.data[p * self.rs + j0..]);
            }
        } else if self.cs == 1 {
            for (p, d) in (p0..p0 + kc).zip(dst.chunks_exact_mut(NR)) {
                let s = p * self.rs + j0;
                d[..cols].copy_from_slice(&self.data[s..s + cols]);
                d[cols..].fill(0.0);
            }
        } else {
            // Column by column: each column's k run is contiguous when B is transposed.
            for j in 0..NR {
                if j < cols {
                    let base = (j0 + j) * self.cs;
                    for (p, d) in (p0..p0 + kc).zip(dst.chunks_exact_mut(NR)) {
                        d[j] = self.data[base + p * self.rs];
                    }
                } else {
                    dst.chunks_exact_mut(NR).for_each(|d| d[j] = 0.0);
                }
            }
        }
    }
}

/// B as stored, rounded to float16 or bfloat16 as its panels are packed: a float16/bfloat16
/// layer's constant weight read without a rounded copy of it. Never read in place (the
/// values in memory are not the rounded ones), so every product packs it.
pub struct RoundedB<'a> {
    pub b: StridedB<'a>,
    pub rounding: crate::numeric::Rounding,
}

impl PackB for RoundedB<'_> {
    fn pack(&self, j0: usize, p0: usize, kc: usize, dst: &mut [f32]) {
        self.b.pack(j0, p0, kc, dst);
        // Rounding is elementwise (the zeros past n stay zeros): the panel holds exactly the
        // values a rounded copy of B would give it.
        self.rounding.round_slice(&mut dst[..kc * NR]);
    }

    fn rounded_rows(&self) -> Option<(&[f32], usize, crate::numeric::Rounding)> {
        self.b.rows().map(|(data, rs)| (data, rs, self.rounding))
    }
}

/// B packed whole ([`PackedB`], as stored) and read rounded to float16 or bfloat16: a float16
/// layer's weight read from the panels a float32 plan of the same weight keeps, so the run
/// holds one packed form of it. Where the kernel rounds as it loads (float16, F16C) the panels
/// are read where they lie; otherwise each product packs its panels from them, rounded.
pub struct RoundedPackedB<'a> {
    pub packed: &'a PackedB,
    pub rounding: crate::numeric::Rounding,
}

impl PackB for RoundedPackedB<'_> {
    fn pack(&self, j0: usize, p0: usize, kc: usize, dst: &mut [f32]) {
        self.packed.pack(j0, p0, kc, dst);
        self.rounding.round_slice(&mut dst[..kc * NR]);
    }

    fn rounded_packed(&self) -> Option<(&PackedB, crate::numeric::Rounding)> {
        Some((self.packed, self.rounding))
    }
}

/// Copies NR values of `src` into a panel row `dst` (NR long): a fixed-size copy the compiler
/// inlines (two vector moves), where a slice copy of a run-time length calls memmove.
#[inline(always)]
pub(crate) fn copy_panel_row(dst: &mut [f32], src: &[f32]) {
    let dst: &mut [f32; NR] = dst.try_into().expect("a panel row is NR long");
    let src: &[f32; NR] = src[..NR].try_into().expect("NR values");
    *dst = *src;
}

/// `C[m×n] (+)= A·B`, C row-major with row stride `ldc`, A element (i, p) at
/// `a[i·a_rs + p·a_cs]`. `accumulate` false overwrites C.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &dyn PackB,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    gemm_threads(m, n, k, a, a_rs, a_cs, b, c, ldc, accumulate, true)
}

/// [`gemm`], split over the pool's threads only where `may_split` (false: on the calling
/// thread, for the products of a batch that runs its products in parallel — attention's
/// per-head Q·Kᵀ and softmax·V —, where splitting each small product again costs more than it
/// gains). The same bits either way.
#[allow(clippy::too_many_arguments)]
pub fn gemm_threads(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &dyn PackB,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    may_split: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(c.len() >= (m - 1) * ldc + n && ldc >= n);
    if k == 0 {
        if !accumulate {
            c.chunks_mut(ldc).take(m).for_each(|r| r[..n].fill(0.0));
        }
        return;
    }
    assert!(a.len() > (m - 1) * a_rs + (k - 1) * a_cs);
    let m_panels = m.div_ceil(MR);
    let n_panels = n.div_ceil(NR);
    // A is read where it lies, never packed: its MR rows stream through the cache as the
    // tile broadcasts them (either of its strides 1 in every caller). Packing it, as before
    // 2026-11-27, cost 10-23 % of the bench transformer's products on two threads
    // (128×256×1024: 170 -> 137 us) and was never faster on the shapes measured.
    let threads = rayon::current_num_threads();
    let parallel = may_split && threads > 1 && m * n * k >= PARALLEL_WORK;
    // Tasks: blocks of B panels (about 128 KiB of packed B each, L2-resident while every A
    // panel passes over them), split over A's rows too when there are too few for the threads.
    // A B in rows larger than L2 (a weight, read from memory once per product) by a product of
    // a few A panels is packed a band at a time, each B row's piece of the band read in order
    // (see `pack_rows_block`); smaller ones, likely in cache already, are read in place.
    let streamed = match (
        b.packed(),
        b.rows().or(b.rounded_rows().map(|(d, rs, _)| (d, rs))),
    ) {
        (None, Some((_, rs))) => {
            m_panels > 1
                && m_panels <= DIRECT_B_PANELS
                && k * n >= STREAMED_B_VALUES
                && rs >= STREAMED_ROW_VALUES
        }
        _ => false,
    };
    let nb = if streamed {
        (STREAMED_BLOCK_VALUES / (k.min(KC) * NR)).clamp(1, n_panels)
    } else {
        (32 * 1024 / (k.min(KC * 4) * NR)).clamp(1, n_panels)
    };
    // Where the AVX-512 tiles take B panels in pairs, blocks of an even number of panels: an
    // odd block leaves its last panel to the 16-column AVX2 tile, at half the width.
    let kernel = Kernel::detect();
    let nb = match kernel.has_avx512() && nb % 2 == 1 {
        true => (nb + 1).min(n_panels),
        false => nb,
    };
    let n_blocks = n_panels.div_ceil(nb);
    let m_split = if parallel {
        (2 * threads).div_ceil(n_blocks).clamp(1, m_panels)
    } else {
        1
    };
    let mb = m_panels.div_ceil(m_split);
    let tasks = n_blocks * m_panels.div_ceil(mb);
    let c_ptr = super::util::DisjointPtr(c.as_mut_ptr());
    // Panels read where they lie: B packed whole, or packed whole and read rounded by a
    // kernel that rounds as it loads.
    let (whole, kernel) = match (b.packed(), b.rounded_packed()) {
        (Some(pb), _) => (Some(pb), kernel),
        (None, Some((pb, rounding))) => match kernel.rounding_b(rounding) {
            Some(rounding_kernel) => (Some(pb), rounding_kernel),
            None => (None, kernel),
        },
        _ => (None, kernel),
    };
    if let Some(pb) = whole {
        assert!(
            pb.k == k && pb.n == n,
            "B is packed as {}×{}, not {k}×{n}",
            pb.k,
            pb.n
        );
    }
    // Few A panels: a B in rows is read where it lies (see DIRECT_B_PANELS); so is a B read
    // rounded where the kernel rounds as it loads (more than one row: one row streams by
    // bands below).
    let in_place = match (b.rows(), b.rounded_rows()) {
        (Some((data, rs)), _) => Some((data, rs, kernel)),
        (None, Some((data, rs, rounding))) if m > 1 => kernel
            .rounding_b(rounding)
            .map(|rounding_kernel| (data, rs, rounding_kernel)),
        _ => None,
    };
    let (direct, kernel) = match in_place {
        Some((data, rs, tile_kernel)) if m_panels <= DIRECT_B_PANELS && !streamed => {
            assert!(data.len() >= (k - 1) * rs + n);
            (Some((data, rs)), tile_kernel)
        }
        _ => (None, kernel),
    };
    // The rounding kernels too: the AVX-512 tiles round B as they load it, as the AVX2 tile.
    let wide = kernel.has_avx512();
    // One row by panels (a decode step's weight), on every CPU: each thread streams one run of
    // adjacent panels, as ONNX Runtime splits a product statically, which the memory system
    // reads at its full rate; the tiles' small blocks of panels, one rayon task each, do not
    // (docs/performance-history.md, 2026-11-30).
    if let (1, Some(pb)) = (m, whole) {
        let threads = if parallel { threads } else { 1 };
        gemv_panels(kernel, pb, a, a_cs, &mut c[..n], accumulate, threads);
        return;
    }
    if m == 1 && whole.is_none() {
        let rows = match (direct, b.rounded_rows()) {
            (Some((data, rs)), _) => Some((data, rs, None)),
            (None, Some((data, rs, rounding))) => Some((data, rs, Some(rounding))),
            (None, None) => None,
        };
        if let Some((data, rs, rounding)) = rows {
            let threads = if parallel { threads } else { 1 };
            let b = BandRows { data, rs, rounding };
            gemv_rows(kernel, n, k, a, a_cs, &b, &mut c[..n], accumulate, threads);
            return;
        }
    }
    // B streamed from memory (read in place, or packed whole and read by a few A panels: a
    // prefill's weight) is prefetched ahead of the tile; B packed here is in cache. Measured
    // with `examples/skinny_gemm.rs` (16 rows by packed cold weights, Zen 3): 10-30 % faster.
    let prefetch = direct.is_some() || (whole.is_some() && m_panels <= DIRECT_B_PANELS);
    let run = |(b_pack, kept): &mut (Vec<f32>, Vec<f32>), t: usize| {
        let (jb, ib) = (t % n_blocks, t / n_blocks);
        let (jp0, jp1) = (jb * nb, ((jb + 1) * nb).min(n_panels));
        let (ip0, ip1) = (ib * mb, ((ib + 1) * mb).min(m_panels));
        for p0 in (0..k).step_by(KC) {
            let kc = KC.min(k - p0);
            if direct.is_none() && whole.is_none() {
                b_pack.resize((jp1 - jp0) * kc * NR, 0.0);
                match (streamed, b.rows(), b.rounded_rows()) {
                    (true, Some((data, rs)), _) => {
                        pack_rows_block(data, rs, n, jp0..jp1, p0, kc, b_pack)
                    }
                    (true, None, Some((data, rs, rounding))) => {
                        pack_rows_block(data, rs, n, jp0..jp1, p0, kc, b_pack);
                        rounding.round_slice(b_pack);
                    }
                    _ => {
                        for (jp, dst) in (jp0..jp1).zip(b_pack.chunks_exact_mut(kc * NR)) {
                            b.pack(jp * NR, p0, kc, dst);
                        }
                    }
                }
            }
            let mut jp = jp0;
            while jp < jp1 {
                let (j0, cols) = (jp * NR, NR.min(n - jp * NR));
                // Several full panels at once where the CPU has AVX-512: eight for a product
                // of one row (1×128), else two (the 6×32 tile).
                let group = if !wide {
                    1
                } else if m == 1 && jp + 8 <= jp1 && (jp + 8) * NR <= n {
                    8
                } else if jp + 1 < jp1 && (jp + 2) * NR <= n {
                    2
                } else {
                    1
                };
                let (bp, b_stride): (*const f32, usize) = match (whole, direct) {
                    (Some(pb), _) => (pb.data[(jp * k + p0) * NR..].as_ptr(), NR),
                    (None, Some((data, rs))) if cols == NR => (data[p0 * rs + j0..].as_ptr(), rs),
                    (None, Some(_)) => {
                        b_pack.resize(kc * NR, 0.0);
                        b.pack(j0, p0, kc, b_pack);
                        (b_pack.as_ptr(), NR)
                    }
                    (None, None) => (b_pack[(jp - jp0) * kc * NR..].as_ptr(), NR),
                };
                // From one panel to the next: the next NR columns of B's rows, or the next
                // packed panel (of all k rows when B is packed whole, of this k block
                // otherwise).
                let panel_step = match (whole, direct) {
                    (Some(_), _) => k * NR,
                    (None, Some(_)) => NR,
                    (None, None) => kc * NR,
                };
                // A kernel that rounds B as it loads it, by two panels over more than one row
                // tile: the first tile keeps the values it rounded, the others read them.
                let keep = kernel.rounds() != AS_STORED && group == 2 && ip1 - ip0 > 1;
                let mut ip = ip0;
                while ip < ip1 {
                    let (i0, rows) = (ip * MR, MR.min(m - ip * MR));
                    // Two full A panels at once by a pair of panels (the 12×32 tile, ONNX
                    // Runtime's AVX-512 shape) in a product of a few A panels (a prefill),
                    // where B comes from memory: each B value loaded once per 12 rows, not
                    // per 6. With many A panels (B packed per call, in cache) 6×32 stays.
                    let double = group == 2
                        && m_panels <= DIRECT_B_PANELS
                        && ip + 1 < ip1
                        && (ip + 2) * MR <= m;
                    let first = ip == ip0;
                    ip += 1 + double as usize;
                    // The first tile keeps where another follows (a full one: only the
                    // last row tile may be short).
                    let keeping = keep && first && ip < ip1;
                    let from_kept = keep && !first;
                    if keeping {
                        kept.resize(2 * kc * NR, 0.0);
                    }
                    let ap = StridedA {
                        data: a[i0 * a_rs + p0 * a_cs..].as_ptr(),
                        rs: a_rs,
                        cs: a_cs,
                    };
                    // SAFETY: `ap` reaches rows i0..i0 + rows (i0 + 2·MR where `double`: both
                    // panels full, inside A) of columns p0..p0 + kc of A,
                    // inside A as asserted above; `bp` holds kc rows of NR values at stride
                    // `b_stride` (a packed panel, or B's own rows with j0 + NR <= n, asserted
                    // above), and so does each of the group's next panels, `panel_step` apart
                    // (a group of 2 or 8 only where (jp + group)·NR <= n and jp + group <= jp1);
                    // tasks write disjoint tiles of C (their own rows i0.. and columns j0..),
                    // each inside C's bounds asserted above. `kept` (this task's own) holds
                    // 2·kc·NR values (resized above), written by the keeping tile before the
                    // tiles that read it.
                    unsafe {
                        let c_tile = c_ptr.get().add(i0 * ldc + j0);
                        let load = accumulate || p0 > 0;
                        #[cfg(target_arch = "x86_64")]
                        if keeping {
                            let tile = match double {
                                true => {
                                    avx512_keeping_tile::<{ 2 * MR }>(prefetch, kernel.rounds())
                                }
                                false => avx512_keeping_tile::<MR>(prefetch, kernel.rounds()),
                            };
                            let out = kept.as_mut_ptr();
                            tile(kc, ap, bp, panel_step, b_stride, c_tile, ldc, load, out);
                            continue;
                        }
                        #[cfg(target_arch = "x86_64")]
                        if from_kept {
                            let tile = match double {
                                true => avx512_panels_tile::<{ 2 * MR }, 2>(false, AS_STORED),
                                false => avx512_pair_tile(rows, false, AS_STORED),
                            };
                            tile(
                                kc,
                                ap,
                                kept.as_ptr(),
                                NR,
                                2 * NR,
                                c_tile,
                                ldc,
                                load,
                                std::ptr::null_mut(),
                            );
                            continue;
                        }
                        #[cfg(target_arch = "x86_64")]
                        let tile: Option<PanelTile> = if group == 8 {
                            Some(avx512_panels_tile::<1, 8>(prefetch, kernel.rounds()))
                        } else if double {
                            Some(avx512_panels_tile::<12, 2>(prefetch, kernel.rounds()))
                        } else if group == 2 {
                            Some(avx512_pair_tile(rows, prefetch, kernel.rounds()))
                        } else {
                            None
                        };
                        #[cfg(target_arch = "x86_64")]
                        if let Some(f) = tile {
                            f(
                                kc,
                                ap,
                                bp,
                                panel_step,
                                b_stride,
                                c_tile,
                                ldc,
                                load,
                                std::ptr::null_mut(),
                            );
                            continue;
                        }
                        kernel.run(
                            kc, ap, bp, b_stride, c_tile, ldc, rows, cols, load, prefetch,
                        );
                    }
                }
                jp += group;
            }
        }
    };
    if parallel {
        (0..tasks)
            .into_par_iter()
            .for_each_init(|| (Vec::new(), Vec::new()), run);
    } else {
        let mut scratch = (Vec::new(), Vec::new());
        (0..tasks).for_each(|t| run(&mut scratch, t));
    }
}

/// Rows ahead of the one a tile multiplies that it prefetches when it reads B in place: about
/// a memory latency (~100 ns) of the tile's steps.
const PREFETCH_ROWS: usize = 48;

/// Values of B (k·n) from which a product of a few A panels packs B a band at a time instead
/// of reading it in place: 1 MiB, beyond L2, so B comes from memory.
const STREAMED_B_VALUES: usize = 1 << 18;
pub(crate) const STREAMED_ROW_VALUES: usize = 16 * 1024;
/// Values of one packed band of B (a k block of its panels): 128 KiB, L2-resident while each
/// A panel passes over it.
const STREAMED_BLOCK_VALUES: usize = 64 * 1024;

/// Packs rows `p0..p0 + kc` of B's panels `panels` (B in rows: element (p, j) at
/// `data[p·rs + j]`) into `dst` (panel q of the range: row p at `dst[(q·kc + p − p0)·NR..]`,
/// zeros past n), reading each B row's piece of the band in order: one run of up to
/// `panels.len()·NR` values per row, which the hardware prefetchers follow, where packing
/// panel by panel reads 64 bytes per row at a stride of a whole row.
fn pack_rows_block(
    data: &[f32],
    rs: usize,
    n: usize,
    panels: std::ops::Range<usize>,
    p0: usize,
    kc: usize,
    dst: &mut [f32],
) {
    let count = panels.len();
    assert!(dst.len() >= count * kc * NR);
    for p in 0..kc {
        let row = &data[(p0 + p) * rs..];
        for (q, jp) in panels.clone().enumerate() {
            let j0 = jp * NR;
            let d = &mut dst[(q * kc + p) * NR..][..NR];
            let cols = NR.min(n - j0);
            if cols == NR {
                copy_panel_row(d, &row[j0..]);
            } else {
                d[..cols].copy_from_slice(&row[j0..j0 + cols]);
                d[cols..].fill(0.0);
            }
        }
    }
}

/// Columns of C one task of [`gemv_rows`] sweeps at most: 4 KiB of running sums (L1) and
/// 4 KiB of each B row, read in order.
const GEMV_COLS: usize = 1024;

/// B as rows in memory (element (p, j) at `data[p·rs + j]`), read as stored or rounded.
struct BandRows<'a> {
    data: &'a [f32],
    rs: usize,
    rounding: Option<crate::numeric::Rounding>,
}

/// `c[0..n] (+)= a·B` for one row of A (element p at `a[p·a_cs]`) and B in rows: the
/// matrix-vector product of a decode step. The tiles would read B as 16-column panels, one
/// 64-byte piece of each row at a stride of a whole row (often more than a page, where the
/// hardware prefetchers stop), and a B read rounded would be packed whole on every call; here
/// each task takes a band of columns and streams its piece of every B row in order (rounded
/// on the way where B is read rounded, as packing rounds it), four rows at a time into the
/// band's running sums. Each element is still one chain of fused multiply-adds over k in
/// order, from +0 or C's value, on the same B values, so the bits are the tiles' (the
/// module's rule).
#[allow(clippy::too_many_arguments)]
fn gemv_rows(
    kernel: Kernel,
    n: usize,
    k: usize,
    a: &[f32],
    a_cs: usize,
    b: &BandRows<'_>,
    c: &mut [f32],
    accumulate: bool,
    threads: usize,
) {
    assert!(c.len() == n && a.len() > (k - 1) * a_cs && b.data.len() >= (k - 1) * b.rs + n);
    let x: Vec<f32> = (0..k).map(|p| a[p * a_cs]).collect();
    let width = n
        .div_ceil(threads.max(1))
        .next_multiple_of(NR)
        .clamp(NR, GEMV_COLS);
    // Float16 rounding inside the vector kernel where the CPU converts (F16C): the same
    // round-to-nearest-even conversion `Rounding::round_slice` runs, without a pass over a copy.
    #[cfg(target_arch = "x86_64")]
    let f16_in_kernel = kernel == Kernel::Avx2Fma
        && b.rounding == Some(crate::numeric::Rounding::F16)
        && std::arch::is_x86_feature_detected!("f16c");
    #[cfg(not(target_arch = "x86_64"))]
    let f16_in_kernel = false;
    let band = |(t, y): (usize, &mut [f32])| {
        if !accumulate {
            y.fill(0.0);
        }
        gemv_band(kernel, &x, b, t * width, y, f16_in_kernel);
    };
    if threads > 1 {
        c.par_chunks_mut(width).enumerate().for_each(band);
    } else {
        c.chunks_mut(width).enumerate().for_each(band);
    }
}

/// `y (+)= x·B[.., j0..j0 + y.len()]`, four rows of B per pass over the band (the sums loaded
/// and stored once per four steps of their chains).
fn gemv_band(
    kernel: Kernel,
    x: &[f32],
    b: &BandRows<'_>,
    j0: usize,
    y: &mut [f32],
    f16_in_kernel: bool,
) {
    let len = y.len();
    let row = |p: usize| &b.data[p * b.rs + j0..p * b.rs + j0 + len];
    // The rounded pieces of the pass's rows (B read rounded).
    let mut rounded = vec![0f32; if b.rounding.is_some() { 4 * len } else { 0 }];
    let mut p = 0;
    while p < x.len() {
        let q = (x.len() - p).min(4);
        #[cfg(target_arch = "x86_64")]
        if f16_in_kernel && q == 4 {
            let rows = [0, 1, 2, 3].map(|r| row(p + r));
            // SAFETY: the CPU has AVX2, FMA and F16C (detected); each row holds y.len() values.
            unsafe { fma4_avx2_f16(&x[p..p + 4], rows, y) };
            p += 4;
            continue;
        }
        let rows: [&[f32]; 4] = match b.rounding {
            None => [0, 1, 2, 3].map(|r| row(p + r.min(q - 1))),
            Some(rounding) => {
                for (r, dst) in rounded.chunks_exact_mut(len).take(q).enumerate() {
                    dst.copy_from_slice(row(p + r));
                }
                rounding.round_slice(&mut rounded[..q * len]);
                let piece = |r: usize| &rounded[r.min(q - 1) * len..][..len];
                [piece(0), piece(1), piece(2), piece(3)]
            }
        };
        match (kernel, q) {
            // SAFETY: the CPU has AVX2 and FMA (detected); each row holds y.len() values.
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx2Fma, 4) => unsafe { fma4_avx2(&x[p..p + 4], rows, y) },
            _ => {
                for (r, &xp) in x[p..p + q].iter().enumerate() {
                    for (t, &bv) in y.iter_mut().zip(rows[r]) {
                        *t = xp.mul_add(bv, *t);
                    }
                }
            }
        }
        p += q;
    }
}

/// `y = fma(x3, r3, fma(x2, r2, fma(x1, r1, fma(x0, r0, y))))` element by element, eight at a
/// time, each row's eight values given by `$load` (a pointer to them); the last 1–7 through a
/// zero-padded copy of each row, loaded the same way.
macro_rules! fma4_rows {
    ($x:expr, $rows:expr, $y:expr, $load:expr) => {{
        let (x, rows, y): (&[f32], [&[f32]; 4], &mut [f32]) = ($x, $rows, $y);
        let load = $load;
        let len = y.len();
        let full = len / 8 * 8;
        let yp = y.as_mut_ptr();
        let r = rows.map(|row| row.as_ptr());
        let v = [0, 1, 2, 3].map(|q| _mm256_set1_ps(x[q]));
        for i in (0..full).step_by(8) {
            let mut s = _mm256_loadu_ps(yp.add(i));
            s = _mm256_fmadd_ps(v[0], load(r[0].add(i)), s);
            s = _mm256_fmadd_ps(v[1], load(r[1].add(i)), s);
            s = _mm256_fmadd_ps(v[2], load(r[2].add(i)), s);
            s = _mm256_fmadd_ps(v[3], load(r[3].add(i)), s);
            _mm256_storeu_ps(yp.add(i), s);
        }
        if full < len {
            let mut tail = [[0f32; 8]; 4];
            for (t, row) in tail.iter_mut().zip(&rows) {
                t[..len - full].copy_from_slice(&row[full..]);
                _mm256_storeu_ps(t.as_mut_ptr(), load(t.as_ptr()));
            }
            for i in full..len {
                let mut s = *yp.add(i);
                for (q, t) in tail.iter().enumerate() {
                    s = x[q].mul_add(t[i - full], s);
                }
                *yp.add(i) = s;
            }
        }
    }};
}

/// Four steps of the band's chains over the rows as stored.
///
/// # Safety
/// The CPU has AVX2 and FMA; each row holds `y.len()` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma4_avx2(x: &[f32], rows: [&[f32]; 4], y: &mut [f32]) {
    use std::arch::x86_64::*;
    fma4_rows!(x, rows, y, |p: *const f32| _mm256_loadu_ps(p))
}

/// [`fma4_avx2`] on the rows' values rounded to float16 as they are loaded (F16C's
/// round-to-nearest-even conversion and back, as `round_slice_to_f16` rounds).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; each row holds `y.len()` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fma4_avx2_f16(x: &[f32], rows: [&[f32]; 4], y: &mut [f32]) {
    use std::arch::x86_64::*;
    fma4_rows!(x, rows, y, |p: *const f32| {
        _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(
            _mm256_loadu_ps(p),
        ))
    })
}

/// Panels one pass of [`gemv_panels`] streams at once: eight running-sum registers, enough
/// independent chains to hide the fused multiply-add's latency.
const GEMV_PANELS: usize = 4;

/// Rows ahead of the one a one-row pass streams that it prefetches in each panel (6 KiB per
/// panel's stream): the hardware prefetchers alone left SmolLM2's decode steps waiting on
/// memory, the more so with the conversions of a rounding pass in the window (Intel, plain
/// export, per token: float32 19.8–20.1 → 19.2–19.3 ms, float16 22.2–22.6 → 20.5–21.6,
/// bfloat16 22.7–22.9 → 20.8–21.0).
const GEMV_PREFETCH_ROWS: usize = 96;

/// `c[0..n] (+)= a·B` for one row of A (element p at `a[p·a_cs]`) and B packed whole: the
/// matrix-vector product of a decode step over a weight kept as panels. Each thread takes a
/// run of panels; each pass streams [`GEMV_PANELS`] panels (each k×NR values in one run) into
/// their columns' running sums. Each element is one chain of fused multiply-adds over k in
/// order, from +0 or C's value, on the same B values: the tiles' bits (the module's rule).
fn gemv_panels(
    kernel: Kernel,
    pb: &PackedB,
    a: &[f32],
    a_cs: usize,
    c: &mut [f32],
    accumulate: bool,
    threads: usize,
) {
    let (k, n) = (pb.k, pb.n);
    assert!(c.len() == n && k > 0 && a.len() > (k - 1) * a_cs);
    let x: Vec<f32> = (0..k).map(|p| a[p * a_cs]).collect();
    let width = n
        .div_ceil(threads.max(1))
        .next_multiple_of(NR)
        .clamp(NR, n.next_multiple_of(NR));
    let run = |(t, y): (usize, &mut [f32])| {
        let jp0 = t * width / NR;
        let mut q = 0;
        while q * NR < y.len() {
            let cols = (y.len() - q * NR).min(GEMV_PANELS * NR);
            let panels = cols.div_ceil(NR);
            let b = &pb.data[(jp0 + q) * k * NR..][..panels * k * NR];
            // The running sums, full panels wide (a panel's columns past n are zeros).
            let mut sums = [0f32; GEMV_PANELS * NR];
            if accumulate {
                sums[..cols].copy_from_slice(&y[q * NR..q * NR + cols]);
            }
            match kernel {
                // SAFETY: the CPU has AVX2, FMA and F16C (detected); `b` holds `panels`
                // panels of k×NR values, `sums` panels·NR values.
                #[cfg(target_arch = "x86_64")]
                Kernel::Avx2Fma | Kernel::Avx2FmaF16 | Kernel::Avx2FmaBf16 => unsafe {
                    fn pick<const ROUND: u8>(
                        panels: usize,
                    ) -> unsafe fn(&[f32], *const f32, usize, *mut f32) {
                        match panels {
                            4 => gemv_panels_avx2::<4, ROUND>,
                            3 => gemv_panels_avx2::<3, ROUND>,
                            2 => gemv_panels_avx2::<2, ROUND>,
                            _ => gemv_panels_avx2::<1, ROUND>,
                        }
                    }
                    fn pick512<const ROUND: u8>(
                        panels: usize,
                    ) -> unsafe fn(&[f32], *const f32, usize, *mut f32) {
                        match panels {
                            4 => gemv_panels_avx512::<4, ROUND>,
                            3 => gemv_panels_avx512::<3, ROUND>,
                            2 => gemv_panels_avx512::<2, ROUND>,
                            _ => gemv_panels_avx512::<1, ROUND>,
                        }
                    }
                    // A rounding kernel on an AVX-512 CPU streams 16 values a vector: its
                    // conversions, not the memory, bound the AVX2 pass (SmolLM2's bfloat16
                    // decode 1.28 → 1.10× its float32 step on Intel). The float32 pass reads at
                    // the memory's rate either way and keeps the AVX2 form.
                    let f = match (kernel.rounds(), kernel.has_avx512()) {
                        (TO_F16, true) => pick512::<TO_F16>(panels),
                        (TO_BF16, true) => pick512::<TO_BF16>(panels),
                        (TO_F16, false) => pick::<TO_F16>(panels),
                        (TO_BF16, false) => pick::<TO_BF16>(panels),
                        _ => pick::<AS_STORED>(panels),
                    };
                    f(&x, b.as_ptr(), k, sums.as_mut_ptr())
                },
                _ => {
                    for (panel, s) in b.chunks_exact(k * NR).zip(sums.chunks_exact_mut(NR)) {
                        for (&xp, row) in x.iter().zip(panel.chunks_exact(NR)) {
                            for (t, &bv) in s.iter_mut().zip(row) {
                                *t = xp.mul_add(bv, *t);
                            }
                        }
                    }
                }
            }
            y[q * NR..q * NR + cols].copy_from_slice(&sums[..cols]);
            q += panels;
        }
    };
    if threads > 1 {
        c.par_chunks_mut(width).enumerate().for_each(run);
    } else {
        c.chunks_mut(width).enumerate().for_each(run);
    }
}

/// P panels' running sums (`sums`, P·NR values, loaded and stored) advanced over all k rows
/// of the panels at `b` (panel q at `b.add(q·k·NR)`), B rounded as it is loaded as `ROUND`
/// says ([`round_b`]).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `b` holds P panels of k×NR values; `x` holds k values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemv_panels_avx2<const P: usize, const ROUND: u8>(
    x: &[f32],
    b: *const f32,
    k: usize,
    sums: *mut f32,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 2]; P];
    for (q, s) in acc.iter_mut().enumerate() {
        s[0] = _mm256_loadu_ps(sums.add(q * NR));
        s[1] = _mm256_loadu_ps(sums.add(q * NR + 8));
    }
    let load = |q: *const f32| round_b::<ROUND>(_mm256_loadu_ps(q));
    for (p, xp) in x.iter().enumerate().take(k) {
        let xv = _mm256_broadcast_ss(xp);
        for (q, s) in acc.iter_mut().enumerate() {
            let ahead = b.wrapping_add((q * k + p + GEMV_PREFETCH_ROWS) * NR);
            _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
            let row = b.add((q * k + p) * NR);
            s[0] = _mm256_fmadd_ps(xv, load(row), s[0]);
            s[1] = _mm256_fmadd_ps(xv, load(row.add(8)), s[1]);
        }
    }
    for (q, s) in acc.iter().enumerate() {
        _mm256_storeu_ps(sums.add(q * NR), s[0]);
        _mm256_storeu_ps(sums.add(q * NR + 8), s[1]);
    }
}

/// [`gemv_panels_avx2`] with each panel row one 512-bit vector, B rounded as `ROUND` says
/// ([`round_b16`]): half the conversions of the 8-wide rounding per value. The same chains
/// (one fused multiply-add per k step and column, in order).
///
/// # Safety
/// The CPU has AVX-512F; `b` holds P panels of k×NR values; `x` holds k values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gemv_panels_avx512<const P: usize, const ROUND: u8>(
    x: &[f32],
    b: *const f32,
    k: usize,
    sums: *mut f32,
) {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_ps(); P];
    for (q, s) in acc.iter_mut().enumerate() {
        *s = _mm512_loadu_ps(sums.add(q * NR));
    }
    for (p, &xp) in x.iter().enumerate().take(k) {
        let xv = _mm512_set1_ps(xp);
        for (q, s) in acc.iter_mut().enumerate() {
            let ahead = b.wrapping_add((q * k + p + GEMV_PREFETCH_ROWS) * NR);
            _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
            let row = round_b16::<ROUND>(_mm512_loadu_ps(b.add((q * k + p) * NR)));
            *s = _mm512_fmadd_ps(xv, row, *s);
        }
    }
    for (q, s) in acc.iter().enumerate() {
        _mm512_storeu_ps(sums.add(q * NR), *s);
    }
}

/// B packed whole into NR-column panels of all k rows (panel jp's row p at
/// `data[(jp·k + p)·NR..]`, zeros in the columns past n): packed once and read by every tile
/// of a product with many rows of A (a convolution's weights, [`gemm_gathered`]).
pub struct PackedB {
    data: Vec<f32>,
    k: usize,
    n: usize,
}

impl PackedB {
    /// Packs the k×n matrix `b`.
    pub fn new(k: usize, n: usize, b: &dyn PackB) -> PackedB {
        let mut data = vec![0f32; n.div_ceil(NR) * k * NR];
        if k > 0 {
            let pack = |(jp, dst): (usize, &mut [f32])| b.pack(jp * NR, 0, k, dst);
            if data.len() >= 1 << 16 {
                data.par_chunks_mut(k * NR).enumerate().for_each(pack);
            } else {
                data.chunks_mut(k * NR).enumerate().for_each(pack);
            }
        }
        PackedB { data, k, n }
    }
}

impl PackedB {
    /// [`new`](Self::new), packing B's rows a band of `band_rows` at a time (every panel's
    /// piece of the band, then the next band) and calling `done` with each band's row range
    /// once it is packed: a caller that gives a band's memory back as soon as it is packed
    /// holds B about once while it is packed, not twice.
    pub fn new_in_bands(
        k: usize,
        n: usize,
        b: &dyn PackB,
        band_rows: usize,
        done: &(dyn Fn(std::ops::Range<usize>) + Sync),
    ) -> PackedB {
        let mut data = vec![0f32; n.div_ceil(NR) * k * NR];
        for p0 in (0..k).step_by(band_rows.max(1)) {
            let kc = band_rows.max(1).min(k - p0);
            data.par_chunks_mut(k * NR)
                .enumerate()
                .with_min_len(16)
                .for_each(|(jp, panel)| {
                    b.pack(jp * NR, p0, kc, &mut panel[p0 * NR..(p0 + kc) * NR])
                });
            done(p0..p0 + kc);
        }
        PackedB { data, k, n }
    }
}

impl PackB for PackedB {
    fn pack(&self, j0: usize, p0: usize, kc: usize, dst: &mut [f32]) {
        let jp = j0 / NR;
        dst[..kc * NR].copy_from_slice(&self.data[(jp * self.k + p0) * NR..][..kc * NR]);
    }

    fn packed(&self) -> Option<&PackedB> {
        Some(self)
    }
}

/// Tiles of A rows one task of [`gemm_gathered`] takes at most (its C block and the image
/// rows its tiles read stay in L2).
const GATHERED_TILES_PER_TASK: usize = 64;

/// The most values of C one task of [`gemm_gathered`] computes before handing them on (128
/// KiB: in L2 with room to spare on every x86 core since Skylake-SP and Zen 2).
const GATHERED_C_VALUES: usize = 32 * 1024;

/// Products of fewer multiply-adds (m·n·k) than this, about 150 µs on one core, split into one
/// task per thread (`gathered_tasks`).
const SMALL_GATHERED_PRODUCT: usize = 1 << 24;

/// A finished block of [`gemm_gathered`]'s C: rows × columns of C, row-major in `values`
/// with `ld` values per row (element (i, j) of C at `values[(i − rows.start)·ld + j −
/// columns.start]`).
pub struct GatheredBlock<'a> {
    pub rows: std::ops::Range<usize>,
    pub columns: std::ops::Range<usize>,
    pub values: &'a mut [f32],
    pub ld: usize,
}

thread_local! {
    /// Each thread's C block for [`gemm_gathered`]: grown, never zeroed again (every tile
    /// overwrites its part before anything reads it).
    static GATHERED_C: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `C[m×n] = A·B`, where row i of A is gathered from `image`: element (i, p) at
/// `image[rows[i] + offsets[p]]` (m = `rows.len()`, k = `offsets.len()`). A convolution's
/// im2col matrix, transposed, is such an A, read where the padded image lies: no copy of it is
/// made. Every element is the same in-order chain as in [`gemm`]. C is never whole: each task
/// computes its block in a buffer of its thread and hands it, final, to `done` while it is
/// still in the cache (a convolution moves it into channel planes there); the blocks cover C
/// once.
pub fn gemm_gathered(
    image: &[f32],
    rows: &[usize],
    offsets: &[usize],
    b: &PackedB,
    done: &(dyn Fn(GatheredBlock) + Sync),
) {
    let l1_blocks = Kernel::detect().l1_blocks();
    let rows = GatheredRows::new(image, rows, offsets);
    gathered_product(&rows, offsets, b, done, l1_blocks);
}

/// Where each row of a gathered A starts, checked once: every offset of every row reads
/// inside the image, which outlives the value.
struct GatheredRows<'a> {
    starts: Vec<*const f32>,
    _image: std::marker::PhantomData<&'a [f32]>,
}

// SAFETY: the pointers are only read through, into slices shared for 'a.
unsafe impl Sync for GatheredRows<'_> {}

impl<'a> GatheredRows<'a> {
    /// Row i starts at `image[rows[i]]`; panics where a row's furthest offset lies past the
    /// image.
    fn new(image: &'a [f32], rows: &[usize], offsets: &[usize]) -> Self {
        let reach = offsets.iter().max().copied().unwrap_or(0);
        let starts = rows
            .iter()
            .map(|&o| {
                assert!(
                    o + reach < image.len(),
                    "a gathered row reads past its image"
                );
                image[o..].as_ptr()
            })
            .collect();
        GatheredRows {
            starts,
            _image: std::marker::PhantomData,
        }
    }

    fn len(&self) -> usize {
        self.starts.len()
    }
}

/// [`gemm_gathered`], with L1-sized k blocks and 12×32 tiles ([`Kernel::l1_blocks`]) or not
/// (tests run both on any AVX-512 CPU; the bits are the same).
fn gathered_product(
    rows: &GatheredRows,
    offsets: &[usize],
    b: &PackedB,
    done: &(dyn Fn(GatheredBlock) + Sync),
    l1_blocks: bool,
) {
    let (m, k, n) = (rows.len(), offsets.len(), b.n);
    assert_eq!(b.k, k, "B has {} rows, A {k} columns", b.k);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        let mut zeros = vec![0f32; m * n];
        done(GatheredBlock {
            rows: 0..m,
            columns: 0..n,
            values: &mut zeros,
            ld: n,
        });
        return;
    }
    let (m_tiles, n_panels) = (m.div_ceil(MR), n.div_ceil(NR));
    let (tb, target) = gathered_tasks(m, n, k);
    let parallel = target > 1;
    let kernel = Kernel::detect();
    // Pairs of full panels go through the 6×32 AVX-512 tile where the CPU has it.
    let wide = kernel.has_avx512();
    let group = if wide { 2 } else { 1 };
    let row_blocks = m_tiles.div_ceil(tb);
    let col_units = n_panels.div_ceil(group);
    let cu = col_units.div_ceil(target.div_ceil(row_blocks).clamp(1, col_units));
    // A task's C block holds at most GATHERED_C_VALUES, so that it stays in the core's L2
    // beside the A rows and B panels its tiles read until the callback moves it out: a wide
    // product (a ConvTranspose's 1024 columns of output channel × tap) otherwise made blocks
    // of 384 rows × 1024 columns (1.5 MiB) on one thread, which the callback then read back
    // from L3. Whole 6×64 tiles where a block takes more than one pair of panels.
    let fit = (GATHERED_C_VALUES / (tb * MR * NR * group)).max(1);
    let cu = cu.min(if fit >= 2 { fit / 2 * 2 } else { fit });
    let col_blocks = col_units.div_ceil(cu);
    let cb = cu * group;
    // On Intel's cores, which run two 512-bit FMAs a cycle, the tiles must find B in L1: k
    // blocks of FULL_WIDTH_KC (the 6×64 tile's four panels then hold 32 KiB instead of 64)
    // and, where twelve rows start at consecutive values, 12×32 tiles inside the four panels
    // (each pair's B, 8 KiB a block, read by twelve rows instead of six). AMD's keep up with B
    // from L2 either way, and the extra passes over C cost 1–5 % ([`avx512_layout`]).
    let l1_blocks = wide && l1_blocks;
    let kc_block = if l1_blocks && k > KC {
        FULL_WIDTH_KC
    } else {
        KC
    };
    let task = |t: usize, block: &mut Vec<f32>| {
        let (tr, tc) = (t % row_blocks, t / row_blocks);
        let (it0, it1) = (tr * tb, ((tr + 1) * tb).min(m_tiles));
        let (jp0, jp1) = (tc * cb, ((tc + 1) * cb).min(n_panels));
        // The block's rows hold whole panels: ldc = their width.
        let ldc = (jp1 - jp0) * NR;
        let size = (it1 - it0) * MR * ldc;
        if block.len() < size {
            block.resize(size, 0.0);
        }
        let c_base = block.as_mut_ptr();
        for p0 in (0..k).step_by(kc_block) {
            let kc = kc_block.min(k - p0);
            let panel = |jp: usize| b.data[(jp * k + p0) * NR..][..kc * NR].as_ptr();
            // Whether row tiles it and it + 1 are twelve rows of A in this block that start
            // evenly spaced (a run of one output row's positions: one value apart, or two at
            // stride 2), and how far apart.
            #[cfg(target_arch = "x86_64")]
            let runs_of_twelve = |it: usize| {
                let i0 = it * MR;
                (it + 1 < it1 && m - i0 >= 2 * MR)
                    .then(|| run_step(&rows.starts[i0..i0 + 2 * MR]))
                    .flatten()
            };
            // Those twelve rows over panels jq and jq + 1: a 12×32 tile, 24 accumulators (per k
            // step 12 broadcasts of A and 2 loads of B for 24 FMAs, against 6 + 2 for 12 in the
            // 6×32 tile: what a CPU with two 512-bit FMA units per core needs to keep both busy).
            #[cfg(target_arch = "x86_64")]
            let tile_12x32 = |it: usize, jq: usize, step: RunStep| {
                let i0 = it * MR;
                let (first, offsets) = (rows.starts[i0], offsets[p0..].as_ptr());
                let c_at = c_base.wrapping_add((i0 - it0 * MR) * ldc + (jq - jp0) * NR);
                // SAFETY: called where `runs_of_twelve(it)` gave `step`: the 12 rows are rows
                // of A, `step` values apart, whose every offset reads inside their image
                // (`GatheredRows`); panel jq + 1 < jp1 follows panel jq at k·NR values in B,
                // each holding kc rows from p0; the 12×32 tile lies inside this thread's block
                // (it + 1 < it1, whole panels).
                unsafe {
                    let tile = RunTile {
                        kc,
                        first,
                        offsets,
                        b: panel(jq),
                        panel_step: k * NR,
                        c: c_at,
                        ldc,
                        load: p0 > 0,
                    };
                    match step {
                        RunStep::One => tile_12x32_run::<1>(tile),
                        RunStep::Two => tile_12x32_run::<2>(tile),
                    }
                }
            };
            let mut jp = jp0;
            while jp < jp1 {
                // Two panels at once where the CPU has AVX-512: a 6×32 tile. The second
                // may be partial (24 channels): its columns past n are zeros in B, and the
                // block's rows hold whole panels, so the tile writes them where nothing
                // reads them.
                let pair = wide && jp + 1 < jp1;
                // Four panels at once (6×64, 24 accumulators): per k step 4 loads of B and 6
                // broadcasts of A for 24 FMAs, against 2 + 6 for 12 in the pair tile.
                #[cfg(target_arch = "x86_64")]
                if wide && jp + 3 < jp1 {
                    let mut it = it0;
                    while it < it1 {
                        let i0 = it * MR;
                        if let Some(step) = runs_of_twelve(it).filter(|_| l1_blocks) {
                            tile_12x32(it, jp, step);
                            tile_12x32(it, jp + 2, step);
                            it += 2;
                            continue;
                        }
                        it += 1;
                        let origins: [*const f32; MR] = row_starts(&rows.starts[i0..]);
                        let c_at = c_base.wrapping_add((i0 - it0 * MR) * ldc + (jp - jp0) * NR);
                        // SAFETY: as the pair tile's below, over four panels.
                        unsafe {
                            tile_avx512_rows(
                                MR.min(m - i0),
                                kc,
                                &origins,
                                offsets[p0..].as_ptr(),
                                [panel(jp), panel(jp + 1), panel(jp + 2), panel(jp + 3)],
                                c_at,
                                ldc,
                                p0 > 0,
                            );
                        }
                    }
                    jp += 4;
                    continue;
                }
                let mut it = it0;
                while it < it1 {
                    let (i0, tile_rows) = (it * MR, MR.min(m - it * MR));
                    let c_at =
                        |jq: usize| c_base.wrapping_add((i0 - it0 * MR) * ldc + (jq - jp0) * NR);
                    // A lone panel (16 or fewer channels, or the last of an odd count) where
                    // the CPU has AVX-512: two full row tiles at once in a 12×16 tile, 12
                    // accumulators of 16 lanes (the 6×16 AVX2 tile fills half of each FMA).
                    #[cfg(target_arch = "x86_64")]
                    if wide && !pair && it + 1 < it1 {
                        let origins: [*const f32; 2 * MR] = row_starts(&rows.starts[i0..]);
                        // SAFETY: as below; the block holds the 12 rows (it + 1 < it1) of
                        // whole panels (columns past n are zeros in B, rows past m start at
                        // the first row's start: both written where nothing reads them).
                        unsafe {
                            tile_avx512_gathered(
                                kc,
                                &origins,
                                offsets[p0..].as_ptr(),
                                [panel(jp)],
                                c_at(jp),
                                ldc,
                                p0 > 0,
                            );
                        }
                        it += 2;
                        continue;
                    }
                    // A pair of panels with twelve rows that start at consecutive values.
                    #[cfg(target_arch = "x86_64")]
                    if let Some(step) = runs_of_twelve(it).filter(|_| pair) {
                        tile_12x32(it, jp, step);
                        it += 2;
                        continue;
                    }
                    it += 1;
                    let origins: [*const f32; MR] = row_starts(&rows.starts[i0..i0 + tile_rows]);
                    // SAFETY: every (row, offset) pair reads inside its image (`GatheredRows`);
                    // a panel holds kc rows of NR values; the tile (at most MR rows of its
                    // panels' columns) lies inside this thread's block, sized above.
                    // A partial row tile too, at its own height (`tile_avx512_rows`): at full
                    // width instead of the 6×16 tile twice (PP-OCRv4 det's 384-channel
                    // pointwise convolutions on 3×3 planes are 9 rows).
                    #[cfg(target_arch = "x86_64")]
                    if pair {
                        unsafe {
                            tile_avx512_rows(
                                tile_rows,
                                kc,
                                &origins,
                                offsets[p0..].as_ptr(),
                                [panel(jp), panel(jp + 1)],
                                c_at(jp),
                                ldc,
                                p0 > 0,
                            );
                        }
                        continue;
                    }
                    let a = GatheredA {
                        rows: origins,
                        offsets: offsets[p0..].as_ptr(),
                    };
                    for jq in jp..jp + 1 + pair as usize {
                        let cols = NR.min(n - jq * NR);
                        unsafe {
                            kernel.run(
                                kc,
                                a,
                                panel(jq),
                                NR,
                                c_at(jq),
                                ldc,
                                tile_rows,
                                cols,
                                p0 > 0,
                                false,
                            );
                        }
                    }
                }
                jp += 1 + pair as usize;
            }
        }
        done(GatheredBlock {
            rows: it0 * MR..(it1 * MR).min(m),
            columns: jp0 * NR..(jp1 * NR).min(n),
            values: &mut block[..size],
            ld: ldc,
        });
    };
    let run = |t: usize| super::util::with_scratch(&GATHERED_C, Vec::new, |c| task(t, c));
    let tasks = row_blocks * col_blocks;
    if parallel {
        (0..tasks).into_par_iter().for_each(run);
    } else {
        (0..tasks).for_each(run);
    }
}

/// Row tiles per task of [`gemm_gathered`] for an m×n×k product on this pool, and the tasks
/// it aims at (1: on the calling thread). Tasks are blocks of row tiles (at most
/// GATHERED_TILES_PER_TASK, at least 4 — 24 rows, whole 8×8 blocks for the callback to
/// transpose — where there are that many), split over groups of B's panels too: about 8 per
/// thread, so that the last tasks balance the threads; a small product one per thread
/// ([`small_product_tasks`]).
fn gathered_tasks(m: usize, n: usize, k: usize) -> (usize, usize) {
    let m_tiles = m.div_ceil(MR);
    let threads = rayon::current_num_threads();
    let parallel = threads > 1 && m * n * k >= PARALLEL_WORK;
    if parallel && m * n * k < SMALL_GATHERED_PRODUCT {
        return small_product_tasks(m_tiles, n, threads, n > m);
    }
    let target = if parallel { 8 * threads } else { 1 };
    // Where B is wider than A is tall (a ConvTranspose's 2048–4096 columns of output channel
    // × tap on 196–784 positions), the tasks take as many rows as they may and split the
    // columns: each task then streams its slice of B once and re-reads the rows of A, which
    // stay in L2 (split by rows, every row block streamed all of B, 6 MiB, from L3).
    // Where the column groups alone give fewer tasks than the target (a 7² convolution's 256
    // channels: 8 pairs of panels), the rows split into the fewest equal blocks that reach it
    // (9 row tiles: 3 blocks of 3, not 5 + 4): with a task per column group the last task
    // left one thread idle for up to an eighth of the product.
    let tb = if n > m {
        let column_groups = n.div_ceil(NR).div_ceil(2).max(1);
        let fewest = target.div_ceil(column_groups).min(m_tiles).max(1);
        let blocks = (fewest..=(2 * fewest).min(m_tiles).max(fewest))
            .min_by_key(|&r| (m_tiles.div_ceil(r) * r, r))
            .unwrap_or(1);
        m_tiles.div_ceil(blocks).min(GATHERED_TILES_PER_TASK)
    } else {
        // At least the target in row blocks where there are 4 tiles a block for it (tiles
        // rounded down, not up: 131 row tiles in 17 blocks of 8, not 15 of 9), so that B's
        // columns are not split as well: two tasks of one row block read the same rows of A
        // (a convolution's gathered image), often on two cores. The bench CNN's 3×3/2
        // 32 → 64 alone on two threads −15 % (Zen 5) and −20 % (Intel), the CNN −2 to −3 %.
        (m_tiles / target)
            .max(m_tiles.min(4))
            .min(GATHERED_TILES_PER_TASK)
    };
    (tb, target)
}

/// A small product's split, as ONNX Runtime splits an op's work: one task per thread, in the
/// grid of row blocks × column blocks whose largest task is least (ties split the larger
/// operand, so that each thread reads part of it), the row blocks doubled, tripled… where one
/// would hold more than GATHERED_C_VALUES. Eight tasks a thread there are tasks of a few
/// microseconds, each dispatched, that cut the columns into pairs of panels, out of the 6×64
/// tile: a 3×3 convolution 128 → 128 on a 5² plane (25 × 128 × 1152) on two Zen 5 threads
/// 26.5 → 22.5 µs alone, 96 → 96 on 6² −15 %, PP-OCRv4 det −5 %, nudenet −3 %.
///
/// Where every thread would take at least TALL_SPLIT_TILES row tiles, the rows split in
/// threads' blocks whatever the grid's largest task: each thread then reads only its part of
/// A (a convolution's input, which the layer before left in two cores' caches) where a split
/// of the columns has both read all of it. The bench CNN's 32 → 64 convolutions on 28²
/// outputs (131 row tiles, 2 pairs of panels: 131 × 1 by columns against 66 × 2 by rows), per
/// layer on two threads: the 3×3/2 −7 % (Zen 5) and −4 % (Intel), the 1×1/2 shortcut −5 % and
/// −22 %; on the 33- and 9-tile products of the deeper layers rows lost (up to +35 %), which
/// keep the grid. The CNN −1 % on Intel, the other models within ±1 % (in one process).
fn small_product_tasks(m_tiles: usize, n: usize, threads: usize, wide: bool) -> (usize, usize) {
    const TALL_SPLIT_TILES: usize = 32;
    let pairs = n.div_ceil(NR).div_ceil(2).max(1);
    let row_blocks = if m_tiles >= TALL_SPLIT_TILES * threads {
        threads
    } else {
        (1..=threads)
            .filter(|r| threads.is_multiple_of(*r))
            .min_by_key(|&r| {
                let column_blocks = threads / r;
                let largest = m_tiles.div_ceil(r) * pairs.div_ceil(column_blocks);
                (largest, if wide { r } else { column_blocks })
            })
            .unwrap_or(1)
    };
    let column_blocks = threads / row_blocks;
    // A row block's C over one pair of panels in GATHERED_C_VALUES.
    let blocks = row_blocks * (m_tiles * MR * 2 * NR).div_ceil(row_blocks * GATHERED_C_VALUES);
    (m_tiles.div_ceil(blocks), blocks * column_blocks)
}

/// The most rows of C one block of [`gemm_gathered`] hands to its callback, for an m×n×k
/// product on this pool (the last block of the rows may hold fewer).
pub fn gathered_block_rows(m: usize, n: usize, k: usize) -> usize {
    (gathered_tasks(m, n, k).0 * MR).min(m)
}

/// A tile's first R row starts (fewer rows: the rest start where the first does, rows the
/// tile computes but nothing reads).
fn row_starts<const R: usize>(rows: &[*const f32]) -> [*const f32; R] {
    let mut starts = [rows[0]; R];
    for (s, &row) in starts.iter_mut().zip(rows) {
        *s = row;
    }
    starts
}

/// Where a tile reads its A values: element (r, p) of the tile (row r < MR, step p < kc).
trait TileA: Copy {
    /// # Safety
    /// (r, p) lies inside the tile the value was made for.
    unsafe fn at(self, r: usize, p: usize) -> *const f32;
}

/// A strided matrix: element (r, p) of the tile at `data[r·rs + p·cs]`.
#[derive(Clone, Copy)]
struct StridedA {
    data: *const f32,
    rs: usize,
    cs: usize,
}

impl TileA for StridedA {
    #[inline(always)]
    unsafe fn at(self, r: usize, p: usize) -> *const f32 {
        self.data.add(r * self.rs + p * self.cs)
    }
}

/// Rows gathered from an image: element (r, p) at `rows[r] + offsets[p]`.
#[derive(Clone, Copy)]
struct GatheredA {
    rows: [*const f32; MR],
    offsets: *const usize,
}

impl TileA for GatheredA {
    #[inline(always)]
    unsafe fn at(self, r: usize, p: usize) -> *const f32 {
        self.rows[r].add(*self.offsets.add(p))
    }
}

/// Rows gathered from an image that start STEP values apart (a run of output positions of one
/// output row: consecutive values in a stride phase or at stride 1, two apart where a strided
/// 1×1 convolution reads its image in place): element (r, p) at `first + r·STEP + offsets[p]`.
/// One pointer instead of one per row: the compiler keeps a 12-row tile's pointers and offsets
/// in registers (with a pointer per row it spilled them, and the 12×32 tile ran 1.3× slower
/// than the 6×32 one on Zen 4).
#[derive(Clone, Copy)]
struct RunA<const STEP: usize> {
    first: *const f32,
    offsets: *const usize,
}

impl<const STEP: usize> TileA for RunA<STEP> {
    #[inline(always)]
    unsafe fn at(self, r: usize, p: usize) -> *const f32 {
        self.first.add(*self.offsets.add(p) + r * STEP)
    }
}

/// One 12×32 panel tile over twelve rows a run apart ([`tile_12x32_run`]).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct RunTile {
    kc: usize,
    /// The first row's start and the offsets ([`RunA`]).
    first: *const f32,
    offsets: *const usize,
    /// B's first panel and the step to the second.
    b: *const f32,
    panel_step: usize,
    /// C, its row stride, and whether C is loaded first.
    c: *mut f32,
    ldc: usize,
    load: bool,
}

/// `t` over rows STEP values apart.
///
/// # Safety
/// As [`tile_avx512_panels`] with [`RunA`]; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile_12x32_run<const STEP: usize>(t: RunTile) {
    let a = RunA::<STEP> {
        first: t.first,
        offsets: t.offsets,
    };
    tile_avx512_panels::<{ 2 * MR }, 2, false, AS_STORED, false, RunA<STEP>>(
        t.kc,
        a,
        t.b,
        t.panel_step,
        NR,
        t.c,
        t.ldc,
        t.load,
        std::ptr::null_mut(),
    )
}

/// How far apart the rows of a [`RunA`] start.
#[derive(Clone, Copy)]
enum RunStep {
    One,
    Two,
}

/// Whether `rows` start evenly one or two values apart, and which.
fn run_step(rows: &[*const f32]) -> Option<RunStep> {
    let gap = |w: &[*const f32]| (w[1] as usize).wrapping_sub(w[0] as usize);
    let step = match gap(rows) / std::mem::size_of::<f32>() {
        1 => RunStep::One,
        2 => RunStep::Two,
        _ => return None,
    };
    let first = gap(rows);
    rows.windows(2).all(|w| gap(w) == first).then_some(step)
}

/// The register-tile kernel this CPU runs (both give the same bits).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kernel {
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
    /// The AVX2 + FMA tile (and, where the CPU has AVX-512, the AVX-512 tiles) reading B
    /// rounded to float16 as it loads it (F16C's round-to-nearest-even conversion and back, the
    /// values `round_slice_to_f16` gives): a float16 layer's weight read in place.
    #[cfg(target_arch = "x86_64")]
    Avx2FmaF16,
    /// The same, rounding to bfloat16 (`numeric::bf16_x8`: the integer steps of
    /// `round_to_bf16`, NaN kept).
    #[cfg(target_arch = "x86_64")]
    Avx2FmaBf16,
    Scalar,
}

/// What the AVX2 kernels do to B's values as they load them ([`round_b`]).
const AS_STORED: u8 = 0;
const TO_F16: u8 = 1;
const TO_BF16: u8 = 2;

/// Eight of B's values as loaded by a kernel that rounds them as `ROUND` says.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn round_b<const ROUND: u8>(v: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    match ROUND {
        TO_F16 => _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v)),
        TO_BF16 => crate::numeric::bf16_x8(v),
        _ => v,
    }
}

/// Sixteen of B's values as loaded by an AVX-512 tile that rounds them as `ROUND` says: the
/// values [`round_b`] gives eight at a time.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn round_b16<const ROUND: u8>(v: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    match ROUND {
        TO_F16 => crate::numeric::f16_x16(v),
        TO_BF16 => crate::numeric::bf16_x16(v),
        _ => v,
    }
}

/// The instruction set the float tiles run with on this CPU (`ops::isa`'s report).
pub(crate) fn instruction_set() -> &'static str {
    let kernel = Kernel::detect();
    if kernel.has_avx512() {
        return if kernel.full_width_avx512() {
            "avx512 (two 512-bit FMAs a cycle)"
        } else {
            "avx512 (512-bit FMAs in two halves)"
        };
    }
    #[cfg(target_arch = "x86_64")]
    if kernel == Kernel::Avx2Fma {
        return "avx2+fma";
    }
    "scalar"
}

impl Kernel {
    fn detect() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            return Kernel::Avx2Fma;
        }
        Kernel::Scalar
    }

    /// This kernel reading B rounded to float16 or bfloat16 as it loads it (None: the scalar
    /// kernel, which reads a rounded copy).
    fn rounding_b(self, rounding: crate::numeric::Rounding) -> Option<Kernel> {
        match (self, rounding) {
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx2Fma, crate::numeric::Rounding::F16) => Some(Kernel::Avx2FmaF16),
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx2Fma, crate::numeric::Rounding::BF16) => Some(Kernel::Avx2FmaBf16),
            _ => None,
        }
    }

    /// What this kernel does to B's values as it loads them.
    fn rounds(self) -> u8 {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2FmaF16 => TO_F16,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2FmaBf16 => TO_BF16,
            _ => AS_STORED,
        }
    }

    /// Whether the 6×32 AVX-512 tiles may run (the same chains as this kernel's).
    fn has_avx512(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if matches!(
            self,
            Kernel::Avx2Fma | Kernel::Avx2FmaF16 | Kernel::Avx2FmaBf16
        ) {
            return std::arch::is_x86_feature_detected!("avx512f");
        }
        false
    }

    /// Whether this core runs two 512-bit FMAs a cycle (Intel's AVX-512 cores; AMD's from
    /// Zen 5, family 26) rather than splitting each into two 256-bit halves (Zen 4).
    fn full_width_avx512(self) -> bool {
        self.has_avx512() && super::isa::signature().is_some_and(|s| avx512_layout(s).full_width)
    }

    /// Whether the gathered product sizes its k blocks for L1 ([`FULL_WIDTH_KC`]) and runs
    /// 12×32 tiles (see [`gathered_product`]).
    fn l1_blocks(self) -> bool {
        self.has_avx512() && super::isa::signature().is_some_and(|s| avx512_layout(s).l1_blocks)
    }

    /// One tile: `C[rows×cols] (+)= A_panel·B_panel` over `kc` steps.
    ///
    /// # Safety
    /// `c` must be valid for `rows` rows of `cols` values at row stride `ldc`; `a` for `rows`
    /// rows of `kc` values, `b` for `kc` rows of NR values at stride `b_stride`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run<A: TileA>(
        self,
        kc: usize,
        a: A,
        b: *const f32,
        b_stride: usize,
        c: *mut f32,
        ldc: usize,
        rows: usize,
        cols: usize,
        accumulate: bool,
        prefetch: bool,
    ) {
        debug_assert!((1..=MR).contains(&rows));
        if cols == NR {
            return self.tile(rows, kc, a, b, b_stride, c, ldc, accumulate, prefetch);
        }
        // An edge tile goes through a full-width one on the stack.
        let mut tile = [0f32; MR * NR];
        if accumulate {
            for r in 0..rows {
                std::ptr::copy_nonoverlapping(c.add(r * ldc), tile.as_mut_ptr().add(r * NR), cols);
            }
        }
        self.tile(
            rows,
            kc,
            a,
            b,
            b_stride,
            tile.as_mut_ptr(),
            NR,
            accumulate,
            prefetch,
        );
        for r in 0..rows {
            std::ptr::copy_nonoverlapping(tile.as_ptr().add(r * NR), c.add(r * ldc), cols);
        }
    }

    /// `rows` full-width rows at `c` (row stride `ldc`), starting from their values or zero,
    /// prefetching B's rows ahead where `prefetch` (B streamed from memory: read in place, or
    /// packed whole and read by a few A panels; not a panel packed for this product, which
    /// is in cache, nor on the scalar tile).
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<A: TileA>(
        self,
        rows: usize,
        kc: usize,
        a: A,
        b: *const f32,
        b_stride: usize,
        c: *mut f32,
        ldc: usize,
        load: bool,
        prefetch: bool,
    ) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2Fma | Kernel::Avx2FmaF16 | Kernel::Avx2FmaBf16 => {
                let f = match (self.rounds(), prefetch) {
                    (TO_F16, false) => avx2_tile::<false, TO_F16, A>(rows),
                    (TO_F16, true) => avx2_tile::<true, TO_F16, A>(rows),
                    (TO_BF16, false) => avx2_tile::<false, TO_BF16, A>(rows),
                    (TO_BF16, true) => avx2_tile::<true, TO_BF16, A>(rows),
                    (_, false) => avx2_tile::<false, AS_STORED, A>(rows),
                    (_, true) => avx2_tile::<true, AS_STORED, A>(rows),
                };
                f(kc, a, b, b_stride, c, ldc, load)
            }
            Kernel::Scalar => tile_scalar(rows, kc, a, b, b_stride, c, ldc, load),
        }
    }
}

/// The portable tile: the same chains of fused multiply-adds as the vector kernel.
///
/// # Safety
/// As [`Kernel::tile`].
#[allow(clippy::too_many_arguments)]
unsafe fn tile_scalar<A: TileA>(
    rows: usize,
    kc: usize,
    a: A,
    b: *const f32,
    b_stride: usize,
    c: *mut f32,
    ldc: usize,
    load: bool,
) {
    for r in 0..rows {
        let mut acc = [0f32; NR];
        if load {
            std::ptr::copy_nonoverlapping(c.add(r * ldc), acc.as_mut_ptr(), NR);
        }
        for p in 0..kc {
            let av = *a.at(r, p);
            for (j, t) in acc.iter_mut().enumerate() {
                *t = av.mul_add(*b.add(p * b_stride + j), *t);
            }
        }
        std::ptr::copy_nonoverlapping(acc.as_ptr(), c.add(r * ldc), NR);
    }
}

/// The AVX2 tile of `rows` rows, prefetching B's rows ahead or not, reading B rounded to float16
/// or as stored.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::type_complexity)]
fn avx2_tile<const PREFETCH: bool, const ROUND: u8, A: TileA>(
    rows: usize,
) -> unsafe fn(usize, A, *const f32, usize, *mut f32, usize, bool) {
    match rows {
        1 => tile_avx2_fma::<1, PREFETCH, ROUND, A>,
        2 => tile_avx2_fma::<2, PREFETCH, ROUND, A>,
        3 => tile_avx2_fma::<3, PREFETCH, ROUND, A>,
        4 => tile_avx2_fma::<4, PREFETCH, ROUND, A>,
        5 => tile_avx2_fma::<5, PREFETCH, ROUND, A>,
        _ => tile_avx2_fma::<6, PREFETCH, ROUND, A>,
    }
}

/// An AVX-512 panel tile over a strided A ([`tile_avx512_panels`]'s arguments after its
/// const parameters).
#[cfg(target_arch = "x86_64")]
type PanelTile =
    unsafe fn(usize, StridedA, *const f32, usize, usize, *mut f32, usize, bool, *mut f32);

/// The AVX-512 tile of R rows by P panels, prefetching B's rows ahead or not.
#[cfg(target_arch = "x86_64")]
fn avx512_panels_tile<const R: usize, const P: usize>(prefetch: bool, rounds: u8) -> PanelTile {
    match (prefetch, rounds) {
        (true, TO_F16) => tile_avx512_panels::<R, P, true, TO_F16, false, StridedA>,
        (false, TO_F16) => tile_avx512_panels::<R, P, false, TO_F16, false, StridedA>,
        (true, TO_BF16) => tile_avx512_panels::<R, P, true, TO_BF16, false, StridedA>,
        (false, TO_BF16) => tile_avx512_panels::<R, P, false, TO_BF16, false, StridedA>,
        (true, _) => tile_avx512_panels::<R, P, true, AS_STORED, false, StridedA>,
        (false, _) => tile_avx512_panels::<R, P, false, AS_STORED, false, StridedA>,
    }
}

/// The AVX-512 tile of R rows by two panels that rounds B as `rounds` says (not AS_STORED) and
/// keeps what it rounded: the first row tile of a product that several row tiles share.
#[cfg(target_arch = "x86_64")]
fn avx512_keeping_tile<const R: usize>(prefetch: bool, rounds: u8) -> PanelTile {
    match (prefetch, rounds) {
        (true, TO_F16) => tile_avx512_panels::<R, 2, true, TO_F16, true, StridedA>,
        (false, TO_F16) => tile_avx512_panels::<R, 2, false, TO_F16, true, StridedA>,
        (true, _) => tile_avx512_panels::<R, 2, true, TO_BF16, true, StridedA>,
        (false, _) => tile_avx512_panels::<R, 2, false, TO_BF16, true, StridedA>,
    }
}

/// The AVX-512 tile of `rows` rows by two panels, prefetching B's rows ahead or not.
#[cfg(target_arch = "x86_64")]
fn avx512_pair_tile(rows: usize, prefetch: bool, rounds: u8) -> PanelTile {
    match rows {
        1 => avx512_panels_tile::<1, 2>(prefetch, rounds),
        2 => avx512_panels_tile::<2, 2>(prefetch, rounds),
        3 => avx512_panels_tile::<3, 2>(prefetch, rounds),
        4 => avx512_panels_tile::<4, 2>(prefetch, rounds),
        5 => avx512_panels_tile::<5, 2>(prefetch, rounds),
        _ => avx512_panels_tile::<6, 2>(prefetch, rounds),
    }
}

/// The AVX2 + FMA tile of R ≤ MR rows: 2·R accumulator registers, per k step two loads of B,
/// R broadcasts of A and 2·R fused multiply-adds.
///
/// # Safety
/// As [`Kernel::tile`]; the CPU has AVX2, FMA and F16C ([`Kernel::detect`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_avx2_fma<const R: usize, const PREFETCH: bool, const ROUND: u8, A: TileA>(
    kc: usize,
    a: A,
    b: *const f32,
    b_stride: usize,
    c: *mut f32,
    ldc: usize,
    load: bool,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    if load {
        for (r, row) in acc.iter_mut().enumerate() {
            row[0] = _mm256_loadu_ps(c.add(r * ldc));
            row[1] = _mm256_loadu_ps(c.add(r * ldc + 8));
        }
    }
    for p in 0..kc {
        if PREFETCH {
            // The row PREFETCH_ROWS steps ahead (past the block: the next block's, or beyond
            // B, where a prefetch is only a hint): both cache lines its 16 values may span.
            let ahead = b.wrapping_add((p + PREFETCH_ROWS) * b_stride);
            _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(NR - 1) as *const i8);
        }
        let load = |q: *const f32| round_b::<ROUND>(_mm256_loadu_ps(q));
        let b0 = load(b.add(p * b_stride));
        let b1 = load(b.add(p * b_stride + 8));
        for (r, row) in acc.iter_mut().enumerate() {
            let av = _mm256_broadcast_ss(&*a.at(r, p));
            row[0] = _mm256_fmadd_ps(av, b0, row[0]);
            row[1] = _mm256_fmadd_ps(av, b1, row[1]);
        }
    }
    for (r, row) in acc.iter().enumerate() {
        _mm256_storeu_ps(c.add(r * ldc), row[0]);
        _mm256_storeu_ps(c.add(r * ldc + 8), row[1]);
    }
}

/// R rows × P B panels (16·P columns; panel q at `b.add(q·panel_step)`, kc rows each at
/// stride `b_stride`) of a product whose A the tile reads through `a`, in AVX-512 registers:
/// the same chains as the 6×16 tile. Three shapes run: R×32 (P = 2; on Zen 5, with full-width
/// 512-bit FMA units, the transformer's MatMuls ~1.6× as fast as through the `gemm` crate's
/// AVX2 kernel), 12×32 for a product of a few A panels (24 accumulators: B streamed from
/// memory is loaded once per 12 rows; a 16-row prefill 5–10 % faster on Zen 4; with many A
/// panels, B packed per call and in cache, 6×32 stays) and, for a product of one row, 1×128
/// (P = 8: eight independent chains hide the FMA latency that a one-row 1×32 tile waits on;
/// Silero's LSTM step [1,128]·[128,512] was 1.5× slower on 1×32 than on the `gemm` crate's
/// one-row path). With PREFETCH, each
/// panel's row PREFETCH_ROWS steps ahead is prefetched, as the AVX2 tile does for a B streamed
/// from memory. With KEEP, each B value as the tile used it (rounded as ROUND says) is also
/// stored into `kept`: panel q's row p at `kept[(p·P + q)·NR..]`; the next row tiles of the
/// same panels read `kept` as stored instead of rounding the same values again. (The panels'
/// rows interleave: panels kc·NR values apart, a multiple of 4 KiB, made each store alias the
/// next loads of B on Intel, and the prefill 10 % slower instead of faster.)
///
/// # Safety
/// As [`Kernel::tile`] for each of the P panels (16·P full columns of C); with KEEP, `kept`
/// writable for P·kc·NR values; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_avx512_panels<
    const R: usize,
    const P: usize,
    const PREFETCH: bool,
    const ROUND: u8,
    const KEEP: bool,
    A: TileA,
>(
    kc: usize,
    a: A,
    b: *const f32,
    panel_step: usize,
    b_stride: usize,
    c: *mut f32,
    ldc: usize,
    load: bool,
    kept: *mut f32,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); P]; R];
    if load {
        for (r, row) in acc.iter_mut().enumerate() {
            for (q, v) in row.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(c.add(r * ldc + q * NR));
            }
        }
    }
    for p in 0..kc {
        if PREFETCH {
            // As the AVX2 tile: each panel's row PREFETCH_ROWS steps ahead (a hint, also past
            // the block or beyond B), both cache lines its 16 values may span.
            for q in 0..P {
                let ahead = b.wrapping_add(q * panel_step + (p + PREFETCH_ROWS) * b_stride);
                _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(NR - 1) as *const i8);
            }
        }
        let bv: [__m512; P] = std::array::from_fn(|q| {
            round_b16::<ROUND>(_mm512_loadu_ps(b.add(q * panel_step + p * b_stride)))
        });
        if KEEP {
            for (q, v) in bv.iter().enumerate() {
                _mm512_storeu_ps(kept.add((p * P + q) * NR), *v);
            }
        }
        for (r, row) in acc.iter_mut().enumerate() {
            let av = _mm512_set1_ps(*a.at(r, p));
            for (v, w) in row.iter_mut().zip(&bv) {
                *v = _mm512_fmadd_ps(av, *w, *v);
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        for (q, v) in row.iter().enumerate() {
            _mm512_storeu_ps(c.add(r * ldc + q * NR), *v);
        }
    }
}

/// R rows × P B panels (16·P columns) of a gathered product in AVX-512 registers: R·P
/// accumulators; per k step P loads of B, R broadcasts of A and R·P fused multiply-adds, the
/// same chains as the 6×16 tile. Three shapes run: 6×64 (P = 4: 4 + 6 loads per 24 FMAs),
/// 6×32 (P = 2; on Zen 4, 1 thread, 5–10 % faster than two 6×16 AVX2 tiles on 3×3 and 7×7
/// convolutions) and, for a lone panel, 12×16 (P = 1; on Zen 5 with a SiLU, YOLOv8n's
/// [1,3,160,160] → 16 stride-2 stem 73.9 → 60.0 µs, its [1,16,40,40] → 16 3×3 45.7 → 35.3 µs
/// against the 6×16 AVX2 tile). (12 rows × 32 columns, 24 accumulators, was 1.3–1.7× slower
/// than 6×32 on 3×3 and pointwise shapes here: twelve row pointers do not fit the registers
/// beside the tile. Twelve rows that start at consecutive values take the 12×32 panel tile
/// through [`RunA`] instead, one pointer for all twelve.)
///
/// # Safety
/// `rows[r] + offsets[p]` readable for r < R, p < kc; each of `b` kc rows of NR values; `c`
/// R rows of 16·P values at stride `ldc`; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile_avx512_gathered<const R: usize, const P: usize>(
    kc: usize,
    rows: &[*const f32; R],
    offsets: *const usize,
    b: [*const f32; P],
    c: *mut f32,
    ldc: usize,
    load: bool,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); P]; R];
    if load {
        for (r, row) in acc.iter_mut().enumerate() {
            for (q, v) in row.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(c.add(r * ldc + q * NR));
            }
        }
    }
    let rows = *rows;
    for p in 0..kc {
        let off = *offsets.add(p);
        let mut v = [_mm512_setzero_ps(); P];
        for (q, v) in v.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(b[q].add(p * NR));
        }
        for (r, row) in acc.iter_mut().enumerate() {
            let av = _mm512_set1_ps(*rows[r].add(off));
            for q in 0..P {
                row[q] = _mm512_fmadd_ps(av, v[q], row[q]);
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        for (q, v) in row.iter().enumerate() {
            _mm512_storeu_ps(c.add(r * ldc + q * NR), *v);
        }
    }
}

/// [`tile_avx512_gathered`] over the first `rows` (1 to MR) of `origins`: a product's last row
/// tile computes only the rows it has (the 49 positions of a 7×7 plane are eight tiles of six
/// and one of one; at the full height the last tile computed 5 rows for nothing, 54 rows for
/// 49). Each row is the same chain either way.
///
/// # Safety
/// As [`tile_avx512_gathered`] for its first `rows` rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_avx512_rows<const P: usize>(
    rows: usize,
    kc: usize,
    origins: &[*const f32; MR],
    offsets: *const usize,
    b: [*const f32; P],
    c: *mut f32,
    ldc: usize,
    load: bool,
) {
    fn first<const R: usize>(origins: &[*const f32; MR]) -> [*const f32; R] {
        std::array::from_fn(|r| origins[r])
    }
    match rows {
        1 => tile_avx512_gathered::<1, P>(kc, &first(origins), offsets, b, c, ldc, load),
        2 => tile_avx512_gathered::<2, P>(kc, &first(origins), offsets, b, c, ldc, load),
        3 => tile_avx512_gathered::<3, P>(kc, &first(origins), offsets, b, c, ldc, load),
        4 => tile_avx512_gathered::<4, P>(kc, &first(origins), offsets, b, c, ldc, load),
        5 => tile_avx512_gathered::<5, P>(kc, &first(origins), offsets, b, c, ldc, load),
        _ => tile_avx512_gathered::<MR, P>(kc, origins, offsets, b, c, ldc, load),
    }
}

/// What an AVX-512 core does with 512-bit FMAs ([`avx512_layout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Avx512Layout {
    /// Two 512-bit FMAs a cycle (not two 256-bit halves each).
    full_width: bool,
    /// The gathered product's L1-sized k blocks and 12×32 tiles.
    l1_blocks: bool,
}

/// For an AVX-512 CPU of this signature: whether it runs two 512-bit FMAs a cycle,
/// and whether the gathered product gives it L1-sized k blocks and 12×32 tiles. Intel's cores
/// stall on B from L2 without them (bench CNN −5 to −8 %, its 3×3 layers −8 to −12 % with
/// them, one thread). AMD's keep up with B from L2: Zen 4's half-width units (the blocks cost
/// 0–3 %) and, measured in one process on a Zen 5 (family 26 model 2), its full-width ones
/// too — there the L1 blocks and 12×32 tiles made the bench CNN 1–5 % and YOLOv8n 3 % slower,
/// no model faster.
fn avx512_layout(cpu: super::isa::Signature) -> Avx512Layout {
    let (full_width, l1_blocks) = match &cpu.vendor {
        b"GenuineIntel" => (true, true),
        b"AuthenticAMD" => (cpu.family >= 0x1a, false),
        _ => (false, false),
    };
    Avx512Layout {
        full_width,
        l1_blocks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chain the module promises, element by element.
    fn reference(
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        c0: Option<&[f32]>,
    ) -> Vec<f32> {
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = c0.map_or(0.0, |c0| c0[i * n + j]);
                for p in 0..k {
                    s = a[i * k + p].mul_add(b[p * n + j], s);
                }
                c[i * n + j] = s;
            }
        }
        c
    }

    /// `gemm` with A and B given by their (row, column) strides, C row-major m×n.
    #[allow(clippy::too_many_arguments)]
    fn product(
        (m, n, k): (usize, usize, usize),
        a: &[f32],
        (a_rs, a_cs): (usize, usize),
        b: &[f32],
        (rs, cs): (usize, usize),
        c: &mut [f32],
        accumulate: bool,
    ) {
        let b = StridedB { data: b, n, rs, cs };
        gemm(m, n, k, a, a_rs, a_cs, &b, c, n, accumulate);
    }

    fn values(len: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn every_element_is_one_in_order_chain_of_fused_multiply_adds() {
        // Edge tiles in both directions, k across several blocks, single and multi task.
        for &(m, n, k) in &[
            (1, 1, 1),
            (3, 40, 300),
            (20, 30, 300),
            (7, 17, 3),
            (13, 40, 300),
            (64, 200, 600),
            (100, 64, 520),
            (5, 3, 0),
            // One row: 1×128 tiles (eight panels), then pairs and a lone partial panel.
            (1, 300, 600),
            (1, 512, 128),
        ] {
            let a = values(m * k, 1);
            let b = values(k * n, 2);
            let want = reference(m, n, k, &a, &b, None);
            let mut c = vec![f32::NAN; m * n];
            product((m, n, k), &a, (k, 1), &b, (n, 1), &mut c, false);
            assert_eq!(bits(&c), bits(&want), "{m}x{n}x{k}");
            // Accumulating into C, B transposed, A transposed.
            let c0 = values(m * n, 3);
            let want = reference(m, n, k, &a, &b, Some(&c0));
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            let at: Vec<f32> = (0..m * k).map(|i| a[(i % m) * k + i / m]).collect();
            let mut c = c0.clone();
            product((m, n, k), &at, (1, m), &bt, (1, k), &mut c, true);
            assert_eq!(
                bits(&c),
                bits(&want),
                "{m}x{n}x{k} transposed, accumulating"
            );
            // B packed whole once (a constant weight), read where its panels lie.
            let packed = PackedB::new(
                k,
                n,
                &StridedB {
                    data: &b,
                    n,
                    rs: n,
                    cs: 1,
                },
            );
            let mut c = vec![f32::NAN; m * n];
            gemm(m, n, k, &a, k, 1, &packed, &mut c, n, false);
            let want = reference(m, n, k, &a, &b, None);
            assert_eq!(bits(&c), bits(&want), "{m}x{n}x{k} packed whole");
        }
    }

    #[test]
    fn a_product_of_a_few_rows_reads_b_in_place_or_by_bands_with_the_same_chains() {
        use crate::numeric::Rounding;
        // A few A panels: B read in place with prefetching (rows a whole row apart, narrow B)
        // or packed a band at a time (rows at least STREAMED_ROW_VALUES apart, B larger than
        // STREAMED_B_VALUES), each with a partial last panel, a partial A panel, k over
        // several blocks; 1 and 3 threads; B as stored and read rounded.
        let wide = STREAMED_ROW_VALUES + 21;
        for &(m, n, k) in &[
            (13, 100, 300),
            (16, 16, 520),
            (7, wide, 20),
            (16, wide, 300),
        ] {
            assert_eq!(
                k * n >= STREAMED_B_VALUES && n >= STREAMED_ROW_VALUES,
                n == wide,
                "{m}x{n}x{k} takes the path it is meant to"
            );
            let (a, b) = (values(m * k, 21), values(k * n, 22));
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let want = reference(m, n, k, &a, &b, None);
                let mut c = vec![f32::NAN; m * n];
                pool.install(|| product((m, n, k), &a, (k, 1), &b, (n, 1), &mut c, false));
                assert_eq!(bits(&c), bits(&want), "{m}x{n}x{k}, {threads} thread(s)");
                for rounding in [Rounding::F16, Rounding::BF16] {
                    let mut rounded = b.clone();
                    rounding.round_slice(&mut rounded);
                    let want = reference(m, n, k, &a, &rounded, None);
                    let rb = RoundedB {
                        b: StridedB {
                            data: &b,
                            n,
                            rs: n,
                            cs: 1,
                        },
                        rounding,
                    };
                    let mut c = vec![f32::NAN; m * n];
                    pool.install(|| gemm(m, n, k, &a, k, 1, &rb, &mut c, n, false));
                    assert_eq!(
                        bits(&c),
                        bits(&want),
                        "{m}x{n}x{k} rounded, {threads} thread(s)"
                    );
                }
            }
        }
    }

    #[test]
    fn a_weight_packed_whole_is_read_by_panels_with_the_same_chains() {
        use crate::numeric::Rounding;
        // One row (streamed panel by panel: full passes of four panels, partial ones, a
        // partial last panel) and several (the tiles over the panels); B as packed and read
        // rounded from the same panels (float16 by the rounding tile, bfloat16 packed per
        // call); with C's values or from zero; 1 and 3 threads. B holds a value beyond
        // float16's range, a float16 subnormal and a NaN.
        for &(m, n, k) in &[
            (1, 7, 5),
            (1, 64, 3),
            (1, 100, 300),
            (1, 1500, 41),
            (3, 33, 300),
            (16, 100, 520),
            (80, 40, 30),
        ] {
            let a = values(m * k, 31);
            let mut b = values(k * n, 32);
            b[0] = 70000.0;
            b[k * n / 2] = 3.0e-6;
            b[k * n - 1] = f32::NAN;
            let c0 = values(m * n, 33);
            let strided = StridedB {
                data: &b,
                n,
                rs: n,
                cs: 1,
            };
            let packed = PackedB::new(k, n, &strided);
            for accumulate in [false, true] {
                for rounding in [None, Some(Rounding::F16), Some(Rounding::BF16)] {
                    let mut rb = b.clone();
                    if let Some(r) = rounding {
                        r.round_slice(&mut rb);
                    }
                    let want = reference(m, n, k, &a, &rb, accumulate.then_some(&c0[..]));
                    for threads in [1, 3] {
                        let pool = rayon::ThreadPoolBuilder::new()
                            .num_threads(threads)
                            .build()
                            .unwrap();
                        let mut c = if accumulate {
                            c0.clone()
                        } else {
                            vec![f32::NAN; m * n]
                        };
                        pool.install(|| match rounding {
                            None => gemm(m, n, k, &a, k, 1, &packed, &mut c, n, accumulate),
                            Some(rounding) => {
                                let view = RoundedPackedB {
                                    packed: &packed,
                                    rounding,
                                };
                                gemm(m, n, k, &a, k, 1, &view, &mut c, n, accumulate)
                            }
                        });
                        assert_eq!(
                            bits(&c),
                            bits(&want),
                            "{m}x{n}x{k} {rounding:?}, {threads} thread(s), accumulate {accumulate}"
                        );
                    }
                    if m == 1 && rounding.is_none() {
                        let mut scalar = if accumulate { c0.clone() } else { vec![0.0; n] };
                        gemv_panels(Kernel::Scalar, &packed, &a, 1, &mut scalar, accumulate, 2);
                        assert_eq!(bits(&scalar), bits(&want), "1x{n}x{k} scalar");
                    }
                }
            }
        }
    }

    #[test]
    fn a_product_of_one_row_streams_b_in_bands_with_the_same_chains() {
        use crate::numeric::Rounding;
        // Bands of one or several panels, a partial last band, k not a multiple of the four
        // rows a pass takes, B rows longer than n (a slice of a wider matrix), 1 and 3
        // threads, the vector and the scalar bands.
        for &(n, k) in &[
            (1, 1),
            (7, 3),
            (16, 4),
            (33, 5),
            (1500, 301),
            (2100, 8),
            (40, 1027),
        ] {
            let rs = n + 5;
            let (a, b) = (values(2 * k, 11), values(k * rs, 12));
            let dense: Vec<f32> = (0..k * n).map(|i| b[(i / n) * rs + i % n]).collect();
            // A's elements two apart (a column of a row-major matrix, say).
            let a1: Vec<f32> = (0..k).map(|p| a[2 * p]).collect();
            let c0 = values(n, 13);
            for accumulate in [false, true] {
                let want = reference(1, n, k, &a1, &dense, accumulate.then_some(&c0[..]));
                for threads in [1, 3] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    let mut c = if accumulate {
                        c0.clone()
                    } else {
                        vec![f32::NAN; n]
                    };
                    pool.install(|| {
                        let bs = StridedB {
                            data: &b,
                            n,
                            rs,
                            cs: 1,
                        };
                        gemm(1, n, k, &a, 1, 2, &bs, &mut c, n, accumulate)
                    });
                    assert_eq!(bits(&c), bits(&want), "1x{n}x{k}, {threads} thread(s)");
                    let mut scalar = if accumulate {
                        c0.clone()
                    } else {
                        vec![f32::NAN; n]
                    };
                    let rows = BandRows {
                        data: &b,
                        rs,
                        rounding: None,
                    };
                    gemv_rows(
                        Kernel::Scalar,
                        n,
                        k,
                        &a,
                        2,
                        &rows,
                        &mut scalar,
                        accumulate,
                        threads,
                    );
                    assert_eq!(bits(&scalar), bits(&want), "1x{n}x{k} scalar");
                    // B read rounded: the chains over the rounded values, as packing gives.
                    for rounding in [Rounding::F16, Rounding::BF16] {
                        let mut rounded_dense = dense.clone();
                        rounding.round_slice(&mut rounded_dense);
                        let want =
                            reference(1, n, k, &a1, &rounded_dense, accumulate.then_some(&c0[..]));
                        let mut c = if accumulate {
                            c0.clone()
                        } else {
                            vec![f32::NAN; n]
                        };
                        pool.install(|| {
                            let rb = RoundedB {
                                b: StridedB {
                                    data: &b,
                                    n,
                                    rs,
                                    cs: 1,
                                },
                                rounding,
                            };
                            gemm(1, n, k, &a, 1, 2, &rb, &mut c, n, accumulate)
                        });
                        assert_eq!(bits(&c), bits(&want), "1x{n}x{k} rounded {rounding:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_vector_and_scalar_tiles_and_any_thread_count_give_the_same_bits() {
        let (m, n, k) = (30, 100, 700);
        let (a, b) = (values(m * k, 4), values(k * n, 5));
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut c = vec![0f32; m * n];
            pool.install(|| product((m, n, k), &a, (k, 1), &b, (n, 1), &mut c, false));
            c
        };
        assert_eq!(bits(&run(1)), bits(&run(3)));
        let mut scalar = values(MR * NR, 8);
        let mut vector = scalar.clone();
        let (ap, bp) = (values(MR * k, 6), values(NR * k, 7));
        let a = StridedA {
            data: ap.as_ptr(),
            rs: 1,
            cs: MR,
        };
        for rows in 1..=MR {
            unsafe {
                Kernel::Scalar.tile(
                    rows,
                    k,
                    a,
                    bp.as_ptr(),
                    NR,
                    scalar.as_mut_ptr(),
                    NR,
                    true,
                    false,
                );
                Kernel::detect().tile(
                    rows,
                    k,
                    a,
                    bp.as_ptr(),
                    NR,
                    vector.as_mut_ptr(),
                    NR,
                    true,
                    true,
                );
            }
            assert_eq!(bits(&scalar), bits(&vector), "{rows} rows");
        }
        // The tiles that round B to float16 or bfloat16 as they load (in place, rows NR + 3
        // apart; values beyond float16's range, subnormal in float16, a bfloat16 tie, NaN):
        // the scalar tile's bits on a rounded copy.
        for (rounding, rounding_kernel) in [
            crate::numeric::Rounding::F16,
            crate::numeric::Rounding::BF16,
        ]
        .into_iter()
        .filter_map(|r| Kernel::detect().rounding_b(r).map(|k| (r, k)))
        {
            let ld = NR + 3;
            let mut braw = values(ld * k, 9);
            braw[5] = 70000.0;
            braw[ld + 2] = 3e-6;
            braw[2 * ld + 7] = f32::NAN;
            braw[3 * ld + 1] = f32::from_bits(0x3F80_8000);
            braw[3 * ld + 2] = f32::from_bits(0x3F81_8000);
            let mut rounded = braw.clone();
            rounding.round_slice(&mut rounded);
            let panel: Vec<f32> = (0..k * NR)
                .map(|i| rounded[(i / NR) * ld + i % NR])
                .collect();
            for rows in 1..=MR {
                let mut scalar = values(MR * NR, 10);
                let mut vector = scalar.clone();
                unsafe {
                    Kernel::Scalar.tile(
                        rows,
                        k,
                        a,
                        panel.as_ptr(),
                        NR,
                        scalar.as_mut_ptr(),
                        NR,
                        true,
                        false,
                    );
                    rounding_kernel.tile(
                        rows,
                        k,
                        a,
                        braw.as_ptr(),
                        ld,
                        vector.as_mut_ptr(),
                        NR,
                        true,
                        true,
                    );
                }
                assert_eq!(
                    bits(&scalar),
                    bits(&vector),
                    "{rows} rows, B rounded as {rounding:?}"
                );
            }
        }
    }

    #[test]
    fn nan_and_infinity_propagate_and_zero_columns_past_n_stay_out_of_c() {
        let (m, n, k) = (2, 3, 2);
        let a = [f32::INFINITY, 1.0, 0.0, 1.0];
        let b = [0.0, 1.0, 2.0, f32::NAN, 1.0, 1.0];
        let mut c = vec![7f32; m * n + 1];
        product((m, n, k), &a, (k, 1), &b, (n, 1), &mut c, false);
        assert!(c[0].is_nan()); // inf·0
        assert_eq!(c[1], f32::INFINITY);
        assert!(c[3].is_nan()); // 0·0 + 1·NaN
        assert_eq!(c[4..], [1.0, 1.0, 7.0]); // the value past C untouched
    }

    #[test]
    fn gathered_rows_give_the_chain_of_the_matrix_they_form() {
        // Overlapping rows out of order, edge tiles both ways, k over two blocks, 1 and 3
        // threads; one panel (full or partial) and an odd panel count, whose lone panel takes
        // the 12×16 AVX-512 tile; four panels and more (the 6×64 tile), the last partial. Rows
        // also as a convolution's are, runs of 14 consecutive values (output rows) apart: whole
        // runs of 12 take the 12×32 tile, tiles across a run's end the gathered ones. Blocks
        // split by columns too where C's blocks would outgrow GATHERED_C_VALUES: B wider than
        // A is tall (whole rows per task, columns split, the last block partial) and a tall
        // product on one thread. Both block layouts: on cores with full-width 512-bit FMAs, k
        // in blocks of FULL_WIDTH_KC and runs of 12 through 12×32 tiles inside four panels. A
        // last row tile of each height from 1 to 5 (`tile_avx512_rows`).
        for (&(m, n, k), runs) in [
            (50, 70, 300),
            (44, 120, 270),
            (1, 1, 1),
            (7, 17, 3),
            (13, 40, 300),
            (50, 37, 520),
            (30, 24, 50),
            (48, 64, 9),
            (40, 16, 300),
            (25, 9, 20),
            (61, 48, 27),
            (40, 1100, 20),
            (400, 300, 10),
            // A last row tile of 3 or 5 rows, over four panels and over a pair.
            (51, 64, 40),
            (47, 96, 33),
            (45, 32, 20),
            (53, 40, 30),
            // B wider than A is tall with too few column groups for the threads' tasks: the
            // rows split too (one row tile a block at 3 threads).
            (49, 96, 60),
        ]
        .iter()
        .flat_map(|s| (0..3).map(move |rows| (s, rows)))
        {
            // Rows scattered; runs of 14 one value apart; runs two apart (a strided 1×1
            // convolution's rows).
            let image = values(4 * m + 2 * k + 40, 9);
            let rows: Vec<usize> = (0..m)
                .map(|i| match runs {
                    0 => i * 3 % (m + 1),
                    1 => i / 14 * 20 + i % 14,
                    _ => i / 14 * 40 + 2 * (i % 14),
                })
                .collect();
            let offsets: Vec<usize> = (0..k).map(|p| 2 * p + p % 3).collect();
            let a: Vec<f32> = (0..m * k)
                .map(|x| image[rows[x / k] + offsets[x % k]])
                .collect();
            let b = values(k * n, 2);
            let want = reference(m, n, k, &a, &b, None);
            let packed = PackedB::new(
                k,
                n,
                &StridedB {
                    data: &b,
                    n,
                    rs: n,
                    cs: 1,
                },
            );
            for (threads, l1_blocks) in [(1, false), (3, false), (1, true), (3, true)] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let c = std::sync::Mutex::new(vec![7f32; m * n]);
                let seen = std::sync::Mutex::new(vec![0; m * n]);
                let done = |blk: GatheredBlock| {
                    let (mut c, mut seen) = (c.lock().unwrap(), seen.lock().unwrap());
                    for i in blk.rows.clone() {
                        for j in blk.columns.clone() {
                            let at = (i - blk.rows.start) * blk.ld + j - blk.columns.start;
                            c[i * n + j] = blk.values[at];
                            seen[i * n + j] += 1;
                        }
                    }
                };
                let starts = GatheredRows::new(&image, &rows, &offsets);
                pool.install(|| gathered_product(&starts, &offsets, &packed, &done, l1_blocks));
                // The finished blocks cover C once.
                assert!(
                    seen.into_inner().unwrap().iter().all(|&s| s == 1),
                    "{m}x{n}x{k}"
                );
                let got = c.into_inner().unwrap();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{m}x{n}x{k}, rows {runs}, {threads} threads, L1 blocks {l1_blocks}"
                );
            }
        }
    }

    /// Where B is wider than A is tall but its column groups alone give fewer tasks than the
    /// pool aims at, the rows split into the fewest equal blocks that reach the target; with
    /// enough column groups, or on one thread, the rows stay whole. Where A is taller, its row
    /// blocks alone reach the target wherever each can hold 4 tiles.
    #[test]
    fn products_split_rows_before_columns() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        // (m, n, k) → row tiles per task. Wide: a 7² convolution's 256 channels (8 column
        // groups, 9 row tiles: 3 blocks of 3, not 5 + 4), 160 channels (5 groups: 4 blocks of
        // 3 tiles for 12), a ConvTranspose's 2048 columns (rows whole). Tall: a 28²
        // convolution's 131 row tiles (17 blocks of 8, B's columns whole), a 56² one's 523,
        // and a 14² one's 33 tiles, which keep blocks of 4 (9 blocks; the columns then split).
        for ((m, n, k), tb) in [
            ((49, 256, 2304), 3),
            ((72, 160, 2000), 3),
            ((196, 2048, 64), 33),
            ((784, 64, 576), 8),
            ((3136, 32, 288), 32),
            ((196, 128, 1152), 4),
        ] {
            let (got, target) = pool.install(|| gathered_tasks(m, n, k));
            assert_eq!(got, tb, "{m}x{n}x{k}");
            let (groups, m_tiles) = (n.div_ceil(NR).div_ceil(2), m.div_ceil(MR));
            let blocks = m_tiles.div_ceil(got);
            if n > m {
                assert!(
                    groups * blocks >= target,
                    "{m}x{n}x{k}: {blocks} row blocks"
                );
            } else if m_tiles >= 4 * target {
                assert!(blocks >= target, "{m}x{n}x{k}: {blocks} row blocks");
            }
        }
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        assert_eq!(one.install(|| gathered_tasks(49, 256, 1152)), (9, 1));
    }

    /// A small product splits into one task per thread, in the grid whose largest task is
    /// least: (m, n, k, threads) → (row tiles per task, tasks).
    #[test]
    fn small_products_take_one_task_per_thread() {
        for ((m, n, k, threads), want) in [
            // 5 row tiles × 4 pairs of panels: the columns in halves (5 × 2 against 3 × 4).
            ((25, 128, 1152, 2), (5, 2)),
            ((25, 128, 1152, 4), (5, 4)),
            // Three threads: 3 row blocks of 2 tiles (2 × 4) against 5 × 2 in column thirds.
            ((25, 128, 1152, 3), (2, 3)),
            // 17 tiles × 2 pairs: the columns (17 × 1) rather than the rows (9 × 2).
            ((100, 64, 576, 2), (17, 2)),
            // One pair of panels: the rows in halves, 134 tiles × 32 columns within
            // GATHERED_C_VALUES.
            ((1600, 32, 288, 2), (134, 2)),
            // 400 tiles × 32 columns exceed it: 4 row blocks.
            ((2400, 32, 200, 2), (100, 4)),
            // 131 row tiles (at least 32 a thread): the rows in halves, though the columns'
            // largest task is one tile smaller (131 × 1 against 66 × 2) — a 3×3/2 and a 1×1/2
            // convolution 32 → 64 on 28² outputs; 33 tiles keep the columns.
            ((784, 64, 288, 2), (66, 2)),
            ((784, 64, 32, 2), (66, 2)),
            ((196, 128, 576, 2), (33, 2)),
            // Ties (8 either way) split the larger operand: B's columns where it is wider
            // than A is tall, else A's rows.
            ((24, 128, 1152, 2), (4, 2)),
            ((48, 48, 576, 2), (4, 2)),
        ] {
            assert!(m * n * k < SMALL_GATHERED_PRODUCT && m * n * k >= PARALLEL_WORK);
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let got = pool.install(|| gathered_tasks(m, n, k));
            assert_eq!(got, want, "{m}x{n}x{k} on {threads} threads");
        }
    }

    /// The gathered product's L1 blocks go to Intel's AVX-512 cores only; the ISA report
    /// still names Zen 5's FMAs full width, Zen 4's halves.
    #[test]
    fn l1_blocks_are_for_intel_cores() {
        let cpu = |vendor: &[u8; 12], family| super::super::isa::Signature {
            vendor: *vendor,
            family,
            model: 0,
        };
        let layout = |full_width, l1_blocks| Avx512Layout {
            full_width,
            l1_blocks,
        };
        assert_eq!(avx512_layout(cpu(b"GenuineIntel", 6)), layout(true, true));
        assert_eq!(
            avx512_layout(cpu(b"AuthenticAMD", 0x19)),
            layout(false, false)
        );
        assert_eq!(
            avx512_layout(cpu(b"AuthenticAMD", 0x1a)),
            layout(true, false)
        );
        assert_eq!(
            avx512_layout(cpu(b"HygonGenuine", 0x18)),
            layout(false, false)
        );
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }
}
