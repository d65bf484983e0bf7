//! com.microsoft QLinearGlobalAveragePool and QLinearAveragePool on uint8/int8 codes, NCHW or
//! (`channels_last`) NHWC, computed as ONNX Runtime's CPU kernels compute them so the codes
//! agree exactly (tests/integration/contrib.rs):
//!
//! - The global pool (mlas/lib/qlgavgpool.cpp) sums the codes of a plane in i32, adds
//!   `−x_zp · size`, multiplies by `x_scale / (y_scale · size)` in f32, clamps to the code
//!   range less `y_zp` (NaN to the lower bound), rounds half to even and adds `y_zp`. ONNX
//!   Runtime refuses a plane of 2^24 or more elements and a scale factor outside
//!   [2^-32, 256); so does this kernel.
//! - The windowed pool (contrib_ops/cpu/quantization/qlinear_pool.cc) dequantizes every code
//!   to f32 (`x_scale · (q − x_zp)`), sums each window in row-major order, divides by the
//!   window's element count (the kernel size with `count_include_pad`, else the elements
//!   inside the input) and quantizes `y / y_scale + y_zp`, rounded half to even. A window
//!   covering the whole unpadded image takes the global pool's integer path, as in ONNX
//!   Runtime.
//!
//! Both are exact whatever the precision plan: they have no float operand.

use super::super::attrs::{boxed, AttrError, Attrs};
use super::super::conv::{window, Window};
use super::super::pool::PoolAttrs;
use super::super::shape::{fact, FactsResult};
use super::super::util::input;
use super::super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use super::qlinear::{codes, scale, zero_point, CodeType, Quant};
use super::MS_DOMAIN;
use crate::graph::fact::{DimFact, Fact};
use crate::tensor::Tensor;

pub fn register(r: &mut Registry) {
    use InputRole::{Data, Scale, ZeroPoint};
    const ROLES: &[InputRole] = &[Data, Scale, ZeroPoint, Scale, ZeroPoint];
    r.add_in(MS_DOMAIN, "QLinearGlobalAveragePool", global_avg_pool)
        .parse(|n, _| boxed(Attrs::new(n).flag("channels_last", false).map(ChannelsLast)))
        .roles(ROLES)
        .infer(global_facts);
    r.add_in(MS_DOMAIN, "QLinearAveragePool", avg_pool)
        .parse(|n, _| boxed(QPoolAttrs::parse(n)))
        .roles(ROLES)
        .infer(pool_facts);
}

/// QLinearGlobalAveragePool's `channels_last`.
struct ChannelsLast(bool);

/// QLinearAveragePool's attributes: AveragePool's and `channels_last`.
struct QPoolAttrs {
    pool: PoolAttrs,
    channels_last: bool,
}

impl QPoolAttrs {
    fn parse(node: &crate::graph::Node) -> Result<QPoolAttrs, AttrError> {
        let pool = PoolAttrs::parse(node)?;
        if pool
            .window
            .dilations
            .as_ref()
            .is_some_and(|d| d.iter().any(|&v| v != 1))
        {
            return Err(AttrError::new(
                "dilations",
                "QLinearAveragePool has no dilations (ONNX Runtime's kernel ignores them)",
            ));
        }
        Ok(QPoolAttrs {
            pool,
            channels_last: Attrs::new(node).flag("channels_last", false)?,
        })
    }
}

/// The input's layout as (N, C, spatial sizes), from NCHW or NHWC.
fn layout(shape: &[usize], channels_last: bool) -> Result<(usize, usize, Vec<usize>), OpError> {
    if shape.len() < 3 {
        return Err(OpError(format!("input must have rank >= 3, got {shape:?}")));
    }
    Ok(if channels_last {
        let r = shape.len();
        (shape[0], shape[r - 1], shape[1..r - 1].to_vec())
    } else {
        (shape[0], shape[1], shape[2..].to_vec())
    })
}

/// The output shape of N, C and spatial sizes in the input's layout.
fn shape_of(n: usize, c: usize, spatial: &[usize], channels_last: bool) -> Vec<usize> {
    let mut s = vec![n];
    if !channels_last {
        s.push(c);
    }
    s.extend_from_slice(spatial);
    if channels_last {
        s.push(c);
    }
    s
}

