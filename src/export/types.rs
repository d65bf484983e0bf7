//! Element types of a node's outputs from its inputs' types (ONNX type constraints of the
//! default domain): enough static typing for the export to know which tensors are float32
//! and what a node produces once some of its inputs change type.

use crate::graph::{Attribute, Graph, Node};
use crate::tensor::DType;
use std::collections::HashMap;

/// The element type of each output of `node` given its inputs' types (None: absent input or
/// unknown type). Returns None when the op's typing is not known here (domains other than
/// ONNX's and the com.microsoft ops mixprec runs, sequences, control flow whose body does not
/// declare its output types).
pub fn infer_outputs(node: &Node, ins: &[Option<DType>]) -> Option<Vec<Option<DType>>> {
    let domain = node.domain.as_str();
    if domain == "com.microsoft" {
        return contrib_outputs(node, ins);
    }
    if !(domain.is_empty() || domain == "ai.onnx") {
        return None;
    }
    let n = node.outputs.len();
    let input = |i: usize| ins.get(i).copied().flatten();
    let first = ins.iter().copied().flatten().next();
    let all = |t: Option<DType>| Some(vec![t; n]);
    let attr_dtype = |name: &str| node.attr_int(name).and_then(|c| DType::from_onnx(c as i32));
    let with_rest = |head: Option<DType>, rest: DType| {
        let mut v = vec![Some(rest); n];
        if let Some(x) = v.first_mut() {
            *x = head;
        }
        Some(v)
    };
    // Control flow: the types its body declares for the node's outputs.
    let body_types = |attr: &str, skip: usize| {
        let g = node.attr_graph(attr)?;
        let v: Vec<Option<DType>> = g.outputs.iter().skip(skip).map(|o| o.dtype).collect();
        (v.len() == n && v.iter().all(|t| t.is_some())).then_some(v)
    };
    match node.op_type.as_str() {
        "If" => body_types("then_branch", 0),
        "Loop" => body_types("body", 1),
        "Scan" => body_types("body", 0),
        "SequenceAt" | "SequenceConstruct" | "SequenceEmpty" | "SequenceErase"
        | "SequenceInsert" | "SequenceLength" | "SequenceMap" | "SplitToSequence"
        | "ConcatFromSequence" | "Optional" | "OptionalGetElement" | "OptionalHasElement" => None,
        "Cast" => all(attr_dtype("to")),
        "CastLike" => all(input(1)),
        "Shape" | "Size" | "NonZero" | "ArgMax" | "ArgMin" | "NonMaxSuppression" => {
            all(Some(DType::I64))
        }
        "TopK" | "MaxPool" => with_rest(input(0), DType::I64),
        "Unique" => with_rest(input(0), DType::I64),
        "Dropout" => with_rest(input(0), DType::Bool),
        "Equal" | "Less" | "LessOrEqual" | "Greater" | "GreaterOrEqual" | "And" | "Or" | "Xor"
        | "Not" | "IsNaN" | "IsInf" | "RegexFullMatch" => all(Some(DType::Bool)),
        "StringNormalizer" | "StringConcat" => all(Some(DType::Str)),
        "StringSplit" => with_rest(Some(DType::Str), DType::I64),
        "ImageDecoder" => all(Some(DType::U8)),
        "TfIdfVectorizer" => all(Some(DType::F32)),
        "MatMulInteger" | "ConvInteger" => all(Some(DType::I32)),
        "QLinearConv" | "QLinearMatMul" => all(input(7)),
        "Constant" => all(constant_dtype(node)),
        "ConstantOfShape" => all(node
            .attr_tensor("value")
            .map(|t| t.dtype())
            .or(Some(DType::F32))),
        "EyeLike" | "RandomNormalLike" | "RandomUniformLike" | "Bernoulli" => {
            all(attr_dtype("dtype").or(input(0)))
        }
        "RandomNormal" | "RandomUniform" => all(attr_dtype("dtype").or(Some(DType::F32))),
        "Multinomial" => all(attr_dtype("dtype").or(Some(DType::I32))),
        "HannWindow" | "HammingWindow" | "BlackmanWindow" | "MelWeightMatrix" => {
            all(attr_dtype("output_datatype").or(Some(DType::F32)))
        }
        "QuantizeLinear" => {
            // output_dtype 0 (unset) is no DType: the zero point's type, else uint8.
            all(attr_dtype("output_dtype").or(input(2)).or(Some(DType::U8)))
        }
        "DequantizeLinear" => all(attr_dtype("output_dtype").or(input(1))),
        "DynamicQuantizeLinear" => Some(
            [DType::U8, DType::F32, DType::U8][..n.min(3)]
                .iter()
                .map(|&t| Some(t))
                .collect(),
        ),
        "Where" => all(input(1)),
        "OneHot" => all(input(2)),
        "LayerNormalization" => {
            // Mean and InvStdDev have the stash type (float32 by default).
            let stash = node
                .attr_int("stash_type")
                .and_then(|c| DType::from_onnx(c as i32))
                .unwrap_or(DType::F32);
            with_rest(input(0), stash)
        }
        // ONNX Runtime's contrib op in the default domain: Y has the scale's type (V), the
        // optional inv_std_var float32 (U).
        "SimplifiedLayerNormalization" => with_rest(input(1).or(input(0)), DType::F32),
        _ => all(input(0).or(first)),
    }
}

