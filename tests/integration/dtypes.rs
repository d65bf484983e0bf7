//! The 8- and 4-bit element types (src/lowbit.rs) against the ONNX reference:
//! scripts/gen_lowbit.py writes what ml_dtypes (the element types of onnx.reference) makes of
//! every float16 value, the rounding midpoints and random f32s, and Q/DQ models (blocked int4,
//! uint4 and float4e2m1, per-axis float8 with saturate=0) with outputs computed by
//! onnx.reference.ReferenceEvaluator (and whether ONNX Runtime agrees, where it runs them).

use crate::common::{python, repo_root};
use mixprec::ops::cast::cast_tensor_saturate;
use mixprec::ops::{OpCtx, Registry};
use mixprec::{load_model, DType, Interpreter, Node, Tensor, TensorData};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn data_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = repo_root().join("target/test-lowbit");
        let status = Command::new(python())
            .arg(repo_root().join("scripts/gen_lowbit.py"))
            .arg("--out")
            .arg(&dir)
            .stderr(std::process::Stdio::null()) // NumPy's "invalid value in cast" warnings
            .status()
            .expect("run scripts/gen_lowbit.py");
        assert!(status.success(), "scripts/gen_lowbit.py failed");
        dir
    })
    .clone()
}

fn read_f32(p: &Path) -> Vec<f32> {
    std::fs::read(p)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The stored code of every element (float8/float4 bit patterns, int4/uint4 low nibbles).
fn codes(t: &Tensor) -> Vec<u8> {
    match t.data() {
        TensorData::F8E4M3FN(v) => v.iter().map(|x| x.to_bits()).collect(),
        TensorData::F8E4M3FNUZ(v) => v.iter().map(|x| x.to_bits()).collect(),
        TensorData::F8E5M2(v) => v.iter().map(|x| x.to_bits()).collect(),
        TensorData::F8E5M2FNUZ(v) => v.iter().map(|x| x.to_bits()).collect(),
        TensorData::F4E2M1(v) => v.iter().map(|x| x.to_bits()).collect(),
        TensorData::I4(v) => v.iter().map(|x| x.to_bits()).collect(),
        TensorData::U4(v) => v.iter().map(|x| x.to_bits()).collect(),
        other => panic!("not a low-bit buffer: {}", other.dtype()),
    }
}

/// Cast (saturating and not) of every input, and every code's value, equal ml_dtypes'.
#[test]
fn conversions_match_ml_dtypes() {
    let dir = data_dir().join("conversions");
    let xs = read_f32(&dir.join("inputs.f32"));
    let x = Tensor::from_f32(vec![xs.len()], xs.clone());
    for name in [
        "float8e4m3fn",
        "float8e4m3fnuz",
        "float8e5m2",
        "float8e5m2fnuz",
        "float4e2m1",
    ] {
        let dtype = DType::from_name(name).unwrap();
        for (sat, file) in [(true, "sat"), (false, "nosat")] {
            let want = std::fs::read(dir.join(format!("{name}.{file}.u8"))).unwrap();
            let got = codes(&cast_tensor_saturate(&x, dtype, sat));
            let bad: Vec<_> = (0..xs.len()).filter(|&i| got[i] != want[i]).collect();
            assert!(
                bad.is_empty(),
                "{name} saturate={sat}: {} of {} differ, e.g. {} -> {:#04x}, ml_dtypes {:#04x}",
                bad.len(),
                xs.len(),
                xs[bad[0]],
                got[bad[0]],
                want[bad[0]]
            );
        }
        let want = read_f32(&dir.join(format!("{name}.decode.f32")));
        let codes: Vec<u8> = (0..want.len() as u32).map(|c| c as u8).collect();
        let t = mixprec::data::npy::as_low_bit(
            Tensor::from_parts(vec![codes.len()], TensorData::U8(codes.into())),
            dtype,
        )
        .unwrap();
        let got = t.to_f32_vec().unwrap();
        for (c, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g.to_bits() == w.to_bits() || g.is_nan() && w.is_nan(),
                "{name} code {c:#04x}: {g} vs ml_dtypes {w}"
            );
        }
        println!(
            "{name}: {} conversions (both saturate modes) and {} codes equal ml_dtypes",
            xs.len(),
            want.len()
        );
    }
    let xs = read_f32(&dir.join("int4_inputs.f32"));
    let x = Tensor::from_f32(vec![xs.len()], xs.clone());
    for (name, dtype) in [("int4", DType::I4), ("uint4", DType::U4)] {
        let want = std::fs::read(dir.join(format!("{name}.cast.u8"))).unwrap();
        let got = codes(&cast_tensor_saturate(&x, dtype, true));
        // Out of range ONNX leaves float → integer undefined; mixprec keeps the low bits, as
        // ml_dtypes 0.6 (pinned in scripts/requirements-test.txt) does — 0.7 returns 0 there.
        let bad = (0..xs.len()).find(|&i| got[i] != want[i]);
        assert!(
            bad.is_none(),
            "{name}: {} -> code {:#x}, ml_dtypes {:#x}",
            xs[bad.unwrap()],
            got[bad.unwrap()],
            want[bad.unwrap()]
        );
    }
}

