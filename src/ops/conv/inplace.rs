//! A 2-D convolution's input read where it lies, without a padded copy: the gathered product's
//! rows of output positions whose windows lie inside the input start in the input itself, and
//! the rows of positions whose windows cross an edge start in an edge buffer. Every buffer has
//! the input's geometry (a row `iw` values, a plane `ih·iw`), so one table of tap offsets
//! serves all rows, and a tile may take rows from several buffers.
//!
//! The positions are grouped by the edges their windows cross (top, bottom, left, right and
//! the four corners). Each group's buffer holds, for every image and channel, the cells its
//! windows read: the input's value inside, zero outside. A cell outside the input lands on
//! another cell's index (column −1 of a row is the last column of the row before it, row −1 of
//! a plane the last row of the plane before it), so a group's cells must span at most `iw`
//! columns and `ih` rows: then no two of them share an index. A window across both edges of an
//! axis, or groups that would span more, keep the padded copy ([`InPlaceImage::new`] says no).
//!
//! Why: a padded copy is a pass over every activation, split over the threads by channels
//! where the product splits by positions (half of it crosses from one core's cache to the
//! other's), and at stride 2 a deinterleave into stride phases besides; the edge buffers hold
//! a few rows and columns per plane. The convolution takes this path at column stride 2
//! (`conv`: at stride 1 the edge columns cost more than the copy; docs/performance-history.md).
//!
//! The same values in the same order: each row's taps read the input's values or zeros, as
//! from the padded copy (`tests`).

use super::Window;

/// Most edge groups: top or bottom, left or right, or both of one of each.
const GROUPS: usize = 8;

