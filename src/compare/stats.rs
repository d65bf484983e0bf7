//! Summary statistics and text histograms of a tensor, as Polygraphy's
//! `comparator/util.py` computes and prints them (`str_output_stats`, `str_histogram`).
//!
//! NumPy semantics: `min`/`max`/`median`/`quantile` are NaN when any value is NaN, and
//! `argmin`/`argmax` then point at the first NaN; quantiles use NumPy's default linear
//! interpolation; histograms use `numpy.histogram`'s 10 equal bins, the last one closed.
//! Large arrays are processed in parallel (rayon): one pass for the moments and extrema, one
//! for the variance, and `select_nth_unstable` for median and percentiles (no full sort).

use super::fmt_g;
use rayon::prelude::*;
use serde::Serialize;

/// Arrays at least this long are processed with rayon.
const PAR_MIN: usize = 1 << 16;
const CHUNK: usize = 1 << 15;

/// Polygraphy's "Stats" line of one array.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Stats {
    pub mean: f64,
    pub std_dev: f64,
    pub var: f64,
    pub median: f64,
    pub min: f64,
    /// N-D index of the (first) minimum.
    pub argmin: Vec<usize>,
    pub max: f64,
    pub argmax: Vec<usize>,
    pub avg_magnitude: f64,
    /// p90, p95, p99 (absent for bool arrays, as in Polygraphy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p90: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p95: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99: Option<f64>,
}

#[derive(Clone, Copy)]
struct Partial {
    n: usize,
    /// Sum of squared deviations from this range's mean (Chan et al.'s parallel variance).
    m2: f64,
    sum: f64,
    sum_abs: f64,
    min: f64,
    argmin: usize,
    max: f64,
    argmax: usize,
    first_nan: usize,
}

impl Partial {
    const EMPTY: Partial = Partial {
        n: 0,
        m2: 0.0,
        sum: 0.0,
        sum_abs: 0.0,
        min: f64::INFINITY,
        argmin: usize::MAX,
        max: f64::NEG_INFINITY,
        argmax: usize::MAX,
        first_nan: usize::MAX,
    };

    fn of(v: &[f64], offset: usize) -> Partial {
        let mut p = Partial::EMPTY;
        for (i, &x) in v.iter().enumerate() {
            p.sum += x;
            p.sum_abs += x.abs();
            if x < p.min || p.argmin == usize::MAX {
                p.min = x;
                p.argmin = offset + i;
            }
            if x > p.max || p.argmax == usize::MAX {
                p.max = x;
                p.argmax = offset + i;
            }
            if x.is_nan() && p.first_nan == usize::MAX {
                p.first_nan = offset + i;
            }
        }
        p.n = v.len();
        if p.n > 0 {
            // The chunk is in cache: a second pass over it costs little and keeps the
            // variance as accurate as NumPy's two-pass formula.
            let mean = p.sum / p.n as f64;
            p.m2 = v.iter().map(|&x| (x - mean) * (x - mean)).sum();
        }
        p
    }

    /// Combines two partials of consecutive ranges (`self` first): ties keep the first index.
    fn merge(self, o: Partial) -> Partial {
        let pick_min = o.argmin != usize::MAX && (self.argmin == usize::MAX || o.min < self.min);
        let pick_max = o.argmax != usize::MAX && (self.argmax == usize::MAX || o.max > self.max);
        let n = self.n + o.n;
        let m2 = if self.n == 0 {
            o.m2
        } else if o.n == 0 {
            self.m2
        } else {
            let delta = o.sum / o.n as f64 - self.sum / self.n as f64;
            self.m2 + o.m2 + delta * delta * (self.n as f64 * o.n as f64 / n as f64)
        };
        Partial {
            n,
            m2,
            sum: self.sum + o.sum,
            sum_abs: self.sum_abs + o.sum_abs,
            min: if pick_min { o.min } else { self.min },
            argmin: if pick_min { o.argmin } else { self.argmin },
            max: if pick_max { o.max } else { self.max },
            argmax: if pick_max { o.argmax } else { self.argmax },
            first_nan: self.first_nan.min(o.first_nan),
        }
    }
}