/// Runs a generated model and compares every output with the reference bit for bit.
fn check_case(case: &str) {
    let dir = data_dir().join(case);
    let model = load_model(dir.join("model.onnx")).unwrap();
    let set = dir.join("test_data_set_0");
    let feeds = mixprec::onnx::read_input_set(&model.graph, &set).unwrap();
    let res = Interpreter::new(&model.graph).unwrap().run(&feeds).unwrap();
    for (i, (name, got)) in res.outputs.iter().enumerate() {
        let (_, want) =
            mixprec::onnx::read_tensor_file(&set.join(format!("output_{i}.pb"))).unwrap();
        assert_eq!(got.dtype(), want.dtype(), "{case}: output {name}");
        assert_eq!(got.shape(), want.shape(), "{case}: output {name}");
        if got.dtype().is_low_bit() {
            assert_eq!(codes(got), codes(&want), "{case}: output {name}");
        } else {
            let (a, b) = (got.to_f32_vec().unwrap(), want.to_f32_vec().unwrap());
            for (k, (x, y)) in a.iter().zip(&b).enumerate() {
                assert!(
                    x.to_bits() == y.to_bits() || x.is_nan() && y.is_nan(),
                    "{case}: output {name}[{k}] = {x}, reference {y}"
                );
            }
        }
    }
    let ort = std::fs::read_to_string(dir.join("ort.txt")).unwrap();
    println!("{case}: equals onnx.reference; ONNX Runtime {}", ort.trim());
}

#[test]
fn blocked_int4_and_float4_dequantize_match_the_reference() {
    check_case("dq_int4_blocked_axis0");
    check_case("dq_float4e2m1_blocked_axis1");
}

#[test]
fn quantize_dequantize_low_bit_types_match_the_reference() {
    for case in [
        "qdq_int4_blocked",
        "qdq_uint4_blocked",
        "qdq_float4e2m1_blocked",
        "qdq_float8e4m3fn_axis_nosat",
        "qdq_float8e5m2_tensor",
    ] {
        check_case(case);
    }
}

