//! `mixprec plan` end to end through the binary: a planted model whose best format per layer
//! is known (src/jobs/plan/tests.rs has the same branches, run through the library).

use crate::common::{mixprec, text};
use mixprec::onnx::proto::*;
use mixprec::onnx::tensor_to_proto;
use mixprec::tensor::Tensor;
use prost::Message;
use std::path::Path;

const N: usize = 64;

/// Deterministic values in [-1, 1).
pub(crate) fn uniform(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// `A` overflows float16 but quantizes; `B` is lost by fp8's mantissa, not by int8; `C` reads
/// one outlier channel (×1000, its weight row 0) that makes int8 round every other value to
/// 0, which fp8 keeps; `Scale` (the ×1000 Mul) has no int8 kernel.
pub(crate) fn planted(dir: &Path) -> String {
    let vi = |name: &str| ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto {
                    dim: [1, N as i64]
                        .iter()
                        .map(|&d| tensor_shape_proto::Dimension {
                            value: Some(tensor_shape_proto::dimension::Value::DimValue(d)),
                            ..Default::default()
                        })
                        .collect(),
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
    let weight = |name: &str, seed, scale: f32, zero_first_row: bool| {
        let mut v: Vec<f32> = uniform(seed, N * N).iter().map(|x| x * scale).collect();
        if zero_first_row {
            v[..N].iter_mut().for_each(|x| *x = 0.0);
        }
        tensor_to_proto(name, &Tensor::from_f32(vec![N, N], v))
    };
    let mut k = vec![1.0f32; N];
    k[0] = 1000.0;
    let model = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(GraphProto {
            name: Some("planted_formats".into()),
            node: vec![
                node("A", "MatMul", &["xa", "wa"], "ya"),
                node("B", "MatMul", &["xb", "wb"], "yb"),
                node("Scale", "Mul", &["xc", "k"], "xk"),
                node("C", "MatMul", &["xk", "wc"], "yc"),
            ],
            initializer: vec![
                weight("wa", 1, 20000.0, false),
                weight("wb", 2, 1.0, false),
                weight("wc", 3, 1.0, true),
                tensor_to_proto("k", &Tensor::from_f32(vec![N], k)),
            ],
            input: vec![vi("xa"), vi("xb"), vi("xc")],
            output: vec![vi("ya"), vi("yb"), vi("yc")],
            ..Default::default()
        }),
        ..Default::default()
    };
    let p = dir.join("planted_formats.onnx");
    std::fs::write(&p, model.encode_to_vec()).unwrap();
    p.to_string_lossy().into_owned()
}

/// The planted model's FP32 run on the inputs plan generates (`--val-range [-1,1]`, two
/// sets), saved: the input and output files' paths.
fn fp32_run(dir: &Path, model: &str) -> (String, String) {
    let gold = dir.join("gold.json").to_string_lossy().into_owned();
    let inputs = dir.join("in.json").to_string_lossy().into_owned();
    let r = mixprec(&[
        "run",
        model,
        "--val-range",
        "[-1,1]",
        "--iterations",
        "2",
        "--save-inputs",
        &inputs,
        "--save-outputs",
        &gold,
    ]);
    assert!(r.status.success(), "{}", text(&r));
    (inputs, gold)
}

fn plan_args<'a>(model: &'a str, formats: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "plan",
        model,
        "--formats",
        formats,
        "--val-range",
        "[-1,1]",
        "--iterations",
        "2",
        "--atol",
        "1e30",
        "--metric",
        "ya:snr:25",
        "yb:snr:38",
        "yc:snr:25",
        "--calibration-algo",
        "minmax",
    ];
    args.extend_from_slice(extra);
    args
}