thread_local! {
    /// Each thread's edge buffers: grown, never shrunk (a buffer of the input's size per
    /// group, of which only the few rows and columns a plane that are written are resident).
    static EDGES: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// A 2-D convolution's rows of A, for [`crate::ops::sgemm::gemm_gathered_sources`] over
/// `[input, edges]`.
pub(super) struct InPlaceImage {
    /// Per output position (images one after another, each row-major): 0 and its window's
    /// origin in the input, or 1 and its origin in `edges`.
    pub rows: Vec<(usize, usize)>,
    /// Per row of B (channel, kernel row, kernel column): where its tap lies from the origin.
    pub offsets: Vec<usize>,
    /// The edge groups' buffers, one after another (this thread's, back to it on drop).
    pub edges: Vec<f32>,
}

impl Drop for InPlaceImage {
    fn drop(&mut self) {
        EDGES.with(|kept| kept.set(std::mem::take(&mut self.edges)));
    }
}

/// A half-open range of rows or columns, possibly outside the input.
type Span = (isize, isize);

/// One edge group: where its buffer starts in `edges` and the cells its windows read (rows
/// `y`, columns `x` of every plane).
#[derive(Clone, Copy)]
struct Group {
    start: usize,
    y: Span,
    x: Span,
}

impl InPlaceImage {
    /// The rows and offsets for `images` images of `channels` channels of `in_sp` = [ih, iw]
    /// in `x` (None where the geometry does not allow it: see the module docs).
    pub fn new(
        x: &[f32],
        images: usize,
        channels: usize,
        in_sp: &[usize],
        w: &Window,
    ) -> Option<Self> {
        let (ih, iw) = (in_sp[0] as isize, in_sp[1] as isize);
        let (oh, ow) = (w.out[0], w.out[1]);
        let (sh, sw) = (w.strides[0] as isize, w.strides[1] as isize);
        let (dh, dw) = (w.dilations[0] as isize, w.dilations[1] as isize);
        let (ph, pw) = (w.pad_begin[0] as isize, w.pad_begin[1] as isize);
        // The window's reach from its origin (last tap), rows and columns.
        let (kh, kw) = (
            (w.kernel[0] as isize - 1) * dh,
            (w.kernel[1] as isize - 1) * dw,
        );
        let plane = (ih * iw) as usize;
        let image = channels * plane;
        if x.len() < images * image || ih == 0 || iw == 0 {
            return None;
        }
        // Each position's group (0: inside) from the edges its window crosses.
        let group_of = |y0: isize, x0: isize| -> usize {
            let (top, bottom) = (y0 < 0, y0 + kh >= ih);
            let (left, right) = (x0 < 0, x0 + kw >= iw);
            let vertical = if top {
                1
            } else if bottom {
                2
            } else {
                0
            };
            let horizontal = if left {
                1
            } else if right {
                2
            } else {
                0
            };
            // A window across both edges of an axis (a kernel as tall as the input) has no
            // group: the caller keeps the padded copy.
            if (top && bottom) || (left && right) {
                return usize::MAX;
            }
            vertical * 3 + horizontal
        };
        // Each group's cells (a bounding box over its windows).
        let mut boxes: [Option<(Span, Span)>; 9] = [None; 9];
        for r in 0..oh as isize {
            let y0 = r * sh - ph;
            for c in 0..ow as isize {
                let x0 = c * sw - pw;
                let g = group_of(y0, x0);
                if g == usize::MAX {
                    return None;
                }
                if g == 0 {
                    continue;
                }
                let b = boxes[g].get_or_insert(((y0, y0 + kh + 1), (x0, x0 + kw + 1)));
                b.0 = (b.0 .0.min(y0), b.0 .1.max(y0 + kh + 1));
                b.1 = (b.1 .0.min(x0), b.1 .1.max(x0 + kw + 1));
            }
        }
        // No two cells of a group on one index: at most ih rows and iw columns.
        if boxes
            .iter()
            .flatten()
            .any(|&((y0, y1), (x0, x1))| y1 - y0 > ih || x1 - x0 > iw)
        {
            return None;
        }
        // Each group's buffer: the images' planes, with room before the first for the cells
        // above and left of the input and after the last for those below and right.
        let before = (ph * iw + pw) as usize;
        let after = w.pad_end[0] * iw as usize + w.pad_end[1] + 1;
        let span = before + images * image + after;
        let mut groups: [Option<Group>; 9] = [None; 9];
        let mut used = 0;
        for (g, b) in boxes.iter().enumerate() {
            if let Some((y, x)) = *b {
                groups[g] = Some(Group {
                    start: used * span + before,
                    y,
                    x,
                });
                used += 1;
            }
        }
        debug_assert!(used <= GROUPS);
        // Every cell a group's windows read is written below (values or zeros): the rest of
        // the buffer keeps what an earlier convolution left, unread. Grown as a fresh zeroed
        // allocation, not by resizing: the system's zero pages stay untouched (not resident)
        // except where cells are written, a few rows and columns a plane.
        let mut edges = EDGES.with(|kept| kept.take());
        if edges.len() < used * span {
            edges = vec![0f32; used * span];
        }
        for group in groups.iter().flatten() {
            fill(&mut edges, group, x, images, channels, (ih, iw));
        }
        let mut rows = Vec::with_capacity(images * oh * ow);
        for img in 0..images {
            let base = (img * image) as isize;
            for r in 0..oh as isize {
                let y0 = r * sh - ph;
                for c in 0..ow as isize {
                    let x0 = c * sw - pw;
                    let at = base + y0 * iw + x0;
                    rows.push(match groups[group_of(y0, x0)] {
                        None => (0, at as usize),
                        Some(group) => (1, (group.start as isize + at) as usize),
                    });
                }
            }
        }
        let mut offsets = Vec::with_capacity(channels * w.kernel[0] * w.kernel[1]);
        for ci in 0..channels {
            for i in 0..w.kernel[0] as isize {
                for j in 0..w.kernel[1] as isize {
                    offsets.push(ci * plane + (i * dh * iw + j * dw) as usize);
                }
            }
        }
        Some(InPlaceImage {
            rows,
            offsets,
            edges,
        })
    }
}

/// Writes `group`'s cells of every image and channel: the input's values inside it, zeros
/// outside.
fn fill(
    edges: &mut [f32],
    group: &Group,
    x: &[f32],
    images: usize,
    channels: usize,
    (ih, iw): (isize, isize),
) {
    let plane = (ih * iw) as usize;
    let (x0, x1) = group.x;
    // Columns of the box inside the input.
    let (c0, c1) = (x0.max(0), x1.min(iw).max(x0.max(0)));
    for p in 0..images * channels {
        let (src, dst) = (p * plane, group.start as isize + (p * plane) as isize);
        for y in group.y.0..group.y.1 {
            let row = &mut edges[(dst + y * iw + x0) as usize..(dst + y * iw + x1) as usize];
            if y < 0 || y >= ih {
                row.fill(0.0);
                continue;
            }
            let (inside, after) = ((c0 - x0) as usize, (c1 - x0) as usize);
            row[..inside].fill(0.0);
            let from = src + (y * iw + c0) as usize;
            row[inside..after].copy_from_slice(&x[from..from + after - inside]);
            row[after..].fill(0.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tap of every output position reads what the padded image holds there.
    #[test]
    fn every_tap_reads_the_padded_images_value() {
        // (images, channels, ih, iw, kernel, stride, dilation, pads [top, left, bottom, right])
        type Case = (usize, usize, usize, usize, usize, usize, usize, [usize; 4]);
        let cases: &[Case] = &[
            (1, 3, 12, 14, 3, 1, 1, [1, 1, 1, 1]),
            (2, 2, 13, 11, 3, 2, 1, [1, 1, 1, 1]),
            (1, 2, 16, 16, 5, 1, 1, [2, 2, 2, 2]),
            (1, 2, 20, 18, 7, 2, 1, [3, 3, 3, 3]),
            (1, 1, 17, 19, 3, 1, 2, [2, 2, 2, 2]),
            (3, 2, 10, 12, 3, 2, 1, [0, 1, 1, 0]),
            (1, 2, 9, 9, 3, 1, 1, [0, 0, 0, 0]),
            (1, 4, 15, 15, 3, 2, 1, [1, 1, 0, 0]),
        ];
        for &(n, c, ih, iw, k, s, d, [pt, pl, pb, pr]) in cases {
            let x: Vec<f32> = (0..n * c * ih * iw).map(|i| i as f32 + 1.0).collect();
            let out = |i: usize, p: (usize, usize)| (i + p.0 + p.1 - d * (k - 1) - 1) / s + 1;
            let w = Window {
                kernel: vec![k, k],
                strides: vec![s, s],
                dilations: vec![d, d],
                pad_begin: vec![pt, pl],
                pad_end: vec![pb, pr],
                out: vec![out(ih, (pt, pb)), out(iw, (pl, pr))],
            };
            let im = InPlaceImage::new(&x, n, c, &[ih, iw], &w).expect("in place");
            let sources = [&x[..], &im.edges[..]];
            let padded = |img: usize, ch: usize, y: isize, xx: isize| -> f32 {
                if y < 0 || xx < 0 || y >= ih as isize || xx >= iw as isize {
                    0.0
                } else {
                    x[((img * c + ch) * ih + y as usize) * iw + xx as usize]
                }
            };
            let (oh, ow) = (w.out[0], w.out[1]);
            assert_eq!(im.rows.len(), n * oh * ow);
            for img in 0..n {
                for r in 0..oh {
                    for col in 0..ow {
                        let (src, o) = im.rows[(img * oh + r) * ow + col];
                        for ch in 0..c {
                            for i in 0..k {
                                for j in 0..k {
                                    let p = (ch * k + i) * k + j;
                                    let got = sources[src][o + im.offsets[p]];
                                    let y = (r * s + i * d) as isize - pt as isize;
                                    let xx = (col * s + j * d) as isize - pl as isize;
                                    assert_eq!(
                                        got,
                                        padded(img, ch, y, xx),
                                        "case {:?}: image {img} position ({r}, {col}) tap ({ch}, {i}, {j})",
                                        (n, c, ih, iw, k, s, d)
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// A window across both edges of an axis keeps the padded copy.
    #[test]
    fn windows_wider_than_the_input_say_no() {
        let w = |k: usize, out: usize| Window {
            kernel: vec![k, k],
            strides: vec![1, 1],
            dilations: vec![1, 1],
            pad_begin: vec![k / 2, k / 2],
            pad_end: vec![k / 2, k / 2],
            out: vec![out, out],
        };
        let x = vec![0f32; 4 * 4];
        assert!(InPlaceImage::new(&x, 1, 1, &[4, 4], &w(5, 4)).is_none());
        assert!(InPlaceImage::new(&x, 1, 1, &[4, 4], &w(3, 4)).is_some());
    }
}
