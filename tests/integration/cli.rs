//! End-to-end CLI tests: Polygraphy file interop in both directions, and bad input.

use crate::common::{example, mixprec, python, text};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn polygraphy(args: &[&str]) -> Output {
    let bin = python().parent().unwrap().join("polygraphy");
    Command::new(bin)
        .args(args)
        .output()
        .expect("run polygraphy")
}

fn p(dir: &Path, name: &str) -> (PathBuf, String) {
    let path = dir.join(name);
    let s = path.to_string_lossy().into_owned();
    (path, s)
}

#[test]
fn polygraphy_files_load_in_mixprec() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, inp) = p(tmp.path(), "poly_in.json");
    let (_, out) = p(tmp.path(), "poly_out.json");
    for (model, range) in [
        ("needs_constraints.onnx", "x:[1,2]"),
        ("transformer.onnx", "[-1,1]"),
    ] {
        let o = polygraphy(&[
            "run",
            &example(model),
            "--onnxrt",
            "--val-range",
            range,
            "--iterations",
            "2",
            "--save-inputs",
            &inp,
            "--save-outputs",
            &out,
        ]);
        assert!(o.status.success(), "polygraphy: {}", text(&o));
        let o = mixprec(&[
            "run",
            &example(model),
            "--load-inputs",
            &inp,
            "--load-outputs",
            &out,
            "--check-error-stat",
            "max",
            "--atol",
            "1e-4",
            "--rtol",
            "1e-4",
        ]);
        assert!(
            o.status.success(),
            "mixprec vs polygraphy/onnxrt on {model}: {}",
            text(&o)
        );
        assert!(text(&o).contains("PASSED"), "{}", text(&o));
    }
}

#[test]
fn mixprec_files_load_in_polygraphy() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, inp) = p(tmp.path(), "mix_in.json");
    let (_, out) = p(tmp.path(), "mix_out.json");
    let o = mixprec(&[
        "run",
        &example("mlp.onnx"),
        "--input-shapes",
        "x:[3,64]",
        "--val-range",
        "[-2,2]",
        "--iterations",
        "2",
        "--save-inputs",
        &inp,
        "--save-outputs",
        &out,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = polygraphy(&[
        "run",
        &example("mlp.onnx"),
        "--onnxrt",
        "--load-inputs",
        &inp,
        "--load-outputs",
        &out,
        "--atol",
        "1e-5",
        "--rtol",
        "1e-5",
    ]);
    assert!(
        o.status.success(),
        "polygraphy rejected mixprec's files: {}",
        text(&o)
    );
}

#[test]
fn golden_mismatch_fails_with_nonzero_exit() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, gold) = p(tmp.path(), "gold.json");
    assert!(mixprec(&[
        "run",
        &example("mlp.onnx"),
        "--input-shapes",
        "x:[2,64]",
        "--seed",
        "1",
        "--save-outputs",
        &gold
    ])
    .status
    .success());
    // Other inputs (another seed): the comparison must fail.
    let o = mixprec(&[
        "run",
        &example("mlp.onnx"),
        "--input-shapes",
        "x:[2,64]",
        "--seed",
        "2",
        "--load-outputs",
        &gold,
    ]);
    assert!(!o.status.success());
    assert!(text(&o).contains("FAILED"), "{}", text(&o));
}

