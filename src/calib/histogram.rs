//! Per-tensor statistics of |x|: the running absolute maximum (pass 1) and a fixed-range
//! histogram over `[0, amax]` (pass 2), plus the percentile threshold read off the histogram.
//!
//! Both passes see every value exactly once and keep only counters, so memory does not grow
//! with the number of batches. Counts are integers, so the result does not depend on how the
//! work is split across threads.

use rayon::prelude::*;

/// Bins of the |x| histogram (TensorRT's and pytorch-quantization's 2048).
pub const NUM_BINS: usize = 2048;

/// Elements above which a tensor's range is taken in parallel chunks.
const PARALLEL_MIN: usize = 1 << 16;
const CHUNK: usize = 1 << 15;
/// The same for a histogram, whose filling costs ~20× a range per value: worth splitting
/// from smaller tensors (a transformer's [128, 256] activations).
const FILL_PARALLEL_MIN: usize = 1 << 14;
const FILL_CHUNK: usize = 1 << 13;

/// Pass-1 statistics of one tensor: max |x| over the finite values, and what was not finite.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RangeStats {
    /// Largest finite |x| seen (0 when nothing finite was seen).
    pub max_abs: f32,
    /// Finite values seen.
    pub finite: u64,
    /// ±inf values seen (left out of the statistics).
    pub infinite: u64,
    /// NaN values seen.
    pub nan: u64,
}

impl RangeStats {
    /// Adds the values of one tensor. Branch-free over lanes (the counts and the maximum do
    /// not depend on the order values are seen in), and over threads for large tensors, so
    /// the result is the same for any split; a value-at-a-time loop with a branch per class
    /// was a third of a minmax calibration's time (the bench transformer: 2.8× the FP32
    /// runs it observes).
    pub fn observe(&mut self, values: &[f32]) {
        let part = if values.len() < PARALLEL_MIN {
            range_of(values)
        } else {
            values
                .par_chunks(CHUNK)
                .map(range_of)
                .reduce(RangeStats::default, |a, b| a.merged(&b))
        };
        *self = self.merged(&part);
    }

    fn merged(&self, other: &RangeStats) -> RangeStats {
        RangeStats {
            max_abs: self.max_abs.max(other.max_abs),
            finite: self.finite + other.finite,
            infinite: self.infinite + other.infinite,
            nan: self.nan + other.nan,
        }
    }
}

/// [`RangeStats`] of `values` alone, compiled for the widest vectors the CPU has (the same
/// arithmetic: only the registers differ; in SSE the lanes spilled to the stack).
fn range_of(values: &[f32]) -> RangeStats {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has the feature the function was compiled for.
            return unsafe { range_of_avx512(values) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: as above.
            return unsafe { range_of_avx2(values) };
        }
    }
    range_in_lanes(values)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn range_of_avx512(values: &[f32]) -> RangeStats {
    range_in_lanes(values)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn range_of_avx2(values: &[f32]) -> RangeStats {
    range_in_lanes(values)
}

/// [`range_of`]'s body: sixteen lanes of maxima and counts, which the compiler keeps in
/// vector registers.
#[inline(always)]
fn range_in_lanes(values: &[f32]) -> RangeStats {
    const LANES: usize = 16;
    let mut max = [0f32; LANES];
    let mut finite = [0u32; LANES];
    let mut nan = [0u32; LANES];
    let mut stats = RangeStats::default();
    // u32 lane counts: flushed before any could overflow.
    for block in values.chunks(LANES * (u32::MAX as usize / 2)) {
        let groups = block.chunks_exact(LANES);
        let tail = groups.remainder();
        // Value x into lane l.
        let mut add = |l: usize, x: f32| {
            let a = x.abs();
            let is_finite = a <= f32::MAX;
            // NaN and ±inf leave the maximum alone.
            max[l] = if is_finite && a > max[l] { a } else { max[l] };
            finite[l] += is_finite as u32;
            nan[l] += a.is_nan() as u32;
        };
        for g in groups {
            for (l, &x) in g.iter().enumerate() {
                add(l, x);
            }
        }
        for (l, &x) in tail.iter().enumerate() {
            add(l, x);
        }
        let block_finite: u64 = finite.iter().map(|&c| c as u64).sum();
        let block_nan: u64 = nan.iter().map(|&c| c as u64).sum();
        stats.finite += block_finite;
        stats.nan += block_nan;
        stats.infinite += block.len() as u64 - block_finite - block_nan;
        finite = [0; LANES];
        nan = [0; LANES];
    }
    stats.max_abs = max.iter().fold(0f32, |m, &x| m.max(x));
    stats
}

/// A histogram of |x| with [`NUM_BINS`] equal bins over `[0, range]`; values above `range`
/// land in the last bin. Bin `j` covers `[j·w, (j+1)·w)` with `w = range / NUM_BINS`.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    pub range: f32,
    pub counts: Vec<u64>,
}

