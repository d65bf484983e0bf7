//! DFT (opsets 17 and 20) and STFT (opset 17), as the onnx reference implementation computes
//! them (numpy's FFT): sums in f64, the result rounded to the input's type once.
//!
//! A signal is `[..., 1]` (real) or `[..., 2]` (complex); the output is always complex
//! `[..., 2]`. DFT transforms along `axis` (opset 17: an attribute, default 1; opset 20: an
//! input, default −2, counted from the back including the complex axis), zero-padding or
//! truncating the signal to `dft_length`; `inverse` uses `e^{+2πi·jk/n}` and divides by n;
//! `onesided` keeps the first `n/2 + 1` frequencies; `inverse` with `onesided` reads a one-sided
//! spectrum and returns the real `[..., 1]` signal of `dft_length` (default `2·(bins − 1)`)
//! points, as numpy's irfft. STFT cuts `[batch, length, 1|2]` into
//! `1 + (length − frame_length) / frame_step` frames of the window's length, weights them by
//! the window (ones when absent), and transforms each with `frame_length` points:
//! `[batch, frames, bins, 2]`. The window functions and MelWeightMatrix run as their ONNX
//! function bodies.

use super::attrs::{boxed, AttrError, Attrs};
use super::shape::{fact, FactsResult};
use super::util::{checked_len, in_dtype, input, input_i64s, opt_input};
use super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use crate::graph::fact::Fact;
use crate::graph::Node;
use crate::tensor::Tensor;
use rayon::prelude::*;
use std::f64::consts::PI;

pub fn register(r: &mut Registry) {
    use InputRole::{Data, Param};
    r.add("DFT", dft)
        .parse(|n, _| boxed(DftAttrs::parse(n)))
        .roles(&[Data, Param, Param])
        .infer(unknown_complex);
    r.add("STFT", stft)
        .parse(|n, _| boxed(Attrs::new(n).flag("onesided", true)))
        .roles(&[Data, Param, Data, Param])
        .infer(unknown_complex);
}

/// DFT's attributes (opset 17's `axis` attribute; opset 20 takes it as an input).
#[derive(Clone, Debug, PartialEq)]
pub struct DftAttrs {
    pub axis: i64,
    pub inverse: bool,
    pub onesided: bool,
}

impl DftAttrs {
    fn parse(node: &Node) -> Result<DftAttrs, AttrError> {
        let a = Attrs::new(node);
        Ok(DftAttrs {
            axis: a.int_or("axis", 1)?,
            inverse: a.flag("inverse", false)?,
            onesided: a.flag("onesided", false)?,
        })
    }
}

/// The outputs' rank is the input's; sizes depend on values (lengths given as inputs).
fn unknown_complex(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    let shape = x.rank().map(|r| {
        let r = if ctx.node.op_type == "STFT" { 4 } else { r };
        (0..r).map(|_| ctx.unknown_dim()).collect()
    });
    Ok(vec![Fact::new(x.dtype, shape)])
}

/// A signal's values as complex numbers (re, im) from its `[..., 1|2]` layout.
fn complex_values(x: &Tensor) -> Result<Vec<(f64, f64)>, OpError> {
    let last = x.shape().last().copied().unwrap_or(0);
    if !(1..=2).contains(&last) || x.rank() < 2 {
        return Err(OpError(format!(
            "the signal {:?} must end in 1 (real) or 2 (complex)",
            x.shape()
        )));
    }
    let v = x
        .to_f64_vec()
        .filter(|_| x.dtype().is_float())
        .ok_or_else(|| {
            OpError(format!(
                "the signal has dtype {}, expected a float type",
                x.dtype()
            ))
        })?;
    Ok(match last {
        1 => v.into_iter().map(|re| (re, 0.0)).collect(),
        _ => v.chunks(2).map(|c| (c[0], c[1])).collect(),
    })
}

/// The `n`-point DFT of `line` (zero-padded or truncated), frequencies `0..keep`.
fn transform(line: &[(f64, f64)], n: usize, keep: usize, inverse: bool) -> Vec<(f64, f64)> {
    let sign = if inverse { 1.0 } else { -1.0 };
    let m = line.len().min(n);
    (0..keep)
        .map(|k| {
            let (mut re, mut im) = (0.0, 0.0);
            for (j, &(a, b)) in line[..m].iter().enumerate() {
                // The angle reduced mod n first keeps large j·k exact.
                let ang = sign * 2.0 * PI * ((j * k) % n) as f64 / n as f64;
                let (s, c) = ang.sin_cos();
                re += a * c - b * s;
                im += a * s + b * c;
            }
            if inverse {
                (re / n as f64, im / n as f64)
            } else {
                (re, im)
            }
        })
        .collect()
}

