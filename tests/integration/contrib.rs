//! com.microsoft ops (and ONNX Runtime's default-domain SimplifiedLayerNormalization) against
//! ONNX Runtime, which defines them: scripts/gen_contrib_cases.py writes one-node models with
//! every activation, transpose flag, mask form and optional input/output, ONNX Runtime runs
//! them, mixprec must agree.

use crate::common::cases_against_onnxruntime;

#[test]
fn contrib_ops_match_onnxruntime() {
    let tmp = tempfile::tempdir().unwrap();
    let failures = cases_against_onnxruntime("gen_contrib_cases.py", tmp.path(), 202);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A chain of contrib ops under a float16 plan: every output is float16 values, two runs agree
/// bit for bit, the error to FP32 is float16-sized. Then a search on it finishes, and its
/// export keeps FusedConv in float32 (no float16 kernel there, `export::types::
/// has_float16_kernel`) and loads again.
#[test]
fn contrib_ops_run_in_float16_search_and_export() {
    use mixprec::exec::{PlanOptions, PreparedPlan, RunOptions};
    use mixprec::precision::{plan::PrecisionPlan, Precision};
    let tmp = tempfile::tempdir().unwrap();
    crate::common::generate_cases("gen_contrib_cases.py", tmp.path());
    let d = tmp.path().join("chain");
    let model = d.join("model.onnx");
    let m = mixprec::load_model(&model).unwrap();
    let feeds = crate::common::feeds_of(&m.graph, &d.join("inputs"));
    let interp = mixprec::Interpreter::new(&m.graph).unwrap();
    let fp32 = interp.run(&feeds).unwrap().outputs[0].1.clone();
    let plan = PrecisionPlan::uniform(&m.graph, Precision::Float16);
    let prepared = PreparedPlan::new(&m.graph, &plan, &PlanOptions::default()).unwrap();
    let run = || {
        interp
            .run_plan(&feeds, &RunOptions::default(), &prepared)
            .unwrap()
            .outputs[0]
            .1
            .clone()
    };
    let (a, b) = (run(), run());
    assert_eq!(a, b, "two float16 runs differ");
    let (a, w) = (a.as_f32().unwrap(), fp32.as_f32().unwrap());
    assert!(a
        .iter()
        .all(|&v| half::f16::from_f32(v).to_f32().to_bits() == v.to_bits()));
    let err = a
        .iter()
        .zip(w)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(err > 0.0 && err < 5e-2, "float16 error {err:e}");

    let out = tmp.path().join("mixed.onnx");
    let (model, out) = (model.to_str().unwrap(), out.to_str().unwrap());
    let o = crate::common::mixprec(&[
        "debug",
        "precision",
        model,
        "--fp16",
        "--mode",
        "minimal",
        "--atol",
        "5e-2",
        "--rtol",
        "1e-2",
        "-o",
        out,
    ]);
    let t = crate::common::text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("layer 'fc' (com.microsoft.FusedConv) stays float32"),
        "{t}"
    );
    let o = crate::common::mixprec(&["run", out, "--onnxrt"]);
    assert!(o.status.success(), "{}", crate::common::text(&o));
}

/// The com.microsoft ops with float16 kernels in ONNX Runtime are written in float16 under a
/// float16 plan, as the emulation ran them: ONNX Runtime runs the converted chain and its
/// output is the emulated float16 plan's within float16 noise (FusedConv stays float32, with
/// its note).
#[test]
fn float16_contrib_ops_export_in_float16() {
    use mixprec::exec::{PlanOptions, PreparedPlan, RunOptions};
    use mixprec::precision::{plan::PrecisionPlan, Precision};
    let tmp = tempfile::tempdir().unwrap();
    crate::common::generate_cases("gen_contrib_cases.py", tmp.path());
    let d = tmp.path().join("chain");
    let model = d.join("model.onnx");
    let out = tmp.path().join("fp16.onnx");
    let o = crate::common::mixprec(&[
        "convert",
        model.to_str().unwrap(),
        "--fp16",
        "--fallback",
        "-o",
        out.to_str().unwrap(),
    ]);
    let t = crate::common::text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("layer 'fc' (com.microsoft.FusedConv) stays float32"),
        "{t}"
    );
    assert_eq!(t.matches("stays float32").count(), 1, "{t}");
    // The written contrib layers read float16.
    let written = mixprec::load_model(&out).unwrap();
    let types = mixprec::export::types::scope_types(&written.graph, &Default::default());
    for n in written
        .graph
        .nodes
        .iter()
        .filter(|n| n.domain == "com.microsoft")
    {
        let want = if n.op_type == "FusedConv" {
            mixprec::tensor::DType::F32
        } else {
            mixprec::tensor::DType::F16
        };
        assert_eq!(
            types.get(&n.inputs[0]),
            Some(&want),
            "{} ({})",
            n.name,
            n.op_type
        );
    }
    // ONNX Runtime's output against the emulation of the float16 plan.
    let m = mixprec::load_model(&model).unwrap();
    let feeds = crate::common::feeds_of(&m.graph, &d.join("inputs"));
    let plan = PrecisionPlan::uniform(&m.graph, Precision::Float16);
    let prepared = PreparedPlan::new(&m.graph, &plan, &PlanOptions::default()).unwrap();
    let emulated = mixprec::Interpreter::new(&m.graph)
        .unwrap()
        .run_plan(&feeds, &RunOptions::default(), &prepared)
        .unwrap()
        .outputs[0]
        .1
        .clone();
    let y = tmp.path().join("ort.npy");
    let script =
        "import sys, numpy as np, onnx, onnxruntime as ort; from onnx import numpy_helper as nh; \
        x = nh.to_array(onnx.load_tensor(sys.argv[2])); s = ort.InferenceSession(sys.argv[1]); \
        np.save(sys.argv[3], s.run(None, {s.get_inputs()[0].name: x})[0].astype(np.float32))";
    let o = std::process::Command::new(crate::common::python())
        .args([
            "-c",
            script,
            out.to_str().unwrap(),
            d.join("inputs/input_0.pb").to_str().unwrap(),
            y.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", crate::common::text(&o));
    let ort = mixprec::data::npy::from_npy(&std::fs::read(&y).unwrap()).unwrap();
    let (a, b) = (emulated.as_f32().unwrap(), ort.as_f32().unwrap());
    assert_eq!(a.len(), b.len());
    let err = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(
        err <= 1e-2 * scale.max(1.0),
        "ONNX Runtime vs emulation: {err:e} (scale {scale})"
    );
}