impl Histogram {
    pub fn new(range: f32) -> Histogram {
        Histogram {
            range,
            counts: vec![0; NUM_BINS],
        }
    }

    /// Width of one bin.
    pub fn bin_width(&self) -> f64 {
        self.range as f64 / self.counts.len() as f64
    }

    /// The value at bin edge `i` (`0 ..= NUM_BINS`): `i · width`, exactly `range` for the last.
    pub fn edge(&self, i: usize) -> f32 {
        if i >= self.counts.len() {
            self.range
        } else {
            (i as f64 * self.bin_width()) as f32
        }
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds the finite values of one tensor (non-finite values are skipped).
    pub fn observe(&mut self, values: &[f32]) {
        if !(self.range > 0.0 && self.range.is_finite()) {
            // A zero range: every finite value is 0 (pass 1 found no larger |x|).
            self.counts[0] += values.iter().filter(|x| x.is_finite()).count() as u64;
            return;
        }
        let n = self.counts.len();
        let per_unit = n as f64 / self.range as f64;
        if values.len() < FILL_PARALLEL_MIN {
            fill(&mut self.counts, values, per_unit);
            return;
        }
        let partial = values
            .par_chunks(FILL_CHUNK)
            .map(|chunk| {
                let mut c = vec![0u64; n];
                fill(&mut c, chunk, per_unit);
                c
            })
            .reduce(
                || vec![0u64; n],
                |mut a, b| {
                    for (x, y) in a.iter_mut().zip(b) {
                        *x += y;
                    }
                    a
                },
            );
        for (x, y) in self.counts.iter_mut().zip(partial) {
            *x += y;
        }
    }

    /// The smallest bin edge below which at least `percentile` % of the values lie (the upper
    /// edge of the bin where the cumulative count reaches the percentile), so 100 gives the
    /// maximum. `percentile` must be in (0, 100].
    pub fn percentile_amax(&self, percentile: f64) -> f32 {
        let total = self.total();
        if total == 0 {
            return 0.0;
        }
        let target = percentile / 100.0 * total as f64;
        let mut cum = 0u64;
        for (j, &c) in self.counts.iter().enumerate() {
            cum += c;
            if cum as f64 >= target {
                return self.edge(j + 1);
            }
        }
        self.range
    }
}

/// The bin of one value, `None` for NaN and ±inf: `⌊|x| · per_unit⌋` in f64, clamped to the
/// last bin (`as usize` saturates; a value past the range — never after pass 1 — clamps).
#[inline(always)]
fn bin_of(x: f32, per_unit: f64, last: usize) -> Option<usize> {
    let a = x.abs();
    a.is_finite()
        .then(|| ((a as f64 * per_unit) as usize).min(last))
}

/// Adds `values` to `counts`. Four interleaved sub-histograms keep runs of equal values (the
/// zeros after a ReLU) from serialising on one counter; with AVX-512 the bins of sixteen
/// values at a time are worked out in vectors (the scalar float-to-integer conversion with its
/// saturation checks was most of the time: filling was 22 % of the entropy calibration bench).
fn fill(counts: &mut [u64], values: &[f32], per_unit: f64) {
    let n = counts.len();
    let last = n - 1;
    if values.len() < 4 * n {
        // Small tensors: merging sub-histograms would cost more than it saves.
        for &x in values {
            if let Some(b) = bin_of(x, per_unit, last) {
                counts[b] += 1;
            }
        }
        return;
    }
    // Four sub-histograms and one bin past them where the vector path counts NaN and ±inf.
    let mut sub = vec![0u32; 4 * n + 1];
    // u32 sub-counts: flush before any could overflow.
    for block in values.chunks(4 * (u32::MAX as usize / 4)) {
        #[cfg(target_arch = "x86_64")]
        let done = if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has the feature the function was compiled for.
            unsafe { fill_sub_avx512(&mut sub, n, block, per_unit) }
        } else {
            0
        };
        #[cfg(not(target_arch = "x86_64"))]
        let done = 0;
        let rest = &block[done..];
        let quads = rest.chunks_exact(4);
        for &x in quads.remainder() {
            if let Some(b) = bin_of(x, per_unit, last) {
                sub[b] += 1;
            }
        }
        for q in quads {
            for (k, &x) in q.iter().enumerate() {
                if let Some(b) = bin_of(x, per_unit, last) {
                    sub[k * n + b] += 1;
                }
            }
        }
        for j in 0..n {
            counts[j] += (0..4).map(|k| sub[k * n + j] as u64).sum::<u64>();
        }
        sub.fill(0);
    }
}

