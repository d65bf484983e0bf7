//! Depthwise 2-D convolutions (one input and one output channel per group): direct loops
//! instead of an im2col and a one-row product per channel.

use super::{ChannelFn, PaddedImage, Window};
use rayon::prelude::*;

/// Output columns a depthwise block computes at once (one AVX-512 vector, two AVX2 ones).
pub(super) const DW_LANES: usize = 16;
/// Depthwise blocks computed together: independent add chains the core overlaps.
const DW_BLOCKS: usize = 4;

/// Depthwise 2-D convolution of `x` ([N, C, H, W], weights [C, 1, kh, kw]) into `out`
/// ([N, C, oh, ow]), then per channel plane its bias and `finish`, while the plane is in cache.
/// Per channel (in parallel): the plane is padded and split into column-stride phases
/// ([`PaddedImage`]), so every tap of 16 consecutive outputs is 16 consecutive values; each
/// output is a sum from +0 of its taps' products in the GEMM's order (kh, then kw), a product
/// and an add where the GEMM fuses them — values may differ from that path in the last bit
/// (docs/numerics.md). A tap in the padding adds `0 · w`: nothing for a finite weight (the sum,
/// from +0, is never −0), NaN for an infinite or NaN one, as the im2col path.
#[allow(clippy::too_many_arguments)]
pub(super) fn depthwise_2d(
    x: &[f32],
    wt: &[f32],
    c: usize,
    in_sp: &[usize],
    w: &Window,
    bias: Option<&[f32]>,
    finish: Option<&ChannelFn>,
    out: &mut [f32],
) {
    let in_sz = in_sp[0] * in_sp[1];
    let (oh_n, ow_n) = (w.out[0], w.out[1]);
    let kt = w.kernel[0] * w.kernel[1];
    out.par_chunks_mut(oh_n * ow_n)
        .enumerate()
        .for_each(|(bc, dst)| {
            let ch = bc % c;
            let image = PaddedImage::new(&x[bc * in_sz..(bc + 1) * in_sz], 1, in_sp, w);
            let taps = image.tap_offsets(1, w);
            let ker = &wt[ch * kt..(ch + 1) * kt];
            // Every block of DW_LANES outputs: where its window origins start, where it goes.
            let blocks: Vec<(usize, usize, usize)> = (0..oh_n)
                .flat_map(|oh| {
                    (0..ow_n).step_by(DW_LANES).map(move |ow| {
                        (
                            oh * w.strides[0] * image.row + ow,
                            oh * ow_n + ow,
                            DW_LANES.min(ow_n - ow),
                        )
                    })
                })
                .collect();
            depthwise_plane(&image.data, &taps, ker, &blocks, dst);
            if let Some(b) = bias {
                let b = b[ch];
                dst.iter_mut().for_each(|v| *v += b);
            }
            if let Some(f) = finish {
                f(crate::ops::Piece::plane(ch, bc * oh_n * ow_n), dst);
            }
        });
}