#[test]
fn plan_chooses_the_known_formats_and_writes_the_model_the_front_and_the_report() {
    let tmp = tempfile::tempdir().unwrap();
    let model = planted(tmp.path());
    let out = tmp.path().join("mixed.onnx");
    let json = tmp.path().join("plan.json");
    let html = tmp.path().join("plan.html");
    let (out_s, json_s, html_s) = (
        out.to_string_lossy().into_owned(),
        json.to_string_lossy().into_owned(),
        html.to_string_lossy().into_owned(),
    );
    let o = mixprec(&plan_args(
        &model,
        "fp8,int8,fp16",
        &["-o", &out_s, "--save-result", &json_s, "--report", &html_s],
    ));
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains(&format!("trtexec --onnx={out_s} --stronglyTyped")),
        "{t}"
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let k = v["chosen"].as_u64().unwrap() as usize;
    let layers = &v["front"][k]["layers"];
    assert!(
        ["int8", "fp8e4m3"].contains(&layers["A"].as_str().unwrap()),
        "{layers}"
    );
    assert_eq!(layers["B"], "int8", "{layers}");
    assert_eq!(layers["C"], "fp8e4m3", "{layers}");
    assert_eq!(layers["Scale"], "float16", "{layers}");
    assert_eq!(v["front"][k]["passed"], true);
    assert!(v["baselines"]
        .as_array()
        .unwrap()
        .iter()
        .all(|b| b["passed"] == false));
    // The exported model is strongly typed: Q/DQ for the int8/fp8 layers, a Cast for Scale.
    let m = ModelProto::decode(std::fs::read(&out).unwrap().as_slice()).unwrap();
    let ops: Vec<&str> = m
        .graph
        .as_ref()
        .unwrap()
        .node
        .iter()
        .map(|n| n.op_type.as_deref().unwrap_or(""))
        .collect();
    assert!(
        ops.contains(&"QuantizeLinear") && ops.contains(&"Cast"),
        "{ops:?}"
    );
    // The exported model runs, and passes the same criterion against the FP32 model.
    let (inputs, gold) = fp32_run(tmp.path(), &model);
    let r = mixprec(&[
        "run",
        &out_s,
        "--load-inputs",
        &inputs,
        "--load-outputs",
        &gold,
        "--atol",
        "1e30",
        "--metric",
        "ya:snr:25",
        "yb:snr:38",
        "yc:snr:25",
    ]);
    assert!(r.status.success(), "{}", text(&r));
    let report = std::fs::read_to_string(&html).unwrap();
    assert!(report.contains("<svg") && report.contains(">chosen<"));
    // --cost-of prices the written model: the chosen point's modeled cost, layer for layer.
    let priced = tmp.path().join("cost.json");
    let priced_s = priced.to_string_lossy().into_owned();
    let r = mixprec(&[
        "plan",
        &model,
        "--cost-of",
        &out_s,
        "--val-range",
        "[-1,1]",
        "--save-result",
        &priced_s,
    ]);
    let t = text(&r);
    assert!(r.status.success(), "{t}");
    assert!(
        t.contains("on h100 (latency)") && t.contains("reformat(s)"),
        "{t}"
    );
    let c: serde_json::Value = serde_json::from_slice(&std::fs::read(&priced).unwrap()).unwrap();
    assert_eq!(c["cost"], v["front"][k]["cost"], "{c}");
    assert_eq!(c["costs"], v["front"][k]["costs"], "{c}");
    assert_eq!(&c["layers"], layers);
    // MODEL is the float model the mixed one was made from; a Q/DQ one is refused.
    let r = mixprec(&["plan", &out_s, "--cost-of", &model, "--val-range", "[-1,1]"]);
    assert!(!r.status.success());
    assert!(text(&r).contains("already quantized"), "{}", text(&r));
}

