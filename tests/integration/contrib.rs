//! com.microsoft ops (and ONNX Runtime's default-domain SimplifiedLayerNormalization) against
//! ONNX Runtime, which defines them: scripts/gen_contrib_cases.py writes one-node models with
//! every activation, transpose flag, mask form and optional input/output, ONNX Runtime runs
//! them, mixprec must agree.

use crate::common::cases_against_onnxruntime;

#[test]
fn contrib_ops_match_onnxruntime() {
    let tmp = tempfile::tempdir().unwrap();
    let failures = cases_against_onnxruntime("gen_contrib_cases.py", tmp.path(), 302);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A chain of contrib ops under a float16 plan: every output is float16 values, two runs agree
/// bit for bit, the error to FP32 is float16-sized. Then a search on it finishes, and its
/// export keeps FusedConv in float32 (no float16 kernel there, `export::types::
/// has_float16_kernel`) and loads again.
#[test]
fn contrib_ops_run_in_float16_search_and_export() {
    use mixprec::exec::{PlanOptions, PreparedPlan, RunOptions};
    use mixprec::precision::{plan::PrecisionPlan, Precision};
    let tmp = tempfile::tempdir().unwrap();
    crate::common::generate_cases("gen_contrib_cases.py", tmp.path());
    let d = tmp.path().join("chain");
    let model = d.join("model.onnx");
    let m = mixprec::load_model(&model).unwrap();
    let feeds = crate::common::feeds_of(&m.graph, &d.join("inputs"));
    let interp = mixprec::Interpreter::new(&m.graph).unwrap();
    let fp32 = interp.run(&feeds).unwrap().outputs[0].1.clone();
    let plan = PrecisionPlan::uniform(&m.graph, Precision::Float16);
    let prepared = PreparedPlan::new(&m.graph, &plan, &PlanOptions::default()).unwrap();
    let run = || {
        interp
            .run_plan(&feeds, &RunOptions::default(), &prepared)
            .unwrap()
            .outputs[0]
            .1
            .clone()
    };
    let (a, b) = (run(), run());
    assert_eq!(a, b, "two float16 runs differ");
    let (a, w) = (a.as_f32().unwrap(), fp32.as_f32().unwrap());
    assert!(a
        .iter()
        .all(|&v| half::f16::from_f32(v).to_f32().to_bits() == v.to_bits()));
    let err = a
        .iter()
        .zip(w)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(err > 0.0 && err < 5e-2, "float16 error {err:e}");

    let out = tmp.path().join("mixed.onnx");
    let (model, out) = (model.to_str().unwrap(), out.to_str().unwrap());
    let o = crate::common::mixprec(&[
        "debug",
        "precision",
        model,
        "--fp16",
        "--mode",
        "minimal",
        "--atol",
        "5e-2",
        "--rtol",
        "1e-2",
        "-o",
        out,
    ]);
    let t = crate::common::text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("layer 'fc' (com.microsoft.FusedConv) stays float32"),
        "{t}"
    );
    let o = crate::common::mixprec(&["run", out, "--onnxrt"]);
    assert!(o.status.success(), "{}", crate::common::text(&o));
}

/// The com.microsoft ops with float16 kernels in ONNX Runtime are written in float16 under a
/// float16 plan, as the emulation ran them: ONNX Runtime runs the converted chain and its
/// output is the emulated float16 plan's within float16 noise (FusedConv stays float32, with
/// its note).
#[test]
fn float16_contrib_ops_export_in_float16() {
    float16_export_runs_as_emulated("chain", Some("fc"));
}

/// MRotaryEmbedding and GatedAdd (ONNX Runtime GenAI's Qwen-VL and Qwen-MoE ops) have float16
/// CPU kernels: a float16 plan writes both in float16 (nothing stays float32) and ONNX Runtime
/// runs the file as the emulation ran it, within float16 noise.
#[test]
fn genai_rope_and_gate_export_in_float16() {
    float16_export_runs_as_emulated("rope_gate_chain", None);
}

