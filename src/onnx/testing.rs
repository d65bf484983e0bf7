//! Protobuf builders for unit tests (one copy for every module's tests: export, Q/DQ,
//! quantize, schema upgrades).

use super::proto;
use super::Model;
use super::{model_from_proto, tensor_to_proto};
use crate::tensor::{DType, Tensor};
use std::path::Path;

/// A tensor value of element type `elem` with static dimensions.
pub(crate) fn vi(name: &str, elem: DType, dims: &[i64]) -> proto::ValueInfoProto {
    proto::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(proto::TypeProto {
            value: Some(proto::type_proto::Value::TensorType(
                proto::type_proto::Tensor {
                    elem_type: Some(elem.onnx_code()),
                    shape: Some(proto::TensorShapeProto {
                        dim: dims
                            .iter()
                            .map(|&d| proto::tensor_shape_proto::Dimension {
                                value: Some(proto::tensor_shape_proto::dimension::Value::DimValue(
                                    d,
                                )),
                                ..Default::default()
                            })
                            .collect(),
                    }),
                },
            )),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn node(op: &str, name: &str, ins: &[&str], outs: &[&str]) -> proto::NodeProto {
    proto::NodeProto {
        name: Some(name.into()),
        op_type: Some(op.into()),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

pub(crate) fn with_int(mut n: proto::NodeProto, attr: &str, v: i64) -> proto::NodeProto {
    n.attribute.push(proto::AttributeProto {
        name: Some(attr.into()),
        r#type: Some(proto::attribute_proto::AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    });
    n
}

pub(crate) fn with_ints(mut n: proto::NodeProto, attr: &str, v: &[i64]) -> proto::NodeProto {
    n.attribute.push(proto::AttributeProto {
        name: Some(attr.into()),
        r#type: Some(proto::attribute_proto::AttributeType::Ints as i32),
        ints: v.to_vec(),
        ..Default::default()
    });
    n
}

pub(crate) fn with_float(mut n: proto::NodeProto, attr: &str, v: f32) -> proto::NodeProto {
    n.attribute.push(proto::AttributeProto {
        name: Some(attr.into()),
        r#type: Some(proto::attribute_proto::AttributeType::Float as i32),
        f: Some(v),
        ..Default::default()
    });
    n
}

/// A float32 model of the default domain at `opset` (IR 8): `inputs` and `outputs` as
/// (name, dims), initializers from tensors.
pub(crate) fn model_proto(
    nodes: Vec<proto::NodeProto>,
    inits: Vec<(&str, Tensor)>,
    inputs: &[(&str, &[i64])],
    outputs: &[(&str, &[i64])],
    opset: i64,
) -> proto::ModelProto {
    proto::ModelProto {
        ir_version: Some(8),
        opset_import: vec![proto::OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(opset),
        }],
        graph: Some(proto::GraphProto {
            name: Some("g".into()),
            node: nodes,
            initializer: inits.iter().map(|(n, t)| tensor_to_proto(n, t)).collect(),
            input: inputs.iter().map(|(n, d)| vi(n, DType::F32, d)).collect(),
            output: outputs.iter().map(|(n, d)| vi(n, DType::F32, d)).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Loads a built model as `load_model` would (panics: test input).
pub(crate) fn load(p: proto::ModelProto) -> Model {
    model_from_proto(p, Path::new("t.onnx"), Path::new(".")).unwrap()
}