#[test]
fn npz_inputs_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, npz) = p(tmp.path(), "in.npz");
    let (_, gold) = p(tmp.path(), "gold.json");
    let o = mixprec(&[
        "run",
        &example("needs_constraints.onnx"),
        "--val-range",
        "x:[1,2]",
        "--save-inputs",
        &npz,
        "--save-outputs",
        &gold,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = mixprec(&[
        "run",
        &example("needs_constraints.onnx"),
        "--load-inputs",
        &npz,
        "--load-outputs",
        &gold,
    ]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn inspect_prints_layer_table() {
    let o = mixprec(&["inspect", &example("transformer.onnx")]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("LayerNormalization") && t.contains("Softmax"),
        "{t}"
    );
    assert!(t.contains("FLOPs") && t.contains("Totals"), "{t}");
}

/// Runs a failing command; checks exit code, one `error:` line naming `needle`, no output file.
fn fails_cleanly(args: &[&str], needle: &str, out_file: &Path) {
    let o = mixprec(args);
    let t = text(&o);
    assert!(!o.status.success(), "expected failure for {args:?}: {t}");
    let err = String::from_utf8_lossy(&o.stderr);
    let line = err
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("no error line: {t}"));
    assert!(
        line.contains(needle),
        "error line {line:?} should name {needle:?}"
    );
    assert!(!t.contains("panicked"), "{t}");
    assert!(
        !out_file.exists(),
        "a failed run left {}",
        out_file.display()
    );
}

/// LLM ops whose inputs contradict them (issue: GroupQueryAttention head counts, a past KV
/// against the cache, a MatMulNBits blob of the wrong size; scripts/gen_bad_llm_ops.py) and
/// `--decode` on a model without ONNX Runtime GenAI's names: one error line naming the node or
/// input, exit ≠ 0, no output file — from `run` and from `debug precision -o`.
#[test]
fn llm_ops_that_contradict_their_inputs_fail_naming_the_node() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    crate::common::generate_cases("gen_bad_llm_ops.py", d);
    let (out_path, out) = p(d, "out.json");
    let (onnx_path, onnx) = p(d, "mixed.onnx");
    for (model, needle) in [
        (
            "gqa_heads.onnx",
            "'attn_bad_heads' (GroupQueryAttention): key [1, 5, 48]",
        ),
        (
            "gqa_past.onnx",
            "'attn_bad_past' (GroupQueryAttention): past_key [1, 2, 6, 8]",
        ),
        (
            "nbits_blob.onnx",
            "'proj_bad_blob' (MatMulNBits): B is uint8 [8, 2, 8]",
        ),
    ] {
        let model = p(d, model).1;
        fails_cleanly(&["run", &model, "--save-outputs", &out], needle, &out_path);
        fails_cleanly(
            &["debug", "precision", &model, "--fp16", "-o", &onnx],
            needle.split(':').next().unwrap(),
            &onnx_path,
        );
    }
    fails_cleanly(
        &[
            "run",
            &example("mlp.onnx"),
            "--decode",
            "2",
            "--save-outputs",
            &out,
        ],
        "--decode: the model has no input 'input_ids'",
        &out_path,
    );
}

#[test]
fn bad_input_gives_clear_errors_and_no_files() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (out_path, out) = p(d, "out.json");
    let model = example("needs_constraints.onnx");

    // Truncated and non-ONNX files.
    let bytes = std::fs::read(&model).unwrap();
    let (_, trunc) = p(d, "trunc.onnx");
    std::fs::write(&trunc, &bytes[..bytes.len() / 3]).unwrap();
    fails_cleanly(
        &["run", &trunc, "--save-outputs", &out],
        "trunc.onnx",
        &out_path,
    );
    let (_, text_file) = p(d, "notes.onnx");
    std::fs::write(&text_file, "hello, I am not a model\n").unwrap();
    fails_cleanly(
        &["run", &text_file, "--save-outputs", &out],
        "notes.onnx",
        &out_path,
    );
    fails_cleanly(
        &["run", &p(d, "missing.onnx").1, "--save-outputs", &out],
        "missing.onnx",
        &out_path,
    );

    // --val-range syntax errors and unknown input names.
    fails_cleanly(
        &[
            "run",
            &model,
            "--val-range",
            "x:[1,",
            "--save-outputs",
            &out,
        ],
        "x:[1,",
        &out_path,
    );
    fails_cleanly(
        &[
            "run",
            &model,
            "--val-range",
            "x:[a,b]",
            "--save-outputs",
            &out,
        ],
        "x:[a,b]",
        &out_path,
    );
    fails_cleanly(
        &[
            "run",
            &model,
            "--val-range",
            "nope:[1,2]",
            "--save-outputs",
            &out,
        ],
        "nope",
        &out_path,
    );

    // Loaded inputs with a wrong name, rank or dtype.
    let (_, inp) = p(d, "in.json");
    assert!(mixprec(&[
        "run",
        &example("mlp.onnx"),
        "--input-shapes",
        "x:[2,64]",
        "--save-inputs",
        &inp
    ])
    .status
    .success());
    fails_cleanly(
        &["run", &model, "--load-inputs", &inp, "--save-outputs", &out],
        "'x'",
        &out_path,
    );
    let (_, npz) = p(d, "in.npz");
    assert!(mixprec(&["run", &model, "--save-inputs", &npz])
        .status
        .success());
    fails_cleanly(
        &[
            "run",
            &example("mlp.onnx"),
            "--load-inputs",
            &npz,
            "--save-outputs",
            &out,
        ],
        "'x'",
        &out_path,
    );

    // JSON that is not Polygraphy's.
    let (_, junk) = p(d, "junk.json");
    std::fs::write(&junk, "{\"hello\": [1, 2, 3]}").unwrap();
    fails_cleanly(
        &[
            "run",
            &model,
            "--load-outputs",
            &junk,
            "--save-outputs",
            &out,
        ],
        "junk.json",
        &out_path,
    );
    fails_cleanly(
        &[
            "run",
            &model,
            "--load-inputs",
            &junk,
            "--save-outputs",
            &out,
        ],
        "junk.json",
        &out_path,
    );
    let (_, broken) = p(d, "broken.json");
    std::fs::write(&broken, "[{\"x\": ").unwrap();
    fails_cleanly(
        &[
            "run",
            &model,
            "--load-inputs",
            &broken,
            "--save-outputs",
            &out,
        ],
        "broken.json",
        &out_path,
    );

    // Unsupported ops are named all at once: each op, its domain and opset, its count and
    // first node; inspect shows the model and lists them.
    let (_, odd) = p(d, "odd.onnx");
    std::fs::write(&odd, unsupported_op_model()).unwrap();
    fails_cleanly(&["run", &odd, "--save-outputs", &out], "FancyOp", &out_path);
    let o = mixprec(&["run", &odd]);
    let t = text(&o);
    assert!(
        t.contains("2 ops of the model are not supported")
            && t.contains("'FancyOp' (domain 'ai.onnx', opset 13): 2 nodes, first 'my_node'")
            && t.contains("'WordConvEmbedding' (domain 'com.microsoft', opset 1): node 'gelu'"),
        "{t}"
    );
    let o = mixprec(&["inspect", &odd]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("Unsupported: 2 ops of the model"),
        "{}",
        text(&o)
    );
}