fn partial(v: &[f64]) -> Partial {
    if v.len() < PAR_MIN {
        return Partial::of(v, 0);
    }
    v.par_chunks(CHUNK)
        .enumerate()
        .map(|(c, chunk)| Partial::of(chunk, c * CHUNK))
        .collect::<Vec<_>>()
        .into_iter()
        .fold(Partial::EMPTY, Partial::merge)
}

/// The mean, min and max of `v` exactly as [`Stats::compute`] reports them (min and max NaN
/// when `v` holds NaN; all 0 when empty), without the quantiles and indices.
pub fn mean_min_max(v: &[f64]) -> (f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let p = partial(v);
    let mean = p.sum / v.len() as f64;
    if p.first_nan != usize::MAX {
        (mean, f64::NAN, f64::NAN)
    } else {
        (mean, p.min, p.max)
    }
}

/// Row-major N-D index of a flat index.
pub fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (d, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            idx[d] = flat % n;
            flat /= n;
        }
    }
    idx
}

/// A Python tuple: `()`, `(5,)`, `(0, 0, 5)`.
pub fn fmt_index(idx: &[usize]) -> String {
    match idx.len() {
        1 => format!("({},)", idx[0]),
        _ => format!(
            "({})",
            idx.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

impl Stats {
    /// Statistics of `v` (row-major, of `shape`). `with_quantiles` is false for bool arrays.
    pub fn compute(v: &[f64], shape: &[usize], with_quantiles: bool) -> Stats {
        if v.is_empty() {
            // Polygraphy returns 0 for statistics of empty arrays.
            let q = with_quantiles.then_some(0.0);
            return Stats {
                mean: 0.0,
                std_dev: 0.0,
                var: 0.0,
                median: 0.0,
                min: 0.0,
                argmin: vec![0; shape.len()],
                max: 0.0,
                argmax: vec![0; shape.len()],
                avg_magnitude: 0.0,
                p90: q,
                p95: q,
                p99: q,
            };
        }
        let n = v.len() as f64;
        let p = partial(v);
        let has_nan = p.first_nan != usize::MAX;
        let mean = p.sum / n;
        let var = if mean.is_finite() { p.m2 / n } else { f64::NAN };
        let (min, argmin, max, argmax) = if has_nan {
            (f64::NAN, p.first_nan, f64::NAN, p.first_nan)
        } else {
            (p.min, p.argmin, p.max, p.argmax)
        };
        let q = if has_nan {
            [f64::NAN; 4]
        } else {
            let qs = quantiles_no_nan(v, &[0.5, 0.9, 0.95, 0.99], Some((p.min, p.max)));
            [qs[0], qs[1], qs[2], qs[3]]
        };
        Stats {
            mean,
            std_dev: var.sqrt(),
            var,
            median: q[0],
            min,
            argmin: unravel(argmin, shape),
            max,
            argmax: unravel(argmax, shape),
            avg_magnitude: p.sum_abs / n,
            p90: with_quantiles.then_some(q[1]),
            p95: with_quantiles.then_some(q[2]),
            p99: with_quantiles.then_some(q[3]),
        }
    }

    /// `mean=..., std-dev=..., ..., p99=...` as Polygraphy prints it.
    pub fn line(&self) -> String {
        let mut s = format!(
            "mean={}, std-dev={}, var={}, median={}, min={} at {}, max={} at {}, avg-magnitude={}",
            fmt_g(self.mean, 5),
            fmt_g(self.std_dev, 5),
            fmt_g(self.var, 5),
            fmt_g(self.median, 5),
            fmt_g(self.min, 5),
            fmt_index(&self.argmin),
            fmt_g(self.max, 5),
            fmt_index(&self.argmax),
            fmt_g(self.avg_magnitude, 5)
        );
        if let (Some(a), Some(b), Some(c)) = (self.p90, self.p95, self.p99) {
            s += &format!(
                ", p90={}, p95={}, p99={}",
                fmt_g(a, 5),
                fmt_g(b, 5),
                fmt_g(c, 5)
            );
        }
        s
    }
}

/// NumPy's linear interpolation between `a` and `b` (`numpy.lib._function_base_impl._lerp`).
fn lerp(a: f64, b: f64, t: f64) -> f64 {
    let d = b - a;
    if t >= 0.5 {
        b - d * (1.0 - t)
    } else {
        a + d * t
    }
}

/// `numpy.quantile(v, q)` for each `q` (method "linear"), NaN if any value is NaN.
pub fn quantiles(v: &[f64], qs: &[f64]) -> Vec<f64> {
    if v.is_empty() || v.iter().any(|x| x.is_nan()) {
        return vec![f64::NAN; qs.len()];
    }
    quantiles_no_nan(v, qs, None)
}

/// `numpy.quantile(v, q)` of an array whose min and max (NaN when it holds NaN, as `Stats`
/// reports them) are known: NaN when it holds NaN, 0 when it is empty (as Polygraphy's stats).
pub fn quantile_in_range(v: &[f64], q: f64, min: f64, max: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    if min.is_nan() || max.is_nan() {
        return f64::NAN;
    }
    quantiles_no_nan(v, &[q], Some((min, max)))[0]
}

/// `quantiles` of a non-empty array known to hold no NaN, with its (min, max) if known.
fn quantiles_no_nan(v: &[f64], qs: &[f64], minmax: Option<(f64, f64)>) -> Vec<f64> {
    let n = v.len();
    let pos: Vec<(usize, f64)> = qs
        .iter()
        .map(|&q| {
            let h = (n - 1) as f64 * q.clamp(0.0, 1.0);
            let lo = (h.floor() as usize).min(n - 1);
            (lo, h - lo as f64)
        })
        .collect();
    let mut need: Vec<usize> = pos
        .iter()
        .flat_map(|&(lo, _)| [lo, (lo + 1).min(n - 1)])
        .collect();
    need.sort_unstable();
    need.dedup();
    let got = if n >= PAR_MIN {
        let (lo, hi) = minmax.unwrap_or_else(|| {
            let p = partial(v);
            (p.min, p.max)
        });
        order_stats_bucketed(v, &need, lo, hi)
    } else {
        order_stats_select(v, &need)
    };
    let at = |k: usize| got[need.binary_search(&k).expect("requested order statistic")];
    pos.iter()
        .map(|&(lo, t)| lerp(at(lo), at((lo + 1).min(n - 1)), t))
        .collect()
}

/// The order statistics `ks` (sorted, distinct, < len; no NaN in `v`) by `select_nth_unstable`
/// on one copy, each selection on the part right of the previous one.
fn order_stats_select(v: &[f64], ks: &[usize]) -> Vec<f64> {
    let mut w = v.to_vec();
    let mut start = 0;
    for &k in ks {
        if k == start {
            // The next order statistic is the minimum of the rest: a scan, not a selection.
            let (i, _) = w[start..]
                .iter()
                .enumerate()
                .min_by(|a, b| a.1.total_cmp(b.1))
                .expect("non-empty rest");
            w.swap(start, start + i);
        } else {
            w[start..].select_nth_unstable_by(k - start, |a, b| a.total_cmp(b));
        }
        start = k + 1;
    }
    ks.iter().map(|&k| w[k]).collect()
}

/// The same for large arrays, without copying or selecting over all of them: one parallel pass
/// counts the values in 4096 equal-width buckets between min and max (monotonic in the value),
/// a second gathers the few buckets holding the wanted ranks, and only those are selected in.
fn order_stats_bucketed(v: &[f64], ks: &[usize], lo: f64, hi: f64) -> Vec<f64> {
    const B: usize = 4096;
    if lo == hi || !(hi - lo).is_finite() {
        return order_stats_select(v, ks);
    }
    let scale = B as f64 / (hi - lo);
    let bucket = move |x: f64| (((x - lo) * scale) as usize).min(B - 1);
    let counts = v
        .par_chunks(CHUNK)
        .map(|c| {
            let mut h = vec![0usize; B];
            for &x in c {
                h[bucket(x)] += 1;
            }
            h
        })
        .reduce(
            || vec![0usize; B],
            |mut a, b| {
                for (x, y) in a.iter_mut().zip(b) {
                    *x += y;
                }
                a
            },
        );
    // For each wanted rank: its bucket and the rank within that bucket.
    let mut starts = Vec::with_capacity(B + 1);
    let mut acc = 0;
    for &c in &counts {
        starts.push(acc);
        acc += c;
    }
    starts.push(acc);
    let located: Vec<(usize, usize)> = ks
        .iter()
        .map(|&k| {
            let b = starts.partition_point(|&s| s <= k) - 1;
            (b, k - starts[b])
        })
        .collect();
    let mut wanted: Vec<usize> = located.iter().map(|&(b, _)| b).collect();
    wanted.dedup();
    let mut slot = vec![usize::MAX; B];
    for (i, &b) in wanted.iter().enumerate() {
        slot[b] = i;
    }
    let gathered = v
        .par_chunks(CHUNK)
        .map(|c| {
            let mut g: Vec<Vec<f64>> = vec![Vec::new(); wanted.len()];
            for &x in c {
                let s = slot[bucket(x)];
                if s != usize::MAX {
                    g[s].push(x);
                }
            }
            g
        })
        .reduce(
            || vec![Vec::new(); wanted.len()],
            |mut a, b| {
                for (x, y) in a.iter_mut().zip(b) {
                    x.extend(y);
                }
                a
            },
        );
    let mut per_bucket: Vec<Vec<(usize, f64)>> = vec![Vec::new(); wanted.len()];
    for &(b, r) in &located {
        let s = slot[b];
        if !per_bucket[s].iter().any(|&(rr, _)| rr == r) {
            per_bucket[s].push((r, 0.0));
        }
    }
    for (s, items) in per_bucket.iter_mut().enumerate() {
        let ranks: Vec<usize> = items.iter().map(|&(r, _)| r).collect();
        let vals = order_stats_select(&gathered[s], &ranks);
        for (it, v) in items.iter_mut().zip(vals) {
            it.1 = v;
        }
    }
    located
        .iter()
        .map(|&(b, r)| {
            per_bucket[slot[b]]
                .iter()
                .find(|&&(rr, _)| rr == r)
                .expect("selected rank")
                .1
        })
        .collect()
}

/// `numpy.histogram(v, bins=10, range=range)`: counts and the 11 edges. None where NumPy raises
/// (a range that is not finite, or lo > hi), which Polygraphy shows as no histogram.
pub fn histogram(v: &[f64], range: Option<(f64, f64)>) -> Option<(Vec<u64>, Vec<f64>)> {
    const BINS: usize = 10;
    let (mut lo, mut hi) = match range {
        Some(r) => r,
        None if v.is_empty() => (0.0, 1.0),
        None => {
            let p = partial(v);
            if p.first_nan != usize::MAX {
                return None;
            }
            (p.min, p.max)
        }
    };
    if !lo.is_finite() || !hi.is_finite() || lo > hi {
        return None;
    }
    if lo == hi {
        lo -= 0.5;
        hi += 0.5;
    }
    let step = (hi - lo) / BINS as f64;
    let mut edges: Vec<f64> = (0..=BINS).map(|i| lo + i as f64 * step).collect();
    edges[BINS] = hi;
    let scale = BINS as f64 / (hi - lo);
    let bin = |x: f64| -> Option<usize> {
        if !(x >= lo && x <= hi) {
            return None;
        }
        // A first guess (exact up to one bin), corrected against the edges as NumPy does.
        let mut i = (((x - lo) * scale) as usize).min(BINS - 1);
        if x < edges[i] && i > 0 {
            i -= 1;
        } else if i != BINS - 1 && x >= edges[i + 1] {
            i += 1;
        }
        Some(i)
    };
    let count = |c: &[f64]| {
        // Four interleaved tallies: runs of equal bins do not serialize on one counter.
        let mut h = [[0u64; BINS]; 4];
        let mut quads = c.chunks_exact(4);
        for q in &mut quads {
            for (k, &x) in q.iter().enumerate() {
                if let Some(i) = bin(x) {
                    h[k][i] += 1;
                }
            }
        }
        for &x in quads.remainder() {
            if let Some(i) = bin(x) {
                h[0][i] += 1;
            }
        }
        let mut t = [0u64; BINS];
        for row in &h {
            for (a, b) in t.iter_mut().zip(row) {
                *a += b;
            }
        }
        t
    };
    let h = if v.len() < PAR_MIN {
        count(v)
    } else {
        v.par_chunks(CHUNK).map(count).reduce(
            || [0u64; BINS],
            |mut a, b| {
                for (x, y) in a.iter_mut().zip(b) {
                    *x += y;
                }
                a
            },
        )
    };
    Some((h.to_vec(), edges))
}

/// Polygraphy's text histogram (`---- Histogram ----` and one line per bin, '#' bars up to 40
/// wide), without a trailing newline; empty when there is none to show.
pub fn str_histogram(hist: &Option<(Vec<u64>, Vec<f64>)>) -> String {
    let Some((counts, edges)) = hist else {
        return String::new();
    };
    let max = counts.iter().copied().max().unwrap_or(0);
    if max == 0 {
        return String::new();
    }
    let e: Vec<String> = edges.iter().map(|&x| fmt_g(x, 3)).collect();
    let ws = e.iter().map(|s| s.len()).max().unwrap_or(0);
    let we = e[1..].iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = String::from("---- Histogram ----\n");
    out += &format!(
        "{:w$}|  Num Elems | Visualization",
        "Bin Range",
        w = ws + we + 5
    );
    for (i, &n) in counts.iter().enumerate() {
        let bar = "#".repeat((40.0 * n as f64 / max as f64) as usize);
        out += &format!("\n({:<ws$}, {:<we$}) | {n:10} | {bar}", e[i], e[i + 1]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Reference numbers from NumPy 2 (the test venv's python):
    //   a = np.array([3., -1., 4., 1., 5., 9., 2., 6., 5., 3.]).reshape(2, 5)
    //   a.mean()=3.7 a.std()=2.6476404589747453 a.var()=7.010000000000001 np.median(a)=3.5
    //   np.quantile(a, [.9, .95, .99]) = [6.3, 7.65, 8.73]
    //   np.unravel_index(a.argmin(), a.shape) = (0, 1); argmax = (1, 0)
    //   np.histogram(a, bins=10) = [1,0,1,1,2,1,2,1,0,1],
    //     edges [-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    #[test]
    fn stats_match_numpy() {
        let a = [3., -1., 4., 1., 5., 9., 2., 6., 5., 3.];
        let s = Stats::compute(&a, &[2, 5], true);
        assert!((s.mean - 3.7).abs() < 1e-12);
        assert!((s.std_dev - 2.6476404589747453).abs() < 1e-12);
        assert!((s.var - 7.010000000000001).abs() < 1e-12);
        assert_eq!(s.median, 3.5);
        assert_eq!((s.min, s.max), (-1.0, 9.0));
        assert_eq!(s.argmin, vec![0, 1]);
        assert_eq!(s.argmax, vec![1, 0]);
        assert!((s.avg_magnitude - 3.9).abs() < 1e-12);
        assert!((s.p90.unwrap() - 6.3).abs() < 1e-12);
        assert!((s.p95.unwrap() - 7.65).abs() < 1e-12);
        assert!((s.p99.unwrap() - 8.73).abs() < 1e-12);
        assert_eq!(
            s.line(),
            "mean=3.7, std-dev=2.6476, var=7.01, median=3.5, min=-1 at (0, 1), max=9 at (1, 0), \
             avg-magnitude=3.9, p90=6.3, p95=7.65, p99=8.73"
        );
        let (h, e) = histogram(&a, None).unwrap();
        assert_eq!(h, vec![1, 0, 1, 1, 2, 1, 2, 1, 0, 1]);
        assert_eq!(e, (-1..=9).map(|x| x as f64).collect::<Vec<_>>());
    }

    // np.quantile(np.arange(7.), [0, .25, .5, .9, 1]) = [0, 1.5, 3, 5.4, 6]
    // np.quantile([1., 2.], .5) = 1.5; np.median([4., 1., 2., 3.]) = 2.5
    #[test]
    fn quantiles_interpolate_linearly() {
        let v: Vec<f64> = (0..7).rev().map(|x| x as f64).collect();
        let q = quantiles(&v, &[0.0, 0.25, 0.5, 0.9, 1.0]);
        let want = [0.0, 1.5, 3.0, 5.4, 6.0];
        for (a, b) in q.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{q:?}");
        }
        assert_eq!(quantiles(&[2.0, 1.0], &[0.5]), vec![1.5]);
        assert_eq!(quantiles(&[4.0, 1.0, 2.0, 3.0], &[0.5]), vec![2.5]);
        assert!(quantiles(&[1.0, f64::NAN], &[0.5])[0].is_nan());
    }

    // np.min/argmin with a NaN: nan at the first NaN's index.
    #[test]
    fn nan_propagates_like_numpy() {
        let s = Stats::compute(&[1.0, f64::NAN, 3.0, f64::NAN], &[4], true);
        assert!(s.min.is_nan() && s.max.is_nan() && s.median.is_nan() && s.mean.is_nan());
        assert_eq!((s.argmin.clone(), s.argmax.clone()), (vec![1], vec![1]));
        assert_eq!(fmt_index(&s.argmin), "(1,)");
        assert!(histogram(&[1.0, f64::NAN], None).is_none());
    }

    // np.histogram(np.full(5, 1.0)) -> edges 0.5 .. 1.5, all in bin 5;
    // np.histogram([0., 2.], range=(0, 2)) -> [1,0,...,0,1] (last bin closed).
    #[test]
    fn histogram_edges_like_numpy() {
        let (h, e) = histogram(&[1.0; 5], None).unwrap();
        assert_eq!(h, vec![0, 0, 0, 0, 0, 5, 0, 0, 0, 0]);
        assert_eq!((e[0], e[10]), (0.5, 1.5));
        let (h, _) = histogram(&[0.0, 2.0, 3.0], Some((0.0, 2.0))).unwrap();
        assert_eq!(h, vec![1, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        let s = str_histogram(&histogram(&[1.0, 1.05, 1.95, 2.0], None));
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "---- Histogram ----");
        assert_eq!(lines[1], "Bin Range  |  Num Elems | Visualization");
        assert_eq!(
            lines[2],
            "(1  , 1.1) |          2 | ########################################"
        );
        assert_eq!(lines[3], "(1.1, 1.2) |          0 | ");
        assert_eq!(
            lines[11],
            "(1.9, 2  ) |          2 | ########################################"
        );
    }

    #[test]
    fn large_arrays_match_serial() {
        let v: Vec<f64> = (0..200_003).map(|i| ((i * 7919) % 1000) as f64).collect();
        let s = Stats::compute(&v, &[v.len()], true);
        let p = Partial::of(&v, 0);
        assert_eq!((s.min, s.argmin[0]), (p.min, p.argmin));
        assert_eq!((s.max, s.argmax[0]), (p.max, p.argmax));
        let (h, _) = histogram(&v, None).unwrap();
        assert_eq!(h.iter().sum::<u64>(), v.len() as u64);
        // Skewed data (one huge outlier): the bucketed selection must still be exact.
        let mut w: Vec<f64> = (0..100_001)
            .map(|i| ((i * 31) % 977) as f64 * 1e-3)
            .collect();
        w[5] = 1e12;
        let ks = [0, 1, 50_000, 50_001, 90_000, 99_999, 100_000];
        assert_eq!(
            order_stats_bucketed(&w, &ks, 0.0, 1e12),
            order_stats_select(&w, &ks)
        );
        assert_eq!(
            order_stats_bucketed(&v, &ks, 0.0, 999.0),
            order_stats_select(&v, &ks)
        );
    }
}
