//! Shared helpers: where the Python venv and the ONNX conformance data live.

use std::path::PathBuf;

/// The repository's root: this target belongs to the CLI crate (crates/cli).
pub fn repo_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
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
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_mixprec"));
    cmd.args(args);
    // A --check command without {model} reads Polygraphy's iteration artifact,
    // polygraphy_debug.onnx, from the working directory: each such run gets its own, so tests
    // running at once never share it (and none lands in the source tree).
    let artifact_in_cwd = args.contains(&"--check")
        && !args.iter().any(|a| a.contains("{model}"))
        && !args.contains(&"--iter-artifact");
    let cwd = artifact_in_cwd.then(|| tempfile::tempdir().expect("a working directory"));
    if let Some(d) = &cwd {
        cmd.current_dir(d.path());
    }
    cmd.output().expect("run mixprec")
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

/// Runs `scripts/GENERATOR OUT_DIR`, which writes one case per directory
/// (`model.onnx`, `inputs/input_K.pb`, and `ort_model.onnx` where ONNX Runtime must run a
/// different but equivalent model).
pub fn generate_cases(generator: &str, dir: &std::path::Path) {
    let status = std::process::Command::new(python())
        .arg(repo_root().join("scripts").join(generator))
        .arg(dir)
        .status()
        .unwrap_or_else(|e| panic!("run scripts/{generator}: {e}"));
    assert!(status.success(), "{generator} failed");
}

/// The feeds of a case, read from its `input_K.pb` files in the graph's input order.
pub fn feeds_of(graph: &mixprec::graph::Graph, dir: &std::path::Path) -> mixprec::exec::Feeds {
    let mut feeds = mixprec::exec::Feeds::new();
    for (k, vi) in graph.inputs.iter().enumerate() {
        let (_, t) = mixprec::onnx::read_tensor_file(&dir.join(format!("input_{k}.pb"))).unwrap();
        feeds.insert(vi.name.clone(), t);
    }
    feeds
}

/// The instruction set whose kernels ONNX Runtime's MLAS runs here, as its platform
/// initialization picks them: "avx512" with AVX-512 F, BW, DQ and VL, "avx2" with AVX2 and FMA.
pub fn mlas_isa() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl") {
            return "avx512";
        }
        if has!("avx2") && has!("fma") {
            return "avx2";
        }
    }
    "other"
}

/// Generates the cases of `generator` into `dir` (at least `min_cases` of them), runs them in
/// ONNX Runtime (scripts/ort_batch.py) and in mixprec's FP32 interpreter, and returns every
/// disagreement: an output further from ORT's than 1e-5 + 1e-4·|ORT| in any element, a
/// different shape, or a case ONNX Runtime refused.
pub fn cases_against_onnxruntime(
    generator: &str,
    dir: &std::path::Path,
    min_cases: usize,
) -> Vec<String> {
    generate_cases(generator, dir);
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("model.onnx").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() >= min_cases, "{names:?}");
    let manifest: String = names
        .iter()
        .map(|n| {
            let d = dir.join(n);
            let model = if d.join("ort_model.onnx").exists() {
                d.join("ort_model.onnx")
            } else {
                d.join("model.onnx")
            };
            format!(
                "{}\t{}\t{}\n",
                model.display(),
                d.join("inputs").display(),
                d.join("ort").display()
            )
        })
        .collect();
    std::fs::write(dir.join("manifest.tsv"), manifest).unwrap();
    let status = std::process::Command::new(python())
        .arg(repo_root().join("scripts/ort_batch.py"))
        .arg(dir.join("manifest.tsv"))
        .status()
        .expect("run scripts/ort_batch.py");
    assert!(status.success());
    let mut failures = Vec::new();
    for n in &names {
        let d = dir.join(n);
        if let Ok(e) = std::fs::read_to_string(d.join("ort/error.txt")) {
            failures.push(format!("{n}: ONNX Runtime refused it: {e}"));
            continue;
        }
        let m = mixprec::load_model(d.join("model.onnx")).unwrap();
        let feeds = feeds_of(&m.graph, &d.join("inputs"));
        let got = match mixprec::Interpreter::new(&m.graph).and_then(|i| i.run(&feeds)) {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{n}: mixprec failed: {e}"));
                continue;
            }
        };
        for (k, (name, t)) in got.outputs.iter().enumerate() {
            let (_, want) =
                mixprec::onnx::read_tensor_file(&d.join(format!("ort/output_{k}.pb"))).unwrap();
            if t.shape() != want.shape() {
                failures.push(format!(
                    "{n}/{name}: shape {:?}, ORT {:?}",
                    t.shape(),
                    want.shape()
                ));
                continue;
            }
            if !want.dtype().is_float() {
                // Integer outputs (quantized codes) must agree exactly.
                if t.dtype() != want.dtype() || t.to_i64_vec() != want.to_i64_vec() {
                    let (g, w) = (t.to_i64_vec().unwrap(), want.to_i64_vec().unwrap());
                    let diff = g.iter().zip(&w).filter(|(a, b)| a != b).count();
                    failures.push(format!(
                        "{n}/{name}: {} codes, ORT {}; {diff} of {} differ",
                        t.dtype(),
                        want.dtype(),
                        w.len()
                    ));
                }
                continue;
            }
            let (g, w) = (t.to_f32_vec().unwrap(), want.to_f32_vec().unwrap());
            let exact = std::fs::read_to_string(d.join("exact"))
                .is_ok_and(|isa| isa.is_empty() || isa == mlas_isa());
            if exact {
                // Cases that follow ORT's kernel expression for expression agree bit for bit
                // (NaN with NaN); those measured against one instruction set's MLAS kernels
                // only where ORT runs them.
                let same =
                    |a: &f32, b: &f32| a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan();
                let diff = g.iter().zip(&w).filter(|(a, b)| !same(a, b)).count();
                if diff > 0 {
                    failures.push(format!(
                        "{n}/{name}: {diff} of {} values differ from ORT's bits",
                        w.len()
                    ));
                }
                continue;
            }
            let worst = g
                .iter()
                .zip(&w)
                .map(|(a, b)| (a - b).abs() / (1e-5 + 1e-4 * b.abs()))
                .fold(0f32, f32::max);
            if worst.is_nan() || worst > 1.0 {
                failures.push(format!(
                    "{n}/{name}: differs from ORT ({worst:.2} x tolerance)"
                ));
            }
        }
    }
    failures
}
