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
//! `[batch, frames, bins, 2]`. The window functions (HannWindow, HammingWindow,
//! BlackmanWindow; `periodic` divides by the size, else by size − 1) and MelWeightMatrix are
//! computed as the onnx reference computes them, in f64 converted to `output_datatype` once.

use super::attrs::{boxed, AttrError, Attrs};
use super::shape::{fact, FactsResult};
use super::util::{checked_len, in_dtype, input, input_i64s, opt_input, scalar_int};
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
    for (op, k) in [
        ("HannWindow", hann as super::Kernel),
        ("HammingWindow", hamming),
        ("BlackmanWindow", blackman),
    ] {
        r.add(op, k)
            .parse(|n, _| boxed(WindowAttrs::parse(n)))
            .roles(&[Param])
            .own_output_type()
            .infer(|ctx, _| {
                let a = ctx.attrs::<WindowAttrs>()?;
                Ok(vec![Fact::new(
                    Some(a.dtype),
                    Some(vec![ctx.unknown_dim()]),
                )])
            });
    }
    r.add("MelWeightMatrix", mel_weight_matrix)
        .parse(|n, _| boxed(WindowAttrs::parse(n)))
        .roles(&[Param, Param, Param, Param, Param])
        .own_output_type()
        .infer(|ctx, _| {
            let a = ctx.attrs::<WindowAttrs>()?;
            Ok(vec![Fact::new(
                Some(a.dtype),
                Some(vec![ctx.unknown_dim(), ctx.unknown_dim()]),
            )])
        });
}

/// The window functions' and MelWeightMatrix's attributes: `output_datatype` (default
/// float32) and the windows' `periodic` (default 1).
#[derive(Clone, Debug, PartialEq)]
pub struct WindowAttrs {
    pub dtype: crate::tensor::DType,
    pub periodic: bool,
}

impl WindowAttrs {
    fn parse(node: &Node) -> Result<WindowAttrs, AttrError> {
        let a = Attrs::new(node);
        let dtype = a
            .dtype("output_datatype")?
            .unwrap_or(crate::tensor::DType::F32);
        if !(dtype.is_float() || dtype.is_int()) {
            return Err(AttrError::new(
                "output_datatype",
                format!("{dtype} is not a numeric type"),
            ));
        }
        Ok(WindowAttrs {
            dtype,
            periodic: a.flag("periodic", true)?,
        })
    }
}

/// A window of `size` points from `f(n, N)` (N the size, or size − 1 when not periodic), as
/// the onnx reference computes it: in f64, converted to the output type once.
fn window_op(ctx: &OpCtx, inputs: &[Option<&Tensor>], f: fn(f64, f64) -> f64) -> OpResult {
    let a = ctx.attrs::<WindowAttrs>()?;
    let size = scalar_int(input(inputs, 0)?, "size")?;
    if size < 0 {
        return Err(OpError(format!("size is {size}, expected >= 0")));
    }
    let size = checked_len(&[size as usize])?;
    let n = if a.periodic { size } else { size - 1 } as f64;
    let v: Vec<f64> = (0..size).map(|i| f(i as f64, n)).collect();
    Ok(vec![f64_as(vec![size], v, a.dtype)])
}

fn f64_as(shape: Vec<usize>, v: Vec<f64>, dtype: crate::tensor::DType) -> Tensor {
    let t = Tensor::from_parts(shape, crate::tensor::TensorData::F64(v.into()));
    super::cast::cast_tensor(&t, dtype)
}

/// `sin²(π·n/N)`.
fn hann(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    window_op(ctx, inputs, |i, n| (PI * i / n).sin().powi(2))
}

/// `25/46 − (21/46)·cos(2π·n/N)`.
fn hamming(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    window_op(ctx, inputs, |i, n| {
        let alpha = 25.0 / 46.0;
        alpha - (2.0 * PI * i / n).cos() * (1.0 - alpha)
    })
}

/// `0.42 − 0.5·cos(2π·n/N) + 0.08·cos(4π·n/N)`.
fn blackman(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    window_op(ctx, inputs, |i, n| {
        0.42 - 0.5 * (2.0 * PI * i / n).cos() + 0.08 * (4.0 * PI * i / n).cos()
    })
}

/// MelWeightMatrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz):
/// `[dft_length/2 + 1, num_mel_bins]` triangular filters, as the onnx reference builds them —
/// the band edges in mel in f32 (the inputs' type), the bin positions in f64, floored to
/// spectrogram bins.
fn mel_weight_matrix(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let a = ctx.attrs::<WindowAttrs>()?;
    let mels = scalar_int(input(inputs, 0)?, "num_mel_bins")?;
    let dft = scalar_int(input(inputs, 1)?, "dft_length")?;
    let rate = scalar_int(input(inputs, 2)?, "sample_rate")?;
    let edge = |i: usize, what: &str| -> Result<f32, OpError> {
        let t = input(inputs, i)?;
        match (t.dtype().is_float(), t.to_f32_vec().as_deref()) {
            (true, Some([v])) => Ok(*v),
            _ => Err(OpError(format!(
                "{what} must be one float, got {} {:?}",
                t.dtype(),
                t.shape()
            ))),
        }
    };
    let (lo, hi) = (edge(3, "lower_edge_hertz")?, edge(4, "upper_edge_hertz")?);
    if mels < 1 || dft < 1 || rate < 1 {
        return Err(OpError(format!(
            "num_mel_bins {mels}, dft_length {dft} and sample_rate {rate} must be >= 1"
        )));
    }
    let (mels, bins) = (mels as usize, dft as usize / 2 + 1);
    checked_len(&[bins, mels])?;
    let mel = |hz: f32| 2595.0f32 * (1.0 + hz / 700.0).log10();
    let (mel_lo, mel_hi) = (mel(lo), mel(hi));
    // The reference divides the mel range by the number of band edges (mels + 2), not by the
    // number of gaps between them; the conformance data follows it.
    let step = (mel_hi - mel_lo) / (mels + 2) as f32;
    let points: Vec<i64> = (0..mels + 2)
        .map(|i| {
            let m = i as f64 * step as f64 + mel_lo as f64;
            let hz = 700.0 * (10f64.powf(m / 2595.0) - 1.0);
            (((dft + 1) as f64 * hz) / rate as f64).floor() as i64
        })
        .collect();
    let mut out = vec![0f64; bins * mels];
    let mut set = |j: i64, i: usize, v: f64| -> Result<(), OpError> {
        if j < 0 || j as usize >= bins {
            return Err(OpError(format!(
                "mel band {i} reaches spectrogram bin {j}, outside 0..{bins}: the edges                  {lo} and {hi} Hz do not fit sample_rate {rate}"
            )));
        }
        out[j as usize * mels + i] = v;
        Ok(())
    };
    for i in 0..mels {
        let (left, center, right) = (points[i], points[i + 1], points[i + 2]);
        if center == left {
            set(center, i, 1.0)?;
        } else {
            for j in left..=center {
                set(j, i, (j - left) as f64 / (center - left) as f64)?;
            }
        }
        if right > center {
            for j in center..right {
                set(j, i, (right - j) as f64 / (right - center) as f64)?;
            }
        }
    }
    Ok(vec![f64_as(vec![bins, mels], out, a.dtype)])
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

    fn run_window(op: &str, periodic: i64, size: i64) -> Vec<f32> {
        use crate::graph::Attribute;
        let node = crate::graph::testing::node_with(op, &[("periodic", Attribute::Int(periodic))]);
        let k = Registry::global().get("", op).unwrap();
        let n = Tensor::from_i64(vec![], vec![size]);
        k(&OpCtx::new(&node, 17), &[Some(&n)]).unwrap()[0]
            .as_f32()
            .unwrap()
            .to_vec()
    }

    #[test]
    fn windows_are_periodic_or_symmetric() {
        // Symmetric Hann of 5 points: 0, 0.5, 1, 0.5, 0; periodic: sin²(πn/5).
        let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6);
        assert!(close(
            &run_window("HannWindow", 0, 5),
            &[0.0, 0.5, 1.0, 0.5, 0.0]
        ));
        let p = run_window("HannWindow", 1, 5);
        assert!((p[1] - (std::f32::consts::PI / 5.0).sin().powi(2)).abs() < 1e-6);
        // Hamming's ends are 25/46 − 21/46 = 2/23; Blackman's 0.42 − 0.5 + 0.08 = 0.
        assert!((run_window("HammingWindow", 0, 4)[3] - 2.0 / 23.0).abs() < 1e-6);
        assert!(run_window("BlackmanWindow", 0, 4)[0].abs() < 1e-6);
    }

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