#[test]
fn plan_bad_input_is_one_line_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let model = planted(tmp.path());
    let out = tmp.path().join("mixed.onnx");
    let out_s = out.to_string_lossy().into_owned();
    let cost = tmp.path().join("gpu.json");
    std::fs::write(&cost, r#"{"name": "x", "source": "s", "peak_tflops": {}}"#).unwrap();
    let cost_s = cost.to_string_lossy().into_owned();
    for (formats, extra, expected) in [
        ("fp8,int4", vec![], "unknown format 'int4'"),
        ("int8", vec!["--target", "a100"], "unknown target"),
        (
            "int8",
            vec!["--target", cost_s.as_str()],
            "missing field \"memory_bandwidth_gb_s\"",
        ),
    ] {
        let mut args = plan_args(&model, formats, &["-o", &out_s]);
        args.extend(extra);
        let o = mixprec(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(expected), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    // No assignment of 16-bit formats reaches 200 dB: the front is printed, nothing written.
    let mut args = plan_args(&model, "bf16", &["-o", &out_s, "--high", "float16"]);
    args.extend(["--metric", "yb:snr:200"]);
    let o = mixprec(&args);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(
        t.contains("no assignment meets the criterion") && t.contains("Front ("),
        "{t}"
    );
    assert!(!out.exists());
}

/// `--check` judges the chosen point and its neighbours, then safer points until one passes:
/// here the command (`mixprec run` on each point's model, a stand-in for TensorRT) asks more
/// of `yc` than the emulation's criterion, which fp8 on `C` does not give; float16 does.
#[test]
fn plan_check_judges_the_chosen_point_and_its_neighbours_and_chooses_what_it_passes() {
    let tmp = tempfile::tempdir().unwrap();
    let model = planted(tmp.path());
    let (inputs, gold) = fp32_run(tmp.path(), &model);
    let json = tmp.path().join("plan.json");
    let json_s = json.to_string_lossy().into_owned();
    let check = |yc: &'static str| -> Vec<String> {
        vec![
            "--check".into(),
            env!("CARGO_BIN_EXE_mixprec").into(),
            "run".into(),
            "{model}".into(),
            "--load-inputs".into(),
            inputs.clone(),
            "--load-outputs".into(),
            gold.clone(),
            "--atol".into(),
            "1e30".into(),
            "--metric".into(),
            "ya:snr:25".into(),
            "yb:snr:38".into(),
            yc.into(),
        ]
    };
    let run = |yc: &'static str, jobs: &str| {
        let check = check(yc);
        let mut args = plan_args(
            &model,
            "fp8,int8,fp16",
            &["--save-result", &json_s, "-j", jobs],
        );
        args.extend(check.iter().map(String::as_str));
        let o = mixprec(&args);
        let v: Option<serde_json::Value> = std::fs::read(&json)
            .ok()
            .map(|b| serde_json::from_slice(&b).unwrap());
        let _ = std::fs::remove_file(&json);
        (o, v)
    };
    // --golden with the FP32 run's own outputs: the same front as without.
    let fronts = |extra: &[&str]| {
        let mut args = plan_args(&model, "fp8,int8,fp16", &["--save-result", &json_s]);
        args.extend_from_slice(extra);
        let o = mixprec(&args);
        assert!(o.status.success(), "{}", text(&o));
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        std::fs::remove_file(&json).unwrap();
        let passed: Vec<bool> = v["front"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["passed"].as_bool().unwrap())
            .collect();
        (passed, v["chosen"].clone())
    };
    assert_eq!(fronts(&["--golden", &gold]), fronts(&[]));
    // The same criterion as the emulation's: the choice stays, three points judged.
    let (o, v) = run("yc:snr:25", "1");
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let v = v.unwrap();
    let k = v["chosen"].as_u64().unwrap() as usize;
    assert_eq!(v["front"][k]["layers"]["C"], "fp8e4m3", "{t}");
    assert_eq!(v["front"][k]["check"]["passed"], true, "{t}");
    let judged = |v: &serde_json::Value| {
        v["front"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| !p["check"].is_null())
            .count()
    };
    assert!((2..=3).contains(&judged(&v)), "{t}");
    assert!(
        t.contains("stays chosen") && t.contains("check PASSED"),
        "{t}"
    );
    // A stricter command: fp8 on C fails it; the cheapest point it passes has C in float16.
    let (o, v) = run("yc:snr:50", "2");
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let v = v.unwrap();
    let k = v["chosen"].as_u64().unwrap() as usize;
    assert_eq!(v["front"][k]["layers"]["C"], "float16", "{t}");
    assert_eq!(v["front"][k]["check"]["passed"], true, "{t}");
    assert!(
        t.contains("chosen instead") && t.contains("check FAILED"),
        "{t}"
    );
    let cost = |p: &serde_json::Value| p["cost"].as_f64().unwrap();
    for p in v["front"].as_array().unwrap() {
        if p["check"]["passed"] == true {
            assert!(cost(p) >= cost(&v["front"][k]), "{t}");
        }
    }
    // A command that passes nothing: a clear verdict, no result file written.
    let mut args = plan_args(&model, "fp8,int8,fp16", &["--save-result", &json_s]);
    args.extend(["--check", "sh", "-c", "exit 3"]);
    let o = mixprec(&args);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("the --check command passed none"), "{t}");
    assert!(!json.exists());
}