/// One channel's blocks ([`depthwise_2d`]), compiled for the widest vectors the CPU has.
fn depthwise_plane(
    data: &[f32],
    taps: &[usize],
    ker: &[f32],
    blocks: &[(usize, usize, usize)],
    dst: &mut [f32],
) {
    // Every tap of every block reads DW_LANES values inside `data` (PaddedImage keeps that
    // many values of slack past its last plane).
    let reach = blocks.iter().map(|b| b.0).max().unwrap_or(0) + taps.iter().max().unwrap_or(&0);
    assert!(reach + DW_LANES <= data.len() && taps.len() == ker.len());
    assert!(blocks.iter().all(|&(_, at, n)| at + n <= dst.len()));
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has the feature; the reads and writes were bounded above.
            return unsafe { depthwise_plane_avx512(data, taps, ker, blocks, dst) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: as above.
            return unsafe { depthwise_plane_avx2(data, taps, ker, blocks, dst) };
        }
    }
    // SAFETY: the reads and writes were bounded above.
    unsafe { depthwise_plane_generic(data, taps, ker, blocks, dst) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn depthwise_plane_avx512(
    data: &[f32],
    taps: &[usize],
    ker: &[f32],
    blocks: &[(usize, usize, usize)],
    dst: &mut [f32],
) {
    depthwise_plane_generic(data, taps, ker, blocks, dst)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn depthwise_plane_avx2(
    data: &[f32],
    taps: &[usize],
    ker: &[f32],
    blocks: &[(usize, usize, usize)],
    dst: &mut [f32],
) {
    depthwise_plane_generic(data, taps, ker, blocks, dst)
}

/// # Safety
/// Every block's origin plus every tap plus DW_LANES lies inside `data`, and every block's
/// destination inside `dst` (checked by [`depthwise_plane`]).
#[inline(always)]
unsafe fn depthwise_plane_generic(
    data: &[f32],
    taps: &[usize],
    ker: &[f32],
    blocks: &[(usize, usize, usize)],
    dst: &mut [f32],
) {
    let mut groups = blocks.chunks_exact(DW_BLOCKS);
    for g in groups.by_ref() {
        let origins: [usize; DW_BLOCKS] = std::array::from_fn(|b| g[b].0);
        let acc = depthwise_sums(data, origins, taps, ker);
        for (sum, &(_, at, n)) in acc.iter().zip(g) {
            dst[at..at + n].copy_from_slice(&sum[..n]);
        }
    }
    for &(origin, at, n) in groups.remainder() {
        let [sum] = depthwise_sums(data, [origin], taps, ker);
        dst[at..at + n].copy_from_slice(&sum[..n]);
    }
}

/// The sums of `N` blocks of DW_LANES outputs, each tap's products added in tap order.
///
/// # Safety
/// `origin + tap + DW_LANES <= data.len()` for every origin and tap.
#[inline(always)]
unsafe fn depthwise_sums<const N: usize>(
    data: &[f32],
    origins: [usize; N],
    taps: &[usize],
    ker: &[f32],
) -> [[f32; DW_LANES]; N] {
    let mut acc = [[0f32; DW_LANES]; N];
    let base = data.as_ptr();
    for (&off, &k) in taps.iter().zip(ker) {
        for (sum, &origin) in acc.iter_mut().zip(&origins) {
            let src = &*(base.add(origin + off) as *const [f32; DW_LANES]);
            for (s, &v) in sum.iter_mut().zip(src) {
                *s += v * k;
            }
        }
    }
    acc
}

/// Channels a vector of the channels-last kernel holds: one block of channels.
const CL_LANES: usize = 16;

/// Depthwise weights as [`depthwise_2d_channels_last`] reads them: per block of CL_LANES
/// channels, tap by tap (kernel row, then column), the block's weights of that tap (zeros past
/// the last channel).
pub(super) struct TapMajor {
    values: Vec<f32>,
    taps: usize,
}

impl TapMajor {
    /// From [C, 1, kh, kw] weights of `taps` = kh · kw values per channel.
    pub(super) fn new(wv: &[f32], c: usize, taps: usize) -> TapMajor {
        const L: usize = CL_LANES;
        let mut values = vec![0f32; c.div_ceil(L) * taps * L];
        for (ch, ker) in wv.chunks_exact(taps).take(c).enumerate() {
            for (t, &k) in ker.iter().enumerate() {
                values[(ch / L * taps + t) * L + ch % L] = k;
            }
        }
        TapMajor { values, taps }
    }

    /// Block `b`'s weights: `taps` vectors.
    fn block(&self, b: usize) -> &[f32] {
        &self.values[b * self.taps * CL_LANES..(b + 1) * self.taps * CL_LANES]
    }
}

thread_local! {
    /// Each thread's padded, blocked input and its [position, channel] sums (kept between
    /// calls, as the gathered product keeps its blocks).
    static CL_IMAGE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    static CL_SUMS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether the channels-last kernel serves a depthwise convolution of `c` channels: with
/// channels across the lanes no lane idles on a plane narrower than a vector, and nothing is
/// paid per channel, so small planes of many channels (PP-OCRv4 det's 384 channels of 3×3) do
/// not pay a padded copy, block list and epilogue call per channel. Below one vector of
/// channels, lanes would idle instead.
pub(super) fn channels_last_pays(c: usize) -> bool {
    c >= CL_LANES
}

/// Multiply-adds below which one convolution runs on one thread (a fork-join costs more).
const CL_SERIAL_WORK: usize = 1 << 17;

/// Depthwise 2-D convolution of `x` ([N, C, H, W]) by `weights` into `out` ([N, C, oh, ow]),
/// then its bias and `finish`, with the channels across the vector lanes (ONNX Runtime's NCHWc
/// depthwise kernel works the same way). Each task takes some blocks of 16 channels and some
/// output rows of one image: it copies the input rows they read into a zero-padded, blocked
/// [block, row, column, lane] image, sums 16 channels of each output at a time, adds the bias,
/// and moves the [position, channel] results into the channel planes, `finish` running on the
/// task's part of each plane — or, where that part is shorter than the task's channels, on
/// each position's row of channels (`Channels::From`) before the move. Each output is the sum
/// from +0 of its taps' products in tap order (kernel row, then column), a product and an
/// add, then `+ bias`: the bits of [`depthwise_2d`], whose order it keeps.
#[allow(clippy::too_many_arguments)]
pub(super) fn depthwise_2d_channels_last(
    x: &[f32],
    weights: &TapMajor,
    n: usize,
    c: usize,
    in_sp: &[usize],
    w: &Window,
    bias: Option<&[f32]>,
    finish: Option<&ChannelFn>,
    out: &mut [f32],
) {
    const L: usize = CL_LANES;
    let (ih, iw) = (in_sp[0], in_sp[1]);
    let (ph, pw) = (w.pad_begin[0], w.pad_begin[1]);
    let hp = ih + ph + w.pad_end[0];
    let wp = iw + pw + w.pad_end[1];
    let (oh_n, ow_n) = (w.out[0], w.out[1]);
    let (kh_n, kw_n) = (w.kernel[0], w.kernel[1]);
    let (sh, sw) = (w.strides[0], w.strides[1]);
    let (dh, dw) = (w.dilations[0], w.dilations[1]);
    let (in_sz, o_sz) = (ih * iw, oh_n * ow_n);
    let blocks = c.div_ceil(L);
    assert_eq!(weights.taps, kh_n * kw_n);
    assert!(x.len() >= n * c * in_sz && out.len() >= n * c * o_sz);
    if n == 0 || o_sz == 0 || blocks == 0 {
        return;
    }
    let bias: Option<Vec<f32>> = bias.map(|b| {
        let mut padded = b[..c].to_vec();
        padded.resize(blocks * L, 0.0);
        padded
    });
    let bias = bias.as_deref();
    // Tasks of whole planes and all blocks where the work is small; else about two per thread,
    // over blocks first, then over rows.
    let work = n * blocks * L * o_sz * kh_n * kw_n;
    let threads = rayon::current_num_threads();
    let want = if work < CL_SERIAL_WORK {
        n
    } else {
        2 * threads
    };
    let block_chunks = want.div_ceil(n).clamp(1, blocks);
    let blocks_per_task = blocks.div_ceil(block_chunks);
    let row_chunks = want
        .div_ceil(n * blocks.div_ceil(blocks_per_task))
        .clamp(1, oh_n);
    let rows_per_task = oh_n.div_ceil(row_chunks);
    let tasks: Vec<(usize, usize, usize)> = (0..n)
        .flat_map(|img| {
            (0..blocks).step_by(blocks_per_task).flat_map(move |b0| {
                (0..oh_n)
                    .step_by(rows_per_task)
                    .map(move |r0| (img, b0, r0))
            })
        })
        .collect();
    // Per tap (kernel row, then column): its offset from a window's start in a block's image.
    let taps: Vec<usize> = (0..kh_n)
        .flat_map(|kh| (0..kw_n).map(move |kw| (kh * dh * wp + kw * dw) * L))
        .collect();
    let how = crate::ops::util::Transpose8::detect();
    let planes = crate::ops::util::DisjointPtr(out.as_mut_ptr());
    let task = |&(img, b0, r0): &(usize, usize, usize)| {
        let (b1, r1) = (
            (b0 + blocks_per_task).min(blocks),
            (r0 + rows_per_task).min(oh_n),
        );
        let (c0, c1) = (b0 * L, (b1 * L).min(c));
        let ld = (b1 - b0) * L;
        // The padded rows the task's outputs read.
        let (y0, y1) = (r0 * sh, (r1 - 1) * sh + (kh_n - 1) * dh + 1);
        let rows = y1 - y0;
        let block = rows * wp * L;
        let positions = (r1 - r0) * ow_n;
        crate::ops::util::with_scratch(&CL_IMAGE, Vec::new, |kept: &mut Vec<f32>| {
            if kept.len() < (b1 - b0) * block {
                kept.resize((b1 - b0) * block, 0.0);
            }
            let image = &mut kept[..(b1 - b0) * block];
            let xb = &x[(img * c + c0) * in_sz..(img * c + c1) * in_sz];
            let padding = (ph, pw, hp, wp);
            fill_channels_last(xb, c1 - c0, (ih, iw), padding, y0..y1, image, how);
            let image: &[f32] = image;
            crate::ops::util::with_scratch(&CL_SUMS, Vec::new, |kept: &mut Vec<f32>| {
                // Every value is written before it is read: no zeroing.
                if kept.len() < positions * ld {
                    kept.resize(positions * ld, 0.0);
                }
                let sums = &mut kept[..positions * ld];
                let geometry = Sliding {
                    rows: r0..r1,
                    first_row: y0,
                    ow_n,
                    wp,
                    kernel: (kh_n, kw_n),
                    step: (sh, dh),
                };
                // Where each output's window starts in a block's image: the same for every
                // block of the task, made once where the sliding kernel does not apply.
                let mut origins: Option<Vec<usize>> = None;
                for b in b0..b1 {
                    let image = &image[(b - b0) * block..(b - b0 + 1) * block];
                    let bias = bias.map(|v| &v[b * L..(b + 1) * L]);
                    let to = (b - b0) * L;
                    let slid = sw == 1
                        && dw == 1
                        && sliding_rows(image, &geometry, weights.block(b), bias, sums, to, ld);
                    if !slid {
                        let origins = origins.get_or_insert_with(|| {
                            (r0..r1)
                                .flat_map(|oh| {
                                    (0..ow_n).map(move |ow| ((oh * sh - y0) * wp + ow * sw) * L)
                                })
                                .collect()
                        });
                        let weights = weights.block(b);
                        channels_last_sums(image, &taps, weights, bias, origins, sums, to, ld);
                    }
                }
                let mut into = crate::ops::sgemm::GatheredBlock {
                    rows: r0 * ow_n..r1 * ow_n,
                    columns: c0..c1,
                    values: sums,
                    ld,
                };
                let rowwise = finish.is_some() && positions < c1 - c0;
                if let (true, Some(f)) = (rowwise, finish) {
                    let planes = super::PlanesOf {
                        plane: o_sz,
                        channels: c,
                        image: img,
                    };
                    super::finish_block_rows(&mut into, c0, None, f, planes);
                }
                // SAFETY: image `img`'s C planes of o_sz values lie in `out`; tasks take
                // disjoint (image, channels, rows), so no two write the same value.
                let planes = unsafe { planes.get().add(img * c * o_sz) };
                unsafe { super::block_into_planes(&into, None, planes, o_sz, None) };
                if let (false, Some(f)) = (rowwise, finish) {
                    for ch in c0..c1 {
                        // SAFETY: as above: this task's positions of channel `ch`.
                        let part = unsafe {
                            std::slice::from_raw_parts_mut(
                                planes.add(ch * o_sz + r0 * ow_n),
                                positions,
                            )
                        };
                        let start = (img * c + ch) * o_sz + r0 * ow_n;
                        f(crate::ops::Piece::plane(ch, start), part);
                    }
                }
            });
        });
    };
    if tasks.len() > 1 {
        tasks.par_iter().for_each(task);
    } else {
        tasks.iter().for_each(task);
    }
}

/// Output rows of one task for [`sliding_rows`]: which rows, the first padded input row its
/// image holds, their width, the padded image's row width, the kernel (rows, columns), and
/// the row stride and dilation.
struct Sliding {
    rows: std::ops::Range<usize>,
    first_row: usize,
    ow_n: usize,
    wp: usize,
    kernel: (usize, usize),
    step: (usize, usize),
}

/// The sums of [`channels_last_sums`] for one block of channels over whole output rows, where
/// the columns step by one (stride and dilation 1: the caller checks) and the kernel is 3 or 5
/// wide, in AVX-512 registers: eight consecutive outputs of a row read, per kernel row, eight
/// plus the kernel's width less one input vectors, each loaded once and used for every output
/// it reaches (the per-position kernel loads one per output and tap: 1.1 loads per
/// multiply-add against 0.3 here). Same products and adds in the same order (kernel row, then
/// column), so the same bits. Returns false (and writes nothing) where it does not apply.
fn sliding_rows(
    image: &[f32],
    geometry: &Sliding,
    weights: &[f32],
    bias: Option<&[f32]>,
    sums: &mut [f32],
    to: usize,
    ld: usize,
) -> bool {
    let Sliding {
        rows,
        first_row,
        ow_n,
        wp,
        kernel: (kh_n, kw_n),
        step: (sh, dh),
    } = geometry;
    if !matches!(kw_n, 3 | 5) || rows.is_empty() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // Every read lies inside the image: the last row's last window ends inside it; every
        // write inside `sums`.
        let last_read = (rows.end - 1) * sh + (kh_n - 1) * dh - first_row;
        assert!(rows.start * sh >= *first_row && ow_n + kw_n - 1 <= *wp);
        assert!((last_read + 1) * wp * CL_LANES <= image.len());
        assert!(
            weights.len() == kh_n * kw_n * CL_LANES && bias.is_none_or(|b| b.len() == CL_LANES)
        );
        assert!(to + CL_LANES <= ld && sums.len() == rows.len() * ow_n * ld);
        // SAFETY: the CPU has the feature; the reads and writes were bounded above.
        unsafe {
            if *kw_n == 3 {
                sliding_rows_avx512::<3>(image, geometry, weights, bias, sums, to, ld);
            } else {
                sliding_rows_avx512::<5>(image, geometry, weights, bias, sums, to, ld);
            }
        }
        return true;
    }
    let _ = (
        image, weights, bias, sums, to, ld, first_row, ow_n, wp, kh_n, sh, dh,
    );
    false
}

/// [`sliding_rows`] for a kernel KW wide.
///
/// # Safety
/// The bounds [`sliding_rows`] checks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sliding_rows_avx512<const KW: usize>(
    image: &[f32],
    geometry: &Sliding,
    weights: &[f32],
    bias: Option<&[f32]>,
    sums: &mut [f32],
    to: usize,
    ld: usize,
) {
    use std::arch::x86_64::*;
    const P: usize = 8;
    const L: usize = CL_LANES;
    let Sliding {
        rows,
        first_row,
        ow_n,
        wp,
        kernel: (kh_n, _),
        step: (sh, dh),
    } = geometry;
    let (ow_n, wp, kh_n, sh, dh) = (*ow_n, *wp, *kh_n, *sh, *dh);
    let (img, wts, out) = (image.as_ptr(), weights.as_ptr(), sums.as_mut_ptr().add(to));
    let b = bias.map(|b| _mm512_loadu_ps(b.as_ptr()));
    let finish = |a: __m512| b.map_or(a, |b| _mm512_add_ps(a, b));
    for (r, oh) in rows.clone().enumerate() {
        let first = r * ow_n;
        let row = |kh: usize, ow: usize| img.add(((oh * sh + kh * dh - first_row) * wp + ow) * L);
        let mut ow0 = 0;
        while ow0 + P <= ow_n {
            let mut acc = [_mm512_setzero_ps(); P];
            for kh in 0..kh_n {
                let line = row(kh, ow0);
                let mut xs = [_mm512_setzero_ps(); P + 4];
                for (i, x) in xs.iter_mut().enumerate().take(P + KW - 1) {
                    *x = _mm512_loadu_ps(line.add(i * L));
                }
                for kw in 0..KW {
                    let k = _mm512_loadu_ps(wts.add((kh * KW + kw) * L));
                    for (p, a) in acc.iter_mut().enumerate() {
                        *a = _mm512_add_ps(*a, _mm512_mul_ps(xs[p + kw], k));
                    }
                }
            }
            for (p, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(out.add((first + ow0 + p) * ld), finish(*a));
            }
            ow0 += P;
        }
        for ow in ow0..ow_n {
            let mut a = _mm512_setzero_ps();
            for kh in 0..kh_n {
                let line = row(kh, ow);
                for kw in 0..KW {
                    let k = _mm512_loadu_ps(wts.add((kh * KW + kw) * L));
                    a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_loadu_ps(line.add(kw * L)), k));
                }
            }
            _mm512_storeu_ps(out.add((first + ow) * ld), finish(a));
        }
    }
}

