//! Reading an engine's layer information: the JSON that `trtexec --exportLayerInfo=FILE
//! --profilingVerbosity=detailed` writes (TensorRT's `IEngineInspector::getEngineInformation`
//! in `kJSON` format), and the text of `polygraphy inspect model ENGINE --show layers`.
//!
//! Formats (docs/verify-engine.md cites the sources):
//! - JSON: `{"Layers": [...], "Bindings": [...]}` up to TensorRT 10, `{"Layers": [...],
//!   "I/O Tensors": [...]}` in TensorRT 11, where each I/O tensor is an object (`Name`,
//!   `IOMode`, `DataType`, `Dimensions`, `Location`, `IsShapeInferenceIO`, `ProfileInfo`)
//!   instead of a bare name. With detailed profiling verbosity each layer is an object with
//!   `Name`, `LayerType`, `Inputs`/`Outputs` (each `Name`, `Dimensions`, and
//!   `Format/Datatype` up to TensorRT 10, a data type key and `Format` in TensorRT 11),
//!   optionally `Metadata` (TensorRT >= 8.6: `[ONNX Layer: node]` entries joined by
//!   `\x1e`/`\x1f`); without it each layer is only its name (a string).
//! - Polygraphy: `Layer N | NAME [Op: TYPE]`, then `{tensor [dtype=..., shape=(...),
//!   Format: ...], ...}` for the inputs and ` -> {...}` for the outputs.

use crate::error::{Error, Result};
use std::path::Path;

/// An element type as an engine reports it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum EngineType {
    Float,
    Half,
    BFloat16,
    Int8,
    Fp8,
    Fp4,
    Int4,
    Int32,
    Int64,
    UInt8,
    Bool,
    /// A format string naming no type mixprec knows (kept for the report).
    Other(String),
}

impl EngineType {
    /// The type named in a TensorRT format string ("Row major linear FP16 format",
    /// "Half", "Thirty-two wide channel vectorized row major Int8 format.") or a Polygraphy
    /// dtype ("float16"); None for "N/A due to dynamic shapes", "Unknown format" and "None".
    pub fn parse(s: &str) -> Option<EngineType> {
        let u = s.to_ascii_uppercase();
        if u.trim().is_empty()
            || u.contains("N/A")
            || u.contains("UNKNOWN FORMAT")
            || u.trim() == "NONE"
        {
            return None;
        }
        // More specific names before the names they contain (BFLOAT16 before FLOAT, UINT8
        // before INT8), as Polygraphy's `_TRT_DTYPE_MAP` orders them.
        const KEYS: &[(&str, EngineType)] = &[
            ("BFLOAT16", EngineType::BFloat16),
            ("FLOAT8", EngineType::Fp8),
            ("FP8", EngineType::Fp8),
            ("FLOAT4", EngineType::Fp4),
            ("FP4", EngineType::Fp4),
            ("FLOAT16", EngineType::Half),
            ("HALF", EngineType::Half),
            ("FP16", EngineType::Half),
            ("FLOAT32", EngineType::Float),
            ("FLOAT", EngineType::Float),
            ("FP32", EngineType::Float),
            ("INT64", EngineType::Int64),
            ("INT32", EngineType::Int32),
            ("UINT8", EngineType::UInt8),
            ("INT8", EngineType::Int8),
            ("INT4", EngineType::Int4),
            ("BOOL", EngineType::Bool),
        ];
        for (k, t) in KEYS {
            if u.contains(k) {
                return Some(t.clone());
            }
        }
        Some(EngineType::Other(s.trim().to_string()))
    }

    pub fn name(&self) -> &str {
        match self {
            EngineType::Float => "Float",
            EngineType::Half => "Half",
            EngineType::BFloat16 => "BFloat16",
            EngineType::Int8 => "Int8",
            EngineType::Fp8 => "FP8",
            EngineType::Fp4 => "FP4",
            EngineType::Int4 => "Int4",
            EngineType::Int32 => "Int32",
            EngineType::Int64 => "Int64",
            EngineType::UInt8 => "UInt8",
            EngineType::Bool => "Bool",
            EngineType::Other(s) => s,
        }
    }

