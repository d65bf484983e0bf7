//! TensorRT's entropy calibration (`IInt8EntropyCalibrator2`): the clipping threshold that
//! minimises the KL divergence between the |x| histogram and its 128-level quantized version.
//!
//! The procedure is the one NVIDIA documents for TensorRT and ships in pytorch-quantization
//! (`calib/histogram.py`, `_compute_amax_entropy`) with its defaults: a 2048-bin histogram of
//! |x| over `[0, max|x|]`, candidate thresholds at bin edges `i = 128 ..= 2048` (stride 1),
//! 128 quantization levels (int8 with the sign bit taken off). For a candidate `i`:
//!
//! * the reference distribution `P` is bins `0..i`, with everything beyond `i` (the values that
//!   would be clipped) added to bin `i-1`;
//! * the candidate distribution `Q` splits bins `0..i` into 128 groups (bin `j` goes to group
//!   `⌊128·j / i⌋`) and spreads each group's total evenly over the group's non-empty bins
//!   (empty bins stay empty); the clipped values are *not* in `Q`, so clipping is penalised;
//! * both are normalised and `KL(P‖Q) = Σ P ln(P/Q)` (infinite where `Q = 0 < P`).
//!
//! Before the search, the count of bin 0 is replaced by that of bin 1, so a spike of exact zeros
//! (ReLU outputs, padding) does not dominate the divergence. The threshold is the upper edge of
//! the candidate with the smallest divergence, the last one on ties.
//!
//! The direct computation costs O(i) logarithms per candidate (≈2 M per tensor). Because `Q` is
//! constant over the non-empty bins of a group, `KL` reduces to prefix sums of `b`, `b ln b`
//! and non-empty-bin counts plus one term per group, O(128) per candidate; tests check the two
//! agree.

/// Quantization levels: `1 << (bits - 1)` for signed 8-bit.
pub const QUANT_LEVELS: usize = 128;
/// The first candidate threshold bin (pytorch-quantization's `start_bin`).
pub const START_BIN: usize = 128;

/// Divergences closer than this count as equal (the last, i.e. largest, threshold wins).
const TIE: f64 = 1e-12;

/// The threshold bin `i` (amax = edge `i`) that minimises the KL divergence, for a histogram
/// of |x| whose bins all have the same width. None for an empty histogram.
pub fn entropy_threshold_bin(counts: &[u64]) -> Option<usize> {
    let n = counts.len();
    let b = prepared(counts)?;
    let total: f64 = b.iter().sum();
    // Prefix sums: mass, mass·ln(mass), non-empty bins.
    let mut s = vec![0f64; n + 1];
    let mut l = vec![0f64; n + 1];
    let mut z = vec![0u32; n + 1];
    for j in 0..n {
        s[j + 1] = s[j] + b[j];
        l[j + 1] = l[j] + xlnx(b[j]);
        z[j + 1] = z[j] + (b[j] > 0.0) as u32;
    }
    let ln_total = total.ln();
    let mut best = f64::INFINITY;
    let mut best_i = None;
    for i in START_BIN.min(n).max(1)..=n {
        let kl = divergence_fast(i, &b, &s, &l, &z, total, ln_total);
        if best_i.is_none() || kl <= best + TIE {
            best = best.min(kl);
            best_i = Some(i);
        }
    }
    best_i
}

/// The bins as f64 with bin 0 replaced by bin 1; None when nothing was counted.
fn prepared(counts: &[u64]) -> Option<Vec<f64>> {
    if counts.iter().all(|&c| c == 0) {
        return None;
    }
    let mut b: Vec<f64> = counts.iter().map(|&c| c as f64).collect();
    if b.len() > 1 {
        b[0] = b[1];
        if b.iter().all(|&x| x == 0.0) {
            // Only exact zeros were seen: nothing to clip.
            return None;
        }
    }
    Some(b)
}

#[inline]
fn xlnx(x: f64) -> f64 {
    if x > 0.0 {
        x * x.ln()
    } else {
        0.0
    }
}

