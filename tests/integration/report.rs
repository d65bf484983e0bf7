//! Comparison that explains itself: the HTML report, `--json`, colour and `--quiet`,
//! `--mark-all` over several input sets, and Polygraphy's `quantile` error statistic.

use crate::common::{example, mixprec, python, text};
use std::path::Path;
use std::process::Command;

fn path(dir: &Path, name: &str) -> String {
    dir.join(name).to_string_lossy().into_owned()
}

/// Saves FP32 inputs and golden outputs of the seed's FP16 overflow model (`iterations` sets).
fn seed_golden(dir: &Path, iterations: &str) -> (String, String) {
    let (inp, gold) = (path(dir, "in.json"), path(dir, "golden.json"));
    let o = mixprec(&[
        "run",
        &example("needs_constraints.onnx"),
        "--val-range",
        "x:[1,2]",
        "--iterations",
        iterations,
        "--save-inputs",
        &inp,
        "--save-outputs",
        &gold,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    (inp, gold)
}

/// The seed's run: Add in float16 overflows, Sub kept in float32.
fn seed_fp16(inp: &str, gold: &str, extra: &[&str]) -> std::process::Output {
    let model = example("needs_constraints.onnx");
    let mut args = vec![
        "run",
        &model,
        "--fp16",
        "--layer-precisions",
        "Add:float16",
        "Sub:float32",
        "--load-inputs",
        inp,
        "--load-outputs",
        gold,
        "--check-error-stat",
        "median",
        "--atol",
        "1e-3",
    ];
    args.extend_from_slice(extra);
    mixprec(&args)
}

/// Every non-void element closes in order; returns how often each of `names` opens.
fn well_formed(html: &str, names: &[&str]) -> Vec<usize> {
    let mut stack: Vec<String> = Vec::new();
    let mut counts = vec![0; names.len()];
    let mut rest = html;
    while let Some(i) = rest.find('<') {
        rest = &rest[i + 1..];
        let end = rest.find('>').expect("unterminated tag");
        let tag = &rest[..end];
        rest = &rest[end + 1..];
        if tag.starts_with('!') {
            continue;
        }
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop().as_deref(), Some(name), "mismatched </{name}>");
            continue;
        }
        let name: String = tag
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        assert!(!name.is_empty(), "bad tag <{tag}>");
        if let Some(k) = names.iter().position(|n| *n == name) {
            counts[k] += 1;
        }
        if tag.ends_with('/') || name == "meta" {
            continue;
        }
        if name == "style" {
            rest = &rest[rest.find("</style>").expect("closed style") + 8..];
            continue;
        }
        stack.push(name);
    }
    assert!(stack.is_empty(), "unclosed elements: {stack:?}");
    counts
}

#[test]
fn html_report_explains_the_seed_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let (inp, gold) = seed_golden(tmp.path(), "2");
    let report = path(tmp.path(), "report.html");
    let o = seed_fp16(&inp, &gold, &["--mark-all", "--report", &report]);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains(&format!("[I] Saved report to {report}")), "{t}");
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    let c = well_formed(&html, &["svg", "details", "table"]);
    // Per iteration one output with 3 histogram charts, plus the layer plot.
    assert_eq!(c[0], 2 * 3 + 1, "svg charts");
    assert_eq!(c[1], 2, "one card per output and iteration");
    // The verdict says why: the iterations, the output's required tolerance, the first
    // failing layer (the Add, as in the seed's log).
    let verdict = &html[html.find("id=\"verdict\"").unwrap()..];
    let verdict = &verdict[..verdict.find("</div>").unwrap()];
    assert!(verdict.contains("FAILED"), "{verdict}");
    assert!(
        verdict.contains("0/2 iterations match the golden outputs"),
        "{verdict}"
    );
    assert!(
        verdict.contains("Iteration 1: mismatched outputs: &#39;output&#39; (needs [abs=1.5] OR [rel=1] at median error)"),
        "{verdict}"
    );
    assert!(
        verdict.contains("First failing layer in any iteration: #1 &#39;Add&#39;"),
        "{verdict}"
    );
    assert!(html.contains("first failing: #1 Add"), "plot annotation");
    assert!(html.contains("← first failing layer"), "table mark");
    // Layer colours by precision, with a legend: 3 float16 layers and 1 float32.
    assert!(html.contains("float16 (3)") && html.contains("float32 (1)"));
    // Self-contained: nothing fetched from elsewhere.
    for needle in [
        "http://", "https://", "src=", "href=", "url(", "@import", "<script",
    ] {
        assert!(!html.contains(needle), "report contains {needle}");
    }
}

