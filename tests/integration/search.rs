//! `debug precision` end to end on models with planted faults (scripts/gen_models.py):
//! planted_cnn (44 compute layers; 'planted_div' only works in FP32) and planted_transformer
//! ('planted_scale_up' overflows float16, 'planted_scale_down' reads the overflow).

use crate::common::{mixprec, text};
use crate::models::models_dir;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn model(name: &str) -> String {
    models_dir()
        .join(format!("{name}.onnx"))
        .to_string_lossy()
        .into_owned()
}

const CRITERION: [&str; 7] = [
    "--val-range",
    "[-1,1]",
    "--check-error-stat",
    "median",
    "--atol",
    "1e-2",
    "--rtol=1e-2",
];

/// Runs `debug precision --fp16` under [`CRITERION`] with `extra` and returns (exit ok,
/// stdout, the `--save-result` JSON; null when none was written).
fn search_result(model_name: &str, extra: &[&str]) -> (bool, String, serde_json::Value) {
    search_result_under(model_name, &CRITERION, extra)
}

/// [`search_result`] under `criterion` (input range and tolerances) instead of [`CRITERION`].
fn search_result_under(
    model_name: &str,
    criterion: &[&str],
    extra: &[&str],
) -> (bool, String, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let result = dir.path().join("result.json");
    let m = model(model_name);
    let mut args = vec!["debug", "precision", m.as_str(), "--fp16"];
    args.extend(criterion);
    args.extend(["--save-result", result.to_str().unwrap()]);
    args.extend(extra);
    let out = mixprec(&args);
    let v = if result.exists() {
        serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap()
    } else {
        serde_json::Value::Null
    };
    (out.status.success(), text(&out), v)
}

/// Runs `debug precision` and returns (exit ok, stdout, the marked layers from the JSON result).
fn search(model_name: &str, extra: &[&str]) -> (bool, String, Vec<String>) {
    let (ok, log, v) = search_result(model_name, extra);
    let layers = v["layers"].as_array().map_or_else(Vec::new, |a| {
        a.iter()
            .map(|l| l["name"].as_str().unwrap().to_string())
            .collect()
    });
    (ok, log, layers)
}

