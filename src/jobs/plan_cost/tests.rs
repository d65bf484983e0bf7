//! Pricing written models: `plan`'s own exports must cost what `plan` modeled for them.

use super::*;
use crate::event::NoProgress;
use crate::jobs::options::CompareOptions;
use crate::jobs::plan::tests::{planted_feeds, planted_model};
use crate::onnx::testing::{model_proto, node};
use crate::tensor::Tensor;
use std::path::Path;
use std::sync::atomic::AtomicBool;

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mixprec-plan-cost-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn plan_of(model: &Path) -> crate::jobs::plan::Outcome {
    let config = crate::jobs::plan::Config {
        model: model.to_path_buf(),
        inputs: Inputs::Feeds(planted_feeds()),
        formats: vec!["fp8,int8,fp16".into()],
        compare: CompareOptions {
            atol: vec!["1e30".into()],
            metric: vec!["ya:snr:25".into(), "yb:snr:38".into(), "yc:snr:25".into()],
            ..Default::default()
        },
        calib: crate::jobs::options::CalibOptions {
            calibration_algo: Some("minmax".into()),
            ..Default::default()
        },
        // On to the safest point, which the float model itself is.
        full_front: true,
        ..Default::default()
    };
    crate::jobs::plan::run(
        config.validate().unwrap(),
        &mut |_| {},
        &NoProgress,
        &AtomicBool::new(false),
    )
    .unwrap()
}

fn write_export(o: &crate::jobs::plan::Outcome, plan: &PrecisionPlan, path: &Path) {
    let e = crate::export::export(
        &o.model,
        plan,
        o.amax.as_ref(),
        &crate::export::ExportOptions::default(),
    )
    .unwrap();
    crate::export::write_model(path, &e.model).unwrap();
}

fn price(model: &Path, mixed: &Path) -> Result<ModelCost> {
    run(
        &Config {
            model: model.to_path_buf(),
            mixed: mixed.to_path_buf(),
            inputs: Inputs::Feeds(planted_feeds()),
            ..Default::default()
        },
        &mut |_| {},
    )
}

#[test]
fn plans_exports_cost_what_plan_modeled_for_them() {
    let dir = tempdir("same");
    let model = planted_model(&dir);
    let o = plan_of(&model);
    for b in &o.baselines {
        let path = dir.join(format!("all_{}.onnx", b.format.name()));
        write_export(&o, &b.plan, &path);
        let c = price(&model, &path).unwrap();
        assert_eq!(c.costs, b.cost, "all {}: {c:?}", b.format.name());
        assert_eq!(c.cost, b.cost.latency_us);
        // Every layer that can take the format reads as it (the Mul has no int8/fp8 kernel).
        let want = if b.format.is_scaled() { 3 } else { 4 };
        assert_eq!(c.formats.get(b.format.name()), Some(&want), "{c:?}");
    }
    let k = o.front.chosen.expect("a point passed");
    let path = dir.join("chosen.onnx");
    write_export(&o, o.chosen_plan().unwrap(), &path);
    let c = price(&model, &path).unwrap();
    assert_eq!(c.costs, o.front.points[k].cost);
    assert_eq!(c.layers["B"], Precision::Int8);
    assert_eq!(c.layers["C"], Precision::Fp8E4M3);
    // The float model itself is the safest point: every layer float32.
    let c = price(&model, &model).unwrap();
    assert_eq!(c.formats, BTreeMap::from([("float32", 4)]));
    assert_eq!(c.costs, o.front.points.last().unwrap().cost);
    // Other objectives and targets price the same layers.
    let bytes = run(
        &Config {
            model: model.clone(),
            mixed: path.clone(),
            inputs: Inputs::Feeds(planted_feeds()),
            objective: "bytes".into(),
            target: "b200".into(),
        },
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(bytes.cost, bytes.costs.bytes);
    assert_eq!(bytes.costs.bytes, o.front.points[k].cost.bytes);
    assert_eq!(bytes.target, "b200");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The planted model's graph with other node names or fewer nodes.
fn variant(dir: &Path, file: &str, names: [&str; 4], keep: usize) -> PathBuf {
    let w = |v: f32| Tensor::from_f32(vec![64, 64], vec![v; 64 * 64]);
    let nodes = vec![
        node("MatMul", names[0], &["xa", "wa"], &["ya"]),
        node("MatMul", names[1], &["xb", "wb"], &["yb"]),
        node("Mul", names[2], &["xc", "k"], &["xk"]),
        node("MatMul", names[3], &["xk", "wc"], &["yc"]),
    ];
    let outputs = [("ya", [1, 64]), ("yb", [1, 64]), ("yc", [1, 64])];
    let proto = model_proto(
        nodes.into_iter().take(keep).collect(),
        vec![
            ("wa", w(0.1)),
            ("wb", w(0.2)),
            ("wc", w(0.3)),
            ("k", Tensor::from_f32(vec![64], vec![1.0; 64])),
        ],
        &[("xa", &[1, 64]), ("xb", &[1, 64]), ("xc", &[1, 64])],
        &outputs
            .iter()
            .take(if keep == 4 { 3 } else { 2 })
            .map(|(n, s)| (*n, &s[..]))
            .collect::<Vec<_>>(),
        17,
    );
    let path = dir.join(file);
    std::fs::write(&path, prost::Message::encode_to_vec(&proto)).unwrap();
    path
}

#[test]
fn unmatched_nodes_and_missing_files_are_errors_naming_them() {
    let dir = tempdir("bad");
    let model = planted_model(&dir);
    // A layer of the float model the mixed one lacks.
    let renamed = variant(&dir, "renamed.onnx", ["A", "B", "Scale", "C2"], 4);
    let e = price(&model, &renamed).unwrap_err().to_string();
    assert!(
        e.contains("renamed.onnx") && e.contains("no node named 'C'") && e.contains("MatMul"),
        "{e}"
    );
    // A compute layer of the mixed model the float one lacks.
    let fewer = variant(&dir, "fewer.onnx", ["A", "B", "Scale", "C"], 2);
    let e = price(&fewer, &model).unwrap_err().to_string();
    assert!(
        e.contains("planted_formats.onnx") && e.contains("node 'Scale' (Mul) is not a layer of"),
        "{e}"
    );
    // The same name on another op.
    let swapped = variant(&dir, "swapped.onnx", ["A", "B", "C", "Scale"], 4);
    let e = price(&model, &swapped).unwrap_err().to_string();
    assert!(e.contains("node 'Scale' is a MatMul, a Mul in"), "{e}");
    // Missing files, either one.
    let gone = dir.join("gone.onnx");
    let e = price(&model, &gone).unwrap_err().to_string();
    assert!(e.contains("gone.onnx"), "{e}");
    let e = price(&gone, &model).unwrap_err().to_string();
    assert!(e.contains("gone.onnx"), "{e}");
    // Bad objective or target: one line naming the option.
    let e = run(
        &Config {
            model: model.clone(),
            mixed: model.clone(),
            objective: "speed".into(),
            ..Default::default()
        },
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("'speed'"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
