//! The planar product: a convolution with output positions across the vector lanes, written
//! straight into its channel planes. Along a run of consecutive output positions (an output
//! row of a padded, stride-phased image, or a pointwise convolution's whole plane) every tap
//! reads consecutive values, so a tile loads 16 positions of a tap as one vector, where the
//! image lies, and broadcasts each output channel's weight: no copy of the image's taps, and
//! no move of a [position, channel] block into the planes afterwards (the gathered product's
//! transposes were 6 % of the bench CNN on Intel).
//!
//! Every output is the chain the gathered product and [`crate::ops::sgemm::gemm`] give: fused
//! multiply-adds over the taps in order from +0, then the bias — added in registers before the
//! store, as is a layer's epilogue where it has the store form ([`StoreEpilogue`]), so that
//! nothing passes over the planes again (those passes were 5–6 % of a stem convolution).

use super::ChannelFn;
#[cfg(target_arch = "x86_64")]
use crate::ops::lanewise::apply16;
use crate::ops::lanewise::Lanewise;
use crate::ops::StoreEpilogue;
use rayon::prelude::*;

/// Positions one vector of a tile holds.
pub(super) const LANES: usize = 16;
/// Output channels a tile computes (rows of the tile; channels past the last are computed on
/// zero weights and never stored).
const TILE_CHANNELS: usize = 8;
/// The most vectors of positions a tile holds: 8 × 3 accumulators, per tap 8 broadcasts of
/// a weight and 3 loads of the image for 24 fused multiply-adds.
const TILE_VECTORS: usize = 3;
/// The fewest positions a task takes (its pieces of the planes are the epilogue's pieces).
const BAND_POSITIONS: usize = 256;
/// Products smaller than this (outputs × taps) run on the calling thread.
const PARALLEL_WORK: usize = 1 << 18;

/// A convolution's weights ([m, k], an output channel's taps in a row) tile by tile: per tile
/// of TILE_CHANNELS channels, per tap, the tile's weights together (zeros past channel m).
pub(crate) struct ChannelTiles {
    data: Vec<f32>,
    m: usize,
    k: usize,
}

impl ChannelTiles {
    pub(crate) fn new(w: &[f32], m: usize, k: usize) -> ChannelTiles {
        let tiles = m.div_ceil(TILE_CHANNELS);
        let mut data = vec![0f32; tiles * k * TILE_CHANNELS];
        for (ch, row) in w.chunks_exact(k.max(1)).take(m).enumerate() {
            let tile = &mut data[ch / TILE_CHANNELS * k * TILE_CHANNELS..];
            for (p, &v) in row.iter().enumerate() {
                tile[p * TILE_CHANNELS + ch % TILE_CHANNELS] = v;
            }
        }
        ChannelTiles { data, m, k }
    }

    fn tile(&self, t: usize) -> &[f32] {
        &self.data[t * self.k * TILE_CHANNELS..][..self.k * TILE_CHANNELS]
    }
}

/// Output positions `out..out + len` of a plane, whose window origins are the consecutive
/// values from `image` on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Run {
    pub image: usize,
    pub out: usize,
    pub len: usize,
}

/// The runs of a 2-D convolution over a padded image whose output row `oh` starts its windows
/// at `oh · row_step`: one per output row.
pub(super) fn row_runs(rows: usize, width: usize, row_step: usize) -> Vec<Run> {
    (0..rows)
        .map(|oh| Run {
            image: oh * row_step,
            out: oh * width,
            len: width,
        })
        .collect()
}