    /// A type a layer computes in (floating point or quantized), not an index or a mask.
    pub fn is_numeric(&self) -> bool {
        matches!(
            self,
            EngineType::Float
                | EngineType::Half
                | EngineType::BFloat16
                | EngineType::Int8
                | EngineType::Fp8
                | EngineType::Fp4
                | EngineType::Int4
        )
    }
}

/// One input or output of an engine layer.
#[derive(Clone, Debug, Default)]
pub struct EngineTensor {
    pub name: String,
    /// The format as written (`Row major linear FP16 format`), if any.
    pub format: Option<String>,
    pub dtype: Option<EngineType>,
}

/// One layer of the engine.
#[derive(Clone, Debug, Default)]
pub struct EngineLayer {
    pub index: usize,
    pub name: String,
    /// `LayerType` (JSON) or `Op` (Polygraphy).
    pub layer_type: Option<String>,
    /// TensorRT's `Metadata` field (`[ONNX Layer: node]` entries).
    pub metadata: Option<String>,
    pub inputs: Vec<EngineTensor>,
    pub outputs: Vec<EngineTensor>,
}

/// One input or output tensor of the engine: a `Bindings` name (TensorRT <= 10, nothing
/// else known) or an `I/O Tensors` object (TensorRT 11).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IoTensor {
    pub name: String,
    /// `IOMode`: `Input` or `Output`.
    pub mode: Option<String>,
    /// `DataType` (`Float`, `Half`, ...).
    pub dtype: Option<EngineType>,
    /// `Dimensions` (-1 for a dynamic dimension).
    pub dimensions: Option<Vec<i64>>,
    /// `IsShapeInferenceIO`: a shape tensor, not data.
    pub shape_io: bool,
}

/// An engine's layers as read from a file.
#[derive(Clone, Debug, Default)]
pub struct LayerInfo {
    pub layers: Vec<EngineLayer>,
    /// The engine's I/O tensors, from `Bindings` or `I/O Tensors` (empty when the file has
    /// neither, e.g. one layer's information or Polygraphy's text).
    pub io_tensors: Vec<IoTensor>,
    /// False when the file holds names only (the engine was not built with
    /// `--profilingVerbosity=detailed`): nothing about types can be checked.
    pub detailed: bool,
    /// Things in the file that were not understood (a key of unexpected type...).
    pub warnings: Vec<String>,
}

/// Reads a layer-information file: JSON (`trtexec --exportLayerInfo`) when its first
/// non-blank character is `{` or `[`, otherwise Polygraphy's text.
pub fn read_layer_info(path: &Path) -> Result<LayerInfo> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::Invalid(format!("{}: cannot read: {e}", path.display())))?;
    let text = String::from_utf8_lossy(&bytes);
    let file = path.display().to_string();
    match text.trim_start().chars().next() {
        Some('{') | Some('[') => parse_json(&text, &file),
        _ => parse_polygraphy(&text, &file),
    }
}

/// Parses `trtexec --exportLayerInfo` JSON; `file` names the source in messages.
pub fn parse_json(text: &str, file: &str) -> Result<LayerInfo> {
    let v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| Error::Invalid(format!("{file}: not valid layer-information JSON: {e}")))?;
    let bad = |what: &str| {
        Error::Invalid(format!(
            "{file}: not a TensorRT layer-information file ({what}); expected {{\"Layers\": [...], \"Bindings\": [...]}} (TensorRT <= 10) or {{\"Layers\": [...], \"I/O Tensors\": [...]}} (TensorRT 11) as `trtexec --exportLayerInfo` writes it"
        ))
    };
    // getLayerInformation of one layer is the bare layer object; accept a list of them too.
    let (layers_v, top) = match &v {
        serde_json::Value::Object(m) if m.contains_key("Layers") => {
            (m.get("Layers").cloned(), Some(m))
        }
        serde_json::Value::Object(m) if m.contains_key("Name") => {
            (Some(serde_json::Value::Array(vec![v.clone()])), None)
        }
        serde_json::Value::Array(_) => (Some(v.clone()), None),
        _ => return Err(bad("no \"Layers\" key")),
    };
    let layers_v = layers_v.ok_or_else(|| bad("no \"Layers\" key"))?;
    let arr = layers_v
        .as_array()
        .ok_or_else(|| bad("\"Layers\" is not a list"))?;
    let mut info = LayerInfo {
        detailed: true,
        ..Default::default()
    };
    if let Some(top) = top {
        info.io_tensors = json_io_tensors(top, &mut info.warnings);
    }
    let mut names_only = 0;
    for (index, l) in arr.iter().enumerate() {
        match l {
            serde_json::Value::String(name) => {
                names_only += 1;
                info.layers.push(EngineLayer {
                    index,
                    name: name.clone(),
                    ..Default::default()
                });
            }
            serde_json::Value::Object(m) => {
                let name = match m.get("Name").and_then(|n| n.as_str()) {
                    Some(n) => n.to_string(),
                    None => {
                        info.warnings
                            .push(format!("layer {index} has no \"Name\"; skipped"));
                        continue;
                    }
                };
                let s = |k: &str| m.get(k).and_then(|x| x.as_str()).map(str::to_string);
                info.layers.push(EngineLayer {
                    index,
                    name,
                    layer_type: s("LayerType"),
                    metadata: s("Metadata"),
                    inputs: json_tensors(m.get("Inputs"), &mut info.warnings, index),
                    outputs: json_tensors(m.get("Outputs"), &mut info.warnings, index),
                });
            }
            _ => info.warnings.push(format!(
                "layer {index} is neither a name nor an object; skipped"
            )),
        }
    }
    if names_only > 0 {
        info.detailed = false;
    }
    Ok(info)
}

