//! Writing a model past protobuf's 2 GiB limit: its large tensors go to an external data file
//! beside it (ONNX's external-data convention), written in one pass with no copy of the data.

use crate::error::{Error, Result};
use crate::onnx::proto;
use prost::Message;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The largest protobuf message protobuf libraries read (2 GiB - 1).
pub const PROTOBUF_LIMIT: usize = i32::MAX as usize;

/// Tensors smaller than this stay inside the model (onnx's `size_threshold` default).
const MIN_EXTERNAL_BYTES: usize = 1024;

/// Offsets of external tensors are multiples of this, so that a loader can read every
/// element type in place from a memory map (and SIMD loads are aligned).
const ALIGN: u64 = 64;

/// Writes `model` to `path` atomically. When its protobuf is larger than `limit` bytes, every
/// initializer of at least 1 KiB stored as raw_data (in the main graph and in subgraphs)
/// moves to `<file name>.data` beside it, at 64-byte aligned offsets, and the model refers to
/// it by `location`/`offset`/`length`. Both files are written under temporary names and
/// renamed into place, so a failure leaves no partial output. Returns the data file's path
/// when one was written.
pub fn write_model_limit(
    path: &Path,
    model: &proto::ModelProto,
    limit: usize,
) -> Result<Option<PathBuf>> {
    let len = model.encoded_len();
    if len <= limit {
        crate::data::write_atomic(path, &model.encode_to_vec())?;
        return Ok(None);
    }
    let file_name = path
        .file_name()
        .ok_or_else(|| Error::Invalid(format!("{}: not a file path", path.display())))?
        .to_string_lossy()
        .into_owned();
    let location = format!("{file_name}.data");
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let data_path = dir.join(&location);
    let tmp_model = dir.join(format!(".{file_name}.tmp-{}", std::process::id()));
    let tmp_data = dir.join(format!(".{location}.tmp-{}", std::process::id()));

    let mut out = model.clone();
    let result = (|| -> Result<()> {
        let f = std::fs::File::create(&tmp_data).map_err(|e| Error::io(&data_path, e))?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        let mut offset = 0u64;
        if let Some(g) = out.graph.as_mut() {
            externalize_graph(g, &location, &mut w, &mut offset)
                .map_err(|e| Error::io(&data_path, e))?;
        }
        let f = w
            .into_inner()
            .map_err(|e| Error::io(&data_path, e.into_error()))?;
        f.sync_all().map_err(|e| Error::io(&data_path, e))?;
        let len = out.encoded_len();
        if len > PROTOBUF_LIMIT {
            return Err(Error::Invalid(format!(
                "{}: the model is {len} bytes without its large tensors, over protobuf's 2 GiB limit",
                path.display()
            )));
        }
        let mut f = std::fs::File::create(&tmp_model).map_err(|e| Error::io(path, e))?;
        f.write_all(&out.encode_to_vec())
            .and_then(|_| f.sync_all())
            .map_err(|e| Error::io(path, e))?;
        std::fs::rename(&tmp_data, &data_path).map_err(|e| Error::io(&data_path, e))?;
        if let Err(e) = std::fs::rename(&tmp_model, path) {
            let _ = std::fs::remove_file(&data_path);
            return Err(Error::io(path, e));
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp_data);
        let _ = std::fs::remove_file(&tmp_model);
    }
    result.map(|()| Some(data_path))
}

/// Moves the large raw_data initializers of `g` and of its subgraphs to `w`.
fn externalize_graph(
    g: &mut proto::GraphProto,
    location: &str,
    w: &mut impl Write,
    offset: &mut u64,
) -> std::io::Result<()> {
    for t in &mut g.initializer {
        externalize(t, location, w, offset)?;
    }
    for n in &mut g.node {
        for a in &mut n.attribute {
            if let Some(sg) = a.g.as_mut() {
                externalize_graph(sg, location, w, offset)?;
            }
            for sg in &mut a.graphs {
                externalize_graph(sg, location, w, offset)?;
            }
        }
    }
    Ok(())
}

fn externalize(
    t: &mut proto::TensorProto,
    location: &str,
    w: &mut impl Write,
    offset: &mut u64,
) -> std::io::Result<()> {
    let external = proto::tensor_proto::DataLocation::External as i32;
    if t.data_location == Some(external) {
        return Ok(());
    }
    let Some(raw) = t.raw_data.take_if(|r| r.len() >= MIN_EXTERNAL_BYTES) else {
        return Ok(());
    };
    let pad = offset.next_multiple_of(ALIGN) - *offset;
    w.write_all(&[0u8; ALIGN as usize][..pad as usize])?;
    *offset += pad;
    w.write_all(&raw)?;
    let entry = |k: &str, v: String| proto::StringStringEntryProto {
        key: Some(k.to_string()),
        value: Some(v),
    };
    t.external_data = vec![
        entry("location", location.to_string()),
        entry("offset", offset.to_string()),
        entry("length", raw.len().to_string()),
    ];
    t.data_location = Some(external);
    *offset += raw.len() as u64;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::{load_model, tensor_to_proto};
    use crate::tensor::{Tensor, TensorData};

    /// y = (x + a) + b with two 256-element initializers (1 KiB each) and a small one.
    fn model() -> (proto::ModelProto, Vec<(String, Tensor)>) {
        let inits = vec![
            (
                "a".to_string(),
                Tensor::from_f32(vec![256], (0..256).map(|i| i as f32 * 0.5).collect()),
            ),
            (
                "b".to_string(),
                Tensor::from_i64(vec![16, 16], (0..256).map(|i| i - 100).collect()),
            ),
            (
                "c".to_string(),
                Tensor::from_f32(vec![3], vec![1.0, 2.0, 3.0]),
            ),
        ];
        let node = |inputs: &[&str], out: &str| proto::NodeProto {
            op_type: Some("Add".into()),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![out.into()],
            ..Default::default()
        };
        let vi = |name: &str| proto::ValueInfoProto {
            name: Some(name.into()),
            ..Default::default()
        };
        let m = proto::ModelProto {
            ir_version: Some(8),
            opset_import: vec![proto::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(17),
            }],
            graph: Some(proto::GraphProto {
                node: vec![node(&["x", "a"], "h"), node(&["h", "a"], "y")],
                initializer: inits.iter().map(|(n, t)| tensor_to_proto(n, t)).collect(),
                input: vec![vi("x")],
                output: vec![vi("y")],
                ..Default::default()
            }),
            ..Default::default()
        };
        (m, inits)
    }

    #[test]
    fn large_models_get_external_data_that_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let (m, inits) = model();
        // Under the limit: one file, as before.
        let small = dir.path().join("small.onnx");
        assert_eq!(write_model_limit(&small, &m, PROTOBUF_LIMIT).unwrap(), None);
        assert!(!dir.path().join("small.onnx.data").exists());

        let path = dir.path().join("m.onnx");
        let data = write_model_limit(&path, &m, 1000).unwrap().unwrap();
        assert_eq!(data, dir.path().join("m.onnx.data"));
        // a and b moved (aligned), c stayed inline.
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() < 1000, "{}", bytes.len());
        let p = crate::onnx::decode_model(&bytes, &path).unwrap();
        let g = p.graph.unwrap();
        let ext = |t: &proto::TensorProto| {
            t.external_data
                .iter()
                .map(|e| (e.key.clone().unwrap(), e.value.clone().unwrap()))
                .collect::<Vec<_>>()
        };
        let e = ext(&g.initializer[1]);
        assert_eq!(e[0], ("location".into(), "m.onnx.data".into()));
        assert_eq!(e[1].1.parse::<u64>().unwrap() % ALIGN, 0);
        assert!(g.initializer[2].external_data.is_empty());
        assert!(g.initializer[2].raw_data.is_some());
        // mixprec reads back what it wrote, the large tensors in place from the map.
        let loaded = load_model(&path).unwrap();
        for (name, t) in &inits {
            assert_eq!(&loaded.graph.initializers[name], t, "{name}");
        }
        match loaded.graph.initializers["a"].data() {
            TensorData::F32(v) => assert!(v.is_borrowed()),
            other => panic!("{other:?}"),
        }
        // No temporary file is left behind.
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["m.onnx", "m.onnx.data", "small.onnx"]);
    }

    #[test]
    fn a_failed_write_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (m, _) = model();
        // The target is a directory: the final rename fails after both files were written.
        let path = dir.path().join("taken");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("keep"), b"x").unwrap();
        assert!(write_model_limit(&path, &m, 1000).is_err());
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["taken"]);
    }
}
