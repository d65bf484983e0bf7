//! The exact integer product of 8-bit codes by a constant weight: `c = a · b` in i32, where
//! `a` and `b` are codes minus their zero points (at most 255 in magnitude). The weight is
//! packed once into panels of 16 columns with k in pairs, as 16-bit values; the AVX2 kernel
//! multiplies pairs with `vpmaddwd` (two products of at most 255² each, summed into an i32
//! lane: exact) and adds them in i32, wrapping as the hardware accumulator does. Integer sums
//! are the same in any order, so every path (AVX2, portable, any thread count) gives the same
//! bits as [`super::integer::igemm`]. ONNX Runtime's u8s8 kernels on AVX2 CPUs without VNNI
//! sum pairs with `vpmaddubsw`, which saturates in 16 bits (docs/export.md): this kernel reads
//! the same bytes per weight product pair but never saturates.

use rayon::prelude::*;

/// Columns of one panel: two AVX2 registers of eight i32 lanes.
const NR: usize = 16;
/// Rows of A computed together (each row's pair broadcast against the same loaded panel).
const MR: usize = 4;
/// Products (m·k·16) from which a panel range is worth a task of its own.
const TASK_WORK: usize = 1 << 16;

/// A k×n weight's shifted codes packed for [`PackedIntB::product`]: panel `p` holds columns
/// `16p..16p+16`, and for pair `q` the 32 values `b[2q, j], b[2q+1, j]` for each of its 16
/// columns (zero past k and n).
pub struct PackedIntB {
    k: usize,
    n: usize,
    data: Panels,
}

/// The packed values: as bytes where every shifted code fits (symmetric int8 weights, the
/// usual dynamic quantization), halving what a product reads; as 16-bit values otherwise.
enum Panels {
    I8(Vec<i8>),
    I16(Vec<i16>),
}

impl PackedIntB {
    /// Packs the row-major k×n `codes` (each within ±255: 8-bit codes minus zero points).
    pub fn new(codes: &[i32], k: usize, n: usize) -> PackedIntB {
        let data = if codes[..k * n].iter().all(|&v| i8::try_from(v).is_ok()) {
            Panels::I8(pack(codes, k, n))
        } else {
            Panels::I16(pack(codes, k, n))
        };
        PackedIntB { k, n, data }
    }

    pub fn k(&self) -> usize {
        self.k
    }

    pub fn n(&self) -> usize {
        self.n
    }

    /// `c[m, n] = Σ_k a[m, k] · b[k, n]` for the row-major m×k shifted codes `a` (each within
    /// ±255), summed exactly in i32 (wrapping beyond 2^31, as the hardware accumulator).
    pub fn product(&self, m: usize, a: &[i32], c: &mut [i32]) {
        let (k, n) = (self.k, self.n);
        assert!(a.len() >= m * k && c.len() >= m * n, "operand sizes");
        let pairs = k.div_ceil(2);
        // A's rows as i16 pairs, each pair one i32 (the lane a broadcast repeats).
        let mut a_pairs = vec![0i32; m * pairs];
        for (row, dst) in a[..m * k]
            .chunks(k.max(1))
            .zip(a_pairs.chunks_mut(pairs.max(1)))
        {
            for (q, d) in dst.iter_mut().enumerate() {
                let lo = row[2 * q] as i16 as u16 as u32;
                let hi = row.get(2 * q + 1).map_or(0, |&v| v as i16 as u16 as u32);
                *d = (lo | hi << 16) as i32;
            }
        }
        let panels = n.div_ceil(NR);
        let panel_len = pairs * 2 * NR;
        let per_panel = m * pairs * 2 * NR;
        let threads = rayon::current_num_threads();
        let per_task = if per_panel * panels < TASK_WORK * 2 || threads == 1 {
            panels
        } else {
            panels
                .div_ceil(threads * 4)
                .max(TASK_WORK.div_ceil(per_panel))
        }
        .max(1);
        // Each task computes a range of panels into its own m×(16·panels) block.
        let blocks: Vec<(usize, Vec<i32>)> = (0..panels.div_ceil(per_task))
            .into_par_iter()
            .map(|t| {
                let (p0, p1) = (t * per_task, ((t + 1) * per_task).min(panels));
                let width = (p1 - p0) * NR;
                let mut out = vec![0i32; m * width];
                for r0 in (0..m).step_by(MR) {
                    let rows = MR.min(m - r0);
                    for p in p0..p1 {
                        let range = p * panel_len..(p + 1) * panel_len;
                        let panel = match &self.data {
                            Panels::I8(v) => Panel::I8(&v[range]),
                            Panels::I16(v) => Panel::I16(&v[range]),
                        };
                        let mut acc = [[0i32; NR]; MR];
                        panel_rows(rows, &a_pairs[r0 * pairs..], pairs, panel, &mut acc);
                        for (r, lanes) in acc.iter().enumerate().take(rows) {
                            let o = (r0 + r) * width + (p - p0) * NR;
                            out[o..o + NR].copy_from_slice(lanes);
                        }
                    }
                }
                (p0, out)
            })
            .collect();
        for (p0, out) in blocks {
            let width = out.len() / m.max(1);
            for r in 0..m {
                let j0 = p0 * NR;
                let cols = width.min(n - j0);
                c[r * n + j0..r * n + j0 + cols].copy_from_slice(&out[r * width..r * width + cols]);
            }
        }
    }
}