/// A low-bit initializer whose byte count does not match its shape: a load error naming it.
#[test]
fn wrong_low_bit_byte_counts_are_errors_naming_the_tensor() {
    use mixprec::onnx::proto;
    use prost::Message;
    let dir = tempfile::tempdir().unwrap();
    for (dtype, bytes) in [
        (DType::I4, 2usize),
        (DType::F8E4M3FN, 4),
        (DType::F4E2M1, 4),
    ] {
        let w = proto::TensorProto {
            name: Some("w_bad".into()),
            dims: vec![5],
            data_type: Some(dtype.onnx_code()),
            raw_data: Some(vec![0; bytes].into()),
            ..Default::default()
        };
        let model = proto::ModelProto {
            ir_version: Some(10),
            opset_import: vec![proto::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(21),
            }],
            graph: Some(proto::GraphProto {
                name: Some("g".into()),
                initializer: vec![w],
                node: vec![proto::NodeProto {
                    op_type: Some("Identity".into()),
                    input: vec!["w_bad".into()],
                    output: vec!["y".into()],
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let p = dir.path().join("bad.onnx");
        std::fs::write(&p, model.encode_to_vec()).unwrap();
        let e = load_model(&p).unwrap_err().to_string();
        assert!(
            e.contains("bad.onnx")
                && e.contains("'w_bad'")
                && e.contains(&format!("{bytes} bytes")),
            "{dtype}: {e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}

/// Every kernel fed low-bit tensors returns a result or an error, never panics (unless it
/// also panics on the same call with float32 tensors, which is not about the dtype).
#[test]
fn every_kernel_survives_low_bit_inputs() {
    let reg = Registry::global();
    let low = [
        DType::F8E4M3FN,
        DType::F8E4M3FNUZ,
        DType::F8E5M2,
        DType::F8E5M2FNUZ,
        DType::U4,
        DType::I4,
        DType::F4E2M1,
    ];
    let mut calls = 0;
    for op in reg.op_types() {
        let kernel = reg.get("", op).unwrap();
        for n_inputs in 1..=3 {
            for opset in [13, 21] {
                let node = Node {
                    name: "n".into(),
                    op_type: op.into(),
                    domain: String::new(),
                    inputs: (0..n_inputs).map(|i| format!("x{i}")).collect(),
                    outputs: vec!["y".into()],
                    attrs: Default::default(),
                    ..Default::default()
                };
                let run = |dtype: DType| {
                    let t = mixprec::ops::cast::cast_tensor(
                        &Tensor::from_f32(vec![2, 2], vec![1.0, -2.0, 0.5, 3.0]),
                        dtype,
                    );
                    let ins: Vec<Option<&Tensor>> = (0..n_inputs).map(|_| Some(&t)).collect();
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        let _ = kernel(&OpCtx::new(&node, opset), &ins);
                    }))
                    .is_ok()
                };
                if !run(DType::F32) {
                    continue;
                }
                for d in low {
                    calls += 1;
                    assert!(
                        run(d),
                        "{op} with {n_inputs} {d} input(s), opset {opset} panicked"
                    );
                }
            }
        }
    }
    println!("{calls} kernel calls with low-bit inputs, none panicked");
}

/// The CLI on low-bit models: inspect, run under a float16 plan, and Polygraphy files both
/// ways (ONNX Runtime returns a float8e4m3fn output as uint8 bits; mixprec saves it so too).
#[test]
fn low_bit_models_work_from_the_cli_and_with_polygraphy() {
    use crate::cli::polygraphy;
    use crate::common::{mixprec, text};
    let dir = data_dir();
    let tmp = tempfile::tempdir().unwrap();
    let f = |n: &str| tmp.path().join(n).to_string_lossy().into_owned();
    let model = |c: &str| {
        dir.join(c)
            .join("model.onnx")
            .to_string_lossy()
            .into_owned()
    };

    let o = mixprec(&["inspect", &model("qdq_float8e5m2_tensor")]);
    assert!(o.status.success(), "{}", text(&o));
    let o = mixprec(&["run", &model("qdq_float8e5m2_tensor"), "--fp16"]);
    assert!(o.status.success(), "{}", text(&o));

    // An int4 graph input: generated, saved as int8, loaded back as int4; int4 and float
    // outputs saved and compared.
    for case in [
        "dq_int4_blocked_axis0",
        "qdq_int4_blocked",
        "qdq_float8e5m2_tensor",
    ] {
        let (i, g) = (
            f(&format!("{case}_in.json")),
            f(&format!("{case}_out.json")),
        );
        let o = mixprec(&[
            "run",
            &model(case),
            "--save-inputs",
            &i,
            "--save-outputs",
            &g,
        ]);
        assert!(o.status.success(), "{case}: {}", text(&o));
        let o = mixprec(&[
            "run",
            &model(case),
            "--load-inputs",
            &i,
            "--load-outputs",
            &g,
        ]);
        assert!(o.status.success(), "{case}: {}", text(&o));
    }

    let m = model("qdq_float8e4m3fn_tensor");
    let o = polygraphy(&[
        "run",
        &m,
        "--onnxrt",
        "--val-range",
        "x:[-20,20]",
        "--save-inputs",
        &f("p_in.json"),
        "--save-outputs",
        &f("p_out.json"),
    ]);
    assert!(o.status.success(), "polygraphy: {}", text(&o));
    let o = mixprec(&[
        "run",
        &m,
        "--load-inputs",
        &f("p_in.json"),
        "--load-outputs",
        &f("p_out.json"),
    ]);
    assert!(
        o.status.success(),
        "mixprec on polygraphy's files: {}",
        text(&o)
    );
    let o = mixprec(&[
        "run",
        &m,
        "--val-range",
        "x:[-20,20]",
        "--save-inputs",
        &f("m_in.json"),
        "--save-outputs",
        &f("m_out.json"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = polygraphy(&[
        "run",
        &m,
        "--onnxrt",
        "--load-inputs",
        &f("m_in.json"),
        "--load-outputs",
        &f("m_out.json"),
    ]);
    assert!(
        o.status.success(),
        "polygraphy on mixprec's files: {}",
        text(&o)
    );
}