/// What the planar product does with its outputs: the bias as the tiles store them, then
/// `store` in the tiles too where given, else `finish` (a layer's rounding or epilogue) on each
/// finished piece of a plane, with the channel's index in the whole output and where the
/// plane's first value lies in it.
pub(super) struct Finish<'a> {
    pub bias: Option<&'a [f32]>,
    pub finish: Option<&'a ChannelFn<'a>>,
    /// `finish` in the form the tiles compute in registers before each store, where it does not
    /// round and starts at its affine stage (a float32 layer's BatchNormalization, residual
    /// Add, Relu); its channel and flat index are the output's, as for `finish`.
    pub store: Option<&'a StoreEpilogue<'a>>,
    /// Channel c of the product is channel `first_channel + c` of the output, its plane at
    /// `plane_start + c · o_sz` of the output's values.
    pub first_channel: usize,
    pub plane_start: usize,
}

/// `out` ([m, o_sz] planes) = the convolution whose output positions are `runs` (one after
/// another in plane order, covering 0..o_sz), tap p of a run's position i at
/// `image[run.image + i + offsets[p]]`, by `weights`; then `finish` on each task's piece of
/// each plane, in its cache. Every output is the in-order chain of its taps' fused
/// multiply-adds from +0, then the bias.
pub(super) fn planar_product(
    image: &[f32],
    runs: &[Run],
    offsets: &[usize],
    weights: &ChannelTiles,
    out: &mut [f32],
    o_sz: usize,
    finish: &Finish,
) {
    let (m, k) = (weights.m, weights.k);
    assert_eq!(offsets.len(), k, "{} offsets for {k} taps", offsets.len());
    assert!(out.len() >= m * o_sz);
    if m == 0 || o_sz == 0 {
        return;
    }
    let reach = offsets.iter().max().copied().unwrap_or(0);
    let mut next = 0;
    for run in runs {
        assert!(
            run.out == next && (run.len == 0 || run.image + run.len + reach <= image.len()),
            "a run reads past the image or leaves a gap in its plane"
        );
        next += run.len;
    }
    assert_eq!(next, o_sz, "the runs store {next} of {o_sz} outputs");
    assert!(
        finish.bias.is_none_or(|b| b.len() >= m),
        "a bias per channel"
    );
    if let Some(e) = finish.store {
        let channels = finish.first_channel + m;
        assert!(
            e.rounds.is_empty() && !e.affine_done,
            "a store epilogue the tiles compute"
        );
        assert!(e.scale.len() >= channels && e.shift.len() >= channels);
        assert!(e
            .operand
            .is_none_or(|o| o.len() >= finish.plane_start + m * o_sz));
    }
    let threads = rayon::current_num_threads();
    let parallel = threads > 1 && m * o_sz * k >= PARALLEL_WORK;
    let target = if parallel { 8 * threads } else { 1 };
    let want = o_sz.div_ceil(target).max(BAND_POSITIONS);
    // A run longer than a band (a pointwise convolution's plane) in pieces of whole tiles.
    let step = want.div_ceil(TILE_VECTORS * LANES) * TILE_VECTORS * LANES;
    let split: Vec<Run>;
    let runs = if runs.iter().any(|r| r.len > step) {
        split = runs
            .iter()
            .flat_map(|r| {
                (0..r.len).step_by(step).map(move |i| Run {
                    image: r.image + i,
                    out: r.out + i,
                    len: step.min(r.len - i),
                })
            })
            .collect();
        &split[..]
    } else {
        runs
    };
    let bands = bands(runs, want);
    let tiles = m.div_ceil(TILE_CHANNELS);
    // Where bands are fewer than the tasks aimed at, the channel tiles split too.
    let per_group = tiles.div_ceil(target.div_ceil(bands.len()).clamp(1, tiles));
    let groups = tiles.div_ceil(per_group);
    let planes = super::super::util::DisjointPtr(out.as_mut_ptr());
    let avx512 = has_avx512();
    let task = |t: usize| {
        let (band, group) = (&bands[t / groups], t % groups);
        let tile_range = group * per_group..((group + 1) * per_group).min(tiles);
        // The band's tiles of positions: (where in the image, where in a plane, how many).
        let mut segments = Vec::new();
        for run in &runs[band.runs.clone()] {
            let vectors = run.len.div_ceil(LANES);
            let pieces = vectors.div_ceil(TILE_VECTORS);
            let mut done = 0;
            for piece in 0..pieces {
                // Vectors spread evenly over the run's tiles (7 vectors: 2, 2, 3).
                let take = vectors * (piece + 1) / pieces - vectors * piece / pieces;
                let len = (take * LANES).min(run.len - done);
                segments.push((run.image + done, run.out + done, len));
                done += len;
            }
        }
        let one = |tile: usize, &(at, out, len): &(usize, usize, usize)| {
            let channels = TILE_CHANNELS.min(m - tile * TILE_CHANNELS);
            // SAFETY: the run's positions read inside `image` (asserted above, with a masked
            // last vector); the tile writes `channels` planes of this task's channels at
            // those positions, which no other task writes.
            // The bias, the epilogue's constants and operand: the tile's channels', at the
            // same positions (asserted above).
            unsafe {
                let first = tile * TILE_CHANNELS;
                let operands = Tile {
                    k,
                    w: weights.tile(tile).as_ptr(),
                    a: image.as_ptr().add(at),
                    offsets: offsets.as_ptr(),
                    c: planes.get().add(first * o_sz + out),
                    ldc: o_sz,
                    channels,
                    bias: finish
                        .bias
                        .map_or(std::ptr::null(), |b| b.as_ptr().add(first)),
                    store: finish.store.map(|e| TileStore {
                        epilogue: e,
                        channel: finish.first_channel + first,
                        start: finish.plane_start + first * o_sz + out,
                    }),
                };
                tile_dispatch(avx512, operands, len);
            }
        };
        for tile in tile_range.clone() {
            for segment in &segments {
                one(tile, segment);
            }
        }
        let positions = band.positions.clone();
        let channels = tile_range.start * TILE_CHANNELS..(tile_range.end * TILE_CHANNELS).min(m);
        // `finish` on this task's pieces of its planes, where the tiles did not apply it.
        let Some(f) = finish.finish.filter(|_| finish.store.is_none()) else {
            return;
        };
        for ch in channels {
            // SAFETY: this task's positions of its channel's plane, written above: no other
            // task touches them.
            let piece = unsafe {
                std::slice::from_raw_parts_mut(
                    planes.get().add(ch * o_sz + positions.start),
                    positions.len(),
                )
            };
            let start = finish.plane_start + ch * o_sz + positions.start;
            f(
                super::super::Piece::plane(finish.first_channel + ch, start),
                piece,
            );
        }
    };
    let tasks = bands.len() * groups;
    if parallel {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// Consecutive runs one task takes, and the positions of the plane they cover.
struct Band {
    runs: std::ops::Range<usize>,
    positions: std::ops::Range<usize>,
}

/// The runs cut into bands of whole runs of at least `want` positions (the last may hold
/// fewer), each covering consecutive positions of the plane.
fn bands(runs: &[Run], want: usize) -> Vec<Band> {
    let mut bands = Vec::new();
    let (mut first, mut taken) = (0, 0);
    for (i, run) in runs.iter().enumerate() {
        taken += run.len;
        if taken >= want || i + 1 == runs.len() {
            let start = runs[first].out;
            bands.push(Band {
                runs: first..i + 1,
                positions: start..start + taken,
            });
            (first, taken) = (i + 1, 0);
        }
    }
    bands
}

/// How a convolution's outputs form the planar product's runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Layout {
    /// A pointwise convolution's plane, one run.
    Plane,
    /// One run per output row.
    Rows,
}

/// Whether a convolution (`pointwise`: 1×1, stride 1, unpadded; else 2-D over a padded image
/// under `w`) takes the planar product rather than the gathered one, and its runs: on a CPU
/// with AVX-512 (elsewhere the gathered product's AVX2 tiles are the faster), where the runs
/// fill at least 9/10 of the lanes of their vectors and most tiles hold three vectors — a
/// pointwise plane of at least 256 values, output rows of at least 48. It pays where the
/// product is short next to the output the gathered product would move into planes (stems,
/// pointwise convolutions: 10–30 % a layer on Intel and Zen 4); 3×3 convolutions whose rows
/// leave lanes empty ran 4–26 % slower than on the gathered product's 12×32 tiles
/// (performance-history, "The planar product").
pub(super) fn layout(pointwise: bool, w: &super::Window) -> Option<Layout> {
    if !has_avx512() {
        return None;
    }
    if pointwise {
        let plane: usize = w.out.iter().product();
        return (plane >= BAND_POSITIONS).then_some(Layout::Plane);
    }
    if w.out.len() != 2 {
        return None;
    }
    let width = w.out[1];
    let lanes = width.div_ceil(LANES) * LANES;
    (width >= TILE_VECTORS * LANES && 10 * width >= 9 * lanes).then_some(Layout::Rows)
}

fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// One tile's operands: tap p of position i read at `a[offsets[p] + i]` (p < k), the tile's
/// weights `w` (k × TILE_CHANNELS), its first `channels` planes written from `c`, `ldc` apart,
/// each value plus its channel's `bias[r]` (null: none), then through `store`.
#[derive(Clone, Copy)]
struct Tile<'a> {
    k: usize,
    w: *const f32,
    a: *const f32,
    offsets: *const usize,
    c: *mut f32,
    ldc: usize,
    channels: usize,
    bias: *const f32,
    store: Option<TileStore<'a>>,
}