/// Copies padded rows `ys` of one image's [C, ih, iw] planes (`xb`, C = `c` channels) into
/// `image`, blocked: per CL_LANES channels a [row, column, lane] image of those rows
/// (`padding`: top and left padding, padded rows and columns), 8×8 blocks at a time. Only the
/// padding is zeroed (rows above and below the input, columns left and right, lanes past C):
/// the rest is overwritten.
fn fill_channels_last(
    xb: &[f32],
    c: usize,
    (ih, iw): (usize, usize),
    (ph, pw, hp, wp): (usize, usize, usize, usize),
    ys: std::ops::Range<usize>,
    image: &mut [f32],
    how: crate::ops::util::Transpose8,
) {
    const L: usize = CL_LANES;
    let (in_sz, row) = (ih * iw, wp * L);
    let plane = ys.len() * row;
    let blocks = c.div_ceil(L);
    assert!(xb.len() >= c * in_sz && image.len() >= blocks * plane);
    assert!(ph + ih <= hp && pw + iw <= wp && ys.end <= hp);
    // Padded row y holds input row y − ph where that exists.
    let inside = ys.start.max(ph)..ys.end.min(ph + ih);
    for b in 0..blocks {
        let plane = &mut image[b * plane..(b + 1) * plane];
        for (y, line) in ys.clone().zip(plane.chunks_exact_mut(row)) {
            if !inside.contains(&y) {
                line.fill(0.0);
                continue;
            }
            line[..pw * L].fill(0.0);
            line[(pw + iw) * L..].fill(0.0);
            if (b + 1) * L > c {
                for x in pw..pw + iw {
                    line[x * L + c - b * L..(x + 1) * L].fill(0.0);
                }
            }
        }
    }
    let at = |ch: usize, y: usize, x: usize| {
        (ch / L) * plane + ((y + ph - ys.start) * wp + x + pw) * L + ch % L
    };
    let (c8, w8) = (c / 8 * 8, iw / 8 * 8);
    for y in inside.start - ph..inside.end.max(inside.start) - ph {
        for x0 in (0..w8).step_by(8) {
            for c0 in (0..c8).step_by(8) {
                // SAFETY: rows c0..c0+8 of 8 values from (y, x0) lie in `xb` (c0 + 8 <= c,
                // x0 + 8 <= iw); lanes c0 % 16..+8 (within one block: 8 divides 16) of
                // positions x0..x0+8 of padded row y + ph, 16 apart, lie in `image` (y + ph is
                // one of `ys`, checked above).
                unsafe {
                    crate::ops::util::transpose_8x8(
                        xb.as_ptr().add(c0 * in_sz + y * iw + x0),
                        in_sz,
                        image.as_mut_ptr().add(at(c0, y, x0)),
                        L,
                        None,
                        how,
                    )
                }
            }
            for ch in c8..c {
                for x in x0..x0 + 8 {
                    image[at(ch, y, x)] = xb[ch * in_sz + y * iw + x];
                }
            }
        }
        for x in w8..iw {
            for ch in 0..c {
                image[at(ch, y, x)] = xb[ch * in_sz + y * iw + x];
            }
        }
    }
}

