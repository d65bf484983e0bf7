//! MLAS's single-precision GEMM as ONNX Runtime 1.32 runs it on an x86-64 CPU with AVX2+FMA
//! (`core/mlas/lib/sgemm.cpp` `MlasSgemmOperation`, its FMA3 kernel and the AVX kernels
//! `SgemmKernelM1Avx.S` / `SgemmKernelM1TransposeBAvx.S`), bit for bit, for the small
//! products of attention: `C = alpha·A·op(B)` or `C = A·op(B) + C`.
//!
//! - M = 1 with alpha = 1 (the M = 1 kernels, plain multiplies and adds, no FMA):
//!   - B not transposed: each output sums the products `a[k]·b[k]` four k at a time,
//!     `((p0 + p1) + p2) + p3`, then two, then one, each group added to C (to +0 first unless
//!     accumulating).
//!   - B transposed: eight lanes of `lane += a[k]·b[k]` (lane `k mod 8`, the K tail in one last
//!     masked step), then the lanes reduced by the output's place: outputs in whole groups of
//!     four as `(((l0+l1)+l2)+l3) + (((l4+l5)+l6)+l7)`, a pair after them as
//!     `((l0+l2)+(l4+l6)) + ((l1+l3)+(l5+l7))`, a last one as `((l0+l1)+(l2+l3)) +
//!     ((l4+l5)+(l6+l7))`; plus C when accumulating.
//! - N = 1 with B and C contiguous columns and alpha = 1: the transposed M = 1 kernel with A's
//!   rows as its outputs.
//! - Otherwise the FMA3 kernel: every output is a chain of fused multiply-adds over k in order
//!   from +0, restarted at each K stride (128, widened or narrowed as `MlasSgemmOperation`
//!   does), each stride's chain `acc` stored as `alpha·acc` when it is the first one of a zeroing
//!   product, else added: `acc + C`.
//!
//! Only alpha = 1 products accumulate into C here (ONNX Runtime's attention asks no other).

/// One row of A times B: `c[j] (+)= Σ_k a[k]·b[k·ldb + j]` as `SgemmKernelM1Avx` does.
fn m1(a: &[f32], b: &[f32], ldb: usize, n: usize, c: &mut [f32], accumulate: bool) {
    let k = a.len();
    let mut acc_mode = accumulate;
    let add_group = |from: usize, len: usize, c: &mut [f32], acc_mode: &mut bool| {
        for (j, cj) in c.iter_mut().enumerate().take(n) {
            let mut g = a[from] * b[from * ldb + j];
            for kk in from + 1..from + len {
                g += a[kk] * b[kk * ldb + j];
            }
            *cj = g + if *acc_mode { *cj } else { 0.0 };
        }
        *acc_mode = true;
    };
    let mut kk = 0;
    while kk + 4 <= k {
        add_group(kk, 4, c, &mut acc_mode);
        kk += 4;
    }
    if k - kk >= 2 {
        add_group(kk, 2, c, &mut acc_mode);
        kk += 2;
    }
    if k - kk == 1 {
        add_group(kk, 1, c, &mut acc_mode);
    }
}

/// One row of A times the rows of B (B transposed: row j of B is output j) as
/// `SgemmKernelM1TransposeBAvx` does.
fn m1_transpose_b(a: &[f32], b: &[f32], ldb: usize, n: usize, c: &mut [f32], accumulate: bool) {
    let k = a.len();
    let lanes_of = |j: usize| -> [f32; 8] {
        let row = &b[j * ldb..j * ldb + k];
        let mut l = [0f32; 8];
        for (kk, (&x, &y)) in a.iter().zip(row).enumerate() {
            l[kk % 8] += x * y;
        }
        l
    };
    let whole = n / 4 * 4;
    for (j, cj) in c.iter_mut().enumerate().take(n) {
        let l = lanes_of(j);
        let v = if j < whole {
            (((l[0] + l[1]) + l[2]) + l[3]) + (((l[4] + l[5]) + l[6]) + l[7])
        } else if n - whole >= 2 && j < whole + 2 {
            ((l[0] + l[2]) + (l[4] + l[6])) + ((l[1] + l[3]) + (l[5] + l[7]))
        } else {
            ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
        };
        *cj = v + if accumulate { *cj } else { 0.0 };
    }
}