/// A store epilogue on a tile's values: the tile's channel r is the output's `channel + r`,
/// its value at `at` from the tile's `c` the output's flat index `start + at`.
#[derive(Clone, Copy)]
struct TileStore<'a> {
    epilogue: &'a StoreEpilogue<'a>,
    channel: usize,
    start: usize,
}

impl TileStore<'_> {
    /// The finished value of `x`, the tile's channel `r`, at `at` from the tile's `c`.
    #[inline(always)]
    fn value(&self, x: f32, r: usize, at: usize) -> f32 {
        self.epilogue.value(x, self.channel + r, self.start + at)
    }
}

/// `tile`'s `len` ≤ TILE_VECTORS · LANES positions.
///
/// # Safety
/// As [`tile_scalar`]; `avx512` only where the CPU has AVX-512F.
unsafe fn tile_dispatch(avx512: bool, tile: Tile, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if avx512 {
        let vectors = len.div_ceil(LANES);
        let masked = !len.is_multiple_of(LANES);
        // The positions of the last vector.
        let last = ((1u32 << (len - (vectors - 1) * LANES)) - 1) as u16;
        let run = match (vectors, masked) {
            (1, false) => tile_avx512::<1, false>,
            (2, false) => tile_avx512::<2, false>,
            (3, false) => tile_avx512::<3, false>,
            (1, true) => tile_avx512::<1, true>,
            (2, true) => tile_avx512::<2, true>,
            _ => tile_avx512::<3, true>,
        };
        run(tile, last);
        return;
    }
    let _ = avx512;
    tile_scalar(tile, len);
}