/// `--fusion tensorrt` on the seed's model (MatMul → Add(65504) → Sub, then MatMul_1): all
/// float16 overflows in the Add unless MatMul, Add and Sub run as one kernel, whose sum stays
/// in f32. Without fusion plan keeps that group in float32; under TensorRT's fusion the
/// cheapest point (all float16) passes, and the output says which fusion every point assumed.
#[test]
fn plan_fusion_tensorrt_emulates_every_point_under_tensorrt_fusion() {
    let tmp = tempfile::tempdir().unwrap();
    let model = crate::common::example("needs_constraints.onnx");
    let result = tmp.path().join("plan.json");
    let result_s = result.to_string_lossy().into_owned();
    let inputs = tmp.path().join("in.json").to_string_lossy().into_owned();
    let gold = tmp.path().join("gold.json").to_string_lossy().into_owned();
    let o = mixprec(&[
        "run",
        &model,
        "--val-range",
        "x:[1,2]",
        "--save-inputs",
        &inputs,
        "--save-outputs",
        &gold,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let run = |fusion: &str, extra: &[&str]| {
        let mut args = vec![
            "plan",
            model.as_str(),
            "--formats",
            "fp16",
            "--load-inputs",
            inputs.as_str(),
            "--check-error-stat",
            "median",
            "--atol",
            "1e-2",
            "--rtol",
            "1e-2",
            "--fusion",
            fusion,
            "--save-result",
            result_s.as_str(),
        ];
        args.extend_from_slice(extra);
        let o = mixprec(&args);
        let t = text(&o);
        assert!(o.status.success(), "{t}");
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
        (t, v)
    };
    let chosen_layers = |v: &serde_json::Value| {
        let k = v["chosen"].as_u64().unwrap() as usize;
        v["front"][k]["layers"].clone()
    };
    let (t, v) = run("none", &[]);
    assert!(t.contains("objective latency on h100, fusion none"), "{t}");
    assert!(!t.contains("Fusion (tensorrt)"), "{t}");
    assert_eq!(v["fusion"], "none");
    assert_eq!(v["fusion_regions"], serde_json::json!([]));
    assert_eq!(v["front"][0]["passed"], false);
    assert_eq!(chosen_layers(&v)["Add"], "float32");
    let mixed = tmp.path().join("mixed.onnx").to_string_lossy().into_owned();
    let (t, v) = run("tensorrt", &["-v", "-o", &mixed]);
    assert!(
        t.contains("objective latency on h100, fusion tensorrt"),
        "{t}"
    );
    assert!(
        t.contains("Fusion (tensorrt): 1 region(s) of 3 layer(s)")
            && t.contains("region MatMul..Sub (float16): MatMul, Add, Sub"),
        "{t}"
    );
    assert_eq!(v["fusion"], "tensorrt");
    assert_eq!(v["chosen"], 0);
    assert_eq!(v["front"][0]["passed"], true);
    assert_eq!(v["baselines"][0]["passed"], true);
    let layers = chosen_layers(&v);
    for name in ["MatMul", "Add", "Sub", "MatMul_1"] {
        assert_eq!(layers[name], "float16", "{layers}");
    }
    assert_eq!(
        v["fusion_regions"][0]["nodes"],
        serde_json::json!(["MatMul", "Add", "Sub"])
    );
    // The written model (the same file as without fusion: ONNX cannot state it) passes when
    // run under TensorRT's fusion, as plan predicted, and fails run as ONNX Runtime runs it.
    let check = |fusion: &str| {
        mixprec(&[
            "run",
            &mixed,
            "--load-inputs",
            &inputs,
            "--load-outputs",
            &gold,
            "--check-error-stat",
            "median",
            "--atol",
            "1e-2",
            "--rtol",
            "1e-2",
            "--fusion",
            fusion,
        ])
    };
    let o = check("tensorrt");
    assert!(o.status.success(), "{}", text(&o));
    let o = check("none");
    assert!(!o.status.success(), "{}", text(&o));
}

#[test]
fn plan_fusion_bad_input_is_one_line() {
    let model = crate::common::example("needs_constraints.onnx");
    for (extra, expected) in [
        (vec!["--fusion", "xla"], "--fusion 'xla': valid choices are none, tensorrt"),
        (
            vec!["--fusion", "tensorrt", "--check", "true"],
            "--fusion tensorrt has no effect with --check: the command judges every point on its own engine (leave --fusion out)",
        ),
        (
            vec!["--fusion", "tensorrt", "--cost-of", model.as_str()],
            "--fusion tensorrt has no effect with --cost-of",
        ),
    ] {
        let mut args = vec!["plan", model.as_str(), "--formats", "fp16"];
        args.extend(extra);
        let o = mixprec(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(expected), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}