/// Input codes as planes: `planes[n·C + c]` holds one channel's spatial values row-major.
fn planes(x: &[i32], n: usize, c: usize, size: usize, channels_last: bool) -> Vec<Vec<i32>> {
    (0..n * c)
        .map(|p| {
            let (b, ch) = (p / c, p % c);
            if channels_last {
                (0..size).map(|i| x[(b * size + i) * c + ch]).collect()
            } else {
                x[p * size..(p + 1) * size].to_vec()
            }
        })
        .collect()
}

/// Planes of `size` outputs back into the output's layout.
fn interleave(planes: Vec<Vec<i32>>, c: usize, size: usize, channels_last: bool) -> Vec<i32> {
    if !channels_last {
        return planes.concat();
    }
    let mut out = vec![0; planes.len() * size];
    for (p, plane) in planes.iter().enumerate() {
        let (b, ch) = (p / c, p % c);
        for (i, &v) in plane.iter().enumerate() {
            out[(b * size + i) * c + ch] = v;
        }
    }
    out
}

/// The (scale, zero point) pairs of X and Y and the code type.
fn params(inputs: &[Option<&Tensor>]) -> Result<(CodeType, Quant, Quant), OpError> {
    let ct = CodeType::of(input(inputs, 0)?, "X")?;
    Ok((
        ct,
        (
            scale(inputs, 1, "x_scale")?,
            zero_point(inputs, 2, ct, "x_zero_point")?,
        ),
        (
            scale(inputs, 3, "y_scale")?,
            zero_point(inputs, 4, ct, "y_zero_point")?,
        ),
    ))
}

/// MLAS's integer global average of each plane.
fn global_planes(
    planes: &[Vec<i32>],
    size: usize,
    ct: CodeType,
    (xs, xz): Quant,
    (ys, yz): Quant,
) -> Result<Vec<Vec<i32>>, OpError> {
    if size >= 1 << 24 {
        return Err(OpError(format!(
            "the pooled plane has {size} elements; ONNX Runtime's kernel takes fewer than 2^24"
        )));
    }
    let factor = xs / (ys * size as f32);
    if factor < f32::from_bits(0x2f80_0000) || factor >= 256.0 {
        return Err(OpError(format!(
            "x_scale / (y_scale · {size}) = {factor:e} is outside [2^-32, 256): every output \
             would be one constant (ONNX Runtime refuses it too)"
        )));
    }
    let bias = (-xz).wrapping_mul(size as i32);
    let (min, max) = ((ct.lo - yz) as f32, (ct.hi - yz) as f32);
    Ok(planes
        .iter()
        .map(|p| {
            let acc = p.iter().fold(bias, |a, &q| a.wrapping_add(q));
            let v = acc as f32 * factor;
            let v = if v.is_nan() || v < min {
                min
            } else {
                v.min(max)
            };
            vec![(v.round_ties_even() as i32 + yz).clamp(ct.lo, ct.hi)]
        })
        .collect())
}

fn global_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    let last = ctx.attrs::<ChannelsLast>()?.0;
    let shape = x.shape.as_ref().map(|s| {
        let r = s.len();
        s.iter()
            .enumerate()
            .map(|(i, d)| {
                let spatial = if last { i > 0 && i + 1 < r } else { i >= 2 };
                if spatial {
                    DimFact::known(1)
                } else {
                    d.clone()
                }
            })
            .collect()
    });
    Ok(vec![Fact::new(x.dtype, shape)])
}

fn global_avg_pool(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let last = ctx.attrs::<ChannelsLast>()?.0;
    let x = input(inputs, 0)?;
    let (ct, xq, yq) = params(inputs)?;
    let (n, c, sp) = layout(x.shape(), last)?;
    let size = sp.iter().product();
    let pl = planes(&codes(x), n, c, size, last);
    let out = global_planes(&pl, size, ct, xq, yq)?;
    let ones = vec![1; sp.len()];
    Ok(vec![ct.tensor(
        shape_of(n, c, &ones, last),
        interleave(out, c, 1, last),
    )])
}

