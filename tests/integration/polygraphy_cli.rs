//! Polygraphy's command-line conventions: runners (`--onnxrt`, `--trt`), marked tensors
//! (`--trt-outputs mark all`), data-loader scripts, calibrator classes, TensorRT-only options.

use crate::cli::polygraphy;
use crate::common::{example, python, text};
use std::path::Path;
use std::process::{Command, Output};

fn mixprec_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mixprec"))
        .args(args)
        .current_dir(dir)
        .env("MIXPREC_PYTHON", python())
        .env("NO_COLOR", "1")
        .output()
        .expect("run mixprec")
}

const NC: &[&str] = &[
    "--val-range",
    "x:[1,2]",
    "--layer-precisions",
    "Add:float16",
    "Sub:float32",
    "--check-error-stat",
    "median",
];

#[test]
fn runners_are_compared_in_command_line_order() {
    let tmp = tempfile::tempdir().unwrap();
    let m = example("needs_constraints.onnx");
    let mut args = vec!["run", m.as_str(), "--onnxrt", "--trt", "--fp16"];
    args.extend(NC);
    args.extend(["--save-outputs", "both.json"]);
    let o = mixprec_in(tmp.path(), &args);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    let cmp = t
        .lines()
        .find(|l| l.starts_with("[I] Accuracy Comparison | "))
        .unwrap();
    assert!(
        cmp.starts_with("[I] Accuracy Comparison | onnxrt-runner-N0-")
            && cmp.contains(" vs. trt-runner-N0-"),
        "{t}"
    );
    // Polygraphy's pattern: <prefix>-N0-MM/DD/YY-HH:MM:SS.
    let re = regex::Regex::new(r"^(onnxrt|trt)-runner-N0-\d\d/\d\d/\d\d-\d\d:\d\d:\d\d$").unwrap();
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("both.json")).unwrap()).unwrap();
    let names: Vec<&str> = saved["lst"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e[0].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.iter().all(|n| re.is_match(n)), "{names:?}");
    assert!(names[0].starts_with("onnxrt") && names[1].starts_with("trt"));

    // --trt without a precision runs float32 and says so: it matches --onnxrt exactly.
    let o = mixprec_in(
        tmp.path(),
        &["run", &m, "--trt", "--onnxrt", "--val-range", "x:[1,2]"],
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("the emulated engine runs in float32"), "{t}");
}