/// The real `n`-point signal of a one-sided spectrum (bins `0..=n/2`, zero-padded or
/// truncated), its other half the conjugate mirror; the imaginary parts of bin 0 and, for an
/// even `n`, bin `n/2` are ignored (numpy's irfft).
fn real_signal(spectrum: &[(f64, f64)], n: usize) -> Vec<f64> {
    let half = n / 2;
    let bin = |k: usize| spectrum.get(k).copied().unwrap_or((0.0, 0.0));
    (0..n)
        .map(|j| {
            let mut x = bin(0).0;
            for k in 1..=half {
                let (re, im) = bin(k);
                let ang = 2.0 * PI * ((j * k) % n) as f64 / n as f64;
                let (s, c) = ang.sin_cos();
                if 2 * k == n {
                    x += re * c;
                } else {
                    x += 2.0 * (re * c - im * s);
                }
            }
            x / n as f64
        })
        .collect()
}

fn dft(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<DftAttrs>()?;
    let x = input(inputs, 0)?;
    let values = complex_values(x)?;
    let shape = x.shape();
    let r = shape.len();
    let axis = if ctx.opset >= 20 {
        let a = match opt_input(inputs, 2) {
            Some(_) => *input_i64s(inputs, 2)?
                .first()
                .ok_or_else(|| OpError("axis is empty".into()))?,
            None => -2,
        };
        if a < 0 {
            a + r as i64
        } else {
            a
        }
    } else {
        attrs.axis
    };
    if axis < 0 || axis as usize + 1 >= r {
        return Err(OpError(format!(
            "axis {axis} is not a signal axis of {shape:?} (0..{})",
            r - 1
        )));
    }
    let axis = axis as usize;
    let len = shape[axis];
    let n = match opt_input(inputs, 1) {
        Some(_) => {
            let d = *input_i64s(inputs, 1)?
                .first()
                .ok_or_else(|| OpError("dft_length is empty".into()))?;
            usize::try_from(d)
                .ok()
                .filter(|&d| d > 0)
                .ok_or_else(|| OpError(format!("dft_length must be >= 1, got {d}")))?
        }
        None => len,
    };
    if n == 0 {
        return Err(OpError(format!(
            "the signal axis {axis} of {shape:?} is empty"
        )));
    }
    // An inverse of a one-sided spectrum is a real signal (numpy's irfft).
    let real_inverse = attrs.inverse && attrs.onesided;
    let n = if real_inverse && opt_input(inputs, 1).is_none() {
        2 * (len.max(1) - 1)
    } else {
        n
    };
    if n == 0 {
        return Err(OpError(format!(
            "a one-sided spectrum of {len} bins has no signal length"
        )));
    }
    let keep = if real_inverse || !attrs.onesided {
        n
    } else {
        n / 2 + 1
    };
    let inner: usize = shape[axis + 1..r - 1].iter().product();
    let mut out_shape = shape.to_vec();
    out_shape[axis] = keep;
    let parts = if real_inverse { 1 } else { 2 };
    out_shape[r - 1] = parts;
    let mut out = vec![0f64; checked_len(&out_shape)?];
    out.par_chunks_mut((keep * inner * parts).max(1))
        .enumerate()
        .for_each(|(o, dst)| {
            for i in 0..inner {
                let line: Vec<(f64, f64)> = (0..len)
                    .map(|j| values[(o * len + j) * inner + i])
                    .collect();
                if real_inverse {
                    for (k, x) in real_signal(&line, n).into_iter().enumerate() {
                        dst[k * inner + i] = x;
                    }
                    continue;
                }
                for (k, (re, im)) in transform(&line, n, keep, attrs.inverse)
                    .into_iter()
                    .enumerate()
                {
                    dst[(k * inner + i) * 2] = re;
                    dst[(k * inner + i) * 2 + 1] = im;
                }
            }
        });
    Ok(vec![in_dtype_f64(out_shape, out, x)])
}

