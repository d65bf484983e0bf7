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
/// export keeps the com.microsoft layers in float32 (ONNX Runtime's CPU kernels take no
/// other type) and runs in ONNX Runtime.
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