/// `MlasSgemmOperation(NoTrans, trans_b ? Trans : NoTrans, m, n, k, alpha, a, lda, b, ldb,
/// beta, c, ldc)` with beta 0 (`accumulate` false) or 1, bit for bit (see the module doc).
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm(
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    accumulate: bool,
    c: &mut [f32],
    ldc: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                c[i * ldc..i * ldc + n].fill(0.0);
            }
        }
        return;
    }
    debug_assert!(!accumulate || alpha == 1.0);
    if m == 1 && alpha == 1.0 {
        let row = &mut c[..n];
        if trans_b {
            m1_transpose_b(&a[..k], b, ldb, n, row, accumulate);
        } else {
            m1(&a[..k], b, ldb, n, row, accumulate);
        }
        return;
    }
    if n == 1 && ldb == 1 && ldc == 1 && alpha == 1.0 {
        // B and C are columns: C = A·b computed as b·Aᵀ by the transposed M = 1 kernel.
        let col: Vec<f32> = (0..k)
            .map(|kk| if trans_b { b[kk] } else { b[kk * ldb] })
            .collect();
        m1_transpose_b(&col, a, lda, m, &mut c[..m], accumulate);
        return;
    }
    // MlasSgemmOperation's K stride (MLAS_SGEMM_STRIDEK 128, traded against the N stride
    // MLAS_SGEMM_STRIDEN 128: halved while half still covers K, doubled while the N stride
    // halves over a narrow N).
    let mut stride_k = 128usize;
    if n >= k {
        while stride_k / 2 >= k {
            stride_k /= 2;
        }
    } else {
        let mut stride_n = 128usize;
        while stride_n > 16 && stride_n / 2 >= n {
            stride_k *= 2;
            stride_n /= 2;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has FMA (detected).
        unsafe {
            return fma3_kernel_with_fma(
                trans_b, m, n, k, stride_k, alpha, a, lda, b, ldb, accumulate, c, ldc,
            );
        }
    }
    fma3_kernel(
        trans_b, m, n, k, stride_k, alpha, a, lda, b, ldb, accumulate, c, ldc,
    )
}

/// [`fma3_kernel`] compiled for a CPU with FMA: `mul_add` becomes one instruction instead of a
/// call to libm's `fmaf` (the same rounding: one fused multiply-add either way).
///
/// # Safety
/// The CPU has FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn fma3_kernel_with_fma(
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
    stride_k: usize,
    alpha: f32,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    accumulate: bool,
    c: &mut [f32],
    ldc: usize,
) {
    fma3_kernel(
        trans_b, m, n, k, stride_k, alpha, a, lda, b, ldb, accumulate, c, ldc,
    )
}

/// The FMA3 kernel's outputs (see the module doc): each a chain over each K stride.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn fma3_kernel(
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
    stride_k: usize,
    alpha: f32,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    accumulate: bool,
    c: &mut [f32],
    ldc: usize,
) {
    for i in 0..m {
        let mut j0 = 0;
        while j0 < n {
            let cols = (n - j0).min(KERNEL_COLS);
            if cols == KERNEL_COLS {
                fma3_columns::<KERNEL_COLS>(
                    trans_b, i, j0, k, stride_k, alpha, a, lda, b, ldb, accumulate, c, ldc,
                );
            } else {
                for j in j0..n {
                    fma3_columns::<1>(
                        trans_b, i, j, k, stride_k, alpha, a, lda, b, ldb, accumulate, c, ldc,
                    );
                }
            }
            j0 += cols;
        }
    }
}

/// Outputs a kernel call computes side by side: independent chains, so that they overlap
/// instead of each waiting on its own fused multiply-adds' latency (GroupQueryAttention's
/// 16×16×64 products were latency-bound one output at a time).
const KERNEL_COLS: usize = 8;