/// MoE and QMoE (ONNX Runtime GenAI's mixture-of-experts layers) have float16 CPU kernels:
/// a float16 plan writes them in float16 and ONNX Runtime runs the file as the emulation ran
/// it (QMoE: bit for bit in these cases but for MLAS's GEMM order; MoE: its float16 GEMM's own
/// order, within float16 noise).
#[test]
fn mixtures_of_experts_export_in_float16() {
    float16_export_runs_as_emulated("moe_swiglu_qwen", None);
    float16_export_runs_as_emulated("qmoe_4b_bs32_zp_silu", None);
    float16_export_runs_as_emulated("qmoe_acc4_4b_bs32", None);
}

/// VarlenCausalConvWithState and GatedRMSNorm (ONNX Runtime GenAI's Qwen3.5 linear-attention
/// ops) have float16 CPU kernels and are written in float16; CausalConvWithState's CPU kernel
/// is float32 only, so it stays float32 with its note. ONNX Runtime runs the file as the
/// emulation ran the float16 plan.
#[test]
fn linear_attention_conv_and_norm_export_in_float16() {
    float16_export_runs_as_emulated("conv_norm_chain", Some("short_conv"));
}

/// LinearAttentionGate → GatedDeltaNet (ONNX Runtime GenAI's Qwen3.5 linear attention) have
/// float16 CPU kernels that compute in f32 and round their outputs once, GatedDeltaNet's state
/// staying float32: the float16 export writes both in float16 with the gate's dt_bias and
/// decay_scale, the net's decay, beta and state float32, and ONNX Runtime's outputs of the
/// file (Y and the final state) are the emulated float16 plan's bit for bit.
#[test]
fn linear_attention_gate_and_gated_delta_net_export_in_float16() {
    use mixprec::tensor::DType;
    // Nothing stays float32 (kept: None), so `--fallback` wrote the plain float16 export.
    let export = float16_export_runs_as_emulated("linear_attention_chain", None);
    let (d, model, out) = (&export.case, &export.model, &export.out);
    let written = mixprec::load_model(out).unwrap();
    let types = mixprec::export::types::scope_types(&written.graph, &Default::default());
    let node = |op: &str| {
        written
            .graph
            .nodes
            .iter()
            .find(|n| n.op_type == op)
            .unwrap()
    };
    let ty = |name: &str| types.get(name).copied();
    let (gate, gdn) = (node("LinearAttentionGate"), node("GatedDeltaNet"));
    assert_eq!(
        [1, 2, 3].map(|i| ty(&gate.inputs[i])),
        [Some(DType::F32), Some(DType::F32), Some(DType::F16)]
    );
    assert_eq!(ty(&gate.outputs[0]), Some(DType::F16));
    // q, k, v float16; decay and beta float32 (TG: the gate's float16 output cast back, the
    // values unchanged); the state float32 in and out.
    assert_eq!(
        [0, 1, 2, 4, 5, 6].map(|i| ty(&gdn.inputs[i])),
        [
            Some(DType::F16),
            Some(DType::F16),
            Some(DType::F16),
            Some(DType::F32),
            Some(DType::F32),
            Some(DType::F32)
        ]
    );
    assert_eq!(gdn.inputs[6], "state", "the state input is read as given");
    assert_eq!(
        [ty(&gdn.outputs[0]), ty(&gdn.outputs[1])],
        [Some(DType::F16), Some(DType::F32)]
    );
    assert_eq!(gdn.outputs[1], "final_state", "no Cast after the state");
    // ONNX Runtime on the file against the emulated float16 plan, both outputs.
    let emulated = emulated_float16(model, &d.join("inputs"));
    let ort_outputs = onnxruntime_outputs(out, &d.join("inputs"));
    assert_eq!(emulated.len(), 2);
    for ((name, e), ort) in emulated.iter().zip(&ort_outputs) {
        assert_eq!(ort.dtype(), DType::F32, "{name}");
        let (a, b) = (e.as_f32().unwrap(), ort.as_f32().unwrap());
        assert_eq!(a.len(), b.len(), "{name}");
        let differ = a
            .iter()
            .zip(b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert_eq!(differ, 0, "{name}: {differ} of {} values differ", a.len());
    }
    // The state is not float16 values: the emulation left it float32.
    let state = emulated[1].1.as_f32().unwrap();
    assert!(state
        .iter()
        .any(|&x| half::f16::from_f32(x).to_f32().to_bits() != x.to_bits()));
}

/// `convert --fp16 --fallback` of the generated chain `case`: only the layer `kept` (no
/// float16 kernel: FusedConv, CausalConvWithState) stays float32 with its note, every other com.microsoft layer
/// reads float16, and ONNX Runtime's output of the file is the emulated float16 plan's within
/// 1e-2 of the largest output. Returns the case and the written file, for more checks.
fn float16_export_runs_as_emulated(case: &str, kept: Option<&str>) -> Float16Export {
    let tmp = tempfile::tempdir().unwrap();
    crate::common::generate_cases("gen_contrib_cases.py", tmp.path());
    let d = tmp.path().join(case);
    let model = d.join("model.onnx");
    let out = tmp.path().join("fp16.onnx");
    let o = crate::common::mixprec(&[
        "convert",
        model.to_str().unwrap(),
        "--fp16",
        "--fallback",
        "-o",
        out.to_str().unwrap(),
    ]);
    let t = crate::common::text(&o);
    assert!(o.status.success(), "{t}");
    if let Some(kept) = kept {
        let source = mixprec::load_model(&model).unwrap();
        let op = &source
            .graph
            .nodes
            .iter()
            .find(|n| n.name == kept)
            .unwrap()
            .op_type;
        assert!(
            t.contains(&format!(
                "layer '{kept}' (com.microsoft.{op}) stays float32"
            )),
            "{t}"
        );
    }
    assert_eq!(
        t.matches("stays float32").count(),
        usize::from(kept.is_some()),
        "{t}"
    );
    // The written contrib layers read float16.
    let written = mixprec::load_model(&out).unwrap();
    let types = mixprec::export::types::scope_types(&written.graph, &Default::default());
    for n in written
        .graph
        .nodes
        .iter()
        .filter(|n| n.domain == "com.microsoft")
    {
        let want = if Some(n.name.as_str()) == kept {
            mixprec::tensor::DType::F32
        } else {
            mixprec::tensor::DType::F16
        };
        assert_eq!(
            types.get(&n.inputs[0]),
            Some(&want),
            "{} ({})",
            n.name,
            n.op_type
        );
    }
    // ONNX Runtime's output against the emulation of the float16 plan.
    let emulated = emulated_float16(&model, &d.join("inputs")).remove(0).1;
    let ort = onnxruntime_outputs(&out, &d.join("inputs")).remove(0);
    let (a, b) = (emulated.as_f32().unwrap(), ort.as_f32().unwrap());
    assert_eq!(a.len(), b.len());
    let err = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(
        err <= 1e-2 * scale.max(1.0),
        "ONNX Runtime vs emulation: {err:e} (scale {scale})"
    );
    Float16Export {
        _dir: tmp,
        case: d,
        model,
        out,
    }
}

/// A generated case and its float16 export ([`float16_export_runs_as_emulated`]); the files
/// live as long as `_dir`.
struct Float16Export {
    _dir: tempfile::TempDir,
    case: std::path::PathBuf,
    model: std::path::PathBuf,
    out: std::path::PathBuf,
}

/// The outputs of `model` under a uniform float16 plan, on the inputs in `inputs`
/// (input_K.pb).
fn emulated_float16(
    model: &std::path::Path,
    inputs: &std::path::Path,
) -> Vec<(String, mixprec::tensor::Tensor)> {
    use mixprec::exec::{PlanOptions, PreparedPlan, RunOptions};
    use mixprec::precision::{plan::PrecisionPlan, Precision};
    let m = mixprec::load_model(model).unwrap();
    let feeds = crate::common::feeds_of(&m.graph, inputs);
    let plan = PrecisionPlan::uniform(&m.graph, Precision::Float16);
    let prepared = PreparedPlan::new(&m.graph, &plan, &PlanOptions::default()).unwrap();
    mixprec::Interpreter::new(&m.graph)
        .unwrap()
        .run_plan(&feeds, &RunOptions::default(), &prepared)
        .unwrap()
        .outputs
}

/// Every output ONNX Runtime's CPU provider computes for the model file `model` on the inputs
/// in `inputs` (input_K.pb, one per graph input), as float32.
fn onnxruntime_outputs(
    model: &std::path::Path,
    inputs: &std::path::Path,
) -> Vec<mixprec::tensor::Tensor> {
    let dir = tempfile::tempdir().unwrap();
    let script = "import sys, os, numpy as np, onnx, onnxruntime as ort; \
        from onnx import numpy_helper as nh; \
        s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider']); \
        xs = [nh.to_array(onnx.load_tensor(f'{sys.argv[2]}/input_{k}.pb')) for k in range(len(s.get_inputs()))]; \
        [np.save(os.path.join(sys.argv[3], f'out_{k}.npy'), y.astype(np.float32)) \
         for k, y in enumerate(s.run(None, {i.name: x for i, x in zip(s.get_inputs(), xs)}))]";
    let o = std::process::Command::new(crate::common::python())
        .args([
            "-c",
            script,
            model.to_str().unwrap(),
            inputs.to_str().unwrap(),
            dir.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", crate::common::text(&o));
    (0..)
        .map(|k| dir.path().join(format!("out_{k}.npy")))
        .take_while(|f| f.exists())
        .map(|f| mixprec::data::npy::from_npy(&std::fs::read(f).unwrap()).unwrap())
        .collect()
}

/// The outputs ONNX Runtime's CPU provider computes for a model of one input (one intra-op
/// thread: the session mixprec's MatMulNBits models, docs/numerics.md), as float32.
fn ort_outputs(model: &std::path::Path, input: &std::path::Path) -> Vec<mixprec::tensor::Tensor> {
    let dir = tempfile::tempdir().unwrap();
    let script = "import sys, os, numpy as np, onnx, onnxruntime as ort; \
        from onnx import numpy_helper as nh; \
        x = nh.to_array(onnx.load_tensor(sys.argv[2])); \
        so = ort.SessionOptions(); so.intra_op_num_threads = 1; \
        s = ort.InferenceSession(sys.argv[1], so, providers=['CPUExecutionProvider']); \
        [np.save(os.path.join(sys.argv[3], f'out_{k}.npy'), y.astype(np.float32)) \
         for k, y in enumerate(s.run(None, {s.get_inputs()[0].name: x}))]";
    let o = std::process::Command::new(crate::common::python())
        .args([
            "-c",
            script,
            model.to_str().unwrap(),
            input.to_str().unwrap(),
            dir.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", crate::common::text(&o));
    (0..)
        .map(|k| dir.path().join(format!("out_{k}.npy")))
        .take_while(|p| p.exists())
        .map(|p| mixprec::data::npy::from_npy(&std::fs::read(p).unwrap()).unwrap())
        .collect()
}

/// The emulated outputs of `plan` on the int4 chain, as float32.
fn emulated_outputs(
    m: &mixprec::Model,
    feeds: &mixprec::exec::Feeds,
    plan: &mixprec::precision::plan::PrecisionPlan,
) -> Vec<mixprec::tensor::Tensor> {
    use mixprec::exec::{PlanOptions, PreparedPlan, RunOptions};
    let prepared = PreparedPlan::new(&m.graph, plan, &PlanOptions::default()).unwrap();
    mixprec::Interpreter::new(&m.graph)
        .unwrap()
        .run_plan(feeds, &RunOptions::default(), &prepared)
        .unwrap()
        .outputs
        .into_iter()
        .map(|(_, t)| mixprec::ops::cast::cast_tensor(&t, mixprec::tensor::DType::F32))
        .collect()
}

/// The element type each weight-only quantized layer of a written model computes in: A's type
/// for MatMulNBits, the scales' for GatherBlockQuantized — whose scales must have it too
/// (ONNX Runtime's T1/T2).
fn weight_only_layer_types(
    path: &std::path::Path,
) -> std::collections::BTreeMap<String, mixprec::tensor::DType> {
    let written = mixprec::load_model(path).unwrap();
    let types = mixprec::export::types::scope_types(&written.graph, &Default::default());
    let mut out = std::collections::BTreeMap::new();
    for n in &written.graph.nodes {
        let t = match n.op_type.as_str() {
            "MatMulNBits" => types[&n.inputs[0]],
            "GatherBlockQuantized" => types[&n.outputs[0]],
            _ => continue,
        };
        assert_eq!(types[&n.inputs[2]], t, "{}: scales", n.name);
        out.insert(n.name.clone(), t);
    }
    out
}

/// Issue (audit, int4 under --fp16): ONNX Runtime GenAI's int4 layout — GatherBlockQuantized
/// and MatMulNBits — under a float16 plan: `convert --fp16` writes them in float16, without
/// `--fallback`, with float16 scales, as the emulation ran them; ONNX Runtime loads and runs
/// the file (its CPU kernels take float16) within the CPU/GPU arithmetic difference of the
/// emulation. Then a mixed plan (one MatMulNBits in float32): each layer is written in the
/// plan's type, and ORT agrees again.
#[test]
fn weight_only_ops_export_in_float16_as_emulated() {
    use mixprec::precision::{plan::PrecisionPlan, Precision};
    use mixprec::tensor::DType;
    let tmp = tempfile::tempdir().unwrap();
    crate::common::generate_cases("gen_contrib_cases.py", tmp.path());
    let d = tmp.path().join("int4_chain");
    let model = d.join("model.onnx");
    let input = d.join("inputs/input_0.pb");
    let m = mixprec::load_model(&model).unwrap();
    let feeds = crate::common::feeds_of(&m.graph, &d.join("inputs"));
    // ONNX Runtime's CPU kernel computes a float16 MatMulNBits as float32 (the int8 path of
    // accuracy_level 4 included) where the emulation dequantizes to float16 as its CUDA kernel
    // does (docs/numerics.md): the file's outputs agree within that difference, not bit for bit.
    let check = |ort: &[mixprec::tensor::Tensor], emu: &[mixprec::tensor::Tensor]| {
        assert_eq!(ort.len(), 2);
        assert_eq!(emu.len(), 2);
        for (name, o, e) in [("y_exact", &ort[0], &emu[0]), ("y", &ort[1], &emu[1])] {
            let (o, e) = (o.as_f32().unwrap(), e.as_f32().unwrap());
            assert_eq!(o.len(), e.len());
            let scale = e.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = o.iter().zip(e).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                o.iter().all(|v| v.is_finite()) && err <= 0.02 * scale,
                "{name}: ORT vs emulation {err:e} (scale {scale})"
            );
        }
    };

    // The whole model in float16, by the CLI, without --fallback.
    let out = tmp.path().join("fp16.onnx");
    let o = crate::common::mixprec(&[
        "convert",
        model.to_str().unwrap(),
        "--fp16",
        "-o",
        out.to_str().unwrap(),
    ]);
    let t = crate::common::text(&o);
    assert!(o.status.success(), "{t}");
    assert!(!t.contains("stays float32"), "{t}");
    let types = weight_only_layer_types(&out);
    assert_eq!(types.len(), 4, "{types:?}");
    assert!(types.values().all(|&t| t == DType::F16), "{types:?}");
    let plan = PrecisionPlan::uniform(&m.graph, Precision::Float16);
    let emu = emulated_outputs(&m, &feeds, &plan);
    for t in &emu {
        let v = t.as_f32().unwrap();
        assert!(v
            .iter()
            .all(|&x| half::f16::from_f32(x).to_f32().to_bits() == x.to_bits()));
    }
    check(&ort_outputs(&out, &input), &emu);
    // The float16 plan differs from float32 (the test sees the rounding).
    let fp32 = emulated_outputs(
        &m,
        &feeds,
        &PrecisionPlan::uniform(&m.graph, Precision::Float32),
    );
    assert_ne!(fp32[0], emu[0]);

    // A mixed plan: o_proj in float32, the rest float16, by the library's export.
    let mut plan = PrecisionPlan::uniform(&m.graph, Precision::Float16);
    let k = m
        .graph
        .nodes
        .iter()
        .position(|n| n.name == "o_proj")
        .unwrap();
    plan.layers[k] = Precision::Float32;
    let e = mixprec::export::export(&m, &plan, None, &Default::default()).unwrap();
    let mixed = tmp.path().join("mixed.onnx");
    mixprec::export::write_model(&mixed, &e.model).unwrap();
    let types = weight_only_layer_types(&mixed);
    for (k, n) in m.graph.nodes.iter().enumerate() {
        let want = if plan.layers[k] == Precision::Float32 {
            DType::F32
        } else {
            DType::F16
        };
        assert_eq!(types[&n.name], want, "{}", n.name);
    }
    check(
        &ort_outputs(&mixed, &input),
        &emulated_outputs(&m, &feeds, &plan),
    );
}