#[test]
fn marked_layers_are_saved_compared_in_order_and_read_by_polygraphy() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let m = example("needs_constraints.onnx");
    let o = mixprec_in(
        d,
        &[
            "run",
            &m,
            "--onnxrt",
            "--val-range",
            "x:[1,2]",
            "--save-inputs",
            "in.json",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    // Every layer of the FP16 run, saved in topological order.
    let mut args = vec![
        "run",
        m.as_str(),
        "--trt",
        "--fp16",
        "--trt-outputs",
        "mark",
        "all",
        "--load-inputs",
        "in.json",
        "--save-outputs",
        "fp16_all.json",
    ];
    args.extend(&NC[2..5]);
    let o = mixprec_in(d, &args);
    assert!(o.status.success(), "{}", text(&o));
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("fp16_all.json")).unwrap()).unwrap();
    let outs: Vec<&String> = saved["lst"][0][1][0]["outputs"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(outs, ["matmul_out", "add_out", "sub_out", "output"]);

    // Compared against the FP32 layers: --fail-fast stops at the first failing layer (the
    // Add, which overflows float16), in topological order; the MatMul passes at 1e-3.
    let o = mixprec_in(
        d,
        &[
            "run",
            &m,
            "--onnxrt",
            "--onnx-outputs",
            "mark",
            "all",
            "--load-inputs",
            "in.json",
            "--load-outputs",
            "fp16_all.json",
            "--fail-fast",
            "--check-error-stat",
            "median",
            "--atol",
            "1e-3",
        ],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("Comparing Output: 'matmul_out'"), "{t}");
    assert!(
        t.contains("--fail-fast: stopping at the first failing output 'add_out'"),
        "{t}"
    );
    assert!(!t.contains("Comparing Output: 'sub_out'"), "{t}");
    // Named tensors and exclusions.
    let o = mixprec_in(
        d,
        &[
            "run",
            &m,
            "--onnxrt",
            "--onnx-outputs",
            "mark",
            "all",
            "--onnx-exclude-outputs",
            "matmul_out",
            "--load-inputs",
            "in.json",
            "--save-outputs",
            "dir_form",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let files: Vec<String> = std::fs::read_dir(d.join("dir_form"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files, ["0000000000.json"]);
    let o = mixprec_in(
        d,
        &[
            "run",
            &m,
            "--onnxrt",
            "--onnx-outputs",
            "nope",
            "--val-range",
            "x:[1,2]",
        ],
    );
    assert!(
        text(&o).contains("--onnx-outputs: the model has no tensor 'nope'"),
        "{}",
        text(&o)
    );

    // Polygraphy reads both forms and compares every marked tensor.
    let o = polygraphy(&[
        "run",
        &m,
        "--onnxrt",
        "--onnx-outputs",
        "mark",
        "all",
        "--load-inputs",
        &d.join("in.json").to_string_lossy(),
        "--load-outputs",
        &d.join("dir_form").to_string_lossy(),
        "--check-error-stat",
        "median",
        "--atol",
        "1e-3",
    ]);
    let t = text(&o);
    assert!(o.status.success(), "polygraphy: {t}");
    assert!(t.contains("Comparing Output: 'sub_out'"), "{t}");
    let o = polygraphy(&[
        "run",
        &m,
        "--onnxrt",
        "--onnx-outputs",
        "mark",
        "all",
        "--load-inputs",
        &d.join("in.json").to_string_lossy(),
        "--load-outputs",
        &d.join("fp16_all.json").to_string_lossy(),
        "--check-error-stat",
        "median",
    ]);
    let t = text(&o);
    assert!(!o.status.success(), "polygraphy: {t}");
    assert!(
        t.contains("Comparing Output: 'add_out'") && t.contains("[abs=1.5]"),
        "polygraphy: {t}"
    );
}

const LOADER: &str = r#"
import numpy as np

def load_data():
    rng = np.random.RandomState(7)
    for _ in range(5):
        yield {"x": rng.uniform(-1, 1, size=(1, 64)).astype(np.float32)}

def raises():
    yield {"x": np.zeros((1, 64), np.float32)}
    raise RuntimeError("no more data on disk")

def wrong_name():
    yield {"y": np.zeros((1, 64), np.float32)}

def wrong_shape():
    yield {"x": np.zeros((1, 65), np.float32)}

def wrong_dtype():
    yield {"x": np.zeros((1, 64), np.float64)}

def nothing():
    return iter([])

def save_npz():
    for i, feed in enumerate(load_data()):
        np.savez("set%d.npz" % i, **feed)
"#;

#[test]
fn data_loader_script_feeds_run_and_calibration_like_npz() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::write(d.join("dl.py"), LOADER).unwrap();
    let m = example("mlp.onnx");
    // mlp.onnx's input is x: [batch, 64].
    let o = mixprec_in(d, &["run", &m, "--data-loader-script", "dl.py", "--onnxrt"]);
    assert!(
        text(&o).contains("Completed 5 iteration(s)"),
        "{}",
        text(&o)
    );
    let o = mixprec_in(
        d,
        &[
            "run",
            &m,
            "--data-loader-script",
            "dl.py:load_data",
            "--iterations",
            "2",
        ],
    );
    assert!(
        text(&o).contains("Completed 2 iteration(s)"),
        "{}",
        text(&o)
    );

    // Calibration from the script equals calibration from the same data as .npz files.
    let o = Command::new(python())
        .args(["-c", "import dl; dl.save_npz()"])
        .current_dir(d)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let o = mixprec_in(
        d,
        &[
            "calibrate",
            &m,
            "--data-loader-script",
            "dl.py",
            "--cache",
            "script.cache",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let npz: Vec<String> = (0..5).map(|i| format!("set{i}.npz")).collect();
    let mut args = vec!["calibrate", m.as_str(), "--cache", "npz.cache", "--data"];
    args.extend(npz.iter().map(String::as_str));
    let o = mixprec_in(d, &args);
    assert!(o.status.success(), "{}", text(&o));
    let a = std::fs::read(d.join("script.cache")).unwrap();
    assert_eq!(a, std::fs::read(d.join("npz.cache")).unwrap());
    // The calibrator classes map to the algorithms.
    for (class, algo) in [
        ("IInt8MinMaxCalibrator", "minmax"),
        ("IInt8EntropyCalibrator2", "entropy"),
    ] {
        let o = mixprec_in(
            d,
            &[
                "calibrate",
                &m,
                "--data-loader-script",
                "dl.py",
                "--calibration-base-class",
                class,
                "--cache",
                "c1.cache",
            ],
        );
        assert!(o.status.success(), "{}", text(&o));
        let o = mixprec_in(
            d,
            &[
                "calibrate",
                &m,
                "--data-loader-script",
                "dl.py",
                "--calibration-algo",
                algo,
                "--cache",
                "c2.cache",
            ],
        );
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(
            std::fs::read(d.join("c1.cache")).unwrap(),
            std::fs::read(d.join("c2.cache")).unwrap(),
            "{class}"
        );
    }
    // No file is left behind: the arrays come over a pipe.
    let mut left: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".npz") && !n.ends_with(".cache") && n != "__pycache__")
        .collect();
    left.sort();
    assert_eq!(left, ["dl.py"]);

    // Bad scripts: the script, the iteration and the input are named.
    for (func, needles) in [
        (
            "raises",
            &[
                "dl.py:raises",
                "iteration 1",
                "Traceback",
                "RuntimeError: no more data on disk",
            ][..],
        ),
        (
            "wrong_name",
            &["dl.py:wrong_name: iteration 0: input 'y': the model has no such input"][..],
        ),
        (
            "wrong_shape",
            &["dl.py:wrong_shape: iteration 0: input 'x'", "shape"][..],
        ),
        (
            "wrong_dtype",
            &["dl.py:wrong_dtype: iteration 0: input 'x': expected dtype float32, got float64"][..],
        ),
        (
            "nothing",
            &["dl.py:nothing: the data loader yielded no feed dicts"][..],
        ),
        ("missing", &["dl.py:missing: no function 'missing'"][..]),
    ] {
        let spec = format!("dl.py:{func}");
        let o = mixprec_in(d, &["run", &m, "--data-loader-script", &spec]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "{func}: {t}");
        for n in needles {
            assert!(t.contains(n), "{func}: missing '{n}' in {t}");
        }
    }
}

#[test]
fn tensorrt_only_options_warn_once_and_unknown_flags_fail() {
    let tmp = tempfile::tempdir().unwrap();
    let m = example("needs_constraints.onnx");
    let o = mixprec_in(
        tmp.path(),
        &[
            "run",
            &m,
            "--trt",
            "--fp16",
            "--builder-optimization-level",
            "5",
            "--tactic-sources",
            "--pool-limit",
            "workspace:1G",
            "--timing-cache",
            "t.cache",
            "--trt-opt-shapes",
            "x:[1,1,256,256]",
            "--trt-max-shapes",
            "x:[1,1,256,256]",
            "--warm-up",
            "2",
            "--use-subprocess",
        ],
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let warnings: Vec<&str> = t.lines().filter(|l| l.starts_with("warning:")).collect();
    assert_eq!(
        warnings,
        ["warning: --use-subprocess, --timing-cache, --builder-optimization-level, --tactic-sources, --pool-limit, --trt-max-shapes are TensorRT/ONNX-Runtime options with no effect on mixprec's emulation (accepted so Polygraphy commands run unchanged)"],
        "{t}"
    );
    let o = mixprec_in(tmp.path(), &["run", &m, "--trt", "--no-such-flag"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--no-such-flag"), "{}", text(&o));
    // --trt-opt-shapes is the generated inputs' shape.
    let mlp = example("mlp.onnx");
    let o = mixprec_in(
        tmp.path(),
        &[
            "run",
            &mlp,
            "--onnxrt",
            "--trt-opt-shapes",
            "x:[3,64]",
            "--save-inputs",
            "i.json",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("shape=(3, "), "{}", text(&o));
}

#[test]
fn debug_conventions_iter_artifact_artifacts_output_and_replay() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let m = example("needs_constraints.onnx");
    let py = python().to_string_lossy().into_owned();
    // The check passes when Polygraphy's iteration artifact exists, counts its calls, prints a
    // marker and writes an artifact to sort.
    let check = "import os, sys; open('count', 'a').write('x'); open('art.txt', 'w').write('a'); \
                 print('CHECK' + '-SAYS-HELLO'); sys.exit(0 if os.path.exists('polygraphy_debug.onnx') else 3)";
    let base = [
        "debug",
        "precision",
        m.as_str(),
        "--fp16",
        "--val-range",
        "x:[1,2]",
    ];
    let run = |extra: &[&str]| {
        let mut a: Vec<&str> = base.to_vec();
        a.extend(extra);
        a.extend(["--check", py.as_str(), "-c", check]);
        mixprec_in(d, &a)
    };
    let o = run(&[
        "--save-debug-replay",
        "replay.json",
        "--artifacts",
        "art.txt",
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let calls = std::fs::read_to_string(d.join("count")).unwrap().len();
    assert!(calls >= 2, "{t}");
    // The artifact was there for the check, and removed after each candidate.
    assert!(!d.join("polygraphy_debug.onnx").exists());
    // Passing candidates' output is hidden unless --show-output.
    assert!(!t.contains("CHECK-SAYS-HELLO"), "{t}");
    let good: Vec<_> = std::fs::read_dir(d.join("polygraphy_artifacts/good"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(good.len(), calls, "{good:?}");
    assert!(
        good.iter()
            .all(|n| n.starts_with("art_") && n.ends_with(".txt")),
        "{good:?}"
    );

    // Resuming evaluates no known candidate again.
    let o = run(&[
        "--load-debug-replay",
        "replay.json",
        "--show-output",
        "--no-remove-intermediate",
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert_eq!(
        std::fs::read_to_string(d.join("count")).unwrap().len(),
        calls,
        "{t}"
    );
    assert!(
        t.contains(&format!(
            "{calls} candidate(s) answered from the debug replay"
        )),
        "{t}"
    );
    // Another flag: refused, naming it.
    let o = mixprec_in(
        d,
        &[
            "debug",
            "precision",
            &m,
            "--bf16",
            "--val-range",
            "x:[1,2]",
            "--load-debug-replay",
            "replay.json",
            "--check",
            &py,
            "-c",
            check,
        ],
    );
    assert!(
        text(&o).contains("precision: recorded '--fp16', now '--bf16'"),
        "{}",
        text(&o)
    );
    // --show-output prints passing candidates' output; with a failing check the output shows
    // by default and --hide-fail-output hides it.
    std::fs::remove_file(d.join("count")).unwrap();
    let o = run(&["--show-output", "--iter-artifact", "elsewhere.onnx"]);
    let t = text(&o);
    assert!(t.contains("CHECK-SAYS-HELLO"), "{t}");
    assert!(
        t.contains("Even the all-high-precision plan fails") || !o.status.success(),
        "{t}"
    );
    let o = run(&["--hide-fail-output", "--iter-artifact", "elsewhere.onnx"]);
    assert!(!text(&o).contains("CHECK-SAYS-HELLO"), "{}", text(&o));
}

#[test]
fn data_loader_script_scalars_keep_their_shape() {
    // np.ascontiguousarray turns a 0-d array into shape [1]; a scalar input (Silero VAD's
    // sample rate) must arrive as shape [] and a transposed array with its values.
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("dl.py");
    std::fs::write(
        &script,
        "import numpy as np\n\ndef load_data():\n    yield {\"sr\": np.array(16000, dtype=np.int64), \"t\": np.arange(6, dtype=np.float32).reshape(2, 3).T}\n",
    )
    .unwrap();
    let mut feeds = mixprec::data::script::DataLoaderScript::parse(script.to_str().unwrap())
        .start(&python())
        .unwrap();
    let feed = feeds.next().unwrap().unwrap();
    assert_eq!(feed["sr"].shape(), &[] as &[usize]);
    assert_eq!(feed["sr"].to_f64_vec().unwrap(), vec![16000.0]);
    assert_eq!(feed["t"].shape(), &[3, 2]);
    assert_eq!(
        feed["t"].to_f64_vec().unwrap(),
        vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    );
    assert!(feeds.next().is_none());
}

/// Files are read by content, not name: `--save-results`/`--save-inputs` to `.pkl` names write
/// JSON (as Polygraphy 0.53 does), and `--golden`, `--load-outputs`, `--load-inputs` read them
/// back; a real Python pickle is an error naming the file and how to re-save it as JSON.
#[test]
fn pkl_named_json_loads_and_real_pickles_say_how_to_resave() {
    let dir = tempfile::tempdir().unwrap();
    let model = example("needs_constraints.onnx");
    let o = mixprec_in(
        dir.path(),
        &[
            "run",
            &model,
            "--onnxrt",
            "--val-range",
            "x:[1,2]",
            "--save-inputs",
            "inputs.pkl",
            "--save-results=golden.pkl",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    for f in ["inputs.pkl", "golden.pkl"] {
        let bytes = std::fs::read(dir.path().join(f)).unwrap();
        assert!(
            bytes.starts_with(b"{") || bytes.starts_with(b"["),
            "{f} is not JSON"
        );
    }
    let o = mixprec_in(
        dir.path(),
        &[
            "run",
            &model,
            "--load-inputs",
            "inputs.pkl",
            "--load-outputs",
            "golden.pkl",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("PASSED"), "{}", text(&o));
    let o = mixprec_in(
        dir.path(),
        &[
            "debug",
            "precision",
            &model,
            "--fp16",
            "--golden=golden.pkl",
            "--load-inputs",
            "inputs.pkl",
            "--check-error-stat",
            "median",
        ],
    );
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
    assert!(!text(&o).contains("error:"), "{}", text(&o));
    // A real pickle, as Python writes it.
    let pkl = dir.path().join("real.pkl");
    let st = Command::new(python())
        .arg("-c")
        .arg("import pickle, sys; pickle.dump({'a': 1}, open(sys.argv[1], 'wb'))")
        .arg(&pkl)
        .status()
        .unwrap();
    assert!(st.success());
    for args in [
        vec!["run", model.as_str(), "--load-outputs", "real.pkl"],
        vec!["run", model.as_str(), "--load-inputs", "real.pkl"],
        vec![
            "debug",
            "precision",
            model.as_str(),
            "--fp16",
            "--golden",
            "real.pkl",
        ],
    ] {
        let o = mixprec_in(dir.path(), &args);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {t}");
        assert!(
            t.contains("real.pkl: a Python pickle") && t.contains("save_json"),
            "{args:?}: {t}"
        );
        assert!(!t.contains("panicked"), "{args:?}: {t}");
    }
}