/// The sums of every position (`origins`: where its window starts in `image`, one block's
/// image) of one block of channels, plus `bias`, into columns `to..to + 16` of `sums`
/// ([position, channel], `ld` values a row), compiled for the widest vectors the CPU has.
#[allow(clippy::too_many_arguments)]
fn channels_last_sums(
    image: &[f32],
    taps: &[usize],
    weights: &[f32],
    bias: Option<&[f32]>,
    origins: &[usize],
    sums: &mut [f32],
    to: usize,
    ld: usize,
) {
    // Every tap of every position reads CL_LANES values inside `image`; the weights hold a
    // vector per tap; every write lies in `sums`.
    let reach = origins.iter().max().unwrap_or(&0) + taps.iter().max().unwrap_or(&0) + CL_LANES;
    assert!(reach <= image.len() || origins.is_empty());
    assert!(weights.len() == taps.len() * CL_LANES && bias.is_none_or(|b| b.len() == CL_LANES));
    assert!(to + CL_LANES <= ld && sums.len() == origins.len() * ld);
    let sums = &mut sums[to..];
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has the feature; the reads and writes were bounded above.
            return unsafe {
                channels_last_sums_avx512(image, taps, weights, bias, origins, sums, ld)
            };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: as above.
            return unsafe {
                channels_last_sums_avx2(image, taps, weights, bias, origins, sums, ld)
            };
        }
    }
    // SAFETY: the reads and writes were bounded above.
    unsafe { channels_last_sums_generic::<4>(image, taps, weights, bias, origins, sums, ld) }
}

