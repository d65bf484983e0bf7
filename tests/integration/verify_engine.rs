//! `mixprec verify-engine`: layer-information files written from TensorRT's documented format
//! (tests/fixtures/engine/, docs/verify-engine.md) are mapped back to ONNX nodes, and every
//! node whose engine precision differs from the plan or the exported model is listed.

use crate::common::{example, mixprec, python, repo_root, text};
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures/engine").join(name)
}

fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = mixprec(args);
    (out.status.code(), text(&out))
}

/// TensorRT <= 10 built `--fp16 --layerPrecisions=Add:fp32,Sub:fp32 --precisionConstraints=obey`
/// and fused Add and Sub into one FP16 pointwise layer anyway (as in NVIDIA/TensorRT#4505,
/// #3224, #2407): both are listed, the exit status is 1, reformat layers are noted and the
/// unnamed shuffle layer is a warning.
#[test]
fn a_disobeying_engine_is_reported_from_json_and_polygraphy_text() {
    let model = example("needs_constraints.onnx");
    for file in [
        "needs_constraints.layers.json",
        "needs_constraints.polygraphy.txt",
    ] {
        let info = fixture(file);
        let (code, log) = run(&[
            "verify-engine",
            &model,
            "--layer-info",
            info.to_str().unwrap(),
            "--fp16",
            "--layer-precisions",
            "Add:float32",
            "Sub:float32",
        ]);
        assert_eq!(code, Some(1), "{file}: {log}");
        assert!(
            log.contains("Add (Add): expected float32, engine Half in 'PWN(Add, Sub)'"),
            "{file}: {log}"
        );
        assert!(
            log.contains("Sub (Sub): expected float32, engine Half in 'PWN(Add, Sub)'"),
            "{file}: {log}"
        );
        assert!(!log.contains("MatMul (MatMul): expected"), "{file}: {log}");
        assert!(
            log.contains("6 engine layer(s): 3 mapped to ONNX nodes, 2 reformat, 0 ignored (constants, no-ops), 1 unmapped"),
            "{file}: {log}"
        );
        assert!(
            log.contains(
                "reformat layer: Reformatting CopyNode for Input Tensor 0 to MatMul (for MatMul)"
            ),
            "{file}: {log}"
        );
        assert!(
            log.contains("warning: ")
                && log.contains("'(Unnamed Layer* 9) [Shuffle]' maps to no ONNX node"),
            "{file}: {log}"
        );
        assert!(log.contains("2 disobey"), "{file}: {log}");
    }
}

fn write(dir: &std::path::Path, name: &str, v: &serde_json::Value) -> String {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_vec_pretty(v).unwrap()).unwrap();
    p.to_string_lossy().into_owned()
}

fn tensor(name: &str, fmt: &str) -> serde_json::Value {
    serde_json::json!({"Name": name, "Location": "Device", "Dimensions": [1, 1, 256, 256], "Format/Datatype": fmt})
}

/// The same engine with Add and Sub in FP32 obeys (exit 0); a plan file gives the same
/// verdicts as the options; the JSON report lists every node.
#[test]
fn an_obeying_engine_passes_and_plans_load_from_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("needs_constraints.layers.json")).unwrap())
            .unwrap();
    v["Layers"][2]["Inputs"][0] = tensor("matmul_out", "Row major linear FP32");
    v["Layers"][2]["Outputs"][0] = tensor("sub_out", "Row major linear FP32");
    let info = write(dir.path(), "ok.json", &v);
    let model = example("needs_constraints.onnx");
    let report = dir.path().join("report.json");
    let (code, log) = run(&[
        "verify-engine",
        &model,
        "--layer-info",
        &info,
        "--fp16",
        "--layer-precisions",
        "Add:float32",
        "Sub:float32",
        "--json",
        report.to_str().unwrap(),
        "-v",
    ]);
    assert_eq!(code, Some(0), "{log}");
    assert!(
        log.contains("4 node(s) compared: 4 obey, 0 disobey"),
        "{log}"
    );
    assert!(
        log.contains("Every compared node runs in the precision asked for"),
        "{log}"
    );
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["nodes"].as_array().unwrap().len(), 4);
    assert_eq!(r["nodes"][1]["verdict"], "obeys");
    // A plan file asking for float16 everywhere: Add and Sub now disobey.
    let plan = write(
        dir.path(),
        "plan.json",
        &serde_json::json!({"layers": ["float16", "float16", "float16", "float16"]}),
    );
    let (code, log) = run(&[
        "verify-engine",
        &model,
        "--layer-info",
        &info,
        "--plan",
        &plan,
    ]);
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("Add (Add): expected float16, engine Float"),
        "{log}"
    );
}

