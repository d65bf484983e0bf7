//! Detection post-processing: NonMaxSuppression (opset 10/11), as ONNX Runtime's CPU kernel
//! selects — per batch and class, boxes with a score above `score_threshold` by descending
//! score (the lower box index first on ties), each kept unless its IoU with a kept box exceeds
//! `iou_threshold`, at most `max_output_boxes_per_class` of them. Outputs
//! `[num_selected, 3]` int64 rows (batch, class, box).

use super::attrs::{boxed, AttrError, Attrs};
use super::shape::{fact, FactsResult};
use super::util::{input, opt_input};
use super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use crate::graph::fact::Fact;
use crate::tensor::{DType, Tensor};

pub fn register(r: &mut Registry) {
    r.add("NonMaxSuppression", nms)
        .parse(|n, _| boxed(NmsAttrs::parse(n)))
        .infer(nms_facts)
        .roles(&[
            InputRole::Data,
            InputRole::Data,
            InputRole::Param,
            InputRole::Param,
            InputRole::Param,
        ]);
}

/// NonMaxSuppression's `center_point_box`: boxes as `[x_center, y_center, w, h]` (1) or as two
/// corners `[y1, x1, y2, x2]` in any order (0).
#[derive(Clone, Debug, PartialEq)]
pub struct NmsAttrs {
    pub center_point_box: bool,
}

impl NmsAttrs {
    fn parse(node: &crate::graph::Node) -> Result<NmsAttrs, AttrError> {
        let a = Attrs::new(node);
        let c = a.int_or("center_point_box", 0)?;
        if !(0..=1).contains(&c) {
            return Err(AttrError::new(
                "center_point_box",
                format!("must be 0 or 1, got {c}"),
            ));
        }
        Ok(NmsAttrs {
            center_point_box: c == 1,
        })
    }
}

fn nms_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    fact(ins, 0)?;
    fact(ins, 1)?;
    Ok(vec![Fact::typed(
        DType::I64,
        vec![ctx.unknown_dim(), crate::graph::fact::DimFact::known(3)],
    )])
}

/// A box as (y_min, x_min, y_max, x_max).
fn corners(b: &[f32], center: bool) -> [f32; 4] {
    if center {
        let (xc, yc, w, h) = (b[0], b[1], b[2], b[3]);
        [yc - h / 2.0, xc - w / 2.0, yc + h / 2.0, xc + w / 2.0]
    } else {
        [
            b[0].min(b[2]),
            b[1].min(b[3]),
            b[0].max(b[2]),
            b[1].max(b[3]),
        ]
    }
}

/// Whether `a` and `b` overlap by more than `threshold` (IoU); boxes without area never do.
fn suppresses(a: &[f32; 4], b: &[f32; 4], threshold: f32) -> bool {
    let area_a = (a[2] - a[0]) * (a[3] - a[1]);
    let area_b = (b[2] - b[0]) * (b[3] - b[1]);
    if area_a <= 0.0 || area_b <= 0.0 {
        return false;
    }
    let (y0, x0) = (a[0].max(b[0]), a[1].max(b[1]));
    let (y1, x1) = (a[2].min(b[2]), a[3].min(b[3]));
    let inter = (y1 - y0).max(0.0) * (x1 - x0).max(0.0);
    let iou = inter / (area_a + area_b - inter);
    iou > threshold
}

fn scalar_f32(t: Option<&Tensor>, what: &str, default: f32) -> Result<f32, OpError> {
    match t {
        None => Ok(default),
        Some(t) if t.len() == 1 => t
            .to_f32_vec()
            .map(|v| v[0])
            .ok_or_else(|| OpError(format!("{what} must be a float"))),
        Some(t) => Err(OpError(format!(
            "{what} must hold one value, got shape {:?}",
            t.shape()
        ))),
    }
}

