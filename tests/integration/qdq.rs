//! `debug precision` on a Q/DQ model without a precision flag (docs/search.md, "Searching a
//! Q/DQ model"), end to end on `qdq_cnn` (scripts/gen_models.py): the CNN quantized by ONNX
//! Runtime's `quantize_static`, with the range in front of '/Conv_7' planted 64x too wide.
//! The golden outputs are the float CNN's, as a user's would be.

use crate::common::{mixprec, python, repo_root, text};
use crate::models::models_dir;
use mixprec::onnx::read_tensor_file;
use std::path::{Path, PathBuf};
use std::process::Command;

const PLANTED: &str = "/Conv_7";

fn model(name: &str) -> String {
    models_dir()
        .join(format!("{name}.onnx"))
        .to_string_lossy()
        .into_owned()
}

/// The input set gen_models.py saved for qdq_cnn as an .npz, and the float CNN's outputs on it
/// as golden outputs (mixprec's float32 run of cnn.onnx).
fn inputs_and_golden(dir: &Path) -> (String, String) {
    let npz = dir.join("in.npz");
    let st = Command::new(python())
        .args([
            "-c",
            "import sys, numpy as np, onnx; from onnx import numpy_helper as nh; \
             t = onnx.load_tensor(sys.argv[1]); np.savez(sys.argv[2], **{t.name: nh.to_array(t)})",
        ])
        .arg(models_dir().join("qdq_cnn/input_0.pb"))
        .arg(&npz)
        .status()
        .unwrap();
    assert!(st.success());
    let golden = dir.join("golden.json");
    let out = mixprec(&[
        "run",
        &model("cnn"),
        "--load-inputs",
        npz.to_str().unwrap(),
        "--save-outputs",
        golden.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    (
        npz.to_string_lossy().into_owned(),
        golden.to_string_lossy().into_owned(),
    )
}

/// Runs the search; returns (exit ok, log, the answer's names from `layers[].name`, the JSON).
fn search(dir: &Path, extra: &[&str]) -> (bool, String, Vec<String>, serde_json::Value) {
    let (npz, golden) = inputs_and_golden(dir);
    let result = dir.join("result.json");
    let m = model("qdq_cnn");
    let mut args = vec![
        "debug",
        "precision",
        m.as_str(),
        "--load-inputs",
        &npz,
        "--golden",
        &golden,
        "--check-error-stat",
        "mean",
        "--atol",
        "0.1",
        "--rtol",
        "0",
        "--save-result",
        result.to_str().unwrap(),
    ];
    args.extend(extra);
    let out = mixprec(&args);
    let log = text(&out);
    let json: serde_json::Value = if result.exists() {
        serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap()
    } else {
        serde_json::Value::Null
    };
    let layers = json["layers"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|l| l["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default();
    (out.status.success(), log, layers, json)
}

/// Mean |a − b| of two TensorProto files.
fn mean_abs_diff(a: &Path, b: &Path) -> f64 {
    let (_, a) = read_tensor_file(a).unwrap();
    let (_, b) = read_tensor_file(b).unwrap();
    let (a, b) = (a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
    assert_eq!(a.len(), b.len());
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).sum::<f64>() / a.len() as f64
}

/// ONNX Runtime (graph optimizations off: the Q/DQ graph as written) on `model` with
/// qdq_cnn's saved input; returns the output file.
fn ort(model: &Path, out: &Path) -> PathBuf {
    let o = Command::new(python())
        .arg(repo_root().join("scripts/ort_run.py"))
        .arg(model)
        .arg("--inputs")
        .arg(models_dir().join("qdq_cnn"))
        .arg("--out")
        .arg(out)
        .args(["--opt-level", "disable"])
        .output()
        .unwrap();
    assert!(o.status.success(), "ort_run.py: {}", text(&o));
    out.join("output_0.pb")
}

#[test]
fn every_mode_finds_the_planted_layer() {
    for (mode, dir) in [
        ("minimal", "forward"),
        ("worst-first", "forward"),
        ("bisect", "forward"),
        ("bisect", "reverse"),
        ("linear", "forward"),
        ("linear", "reverse"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let (ok, log, layers, json) = search(tmp.path(), &["--mode", mode, "--direction", dir]);
        assert!(ok, "{mode} {dir}: {log}");
        match (mode, dir) {
            ("minimal" | "worst-first", _) => assert_eq!(layers, [PLANTED], "{mode}: {log}"),
            // Contiguous: every quantized layer up to the planted one (or back to it).
            (_, "forward") => assert_eq!(layers.last().unwrap(), PLANTED, "{mode}: {log}"),
            _ => assert_eq!(layers[0], PLANTED, "{mode}: {log}"),
        }
        assert_eq!(
            json["qdq"]["nodes_to_exclude"][0].as_str(),
            Some(layers[0].as_str())
        );
        assert!(json["qdq"]["quantized_layers"].as_u64().unwrap() > 30);
        assert_eq!(
            json["low_precisions"][0]
                .as_str()
                .unwrap()
                .split(' ')
                .nth(1),
            Some("quantized")
        );
    }
}

#[test]
fn the_stripped_model_runs_in_onnxruntime_and_passes_and_the_exclusions_are_printed() {
    let tmp = tempfile::tempdir().unwrap();
    let stripped = tmp.path().join("stripped.onnx");
    let report = tmp.path().join("report.html");
    let (ok, log, layers, json) = search(
        tmp.path(),
        &[
            "--mode",
            "minimal",
            "-o",
            stripped.to_str().unwrap(),
            "--report",
            report.to_str().unwrap(),
        ],
    );
    assert!(ok, "{log}");
    assert_eq!(layers, [PLANTED]);
    assert!(
        log.contains("python -m modelopt.onnx.quantization --onnx_path <float model> ... --nodes_to_exclude /Conv_7"),
        "{log}"
    );
    assert!(
        log.contains("quantize_static(..., nodes_to_exclude=[\"/Conv_7\"])"),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "trtexec --onnx={} --stronglyTyped",
            stripped.display()
        )),
        "{log}"
    );
    assert_eq!(json["qdq"]["stripped_model"].as_str(), stripped.to_str());
    let removed = json["qdq"]["removed"].as_array().unwrap();
    assert_eq!(removed.len(), 2, "{removed:?}");
    assert_eq!(removed[0]["kind"], "activation");
    assert_eq!(removed[1]["kind"], "weight");
    // Why: the planted layer's activation is rounded with a 64x too coarse step.
    assert!(
        log.contains("Why: each layer alone back in quantization"),
        "{log}"
    );
    let why = &json["qdq"]["reasons"][0];
    assert_eq!(why["layer"], PLANTED, "{why}");
    let input = &why["inputs"][0];
    assert_eq!(input["clipped"].as_f64(), Some(0.0), "{why}");
    assert!(input["relative_error"].as_f64().unwrap() > 0.01, "{why}");
    assert!(
        log.contains(&format!("{PLANTED} (Conv): rounding of ")),
        "{log}"
    );
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.contains(PLANTED));
    // ONNX Runtime: the stripped model is within the criterion of the float model, the
    // Q/DQ model as it was is not.
    let float_out = models_dir().join("cnn/output_0.pb");
    let got = mean_abs_diff(&ort(&stripped, &tmp.path().join("ort")), &float_out);
    let before = mean_abs_diff(&models_dir().join("qdq_cnn/output_0.pb"), &float_out);
    assert!(got <= 0.1, "stripped: mean |ORT − float| = {got}");
    assert!(before > 0.1, "unstripped: {before}");
    // Only the planted layer's pair and weight went: the rest is still quantized.
    let m = mixprec::load_model(&stripped).unwrap();
    let ops =
        |m: &mixprec::Model, op: &str| m.graph.nodes.iter().filter(|n| n.op_type == op).count();
    let orig = mixprec::load_model(model("qdq_cnn")).unwrap();
    assert_eq!(
        ops(&m, "DequantizeLinear"),
        ops(&orig, "DequantizeLinear") - 2
    );
    assert_eq!(ops(&m, "QuantizeLinear"), ops(&orig, "QuantizeLinear") - 1);
}

#[test]
fn float16_fusion_and_check_modes_find_it_too() {
    // Marked layers in float16: the export's Casts, the weight in float16; ORT runs it.
    let tmp = tempfile::tempdir().unwrap();
    let stripped = tmp.path().join("fp16.onnx");
    let (ok, log, layers, _) = search(
        tmp.path(),
        &[
            "--mode",
            "minimal",
            "--precision",
            "float16",
            "-o",
            stripped.to_str().unwrap(),
        ],
    );
    assert!(ok, "{log}");
    assert_eq!(layers, [PLANTED]);
    let m = mixprec::load_model(&stripped).unwrap();
    assert!(m.graph.nodes.iter().any(|n| n.op_type == "Cast"));
    let got = mean_abs_diff(
        &ort(&stripped, &tmp.path().join("ort")),
        &models_dir().join("cnn/output_0.pb"),
    );
    assert!(got <= 0.1, "{got}");
    // --fusion tensorrt reaches the runs.
    let tmp = tempfile::tempdir().unwrap();
    let (ok, log, layers, json) =
        search(tmp.path(), &["--mode", "minimal", "--fusion", "tensorrt"]);
    assert!(ok, "{log}");
    assert_eq!(layers, [PLANTED]);
    assert_eq!(json["fusion"], "tensorrt");
    assert!(log.contains("Every run used --fusion tensorrt"), "{log}");
    // --check: ONNX Runtime judges each candidate's stripped model ({model}).
    let tmp = tempfile::tempdir().unwrap();
    let py = python();
    let judge = "import sys, numpy as np, onnx, onnxruntime as ort; from onnx import numpy_helper as nh; \
                 x = nh.to_array(onnx.load_tensor(sys.argv[2])); ref = nh.to_array(onnx.load_tensor(sys.argv[3])); \
                 so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL; \
                 s = ort.InferenceSession(sys.argv[1], so, providers=['CPUExecutionProvider']); \
                 y = s.run(None, {s.get_inputs()[0].name: x})[0]; sys.exit(0 if np.abs(y - ref).mean() <= 0.1 else 1)";
    let input = models_dir().join("qdq_cnn/input_0.pb");
    let reference = models_dir().join("cnn/output_0.pb");
    let (ok, log, layers, _) = search(
        tmp.path(),
        &[
            "--mode",
            "minimal",
            "--hide-fail-output",
            "--check",
            py.to_str().unwrap(),
            "-c",
            judge,
            "{model}",
            input.to_str().unwrap(),
            reference.to_str().unwrap(),
        ],
    );
    assert!(ok, "{log}");
    assert_eq!(layers, [PLANTED], "{log}");
}

#[test]
fn a_qdq_search_ranks_by_growth_and_refuses_sensitivity() {
    let out = mixprec(&[
        "debug",
        "precision",
        &model("qdq_cnn"),
        "--mode",
        "minimal",
        "--ranking",
        "sensitivity",
    ]);
    assert!(!out.status.success());
    let log = text(&out);
    assert!(
        log.contains("--ranking sensitivity is not available for a Q/DQ model's search"),
        "{log}"
    );
}

#[test]
fn a_precision_flag_on_a_qdq_model_explains_the_two_workflows() {
    let out = mixprec(&["debug", "precision", &model("qdq_cnn"), "--int8"]);
    assert!(!out.status.success());
    let t = text(&out);
    assert!(
        t.contains("already quantized") && t.contains("leave the precision flags out"),
        "{t}"
    );
}

#[test]
fn inconsistent_qdq_models_are_refused_naming_the_node_with_no_output() {
    let tmp = tempfile::tempdir().unwrap();
    // Three broken copies of qdq_cnn: a zero scale, a DequantizeLinear zero point of another
    // type than its QuantizeLinear's, a weight DequantizeLinear whose axis does not fit.
    let script = r#"
import sys, numpy as np, onnx
from onnx import numpy_helper as nh, helper
src, out = sys.argv[1], sys.argv[2]
def load():
    m = onnx.load(src)
    return m, {o: n for n in m.graph.node for o in n.output}, {t.name: t for t in m.graph.initializer}
m, prod, inits = load()
conv = next(n for n in m.graph.node if n.name == "/Conv_7")
dq = prod[conv.input[0]]
s = inits[dq.input[1]]
s.CopyFrom(nh.from_array(np.zeros_like(nh.to_array(s)), s.name))
onnx.save(m, out + "/zero_scale.onnx")
m, prod, inits = load()
dq = prod[next(n for n in m.graph.node if n.name == "/Conv_7").input[0]]
m.graph.initializer.append(nh.from_array(np.array(0, np.int8), "bad_zp"))
dq.input[2] = "bad_zp"
onnx.save(m, out + "/zp_type.onnx")
m, prod, inits = load()
wdq = prod[next(n for n in m.graph.node if n.name == "/Conv_7").input[1]]
for a in wdq.attribute:
    if a.name == "axis":
        a.i = 2
onnx.save(m, out + "/axis.onnx")
print(dq.name, wdq.name, prod[dq.input[0]].name)
"#;
    let o = Command::new(python())
        .args([
            "-c",
            script,
            &model("qdq_cnn"),
            tmp.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let names = String::from_utf8_lossy(&o.stdout).to_string();
    let mut names = names.split_whitespace();
    let (dq, wdq, q) = (
        names.next().unwrap().to_string(),
        names.next().unwrap().to_string(),
        names.next().unwrap().to_string(),
    );
    // The zero scale is shared by the pair: its QuantizeLinear is checked first.
    for (file, node, what) in [
        ("zero_scale.onnx", q.as_str(), "positive and finite"),
        ("zp_type.onnx", dq.as_str(), "zero point"),
        ("axis.onnx", wdq.as_str(), "axis"),
    ] {
        let out_model = tmp.path().join("out.onnx");
        let result = tmp.path().join("r.json");
        let o = mixprec(&[
            "debug",
            "precision",
            tmp.path().join(file).to_str().unwrap(),
            "--val-range",
            "[-1,1]",
            "-o",
            out_model.to_str().unwrap(),
            "--save-result",
            result.to_str().unwrap(),
        ]);
        let t = text(&o);
        assert!(!o.status.success(), "{file}: {t}");
        assert!(
            t.contains(&format!("'{node}'")) && t.contains(what),
            "{file}: {t}"
        );
        assert!(
            !out_model.exists() && !result.exists(),
            "{file}: partial output"
        );
    }
}

#[test]
fn a_debug_replay_answers_a_second_qdq_search() {
    let tmp = tempfile::tempdir().unwrap();
    let replay = tmp.path().join("replay.json");
    let r = replay.to_str().unwrap();
    let (ok, log, first, _) = search(tmp.path(), &["--mode", "minimal", "--save-debug-replay", r]);
    assert!(ok, "{log}");
    assert!(log.contains("Saved debug replay"), "{log}");
    let (ok, log, again, json) =
        search(tmp.path(), &["--mode", "minimal", "--load-debug-replay", r]);
    assert!(ok, "{log}");
    assert_eq!(first, again);
    let n = json["stats"]["evaluations"].as_u64().unwrap();
    assert!(
        log.contains(&format!("{n} candidate(s) answered from the debug replay")),
        "{log}"
    );
}
