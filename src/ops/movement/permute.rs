//! Permuting the axes of an f32 tensor (Transpose, and the operand layouts of Einsum and the
//! fused ops): the permutation is first reduced to its fewest axes (unit axes dropped, input
//! axes that stay adjacent and in order merged), then either contiguous runs are copied (the
//! innermost axis stays innermost) or 8×8 blocks are transposed through registers (it moves).
//! Only values move, so the result is the same bits whatever the path or thread count.

use crate::ops::util::unzeroed_f32;
use crate::tensor::strides_of;
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Values above which the copy is split over threads.
const PARALLEL_VALUES: usize = 1 << 16;

/// `x` (of `shape`) with its axes permuted: output axis i is input axis `perm[i]`.
pub fn permute_f32(x: &[f32], shape: &[usize], perm: &[usize]) -> Vec<f32> {
    let (dims, perm) = simplify(shape, perm);
    let n = x.len();
    let r = dims.len();
    if r <= 1 || n == 0 {
        return x.to_vec();
    }
    let in_st = strides_of(&dims);
    let out_dims: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    let out_st = strides_of(&out_dims);
    if perm[r - 1] == r - 1 {
        // Runs of the innermost axis, contiguous on both sides.
        let run = dims[r - 1];
        let src_of = |j: usize| {
            // Run j's offset in x: j spelled over the output's outer axes.
            let (mut j, mut off) = (j, 0);
            for d in (0..r - 1).rev() {
                off += (j % out_dims[d]) * in_st[perm[d]];
                j /= out_dims[d];
            }
            off
        };
        let copy = |(j, dst): (usize, &mut [MaybeUninit<f32>])| {
            let s = src_of(j);
            for (d, &v) in dst.iter_mut().zip(&x[s..s + run]) {
                d.write(v);
            }
        };
        let fill = |out: &mut [MaybeUninit<f32>]| {
            if n >= PARALLEL_VALUES {
                out.par_chunks_mut(run).enumerate().for_each(copy);
            } else {
                out.chunks_mut(run).enumerate().for_each(copy);
            }
        };
        // SAFETY: the runs (chunks of `run` values) cover the n outputs, each copied whole.
        return unsafe { unzeroed_f32(n, fill) };
    }
    // The innermost axis moves: input axis `pi` becomes the output's innermost, and the
    // input's innermost becomes output axis q. For every index of the other axes a 2-D
    // transpose: out[a·out_st[q] + b] = x[a + b·in_st[pi]] (a < dims[r-1], b < dims[pi]).
    let pi = perm[r - 1];
    let q = perm
        .iter()
        .position(|&p| p == r - 1)
        .expect("a permutation");
    let others: Vec<usize> = (0..r - 1).filter(|&d| d != q).collect();
    let planes: usize = others.iter().map(|&d| out_dims[d]).product();
    let (rows, cols) = (dims[r - 1], dims[pi]);
    let (ld_src, ld_dst) = (in_st[pi], out_st[q]);
    let how = crate::ops::util::Transpose8::detect();
    let fill = |out: &mut [MaybeUninit<f32>]| {
        let dst_ptr = crate::ops::util::DisjointPtr(out.as_mut_ptr() as *mut f32);
        // One task: plane `t`, rows a0..a1 of it.
        let row_blocks = if planes >= 4 || n < PARALLEL_VALUES {
            1
        } else {
            rows.div_ceil(64).clamp(1, 16)
        };
        let task = |t: usize| {
            let (plane, rb) = (t / row_blocks, t % row_blocks);
            let (mut rest, mut src0, mut dst0) = (plane, 0, 0);
            for &d in others.iter().rev() {
                let i = rest % out_dims[d];
                rest /= out_dims[d];
                src0 += i * in_st[perm[d]];
                dst0 += i * out_st[d];
            }
            let per = rows.div_ceil(row_blocks);
            let (a0, a1) = (rb * per, ((rb + 1) * per).min(rows));
            let (a8, b8) = (a0 + (a1 - a0) / 8 * 8, cols / 8 * 8);
            let put = |a: usize, b: usize| {
                // SAFETY: (plane, a, b) is one output element, written by the one task that owns
                // plane and row a; inside `out` (n values).
                unsafe { *dst_ptr.get().add(dst0 + a * ld_dst + b) = x[src0 + a + b * ld_src] };
            };
            for a in (a0..a8).step_by(8) {
                for b in (0..b8).step_by(8) {
                    assert!(src0 + (a + 7) + (b + 7) * ld_src < x.len());
                    // SAFETY: the 8×8 block's source lies in x (asserted), its destination is
                    // rows a..a + 8 of this task's plane (see `put`).
                    unsafe {
                        crate::ops::util::transpose_8x8(
                            x[src0 + a + b * ld_src..].as_ptr(),
                            ld_src,
                            dst_ptr.get().add(dst0 + a * ld_dst + b),
                            ld_dst,
                            None,
                            how,
                        );
                    }
                }
                for a in a..a + 8 {
                    (b8..cols).for_each(|b| put(a, b));
                }
            }
            for a in a8..a1 {
                (0..cols).for_each(|b| put(a, b));
            }
        };
        let tasks = planes * row_blocks;
        if n >= PARALLEL_VALUES {
            (0..tasks).into_par_iter().for_each(task);
        } else {
            (0..tasks).for_each(task);
        }
    };
    // SAFETY: the tasks cover every plane, and each of its rows a (a0..a1 over the row
    // blocks) and columns b (8×8 blocks, then the rest one by one): all n values written.
    unsafe { unzeroed_f32(n, fill) }
}