/// [`channels_last_sums_generic`] in AVX-512 registers, eight positions at a time: eight add
/// chains hide an add's latency (the generic loop with eight positions of 16-value arrays
/// spilled them and ran 3–4× slower). Same operations in the same order, so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn channels_last_sums_avx512(
    image: &[f32],
    taps: &[usize],
    weights: &[f32],
    bias: Option<&[f32]>,
    origins: &[usize],
    sums: &mut [f32],
    ld: usize,
) {
    use std::arch::x86_64::*;
    const P: usize = 8;
    let (img, wts, out) = (image.as_ptr(), weights.as_ptr(), sums.as_mut_ptr());
    let b = bias.map(|b| _mm512_loadu_ps(b.as_ptr()));
    let finish = |a: __m512| b.map_or(a, |b| _mm512_add_ps(a, b));
    let mut groups = origins.chunks_exact(P);
    let mut p = 0;
    for g in groups.by_ref() {
        let mut acc = [_mm512_setzero_ps(); P];
        for (t, &off) in taps.iter().enumerate() {
            let k = _mm512_loadu_ps(wts.add(t * CL_LANES));
            for (a, &o) in acc.iter_mut().zip(g) {
                let v = _mm512_loadu_ps(img.add(o + off));
                *a = _mm512_add_ps(*a, _mm512_mul_ps(v, k));
            }
        }
        for (i, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(out.add((p + i) * ld), finish(*a));
        }
        p += P;
    }
    for &o in groups.remainder() {
        let mut a = _mm512_setzero_ps();
        for (t, &off) in taps.iter().enumerate() {
            let k = _mm512_loadu_ps(wts.add(t * CL_LANES));
            a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_loadu_ps(img.add(o + off)), k));
        }
        _mm512_storeu_ps(out.add(p * ld), finish(a));
        p += 1;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn channels_last_sums_avx2(
    image: &[f32],
    taps: &[usize],
    weights: &[f32],
    bias: Option<&[f32]>,
    origins: &[usize],
    sums: &mut [f32],
    ld: usize,
) {
    // Four positions: eight vectors of add chains (two per position) in 16 registers.
    channels_last_sums_generic::<4>(image, taps, weights, bias, origins, sums, ld)
}

