//! Runs the ONNX backend node tests shipped in the onnx==1.22.0 wheel and checks every test
//! whose ops mixprec supports. `CONFORMANCE_FILTER=substr` narrows the run while developing.
//! Deliberate exclusions live in tests/conformance_exclusions.txt, each with its reason.

use crate::common::{onnx_node_dir, repo_root};
use mixprec::exec::{Feeds, RunOptions};
use mixprec::infer::{feed_facts, infer_graph};
use mixprec::onnx::{load_model, read_tensor_file};
use mixprec::ops::Registry;
use mixprec::{Interpreter, Tensor, TensorData};
use std::collections::BTreeMap;
use std::path::Path;

enum Outcome {
    Pass,
    Fail(String),
    Unsupported(String),
}

/// Conformance tests that passed when this was last raised: the count may only grow.
const MIN_PASSED: usize = 1461;

pub(crate) fn exclusions() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(repo_root().join("tests/conformance_exclusions.txt"))
        .unwrap_or_default();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, why) = l.split_once('#').unwrap_or((l, ""));
            (name.trim().to_string(), why.trim().to_string())
        })
        .collect()
}

/// Why a test is out of mixprec's scope, read from the file alone: an op mixprec has no
/// kernel for (subgraphs included), or a value that is not a tensor of a supported type
/// (sequences, optionals, maps; int2/uint2/float8e8m0). None: every op and type is supported,
/// so any load or kernel error is a failure.
pub(crate) fn out_of_scope(path: &Path) -> Option<String> {
    use mixprec::onnx::proto::{type_proto, GraphProto, ValueInfoProto};
    let bytes = std::fs::read(path).ok()?;
    let model = mixprec::onnx::decode_model(&bytes, path).ok()?;
    fn value_ok(v: &ValueInfoProto) -> Result<(), String> {
        match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            Some(type_proto::Value::TensorType(t)) => match t.elem_type {
                Some(code) if mixprec::DType::from_onnx(code).is_none() => {
                    Err(format!("element type {code}"))
                }
                _ => Ok(()),
            },
            None => Ok(()),
            Some(_) => Err("a sequence, map or optional value".into()),
        }
    }
    fn graph_ok(g: &GraphProto) -> Result<(), String> {
        let registry = Registry::global();
        for v in g.input.iter().chain(&g.output).chain(&g.value_info) {
            value_ok(v)?;
        }
        for t in &g.initializer {
            if mixprec::DType::from_onnx(t.data_type.unwrap_or(0)).is_none() {
                return Err(format!("element type {}", t.data_type.unwrap_or(0)));
            }
        }
        for n in &g.node {
            let (op, domain) = (n.op_type(), n.domain());
            if registry.get(domain, op).is_none() {
                return Err(format!("op {op} ({domain})"));
            }
            for a in &n.attribute {
                for sub in a.g.iter().chain(&a.graphs) {
                    graph_ok(sub)?;
                }
            }
        }
        Ok(())
    }
    graph_ok(model.graph.as_ref()?).err()
}

fn run_case(dir: &Path) -> Outcome {
    if let Some(why) = out_of_scope(&dir.join("model.onnx")) {
        return Outcome::Unsupported(why);
    }
    let model = match load_model(dir.join("model.onnx")) {
        Ok(m) => m,
        Err(e) => return Outcome::Fail(format!("load: {e}")),
    };
    let interp = match Interpreter::new(&model.graph) {
        Ok(i) => i,
        Err(e) => return Outcome::Fail(e.to_string()),
    };
    let mut sets: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    sets.sort();
    for set in sets {
        let mut feeds = Feeds::new();
        for (i, vi) in model.graph.inputs.iter().enumerate() {
            let p = set.join(format!("input_{i}.pb"));
            match read_tensor_file(&p) {
                Ok((_, t)) => {
                    feeds.insert(vi.name.clone(), t);
                }
                Err(e) => return Outcome::Unsupported(format!("input data: {e}")),
            }
        }
        let mut expected = Vec::new();
        for i in 0..model.graph.outputs.len() {
            match read_tensor_file(&set.join(format!("output_{i}.pb"))) {
                Ok((_, t)) => expected.push(t),
                Err(e) => return Outcome::Unsupported(format!("output data: {e}")),
            }
        }
        let result = match interp.run_with(
            &feeds,
            &RunOptions {
                keep_intermediates: true,
            },
        ) {
            Ok(r) => r,
            Err(e) => return Outcome::Fail(e.to_string()),
        };
        // The shape and type inference must agree with what the kernels produced.
        let facts = match infer_graph(&model.graph, &feed_facts(&feeds)) {
            Ok(f) => f,
            Err(e) => return Outcome::Fail(format!("inference: {e}")),
        };
        let values = result
            .outputs
            .iter()
            .map(|(n, t)| (n, t))
            .chain(result.intermediates.iter());
        for (name, t) in values {
            let Some(f) = facts.get(name) else { continue };
            if let Some(s) = f.known_shape() {
                if s != t.shape() {
                    return Outcome::Fail(format!(
                        "inferred shape {s:?} of '{name}' differs from the computed {:?}",
                        t.shape()
                    ));
                }
            } else if let Some(r) = f.rank() {
                if r != t.rank() {
                    return Outcome::Fail(format!(
                        "inferred rank {r} of '{name}' differs from the computed {:?}",
                        t.shape()
                    ));
                }
            }
            if let Some(d) = f.dtype {
                if d != t.dtype() {
                    return Outcome::Fail(format!(
                        "inferred dtype {d} of '{name}' differs from the computed {}",
                        t.dtype()
                    ));
                }
            }
        }
        for ((name, got), want) in result.outputs.iter().zip(&expected) {
            if let Err(msg) = compare(got, want) {
                return Outcome::Fail(format!("output '{name}': {msg}"));
            }
        }
    }
    Outcome::Pass
}