/// The engine's I/O tensors: TensorRT 11's `"I/O Tensors"` objects, or TensorRT <= 10's
/// `"Bindings"` names (both read; a file has one or the other).
fn json_io_tensors(
    top: &serde_json::Map<String, serde_json::Value>,
    warnings: &mut Vec<String>,
) -> Vec<IoTensor> {
    let mut out = Vec::new();
    if let Some(v) = top.get("I/O Tensors") {
        let Some(arr) = v.as_array() else {
            warnings.push("\"I/O Tensors\" is not a list; ignored".into());
            return out;
        };
        for (i, t) in arr.iter().enumerate() {
            let Some(name) = t.get("Name").and_then(|n| n.as_str()) else {
                warnings.push(format!("I/O tensor {i} has no \"Name\"; skipped"));
                continue;
            };
            let s = |k: &str| t.get(k).and_then(|x| x.as_str());
            out.push(IoTensor {
                name: name.to_string(),
                mode: s("IOMode").map(str::to_string),
                dtype: s("DataType")
                    .or_else(|| s("Datatype"))
                    .and_then(EngineType::parse),
                dimensions: t
                    .get("Dimensions")
                    .and_then(|d| d.as_array())
                    .and_then(|d| d.iter().map(|x| x.as_i64()).collect()),
                shape_io: t.get("IsShapeInferenceIO").and_then(|b| b.as_bool()) == Some(true),
            });
        }
    } else if let Some(v) = top.get("Bindings") {
        let Some(arr) = v.as_array() else {
            warnings.push("\"Bindings\" is not a list; ignored".into());
            return out;
        };
        out.extend(arr.iter().filter_map(|x| x.as_str()).map(|n| IoTensor {
            name: n.to_string(),
            ..Default::default()
        }));
    }
    out
}

fn json_tensors(
    v: Option<&serde_json::Value>,
    warnings: &mut Vec<String>,
    layer: usize,
) -> Vec<EngineTensor> {
    let Some(v) = v else { return Vec::new() };
    let Some(arr) = v.as_array() else {
        warnings.push(format!(
            "layer {layer}: \"Inputs\"/\"Outputs\" is not a list; ignored"
        ));
        return Vec::new();
    };
    arr.iter()
        .filter_map(|t| {
            let m = t.as_object()?;
            let s = |k: &str| m.get(k).and_then(|x| x.as_str()).map(str::to_string);
            // TensorRT <= 10: one "Format/Datatype" string; TensorRT 11 splits it into a
            // data type key and "Format" (Polygraphy 0.53's engine reader reads "Datatype";
            // TensorRT 11's own I/O tensor objects spell it "DataType": both are read).
            let datatype = s("DataType").or_else(|| s("Datatype"));
            let format = s("Format/Datatype")
                .or_else(|| s("Format/DataType"))
                .or_else(|| {
                    let parts: Vec<String> = datatype.iter().cloned().chain(s("Format")).collect();
                    (!parts.is_empty()).then(|| parts.join(" "))
                });
            let dtype = datatype
                .as_deref()
                .and_then(EngineType::parse)
                .or_else(|| format.as_deref().and_then(EngineType::parse));
            Some(EngineTensor {
                name: s("Name").unwrap_or_default(),
                format,
                dtype,
            })
        })
        .collect()
}

