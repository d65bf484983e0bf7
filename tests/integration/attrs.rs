//! Bad attributes are load errors: every command that loads a model rejects them with one
//! line naming node, op and attribute, exits non-zero and writes nothing.

use crate::common::{mixprec, text};
use mixprec::onnx::proto::*;
use prost::Message;

/// X [1, 1, 4, 4] -> Conv 'conv1' (3x3 kernel, `pads` as given) -> Y.
fn conv_model(pads: &[i64]) -> Vec<u8> {
    let vi = |name: &str, dims: &[i64]| ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto {
                    dim: dims
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
    let ints = |name: &str, v: &[i64]| AttributeProto {
        name: Some(name.into()),
        r#type: Some(attribute_proto::AttributeType::Ints as i32),
        ints: v.to_vec(),
        ..Default::default()
    };
    let w = TensorProto {
        name: Some("w".into()),
        dims: vec![1, 1, 3, 3],
        data_type: Some(1),
        float_data: vec![1.0; 9],
        ..Default::default()
    };
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(GraphProto {
            name: Some("g".into()),
            node: vec![NodeProto {
                name: Some("conv1".into()),
                op_type: Some("Conv".into()),
                input: vec!["x".into(), "w".into()],
                output: vec!["y".into()],
                attribute: vec![ints("kernel_shape", &[3, 3]), ints("pads", pads)],
                ..Default::default()
            }],
            initializer: vec![w],
            input: vec![vi("x", &[1, 1, 4, 4])],
            output: vec![vi("y", &[1, 1, 4, 4])],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

#[test]
fn bad_conv_pads_fail_every_command_at_load() {
    let tmp = tempfile::tempdir().unwrap();
    let good = tmp.path().join("good.onnx");
    std::fs::write(&good, conv_model(&[1, 1, 1, 1])).unwrap();
    let o = mixprec(&["inspect", good.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));

    let bad = tmp.path().join("bad.onnx");
    std::fs::write(&bad, conv_model(&[1, 1, 1])).unwrap();
    let bad = bad.to_str().unwrap();
    let out = tmp.path().join("out.onnx");
    let expected =
        "error: node 'conv1' (Conv): attribute 'pads': expected 4 values (2 spatial dims x 2), got 3";
    for args in [
        vec!["inspect", bad],
        vec!["run", bad],
        vec!["convert", bad, "--fp16", "-o", out.to_str().unwrap()],
    ] {
        let o = mixprec(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded: {}", text(&o));
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors, [expected], "{args:?}: {}", text(&o));
        assert!(!err.contains("panicked"), "{err}");
    }
    assert!(!out.exists(), "a failed convert wrote {}", out.display());
}