/// An f64 result handed back in the signal's float type.
fn in_dtype_f64(shape: Vec<usize>, v: Vec<f64>, like: &Tensor) -> Tensor {
    let t = Tensor::from_f64(shape, v);
    if like.dtype() == crate::tensor::DType::F64 {
        t
    } else {
        in_dtype(
            super::cast::cast_tensor(&t, crate::tensor::DType::F32),
            like.dtype(),
        )
    }
}

fn stft(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let onesided = *ctx.attrs::<bool>()?;
    let x = input(inputs, 0)?;
    let values = complex_values(x)?;
    let shape = x.shape();
    if shape.len() != 3 {
        return Err(OpError(format!(
            "the signal {shape:?} must be [batch, length, 1|2]"
        )));
    }
    let (batch, len) = (shape[0], shape[1]);
    let step = *input_i64s(inputs, 1)?
        .first()
        .ok_or_else(|| OpError("frame_step is empty".into()))?;
    let step = usize::try_from(step)
        .ok()
        .filter(|&s| s > 0)
        .ok_or_else(|| OpError(format!("frame_step must be >= 1, got {step}")))?;
    let window = opt_input(inputs, 2)
        .map(|w| {
            w.to_f64_vec().filter(|_| w.rank() == 1).ok_or_else(|| {
                OpError(format!("window {:?} must be a 1-D float tensor", w.shape()))
            })
        })
        .transpose()?;
    let frame_len = match opt_input(inputs, 3) {
        Some(_) => {
            let f = *input_i64s(inputs, 3)?
                .first()
                .ok_or_else(|| OpError("frame_length is empty".into()))?;
            usize::try_from(f)
                .ok()
                .filter(|&f| f > 0)
                .ok_or_else(|| OpError(format!("frame_length must be >= 1, got {f}")))?
        }
        None => window.as_ref().map_or(len, Vec::len),
    };
    let window = window.unwrap_or_else(|| vec![1.0; frame_len]);
    let wlen = window.len();
    if frame_len > len || wlen == 0 {
        return Err(OpError(format!(
            "frame_length {frame_len} (window {wlen}) does not fit the signal's {len} samples"
        )));
    }
    let frames = 1 + (len - frame_len) / step;
    let bins = if onesided {
        frame_len / 2 + 1
    } else {
        frame_len
    };
    let out_shape = vec![batch, frames, bins, 2];
    let mut out = vec![0f64; checked_len(&out_shape)?];
    out.par_chunks_mut((bins * 2).max(1))
        .enumerate()
        .for_each(|(bf, dst)| {
            let (b, f) = (bf / frames, bf % frames);
            let line: Vec<(f64, f64)> = (0..wlen)
                .map(|j| {
                    let t = f * step + j;
                    if t < len {
                        let (re, im) = values[b * len + t];
                        (re * window[j], im * window[j])
                    } else {
                        (0.0, 0.0)
                    }
                })
                .collect();
            for (k, (re, im)) in transform(&line, frame_len, bins, false)
                .into_iter()
                .enumerate()
            {
                dst[2 * k] = re;
                dst[2 * k + 1] = im;
            }
        });
    Ok(vec![in_dtype_f64(out_shape, out, x)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dft_of_an_impulse_and_back() {
        // An impulse at 1 of 4 points: e^{-2πik/4} = 1, -i, -1, i.
        let f = transform(
            &[(0.0, 0.0), (1.0, 0.0), (0.0, 0.0), (0.0, 0.0)],
            4,
            4,
            false,
        );
        let want = [(1.0, 0.0), (0.0, -1.0), (-1.0, 0.0), (0.0, 1.0)];
        for (g, w) in f.iter().zip(want) {
            assert!(
                (g.0 - w.0).abs() < 1e-12 && (g.1 - w.1).abs() < 1e-12,
                "{f:?}"
            );
        }
        let back = transform(&f, 4, 4, true);
        assert!((back[1].0 - 1.0).abs() < 1e-12 && back[0].0.abs() < 1e-12);
        // Zero padding: a 2-point signal read as 4 points.
        assert_eq!(
            transform(&[(1.0, 0.0), (1.0, 0.0)], 4, 1, false),
            vec![(2.0, 0.0)]
        );
    }

    #[test]
    fn bad_signals_are_named() {
        let x = Tensor::from_f32(vec![1, 4, 3], vec![0.0; 12]);
        let e = complex_values(&x).unwrap_err();
        assert!(e.0.contains("[1, 4, 3]"), "{e}");
    }
}