/// A model whose layer and tensor names are markup: the report escapes them.
fn hostile_names_model(dir: &Path) -> String {
    use mixprec::onnx::proto::*;
    use prost::Message;
    let vi = |name: &str| ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto {
                    dim: vec![tensor_shape_proto::Dimension {
                        value: Some(tensor_shape_proto::dimension::Value::DimValue(64)),
                        ..Default::default()
                    }],
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    };
    let node = |name: &str, op: &str, i: &[&str], o: &str| NodeProto {
        name: Some(name.into()),
        op_type: Some(op.into()),
        input: i.iter().map(|s| s.to_string()).collect(),
        output: vec![o.into()],
        ..Default::default()
    };
    let model = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(13),
        }],
        graph: Some(GraphProto {
            name: Some("g".into()),
            node: vec![
                node("<img src=x onerror=alert(1)>", "Exp", &["x"], "e<1>"),
                node("a&b \"quoted\" 'single'", "Mul", &["e<1>", "x"], "y&z"),
            ],
            input: vec![vi("x")],
            output: vec![vi("y&z")],
            ..Default::default()
        }),
        ..Default::default()
    };
    let p = path(dir, "names.onnx");
    std::fs::write(&p, model.encode_to_vec()).unwrap();
    p
}

#[test]
fn html_report_escapes_names() {
    let tmp = tempfile::tempdir().unwrap();
    let model = hostile_names_model(tmp.path());
    let gold = path(tmp.path(), "gold.json");
    let report = path(tmp.path(), "names.html");
    let o = mixprec(&["run", &model, "--save-outputs", &gold]);
    assert!(o.status.success(), "{}", text(&o));
    let o = mixprec(&[
        "run",
        &model,
        "--fp16",
        "--mark-all",
        "--load-outputs",
        &gold,
        "--report",
        &report,
    ]);
    assert!(!o.status.success(), "fp16 misses 1e-5: {}", text(&o));
    let html = std::fs::read_to_string(&report).unwrap();
    well_formed(&html, &[]);
    assert!(!html.contains("<img"), "raw markup from a layer name");
    assert!(html.contains("&lt;img src=x onerror=alert(1)&gt;"));
    assert!(html.contains("a&amp;b &quot;quoted&quot; &#39;single&#39;"));
    assert!(html.contains("e&lt;1&gt;") && html.contains("y&amp;z"));
    assert!(!html.contains("y&z"));
}

#[test]
fn json_replaces_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let (inp, gold) = seed_golden(tmp.path(), "2");
    let o = seed_fp16(&inp, &gold, &["--mark-all", "--json"]);
    assert!(!o.status.success());
    let stdout = String::from_utf8(o.stdout.clone()).unwrap();
    let j: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {stdout}"));
    assert_eq!(j["passed"], false);
    assert_eq!(j["runner"], "mixprec-float16-runner");
    assert_eq!(j["iterations"], 2);
    assert_eq!(j["outputs"][0]["name"], "output");
    assert_eq!(
        j["outputs"][0]["shape"],
        serde_json::json!([1, 1, 256, 256])
    );
    // The comparison: the --save-error-metrics document.
    let c = &j["comparison"];
    assert_eq!(c["passed_iterations"], 0);
    assert_eq!(c["total_iterations"], 2);
    let out = &c["iterations"][1]["outputs"][0];
    assert_eq!(out["stat"], "median");
    assert_eq!(out["required_atol"], 1.5);
    assert_eq!(out["passed"], false);
    // Layer-wise: every iteration and the aggregate, the Add first failing.
    let l = &j["layerwise"];
    assert_eq!(l["stat"], "median");
    assert_eq!(l["compared_iterations"], 2);
    assert_eq!(l["iterations"].as_array().unwrap().len(), 2);
    assert_eq!(l["iterations"][1]["first_failing_layer"], 1);
    assert_eq!(l["aggregate"]["first_failing_layer"], 1);
    let add = &l["aggregate"]["layers"][1];
    assert_eq!(add["layer"], "Add");
    assert_eq!(add["precision"], "float16");
    assert!(
        (add["growth"].as_f64().unwrap() - 1.5).abs() < 0.01,
        "{add}"
    );
    assert_eq!(l["aggregate"]["layers"][2]["precision"], "float32");
    // Why: every sum of the Add lies just beyond float16's largest value and rounds down to
    // it (65504); the float32 Sub adds nothing of its own.
    assert_eq!(add["cause"], "overflow", "{add}");
    assert_eq!(add["facts"]["saturated_outputs"], 65536, "{add}");
    assert_eq!(l["aggregate"]["layers"][2]["cause"], "inherited");
    assert!(j["validation"].is_null());
}

