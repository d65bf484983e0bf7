//! Shared helpers: where the Python venv and the ONNX conformance data live.

use std::path::PathBuf;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[allow(dead_code)] // used by the model and interop tests
/// The test venv's python (made by scripts/setup-python.sh); `MIXPREC_PYTHON` overrides.
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("MIXPREC_PYTHON") {
        return PathBuf::from(p);
    }
    let p = repo_root().join("target/venv/bin/python");
    assert!(
        p.exists(),
        "{} not found: run `bash scripts/test.sh` (it creates the test venv) or set MIXPREC_PYTHON",
        p.display()
    );
    p
}

/// `onnx/backend/test/data/node` of the onnx==1.22.0 wheel; `MIXPREC_ONNX_NODE_DIR` overrides.
pub fn onnx_node_dir() -> PathBuf {
    if let Ok(p) = std::env::var("MIXPREC_ONNX_NODE_DIR") {
        return PathBuf::from(p);
    }
    let lib = repo_root().join("target/venv/lib");
    if let Ok(rd) = std::fs::read_dir(&lib) {
        for e in rd.flatten() {
            let p = e.path().join("site-packages/onnx/backend/test/data/node");
            if p.is_dir() {
                return p;
            }
        }
    }
    panic!(
        "ONNX conformance data not found under {}: run `bash scripts/test.sh` (it installs onnx==1.22.0) or set MIXPREC_ONNX_NODE_DIR",
        lib.display()
    );
}

/// Runs the mixprec binary built for this test run.
pub fn mixprec(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_mixprec"))
        .args(args)
        .output()
        .expect("run mixprec")
}

/// A bundled example model's path.
pub fn example(name: &str) -> String {
    repo_root()
        .join("examples")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// stdout and stderr of a finished command, for assertions and failure messages.
pub fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