/// The panels of [`PackedIntB`] in `T` (every code fits it).
fn pack<T: Copy + Default + Send + TryFrom<i32>>(codes: &[i32], k: usize, n: usize) -> Vec<T> {
    let pairs = k.div_ceil(2);
    let panels = n.div_ceil(NR);
    let mut data = vec![T::default(); panels * pairs * 2 * NR];
    data.par_chunks_mut(pairs * 2 * NR)
        .enumerate()
        .for_each(|(p, panel)| {
            for q in 0..pairs {
                for jj in 0..NR.min(n - p * NR) {
                    let j = p * NR + jj;
                    for h in 0..2 {
                        let row = 2 * q + h;
                        if row < k {
                            panel[q * 2 * NR + 2 * jj + h] =
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

/// `rows` (≤ MR) rows of A (their pairs at `a_pairs`, `pairs` apart) by one panel: the 16
/// column sums of each row in `acc`.
fn panel_rows(rows: usize, a_pairs: &[i32], pairs: usize, panel: Panel, acc: &mut [[i32; NR]; MR]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2; the slices hold `rows` rows of `pairs` pairs and
        // `pairs` panel steps of 2·NR values (asserted in the kernel).
        unsafe {
            match (rows, panel) {
                (1, Panel::I8(b)) => panel_rows_avx2::<1, i8>(a_pairs, pairs, b, acc),
                (2, Panel::I8(b)) => panel_rows_avx2::<2, i8>(a_pairs, pairs, b, acc),
                (3, Panel::I8(b)) => panel_rows_avx2::<3, i8>(a_pairs, pairs, b, acc),
                (_, Panel::I8(b)) => panel_rows_avx2::<4, i8>(a_pairs, pairs, b, acc),
                (1, Panel::I16(b)) => panel_rows_avx2::<1, i16>(a_pairs, pairs, b, acc),
                (2, Panel::I16(b)) => panel_rows_avx2::<2, i16>(a_pairs, pairs, b, acc),
                (3, Panel::I16(b)) => panel_rows_avx2::<3, i16>(a_pairs, pairs, b, acc),
                (_, Panel::I16(b)) => panel_rows_avx2::<4, i16>(a_pairs, pairs, b, acc),
            }
        }
        return;
    }
    panel_rows_portable(rows, a_pairs, pairs, panel, acc)
}

fn panel_rows_portable(
    rows: usize,
    a_pairs: &[i32],
    pairs: usize,
    panel: Panel,
    acc: &mut [[i32; NR]; MR],
) {
    for (r, lanes) in acc.iter_mut().enumerate().take(rows) {
        for q in 0..pairs {
            let pair = a_pairs[r * pairs + q] as u32;
            let (a0, a1) = (
                i32::from(pair as u16 as i16),
                i32::from((pair >> 16) as u16 as i16),
            );
            let step = q * 2 * NR;
            for (j, lane) in lanes.iter_mut().enumerate() {
                let two = a0 * panel.get(step + 2 * j) + a1 * panel.get(step + 2 * j + 1);
                *lane = lane.wrapping_add(two);
            }
        }
    }
}

/// A panel value type the AVX2 kernel widens to 16 bits as it loads.
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
unsafe fn panel_rows_avx2<const R: usize, T: Widen>(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(len: usize, seed: u64, lo: i32, hi: i32) -> Vec<i32> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                lo + ((s >> 33) % (hi - lo + 1) as u64) as i32
            })
            .collect()
    }

    /// Every path equals the i64 sum wrapped to i32: byte and 16-bit panels, odd k, n not a
    /// multiple of 16, row counts around MR, extreme codes (±255, whose sums of 40,000
    /// products wrap), one and two threads.
    #[test]
    fn packed_integer_product_equals_the_wrapped_exact_sum() {
        for (i, &(m, k, n, lo, hi)) in [
            (1, 1, 1, -255, 255),
            (3, 7, 17, -255, 255),
            (4, 64, 16, -128, 127),
            (5, 33, 40, 0, 255),
            (9, 129, 100, -255, 255),
            (2, 40_000, 3, 255, 255),
        ]
        .iter()
        .enumerate()
        {
            let a = codes(m * k, 3 + i as u64, lo, hi);
            let b = codes(k * n, 5 + i as u64, lo.min(-lo), hi);
            let want: Vec<i32> = (0..m * n)
                .map(|o| {
                    let (r, j) = (o / n, o % n);
                    (0..k)
                        .map(|p| i64::from(a[r * k + p]) * i64::from(b[p * n + j]))
                        .sum::<i64>() as i32
                })
                .collect();
            let packed = PackedIntB::new(&b, k, n);
            for threads in [1, 2] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut c = vec![7i32; m * n];
                pool.install(|| packed.product(m, &a, &mut c));
                assert_eq!(c, want, "case {i}, {threads} threads");
            }
            let mut portable = [[0i32; NR]; MR];
            let pairs = k.div_ceil(2);
            let mut a_pairs = vec![0i32; m * pairs];
            for r in 0..m {
                for q in 0..pairs {
                    let lo = a[r * k + 2 * q] as i16 as u16 as u32;
                    let hi = if 2 * q + 1 < k {
                        a[r * k + 2 * q + 1] as i16 as u16 as u32
                    } else {
                        0
                    };
                    a_pairs[r * pairs + q] = (lo | hi << 16) as i32;
                }
            }
            let rows = m.min(MR);
            let panel = match &packed.data {
                Panels::I8(v) => Panel::I8(&v[..pairs * 2 * NR]),
                Panels::I16(v) => Panel::I16(&v[..pairs * 2 * NR]),
            };
            assert_eq!(
                matches!(panel, Panel::I8(_)),
                b.iter().all(|v| (-128..=127).contains(v)),
                "case {i}"
            );
            panel_rows_portable(rows, &a_pairs, pairs, panel, &mut portable);
            for r in 0..rows {
                for j in 0..NR.min(n) {
                    assert_eq!(portable[r][j], want[r * n + j], "case {i}, portable");
                }
            }
        }
    }
}