fn nms(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let boxes = input(inputs, 0)?;
    let scores = input(inputs, 1)?;
    let center = ctx.attrs::<NmsAttrs>()?.center_point_box;
    let max_out = match opt_input(inputs, 2) {
        None => 0,
        Some(t) if t.len() == 1 => t
            .to_i64_vec()
            .map(|v| v[0])
            .ok_or_else(|| OpError("max_output_boxes_per_class must be an integer".into()))?,
        Some(t) => {
            return Err(OpError(format!(
                "max_output_boxes_per_class must hold one value, got shape {:?}",
                t.shape()
            )))
        }
    };
    let iou_threshold = scalar_f32(opt_input(inputs, 3), "iou_threshold", 0.0)?;
    let score_threshold = opt_input(inputs, 4)
        .map(|t| scalar_f32(Some(t), "score_threshold", 0.0))
        .transpose()?;
    let (bs, ss) = (boxes.shape(), scores.shape());
    if bs.len() != 3 || bs[2] != 4 {
        return Err(OpError(format!(
            "boxes must be [batches, boxes, 4], got {bs:?}"
        )));
    }
    if ss.len() != 3 || ss[0] != bs[0] || ss[2] != bs[1] {
        return Err(OpError(format!(
            "scores must be [batches, classes, boxes] = [{}, C, {}], got {ss:?}",
            bs[0], bs[1]
        )));
    }
    if !(0.0..=1.0).contains(&iou_threshold) {
        return Err(OpError(format!(
            "iou_threshold must be in [0, 1], got {iou_threshold}"
        )));
    }
    let bv = boxes
        .to_f32_vec()
        .ok_or_else(|| OpError("boxes must be float".into()))?;
    let sv = scores
        .to_f32_vec()
        .ok_or_else(|| OpError("scores must be float".into()))?;
    let (nb, nc, n) = (ss[0], ss[1], ss[2]);
    let mut out: Vec<i64> = Vec::new();
    let max_out = max_out.max(0) as usize;
    for b in 0..nb {
        let cs: Vec<[f32; 4]> = (0..n)
            .map(|i| corners(&bv[(b * n + i) * 4..(b * n + i + 1) * 4], center))
            .collect();
        for c in 0..nc {
            if max_out == 0 {
                break;
            }
            let s = &sv[(b * nc + c) * n..(b * nc + c + 1) * n];
            let mut cand: Vec<usize> = (0..n)
                .filter(|&i| score_threshold.is_none_or(|t| s[i] > t))
                .collect();
            // Descending score, the lower index first on ties (a stable sort of the indices).
            cand.sort_by(|&i, &j| s[j].partial_cmp(&s[i]).unwrap_or(std::cmp::Ordering::Equal));
            let mut kept: Vec<usize> = Vec::new();
            for i in cand {
                if kept.len() >= max_out {
                    break;
                }
                if kept
                    .iter()
                    .all(|&k| !suppresses(&cs[k], &cs[i], iou_threshold))
                {
                    kept.push(i);
                }
            }
            for k in kept {
                out.extend([b as i64, c as i64, k as i64]);
            }
        }
    }
    let rows = out.len() / 3;
    Ok(vec![Tensor::from_i64(vec![rows, 3], out)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Attribute;

    #[test]
    fn nms_keeps_the_best_box_of_each_overlapping_cluster() {
        let node = crate::graph::testing::node_with(
            "NonMaxSuppression",
            &[("center_point_box", Attribute::Int(0))],
        );
        // Boxes 0 and 1 overlap (IoU 0.81), box 2 is apart, box 3 is flipped and equals box 2.
        let boxes = Tensor::from_f32(
            vec![1, 4, 4],
            vec![
                0.0, 0.0, 1.0, 1.0, 0.0, 0.1, 1.0, 1.1, 5.0, 5.0, 6.0, 6.0, 6.0, 6.0, 5.0, 5.0,
            ],
        );
        let scores = Tensor::from_f32(vec![1, 1, 4], vec![0.8, 0.9, 0.7, 0.7]);
        let run = |max: i64, iou: f32| {
            let k = Tensor::from_i64(vec![1], vec![max]);
            let t = Tensor::from_f32(vec![1], vec![iou]);
            let ctx = OpCtx::new(&node, 11);
            nms(&ctx, &[Some(&boxes), Some(&scores), Some(&k), Some(&t)]).unwrap()[0]
                .to_i64_vec()
                .unwrap()
        };
        assert_eq!(run(10, 0.5), vec![0, 0, 1, 0, 0, 2]);
        assert_eq!(run(1, 0.5), vec![0, 0, 1]);
        assert!(run(0, 0.5).is_empty());
        // A threshold of 1 suppresses nothing; equal scores keep the lower index first.
        assert_eq!(run(10, 1.0), vec![0, 0, 1, 0, 0, 0, 0, 0, 2, 0, 0, 3]);
    }
}