/// Parses the text of `polygraphy inspect model ENGINE --show layers`.
pub fn parse_polygraphy(text: &str, file: &str) -> Result<LayerInfo> {
    let header =
        regex::Regex::new(r"^\s*Layer\s+(\d+)\s*\|\s(.*)\s\[Op:\s(.*)\]\s*$").expect("valid regex");
    let mut info = LayerInfo {
        detailed: true,
        ..Default::default()
    };
    let mut cur: Option<EngineLayer> = None;
    let mut outputs = false;
    for line in text.lines() {
        if let Some(c) = header.captures(line) {
            if let Some(l) = cur.take() {
                info.layers.push(l);
            }
            cur = Some(EngineLayer {
                index: c[1].parse().unwrap_or(info.layers.len()),
                name: c[2].trim().to_string(),
                layer_type: Some(c[3].trim().to_string()),
                ..Default::default()
            });
            outputs = false;
            continue;
        }
        let Some(layer) = cur.as_mut() else { continue };
        let mut t = line.trim();
        if t.is_empty() {
            info.layers.push(cur.take().expect("a layer"));
            continue;
        }
        if let Some(rest) = t.strip_prefix("{} -> ") {
            outputs = true;
            t = rest;
        } else if let Some(rest) = t.strip_prefix("-> ") {
            outputs = true;
            t = rest;
        }
        let t = t.strip_prefix('{').unwrap_or(t);
        let t = t
            .strip_suffix('}')
            .or_else(|| t.strip_suffix(','))
            .unwrap_or(t)
            .trim();
        if t.is_empty() {
            continue;
        }
        let tensor = polygraphy_tensor(t);
        if outputs {
            layer.outputs.push(tensor);
        } else {
            layer.inputs.push(tensor);
        }
    }
    if let Some(l) = cur.take() {
        info.layers.push(l);
    }
    if info.layers.is_empty() {
        return Err(Error::Invalid(format!(
            "{file}: no layers found: expected the text of `polygraphy inspect model ENGINE --show layers` (lines `Layer N | NAME [Op: TYPE]`) or `trtexec --exportLayerInfo` JSON"
        )));
    }
    Ok(info)
}