/// The tile in scalar code: the same chains, the same bias and epilogue.
///
/// # Safety
/// `a[offsets[p] + i]` readable for p < k, i < len; `w` k · TILE_CHANNELS values; `c` writable
/// at `r · ldc + i` for r < channels, i < len.
unsafe fn tile_scalar(t: Tile, len: usize) {
    for r in 0..t.channels {
        for i in 0..len {
            let mut acc = 0f32;
            for p in 0..t.k {
                let x = *t.a.add(*t.offsets.add(p) + i);
                acc = (*t.w.add(p * TILE_CHANNELS + r)).mul_add(x, acc);
            }
            if !t.bias.is_null() {
                acc += *t.bias.add(r);
            }
            if let Some(s) = &t.store {
                acc = s.value(acc, r, r * t.ldc + i);
            }
            *t.c.add(r * t.ldc + i) = acc;
        }
    }
}

/// TILE_CHANNELS channels × P vectors of positions in AVX-512 registers; with MASKED, the last
/// vector holds the positions `last` marks (loaded and stored under the mask: nothing past the
/// run is read or written).
///
/// # Safety
/// As [`tile_scalar`] with len = 16·(P − 1) + the bits of `last` (all 16 without MASKED);
/// the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile_avx512<const P: usize, const MASKED: bool>(t: Tile, last: u16) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); P]; TILE_CHANNELS];
    for p in 0..t.k {
        let src = t.a.add(*t.offsets.add(p));
        let x: [__m512; P] = std::array::from_fn(|q| {
            if MASKED && q + 1 == P {
                _mm512_maskz_loadu_ps(last, src.add(q * LANES))
            } else {
                _mm512_loadu_ps(src.add(q * LANES))
            }
        });
        let wp = t.w.add(p * TILE_CHANNELS);
        for (r, row) in acc.iter_mut().enumerate() {
            let wv = _mm512_set1_ps(*wp.add(r));
            for (v, x) in row.iter_mut().zip(&x) {
                *v = _mm512_fmadd_ps(wv, *x, *v);
            }
        }
    }
    // The accumulators by value: handed over by reference, they were written to the stack on
    // every tap (free on Zen 5, the stem 2.6× slower on Intel).
    store_tile::<P, MASKED>(&t, acc, last);
}