/// ONNX's backend runner: `assert_allclose(rtol=1e-3, atol=1e-7)`, NaN equal to NaN.
fn compare(got: &Tensor, want: &Tensor) -> Result<(), String> {
    if got.dtype() != want.dtype() {
        return Err(format!(
            "dtype {} != expected {}",
            got.dtype(),
            want.dtype()
        ));
    }
    if got.shape() != want.shape() {
        return Err(format!(
            "shape {:?} != expected {:?}",
            got.shape(),
            want.shape()
        ));
    }
    if let (TensorData::Str(a), TensorData::Str(b)) = (got.data(), want.data()) {
        return if a == b {
            Ok(())
        } else {
            Err("strings differ".into())
        };
    }
    let a = got.to_f64_vec().unwrap();
    let b = want.to_f64_vec().unwrap();
    let (rtol, atol) = match got.dtype() {
        mixprec::DType::F16 | mixprec::DType::BF16 => (4e-3, 1e-3),
        _ => (1e-3, 1e-7),
    };
    for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
        let ok = (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= atol + rtol * y.abs();
        if !ok {
            return Err(format!("element {i}: got {x}, expected {y}"));
        }
    }
    Ok(())
}

/// The conformance test directories under `root` whose name contains `filter`, sorted.
pub(crate) fn case_dirs(root: &std::path::Path, filter: &str) -> Vec<std::path::PathBuf> {
    let mut cases: Vec<_> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("model.onnx").exists())
        .filter(|p| p.file_name().unwrap().to_string_lossy().contains(filter))
        .collect();
    cases.sort();
    cases
}

#[test]
fn onnx_node_conformance() {
    let root = onnx_node_dir();
    let filter = std::env::var("CONFORMANCE_FILTER").unwrap_or_default();
    let excluded = exclusions();
    let cases = case_dirs(&root, &filter);
    let (mut passed, mut failed, mut unsupported, mut excl) = (0, 0, 0, 0);
    let mut failures = Vec::new();
    let verbose = std::env::var("CONFORMANCE_VERBOSE").is_ok();
    for case in &cases {
        let name = case.file_name().unwrap().to_string_lossy().to_string();
        let outcome = std::panic::catch_unwind(|| run_case(case))
            .unwrap_or_else(|_| Outcome::Fail("PANIC".into()));
        match outcome {
            Outcome::Pass => {
                passed += 1;
                if excluded.contains_key(&name) {
                    failures.push(format!(
                        "{name}: passes but is listed in conformance_exclusions.txt: remove it"
                    ));
                }
            }
            Outcome::Unsupported(why) => {
                unsupported += 1;
                if verbose {
                    eprintln!("unsupported {name}: {why}");
                }
            }
            Outcome::Fail(msg) => {
                if excluded.contains_key(&name) {
                    excl += 1;
                } else {
                    failed += 1;
                    failures.push(format!("{name}: {msg}"));
                }
            }
        }
    }
    for f in &failures {
        eprintln!("FAILED {f}");
    }
    println!(
        "onnx conformance ({} node tests): {passed} passed, {failed} failed, {unsupported} unsupported, {excl} excluded",
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} conformance problems (see above)",
        failures.len()
    );
    if filter.is_empty() {
        assert!(
            passed >= MIN_PASSED,
            "only {passed} conformance tests passed; at least {MIN_PASSED} did before"
        );
    }
}