#[test]
fn colour_and_quiet() {
    let tmp = tempfile::tempdir().unwrap();
    let (inp, gold) = seed_golden(tmp.path(), "1");
    // Piped: plain text.
    let o = seed_fp16(&inp, &gold, &[]);
    let plain = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(!plain.contains('\x1b'), "{plain}");
    assert!(plain.contains("[E]         FAILED | Output: 'output'"));
    // --color always: [E] lines red, FAILED bold red, PASSED green.
    let o = seed_fp16(
        &inp,
        &gold,
        &["--color", "always", "--atol", "1e-3", "output:2"],
    );
    let col = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        col.contains("\x1b[1;32mPASSED\x1b[0m | Output: 'output'"),
        "{col}"
    );
    let o = seed_fp16(&inp, &gold, &["--color", "always"]);
    let col = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        col.contains("\x1b[31m[E]         \x1b[1;31mFAILED\x1b[0m\x1b[31m | Output: 'output'"),
        "{col}"
    );
    assert!(col.contains("\x1b[31m[E] Accuracy Summary"), "{col}");
    // The flag wins over NO_COLOR; auto honours it (and is plain when piped anyway).
    let run_env = |color: &str| {
        Command::new(env!("CARGO_BIN_EXE_mixprec"))
            .args(["run", &example("needs_constraints.onnx"), "--color", color])
            .env("NO_COLOR", "1")
            .output()
            .unwrap()
    };
    assert!(String::from_utf8_lossy(&run_env("always").stdout).contains("\x1b[1;32mPASSED"));
    assert!(!String::from_utf8_lossy(&run_env("auto").stdout).contains('\x1b'));
    let o = seed_fp16(&inp, &gold, &["--color", "sometimes"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--color"), "{}", text(&o));
    // --quiet: only the verdict line.
    let o = seed_fp16(&inp, &gold, &["--quiet", "--mark-all"]);
    assert!(!o.status.success());
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.starts_with("[E] FAILED | Runtime: "), "{out}");
    let o = mixprec(&["run", &example("needs_constraints.onnx"), "-q"]);
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.starts_with("[I] PASSED | Runtime: "), "{out}");
    let o = mixprec(&["run", &example("needs_constraints.onnx"), "-q", "-v"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("cannot be used with"), "{}", text(&o));
}