/// [`tile_avx512`]'s stores: each value plus its channel's bias, through the store epilogue.
/// Not inlined, so that the epilogue's constants do not take the product loop's registers;
/// the epilogue's stages decided once a tile, in [`affine_stores`]' constants (decided per
/// vector, reading the epilogue again after each store, which could alias it, the stem
/// convolution ran 2–5 % slower than with a pass over the planes afterwards).
///
/// # Safety
/// As [`tile_avx512`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline(never)]
unsafe fn store_tile<const P: usize, const MASKED: bool>(
    t: &Tile,
    acc: [[std::arch::x86_64::__m512; P]; TILE_CHANNELS],
    last: u16,
) {
    use std::arch::x86_64::*;
    let (c, ldc, bias) = (t.c, t.ldc, t.bias);
    let Some(store) = t.store else {
        for (r, row) in acc.iter().enumerate().take(t.channels) {
            for (q, &v) in row.iter().enumerate() {
                let mask = if MASKED && q + 1 == P { last } else { u16::MAX };
                let v = match bias.is_null() {
                    true => v,
                    false => _mm512_add_ps(v, _mm512_set1_ps(*bias.add(r))),
                };
                _mm512_mask_storeu_ps(c.add(r * ldc + q * LANES), mask, v);
            }
        }
        return;
    };
    let e = store.epilogue;
    let stages = Stages {
        c,
        ldc,
        bias,
        scale: e.scale.as_ptr().add(store.channel),
        shift: e.shift.as_ptr().add(store.channel),
        operand: e
            .operand
            .map_or(std::ptr::null(), |o| o.as_ptr().add(store.start)),
        operand_first: e.operand_first,
        channels: t.channels,
    };
    match e.last {
        Some(Lanewise::Relu) => {
            affine_stores::<P, MASKED, RELU>(stages, &acc, last, Lanewise::Relu)
        }
        Some(l) => affine_stores::<P, MASKED, OTHER>(stages, &acc, last, l),
        None => affine_stores::<P, MASKED, NONE>(stages, &acc, last, Lanewise::Relu),
    }
}

/// [`store_tile`]'s operands for [`affine_stores`].
#[derive(Clone, Copy)]
struct Stages {
    c: *mut f32,
    ldc: usize,
    bias: *const f32,
    /// The tile's first channel's.
    scale: *const f32,
    shift: *const f32,
    /// At the tile's `c` (null: none).
    operand: *const f32,
    operand_first: bool,
    channels: usize,
}

