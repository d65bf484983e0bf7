//! TensorRT 11 first: the answer's deploy lines name a model that exists after the command
//! ran (the `-o` file, or the `mixprec convert` command printed first writes it, with the same
//! bytes), and `--check`'s `{model}` is each candidate's exported mixed-precision model, whose
//! own types are the candidate's precisions (what `trtexec --stronglyTyped` builds).

use crate::common::{example, mixprec, text};
use mixprec::engine::expected_from_model;
use mixprec::load_model;
use mixprec::precision::Precision;

/// The deploy line that starts with `prefix` (after the `[I]` marker), without the marker.
fn line<'a>(log: &'a str, prefix: &str) -> &'a str {
    log.lines()
        .map(|l| l.trim_start_matches("[I]").trim())
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with '{prefix}' in:\n{log}"))
}

/// Returns the printed convert command.
fn search_and_convert(extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let model = example("needs_constraints.onnx");
    let mut args = vec![
        "debug",
        "precision",
        model.as_str(),
        "--val-range",
        "[-1,1]",
        "--seed",
        "7",
        "-q",
    ];
    args.extend(extra);
    // With -o: the TensorRT 11 lines name the file -o wrote.
    let written = dir.path().join("answer.onnx");
    let mut with_o = args.clone();
    with_o.extend(["-o", written.to_str().unwrap()]);
    let out = mixprec(&with_o);
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    assert!(written.exists(), "{log}");
    let trtexec = line(&log, "trtexec --onnx=");
    assert_eq!(
        trtexec,
        format!("trtexec --onnx={} --stronglyTyped", written.display()),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "polygraphy run {} --trt --strongly-typed",
            written.display()
        )),
        "{log}"
    );
    // The TensorRT 11 lines come first; the weakly typed ones stay, marked as such.
    let t11 = log
        .find("TensorRT 11 (strongly typed")
        .expect("TensorRT 11 header");
    let t10 = log
        .find("TensorRT <= 10 only")
        .expect("TensorRT <= 10 header");
    assert!(t11 < t10, "{log}");
    assert!(log[t10..].contains("--precisionConstraints=obey"), "{log}");
    // Without -o: the first line is the convert command; run it (mixprec as this binary):
    // it writes the very model -o wrote.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mixprec"))
        .args(&args)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    let convert = line(&log, "mixprec convert ");
    assert!(convert.ends_with("-o model_mixed.onnx"), "{log}");
    assert_eq!(
        line(&log, "trtexec --onnx="),
        "trtexec --onnx=model_mixed.onnx --stronglyTyped"
    );
    let cmd = convert.replacen("mixprec", env!("CARGO_BIN_EXE_mixprec"), 1);
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(&cmd)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{cmd}: {}", text(&out));
    assert_eq!(
        std::fs::read(dir.path().join("model_mixed.onnx")).unwrap(),
        std::fs::read(&written).unwrap(),
        "{cmd} wrote another model than -o"
    );
    convert.to_string()
}

#[test]
fn the_printed_convert_command_writes_the_model_o_writes() {
    let convert = search_and_convert(&["--fp16"]);
    assert!(convert.contains("--fp16 --layer-precisions"), "{convert}");
    // int8 calibrated on the search's own inputs (no cache): the command repeats them.
    // (The tolerance keeps the MatMuls in int8; Add and Sub overflow in float16.)
    let convert = search_and_convert(&[
        "--int8",
        "--fp16",
        "--calibration-algo",
        "minmax",
        "--mode",
        "minimal",
        "--atol",
        "1e-2",
        "--rtol",
        "1e-2",
        "--check-error-stat",
        "median",
    ]);
    assert!(
        convert.contains("--layer-precisions Add:float32 Sub:float32")
            && convert.contains("--calibration-algo minmax")
            && convert.contains("--val-range '[-1,1]' --seed 7"),
        "{convert}"
    );
}

/// Every `{model}` handed to `--check` is the candidate's mixed-precision model: the layers
/// the candidate marks are float32 in it, the others float16.
#[test]
fn check_model_placeholder_is_each_candidates_mixed_model() {
    let dir = tempfile::tempdir().unwrap();
    let model = example("needs_constraints.onnx");
    let script = "n=$(ls \"$2\" | wc -l); cp \"$1\" \"$2/c$n.onnx\"; echo \"$3\" > \"$2/c$n.txt\"; test \"$4\" -ge 2";
    let keep = dir.path().join("models");
    std::fs::create_dir(&keep).unwrap();
    let out = mixprec(&[
        "debug",
        "precision",
        &model,
        "--fp16",
        "-q",
        "--check",
        "sh",
        "-c",
        script,
        "check",
        "{model}",
        keep.to_str().unwrap(),
        "marked={layer_precisions}",
        "{marked_count}",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let mut candidates = 0;
    for e in std::fs::read_dir(&keep).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "onnx") {
            continue;
        }
        let marked = std::fs::read_to_string(p.with_extension("txt")).unwrap();
        let m = load_model(&p).unwrap();
        let types = expected_from_model(&m.graph).unwrap();
        for name in ["MatMul", "Add", "Sub", "MatMul_1"] {
            let i = m.graph.nodes.iter().position(|n| n.name == name).unwrap();
            let want = if marked.contains(&format!("{name}:float32")) {
                Precision::Float32
            } else {
                Precision::Float16
            };
            assert_eq!(
                types[i],
                Some(want),
                "{}: {name} (marked: {marked})",
                p.display()
            );
        }
        candidates += 1;
    }
    assert!(candidates >= 3, "{candidates} candidates");
}
