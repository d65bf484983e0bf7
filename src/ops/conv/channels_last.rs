//! Channels-last ([N, H, W, C]) images for the gathered product: a 2-D convolution whose
//! input or output the interpreter carries between convolutions in that layout
//! ([`crate::ops::ChannelsLast`]). The gathered product writes [position, channel] blocks,
//! which are rows of a channels-last output as they stand (no transposition into planes),
//! and reads a channels-last image through the same offsets as a planar one: tap p of the
//! row for position q at `origins[q] + offsets[p]`, the taps in the same order (channel,
//! kernel row, kernel column), so every output is the same chain of fused multiply-adds in
//! either layout.

use super::Window;
use rayon::prelude::*;

/// A channels-last image ([images, H, W, C]) with the convolution's zero padding around each
/// image and each padded row's pixels split into column-stride phases (pixel x·s + r in
/// phase r), so that consecutive output columns read pixels one apart (C values).
pub(super) struct PaddedPixels {
    pub data: Vec<f32>,
    /// Pixels per padded row (all phases), per phase, and the column stride.
    row: usize,
    phase: usize,
    stride_w: usize,
    /// Values per padded image.
    pub image: usize,
    channels: usize,
}

impl PaddedPixels {
    pub fn new(x: &[f32], images: usize, channels: usize, in_sp: &[usize], w: &Window) -> Self {
        let (ih, iw) = (in_sp[0], in_sp[1]);
        let (ph, pw) = (w.pad_begin[0], w.pad_begin[1]);
        let hp = ih + ph + w.pad_end[0];
        let wp = iw + pw + w.pad_end[1];
        let sw = w.strides[1];
        let phase = wp.div_ceil(sw);
        let row = phase * sw;
        let image = hp * row * channels;
        let mut data = vec![0f32; images * image];
        let c = channels;
        // One padded row a task: its input row's pixels, each C values, to their phase.
        let fill = |(r, dst): (usize, &mut [f32])| {
            let (img, y) = (r / hp, r % hp);
            if y < ph || y >= ph + ih {
                return;
            }
            let src = &x[((img * ih) + y - ph) * iw * c..][..iw * c];
            for (ix, pixel) in src.chunks_exact(c.max(1)).enumerate() {
                let px = ix + pw;
                let at = (px % sw) * phase + px / sw;
                dst[at * c..(at + 1) * c].copy_from_slice(pixel);
            }
        };
        let row_values = (row * c).max(1);
        if images * image >= 1 << 15 {
            data.par_chunks_mut(row_values).enumerate().for_each(fill);
        } else {
            data.chunks_mut(row_values).enumerate().for_each(fill);
        }
        PaddedPixels {
            data,
            row,
            phase,
            stride_w: sw,
            image,
            channels,
        }
    }

    /// Per im2col row p (channel, kernel row, kernel column): where its tap for output (0, 0)
    /// lies in an image of `data`.
    pub fn tap_offsets(&self, w: &Window) -> Vec<usize> {
        let c = self.channels;
        let taps: Vec<usize> = (0..w.kernel[0])
            .flat_map(|kh| (0..w.kernel[1]).map(move |kw| (kh, kw)))
            .map(|(kh, kw)| (kh * w.dilations[0] * self.row + self.column(kw * w.dilations[1])) * c)
            .collect();
        (0..c)
            .flat_map(|ci| taps.iter().map(move |&t| t + ci))
            .collect()
    }

    /// Per output position (oh, ow) in row-major order: where its window's origin lies in an
    /// image of `data`.
    pub fn window_origins(&self, w: &Window) -> Vec<usize> {
        let c = self.channels;
        (0..w.out[0])
            .flat_map(|oh| (0..w.out[1]).map(move |ow| (oh * w.strides[0] * self.row + ow) * c))
            .collect()
    }

    /// Where padded column `x0 + ow·s` lies in a row, in pixels, less `ow`.
    fn column(&self, x0: usize) -> usize {
        (x0 % self.stride_w) * self.phase + x0 / self.stride_w
    }
}