/// Whether ONNX Runtime's CPU kernels of a com.microsoft op (or of its default-domain
/// SimplifiedLayerNormalization) take float16 (1.32: the op
/// registered for MLFloat16 in `contrib_ops/cpu/cpu_contrib_kernels.cc`; each one loads and
/// runs in float16, `integration::contrib::float16_contrib_ops_export_in_float16`,
/// `genai_rope_and_gate_export_in_float16`): the export
/// writes such a layer in float16 when the plan has it there, as the emulation ran it. The
/// weight-only quantized ops (MatMulNBits, GatherBlockQuantized) are among them: their scales
/// (and float zero points) become float16 with A, as ONNX Runtime GenAI's builder writes float16
/// models, and ORT's x86 kernel computes in f32 and rounds the output, as the emulation does
/// (`integration::contrib::weight_only_ops_export_in_float16_as_emulated`). The CUDA-only ops
/// (BiasAdd), FusedConv, CausalConvWithState and LinearAttention (ORT 1.32's CPU kernels are
/// float32 only: a float16 one runs between Casts ORT inserts) stay float32 with a note.
/// LinearAttentionGate's float16 kernel computes in f32 and rounds each output once;
/// GatedDeltaNet's computes in f32 from the widened inputs, rounds the output once and keeps
/// its state float32 (measured bit for bit against ORT 1.32): their float32 inputs (the gate's
/// dt_bias and decay_scale, the net's decay, beta, initial_state, a_log and dt_bias) stay
/// float32, as their input roles say.
pub fn has_float16_kernel(node: &Node) -> bool {
    // ONNX Runtime's SimplifiedLayerNormalization lives in the default domain, outside ONNX's
    // schemas.
    let ort_default_domain = matches!(node.domain.as_str(), "" | "ai.onnx")
        && node.op_type == "SimplifiedLayerNormalization";
    ort_default_domain
        || node.domain == "com.microsoft"
            && matches!(
                node.op_type.as_str(),
                "SkipSimplifiedLayerNormalization"
                    | "SkipLayerNormalization"
                    | "GroupQueryAttention"
                    | "MultiHeadAttention"
                    | "Attention"
                    | "RotaryEmbedding"
                    | "MRotaryEmbedding"
                    | "GatedAdd"
                    | "SparseAttention"
                    | "FusedMatMul"
                    | "Gelu"
                    | "FastGelu"
                    | "QuickGelu"
                    | "BiasGelu"
                    | "MatMulNBits"
                    | "GatherBlockQuantized"
                    | "MoE"
                    | "QMoE"
                    | "VarlenCausalConvWithState"
                    | "GatedRMSNorm"
                    | "LinearAttentionGate"
                    | "GatedDeltaNet"
            )
}