#[test]
fn mark_all_compares_every_input_set() {
    let tmp = tempfile::tempdir().unwrap();
    let (inp, gold) = seed_golden(tmp.path(), "3");
    let tables = |t: &str| t.matches("  result\n").count();
    let o = seed_fp16(&inp, &gold, &["--mark-all"]);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    // The table of iteration 0, a verdict line for the others, then the aggregate.
    assert_eq!(tables(&t), 2, "{t}");
    assert!(t.contains("[I] Layer-wise comparison (iteration 0): mixprec-float16-runner vs. FP32 reference | Checking median error per layer"), "{t}");
    for i in [1, 2] {
        assert!(
            t.contains(&format!("[E] Layer-wise comparison (iteration {i}): FAILED | First failing layer: #1 'Add' (Add)")),
            "{t}"
        );
    }
    assert!(
        t.contains("[I] Layer-wise comparison (all 3 iterations, worst per layer)"),
        "{t}"
    );
    assert!(
        t.contains("[E] First failing layer in any iteration: #1 'Add' (Add)"),
        "{t}"
    );
    assert!(
        t.contains("[E] Layer-wise Summary | Passed: 0/3 iterations | Pass Rate: 0.00%"),
        "{t}"
    );
    // --verbose: every iteration's table.
    let o = seed_fp16(&inp, &gold, &["--mark-all", "--verbose"]);
    assert_eq!(tables(&text(&o)), 4, "{}", text(&o));
    // --fail-fast: stops after the first failing iteration.
    let o = seed_fp16(&inp, &gold, &["--mark-all", "--fail-fast"]);
    let t = text(&o);
    assert!(
        t.contains("[I] --fail-fast: layer-wise comparison stopped after iteration 0"),
        "{t}"
    );
    assert!(!t.contains("(iteration 1)"), "{t}");
    // With the Add in float32 every layer of every iteration passes the aggregate.
    let model = example("needs_constraints.onnx");
    let o = mixprec(&[
        "run",
        &model,
        "--fp16",
        "--layer-precisions",
        "Add:float32",
        "Sub:float32",
        "--load-inputs",
        &inp,
        "--mark-all",
        "--check-error-stat",
        "median",
        "--atol",
        "1e-2",
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("[I] PASSED | All 4 compared layers are within tolerance in all iterations"),
        "{t}"
    );
    assert!(
        t.contains("[I] Layer-wise Summary | Passed: 3/3 iterations | Pass Rate: 100.00%"),
        "{t}"
    );
}

/// `--check-error-stat quantile --error-quantile Q` gives what Polygraphy's
/// `CompareFunc.simple(check_error_stat="quantile", error_quantile=...)` gives on the same
/// outputs (globally and per output).
#[test]
fn quantile_stat_matches_polygraphy() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (gold, fp16, em) = (
        path(dir, "gold.json"),
        path(dir, "fp16.json"),
        path(dir, "em.json"),
    );
    let mlp = example("mlp.onnx");
    let base = [
        "run",
        &mlp,
        "--input-shapes",
        "x:[4,64]",
        "--val-range",
        "[-2,2]",
    ];
    let run = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        mixprec(&a)
    };
    assert!(run(&["--save-outputs", &gold]).status.success());
    let o = run(&["--fp16", "--save-outputs", &fp16]);
    assert!(o.status.success(), "{}", text(&o));
    // The output's name, from `inspect`'s "{name [dtype=..." line.
    let t = text(&mixprec(&["inspect", &mlp]));
    let out_name: String = t
        .lines()
        .skip_while(|l| !l.contains("Graph Output"))
        .nth(1)
        .and_then(|l| l.trim_start_matches('{').split_whitespace().next())
        .unwrap_or_else(|| panic!("no output in {t}"))
        .to_string();
    for (q_args, py_q) in [
        (vec!["0.9"], "0.9".to_string()),
        (
            vec!["0.25", &*format!("{out_name}:0.6")],
            format!("{{'': 0.25, {out_name:?}: 0.6}}"),
        ),
    ] {
        let mut args = vec![
            "--fp16",
            "--load-outputs",
            &gold,
            "--check-error-stat",
            "quantile",
            "--atol",
            "1e-3",
            "--save-error-metrics",
            &em,
            "--error-quantile",
        ];
        args.extend(q_args.iter().copied());
        let o = run(&args);
        let t = text(&o);
        assert!(t.contains("Checking quantile error"), "{t}");
        assert!(
            t.contains("Minimum Required Tolerance: quantile error | [abs="),
            "{t}"
        );
        let j: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&em).unwrap()).unwrap();
        let ours = &j["iterations"][0]["outputs"][0];
        let script = format!(
            "import json\n\
             from polygraphy.comparator import RunResults, CompareFunc\n\
             a = RunResults.load({fp16:?})[0][1][0]\n\
             b = RunResults.load({gold:?})[0][1][0]\n\
             f = CompareFunc.simple(check_error_stat='quantile', error_quantile={py_q}, atol=1e-3, rtol=1e-5)\n\
             r = f(a, b)[{out_name:?}]\n\
             print(json.dumps(dict(passed=bool(r), qa=float(r.quantile_absdiff), qr=float(r.quantile_reldiff))))\n"
        );
        let py = Command::new(python())
            .args(["-c", &script])
            .output()
            .unwrap();
        assert!(py.status.success(), "{}", text(&py));
        let stdout = String::from_utf8_lossy(&py.stdout);
        let theirs: serde_json::Value =
            serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        let close = |a: &serde_json::Value, b: &serde_json::Value| {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            (a - b).abs() <= 1e-6 * b.abs().max(1e-12)
        };
        assert!(
            close(&ours["required_atol"], &theirs["qa"]),
            "{ours} vs {theirs}"
        );
        assert!(
            close(&ours["required_rtol"], &theirs["qr"]),
            "{ours} vs {theirs}"
        );
        assert_eq!(ours["passed"], theirs["passed"], "{ours} vs {theirs}");
        assert!(ours["required_atol"].as_f64().unwrap() > 0.0);
    }
    let o = run(&["--error-quantile", "1.5"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--error-quantile"), "{}", text(&o));
}

/// The search report of a passing answer judges only the graph outputs (no red FAILED for
/// intermediate layers held to the outputs' tolerance), every layer table has a cause
/// column, the answer says why each layer is needed, and wide tables scroll inside their box
/// instead of running off the page: checked in the HTML and, when Chromium is installed, in
/// the rendered page (`scripts/check_report.sh --check`, 900 pixels wide).
#[test]
fn reports_inform_explain_and_scroll() {
    let tmp = tempfile::tempdir().unwrap();
    let model = crate::models::models_dir().join("planted_transformer.onnx");
    let m = model.to_str().unwrap();
    let (search, result, run) = (
        path(tmp.path(), "search.html"),
        path(tmp.path(), "result.json"),
        path(tmp.path(), "run.html"),
    );
    // atol/rtol 1e-3 on the median: the outputs pass with the answer, while many float16
    // layers in between need more than 1e-3 (the old report called them FAILED).
    let o = mixprec(&[
        "debug",
        "precision",
        m,
        "--fp16",
        "--val-range",
        "[-1,1]",
        "--check-error-stat",
        "median",
        "--atol",
        "1e-3",
        "--rtol=1e-3",
        "--mode",
        "worst-first",
        "--report",
        &search,
        "--save-result",
        &result,
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("[I]     Why: each layer alone back in its low precision"),
        "{t}"
    );
    assert!(
        t.lines()
            .any(|l| l.contains("planted_scale_up (Mul, float16): overflow")),
        "{t}"
    );
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
    let layers = j["layers"].as_array().unwrap();
    let up = layers
        .iter()
        .find(|l| l["name"] == "planted_scale_up")
        .unwrap_or_else(|| panic!("{j}"));
    assert_eq!(up["reason"]["cause"], "overflow", "{up}");
    assert!(
        up["reason"]["facts"]["overflowing_inputs"]
            .as_u64()
            .unwrap()
            >= 1
    );
    assert!(
        layers.iter().all(|l| l["reason"]["cause"].is_string()),
        "{j}"
    );
    let html = std::fs::read_to_string(&search).unwrap();
    well_formed(&html, &[]);
    assert!(html.contains("<div class=\"verdict pass\" id=\"verdict\">"));
    assert!(
        !html.contains("badge fail") && !html.contains("<td class=\"fail\">"),
        "a red FAILED in the report of a passing answer"
    );
    assert!(html.contains("the criterion applies to the graph outputs only"));
    assert!(html.contains("<th class=\"l\">cause</th>"));
    assert!(html.contains("Why these layers"));
    // run --mark-all: the layer table has a cause column; the planted overflow is named.
    let o = mixprec(&[
        "run",
        m,
        "--fp16",
        "--val-range",
        "[-1,1]",
        "--mark-all",
        "--check-error-stat",
        "median",
        "--atol",
        "1e-2",
        "--report",
        &run,
    ]);
    let t = text(&o);
    assert!(
        t.lines()
            .any(|l| l.contains("planted_scale_up") && l.contains(" overflow ")),
        "{t}"
    );
    let html = std::fs::read_to_string(&run).unwrap();
    assert!(html.contains("<td class=\"l cause overflow\""));
    // The rendered pages.
    let have_chromium = Command::new("sh")
        .args([
            "-c",
            "command -v chromium || command -v chromium-browser || command -v google-chrome",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_chromium {
        eprintln!("reports_inform_explain_and_scroll: Chromium not installed, layout not rendered");
        return;
    }
    let script = crate::common::repo_root().join("scripts/check_report.sh");
    for (file, passing) in [(&search, true), (&run, false)] {
        let mut args = vec![script.to_str().unwrap(), "--check"];
        if passing {
            args.push("--passing");
        }
        args.extend([file.as_str(), "900"]);
        let o = Command::new("bash").args(&args).output().unwrap();
        let out = text(&o);
        assert!(o.status.success(), "{file}: {out}");
        assert!(
            out.contains("clipped=0\n") && out.contains("page_overflow=0\n"),
            "{out}"
        );
        // The layer table is wider than 900 pixels: it scrolls in its box.
        assert!(!out.contains("scrolling=0\n"), "{out}");
    }
}
