//! `plan` end to end on a planted model whose best assignment is known.

use super::*;
use crate::event::NoProgress;
use crate::onnx::testing::{model_proto, node};
use crate::tensor::Tensor;
use std::sync::atomic::AtomicBool;

const N: usize = 64;

/// Deterministic values in [-1, 1).
fn uniform(seed: u64, n: usize) -> Vec<f32> {
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

/// Three branches, each with one known best format under the criterion (each output's SNR):
/// - `A` (xa @ WA·20000): its sums reach ~1e5, beyond float16's 65504 (inf), and quantize
///   well: int8 or fp8.
/// - `B` (xb @ WB, judged at 38 dB): uniform values that int8's 255 levels keep (~45 dB) and
///   fp8's 3-bit mantissa does not (~30 dB): int8.
/// - `C` (xc · [1000, 1, 1, ...] @ WC, WC's first row 0, judged at 25 dB): one outlier
///   channel sets the int8 scale, so every other value rounds to 0 (the output is lost); fp8
///   keeps them (~30 dB): fp8. Its `Scale` (the Mul) takes float16.
pub(crate) fn planted_model(dir: &std::path::Path) -> PathBuf {
    let weight = |seed, scale: f32, zero_first_row: bool| {
        let mut v: Vec<f32> = uniform(seed, N * N).iter().map(|x| x * scale).collect();
        if zero_first_row {
            v[..N].iter_mut().for_each(|x| *x = 0.0);
        }
        Tensor::from_f32(vec![N, N], v)
    };
    let mut k = vec![1.0f32; N];
    k[0] = 1000.0;
    let proto = model_proto(
        vec![
            node("MatMul", "A", &["xa", "wa"], &["ya"]),
            node("MatMul", "B", &["xb", "wb"], &["yb"]),
            node("Mul", "Scale", &["xc", "k"], &["xk"]),
            node("MatMul", "C", &["xk", "wc"], &["yc"]),
        ],
        vec![
            ("wa", weight(1, 20000.0, false)),
            ("wb", weight(2, 1.0, false)),
            ("wc", weight(3, 1.0, true)),
            ("k", Tensor::from_f32(vec![N], k)),
        ],
        &[
            ("xa", &[1, N as i64]),
            ("xb", &[1, N as i64]),
            ("xc", &[1, N as i64]),
        ],
        &[
            ("ya", &[1, N as i64]),
            ("yb", &[1, N as i64]),
            ("yc", &[1, N as i64]),
        ],
        17,
    );
    let path = dir.join("planted_formats.onnx");
    std::fs::write(&path, prost::Message::encode_to_vec(&proto)).unwrap();
    path
}

pub(crate) fn planted_feeds() -> Vec<crate::tensor::Feeds> {
    (0..2u64)
        .map(|set| {
            ["xa", "xb", "xc"]
                .iter()
                .enumerate()
                .map(|(j, name)| {
                    let t = Tensor::from_f32(vec![1, N], uniform(100 + 10 * set + j as u64, N));
                    (name.to_string(), t)
                })
                .collect()
        })
        .collect()
}

pub(crate) fn config(model: PathBuf, formats: &str) -> Config {
    Config {
        model,
        inputs: Inputs::Feeds(planted_feeds()),
        formats: vec![formats.into()],
        compare: CompareOptions {
            atol: vec!["1e30".into()],
            metric: vec!["ya:snr:25".into(), "yb:snr:38".into(), "yc:snr:25".into()],
            ..Default::default()
        },
        calib: CalibOptions {
            calibration_algo: Some("minmax".into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

pub(crate) fn run_plan(c: Config) -> Outcome {
    run(
        c.validate().unwrap(),
        &mut |_| {},
        &NoProgress,
        &AtomicBool::new(false),
    )
    .unwrap()
}

pub(crate) fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mixprec-plan-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn chosen(o: &Outcome) -> BTreeMap<String, Precision> {
    let plan = o.chosen_plan().expect("a point passed");
    o.model
        .graph
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.clone(), plan.layers[i]))
        .collect()
}

#[test]
fn the_planted_model_gets_its_known_best_assignment() {
    let dir = tempdir("best");
    let o = run_plan(config(planted_model(&dir), "fp8,int8,fp16"));
    let c = chosen(&o);
    assert!(c["A"].is_scaled(), "A overflows float16: {c:?}");
    assert_eq!(c["B"], Precision::Int8, "fp8 loses B: {c:?}");
    assert_eq!(c["C"], Precision::Fp8E4M3, "int8 loses C: {c:?}");
    assert_eq!(c["Scale"], Precision::Float16, "{c:?}");
    assert_eq!(o.front.verified.as_ref().map(|e| e.passed), Some(true));
    // Each uniform baseline fails: all fp16 (A overflows), all int8 (C), all fp8 (B).
    assert_eq!(o.baselines.len(), 3);
    assert!(o.baselines.iter().all(|b| !b.passed), "{:?}", o.baselines);
    // The walk stopped once no later point could be chosen; walked on to the safest point
    // (everything float32), it chooses the same assignment, which costs less.
    assert!(o
        .front
        .log
        .iter()
        .any(|l| l.starts_with("The walk stopped")));
    let full = run_plan(Config {
        full_front: true,
        ..config(planted_model(&dir), "fp8,int8,fp16")
    });
    assert_eq!(chosen(&full), c);
    assert!(full.front.evaluations > o.front.evaluations);
    let last = full.front.points.last().unwrap();
    assert!(last.formats.iter().all(|&f| f == Precision::Float32));
    let k = o.front.chosen.unwrap();
    assert!(o.cost_of(&o.front.points[k].cost) < o.cost_of(&last.cost));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_exported_model_runs_as_the_emulation_ran_the_plan() {
    let dir = tempdir("export");
    let o = run_plan(config(planted_model(&dir), "fp8,int8,fp16"));
    let exported = o.export().unwrap().expect("a point passed");
    let path = dir.join("mixed.onnx");
    crate::export::write_model(&path, &exported.model).unwrap();
    let mixed = load_model(&path).unwrap();
    let feeds = planted_feeds();
    let run_mixed = Interpreter::new(&mixed.graph).unwrap();
    let interp = Interpreter::new(&o.model.graph).unwrap();
    let prepared = PrecisionOptions::default()
        .prepare(
            &o.model.graph,
            o.chosen_plan().unwrap(),
            o.amax.as_ref(),
            &crate::exec::feed_shapes(&feeds[0]),
        )
        .unwrap();
    let opts = crate::exec::RunOptions::default();
    for f in &feeds {
        let emulated = interp.run_plan(f, &opts, &prepared).unwrap().outputs;
        let native = run_mixed.run_with(f, &opts).unwrap().outputs;
        for ((name, e), (_, n)) in emulated.iter().zip(&native) {
            let (e, n) = (e.to_f32_vec().unwrap(), n.to_f32_vec().unwrap());
            let same = e.iter().zip(&n).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{name}: the exported model differs from the emulated plan"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_result_file_holds_the_front_the_chosen_point_and_the_baselines() {
    let dir = tempdir("json");
    let o = run_plan(config(planted_model(&dir), "fp8,int8,fp16"));
    let v: serde_json::Value = serde_json::from_slice(&o.result_json().unwrap()).unwrap();
    let front = v["front"].as_array().unwrap();
    assert_eq!(front.len(), o.front.points.len());
    let k = v["chosen"].as_u64().unwrap() as usize;
    assert_eq!(front[k]["passed"], true);
    assert_eq!(front[k]["layers"]["B"], "int8");
    assert!(front
        .iter()
        .all(|p| p["cost"].is_number() && p["passed"].is_boolean()));
    let baselines = v["baselines"].as_array().unwrap();
    let names: Vec<&str> = baselines
        .iter()
        .map(|b| b["format"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["fp8e4m3", "int8", "float16"]);
    // Each baseline is a point of the front too.
    for b in baselines {
        let point = &front[b["point"].as_u64().unwrap() as usize];
        assert_eq!(point["step"]["kind"], "uniform");
        assert_eq!(point["step"]["format"], b["format"]);
        assert_eq!(point["passed"], b["passed"]);
    }
    assert_eq!(v["target"]["name"], "h100");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_options_are_one_line_errors_naming_the_option() {
    let err = |c: Config| c.validate().err().map(|e| e.to_string()).unwrap();
    let base = || config(PathBuf::from("m.onnx"), "fp8,int8,fp16");
    let e = err(Config {
        formats: vec!["fp8,int4".into()],
        ..base()
    });
    assert!(e.contains("--formats: unknown format 'int4'"), "{e}");
    let e = err(Config {
        target: "a100".into(),
        ..base()
    });
    assert!(e.contains("unknown target"), "{e}");
    let e = err(Config {
        objective: "speed".into(),
        ..base()
    });
    assert!(e.contains("--objective 'speed'"), "{e}");
    let e = err(Config {
        high: "int8".into(),
        ..base()
    });
    assert!(e.contains("--high int8"), "{e}");
    let dir = tempdir("cost");
    let file = dir.join("gpu.json");
    std::fs::write(&file, r#"{"name": "x", "source": "s", "peak_tflops": {}}"#).unwrap();
    let e = err(Config {
        target: file.display().to_string(),
        ..base()
    });
    assert!(e.contains("gpu.json") && e.contains("missing field"), "{e}");
    assert!(!e.contains('\n'));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_criterion_no_assignment_meets_is_a_verdict_with_the_front() {
    let dir = tempdir("none");
    let mut c = config(planted_model(&dir), "bf16");
    // Nothing in 16 bits reaches 200 dB: no assignment of bfloat16 and float16 passes.
    c.high = "float16".into();
    c.compare.metric = vec!["yb:snr:200".into()];
    let o = run_plan(c);
    assert_eq!(o.front.chosen, None);
    assert!(!o.front.points.is_empty());
    assert!(o.export().unwrap().is_none());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_report_plots_the_front_and_lists_every_group() {
    let dir = tempdir("html");
    let o = run_plan(config(planted_model(&dir), "fp8,int8,fp16"));
    let html = o.html();
    assert!(
        html.contains("<svg") && html.contains(">chosen<"),
        "no plot"
    );
    // A circle per walked point and the chosen point's ring; the baselines are squares.
    let walked = o.front.points.len() - o.baselines.len();
    assert_eq!(html.matches("<circle").count(), walked + 1);
    assert_eq!(html.matches("<rect").count(), o.baselines.len());
    assert!(html.contains("criterion (largest passing error)"));
    for name in ["A", "B", "Scale", "C"] {
        assert!(html.contains(&format!("<td>{name}</td>")), "{name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `A` (x @ W, sums ~8e4: beyond float16's 65504) then `R` (A's output plus the input `r`,
/// ~-6e4: back to ~2e4). `R`'s second operand is no weight, so A and R are two decision
/// groups; TensorRT fuses them (a GEMM with its residual Add epilogue) when both are float16.
fn residual_model(dir: &std::path::Path) -> PathBuf {
    let proto = model_proto(
        vec![
            node("MatMul", "A", &["x", "w"], &["y"]),
            node("Add", "R", &["y", "r"], &["z"]),
        ],
        vec![("w", Tensor::from_f32(vec![N, N], vec![820.0; N * N]))],
        &[("x", &[1, N as i64]), ("r", &[1, N as i64])],
        &[("z", &[1, N as i64])],
        17,
    );
    let path = dir.join("residual.onnx");
    std::fs::write(&path, prost::Message::encode_to_vec(&proto)).unwrap();
    path
}

fn residual_config(model: PathBuf, fusion: &str) -> Config {
    let feeds = (0..2u64)
        .map(|set| {
            let x: Vec<f32> = uniform(200 + set, N)
                .iter()
                .map(|v| 1.5 + v / 2.0)
                .collect();
            let r: Vec<f32> = uniform(300 + set, N)
                .iter()
                .map(|v| -60000.0 + 100.0 * v)
                .collect();
            [
                ("x".to_string(), Tensor::from_f32(vec![1, N], x)),
                ("r".to_string(), Tensor::from_f32(vec![1, N], r)),
            ]
            .into_iter()
            .collect()
        })
        .collect();
    Config {
        model,
        inputs: Inputs::Feeds(feeds),
        formats: vec!["fp16".into()],
        compare: CompareOptions {
            atol: vec!["1e-2".into()],
            rtol: vec!["1e-2".into()],
            check_error_stat: vec!["median".into()],
            ..Default::default()
        },
        fusion: fusion.into(),
        ..Default::default()
    }
}

#[test]
fn under_tensorrt_fusion_a_fused_epilogue_keeps_f32_and_each_point_gets_its_own_regions() {
    let dir = tempdir("fusion");
    let model = residual_model(&dir);
    // No fusion: A's float16 output overflows whatever R does; only all float32 passes.
    let o = run_plan(residual_config(model.clone(), "none"));
    assert_eq!(o.fusion, FusionModel::None);
    assert!(!o.front.points[0].passed, "{:?}", o.front.points[0]);
    let c = chosen(&o);
    assert_eq!((c["A"], c["R"]), (Precision::Float32, Precision::Float32));
    assert!(o.chosen_regions.is_empty());
    assert!(o.chosen_plan().unwrap().fusion.is_none());
    // TensorRT: all float16 is one kernel whose sum stays in f32; only z is rounded.
    let o = run_plan(residual_config(model, "tensorrt"));
    assert_eq!(o.fusion, FusionModel::TensorRt);
    let p = &o.front.points[0];
    assert!(p.passed && p.error.is_finite(), "{p:?}");
    assert_eq!(o.front.chosen, Some(0));
    let c = chosen(&o);
    assert_eq!((c["A"], c["R"]), (Precision::Float16, Precision::Float16));
    assert_eq!(o.chosen_plan().unwrap().fusion, FusionModel::TensorRt);
    assert_eq!(o.front.verified.as_ref().map(|e| e.passed), Some(true));
    // Each group in float16 alone fails: the precision boundary splits the region, so every
    // point's regions are derived from its own formats, not once for the model.
    for s in o.front.sensitivity.iter().flatten() {
        assert!(!s.passed, "{s:?}");
    }
    let names = |r: &ResolvedRegion| -> Vec<&str> {
        r.nodes
            .iter()
            .map(|&i| o.model.graph.nodes[i].name.as_str())
            .collect()
    };
    assert_eq!(o.chosen_regions.len(), 1);
    assert_eq!(names(&o.chosen_regions[0]), ["A", "R"]);
    assert!(o.baselines[0].passed, "{:?}", o.baselines[0]);
    let v: serde_json::Value = serde_json::from_slice(&o.result_json().unwrap()).unwrap();
    assert_eq!(v["fusion"], "tensorrt");
    assert_eq!(
        v["fusion_regions"][0]["nodes"],
        serde_json::json!(["A", "R"])
    );
    assert!(o.html().contains("fusion tensorrt"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn fusion_options_are_checked_before_any_model_is_read() {
    let err = |c: Config| c.validate().err().map(|e| e.to_string()).unwrap();
    let base = || residual_config(PathBuf::from("m.onnx"), "tensorrt");
    let e = err(Config {
        fusion: "xla".into(),
        ..base()
    });
    assert!(
        e.contains("--fusion 'xla'") && e.contains("tensorrt"),
        "{e}"
    );
    let e = err(Config {
        check: Some(CheckOptions {
            command: vec!["true".into()],
            ..Default::default()
        }),
        ..base()
    });
    assert_eq!(
        e,
        "--fusion tensorrt has no effect with --check: the command judges every point on its own engine (leave --fusion out)"
    );
    assert!(Config {
        fusion: "none".into(),
        check: Some(CheckOptions {
            command: vec!["true".into()],
            ..Default::default()
        }),
        ..base()
    }
    .validate()
    .is_ok());
}