/// Output types of the com.microsoft ops mixprec runs, from ONNX Runtime's contrib schemas
/// (onnxruntime/core/graph/contrib_ops/*_defs.cc). Without them the export cannot tell that a
/// contrib op it keeps in float32 feeds float32 to a float16 layer, and writes no Cast (the
/// GenAI-layout LLMs: a SkipSimplifiedLayerNormalization kept float32 before a float16
/// MatMul, which ONNX Runtime refuses to load).
fn contrib_outputs(node: &Node, ins: &[Option<DType>]) -> Option<Vec<Option<DType>>> {
    let n = node.outputs.len();
    let input = |i: usize| ins.get(i).copied().flatten();
    let all = |t: Option<DType>| Some(vec![t; n]);
    match node.op_type.as_str() {
        // T in, T out (every output, the KV-cache outputs of the attention ops included).
        "BiasAdd"
        | "BiasGelu"
        | "FastGelu"
        | "Gelu"
        | "QuickGelu"
        | "FusedConv"
        | "FusedMatMul"
        | "RotaryEmbedding"
        | "MRotaryEmbedding"
        | "GatedAdd"
        | "SparseAttention"
        | "MultiHeadAttention"
        | "Attention"
        | "DynamicQuantizeLSTM"
        | "QLinearAdd"
        | "QLinearMul"
        | "QLinearAveragePool"
        | "QLinearGlobalAveragePool"
        | "QLinearLeakyRelu"
        | "QLinearSigmoid"
        | "MoE"
        | "QMoE"
        | "CausalConvWithState"
        | "VarlenCausalConvWithState"
        | "GatedRMSNorm"
        | "LinearAttentionGate" => all(input(0)),
        // output is T; present_state S, past_state's type (without one, the model declares
        // it: the query's here).
        "LinearAttention" => Some(
            (0..n)
                .map(|j| {
                    if j == 0 {
                        input(0)
                    } else {
                        input(3).or(input(0))
                    }
                })
                .collect(),
        ),
        // output is T; final_state and state_update float32 (TS).
        "GatedDeltaNet" => Some(
            (0..n)
                .map(|j| if j == 0 { input(0) } else { Some(DType::F32) })
                .collect(),
        ),
        // A quantized KV cache (k_quant_type other than NONE) has its own cache type: not
        // typed here.
        "GroupQueryAttention" if node.attr_str("k_quant_type").is_none_or(|q| q == "NONE") => {
            all(input(0))
        }
        // output and input_skip_bias_sum are T; mean and inv_std_var float32 (U).
        "SkipLayerNormalization" | "SkipSimplifiedLayerNormalization" => Some(
            (0..n)
                .map(|j| {
                    if j == 1 || j == 2 {
                        Some(DType::F32)
                    } else {
                        input(0)
                    }
                })
                .collect(),
        ),
        // Y has A's type (T1).
        "MatMulNBits" => all(input(0)),
        // The output has the scales' type (T2).
        "GatherBlockQuantized" => all(input(2)),
        // Y has the type of the first quantized input (after Y's scale and zero point).
        "QLinearConcat" => all(input(2)),
        _ => None,
    }
}