/// Per output position (row-major) of an unpadded 1×1 convolution: where its pixel lies in a
/// channels-last image of `in_sp` pixels and `channels` values each, read at `strides`.
pub(super) fn strided_pixel_origins(
    in_sp: &[usize],
    strides: &[usize],
    out: &[usize],
    channels: usize,
) -> Vec<usize> {
    let (oh_n, ow_n) = (out[0], out[1]);
    (0..oh_n)
        .flat_map(|oh| {
            (0..ow_n).map(move |ow| (oh * strides[0] * in_sp[1] + ow * strides[1]) * channels)
        })
        .collect()
}

/// [N, C, P] values as [N, P, C] (or back, with `c` and `p` swapped): each image's matrix
/// transposed, in parallel over blocks of rows of the result.
pub(super) fn transpose_images(x: &[f32], n: usize, c: usize, p: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * c * p];
    if c == 0 || p == 0 {
        return out;
    }
    const BLOCK: usize = 16;
    // Tasks of BLOCK result rows of one image (rows: positions; columns: channels).
    out.par_chunks_mut(BLOCK * c)
        .enumerate()
        .for_each(|(t, dst)| {
            let first = t * BLOCK;
            for (r, row) in dst.chunks_mut(c).enumerate() {
                let (img, q) = ((first + r) / p, (first + r) % p);
                let src = &x[img * c * p..];
                for (ch, v) in row.iter_mut().enumerate() {
                    *v = src[ch * p + q];
                }
            }
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(k: usize, s: usize, pad: usize, ih: usize, iw: usize) -> Window {
        let attrs = super::super::WindowAttrs {
            kernel_shape: Some(vec![k, k]),
            strides: Some(vec![s, s]),
            dilations: None,
            pads: Some(vec![pad; 4]),
            auto_pad: super::super::AutoPad::NotSet,
        };
        super::super::window(&attrs, &[ih, iw], &[k, k], false).expect("window")
    }

    #[test]
    fn padded_pixels_put_every_tap_where_the_planar_image_has_it() {
        // Each tap of each output position reads the input value the definition names (or a
        // padding zero), for strides 1 and 2 and a dilation-free 3×3 and 2×2 kernel.
        for (k, s, pad, ih, iw, c) in [(3, 1, 1, 5, 7, 3), (3, 2, 1, 6, 5, 2), (2, 2, 0, 4, 6, 4)] {
            let w = window(k, s, pad, ih, iw);
            let x: Vec<f32> = (0..2 * ih * iw * c).map(|i| i as f32 + 1.0).collect();
            let img = PaddedPixels::new(&x, 2, c, &[ih, iw], &w);
            let (offsets, origins) = (img.tap_offsets(&w), img.window_origins(&w));
            for n in 0..2 {
                for (q, &o) in origins.iter().enumerate() {
                    let (oh, ow) = (q / w.out[1], q % w.out[1]);
                    for (p, &off) in offsets.iter().enumerate() {
                        let (ci, kh, kw) = (p / (k * k), p / k % k, p % k);
                        let (y, xx) = ((oh * s + kh) as isize - pad as isize, (ow * s + kw) as isize - pad as isize);
                        let want = if y < 0 || xx < 0 || y >= ih as isize || xx >= iw as isize {
                            0.0
                        } else {
                            x[((n * ih + y as usize) * iw + xx as usize) * c + ci]
                        };
                        assert_eq!(img.data[n * img.image + o + off], want, "k{k} s{s} q{q} p{p}");
                    }
                }
            }
        }
    }

    #[test]
    fn strided_pixel_origins_name_each_positions_pixel() {
        let o = strided_pixel_origins(&[4, 6], &[2, 2], &[2, 3], 5);
        assert_eq!(o, vec![0, 10, 20, 60, 70, 80]);
    }

    #[test]
    fn transposing_images_there_and_back_gives_them_back() {
        let (n, c, p) = (2, 5, 37);
        let x: Vec<f32> = (0..n * c * p).map(|i| i as f32).collect();
        let t = transpose_images(&x, n, c, p);
        assert_eq!(t[(p + 3) * c + 2], x[(c + 2) * p + 3]);
        assert_eq!(transpose_images(&t, n, p, c), x);
    }
}