fn unsupported_op_model() -> Vec<u8> {
    use mixprec::onnx::proto::*;
    use prost::Message;
    let vi = |name: &str| ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto {
                    dim: vec![tensor_shape_proto::Dimension {
                        value: Some(tensor_shape_proto::dimension::Value::DimValue(4)),
                        ..Default::default()
                    }],
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    };
    let model = ModelProto {
        ir_version: Some(8),
        opset_import: vec![
            OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(13),
            },
            OperatorSetIdProto {
                domain: Some("com.microsoft".into()),
                version: Some(1),
            },
        ],
        graph: Some(GraphProto {
            name: Some("g".into()),
            node: vec![
                NodeProto {
                    name: Some("my_node".into()),
                    op_type: Some("FancyOp".into()),
                    input: vec!["x".into()],
                    output: vec!["a".into()],
                    ..Default::default()
                },
                NodeProto {
                    name: Some("gelu".into()),
                    op_type: Some("WordConvEmbedding".into()),
                    domain: Some("com.microsoft".into()),
                    input: vec!["a".into()],
                    output: vec!["b".into()],
                    ..Default::default()
                },
                NodeProto {
                    name: Some("again".into()),
                    op_type: Some("FancyOp".into()),
                    input: vec!["b".into()],
                    output: vec!["y".into()],
                    ..Default::default()
                },
            ],
            input: vec![vi("x")],
            output: vec![vi("y")],
            ..Default::default()
        }),
        ..Default::default()
    };
    model.encode_to_vec()
}

/// `--seed`/`--val-range` reproduce Polygraphy's data loader bit for bit (NumPy's legacy
/// MT19937), over several iterations and for float and integer inputs.
#[test]
fn generated_inputs_equal_polygraphys() {
    let tmp = tempfile::tempdir().unwrap();
    for (model, args) in [
        (
            "needs_constraints.onnx",
            vec!["--val-range", "x:[1,2]", "--iterations", "3"],
        ),
        (
            "transformer.onnx",
            vec!["--val-range", "[-3,3]", "--seed", "7"],
        ),
    ] {
        let (_, poly) = p(tmp.path(), "poly.json");
        let (_, mine) = p(tmp.path(), "mine.json");
        let model_path = example(model);
        let mut a = vec!["run", &model_path, "--onnxrt", "--save-inputs", &poly];
        a.extend(&args);
        let o = polygraphy(&a);
        assert!(o.status.success(), "{}", text(&o));
        let mut a = vec!["run", &model_path, "--save-inputs", &mine];
        a.extend(&args);
        let o = mixprec(&a);
        assert!(o.status.success(), "{}", text(&o));
        let theirs = mixprec::data::polygraphy::load_inputs(Path::new(&poly)).unwrap();
        let ours = mixprec::data::polygraphy::load_inputs(Path::new(&mine)).unwrap();
        assert_eq!(theirs.len(), ours.len(), "{model}: iteration count");
        for (t, m) in theirs.iter().zip(&ours) {
            assert_eq!(t.keys().collect::<Vec<_>>(), m.keys().collect::<Vec<_>>());
            for (name, tv) in t {
                assert_eq!(
                    tv, &m[name],
                    "{model}: input '{name}' differs from Polygraphy's"
                );
            }
        }
    }
}