/// The element types of every value of `graph` that can be told statically: declared ones
/// (inputs, outputs, value_info, initializers) first, else from the op's rule. `outer` holds
/// the types of the enclosing scopes, which subgraph nodes read by name. Control flow whose
/// body declares no output types (exporters often leave branch outputs untyped) is typed from
/// its body, typed in turn with this scope's types as its outer scope.
pub fn scope_types(graph: &Graph, outer: &HashMap<String, DType>) -> HashMap<String, DType> {
    let mut known = outer.clone();
    let mut declared: HashMap<&str, DType> = HashMap::new();
    for vi in graph
        .value_info
        .values()
        .chain(&graph.outputs)
        .chain(&graph.inputs)
    {
        if let Some(t) = vi.dtype {
            declared.insert(&vi.name, t);
        }
    }
    for (name, t) in &graph.initializers {
        known.insert(name.clone(), t.dtype());
    }
    for vi in &graph.inputs {
        if let Some(t) = vi.dtype {
            known.insert(vi.name.clone(), t);
        }
    }
    for node in &graph.nodes {
        let ins: Vec<Option<DType>> = node.inputs.iter().map(|s| known.get(s).copied()).collect();
        let rule = infer_outputs(node, &ins).or_else(|| body_output_types(node, &known));
        for (j, o) in node.outputs.iter().enumerate() {
            if o.is_empty() {
                continue;
            }
            let t = declared
                .get(o.as_str())
                .copied()
                .or_else(|| rule.as_ref().and_then(|r| r.get(j).copied().flatten()));
            if let Some(t) = t {
                known.insert(o.clone(), t);
            }
        }
    }
    known
}

/// If/Loop/Scan output types from their bodies' values (If: the then branch, else the else
/// branch; Loop: the outputs after the condition). None for other ops or unknown bodies.
fn body_output_types(node: &Node, outer: &HashMap<String, DType>) -> Option<Vec<Option<DType>>> {
    let (attrs, skip): (&[&str], usize) = match node.op_type.as_str() {
        "If" => (&["then_branch", "else_branch"], 0),
        "Loop" => (&["body"], 1),
        "Scan" => (&["body"], 0),
        _ => return None,
    };
    let n = node.outputs.len();
    for attr in attrs {
        let Some(g) = node.attr_graph(attr) else {
            continue;
        };
        let types = scope_types(g, outer);
        let v: Vec<Option<DType>> = g
            .outputs
            .iter()
            .skip(skip)
            .map(|o| types.get(&o.name).copied())
            .collect();
        if v.len() == n && v.iter().all(|t| t.is_some()) {
            return Some(v);
        }
    }
    None
}