/// `KL(P‖Q)` for candidate `i` from prefix sums (see the module docs).
fn divergence_fast(
    i: usize,
    b: &[f64],
    s: &[f64],
    l: &[f64],
    z: &[u32],
    total: f64,
    ln_total: f64,
) -> f64 {
    let clipped = total - s[i];
    let last = b[i - 1];
    if last == 0.0 && clipped > 0.0 {
        return f64::INFINITY; // P > 0 = Q in the last bin
    }
    let q_total = s[i];
    if q_total <= 0.0 {
        return f64::INFINITY;
    }
    // Σ p ln p: bins 0..i-1 as counted, bin i-1 with the clipped mass added.
    let p_lnp = l[i - 1] + xlnx(last + clipped);
    // Σ p ln q over the groups: q is the group's mean over its non-empty bins.
    let mut p_lnq = 0.0;
    for k in 0..QUANT_LEVELS {
        let lo = (k * i).div_ceil(QUANT_LEVELS);
        let hi = ((k + 1) * i).div_ceil(QUANT_LEVELS).min(i);
        if lo >= hi {
            continue;
        }
        let nonempty = z[hi] - z[lo];
        if nonempty == 0 {
            continue;
        }
        let mass = s[hi] - s[lo];
        let p_mass = if hi == i { mass + clipped } else { mass };
        p_lnq += p_mass * (mass / nonempty as f64).ln();
    }
    (p_lnp - p_lnq) / total - ln_total + q_total.ln()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The direct O(i)-per-candidate computation, written as the algorithm reads.
    pub(crate) fn entropy_threshold_bin_naive(counts: &[u64]) -> Option<usize> {
        let n = counts.len();
        let b = prepared(counts)?;
        let total: f64 = b.iter().sum();
        let mut best = f64::INFINITY;
        let mut best_i = None;
        for i in START_BIN.min(n).max(1)..=n {
            let mut p: Vec<f64> = b[..i].to_vec();
            p[i - 1] += b[i..].iter().sum::<f64>();
            let mut group_sum = [0f64; QUANT_LEVELS];
            let mut group_nonempty = [0u32; QUANT_LEVELS];
            for (j, &x) in b[..i].iter().enumerate() {
                let g = QUANT_LEVELS * j / i;
                if x > 0.0 {
                    group_sum[g] += x;
                    group_nonempty[g] += 1;
                }
            }
            let q: Vec<f64> = (0..i)
                .map(|j| {
                    let g = QUANT_LEVELS * j / i;
                    if b[j] > 0.0 {
                        group_sum[g] / group_nonempty[g] as f64
                    } else {
                        0.0
                    }
                })
                .collect();
            let (ps, qs): (f64, f64) = (p.iter().sum(), q.iter().sum());
            assert!((ps - total).abs() <= 1e-6 * total);
            let mut kl = 0.0;
            for j in 0..i {
                if p[j] > 0.0 {
                    let (pn, qn) = (p[j] / ps, q[j] / qs);
                    kl += if qn > 0.0 {
                        pn * (pn / qn).ln()
                    } else {
                        f64::INFINITY
                    };
                }
            }
            if best_i.is_none() || kl <= best + TIE {
                best = best.min(kl);
                best_i = Some(i);
            }
        }
        best_i
    }

    /// A deterministic pseudo-random stream (SplitMix64) for synthetic data.
    pub(crate) struct Rng(pub u64);
    impl Rng {
        pub fn next_f64(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 11) as f64 / (1u64 << 53) as f64
        }
        /// Standard normal (Box-Muller).
        pub fn normal(&mut self) -> f64 {
            let u = self.next_f64().max(1e-300);
            let v = self.next_f64();
            (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
        }
    }

    fn histogram_of(values: &[f64], bins: usize) -> Vec<u64> {
        let max = values.iter().fold(0f64, |m, x| m.max(x.abs()));
        let mut h = vec![0u64; bins];
        for x in values {
            let j = ((x.abs() / max * bins as f64) as usize).min(bins - 1);
            h[j] += 1;
        }
        h
    }

    #[test]
    fn fast_and_direct_computations_agree() {
        let mut rng = Rng(7);
        // Gaussian with outliers, a uniform, a sparse spiky histogram, a ReLU-like one.
        let gauss: Vec<f64> = (0..50_000)
            .map(|k| if k % 5000 == 0 { 40.0 } else { rng.normal() })
            .collect();
        let uniform: Vec<f64> = (0..50_000).map(|_| rng.next_f64() * 2.0 - 1.0).collect();
        let relu: Vec<f64> = (0..50_000).map(|_| rng.normal().max(0.0).powi(2)).collect();
        let mut sparse = vec![0u64; 2048];
        for j in (0..2048).step_by(37) {
            sparse[j] = (j as u64 * 7919) % 101 + 1;
        }
        for (name, h) in [
            ("gauss", histogram_of(&gauss, 2048)),
            ("uniform", histogram_of(&uniform, 2048)),
            ("relu", histogram_of(&relu, 2048)),
            ("sparse", sparse),
        ] {
            assert_eq!(
                entropy_threshold_bin(&h),
                entropy_threshold_bin_naive(&h),
                "{name}"
            );
        }
    }

    #[test]
    fn outliers_are_clipped_and_uniform_data_is_not() {
        let mut rng = Rng(11);
        let mut v: Vec<f64> = (0..200_000).map(|_| rng.normal()).collect();
        for k in 0..5 {
            v.push(30.0 + k as f64);
        }
        let h = histogram_of(&v, 2048);
        let i = entropy_threshold_bin(&h).unwrap();
        let amax = i as f64 / 2048.0 * 34.0;
        assert!(amax < 10.0, "gaussian with outliers: amax {amax} of max 34");
        assert!(
            amax > 2.0,
            "gaussian with outliers: amax {amax} clips the bulk"
        );

        let v: Vec<f64> = (0..200_000).map(|_| rng.next_f64()).collect();
        let h = histogram_of(&v, 2048);
        let i = entropy_threshold_bin(&h).unwrap();
        assert!(i >= 2000, "uniform: threshold bin {i} of 2048");
    }

    #[test]
    fn empty_and_zero_histograms_have_no_threshold() {
        assert_eq!(entropy_threshold_bin(&[0; 2048]), None);
        let mut only_zeros = vec![0u64; 2048];
        only_zeros[0] = 100;
        assert_eq!(entropy_threshold_bin(&only_zeros), None);
    }
}
