//! Whole models against ONNX Runtime: scripts/gen_models.py builds a ResNet-like CNN, a
//! transformer encoder and an MLP (plus the MLP with external weights) and saves ORT's CPU
//! outputs; mixprec's FP32 interpreter must match them to f32 noise.

use crate::common::{python, repo_root};
use mixprec::onnx::{read_input_set, read_tensor_file};
use mixprec::{load_model, Interpreter};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Generates the models once per test run into target/test-models.
pub fn models_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = repo_root().join("target/test-models");
        let status = Command::new(python())
            .arg(repo_root().join("scripts/gen_models.py"))
            .arg("--out")
            .arg(&dir)
            .status()
            .expect("run scripts/gen_models.py");
        assert!(status.success(), "scripts/gen_models.py failed");
        dir
    })
    .clone()
}

/// Max |ours - ort| / max(|ort|) over all outputs.
pub(crate) fn scaled_error(model: &str, data: &str) -> f64 {
    let dir = models_dir();
    let m = load_model(dir.join(format!("{model}.onnx"))).unwrap();
    let interp = Interpreter::new(&m.graph).unwrap();
    let feeds = read_input_set(&m.graph, &dir.join(data)).unwrap();
    let res = interp.run(&feeds).unwrap();
    let mut worst: f64 = 0.0;
    for (i, (name, got)) in res.outputs.iter().enumerate() {
        let (_, want) = read_tensor_file(&dir.join(data).join(format!("output_{i}.pb"))).unwrap();
        assert_eq!(got.shape(), want.shape(), "{model}: output {name} shape");
        let a = got.to_f64_vec().unwrap();
        let b = want.to_f64_vec().unwrap();
        let scale = b.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-30);
        let err = a
            .iter()
            .zip(&b)
            .fold(0f64, |m, (x, y)| m.max((x - y).abs()))
            / scale;
        println!("{model}: output '{name}' max |mixprec - onnxruntime| / max|ort| = {err:.3e}");
        worst = worst.max(err);
    }
    worst
}

#[test]
fn cnn_matches_onnxruntime() {
    assert!(scaled_error("cnn", "cnn") <= 1e-4);
}

#[test]
fn transformer_matches_onnxruntime() {
    assert!(scaled_error("transformer", "transformer") <= 1e-4);
}

#[test]
fn mlp_matches_onnxruntime() {
    assert!(scaled_error("mlp", "mlp") <= 1e-4);
}

#[test]
fn external_data_model_matches_onnxruntime() {
    // Same weights, stored in mlp_external.weights next to the model.
    assert!(scaled_error("mlp_external", "mlp") <= 1e-4);
}

#[test]
fn missing_external_data_is_a_clear_error() {
    let dir = models_dir();
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("m.onnx");
    std::fs::copy(dir.join("mlp_external.onnx"), &copy).unwrap();
    let err = load_model(&copy).unwrap_err().to_string();
    assert!(err.contains("mlp_external.weights"), "{err}");
    assert!(err.contains("m.onnx"), "{err}");
}