/// TensorRT 11 / strongly typed: the exported model's own types are the expectation. The
/// Cast fused in front of Add (its input is the layer's input) does not hide Add's type, and
/// a Cast fused behind MatMul (its output is the layer's) does not make MatMul float32.
#[test]
fn the_exported_models_types_are_the_expectation_when_no_plan_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let mixed = dir.path().join("mixed.onnx");
    let (code, log) = run(&[
        "convert",
        &example("needs_constraints.onnx"),
        "--fp16",
        "--layer-precisions",
        "Add:float32",
        "Sub:float32",
        "-o",
        mixed.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{log}");
    let (h, f) = ("Half", "Float");
    let layer = |name: &str, i: (&str, &str), o: (&str, &str), meta: Option<&str>| {
        let mut l = serde_json::json!({
            "Name": name, "LayerType": "kgen",
            "Inputs": [tensor(i.0, i.1)], "Outputs": [tensor(o.0, o.1)],
        });
        if let Some(m) = meta {
            l["Metadata"] = m.into();
        }
        l
    };
    let engine = |sub_type: &str| {
        serde_json::json!({"Layers": [
            layer("x_Cast_fp16", ("x", f), ("x_fp16", h), None),
            layer("MatMul + matmul_out_Cast_fp32", ("x_fp16", h), ("matmul_out_fp32", f), None),
            // TensorRT 10 Myelin kernel names: the Metadata lists the nodes.
            layer("__myl_AddSub_myl0_3", ("matmul_out_fp32", f), ("sub_out_fp16", sub_type),
                  Some("[ONNX Layer: Add]\u{1e}[ONNX Layer: Sub]\u{1f}[ONNX Layer: sub_out_Cast_fp16]")),
            layer("MatMul_1", ("sub_out_fp16", h), ("output_fp16", h), None),
            layer("output_Cast_fp32", ("output_fp16", h), ("output", f), None),
        ], "Bindings": ["x", "output"]})
    };
    let ok = write(dir.path(), "ok.json", &engine(h));
    let (code, log) = run(&[
        "verify-engine",
        mixed.to_str().unwrap(),
        "--layer-info",
        &ok,
    ]);
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("the model's own types"), "{log}");
    assert!(log.contains("4 node(s) compared: 4 obey"), "{log}");
    // The pointwise kernel computing Add and Sub in Half with Half input: disobeys.
    let mut bad = engine(h);
    bad["Layers"][2]["Inputs"][0] = tensor("matmul_out_fp32", h);
    bad["Layers"][2]["Metadata"] = "[ONNX Layer: Add]\u{1e}[ONNX Layer: Sub]".into();
    let bad = write(dir.path(), "bad.json", &bad);
    let (code, log) = run(&[
        "verify-engine",
        mixed.to_str().unwrap(),
        "--layer-info",
        &bad,
    ]);
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("Add (Add): expected float32, engine Half"),
        "{log}"
    );
}

/// Myelin `{ForeignNode[first...last]}` ranges cover every node between the two; their types
/// are the region's boundary, so nodes only inside a range are not judged (exit 2: nothing
/// compared). Names from an unknown TensorRT version: a warning per layer and a summary.
#[test]
fn myelin_ranges_unknown_names_and_bad_files() {
    let dir = tempfile::tempdir().unwrap();
    let model = example("needs_constraints.onnx");
    let myelin = write(
        dir.path(),
        "myelin.json",
        &serde_json::json!({"Layers": [{
            "Name": "{ForeignNode[MatMul...MatMul_1]}", "LayerType": "Myelin",
            "Inputs": [tensor("x", "Row major linear FP32")],
            "Outputs": [tensor("output", "Row major linear FP32")]}],
            "Bindings": ["x", "output"]}),
    );
    let (code, log) = run(&["verify-engine", &model, "--layer-info", &myelin, "--fp16"]);
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("4 only inside Myelin regions"), "{log}");
    assert!(log.contains("No node could be compared"), "{log}");
    let unknown = write(
        dir.path(),
        "unknown.json",
        &serde_json::json!({"Layers": [
            {"Name": "kernel_0", "LayerType": "Future", "Inputs": [], "Outputs": [tensor("a", "Half")]},
            {"Name": "kernel_1", "LayerType": "Future", "Inputs": [], "Outputs": [tensor("b", "Half")]}
        ]}),
    );
    let (code, log) = run(&["verify-engine", &model, "--layer-info", &unknown, "--fp16"]);
    assert_eq!(code, Some(2), "{log}");
    assert!(
        log.contains("engine layer 0 'kernel_0' maps to no ONNX node"),
        "{log}"
    );
    assert!(
        log.contains("engine layer 1 'kernel_1' maps to no ONNX node"),
        "{log}"
    );
    assert!(log.contains("2 engine layer(s): 0 mapped to ONNX nodes, 0 reformat, 0 ignored (constants, no-ops), 2 unmapped"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    // Names only (no --profilingVerbosity=detailed): exit 2 with the advice.
    let names = write(
        dir.path(),
        "names.json",
        &serde_json::json!({"Layers": ["MatMul", "PWN(Add, Sub)", "MatMul_1"], "Bindings": []}),
    );
    let (code, log) = run(&["verify-engine", &model, "--layer-info", &names, "--fp16"]);
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("--profilingVerbosity=detailed"), "{log}");
    // Unreadable JSON: one line naming the file.
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, "{\"Layers\": [ {\"Name\": ").unwrap();
    let out = mixprec(&[
        "verify-engine",
        &model,
        "--layer-info",
        broken.to_str().unwrap(),
        "--fp16",
    ]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!(
            "{}: not valid layer-information JSON",
            broken.display()
        )),
        "{err}"
    );
}