fn pool_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    let attrs = ctx.attrs::<QPoolAttrs>()?;
    let Some(s) = &x.shape else {
        return Ok(vec![Fact::new(x.dtype, None)]);
    };
    let r = attrs.pool.kernel.len() + 2;
    if s.len() != r {
        return Err(OpError(format!(
            "kernel_shape {:?} does not match input {}",
            attrs.pool.kernel,
            x.shape_string()
        )));
    }
    let (n, c, sp) = if attrs.channels_last {
        (&s[0], &s[r - 1], &s[1..r - 1])
    } else {
        (&s[0], &s[1], &s[2..])
    };
    let out_sp: Vec<DimFact> = match sp.iter().map(DimFact::as_known).collect::<Option<Vec<_>>>() {
        Some(known) => window(
            &attrs.pool.window,
            &known,
            &attrs.pool.kernel,
            attrs.pool.ceil_mode,
        )?
        .out
        .into_iter()
        .map(DimFact::known)
        .collect(),
        None => sp.iter().map(|_| ctx.unknown_dim()).collect(),
    };
    let mut shape = vec![n.clone()];
    if !attrs.channels_last {
        shape.push(c.clone());
    }
    shape.extend(out_sp);
    if attrs.channels_last {
        shape.push(c.clone());
    }
    Ok(vec![Fact::new(x.dtype, Some(shape))])
}

fn avg_pool(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<QPoolAttrs>()?;
    let last = attrs.channels_last;
    let x = input(inputs, 0)?;
    let (ct, xq, yq) = params(inputs)?;
    let (n, c, sp) = layout(x.shape(), last)?;
    let kernel = &attrs.pool.kernel;
    if kernel.len() != sp.len() || !(1..=3).contains(&kernel.len()) {
        return Err(OpError(format!(
            "kernel_shape {kernel:?} does not match input {:?} (1 to 3 spatial axes)",
            x.shape()
        )));
    }
    let w = window(&attrs.pool.window, &sp, kernel, attrs.pool.ceil_mode)?;
    let size: usize = sp.iter().product();
    let out_size: usize = w.out.iter().product();
    let pl = planes(&codes(x), n, c, size, last);
    let whole = *kernel == sp && w.pad_begin.iter().chain(&w.pad_end).all(|&p| p == 0);
    let out = if whole {
        global_planes(&pl, size, ct, xq, yq)?
    } else {
        pl.iter()
            .map(|p| window_plane(p, &sp, &w, attrs.pool.count_include_pad, ct, xq, yq))
            .collect()
    };
    Ok(vec![ct.tensor(
        shape_of(n, c, &w.out, last),
        interleave(out, c, out_size, last),
    )])
}

