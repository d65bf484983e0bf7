//! LSTM, GRU and RNN against ONNX Runtime where the ONNX conformance data has no test:
//! bidirectional and reverse with `sequence_lens`, layout 1, `clip`, every activation with
//! alpha/beta, peepholes, `input_forget`, `linear_before_reset`, initial states, omitted outputs,
//! opsets 7/14/22, an entry of length 0. scripts/gen_recurrent_cases.py writes the models and inputs, ONNX Runtime runs
//! them (scripts/ort_batch.py; ORT's CPU kernels refuse layout 1, so for those cases it runs the
//! layout-0 node between exact Transposes), mixprec must agree. Then the reduced-precision
//! contract of docs/numerics.md ("Recurrent layers") end to end through a precision plan.

use crate::common::{cases_against_onnxruntime, feeds_of, generate_cases, python};
use mixprec::exec::{Feeds, PlanOptions, PreparedPlan, RunOptions};
use mixprec::precision::plan::PrecisionPlan;
use mixprec::precision::Precision;
use mixprec::{load_model, Interpreter, Tensor};
use std::path::Path;
use std::process::Command;

fn generate(dir: &Path) {
    generate_cases("gen_recurrent_cases.py", dir);
}

#[test]
fn recurrent_ops_match_onnxruntime() {
    let tmp = tempfile::tempdir().unwrap();
    let failures = cases_against_onnxruntime("gen_recurrent_cases.py", tmp.path(), 20);
    assert!(failures.is_empty(), "{failures:#?}");
}

fn run_plan(m: &mixprec::Model, feeds: &Feeds, p: Precision) -> Vec<(String, Tensor)> {
    let interp = Interpreter::new(&m.graph).unwrap();
    let plan = PrecisionPlan::uniform(&m.graph, p);
    let prepared = PreparedPlan::new(&m.graph, &plan, &PlanOptions::default()).unwrap();
    interp
        .run_plan(feeds, &RunOptions::default(), &prepared)
        .unwrap()
        .outputs
}

/// A float16 LSTM/GRU/RNN layer: outputs are float16 values close to FP32, runs are
/// deterministic; the hidden state is rounded at every step through the plan (an RNN adding
/// 0.25 to 1024 eight times stays at 1024 in float16 and bfloat16, reaches 1026 in float32).
#[test]
fn recurrent_layers_run_in_float16_with_rounded_state() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    generate(dir);
    for n in [
        "lstm_bidirectional_seq_lens",
        "gru_bidirectional_linear_before_reset",
        "rnn_bidirectional_seq_lens_layout1",
    ] {
        let d = dir.join(n);
        let m = load_model(d.join("model.onnx")).unwrap();
        let feeds = feeds_of(&m.graph, &d.join("inputs"));
        let fp32 = Interpreter::new(&m.graph)
            .unwrap()
            .run(&feeds)
            .unwrap()
            .outputs;
        let a = run_plan(&m, &feeds, Precision::Float16);
        let b = run_plan(&m, &feeds, Precision::Float16);
        for (((name, x), (_, y)), (_, w)) in a.iter().zip(&b).zip(&fp32) {
            let (x, y, w) = (
                x.as_f32().unwrap(),
                y.as_f32().unwrap(),
                w.as_f32().unwrap(),
            );
            assert_eq!(
                x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{n}/{name}: two float16 runs differ"
            );
            assert!(
                x.iter()
                    .all(|&v| half::f16::from_f32(v).to_f32().to_bits() == v.to_bits()),
                "{n}/{name}: not float16 values"
            );
            let err = x
                .iter()
                .zip(w)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(err > 0.0 && err < 1e-2, "{n}/{name}: float16 error {err:e}");
        }
    }

    // h_t = h_{t-1} + x_t: W = R = 1, Affine(1, 0), h0 = 1024, x = 0.25 for 8 steps.
    let py = r#"
import sys, numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto
one = numpy_helper.from_array(np.ones([1, 1, 1], np.float32), "W")
r = numpy_helper.from_array(np.ones([1, 1, 1], np.float32), "R")
node = helper.make_node("RNN", ["X", "W", "R", "", "", "h0"], ["", "Y_h"], name="rnn",
                        hidden_size=1, activations=["Affine"], activation_alpha=[1.0],
                        activation_beta=[0.0])
g = helper.make_graph([node], "acc",
    [helper.make_tensor_value_info("X", TensorProto.FLOAT, [8, 1, 1]),
     helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, 1, 1])],
    [helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [1, 1, 1])], [one, r])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
onnx.save(m, sys.argv[1])
"#;
    let model = dir.join("acc.onnx");
    let status = Command::new(python())
        .args(["-c", py])
        .arg(&model)
        .status()
        .unwrap();
    assert!(status.success());
    let m = load_model(&model).unwrap();
    let mut feeds = Feeds::new();
    feeds.insert("X".into(), Tensor::from_f32(vec![8, 1, 1], vec![0.25; 8]));
    feeds.insert("h0".into(), Tensor::from_f32(vec![1, 1, 1], vec![1024.0]));
    let y = |p| run_plan(&m, &feeds, p)[0].1.as_f32().unwrap()[0];
    assert_eq!(y(Precision::Float32), 1026.0);
    assert_eq!(y(Precision::Float16), 1024.0);
    assert_eq!(y(Precision::BFloat16), 1024.0);
}
