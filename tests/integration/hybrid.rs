//! Hybrids (issue 43): a float model quantized the way ONNX Runtime's `quantize_dynamic`
//! leaves a T5 (DynamicQuantizeLinear → MatMulInteger → Cast → Mul, an int8 embedding table
//! dequantized before its Gather) is not Q/DQ-quantized: `--fp16` runs and searches its float
//! layers, the integer ops run as written, and the exported mixed model runs in ONNX Runtime.
//! The model comes from scripts/gen_hybrid.py; its RMSNorm Pow squares ~1e4 past float16.

use crate::common::{mixprec, python, repo_root, text};
use crate::models::models_dir;
use mixprec::onnx::read_tensor_file;
use std::path::PathBuf;
use std::process::Command;

/// Generates the model, its inputs (.npz and input_K.pb), ONNX Runtime's outputs and
/// mixprec's FP32 outputs (golden.json) into `name` (one folder per test: they run in
/// parallel).
fn generate(name: &str) -> PathBuf {
    let dir = models_dir().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let st = Command::new(python())
        .arg(repo_root().join("scripts/gen_hybrid.py"))
        .arg(&dir)
        .status()
        .unwrap();
    assert!(st.success(), "scripts/gen_hybrid.py failed");
    // mixprec's FP32 outputs, the searches' golden.
    let o = mixprec(&[
        "run",
        &s(&dir.join("hybrid.onnx")),
        "--load-inputs",
        &s(&dir.join("hybrid.npz")),
        "--save-outputs",
        &s(&dir.join("golden.json")),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    dir
}

fn s(p: &std::path::Path) -> String {
    p.to_string_lossy().into_owned()
}

/// `debug precision` with `flag` (`--fp16`/`--bf16`) on the hybrid against `golden`, the
/// criterion atol 0.05: the log, the answer's layers, the `-o` model.
fn search(
    dir: &std::path::Path,
    flag: &str,
    golden: &str,
    suffix: &str,
) -> (String, Vec<String>, PathBuf) {
    let model = s(&dir.join("hybrid.onnx"));
    let npz = s(&dir.join("hybrid.npz"));
    let mixed = dir.join(format!("mixed{suffix}.onnx"));
    let result = dir.join(format!("result{suffix}.json"));
    let o = mixprec(&[
        "debug",
        "precision",
        &model,
        flag,
        "--load-inputs",
        &npz,
        "--golden",
        golden,
        "--atol",
        "0.05",
        "--rtol",
        "0",
        "--save-result",
        &s(&result),
        "-o",
        &s(&mixed),
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let answer = mixprec::quantize::result_file_layers(&result).unwrap();
    (t, answer, mixed)
}

#[test]
fn a_dynamically_quantized_hybrid_runs_searches_and_exports_in_float16() {
    let dir = generate("hybrid_case");
    let model = s(&dir.join("hybrid.onnx"));
    let npz = s(&dir.join("hybrid.npz"));
    let golden = s(&dir.join("golden.json"));

    // run --fp16: not "already quantized"; the integer ops stay float32 in the plan.
    let o = mixprec(&["run", &model, "--load-inputs", &npz, "--fp16"]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(!t.contains("already quantized"), "{t}");

    // debug precision --fp16 finds the overflowing Pow and writes a model ORT runs.
    let (_, answer, mixed) = search(&dir, "--fp16", &golden, "");
    assert!(answer.iter().any(|n| n == "/rms/Pow"), "{answer:?}");
    for int_op in ["/lin/DynamicQuantizeLinear", "/lin/MatMulInteger"] {
        assert!(
            !answer.iter().any(|n| n == int_op),
            "{int_op} is no candidate: {answer:?}"
        );
    }

    // The export: integer ops untouched, float16 Casts around the rest; ONNX Runtime runs it
    // and agrees with the original model in ONNX Runtime within float16's error.
    let out = dir.join("ort_mixed");
    let _ = std::fs::remove_dir_all(&out);
    let o = Command::new(python())
        .arg(repo_root().join("scripts/ort_run.py"))
        .arg(&mixed)
        .arg("--inputs")
        .arg(dir.join("hybrid"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = read_tensor_file(&out.join("output_0.pb")).unwrap().1;
    let want = read_tensor_file(&dir.join("hybrid/output_0.pb")).unwrap().1;
    let (g, w) = (got.to_f64_vec().unwrap(), want.to_f64_vec().unwrap());
    let scale = w.iter().fold(0f64, |m, x| m.max(x.abs()));
    let diff = g
        .iter()
        .zip(&w)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
    println!("hybrid: ORT mixed vs ORT fp32 max|diff| {diff:.3e} (max|ref| {scale:.3})");
    assert!(diff <= 0.05, "max|diff| {diff:.3e}");
    assert_keeps_integer_ops_and_casts(&mixed, "_fp16");

    // convert --fp16 writes the whole float part in float16: ORT runs it (the Pow overflows,
    // so only that it runs is checked).
    let conv = dir.join("converted.onnx");
    let o = mixprec(&["convert", &model, "--fp16", "-o", &s(&conv)]);
    assert!(o.status.success(), "{}", text(&o));
    let o = Command::new(python())
        .arg(repo_root().join("scripts/ort_run.py"))
        .arg(&conv)
        .arg("--inputs")
        .arg(dir.join("hybrid"))
        .arg("--out")
        .arg(dir.join("ort_converted"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The same hybrid under `--bf16`: not "already quantized"; bfloat16's range holds the Pow,
/// so the search needs no layer (max error 0.016 < 0.05); the exported model keeps the
/// integer ops as written, casts the float rest to bfloat16, and computes — run as typed —
/// exactly what the emulated bfloat16 plan computed. (ONNX Runtime's CPU provider has no
/// bfloat16 Add, so it cannot run the file: mixprec's typed run is the check.)
#[test]
fn a_dynamically_quantized_hybrid_runs_searches_and_exports_in_bfloat16() {
    let dir = generate("hybrid_case_bf16");
    let model = s(&dir.join("hybrid.onnx"));
    let npz = s(&dir.join("hybrid.npz"));
    let golden = s(&dir.join("golden.json"));
    let emulated = s(&dir.join("emulated_bf16.json"));
    let o = mixprec(&[
        "run",
        &model,
        "--load-inputs",
        &npz,
        "--bf16",
        "--save-outputs",
        &emulated,
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(!t.contains("already quantized"), "{t}");

    let (t, answer, mixed) = search(&dir, "--bf16", &golden, "_bf16");
    assert!(t.contains("no layer needs float32"), "{t}");
    assert!(answer.is_empty(), "{answer:?}");
    assert_keeps_integer_ops_and_casts(&mixed, "_bf16");
    // The file, run as typed, gives the emulated plan's bits.
    let o = mixprec(&[
        "run",
        &s(&mixed),
        "--load-inputs",
        &npz,
        "--load-outputs",
        &emulated,
        "--atol",
        "0",
        "--rtol",
        "0",
    ]);
    assert!(o.status.success(), "{}", text(&o));
}

/// The exported hybrid keeps its integer ops (dynamic quantization, weight-only dequantization)
/// and casts its float part down through Casts named with `suffix`.
fn assert_keeps_integer_ops_and_casts(mixed: &std::path::Path, suffix: &str) {
    let m = mixprec::onnx::load_model(mixed).unwrap();
    for op in ["DynamicQuantizeLinear", "MatMulInteger", "DequantizeLinear"] {
        assert!(m.graph.nodes.iter().any(|n| n.op_type == op), "{op} kept");
    }
    assert!(m
        .graph
        .nodes
        .iter()
        .any(|n| n.op_type == "Cast" && n.name.ends_with(suffix)));
}