/// The same permutation on the fewest axes: unit axes dropped, and runs of input axes that
/// are also consecutive, in order, in the output merged into one.
fn simplify(shape: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let kept: Vec<usize> = perm.iter().copied().filter(|&p| shape[p] != 1).collect();
    // Input axes in output order, grouped into runs p, p+1, … (in the input's numbering of
    // the kept axes).
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for &p in &kept {
        match groups.last_mut() {
            Some(g) if next_kept(shape, *g.last().expect("non-empty")) == Some(p) => g.push(p),
            _ => groups.push(vec![p]),
        }
    }
    // Each group is one axis; number the groups by where they start in the input.
    let mut by_input: Vec<usize> = (0..groups.len()).collect();
    by_input.sort_by_key(|&g| groups[g][0]);
    let dims: Vec<usize> = by_input
        .iter()
        .map(|&g| groups[g].iter().map(|&p| shape[p]).product())
        .collect();
    let mut perm = vec![0; groups.len()];
    for (new_axis, &g) in by_input.iter().enumerate() {
        perm[g] = new_axis;
    }
    (dims, perm)
}

/// The next input axis after `p` that is not a unit axis.
fn next_kept(shape: &[usize], p: usize) -> Option<usize> {
    (p + 1..shape.len()).find(|&d| shape[d] != 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Element by element: output index spelled out, read through the permuted strides.
    fn reference(x: &[f32], shape: &[usize], perm: &[usize]) -> Vec<f32> {
        let st = strides_of(shape);
        let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
        (0..x.len())
            .map(|mut i| {
                let mut off = 0;
                for d in (0..out_shape.len()).rev() {
                    off += (i % out_shape[d]) * st[perm[d]];
                    i /= out_shape[d];
                }
                x[off]
            })
            .collect()
    }

    #[test]
    fn every_permutation_moves_every_value_where_the_reference_does() {
        let cases: &[(&[usize], &[usize])] = &[
            (&[1, 128, 4, 64], &[0, 2, 1, 3]),
            (&[1, 4, 128, 64], &[0, 1, 3, 2]),
            (&[3, 5, 7], &[2, 0, 1]),
            (&[9, 17], &[1, 0]),
            (&[300, 260], &[1, 0]),
            (&[2, 3, 1, 5, 4], &[4, 2, 0, 3, 1]),
            (&[6, 1, 1, 10], &[3, 1, 2, 0]),
            (&[1, 1], &[1, 0]),
            (&[4, 5, 6], &[0, 1, 2]),
            (&[2, 70, 3, 80], &[0, 3, 2, 1]),
            (&[0, 3], &[1, 0]),
        ];
        for &(shape, perm) in cases {
            let n: usize = shape.iter().product();
            let x: Vec<f32> = (0..n).map(|i| i as f32 - 0.5).collect();
            let want = reference(&x, shape, perm);
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let got = pool.install(|| permute_f32(&x, shape, perm));
                assert_eq!(got, want, "{shape:?} by {perm:?}, {threads} threads");
            }
        }
    }

    #[test]
    fn adjacent_axes_merge_and_unit_axes_drop() {
        assert_eq!(
            simplify(&[1, 128, 4, 64], &[0, 2, 1, 3]),
            (vec![128, 4, 64], vec![1, 0, 2])
        );
        assert_eq!(simplify(&[2, 3, 4], &[1, 2, 0]), (vec![2, 12], vec![1, 0]));
        assert_eq!(simplify(&[2, 1, 4], &[2, 1, 0]), (vec![2, 4], vec![1, 0]));
        assert_eq!(simplify(&[2, 3], &[0, 1]), (vec![6], vec![0]));
    }
}