/// One plane's windowed averages (ONNX Runtime's float path).
fn window_plane(
    plane: &[i32],
    sp: &[usize],
    w: &Window,
    count_include_pad: bool,
    ct: CodeType,
    (xs, xz): Quant,
    (ys, yz): Quant,
) -> Vec<i32> {
    let r = sp.len();
    let k_size: usize = w.kernel.iter().product();
    let out_size: usize = w.out.iter().product();
    let mut o_idx = vec![0usize; r];
    (0..out_size)
        .map(|oi| {
            let mut rem = oi;
            for d in (0..r).rev() {
                o_idx[d] = rem % w.out[d];
                rem /= w.out[d];
            }
            // Each axis's window clipped to the input: [start, end).
            let bounds: Vec<(usize, usize)> = (0..r)
                .map(|d| {
                    let s = (o_idx[d] * w.strides[d]) as isize - w.pad_begin[d] as isize;
                    let e = (s + w.kernel[d] as isize).min(sp[d] as isize);
                    (s.max(0) as usize, e.max(0) as usize)
                })
                .collect();
            let count: usize = bounds.iter().map(|&(s, e)| e.saturating_sub(s)).product();
            let mut sum = 0f32;
            let mut idx: Vec<usize> = bounds.iter().map(|b| b.0).collect();
            if count > 0 {
                loop {
                    let off = idx.iter().zip(sp).fold(0, |a, (&i, &s)| a * s + i);
                    sum += xs * (plane[off] - xz) as f32;
                    let mut d = r;
                    loop {
                        if d == 0 {
                            break;
                        }
                        d -= 1;
                        idx[d] += 1;
                        if idx[d] < bounds[d].1 {
                            break;
                        }
                        idx[d] = bounds[d].0;
                        if d == 0 {
                            d = usize::MAX;
                            break;
                        }
                    }
                    if d == usize::MAX {
                        break;
                    }
                }
            }
            let divisor = if count_include_pad { k_size } else { count };
            let y = sum / divisor as f32;
            ct.convert_saturate((y / ys + yz as f32).round_ties_even())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::node_with;
    use crate::graph::Attribute;
    use crate::tensor::TensorData;

    fn run(op: &str, attrs: &[(&str, Attribute)], x: Tensor) -> Result<Tensor, OpError> {
        let mut node = node_with(op, attrs);
        node.domain = MS_DOMAIN.into();
        let k = Registry::global().get(MS_DOMAIN, op).unwrap();
        let (xs, xz) = (
            Tensor::from_f32(vec![], vec![0.5]),
            Tensor::from_parts(vec![], TensorData::U8(vec![2u8].into())),
        );
        let (ys, yz) = (
            Tensor::from_f32(vec![], vec![0.25]),
            Tensor::from_parts(vec![], TensorData::U8(vec![1u8].into())),
        );
        let ins = [&x, &xs, &xz, &ys, &yz].map(Some);
        k(&OpCtx::new(&node, 1), &ins).map(|mut v| v.remove(0))
    }

    fn u8s(shape: Vec<usize>, v: Vec<u8>) -> Tensor {
        Tensor::from_parts(shape, TensorData::U8(v.into()))
    }

    #[test]
    fn global_average_requantizes_the_integer_sum() {
        // Plane [2, 4, 6, 9]: Σ(q − 2) = 13, · 0.5 / (0.25 · 4) = 6.5 → 6 (ties to even) + 1.
        let x = u8s(vec![1, 2, 2, 2], vec![2, 4, 6, 9, 2, 2, 2, 2]);
        let y = run("QLinearGlobalAveragePool", &[], x.clone()).unwrap();
        assert_eq!(y.shape(), &[1, 2, 1, 1]);
        assert_eq!(y.to_i64_vec().unwrap(), vec![7, 1]);
        // channels_last reads the same values as [1, 2, 2, C=2].
        let nhwc = u8s(vec![1, 2, 2, 2], vec![2, 2, 4, 2, 6, 2, 9, 2]);
        let last = [("channels_last", Attribute::Int(1))];
        let y = run("QLinearGlobalAveragePool", &last, nhwc).unwrap();
        assert_eq!(y.shape(), &[1, 1, 1, 2]);
        assert_eq!(y.to_i64_vec().unwrap(), vec![7, 1]);
    }

    #[test]
    fn windowed_average_divides_by_the_elements_inside() {
        let x = u8s(vec![1, 1, 1, 3], vec![4, 8, 12]);
        let k = ("kernel_shape", Attribute::Ints(vec![1, 2]));
        let pads = ("pads", Attribute::Ints(vec![0, 1, 0, 0]));
        let strides = ("strides", Attribute::Ints(vec![1, 2]));
        // Windows [pad, 4], [8, 12]: dequantized 1 → 1/1 and (3 + 5)/2 = 4; /0.25 + 1.
        let y = run(
            "QLinearAveragePool",
            &[k.clone(), pads.clone(), strides.clone()],
            x.clone(),
        )
        .unwrap();
        assert_eq!(y.shape(), &[1, 1, 1, 2]);
        assert_eq!(y.to_i64_vec().unwrap(), vec![5, 17]);
        let inc = ("count_include_pad", Attribute::Int(1));
        let y = run(
            "QLinearAveragePool",
            &[k.clone(), pads, strides, inc],
            x.clone(),
        )
        .unwrap();
        assert_eq!(y.to_i64_vec().unwrap(), vec![3, 17]);
        let dil = ("dilations", Attribute::Ints(vec![1, 2]));
        let e = run("QLinearAveragePool", &[k, dil], x).unwrap_err();
        assert!(e.0.contains("dilations"), "{e}");
    }

    #[test]
    fn out_of_range_scales_are_refused() {
        let mut node = node_with("QLinearGlobalAveragePool", &[]);
        node.domain = MS_DOMAIN.into();
        let x = u8s(vec![1, 1, 1, 1], vec![3]);
        let (s, tiny) = (
            Tensor::from_f32(vec![], vec![1.0]),
            Tensor::from_f32(vec![], vec![1e-3]),
        );
        let ins = [Some(&x), Some(&s), None, Some(&tiny), None];
        let e = global_avg_pool(&OpCtx::new(&node, 1), &ins).unwrap_err();
        assert!(e.0.contains("[2^-32, 256)"), "{e}");
    }
}
