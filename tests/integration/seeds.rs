//! The seeds' own commands (Polygraphy's documentation the project imitates), run verbatim
//! with `mixprec` in place of `polygraphy`.
//!
//! The commands come from a fixture in the repository, `tests/fixtures/seeds/commands.json`:
//! per seed, the shell commands of its fenced code blocks in document order (continuation
//! lines joined, `a && b` split as a shell does) and the Python files it shows (`# name.py`
//! blocks, written out before the commands run). The fixture is extracted from
//! `../shared/seeds/*.txt` by [`extract`]; where that directory exists beside the repository,
//! [`fixture_matches_the_seeds`] checks that the fixture is still what extraction yields (so a
//! changed seed is noticed; `MIXPREC_UPDATE_SEED_FIXTURE=1` rewrites it). The suite passes in
//! a fresh clone with nothing beside it.
//!
//! `polygraphy` becomes the mixprec binary, TensorRT engines (`*.engine`) become ONNX files,
//! `> file` redirections are dropped; every other word is kept, file names included
//! (`--save-results=golden.pkl` writes JSON, as Polygraphy 0.53 does, and `--golden=golden.pkl`
//! reads it back by content). `model.onnx` is a small CNN with Polygraphy's example names
//! (`input` 1x3x224x224, `Conv_0`, `Conv_5`, `Add_10`, ...), `needs_constraints.onnx` the
//! bundled example. Every command has an expected outcome below, in document order: a seed
//! that gains or loses a command fails this test until the table says what it should do.

use crate::common::{example, python, repo_root, text};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