/// `name [dtype=float16, shape=(1, 2), Format: Row major linear FP16 format]`.
fn polygraphy_tensor(t: &str) -> EngineTensor {
    let meta_at = [" [dtype=", " [shape=", " [Format: "]
        .iter()
        .filter_map(|k| t.rfind(k))
        .max();
    let Some(at) = meta_at.filter(|_| t.ends_with(']')) else {
        return EngineTensor {
            name: t.to_string(),
            ..Default::default()
        };
    };
    let name = t[..at].to_string();
    let meta = &t[at + 2..t.len() - 1];
    let mut dtype = None;
    let mut format = None;
    if let Some(d) = meta.strip_prefix("dtype=") {
        let d = d.split(',').next().unwrap_or("").trim();
        dtype = EngineType::parse(d);
    }
    if let Some(i) = meta.find("Format: ") {
        let f = meta[i + "Format: ".len()..].trim().to_string();
        if dtype.is_none() {
            dtype = EngineType::parse(&f);
        }
        format = Some(f);
    }
    EngineTensor {
        name,
        format,
        dtype,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_strings_name_their_types() {
        let cases = [
            ("Row major linear FP16 format", Some(EngineType::Half)),
            (
                "Channel major FP32 format where channel % 4 == 0",
                Some(EngineType::Float),
            ),
            (
                "Thirty-two wide channel vectorized row major Int8 format.",
                Some(EngineType::Int8),
            ),
            (
                "Row major linear BFloat16 format",
                Some(EngineType::BFloat16),
            ),
            ("Row major linear FP8 format", Some(EngineType::Fp8)),
            ("Half", Some(EngineType::Half)),
            ("Float", Some(EngineType::Float)),
            ("Row major linear UInt8 format", Some(EngineType::UInt8)),
            ("float8e4m3fn", Some(EngineType::Fp8)),
            ("N/A due to dynamic shapes", None),
            ("Unknown format", None),
        ];
        for (s, want) in cases {
            assert_eq!(EngineType::parse(s), want, "{s}");
        }
    }

    #[test]
    fn json_names_only_and_trt11_split_keys() {
        let names = parse_json(r#"{"Layers": ["a + b", "c"], "Bindings": ["x"]}"#, "f").unwrap();
        assert!(!names.detailed);
        assert_eq!(names.layers[0].name, "a + b");
        assert_eq!(names.io_tensors[0].name, "x");
        assert_eq!(names.io_tensors[0].mode, None);
        let t11 = parse_json(
            r#"{"Layers": [{"Name": "c", "LayerType": "CaskConvolution",
                "Inputs": [{"Name": "x", "Datatype": "Half", "Format": "Row major linear"}],
                "Outputs": [{"Name": "y", "Format/Datatype": "Row major linear FP32"}]}]}"#,
            "f",
        )
        .unwrap();
        assert!(t11.detailed);
        assert_eq!(t11.layers[0].inputs[0].dtype, Some(EngineType::Half));
        assert_eq!(t11.layers[0].outputs[0].dtype, Some(EngineType::Float));
        let t11 = parse_json(
            r#"{"Layers": [{"Name": "c", "Inputs": [{"Name": "x", "DataType": "Half", "Format": "Row major linear FP16 format (kLINEAR)"}]}],
                "I/O Tensors": [
                  {"Name": "x", "IOMode": "Input", "DataType": "Float", "Dimensions": [1, -1],
                   "Location": "Device", "IsShapeInferenceIO": false,
                   "ProfileInfo": [{"MinShape": [1, 1], "OptShape": [1, 4], "MaxShape": [1, 8], "Format": "Row major linear FP32 format (kLINEAR)"}]},
                  {"Name": "n", "IOMode": "Output", "DataType": "Int64", "Dimensions": [1], "IsShapeInferenceIO": true},
                  {"IOMode": "Output"}]}"#,
            "f",
        )
        .unwrap();
        assert_eq!(t11.layers[0].inputs[0].dtype, Some(EngineType::Half));
        assert_eq!(
            t11.io_tensors,
            [
                IoTensor {
                    name: "x".into(),
                    mode: Some("Input".into()),
                    dtype: Some(EngineType::Float),
                    dimensions: Some(vec![1, -1]),
                    shape_io: false,
                },
                IoTensor {
                    name: "n".into(),
                    mode: Some("Output".into()),
                    dtype: Some(EngineType::Int64),
                    dimensions: Some(vec![1]),
                    shape_io: true,
                },
            ]
        );
        assert_eq!(t11.warnings, ["I/O tensor 2 has no \"Name\"; skipped"]);
        let e = parse_json("{\"Layers\": [", "layers.json")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("layers.json: not valid layer-information JSON"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
        let e = parse_json("{\"x\": 1}", "l.json").unwrap_err().to_string();
        assert!(e.contains("no \"Layers\" key"), "{e}");
    }

    #[test]
    fn polygraphy_text_layers() {
        let text = "---- 2 Layer(s) ----\n\
Layer 0    | conv1 + relu1 [Op: CaskConvolution]\n    {x [dtype=float32, shape=(1, 3), Format: Row major linear FP32]}\n     -> {r [dtype=float16, shape=(1, 3), Format: Row major linear FP16 format]}\n\n\
Layer 1    | add [Op: PointWise]\n    {r [dtype=float16, shape=(1, 3)],\n     y [dtype=float16, shape=(1, 3)]}\n     -> {z [dtype=float16, shape=(1, 3)]}\n\n";
        let info = parse_polygraphy(text, "t").unwrap();
        assert_eq!(info.layers.len(), 2);
        assert_eq!(info.layers[0].name, "conv1 + relu1");
        assert_eq!(info.layers[0].inputs[0].dtype, Some(EngineType::Float));
        assert_eq!(info.layers[0].outputs[0].name, "r");
        assert_eq!(info.layers[0].outputs[0].dtype, Some(EngineType::Half));
        assert_eq!(info.layers[1].inputs.len(), 2);
        assert_eq!(info.layers[1].inputs[1].name, "y");
        assert!(parse_polygraphy("hello", "t.txt").is_err());
    }
}