/// The bins of the first multiple of sixteen values of `values`, sixteen at a time, counted
/// into `sub` (four sub-histograms of `n` bins, value `l` of each sixteen into sub-histogram
/// `l % 4`; NaN and ±inf into the extra bin `4n`). The same bins as [`bin_of`]: |x| widened to
/// f64 and multiplied there (the same IEEE operations), then clamped before the truncation —
/// for a product ≥ 0, truncating min(p, last) gives min(⌊p⌋, last). Returns how many values it
/// took.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fill_sub_avx512(sub: &mut [u32], n: usize, values: &[f32], per_unit: f64) -> usize {
    use std::arch::x86_64::*;
    assert!(sub.len() > 4 * n && n <= i32::MAX as usize);
    let abs_mask = _mm512_set1_epi32(0x7FFF_FFFF);
    let max_finite = _mm512_set1_ps(f32::MAX);
    let scale = _mm512_set1_pd(per_unit);
    let last = _mm512_set1_pd((n - 1) as f64);
    let dump = _mm512_set1_epi32((4 * n) as i32);
    // Lane l's offset: its sub-histogram, l % 4.
    let lane_offsets: [i32; 16] = std::array::from_fn(|l| ((l % 4) * n) as i32);
    // SAFETY: `lane_offsets` holds 16 i32 (unaligned load).
    let offsets = unsafe { _mm512_loadu_si512(lane_offsets.as_ptr().cast()) };
    let mut idx = [0i32; 16];
    let groups = values.chunks_exact(16);
    let taken = values.len() - groups.remainder().len();
    for g in groups {
        // SAFETY: `g` holds 16 f32 (unaligned load); the feature is enabled.
        let x = unsafe { _mm512_loadu_ps(g.as_ptr()) };
        let a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), abs_mask));
        // Ordered ≤: false for NaN and +inf.
        let finite = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(a, max_finite);
        let lo = _mm512_castps512_ps256(a);
        let hi = _mm256_castsi256_ps(_mm512_extracti64x4_epi64::<1>(_mm512_castps_si512(a)));
        let bins = |h: __m256| {
            let p = _mm512_min_pd(_mm512_mul_pd(_mm512_cvtps_pd(h), scale), last);
            _mm512_cvttpd_epi32(p)
        };
        let b = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(bins(lo)), bins(hi));
        let b = _mm512_mask_add_epi32(dump, finite, b, offsets);
        // SAFETY: `idx` holds 16 i32.
        unsafe { _mm512_storeu_si512(idx.as_mut_ptr().cast(), b) };
        for &i in &idx {
            // In 0..=4n: a finite value's bin is in 0..n (clamped above), plus its offset.
            sub[i as usize] += 1;
        }
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_stats_skip_non_finite_values() {
        let mut s = RangeStats::default();
        s.observe(&[1.0, -3.0, f32::INFINITY, f32::NEG_INFINITY]);
        s.observe(&[f32::NAN, 2.0]);
        assert_eq!(s.max_abs, 3.0);
        assert_eq!((s.finite, s.infinite, s.nan), (3, 2, 1));
        s.observe(&[-f32::MAX, f32::NAN]);
        assert_eq!(s.max_abs, f32::MAX);
        assert_eq!((s.finite, s.infinite, s.nan), (4, 2, 2));
    }

    /// The definition, one value at a time.
    fn range_stats_by_value(values: &[f32]) -> RangeStats {
        let mut s = RangeStats::default();
        for &x in values {
            if x.is_nan() {
                s.nan += 1;
            } else if x.is_infinite() {
                s.infinite += 1;
            } else {
                s.finite += 1;
                s.max_abs = s.max_abs.max(x.abs());
            }
        }
        s
    }

    #[test]
    fn range_stats_in_lanes_and_threads_equal_the_definition() {
        // Special values at every lane position, tails of every length, and sizes on both
        // sides of the parallel threshold; the largest finite |x| placed anywhere.
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            0.0,
            f32::MIN_POSITIVE / 4.0,
            -6.5,
            1.5,
        ];
        for len in [
            0,
            1,
            15,
            16,
            17,
            33,
            1000,
            PARALLEL_MIN - 1,
            PARALLEL_MIN + 17,
            3 * CHUNK + 5,
        ] {
            for at in [0usize, 7, len / 2, len.saturating_sub(1)] {
                let mut v: Vec<f32> = (0..len)
                    .map(|i| match i % 11 {
                        k @ 0..=7 if i % 5 == 0 => specials[k],
                        _ => ((i as f32) * 0.37).sin() * 5.0,
                    })
                    .collect();
                if at < len {
                    v[at] = -7.25;
                }
                let want = range_stats_by_value(&v);
                let mut got = RangeStats::default();
                got.observe(&v);
                assert_eq!(got, want, "len {len}, largest at {at}");
                // Observed in pieces: the same statistics.
                let mut pieces = RangeStats::default();
                for c in v.chunks(1 + len / 3) {
                    pieces.observe(c);
                }
                assert_eq!(pieces, want, "len {len} in pieces");
            }
        }
    }

    #[test]
    fn histogram_bins_and_edges() {
        let mut h = Histogram::new(2048.0);
        h.observe(&[0.0, 0.5, -1.0, 1.5, 2047.9, 2048.0, f32::INFINITY]);
        assert_eq!(h.counts[0], 2);
        assert_eq!(h.counts[1], 2);
        assert_eq!(h.counts[2047], 2);
        assert_eq!(h.total(), 6);
        assert_eq!(h.edge(0), 0.0);
        assert_eq!(h.edge(1), 1.0);
        assert_eq!(h.edge(NUM_BINS), 2048.0);
    }

    #[test]
    fn histogram_in_vectors_equals_the_definition() {
        // Bin edges exactly, values just below and above them, past the range, zeros, NaN,
        // ±inf and subnormals, at every lane position; sizes through the small-tensor loop,
        // the vector path with tails, and the parallel chunks.
        let range = 3.0f32;
        let per_unit = NUM_BINS as f64 / range as f64;
        let edge = |j: usize| (j as f64 / per_unit) as f32;
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            f32::MIN_POSITIVE / 8.0,
            range,
            -range * 4.0,
            f32::MAX,
        ];
        for len in [
            5,
            4 * NUM_BINS - 1,
            4 * NUM_BINS + 21,
            FILL_PARALLEL_MIN + 7,
            70_001,
        ] {
            let v: Vec<f32> = (0..len)
                .map(|i| match i % 13 {
                    k @ 0..=8 if i % 3 == 0 => specials[k],
                    9 => edge(i % NUM_BINS),
                    10 => f32::from_bits(edge(i % NUM_BINS).to_bits().wrapping_sub(1)),
                    11 => -f32::from_bits(edge(i % NUM_BINS).to_bits() + 1),
                    _ => ((i as f32) * 0.37).sin() * range,
                })
                .collect();
            let mut want = vec![0u64; NUM_BINS];
            for &x in &v {
                if let Some(b) = bin_of(x, per_unit, NUM_BINS - 1) {
                    want[b] += 1;
                }
            }
            let mut h = Histogram::new(range);
            h.observe(&v);
            assert_eq!(h.counts, want, "{len} values");
        }
    }

    #[test]
    fn parallel_fill_matches_serial() {
        let v: Vec<f32> = (0..200_000)
            .map(|i| ((i as f32) * 0.37).sin() * 5.0)
            .collect();
        let mut a = Histogram::new(5.0);
        a.observe(&v);
        let mut b = Histogram::new(5.0);
        for c in v.chunks(1000) {
            b.observe(c);
        }
        assert_eq!(a, b);
        assert_eq!(a.total(), 200_000);
    }

    #[test]
    fn percentile_reads_the_cumulative_counts() {
        // 10 000 values spread evenly over the 2048 bins of [0, 2048): value k lands in bin k.
        let mut h = Histogram::new(2048.0);
        let v: Vec<f32> = (0..2048).map(|k| k as f32 + 0.5).collect();
        h.observe(&v);
        assert_eq!(h.percentile_amax(100.0), 2048.0);
        assert_eq!(h.percentile_amax(50.0), 1024.0);
        // One value in a million beyond: 99.99 % ignores a far outlier.
        let mut h = Histogram::new(1000.0);
        h.observe(&vec![0.5; 1_000_000]);
        h.observe(&[1000.0]);
        assert!(
            h.percentile_amax(99.99) <= 1.0,
            "{}",
            h.percentile_amax(99.99)
        );
        assert_eq!(h.percentile_amax(100.0), 1000.0);
    }

    #[test]
    fn zero_range_counts_zeros() {
        let mut h = Histogram::new(0.0);
        h.observe(&[0.0, -0.0, f32::NAN]);
        assert_eq!(h.total(), 2);
        assert_eq!(h.percentile_amax(99.0), 0.0);
    }
}