/// What a command must do.
#[derive(Debug)]
enum Expect {
    /// Exit status 0.
    Pass,
    /// Exit status 1 after comparing, with these strings in the output.
    Fail(&'static [&'static str]),
    /// Compares (exit 0 or 1, an accuracy summary printed; not an error), with these strings.
    Compares(&'static [&'static str]),
    /// Refused with an error containing this string.
    Refused(&'static str),
    /// Not run: mixprec has no counterpart, for this reason.
    NoCounterpart(&'static str),
}

use Expect::*;

/// Per seed, the commands in document order: a string the command contains, and its outcome.
fn expectations(seed: &str) -> Vec<(&'static str, Expect)> {
    match seed {
        "000" => vec![
            ("run model.onnx --onnxrt --save-results=golden.pkl", Pass),
            ("precision bisect model.onnx --golden=golden.pkl --mode=forward --int8", Pass),
        ],
        // The same page as 000 rendered to HTML text: no fenced blocks.
        "001" => vec![],
        "002" => vec![
            (
                "--trt --fp16 --onnxrt --val-range x:[1,2] --layer-precisions Add:float16 Sub:float32",
                Fail(&["Minimum Required Tolerance: median error | [abs=1.5]", "trt-runner-N0-", "onnxrt-runner-N0-"]),
            ),
            ("--save-inputs inputs.json --save-outputs golden_outputs.json", Pass),
            ("run constrained_network.py --precision-constraints obey", NoCounterpart("a TensorRT network script (TensorRT's Python API); --layer-precisions is the counterpart")),
            ("run constrained_network.py --precision-constraints prefer", NoCounterpart("a TensorRT network script (TensorRT's Python API)")),
            ("--trt-network-postprocess-script ./add_constraints.py", Refused("--trt-network-postprocess-script has no counterpart in mixprec")),
            ("run ... --trt-npps my_script.py:custom_func", NoCounterpart("a placeholder (`...`), marked 'Polygraphy Test: Ignore'")),
        ],
        "003" => vec![
            ("convert model.onnx --fp16 -o model_fp16.engine", Pass),
            ("--data-loader-script calibration_data_loader.py --calibration-cache calibration.cache", Pass),
            ("run model.onnx --onnxrt --save-inputs test_inputs.json", Pass),
            ("run model_fp16.engine --trt", Pass),
            ("run model_int8.engine --trt", Compares(&["Accuracy Summary | trt-runner-N0-"])),
            ("--trt-outputs mark all --load-inputs test_inputs.json --save-outputs fp16_all_layers.json", Pass),
            (
                "--trt-outputs mark all --load-inputs test_inputs.json --load-outputs fp16_all_layers.json --fail-fast",
                Compares(&[
                    "Comparing Output: 'Conv_0_out'",
                    "--fail-fast: stopping at the first failing output 'Conv_0_out'",
                ]),
            ),
            ("python3 parse_layer_errors.py", NoCounterpart("the seed does not ship parse_layer_errors.py")),
            ("debug precision model.onnx --int8 --calibration-cache calibration.cache --precision float32 --mode bisect --check polygraphy run model.onnx --fp16 --onnxrt", Pass),
            // A shell runs the part after `&&` once the search ended, and Polygraphy removes
            // the iteration artifact after every iteration, so the file is gone (as there).
            ("run polygraphy_debug.engine --trt", Refused("polygraphy_debug.onnx")),
            ("--trt-network-postprocess-script fix_precision.py", Refused("--trt-network-postprocess-script has no counterpart in mixprec")),
            ("run model_int8_fixed.engine --trt", NoCounterpart("its engine comes from the network-postprocess-script build just above")),
            ("--layer-precisions Conv_0:float32 Conv_5:float32 Add_10:float32 --precision-constraints obey", Pass),
        ],
        "004" => vec![
            ("python create_network.py", NoCounterpart("the model is bundled as examples/needs_constraints.onnx")),
            (
                "--trt-outputs mark all --onnx-outputs mark all --check-error-stat median",
                Fail(&["Comparing Output: 'add_out'", "Minimum Required Tolerance: median error | [abs=1.5] OR [rel=2.2899e-05]", "Comparing Output: 'sub_out'"]),
            ),
            ("--trt-network-postprocess-script ./postprocess.py", Refused("--trt-network-postprocess-script has no counterpart in mixprec")),
            ("--save-inputs inputs.json --save-outputs outputs.json", Pass),
            ("run loader.py", NoCounterpart("a TensorRT network script (TensorRT's Python API)")),
            ("bash test.sh", NoCounterpart("the seed does not ship test.sh")),
        ],
        other => panic!("seed {other}: no expectations: add them to tests/integration/seeds.rs"),
    }
}

/// `../shared/seeds` beside the repository, when it is there.
fn seeds_dir() -> Option<PathBuf> {
    let d = repo_root().join("../shared/seeds");
    d.is_dir().then_some(d)
}

/// The committed fixture: the seeds' extracted commands and Python files.
fn fixture_path() -> PathBuf {
    repo_root().join("tests/fixtures/seeds/commands.json")
}

/// One seed as the fixture holds it.
struct Seed {
    /// The seed's file name (`000_b812010cb504ffc0.txt`).
    file: String,
    commands: Vec<String>,
    files: Vec<(String, String)>,
}

/// The fixture's JSON for `seeds` (file name order).
fn fixture_json(seeds: &[Seed]) -> Value {
    json!({
        "about": "Generated from ../shared/seeds/*.txt (Polygraphy's documentation) by tests/integration/seeds.rs (extract); MIXPREC_UPDATE_SEED_FIXTURE=1 rewrites it.",
        "seeds": seeds.iter().map(|s| json!({
            "seed": s.file,
            "commands": s.commands,
            "files": s.files.iter().map(|(name, text)| json!({"name": name, "text": text})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

/// Reads the committed fixture.
fn load_fixture() -> Vec<Seed> {
    let p = fixture_path();
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let strs = |v: &Value| -> Vec<String> {
        v.as_array()
            .expect("a list")
            .iter()
            .map(|s| s.as_str().expect("a string").to_string())
            .collect()
    };
    v["seeds"]
        .as_array()
        .expect("\"seeds\": a list")
        .iter()
        .map(|s| Seed {
            file: s["seed"]
                .as_str()
                .expect("\"seed\": a file name")
                .to_string(),
            commands: strs(&s["commands"]),
            files: s["files"]
                .as_array()
                .expect("\"files\": a list")
                .iter()
                .map(|f| {
                    let get = |k: &str| f[k].as_str().expect("a string").to_string();
                    (get("name"), get("text"))
                })
                .collect(),
        })
        .collect()
}

/// Extracts every `*.txt` seed of `dir`, in file name order.
fn extract_dir(dir: &Path) -> Vec<Seed> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let (commands, files) = extract(&std::fs::read_to_string(p).unwrap());
            Seed {
                file: p.file_name().unwrap().to_string_lossy().into_owned(),
                commands,
                files,
            }
        })
        .collect()
}

#[test]
fn fixture_matches_the_seeds() {
    let Some(dir) = seeds_dir() else {
        eprintln!("../shared/seeds not found beside the repository: the fixture is not re-checked");
        return;
    };
    let want = fixture_json(&extract_dir(&dir));
    if std::env::var_os("MIXPREC_UPDATE_SEED_FIXTURE").is_some() {
        let p = fixture_path();
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let text = serde_json::to_string_pretty(&want).unwrap() + "\n";
        mixprec::data::write_atomic(&p, text.as_bytes()).unwrap();
        eprintln!("rewrote {}", p.display());
        return;
    }
    let have: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture_path()).unwrap()).unwrap();
    assert!(
        have == want,
        "{} is not what extraction yields from {} now (a seed changed?): rerun with MIXPREC_UPDATE_SEED_FIXTURE=1 to rewrite it, then update the table in tests/integration/seeds.rs",
        fixture_path().display(),
        dir.display()
    );
}

/// A seed's shell commands and its Python files (`# name.py` first line).
fn extract(text: &str) -> (Vec<String>, Vec<(String, String)>) {
    let mut commands = Vec::new();
    let mut files = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let t = line.trim();
        let Some(lang) = t.strip_prefix("```") else {
            continue;
        };
        let lang = lang.trim().to_string();
        let mut block = Vec::new();
        for l in lines.by_ref() {
            if l.trim().starts_with("```") {
                break;
            }
            block.push(l.to_string());
        }
        if lang == "python" {
            if let Some(name) = block
                .first()
                .and_then(|l| l.trim().strip_prefix("# "))
                .filter(|n| n.ends_with(".py"))
            {
                files.push((name.to_string(), block.join("\n") + "\n"));
            }
            continue;
        }
        // Join continuation lines, then keep lines that start with a command.
        let mut joined: Vec<String> = Vec::new();
        let mut cur = String::new();
        for l in &block {
            let l = l.trim();
            match l.strip_suffix('\\') {
                Some(head) => {
                    cur.push_str(head.trim_end());
                    cur.push(' ');
                }
                None => {
                    cur.push_str(l);
                    joined.push(std::mem::take(&mut cur));
                }
            }
        }
        for c in joined {
            for part in c.split(" && ") {
                let part = part.trim();
                let first = part.split_whitespace().next().unwrap_or("");
                if ["polygraphy", "python", "python3", "bash", "trtexec"].contains(&first) {
                    commands.push(part.split_whitespace().collect::<Vec<_>>().join(" "));
                }
            }
        }
    }
    (commands, files)
}

/// The command's arguments for mixprec: `polygraphy` → the binary, engines → ONNX, `> file`
/// dropped; every other word (`golden.pkl` included) kept.
fn substitute(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut words = command.split_whitespace();
    while let Some(w) = words.next() {
        if w == ">" {
            words.next();
            continue;
        }
        let w = if w == "polygraphy" {
            env!("CARGO_BIN_EXE_mixprec").to_string()
        } else {
            w.replace(".engine", ".onnx")
        };
        out.push(w);
    }
    out
}

/// The seed CNN: Polygraphy's example names and input (`input`: 1x3x224x224).
const MODEL_PY: &str = r#"
import sys
import numpy as np, onnx
from onnx import helper, TensorProto, numpy_helper
rng = np.random.default_rng(0)
nodes, inits = [], []
def w(name, shape, scale):
    inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
    return name
def conv(i, x, cin, cout, k, s):
    y = f"Conv_{i}_out"
    nodes.append(helper.make_node("Conv", [x, w(f"W{i}", (cout, cin, k, k), (2.0 / (cin * k * k)) ** 0.5), w(f"B{i}", (cout,), 0.1)], [y], name=f"Conv_{i}", kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4))
    return y
def op(i, t, xs, **kw):
    y = f"{t}_{i}_out"
    nodes.append(helper.make_node(t, xs, [y], name=f"{t}_{i}", **kw))
    return y
x = op(1, "Relu", [conv(0, "input", 3, 8, 3, 2)])
x = op(3, "Relu", [conv(2, x, 8, 8, 3, 2)])
p = op(4, "MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
x = op(6, "Relu", [conv(5, p, 8, 8, 3, 1)])
x = op(8, "Relu", [conv(7, x, 8, 8, 1, 1)])
x = op(10, "Add", [conv(9, x, 8, 8, 3, 1), p])
x = op(12, "Flatten", [op(11, "GlobalAveragePool", [x])])
nodes.append(helper.make_node("Gemm", [x, w("W13", (10, 8), 0.5), w("B13", (10,), 0.1)], ["output"], name="Gemm_13", transB=1))
g = helper.make_graph(nodes, "seed_model", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 224, 224])], [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 10])], inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
m.ir_version = 8
onnx.checker.check_model(m)
onnx.save(m, sys.argv[1])
"#;