fn constant_dtype(node: &Node) -> Option<DType> {
    for (name, a) in &node.attrs {
        match (name.as_str(), a) {
            ("value" | "sparse_value", Attribute::Tensor(t)) => return Some(t.dtype()),
            ("value_float" | "value_floats", _) => return Some(DType::F32),
            ("value_int" | "value_ints", _) => return Some(DType::I64),
            ("value_string" | "value_strings", _) => return Some(DType::Str),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn node(op: &str, n_out: usize, attrs: &[(&str, Attribute)]) -> Node {
        Node {
            name: "n".into(),
            op_type: op.into(),
            domain: String::new(),
            inputs: vec![],
            outputs: (0..n_out).map(|i| format!("o{i}")).collect(),
            attrs: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect::<BTreeMap<_, _>>(),
            ..Default::default()
        }
    }

    #[test]
    fn common_rules() {
        let f16 = Some(DType::F16);
        let f32 = Some(DType::F32);
        assert_eq!(
            infer_outputs(&node("Add", 1, &[]), &[f16, f16]),
            Some(vec![f16])
        );
        assert_eq!(
            infer_outputs(&node("Shape", 1, &[]), &[f16]),
            Some(vec![Some(DType::I64)])
        );
        assert_eq!(
            infer_outputs(&node("Cast", 1, &[("to", Attribute::Int(1))]), &[f16]),
            Some(vec![f32])
        );
        assert_eq!(
            infer_outputs(&node("Where", 1, &[]), &[Some(DType::Bool), f16, f16]),
            Some(vec![f16])
        );
        assert_eq!(
            infer_outputs(&node("LayerNormalization", 3, &[]), &[f16, f16, f16]),
            Some(vec![f16, f32, f32])
        );
        assert_eq!(
            infer_outputs(&node("TopK", 2, &[]), &[f16, Some(DType::I64)]),
            Some(vec![f16, Some(DType::I64)])
        );
        assert_eq!(infer_outputs(&node("If", 1, &[]), &[]), None);
        let mut custom = node("Foo", 1, &[]);
        custom.domain = "com.example".into();
        assert_eq!(infer_outputs(&custom, &[f32]), None);
    }

    #[test]
    fn contrib_rules() {
        let f16 = Some(DType::F16);
        let f32 = Some(DType::F32);
        let u8 = Some(DType::U8);
        let contrib = |op: &str, n_out: usize| {
            let mut n = node(op, n_out, &[]);
            n.domain = "com.microsoft".into();
            n
        };
        assert_eq!(
            infer_outputs(
                &contrib("SkipSimplifiedLayerNormalization", 4),
                &[f16, f16, f16]
            ),
            Some(vec![f16, f32, f32, f16])
        );
        assert_eq!(
            infer_outputs(
                &contrib("GroupQueryAttention", 3),
                &[f16, None, None, f16, f16]
            ),
            Some(vec![f16, f16, f16])
        );
        assert_eq!(
            infer_outputs(&contrib("MatMulNBits", 1), &[f16, u8, f16]),
            Some(vec![f16])
        );
        assert_eq!(
            infer_outputs(
                &contrib("GatherBlockQuantized", 1),
                &[u8, Some(DType::I64), f16]
            ),
            Some(vec![f16])
        );
        assert_eq!(
            infer_outputs(&node("SimplifiedLayerNormalization", 2, &[]), &[f16, f32]),
            Some(vec![f32, f32])
        );
        assert_eq!(
            infer_outputs(&contrib("MRotaryEmbedding", 1), &[f16, None, f16, f16]),
            Some(vec![f16])
        );
        assert_eq!(
            infer_outputs(&contrib("GatedAdd", 1), &[f16, f16, f16]),
            Some(vec![f16])
        );
        assert_eq!(
            infer_outputs(&contrib("SparseAttention", 3), &[f16, f16, f16, f16, f16]),
            Some(vec![f16, f16, f16])
        );
        assert_eq!(
            infer_outputs(
                &contrib("VarlenCausalConvWithState", 3),
                &[f16, f16, None, f16]
            ),
            Some(vec![f16, f16, f16])
        );
        assert_eq!(
            infer_outputs(&contrib("CausalConvWithState", 2), &[f32, f32]),
            Some(vec![f32, f32])
        );
        assert_eq!(
            infer_outputs(&contrib("GatedRMSNorm", 1), &[f16, f16, f16]),
            Some(vec![f16])
        );
        assert_eq!(
            infer_outputs(&contrib("LinearAttentionGate", 2), &[f16, f32, f32, f16]),
            Some(vec![f16, f16])
        );
        assert_eq!(
            infer_outputs(
                &contrib("GatedDeltaNet", 2),
                &[f16, f16, f16, None, f32, f32, f32, f32, f32]
            ),
            Some(vec![f16, f32])
        );
        assert_eq!(
            infer_outputs(&contrib("LinearAttention", 2), &[f16, f16, f16, f32]),
            Some(vec![f16, f32])
        );
        assert_eq!(
            infer_outputs(&contrib("LinearAttention", 2), &[f32, f32, f32]),
            Some(vec![f32, f32])
        );
        assert!(has_float16_kernel(&contrib("LinearAttentionGate", 2)));
        assert!(has_float16_kernel(&contrib("GatedDeltaNet", 2)));
        assert!(!has_float16_kernel(&contrib("LinearAttention", 2)));
        assert!(has_float16_kernel(&contrib("GatedRMSNorm", 1)));
        assert!(has_float16_kernel(&contrib("VarlenCausalConvWithState", 2)));
        assert!(!has_float16_kernel(&contrib("CausalConvWithState", 2)));
        assert_eq!(infer_outputs(&contrib("NoSuchOp", 1), &[f32]), None);
    }
}