/// The plan must really pass: `mixprec run` with the found layers in FP32 against the FP32
/// outputs, under the same criterion.
fn assert_plan_passes(model_name: &str, layers: &[String]) {
    let dir = tempfile::tempdir().unwrap();
    let golden = dir.path().join("golden.json");
    let m = model(model_name);
    let out = mixprec(&[
        "run",
        &m,
        "--val-range",
        "[-1,1]",
        "--save-outputs",
        golden.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let items: Vec<String> = layers.iter().map(|l| format!("{l}:float32")).collect();
    let mut args = vec![
        "run",
        m.as_str(),
        "--fp16",
        "--load-outputs",
        golden.to_str().unwrap(),
    ];
    args.extend(CRITERION);
    args.push("--layer-precisions");
    args.extend(items.iter().map(String::as_str));
    let out = mixprec(&args);
    assert!(
        out.status.success(),
        "plan {layers:?} fails when run: {}",
        text(&out)
    );
}

#[test]
fn minimal_finds_exactly_the_planted_layers() {
    let (ok, log, layers) = search("planted_cnn", &["--mode", "minimal"]);
    assert!(ok, "{log}");
    assert_eq!(layers, vec!["planted_div"], "{log}");
    assert!(log.contains("To achieve acceptable accuracy"), "{log}");
    assert_plan_passes("planted_cnn", &layers);

    let (ok, log, layers) = search("planted_transformer", &["--mode", "minimal"]);
    assert!(ok, "{log}");
    assert_eq!(
        layers,
        vec!["planted_scale_up", "planted_scale_down"],
        "{log}"
    );
    assert_plan_passes("planted_transformer", &layers);
}

/// Both rankings find the planted layers; the sensitivity ranking (the default) says what it
/// ran — one run per candidate — in the log and in `stats.ranking_runs`, growth runs none.
#[test]
fn both_rankings_find_the_planted_layers_and_say_what_ranking_cost() {
    for model_name in ["planted_cnn", "planted_transformer"] {
        let mut runs = Vec::new();
        for ranking in ["sensitivity", "growth"] {
            let (ok, log, v) =
                search_result(model_name, &["--mode", "minimal", "--ranking", ranking]);
            assert!(ok, "{log}");
            let candidates = v["candidates"].as_u64().unwrap();
            let ranking_runs = v["stats"]["ranking_runs"].as_u64().unwrap();
            if ranking == "sensitivity" {
                assert_eq!(ranking_runs, candidates, "{log}");
                assert!(
                    log.contains(&format!(
                        "after ranking by sensitivity ({candidates} run(s)"
                    )),
                    "{log}"
                );
                assert!(
                    log.contains(&format!(
                        "[I] Ranking {candidates} candidate layer(s) by sensitivity"
                    )),
                    "{log}"
                );
            } else {
                assert_eq!(ranking_runs, 0, "{log}");
                assert!(!log.contains("by sensitivity"), "{log}");
            }
            runs.push(v["layers"].clone());
        }
        assert_eq!(runs[0], runs[1], "{model_name}: the two rankings' answers");
    }
    // Nothing needed (a loose criterion): the ranking waits for the reference checks, so
    // none of its runs is made.
    let (ok, log, v) = search_result_under(
        "planted_cnn",
        &["--val-range", "[-1,1]", "--atol", "1e6"],
        &["--mode", "minimal"],
    );
    assert!(ok, "{log}");
    assert_eq!(v["outcome"]["kind"], "nothing-needed");
    assert_eq!(v["stats"]["ranking_runs"], 0, "{log}");
}

/// planted_twins: two identical Muls whose float16 roundings cancel when both are in float16,
/// and fail the criterion when either is alone. The sensitivity ranking fails each alone, the
/// answer (the Add/Sub pair) leaves both low, and the search says the criterion is not
/// monotone; the growth ranking judges nothing, so it has no such evidence.
#[test]
fn a_criterion_that_is_not_monotone_is_reported_from_the_ranking() {
    let names = |v: &serde_json::Value| -> Vec<String> {
        v["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["name"].as_str().unwrap().to_string())
            .collect()
    };
    let (ok, log, v) = search_result("planted_twins", &["--mode", "minimal"]);
    assert!(ok, "{log}");
    assert_eq!(names(&v), ["Add", "Sub"], "{log}");
    assert_eq!(v["stats"]["contradictions"]["failing_alone"], 2, "{log}");
    assert!(
        log.contains("[W] The criterion is not monotone on this model: 2 layer(s) failed the criterion alone in low precision in the ranking, yet a passing evaluation leaves them low (planted_twin_a fails alone"),
        "{log}"
    );
    let (ok, log, v) = search_result(
        "planted_twins",
        &["--mode", "minimal", "--ranking", "growth"],
    );
    assert!(ok, "{log}");
    assert_eq!(names(&v), ["Add", "Sub"], "{log}");
    assert_eq!(v["stats"]["contradictions"]["failing_alone"], 0, "{log}");
}

#[test]
fn minimal_with_the_flops_objective_finds_the_planted_layer() {
    let (ok, log, layers) = search(
        "planted_cnn",
        &["--mode", "minimal", "--objective", "flops"],
    );
    assert!(ok, "{log}");
    assert_eq!(layers, vec!["planted_div"], "{log}");
}

#[test]
fn bisect_forward_marks_everything_up_to_the_planted_layer() {
    let (ok, log, layers) = search(
        "planted_cnn",
        &["--mode", "bisect", "--direction", "forward"],
    );
    assert!(ok, "{log}");
    assert_eq!(
        layers.last().map(String::as_str),
        Some("planted_div"),
        "{log}"
    );
    assert!(layers.len() > 20, "{log}");
    assert!(
        log.contains(&format!(
            "try running the first {} layer(s) in higher precision",
            layers.len()
        )),
        "{log}"
    );
    assert_plan_passes("planted_cnn", &layers);
    // The incremental cache saves at least half the layer executions of full re-runs.
    let line = log
        .lines()
        .find(|l| l.contains("layer executions"))
        .unwrap();
    let ratio: f64 = line
        .split("cache: ")
        .nth(1)
        .and_then(|s| s.split('x').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no ratio in {line}"));
    assert!(ratio <= 0.5, "{line}");
}

#[test]
fn bisect_reverse_and_the_other_modes_find_acceptable_plans() {
    for (model_name, mode, dir) in [
        ("planted_cnn", "bisect", "reverse"),
        ("planted_transformer", "bisect", "forward"),
        ("planted_transformer", "bisect", "reverse"),
        ("planted_cnn", "worst-first", "forward"),
        ("planted_transformer", "worst-first", "forward"),
        ("planted_transformer", "linear", "reverse"),
    ] {
        let (ok, log, layers) = search(model_name, &["--mode", mode, "--direction", dir]);
        assert!(ok, "{model_name} {mode} {dir}: {log}");
        assert!(!layers.is_empty(), "{model_name} {mode} {dir}: {log}");
        let planted: &[&str] = if model_name == "planted_cnn" {
            &["planted_div"]
        } else {
            &["planted_scale_up", "planted_scale_down"]
        };
        for p in planted {
            assert!(
                layers.iter().any(|l| l == p),
                "{model_name} {mode} {dir}: {p} not marked: {layers:?}"
            );
        }
        assert_plan_passes(model_name, &layers);
    }
}

#[test]
fn results_are_deterministic_and_the_legacy_spelling_agrees() {
    let (_, _, a) = search("planted_transformer", &["--mode", "bisect"]);
    let (_, _, b) = search("planted_transformer", &["--mode", "bisect"]);
    assert_eq!(a, b);
    // Polygraphy's older form: `precision bisect MODEL --mode forward`.
    let m = model("planted_transformer");
    let mut args = vec![
        "precision",
        "bisect",
        m.as_str(),
        "--mode",
        "forward",
        "--fp16",
    ];
    args.extend(CRITERION);
    let out = mixprec(&args);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(&format!(
        "try running the first {} layer(s) in higher precision (float32)",
        a.len()
    )));
}

#[test]
fn check_command_drives_the_search_with_placeholders() {
    // The "engine" passes exactly when planted_div runs in float32; the candidate model must
    // exist as a file.
    let script = "m=$1; shift; test -s \"$m\" && echo \"$*\" | grep -q 'planted_div:float32' && echo \"$*\" | grep -q 'planted_div:fp32'";
    let (ok, log, layers) = search(
        "planted_cnn",
        &[
            "--mode",
            "minimal",
            "--check",
            "sh",
            "-c",
            script,
            "check",
            "{model}",
            "{trtexec_layer_precisions}",
            "{layer_precisions}",
        ],
    );
    assert!(ok, "{log}");
    assert_eq!(layers, vec!["planted_div"], "{log}");
    assert!(log.contains("--check exited with status 0"), "{log}");
}

#[test]
fn check_command_errors_and_timeouts_are_reported() {
    let (ok, log, _) = search(
        "planted_cnn",
        &["--check", "mixprec-no-such-command-xyz", "{model}"],
    );
    assert!(!ok);
    assert!(
        log.contains("--check: command 'mixprec-no-such-command-xyz' not found"),
        "{log}"
    );
    // A command that hangs is killed and counts as failing: even all-FP32 then fails.
    let (ok, log, _) = search(
        "planted_cnn",
        &["--check-timeout", "0.2", "--check", "sleep", "5"],
    );
    assert!(!ok);
    assert!(log.contains("timed out after"), "{log}");
    assert!(
        log.contains("the golden outputs or the tolerances are wrong"),
        "{log}"
    );
    // --fail-regex turns a zero exit status into a failure.
    let (ok, log, _) = search(
        "planted_cnn",
        &["--fail-regex", "MISMATCH", "--check", "echo", "MISMATCH"],
    );
    assert!(!ok);
    assert!(log.contains("matched --fail-regex"), "{log}");
}

#[test]
fn degenerate_criteria_are_explained() {
    // Nothing needs marking when the tolerance is loose (and nothing overflows).
    let plain = model("transformer");
    let out = mixprec(&[
        "debug",
        "precision",
        &plain,
        "--fp16",
        "--atol",
        "1",
        "--rtol",
        "1",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("no layer needs float32"),
        "{}",
        text(&out)
    );
    let m = model("planted_transformer");
    // Golden outputs of other inputs: even all-FP32 fails.
    let dir = tempfile::tempdir().unwrap();
    let golden = dir.path().join("golden.json");
    let out = mixprec(&[
        "run",
        &m,
        "--seed",
        "7",
        "--save-outputs",
        golden.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let out = mixprec(&[
        "debug",
        "precision",
        &m,
        "--fp16",
        "--golden",
        golden.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("the golden outputs or the tolerances are wrong"),
        "{}",
        text(&out)
    );
    // No reduced precision to search over.
    let out = mixprec(&["debug", "precision", &m]);
    assert!(!out.status.success());
    assert!(text(&out).contains("enable at least one precision"));
}

#[test]
fn writes_the_mixed_precision_model() {
    let dir = tempfile::tempdir().unwrap();
    let out_model = dir.path().join("mixed.onnx");
    let (ok, log, _) = search(
        "planted_cnn",
        &["--mode", "minimal", "-o", out_model.to_str().unwrap()],
    );
    assert!(ok, "{log}");
    assert!(log.contains("Saved mixed-precision model"), "{log}");
    // mixprec loads it back: planted_div reads float32 while its neighbours are float16.
    let m = mixprec::load_model(&out_model).unwrap();
    let casts = m.graph.nodes.iter().filter(|n| n.op_type == "Cast").count();
    assert!(casts >= 2, "{casts} casts");
}

#[test]
fn writes_the_model_when_no_layer_needs_high_precision() {
    // A criterion all-float16 meets: the answer is empty and -o still writes its model.
    let dir = tempfile::tempdir().unwrap();
    let out_model = dir.path().join("mixed.onnx");
    let (ok, log, layers) = search(
        "planted_cnn",
        &[
            "--mode",
            "minimal",
            "--atol",
            "1e9",
            "-o",
            out_model.to_str().unwrap(),
        ],
    );
    assert!(ok, "{log}");
    assert!(log.contains("no layer needs float32"), "{log}");
    assert!(layers.is_empty(), "{layers:?}");
    assert!(log.contains("Saved mixed-precision model"), "{log}");
    let m = mixprec::load_model(&out_model).unwrap();
    assert!(m.graph.nodes.iter().any(|n| n.op_type == "Cast"));
}

#[test]
fn ctrl_c_prints_the_best_plan_so_far() {
    // Each evaluation sleeps, so the interrupt lands mid-search.
    let m = model("planted_cnn");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mixprec"))
        .args([
            "debug",
            "precision",
            &m,
            "--fp16",
            "--mode",
            "bisect",
            "--check",
            "sh",
            "-c",
            "sleep 0.3; test \"$1\" -gt 5",
            "check",
            "{marked_count}",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let third = line.contains("Iteration   3");
        seen.push(line);
        if third {
            // SAFETY: plain kill(2) on our own child.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGINT);
            }
            break;
        }
    }
    seen.extend(lines.map_while(|l| l.ok()));
    let status = child.wait().unwrap();
    let all = seen.join("\n");
    assert_eq!(status.code(), Some(130), "{all}");
    assert!(all.contains("Interrupted after"), "{all}");
    assert!(all.contains("the best passing plan so far"), "{all}");
}

#[test]
fn html_report_holds_the_history_and_the_final_plan() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("search.html");
    let (ok, log, _) = search(
        "planted_transformer",
        &["--mode", "minimal", "--report", report.to_str().unwrap()],
    );
    assert!(ok, "{log}");
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.contains("Search history"), "no history plot");
    assert!(html.contains("Layer-wise error of the final plan"));
    assert!(html.contains("planted_scale_up, planted_scale_down"));
    assert!(html.matches("<svg").count() >= 2);
    assert!(!html.contains("http://") && !html.contains("https://"));
    // Every candidate is a row of the table.
    let evaluations: usize = log
        .lines()
        .find_map(|l| l.strip_prefix("[I] Search: "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    let rows = [
        "check-all",
        "check-none",
        "rank-gallop",
        "rank-bisect",
        "prune",
        "confirm",
    ]
    .iter()
    .map(|phase| {
        html.matches(&format!("<td class=\"l\">{phase}</td>"))
            .count()
    })
    .sum::<usize>();
    assert_eq!(rows, evaluations, "{log}");
}

#[test]
fn the_cache_budget_bounds_memory_without_changing_the_answer() {
    let (ok, log, with_cache) = search("planted_cnn", &["--mode", "bisect"]);
    assert!(ok, "{log}");
    let (ok, log, no_cache) = search("planted_cnn", &["--mode", "bisect", "--cache-budget", "0"]);
    assert!(ok, "{log}");
    assert_eq!(with_cache, no_cache);
    // Without a cache every candidate re-runs in full.
    assert!(
        log.contains("without the incremental cache: 1.00x"),
        "{log}"
    );
    // The ranking compares in windows of the budget (at least 16 MiB, several passes on a
    // larger model): the same ranking, so the same trials, for any budget.
    let mut trials = Vec::new();
    for budget in ["auto", "0", "2G"] {
        let (log, t) = minimal_trials("planted_transformer", &["--cache-budget", budget]);
        assert!(!log.contains("ranked last"), "{log}");
        trials.push(t);
    }
    assert_eq!(trials[0], trials[1]);
    assert_eq!(trials[0], trials[2]);
}

#[test]
fn golden_outputs_from_polygraphy_drive_the_search() {
    // Polygraphy generates the same inputs for the same --val-range and seed, so its ONNX
    // Runtime outputs are golden outputs for mixprec's search.
    let dir = tempfile::tempdir().unwrap();
    let golden = dir.path().join("golden.json");
    let m = model("planted_transformer");
    let out = crate::cli::polygraphy(&[
        "run",
        &m,
        "--onnxrt",
        "--val-range",
        "[-1,1]",
        "--save-outputs",
        golden.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let (ok, log, layers) = search(
        "planted_transformer",
        &["--mode", "minimal", "--golden", golden.to_str().unwrap()],
    );
    assert!(ok, "{log}");
    assert_eq!(
        layers,
        vec!["planted_scale_up", "planted_scale_down"],
        "{log}"
    );
}

/// `debug precision --fp16 --mode minimal` with `extra` (must pass): its log and trials.
fn minimal_trials(model_name: &str, extra: &[&str]) -> (String, Vec<(String, Vec<u64>, bool)>) {
    let mut args = vec!["--mode", "minimal"];
    args.extend(extra);
    let (ok, log, v) = search_result(model_name, &args);
    assert!(ok, "{log}");
    (log, trials_of(&v))
}

/// The trials of a `--save-result` file: (phase, marked layers, passed).
fn trials_of(v: &serde_json::Value) -> Vec<(String, Vec<u64>, bool)> {
    v["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["phase"].as_str().unwrap().to_string(),
                t["marked"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m.as_u64().unwrap())
                    .collect(),
                t["passed"].as_bool().unwrap(),
            )
        })
        .collect()
}

#[test]
fn jobs_evaluate_ahead_without_changing_the_search() {
    let mut trials = Vec::new();
    // `--threads 1`: the kernels' pool is the main thread alone (src/threads.rs), which must
    // then run the jobs it hands out itself.
    for (jobs, threads) in [("1", "2"), ("3", "2"), ("3", "1")] {
        let (log, t) = minimal_trials(
            "planted_transformer",
            &["--jobs", jobs, "--threads", threads],
        );
        let ahead = log.contains("evaluated ahead and not needed");
        assert_eq!(ahead, jobs != "1", "{log}");
        trials.push(t);
    }
    assert!(trials[0].len() > 4, "{:?}", trials[0]);
    assert_eq!(trials[0], trials[1]);
    assert_eq!(trials[0], trials[2]);
    let m = model("planted_transformer");
    let out = mixprec(&["debug", "precision", m.as_str(), "--fp16", "--jobs", "0"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("is not a number of jobs"),
        "{}",
        text(&out)
    );
}

#[test]
fn check_commands_run_at_once_each_in_its_own_directory() {
    let shared = tempfile::tempdir().unwrap();
    let s = shared.path().display().to_string();
    // Each command notes its working directory, holds a marker while it runs and counts the
    // markers it sees (more than one: commands overlapped); it writes a relative artifact.
    // It passes exactly when planted_div runs in float32.
    let script = format!(
        "pwd >> {s}/dirs; touch {s}/running.$$; sleep 0.3; ls {s} | grep -c running >> {s}/overlap; rm {s}/running.$$; \
         echo engine > engine.plan; echo \"$*\" | grep -q 'planted_div:float32'"
    );
    let artifacts = shared.path().join("sorted");
    let (ok, log, layers) = search(
        "planted_cnn",
        &[
            "--mode",
            "minimal",
            "--jobs",
            "3",
            "--artifacts",
            "engine.plan",
            "--artifacts-dir",
            artifacts.to_str().unwrap(),
            "--check",
            "sh",
            "-c",
            &script,
            "check",
            "{layer_precisions}",
        ],
    );
    assert!(ok, "{log}");
    assert_eq!(layers, vec!["planted_div"], "{log}");
    let dirs = std::fs::read_to_string(shared.path().join("dirs")).unwrap();
    let distinct: std::collections::BTreeSet<&str> = dirs.lines().collect();
    assert_eq!(distinct.len(), 3, "{dirs}");
    assert!(distinct
        .iter()
        .all(|d| d.ends_with("job0") || d.ends_with("job1") || d.ends_with("job2")));
    let overlap = std::fs::read_to_string(shared.path().join("overlap")).unwrap();
    assert!(
        overlap
            .lines()
            .any(|n| n.trim().parse::<usize>().unwrap() > 1),
        "{overlap}"
    );
    // Every command's artifact was sorted (none overwritten by another job's).
    let sorted = ["good", "bad"]
        .iter()
        .filter_map(|d| std::fs::read_dir(artifacts.join(d)).ok())
        .map(|r| r.count())
        .sum::<usize>();
    assert_eq!(sorted, dirs.lines().count(), "{log}");
    // A file every job would write is refused.
    let (ok, log, _) = search(
        "planted_cnn",
        &[
            "--jobs",
            "2",
            "--iter-artifact",
            "/tmp/x.onnx",
            "--check",
            "true",
        ],
    );
    assert!(!ok);
    assert!(log.contains("is an absolute path"), "{log}");
}

/// A model of `blocks` repeated blocks named as PyTorch exports them
/// (`/model/layers.{b}/scale/Mul`, `.../unscale/Mul`, `.../residual/Add`, `.../act/Relu`): x in
/// [70, 72] times 1024 passes float16's 65504 in the blocks of `overflowing` (8 elsewhere), so
/// both multiplications of those blocks must stay in float32. Written by the test venv's onnx.
fn repeated_blocks_model(dir: &std::path::Path, blocks: usize, overflowing: &[usize]) -> String {
    let path = dir.join("repeated_blocks.onnx");
    let script = r#"
import sys, json, numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto
path, blocks, overflowing = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
nodes, inits, prev = [], [numpy_helper.from_array(np.array([0.25], np.float32), "quarter")], "x"
for b in range(blocks):
    w = 1024.0 if b in overflowing else 8.0
    p = f"/model/layers.{b}"
    out = "y" if b + 1 == blocks else f"h{b}"
    nodes += [helper.make_node("Mul", [prev, f"w{b}"], [f"s{b}"], name=f"{p}/scale/Mul"),
              helper.make_node("Mul", [f"s{b}", f"iw{b}"], [f"u{b}"], name=f"{p}/unscale/Mul"),
              helper.make_node("Add", [f"u{b}", "quarter"], [f"a{b}"], name=f"{p}/residual/Add"),
              helper.make_node("Relu", [f"a{b}"], [out], name=f"{p}/act/Relu")]
    inits += [numpy_helper.from_array(np.array([w], np.float32), f"w{b}"),
              numpy_helper.from_array(np.array([1.0 / w], np.float32), f"iw{b}")]
    prev = out
g = helper.make_graph(nodes, "repeated_blocks",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], inits)
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
"#;
    let st = Command::new(crate::common::python())
        .arg("-c")
        .arg(script)
        .arg(&path)
        .arg(blocks.to_string())
        .arg(serde_json::to_string(overflowing).unwrap())
        .status()
        .unwrap();
    assert!(st.success(), "writing repeated_blocks.onnx");
    path.to_string_lossy().into_owned()
}

/// `--group roles` (docs/search.md, "Roles"): the answer prints one line per role with its
/// `--layer-precisions` item and ModelOpt's patterns, `--save-result` holds the groups and the
/// trials in layer terms, the answer is the plain search's, and the items give it back.
#[test]
fn group_roles_answers_as_rules_and_saves_the_groups() {
    let dir = tempfile::tempdir().unwrap();
    let m = repeated_blocks_model(dir.path(), 12, &[9, 10, 11]);
    let criterion = [
        "--val-range",
        "x:[70,72]",
        "--atol",
        "0.1",
        "--rtol",
        "0.01",
    ];
    let run = |extra: &[&str]| {
        let result = dir.path().join("result.json");
        let mut args = vec![
            "debug",
            "precision",
            m.as_str(),
            "--fp16",
            "--mode",
            "minimal",
        ];
        args.extend(criterion);
        args.extend(["--save-result", result.to_str().unwrap()]);
        args.extend(extra);
        let out = mixprec(&args);
        let log = text(&out);
        assert!(out.status.success(), "{log}");
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
        (log, v)
    };
    let names = |v: &serde_json::Value| -> Vec<String> {
        v["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["name"].as_str().unwrap().to_string())
            .collect()
    };
    let (log, v) = run(&["--group", "roles"]);
    let (plain_log, plain) = run(&[]);
    let want: Vec<String> = (9..12)
        .flat_map(|b| {
            [
                format!("/model/layers.{b}/scale/Mul"),
                format!("/model/layers.{b}/unscale/Mul"),
            ]
        })
        .collect();
    assert_eq!(names(&v), want, "{log}");
    assert_eq!(names(&plain), want, "{plain_log}");
    // One line per role, each with its item; the plain search's answer reads the same.
    for l in [&log, &plain_log] {
        assert!(
            l.contains("Layers, by role (2 rule(s) for 6 layer(s)"),
            "{l}"
        );
        assert!(
            l.contains("scale/Mul in /model/layers 9–11 (3 layers)"),
            "{l}"
        );
        assert!(
            l.contains("unscale/Mul in /model/layers 9–11 (3 layers)"),
            "{l}"
        );
        assert!(
            l.contains(r"--layer-precisions 're:^/model/layers\.(?:9|1[0-1])/scale/Mul$:float32'"),
            "{l}"
        );
        assert!(l.contains("--nodes_to_exclude '^/model/layers"), "{l}");
    }
    let groups = v["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "{v}");
    assert_eq!(groups[0]["role"], "scale/Mul");
    assert_eq!(groups[0]["scope"], "/model/layers");
    assert_eq!(groups[0]["blocks"], "9–11");
    assert_eq!(groups[0]["block_indices"], serde_json::json!([9, 10, 11]));
    assert_eq!(groups[0]["layers"].as_array().unwrap().len(), 3);
    assert_eq!(groups[1]["role"], "unscale/Mul");
    assert_eq!(plain["groups"], v["groups"]);
    // Trials in layer terms: the roles' ranking and refinement are there, and fewer runs than
    // the plain search's ranking of 48 layers and its evaluations.
    let trials = v["trials"].as_array().unwrap();
    let phases: Vec<&str> = trials
        .iter()
        .map(|t| t["phase"].as_str().unwrap())
        .collect();
    assert!(
        phases.contains(&"rank-roles") && phases.iter().any(|p| p.starts_with("refine")),
        "{phases:?}"
    );
    let runs = |v: &serde_json::Value| {
        v["stats"]["evaluations"].as_u64().unwrap() + v["stats"]["ranking_runs"].as_u64().unwrap()
    };
    assert!(runs(&v) < runs(&plain), "{} vs {}", runs(&v), runs(&plain));
    // The items, given to `run`, select exactly the answer: it passes against the FP32 run.
    let golden = dir.path().join("golden.json");
    let inputs = dir.path().join("inputs.json");
    let out = mixprec(&[
        "run",
        &m,
        "--val-range",
        "x:[70,72]",
        "--save-inputs",
        inputs.to_str().unwrap(),
        "--save-outputs",
        golden.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let items: Vec<String> = groups
        .iter()
        .map(|g| g["layer_precisions"].as_str().unwrap().to_string())
        .collect();
    let mut args = vec![
        "run",
        m.as_str(),
        "--fp16",
        "--load-inputs",
        inputs.to_str().unwrap(),
        "--load-outputs",
        golden.to_str().unwrap(),
        "--atol",
        "0.1",
        "--rtol",
        "0.01",
        "--layer-precisions",
    ];
    args.extend(items.iter().map(String::as_str));
    let out = mixprec(&args);
    assert!(out.status.success(), "{items:?}: {}", text(&out));
}