/// `P` positions at a time (independent add chains that share each weight vector they load).
///
/// # Safety
/// Every origin plus every tap plus CL_LANES lies inside `image`, every position's row of
/// `ld` inside `sums` (checked by [`channels_last_sums`]).
#[inline(always)]
unsafe fn channels_last_sums_generic<const P: usize>(
    image: &[f32],
    taps: &[usize],
    weights: &[f32],
    bias: Option<&[f32]>,
    origins: &[usize],
    sums: &mut [f32],
    ld: usize,
) {
    let out = sums.as_mut_ptr();
    let store = |at: usize, a: &[f32; CL_LANES]| {
        let to = std::slice::from_raw_parts_mut(out.add(at * ld), CL_LANES);
        match bias {
            Some(b) => {
                for ((t, &v), &b) in to.iter_mut().zip(a).zip(b) {
                    *t = v + b;
                }
            }
            None => to.copy_from_slice(a),
        }
    };
    let mut groups = origins.chunks_exact(P);
    let mut p = 0;
    for g in groups.by_ref() {
        let at: [usize; P] = std::array::from_fn(|i| g[i]);
        let acc = channels_last_block(image, at, taps, weights);
        for (i, a) in acc.iter().enumerate() {
            store(p + i, a);
        }
        p += P;
    }
    for &o in groups.remainder() {
        let [a] = channels_last_block(image, [o], taps, weights);
        store(p, &a);
        p += 1;
    }
}

/// The sums of `N` positions' CL_LANES channels, each tap's products added in tap order.
///
/// # Safety
/// `at + tap + CL_LANES <= image.len()` for every position and tap; `wts` holds a vector per
/// tap.
#[inline(always)]
unsafe fn channels_last_block<const N: usize>(
    image: &[f32],
    at: [usize; N],
    taps: &[usize],
    wts: &[f32],
) -> [[f32; CL_LANES]; N] {
    let mut acc = [[0f32; CL_LANES]; N];
    let base = image.as_ptr();
    let wbase = wts.as_ptr();
    for (t, &off) in taps.iter().enumerate() {
        let k = &*(wbase.add(t * CL_LANES) as *const [f32; CL_LANES]);
        for (sum, &origin) in acc.iter_mut().zip(&at) {
            let src = &*(base.add(origin + off) as *const [f32; CL_LANES]);
            for ((s, &v), &k) in sum.iter_mut().zip(src).zip(k) {
                *s += v * k;
            }
        }
    }
    acc
}