/// The committed Polygraphy text is what Polygraphy's own formatter prints for the JSON
/// fixture (scripts/polygraphy_layer_text.py uses Polygraphy 0.53's `str_from_graph_data`).
#[test]
fn the_polygraphy_fixture_is_polygraphys_own_text() {
    let out = std::process::Command::new(python())
        .arg(repo_root().join("scripts/polygraphy_layer_text.py"))
        .arg(fixture("needs_constraints.layers.json"))
        .output()
        .expect("run scripts/polygraphy_layer_text.py");
    assert!(out.status.success(), "{}", text(&out));
    let committed = std::fs::read_to_string(fixture("needs_constraints.polygraphy.txt")).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), committed);
}

/// TensorRT 11's layout (docs/verify-engine.md cites NVIDIA's migration guide): `"I/O
/// Tensors"` objects instead of `"Bindings"` names, and each layer tensor's type in its own
/// key beside `Format`. The strongly typed engine of the exported model obeys; the same file
/// rewritten in TensorRT 10's layout gives the same verdicts; I/O tensors the model does not
/// have, or of another type, are warnings, and a Half Add/Sub kernel disobeys.
#[test]
fn tensorrt_11_io_tensors_layout_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let mixed = dir.path().join("mixed.onnx");
    let (code, log) = run(&[
        "convert",
        &example("needs_constraints.onnx"),
        "--fp16",
        "--layer-precisions",
        "Add:float32",
        "Sub:float32",
        "-o",
        mixed.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{log}");
    let mixed = mixed.to_str().unwrap();
    let t11 = fixture("needs_constraints_mixed.trt11.layers.json");
    let report = dir.path().join("report.json");
    let (code, log) = run(&[
        "verify-engine",
        mixed,
        "--layer-info",
        t11.to_str().unwrap(),
        "--json",
        report.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{log}");
    assert!(
        log.contains("4 node(s) compared: 4 obey, 0 disobey"),
        "{log}"
    );
    assert!(
        log.contains("engine I/O tensors: x (Input, Float), output (Output, Float)"),
        "{log}"
    );
    assert!(!log.contains("warning:"), "{log}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(
        r["io_tensors"][0],
        serde_json::json!({"name": "x", "mode": "Input", "engine": "Float", "model": "float32"})
    );

    // The same engine in TensorRT 10's layout: `Bindings` names, `Format/Datatype` strings.
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&t11).unwrap()).unwrap();
    let mut t10 = v.clone();
    let names: Vec<_> = t10["I/O Tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["Name"].clone())
        .collect();
    let obj = t10.as_object_mut().unwrap();
    obj.remove("I/O Tensors");
    obj.insert("Bindings".into(), names.into());
    for l in obj["Layers"].as_array_mut().unwrap() {
        for side in ["Inputs", "Outputs"] {
            for t in l[side].as_array_mut().unwrap() {
                let t = t.as_object_mut().unwrap();
                let dt = t.remove("Datatype").unwrap();
                let fmt = t.remove("Format").unwrap();
                let fmt = fmt.as_str().unwrap().replace(" (kLINEAR)", "");
                assert!(fmt.contains(if dt == "Half" { "FP16" } else { "FP32" }));
                t.insert("Format/Datatype".into(), fmt.into());
            }
        }
    }
    let t10 = write(dir.path(), "t10.json", &t10);
    let (code, log10) = run(&["verify-engine", mixed, "--layer-info", &t10]);
    assert_eq!(code, Some(0), "{log10}");
    assert!(
        log10.contains("4 node(s) compared: 4 obey, 0 disobey"),
        "{log10}"
    );
    assert!(log10.contains("engine I/O tensors: x, output"), "{log10}");

    // Another type at the output, a tensor the model lacks, and Add/Sub computed in Half.
    v["I/O Tensors"][1]["DataType"] = "Half".into();
    let mut extra = v["I/O Tensors"][1].clone();
    extra["Name"] = "logits".into();
    v["I/O Tensors"].as_array_mut().unwrap().push(extra);
    v["Layers"][2]["Inputs"][0]["Datatype"] = "Half".into();
    let bad = write(dir.path(), "bad.json", &v);
    let (code, log) = run(&["verify-engine", mixed, "--layer-info", &bad]);
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("Add (Add): expected float32, engine Half"),
        "{log}"
    );
    assert!(
        log.contains(
            "engine I/O tensor 'output' (Output) is Half in the engine, float32 in the model"
        ),
        "{log}"
    );
    assert!(
        log.contains("engine I/O tensor 'logits' (Output) is not an input or output of the model"),
        "{log}"
    );
}