fn prepare(dir: &Path, files: &[(String, String)]) {
    let o = Command::new(python())
        .arg("-c")
        .arg(MODEL_PY)
        .arg(dir.join("model.onnx"))
        .output()
        .unwrap();
    assert!(o.status.success(), "model.onnx: {}", text(&o));
    std::fs::copy(
        example("needs_constraints.onnx"),
        dir.join("needs_constraints.onnx"),
    )
    .unwrap();
    for (name, body) in files {
        std::fs::write(dir.join(name), body).unwrap();
    }
}

#[test]
fn seed_commands_run_verbatim() {
    let seeds = load_fixture();
    assert!(seeds.len() >= 5, "{} seed(s) in the fixture", seeds.len());
    let mut ran = 0;
    let mut report = Vec::new();
    for seed in &seeds {
        let name = &seed.file;
        let (commands, files) = (&seed.commands, &seed.files);
        let expect = expectations(&name[..3]);
        assert_eq!(
            commands.len(),
            expect.len(),
            "{name}: the seed has {} command(s), the table {}: {commands:#?}",
            commands.len(),
            expect.len()
        );
        let tmp = tempfile::tempdir().unwrap();
        prepare(tmp.path(), files);
        for (command, (hint, expect)) in commands.iter().zip(expect) {
            assert!(
                command.contains(hint),
                "{name}: expected a command with '{hint}', found: {command}"
            );
            if let NoCounterpart(why) = expect {
                report.push(format!("{name}: skipped ({why}): {command}"));
                continue;
            }
            let args = substitute(command);
            let o = Command::new(&args[0])
                .args(&args[1..])
                .current_dir(tmp.path())
                .env("MIXPREC_PYTHON", python())
                .env("NO_COLOR", "1")
                .output()
                .unwrap();
            ran += 1;
            let t = text(&o);
            let code = o.status.code();
            let ctx = || format!("{name}: {command}\n(ran as {args:?})\n{t}");
            match expect {
                Pass => assert_eq!(code, Some(0), "{}", ctx()),
                Fail(needles) => {
                    assert_eq!(code, Some(1), "{}", ctx());
                    assert!(!t.contains("error:"), "{}", ctx());
                    for n in needles {
                        assert!(t.contains(n), "missing '{n}': {}", ctx());
                    }
                }
                Compares(needles) => {
                    assert!(matches!(code, Some(0 | 1)), "{}", ctx());
                    assert!(t.contains("Accuracy Summary |"), "{}", ctx());
                    assert!(!t.contains("error:"), "{}", ctx());
                    for n in needles {
                        assert!(t.contains(n), "missing '{n}': {}", ctx());
                    }
                }
                Refused(msg) => {
                    assert_eq!(code, Some(1), "{}", ctx());
                    assert!(t.contains("error:") && t.contains(msg), "{}", ctx());
                }
                NoCounterpart(_) => unreachable!(),
            }
            report.push(format!("{name}: {expect:?}: {command}"));
        }
    }
    assert!(
        ran >= 18,
        "only {ran} seed commands ran:\n{}",
        report.join("\n")
    );
    eprintln!("{}", report.join("\n"));
}

#[test]
fn extraction_joins_continuations_and_splits_and_lists() {
    let doc =
        "text\n```bash\n# comment\npolygraphy run a.onnx \\\n    --trt --fp16 > log.log\n```\n\
               ```python\n# dl.py\nimport numpy\n```\n```\n[I] log line\n```\n\
               ```bash\npolygraphy run m.engine --trt && python3 x.py\n```\n";
    let (c, f) = extract(doc);
    assert_eq!(
        c,
        vec![
            "polygraphy run a.onnx --trt --fp16 > log.log",
            "polygraphy run m.engine --trt",
            "python3 x.py"
        ]
    );
    assert_eq!(
        f,
        vec![("dl.py".to_string(), "# dl.py\nimport numpy\n".to_string())]
    );
    let a = substitute("polygraphy run m.engine --save-results=g.pkl > log.log");
    assert_eq!(&a[1..], &["run", "m.onnx", "--save-results=g.pkl"]);
}