/// Outputs (i, j0..j0 + J) of [`fma3_kernel`], each its own chain over each K stride from +0,
/// added to C after the first stride (or scaled by alpha into C at the first, unless
/// accumulating): the same operations in the same order per output as one at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn fma3_columns<const J: usize>(
    trans_b: bool,
    i: usize,
    j0: usize,
    k: usize,
    stride_k: usize,
    alpha: f32,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    accumulate: bool,
    c: &mut [f32],
    ldc: usize,
) {
    let a_row = &a[i * lda..i * lda + k];
    let c_row = &mut c[i * ldc + j0..i * ldc + j0 + J];
    let mut zero_mode = !accumulate;
    let mut k0 = 0;
    while k0 < k {
        let k1 = (k0 + stride_k).min(k);
        let mut acc = [0f32; J];
        if trans_b {
            let rows: [&[f32]; J] = std::array::from_fn(|jj| &b[(j0 + jj) * ldb..][..k]);
            for kk in k0..k1 {
                let av = a_row[kk];
                for (s, row) in acc.iter_mut().zip(&rows) {
                    *s = av.mul_add(row[kk], *s);
                }
            }
        } else {
            for kk in k0..k1 {
                let av = a_row[kk];
                let b_row: &[f32; J] = b[kk * ldb + j0..][..J].try_into().expect("J values");
                for (s, &bv) in acc.iter_mut().zip(b_row) {
                    *s = av.mul_add(bv, *s);
                }
            }
        }
        for (cij, &s) in c_row.iter_mut().zip(&acc) {
            *cij = if zero_mode { s * alpha } else { s + *cij };
        }
        zero_mode = false;
        k0 = k1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The M = 1 kernel adds four products, then the group to C; the general kernel one FMA
    /// chain: 2^24 + 1 + 1 shows the order.
    #[test]
    fn m1_groups_and_fma_chains_round_where_mlas_does() {
        let big = 16_777_216f32;
        let a = [1.0f32, 1.0, 1.0, 1.0, 1.0];
        let b = [big, 1.0, 1.0, 1.0, 1.0];
        let mut c = [0f32];
        sgemm(false, 1, 1, 5, 1.0, &a, 5, &b, 1, false, &mut c, 1);
        // ((2^24 + 1) + 1) + 1 rounds each +1 away (ties to even); then + 1 from the last group.
        assert_eq!(c[0], big + 0.0 + 0.0);
        // With alpha ≠ 1 the FMA chain: fma(1, 1, 2^24) = 2^24 (tie to even) each time; ×2.
        let a2 = [1.0f32; 10];
        let mut b2 = [1.0f32; 10];
        b2[0] = big;
        let mut c2 = [0f32; 2];
        sgemm(false, 2, 1, 5, 2.0, &a2, 5, &b2, 1, false, &mut c2, 1);
        assert_eq!(c2[0], 2.0 * big);
        // Transposed B, one output: eight lanes then ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)).
        let a3 = [1.0f32; 9];
        let mut b3 = [1.0f32; 9];
        b3[0] = big;
        let mut c3 = [0f32];
        sgemm(true, 1, 1, 9, 1.0, &a3, 9, &b3, 9, false, &mut c3, 1);
        // Lane 0: 2^24 + 1 → 2^24; lanes 1..7: 1 each: 2^24 + 7 → rounded in the fold.
        let l = [big, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
        assert_eq!(
            c3[0],
            ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
        );
    }

    /// Outputs computed eight side by side are each the chain computed alone: every shape
    /// with full and partial groups of columns, both B layouts, alpha, accumulation, K strides.
    #[test]
    fn side_by_side_outputs_are_each_their_own_chain() {
        let val = |i: usize, s: usize| ((i * s % 37) as f32 - 18.0) * 0.173;
        for &(m, n, k) in &[
            (3, 5, 7),
            (16, 16, 64),
            (5, 19, 300),
            (2, 64, 16),
            (7, 9, 129),
        ] {
            for trans_b in [false, true] {
                for (alpha, accumulate) in [(1.0, false), (0.125, false), (1.0, true)] {
                    let a: Vec<f32> = (0..m * k).map(|i| val(i, 7)).collect();
                    let b: Vec<f32> = (0..k * n).map(|i| val(i, 11)).collect();
                    let c0: Vec<f32> = (0..m * n).map(|i| val(i, 13)).collect();
                    let ldb = if trans_b { k } else { n };
                    let mut want = c0.clone();
                    let mut stride_k = 128usize;
                    if n >= k {
                        while stride_k / 2 >= k {
                            stride_k /= 2;
                        }
                    } else {
                        let mut stride_n = 128usize;
                        while stride_n > 16 && stride_n / 2 >= n {
                            stride_k *= 2;
                            stride_n /= 2;
                        }
                    }
                    for i in 0..m {
                        for j in 0..n {
                            let mut zero = !accumulate;
                            for k0 in (0..k).step_by(stride_k) {
                                let mut s = 0f32;
                                for kk in k0..(k0 + stride_k).min(k) {
                                    let bv = if trans_b {
                                        b[j * k + kk]
                                    } else {
                                        b[kk * n + j]
                                    };
                                    s = a[i * k + kk].mul_add(bv, s);
                                }
                                let w = &mut want[i * n + j];
                                *w = if zero { s * alpha } else { s + *w };
                                zero = false;
                            }
                        }
                    }
                    let mut c = c0.clone();
                    sgemm(
                        trans_b, m, n, k, alpha, &a, k, &b, ldb, accumulate, &mut c, n,
                    );
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&c),
                        bits(&want),
                        "{m}x{n}x{k} trans_b {trans_b} alpha {alpha}"
                    );
                }
            }
        }
    }

    /// K strides: each stride's chain starts from +0 and is added to C.
    #[test]
    fn k_strides_restart_the_chain() {
        // n = 2 < k = 300: the N stride narrows to 16, the K stride widens to 1024: one chain.
        let k = 300;
        let a: Vec<f32> = (0..2 * k).map(|i| (i % 7) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..k * 2).map(|i| (i % 5) as f32 * 0.3).collect();
        let mut c = vec![0f32; 4];
        sgemm(false, 2, 2, k, 1.0, &a, k, &b, 2, false, &mut c, 2);
        let mut want = 0f32;
        for kk in 0..k {
            want = a[kk].mul_add(b[kk * 2], want);
        }
        assert_eq!(c[0], want);
        // n = 300 ≥ k = 200: the K stride stays 128 → chains over 0..128 and 128..200, added.
        let (n, k) = (300, 200);
        let a: Vec<f32> = (0..2 * k).map(|i| ((i * 13) % 17) as f32 * 0.01).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 7) % 11) as f32 * 0.03).collect();
        let mut c = vec![0f32; 2 * n];
        sgemm(false, 2, n, k, 1.0, &a, k, &b, n, false, &mut c, n);
        let chain =
            |r: std::ops::Range<usize>| r.fold(0f32, |acc, kk| a[kk].mul_add(b[kk * n], acc));
        assert_eq!(c[0], chain(128..200) + chain(0..128));
    }
}