/// Iterations, the Accuracy Summary, --metric, --save-error-metrics, --validate and
/// --allow-missing.
#[test]
fn comparison_options() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, gold) = p(tmp.path(), "gold.json");
    let (em_path, em) = p(tmp.path(), "metrics.json");
    let mlp = example("mlp.onnx");
    let base = [
        "run",
        &mlp,
        "--input-shapes",
        "x:[2,64]",
        "--iterations",
        "2",
    ];
    let run = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        mixprec(&a)
    };
    assert!(run(&["--save-outputs", &gold]).status.success());
    // FP16 within loose tolerances, and cosine/SNR/top-k/max-rel metrics that hold.
    let o = run(&[
        "--fp16",
        "--load-outputs",
        &gold,
        "--atol",
        "1",
        "--rtol",
        "1",
        "--metric",
        "cosine:0.99",
        "snr:20",
        "topk:1:0.5",
        "max-rel-above:1e-2:1",
        "--save-error-metrics",
        &em,
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("Cosine Similarity: "), "{t}");
    assert!(t.contains("(min required: 20 dB) | PASSED"), "{t}");
    assert!(t.contains("[I] Iteration: 1"), "{t}");
    assert!(
        t.contains("Accuracy Summary | mixprec-float16-runner vs. mixprec-fp32-runner | Passed: 2/2 iterations | Pass Rate: 100.00%"),
        "{t}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&em_path).unwrap()).unwrap();
    assert_eq!(json["total_iterations"], 2);
    assert_eq!(json["passed"], true);
    let out0 = &json["iterations"][1]["outputs"][0];
    assert_eq!(out0["passed"], true);
    assert_eq!(out0["metrics"].as_array().unwrap().len(), 4);
    assert!(out0["metrics"][0]["value"].as_f64().unwrap() > 0.99);
    assert!(out0["absdiff_stats"]["p99"].as_f64().is_some());
    assert!(out0["required_atol"].as_f64().is_some());
    // A metric that cannot hold fails every iteration, though the tolerances pass.
    let o = run(&["--load-outputs", &gold, "--metric", "cosine:1.5"]);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("(min required: 1.5) | FAILED"), "{t}");
    assert!(
        t.contains("Passed: 0/2 iterations | Pass Rate: 0.00%"),
        "{t}"
    );
    // A metric for another output name does not apply.
    let o = run(&["--load-outputs", &gold, "--metric", "nosuch:cosine:1.5"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = run(&["--metric", "psnr:3"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("--metric: cannot parse 'psnr:3'"),
        "{}",
        text(&o)
    );

    // A golden output the model lacks: an error naming it, unless --allow-missing.
    let (_, gold2) = p(tmp.path(), "gold2.json");
    let script = format!(
        "from polygraphy.comparator import RunResults\n\
         r = RunResults.load({gold:?})\n\
         for it in r[0][1]:\n    it['extra_out'] = next(iter(it.values()))\n\
         r.save({gold2:?})\n"
    );
    let py = Command::new(python())
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(py.status.success(), "{}", text(&py));
    let o = run(&["--load-outputs", &gold2]);
    assert!(!o.status.success());
    assert!(text(&o).contains("'extra_out'"), "{}", text(&o));
    let o = run(&["--load-outputs", &gold2, "--allow-missing"]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("[W]     Skipping golden output(s) the model does not produce: 'extra_out'"),
        "{t}"
    );
}

/// --validate fails on NaN/Inf: Add in float16 overflows to inf for inputs in [100, 200], and
/// the MatMul that follows turns inf * 0 into NaN.
#[test]
fn validate_flags_non_finite_outputs() {
    let model = example("needs_constraints.onnx");
    let o = mixprec(&["run", &model, "--val-range", "x:[100,200]", "--validate"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("PASSED | Output: output is valid"));
    let o = mixprec(&[
        "run",
        &model,
        "--fp16",
        "--val-range",
        "x:[100,200]",
        "--validate",
    ]);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("[E]         NaN Detected"), "{t}");
    assert!(
        t.contains("[E]         FAILED | Errors detected in output: output"),
        "{t}"
    );
    assert!(t.contains("[E]     FAILED | Output Validation"), "{t}");
}

/// `run --load-outputs` and `debug precision --golden` read golden files through one
/// implementation (`mixprec::golden`): a malformed file fails both the same way, before any
/// model run.
#[test]
fn run_and_debug_precision_reject_the_same_malformed_golden_file() {
    let tmp = tempfile::tempdir().unwrap();
    let model = example("mlp.onnx");
    let (gold_path, gold) = p(tmp.path(), "gold.json");
    assert!(mixprec(&[
        "run",
        &model,
        "--input-shapes",
        "x:[2,64]",
        "--save-outputs",
        &gold
    ])
    .status
    .success());
    let valid: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&gold_path).unwrap()).unwrap();
    // No runner at all; a second runner without iterations (the first is fine).
    let mut no_runner = valid.clone();
    no_runner["lst"] = serde_json::json!([]);
    let mut empty_second = valid.clone();
    let first = valid["lst"][0].clone();
    empty_second["lst"] = serde_json::json!([first, ["other-runner", []]]);
    for (name, json, expected) in [
        (
            "no_runner.json",
            no_runner,
            "the RunResults file holds no runner".to_string(),
        ),
        (
            "empty_second.json",
            empty_second,
            "runner 'other-runner' has no iterations".to_string(),
        ),
    ] {
        let (path, file) = p(tmp.path(), name);
        std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
        let run = mixprec(&[
            "run",
            &model,
            "--input-shapes",
            "x:[2,64]",
            "--load-outputs",
            &file,
        ]);
        let debug = mixprec(&[
            "debug",
            "precision",
            &model,
            "--input-shapes",
            "x:[2,64]",
            "--fp16",
            "--golden",
            &file,
        ]);
        let error_line = |o: &Output| {
            assert!(!o.status.success(), "{}", text(o));
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .find(|l| l.contains(&expected))
                .unwrap_or_else(|| panic!("no '{expected}' in:\n{}", text(o)))
                .to_string()
        };
        let (r, d) = (error_line(&run), error_line(&debug));
        assert_eq!(r, d);
        assert!(r.contains(&format!("{file}: {expected}")), "{r}");
        // Rejected before any inference: neither command got as far as running the model.
        assert!(!text(&run).contains("Completed"), "{}", text(&run));
        assert!(
            !text(&debug).contains("candidate layer"),
            "{}",
            text(&debug)
        );
    }
}

/// `run --profile` lists every executed layer once with the layers fused into it (the
/// transformer's bias Adds and GELUs run inside their MatMuls), then the totals per op type;
/// it refuses what would make the timed runs something else (--mark-all).
#[test]
fn profile_lists_each_layer_with_what_ran_inside_it() {
    let o = mixprec(&[
        "run",
        &example("transformer.onnx"),
        "--profile",
        "--iterations",
        "2",
        "--val-range",
        "[-1,1]",
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let header = t
        .lines()
        .find(|l| l.contains("Layer profile:"))
        .unwrap_or_else(|| panic!("no profile in:\n{t}"));
    let count: usize = header
        .split("Layer profile: ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    let rows: Vec<&str> = t.lines().filter(|l| l.contains(" %  /")).collect();
    assert_eq!(rows.len(), count, "{t}");
    assert!(
        rows.iter()
            .any(|r| r.contains("(MatMul + Add + Mul + Div + Erf + Add + Mul)")),
        "{t}"
    );
    // A layer that ran inside another has no row of its own.
    assert!(!rows.iter().any(|r| r.contains("(Erf)")), "{t}");
    assert!(t.contains("By op type:"), "{t}");
    // Warm-up runs (Polygraphy's --warm-up) are neither timed nor reported as iterations.
    let o = mixprec(&[
        "run",
        &example("transformer.onnx"),
        "--profile",
        "--warm-up",
        "3",
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("(average of 1)"), "{t}");
    assert!(t.contains("Completed 1 iteration(s)"), "{t}");
    assert!(!t.contains("no effect"), "{t}");
    let o = mixprec(&[
        "run",
        &example("transformer.onnx"),
        "--profile",
        "--mark-all",
    ]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("--profile times plain runs"),
        "{}",
        text(&o)
    );
}