/// [`affine_stores`]' last stage: none, Relu, or another (`apply16` per vector).
const NONE: u8 = 0;
const RELU: u8 = 1;
const OTHER: u8 = 2;

/// [`store_tile`]'s stores through the epilogue, its last stage `stage` as LAST says:
/// [`StoreEpilogue::value`]'s operations in its order, for an epilogue that does not round and
/// starts at the affine stage.
///
/// # Safety
/// As [`store_tile`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn affine_stores<const P: usize, const MASKED: bool, const LAST: u8>(
    st: Stages,
    acc: &[[std::arch::x86_64::__m512; P]; TILE_CHANNELS],
    last: u16,
    stage: Lanewise,
) {
    use std::arch::x86_64::*;
    for (r, row) in acc.iter().enumerate().take(st.channels) {
        let b = match st.bias.is_null() {
            true => _mm512_setzero_ps(),
            false => _mm512_set1_ps(*st.bias.add(r)),
        };
        let (a, s) = (
            _mm512_set1_ps(*st.scale.add(r)),
            _mm512_set1_ps(*st.shift.add(r)),
        );
        for (q, &x) in row.iter().enumerate() {
            let mask = if MASKED && q + 1 == P { last } else { u16::MAX };
            let at = r * st.ldc + q * LANES;
            // No bias: the chain as it is (+0 would turn a −0 into +0).
            let x = match st.bias.is_null() {
                true => x,
                false => _mm512_add_ps(x, b),
            };
            let mut v = _mm512_add_ps(_mm512_mul_ps(x, a), s);
            if !st.operand.is_null() {
                let o = _mm512_maskz_loadu_ps(mask, st.operand.add(at));
                // In the Add's order (where both are NaN, the first's payload comes out).
                v = match st.operand_first {
                    true => _mm512_add_ps(o, v),
                    false => _mm512_add_ps(v, o),
                };
            }
            v = match LAST {
                RELU => apply16(Lanewise::Relu, v),
                OTHER => apply16(stage, v),
                _ => v,
            };
            _mm512_mask_storeu_ps(st.c.add(at), mask, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per output (channel, run position): the in-order chain of its taps from +0, then the
    /// bias — what the planar product promises.
    fn reference(
        image: &[f32],
        runs: &[Run],
        offsets: &[usize],
        w: &[f32],
        m: usize,
        o_sz: usize,
        bias: Option<&[f32]>,
    ) -> Vec<f32> {
        let k = offsets.len();
        let mut out = vec![0f32; m * o_sz];
        for ch in 0..m {
            for run in runs {
                for i in 0..run.len {
                    let mut acc = 0f32;
                    for (p, &off) in offsets.iter().enumerate() {
                        acc = image[run.image + i + off].mul_add(w[ch * k + p], acc);
                    }
                    out[ch * o_sz + run.out + i] = bias.map_or(acc, |b| acc + b[ch]);
                }
            }
        }
        out
    }

    /// `f` on a pool of `threads` threads.
    fn on_threads<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
        pool.expect("a thread pool").install(f)
    }

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 37 + seed * 11) % 101) as f32 - 50.0) / 17.0)
            .collect()
    }

    /// Runs of every length from 1 to 3 vectors and past (masked last vectors, tiles spread
    /// over a run; one run of a plane split into bands), channel counts off the tile (the
    /// last tile's spare rows never stored), one and several threads, with and without a
    /// bias; the scalar and vector tiles alike.
    #[test]
    fn every_output_is_the_in_order_chain_of_its_taps_then_the_bias() {
        for (m, width, rows, k) in [
            (8usize, 56usize, 4usize, 9usize),
            (3, 1, 5, 4),
            (13, 17, 3, 27),
            (32, 112, 2, 147),
            (20, 33, 7, 5),
            (8, 48, 1, 300),
            (9, 2000, 1, 20),
        ] {
            let row_step = width + 9;
            let offsets: Vec<usize> = (0..k).map(|p| p * 3 % (2 * row_step + 5)).collect();
            let runs = row_runs(rows, width, row_step);
            let o_sz = rows * width;
            let image = values(rows * row_step + 2 * row_step + 5 + width, m);
            let mut w = values(m * k, 7);
            w[k + 1] = f32::INFINITY;
            let bias: Vec<f32> = (0..m).map(|c| c as f32 * 0.5 - 1.0).collect();
            let tiles = ChannelTiles::new(&w, m, k);
            for with_bias in [false, true] {
                let bias = with_bias.then_some(&bias[..]);
                let want = reference(&image, &runs, &offsets, &w, m, o_sz, bias);
                for threads in [1, 3] {
                    let mut got = vec![f32::NAN; m * o_sz];
                    let finish = Finish {
                        bias,
                        finish: None,
                        first_channel: 0,
                        store: None,
                        plane_start: 0,
                    };
                    on_threads(threads, || {
                        planar_product(&image, &runs, &offsets, &tiles, &mut got, o_sz, &finish)
                    });
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            w.to_bits(),
                            "m {m} width {width} k {k} output {i}: {g} vs {w}"
                        );
                    }
                }
            }
            // The scalar tile alone, as a CPU without AVX-512 runs it.
            let mut got = vec![f32::NAN; m * o_sz];
            for t in 0..m.div_ceil(TILE_CHANNELS) {
                for run in &runs {
                    // SAFETY: the run lies inside the image and the planes (as above).
                    let operands = Tile {
                        k,
                        w: tiles.tile(t).as_ptr(),
                        a: image[run.image..].as_ptr(),
                        offsets: offsets.as_ptr(),
                        c: got[t * TILE_CHANNELS * o_sz + run.out..].as_mut_ptr(),
                        ldc: o_sz,
                        channels: TILE_CHANNELS.min(m - t * TILE_CHANNELS),
                        bias: std::ptr::null(),
                        store: None,
                    };
                    unsafe { tile_scalar(operands, run.len) }
                }
            }
            let want = reference(&image, &runs, &offsets, &w, m, o_sz, None);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    /// Each task hands `finish` its piece of each plane once: the pieces cover every plane
    /// exactly, with the channel and start of the whole output.
    #[test]
    fn finish_sees_each_planes_positions_once_where_they_lie() {
        let (m, width, rows, k) = (11usize, 40usize, 30usize, 9usize);
        let runs = row_runs(rows, width, width + 2);
        let offsets: Vec<usize> = (0..k).collect();
        let image = values(rows * (width + 2) + 64, 1);
        let tiles = ChannelTiles::new(&values(m * k, 2), m, k);
        let o_sz = rows * width;
        let seen = std::sync::Mutex::new(vec![0u8; 2 * m * o_sz]);
        let record = |piece: super::super::super::Piece, v: &mut [f32]| {
            let mut seen = seen.lock().unwrap();
            assert_eq!(piece.step, 1);
            for i in 0..v.len() {
                seen[piece.start + i] += 1;
            }
            let super::super::super::Channels::One(ch) = piece.channels else {
                panic!("a piece of one plane")
            };
            assert_eq!((piece.start - m * o_sz) / o_sz, ch - 5);
        };
        let finish = Finish {
            bias: None,
            finish: Some(&record),
            first_channel: 5,
            plane_start: m * o_sz,
            store: None,
        };
        let mut out = vec![0f32; m * o_sz];
        on_threads(2, || {
            planar_product(&image, &runs, &offsets, &tiles, &mut out, o_sz, &finish)
        });
        let seen = seen.into_inner().unwrap();
        assert!(seen[..m * o_sz].iter().all(|&s| s == 0));
        assert!(seen[m * o_sz..].iter().all(|&s| s == 1));
    }

    /// A float32 epilogue in store form computed in the tiles gives the bits of the same
    /// epilogue applied to the finished planes ([`StoreEpilogue::value`]): with and without
    /// an operand (in either order) and a last stage; NaNs, signed zeros and infinities in the
    /// operand; the vector tiles (one and three threads, masked last vectors) and the scalar
    /// tile.
    #[test]
    fn an_epilogue_in_the_tiles_is_the_epilogue_on_the_planes() {
        let (m, width, rows, k) = (13usize, 53usize, 5usize, 9usize);
        let row_step = width + 2;
        let runs = row_runs(rows, width, row_step);
        let offsets: Vec<usize> = (0..k).map(|p| p % 3 + p / 3 * row_step).collect();
        let image = values(rows * row_step + 3 * row_step, 3);
        let w = values(m * k, 4);
        let tiles = ChannelTiles::new(&w, m, k);
        let o_sz = rows * width;
        let (first, start) = (5usize, m * o_sz);
        let bias: Vec<f32> = (0..m).map(|c| c as f32 * 0.25 - 1.5).collect();
        let scale: Vec<f32> = (0..first + m).map(|c| 0.75 - c as f32 * 0.1).collect();
        let shift: Vec<f32> = (0..first + m).map(|c| c as f32 * 0.3 - 2.0).collect();
        let mut operand = values(start + m * o_sz, 9);
        for (i, special) in [
            f32::NAN,
            -0.0,
            0.0,
            f32::INFINITY,
            -f32::INFINITY,
            -f32::NAN,
        ]
        .into_iter()
        .enumerate()
        {
            operand[start + 101 * i + 7] = special;
        }
        let mut cases = Vec::new();
        for operand in [None, Some(&operand[..])] {
            for operand_first in [false, true] {
                for last in [None, Some(Lanewise::Relu), Some(Lanewise::Clip(-0.5, 0.5))] {
                    cases.push(StoreEpilogue {
                        scale: &scale,
                        shift: &shift,
                        operand,
                        operand_first,
                        last,
                        rounds: Default::default(),
                        affine_done: false,
                    });
                }
            }
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for e in &cases {
            for bias in [None, Some(&bias[..])] {
                let mut want = reference(&image, &runs, &offsets, &w, m, o_sz, bias);
                for (i, v) in want.iter_mut().enumerate() {
                    *v = e.value(*v, first + i / o_sz, start + i);
                }
                let finish = Finish {
                    bias,
                    finish: None,
                    first_channel: first,
                    plane_start: start,
                    store: Some(e),
                };
                for threads in [1, 3] {
                    let mut got = vec![f32::NAN; m * o_sz];
                    on_threads(threads, || {
                        planar_product(&image, &runs, &offsets, &tiles, &mut got, o_sz, &finish)
                    });
                    assert_eq!(bits(&got), bits(&want), "{e:?} bias {bias:?}");
                }
                let mut got = vec![f32::NAN; m * o_sz];
                for t in 0..m.div_ceil(TILE_CHANNELS) {
                    for run in &runs {
                        let out = t * TILE_CHANNELS * o_sz + run.out;
                        let operands = Tile {
                            k,
                            w: tiles.tile(t).as_ptr(),
                            a: image[run.image..].as_ptr(),
                            offsets: offsets.as_ptr(),
                            c: got[out..].as_mut_ptr(),
                            ldc: o_sz,
                            channels: TILE_CHANNELS.min(m - t * TILE_CHANNELS),
                            bias: bias
                                .map_or(std::ptr::null(), |b| b[t * TILE_CHANNELS..].as_ptr()),
                            store: Some(TileStore {
                                epilogue: e,
                                channel: first + t * TILE_CHANNELS,
                                start: start + out,
                            }),
                        };
                        // SAFETY: the run lies inside the image and the planes.
                        unsafe { tile_scalar(operands, run.len) }
                    }
                }
                assert_eq!(bits(&got), bits(&want), "scalar {e:?} bias {bias:?}");
            }
        }
    }
}
