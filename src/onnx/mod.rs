//! ONNX protobuf ⇄ graph IR: model loading (with external data), tensor conversion.

pub mod proto;
#[cfg(test)]
pub(crate) mod testing;

use crate::error::{Error, Result};
use crate::graph::{Attribute, Dim, Graph, Node, ValueInfo};
use crate::tensor::{Buf, DType, Tensor, TensorData};
use half::{bf16, f16};
use prost::bytes::Bytes;
use prost::Message;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

/// A loaded model: its main graph plus the facts `inspect` shows.
#[derive(Clone, Debug)]
pub struct Model {
    pub path: PathBuf,
    pub graph: Graph,
    pub producer: String,
    /// The decoded protobuf the graph was built from (export starts from it; every IR node's
    /// [`Node::pos`] indexes its graph's node list here).
    pub proto: std::sync::Arc<proto::ModelProto>,
}

/// Reads and parses an ONNX file, resolving external data relative to the file's folder,
/// sorting nodes topologically and naming unnamed ones.
///
/// The file is memory-mapped, and so are external-data files: initializers whose bytes are
/// little-endian and aligned for their type are read in place ([`Buf`]), so loading reads
/// none of their bytes and the operating system pages them in when a kernel touches them.
/// Unaligned data (raw_data inside the protobuf often is) and types stored differently from
/// their memory form (bool, 4-bit) are copied. Changing a model file while it is loaded is
/// not supported.
pub fn load_model(path: impl AsRef<Path>) -> Result<Model> {
    let path = path.as_ref();
    let bytes = map_file(path).map_err(|e| Error::io(path, e))?;
    let proto = decode_model_bytes(bytes, path)?;
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    model_from_proto(proto, path, &base)
}

/// The bytes of a file, memory-mapped (read-only; an empty file is empty bytes).
pub fn map_file(path: &Path) -> std::io::Result<Bytes> {
    let f = std::fs::File::open(path)?;
    if f.metadata()?.len() == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: the map is read-only and private to this process; like every tool that maps
    // its inputs, mixprec requires that the file is not truncated or rewritten while loaded.
    let map = unsafe { memmap2::Mmap::map(&f)? };
    Ok(Bytes::from_owner(crate::mapped::MappedFile::new(map)))
}

/// Decodes the protobuf bytes of a model (`raw_data` fields are copied out of `bytes`; see
/// [`decode_model_bytes`] for the form that borrows them).
pub fn decode_model(bytes: &[u8], path: &Path) -> Result<proto::ModelProto> {
    check_decoded(proto::ModelProto::decode(bytes), bytes.is_empty(), path)
}

/// Decodes a model from shared bytes (a memory map): every `raw_data` field of the result is
/// a slice of `bytes`, not a copy.
pub fn decode_model_bytes(bytes: Bytes, path: &Path) -> Result<proto::ModelProto> {
    let empty = bytes.is_empty();
    check_decoded(proto::ModelProto::decode(bytes), empty, path)
}

fn check_decoded(
    decoded: std::result::Result<proto::ModelProto, prost::DecodeError>,
    empty: bool,
    path: &Path,
) -> Result<proto::ModelProto> {
    let bad = |msg: String| Error::Model {
        path: path.to_path_buf(),
        msg,
    };
    if empty {
        return Err(bad("the file is empty".into()));
    }
    let model = decoded.map_err(|e| {
        bad(format!(
            "protobuf decoding failed ({e}); is the file truncated or not ONNX?"
        ))
    })?;
    if model.graph.is_none() {
        return Err(bad("the model has no graph".into()));
    }
    if model.ir_version.unwrap_or(0) <= 0 && model.opset_import.is_empty() {
        return Err(bad(
            "no ir_version and no opset_import: not an ONNX model".into()
        ));
    }
    Ok(model)
}

/// Converts a decoded model into the IR.
pub fn model_from_proto(model: proto::ModelProto, path: &Path, base_dir: &Path) -> Result<Model> {
    let bad = |msg: String| Error::Model {
        path: path.to_path_buf(),
        msg,
    };
    let mut opsets = BTreeMap::new();
    for o in &model.opset_import {
        let domain = o.domain.clone().unwrap_or_default();
        let domain = if domain == "ai.onnx" {
            String::new()
        } else {
            domain
        };
        opsets.insert(domain, o.version.unwrap_or(1));
    }
    if model.opset_import.is_empty() {
        // IR version 2 and older models carry no opset_import; they are opset 1.
        opsets.insert(String::new(), 1);
    }
    let g = model
        .graph
        .as_ref()
        .ok_or_else(|| bad("the model has no graph".into()))?;
    let mut ext = ExternalData::new(base_dir);
    let ir_version = model.ir_version.unwrap_or(0);
    let scope = Scope {
        opsets: &opsets,
        ir_version,
        next_id: std::cell::Cell::new(0),
    };
    let graph = graph_from_proto(g, &mut ext, &scope, None).map_err(bad)?;
    crate::ops::attrs::parse_graph(&graph)?;
    Ok(Model {
        path: path.to_path_buf(),
        graph,
        producer: format!(
            "{} {}",
            model.producer_name.as_deref().unwrap_or_default(),
            model.producer_version.as_deref().unwrap_or_default()
        )
        .trim()
        .to_string(),
        proto: std::sync::Arc::new(model),
    })
}

/// What every graph of a model shares.
struct Scope<'a> {
    opsets: &'a BTreeMap<String, i64>,
    ir_version: i64,
    /// The next node id ([`Node::id`]).
    next_id: std::cell::Cell<usize>,
}

/// Converts a graph. `outer` is None for the main graph; for a subgraph, every value its
/// enclosing graphs define (it may read them by name). The graph comes back sorted and named,
/// its subgraphs too, and every outer-scope reference checked.
fn graph_from_proto(
    g: &proto::GraphProto,
    ext: &mut ExternalData,
    scope: &Scope,
    outer: Option<&HashSet<String>>,
) -> std::result::Result<Graph, String> {
    let mut initializers = HashMap::new();
    for t in &g.initializer {
        let name = t.name.clone().unwrap_or_default();
        let tensor = tensor_from_proto(t, Some(&mut *ext))
            .map_err(|e| format!("initializer '{name}': {e}"))?;
        initializers.insert(name, tensor);
    }
    for st in &g.sparse_initializer {
        let name = st
            .values
            .as_ref()
            .and_then(|v| v.name.clone())
            .unwrap_or_default();
        let tensor =
            sparse_from_proto(st, ext).map_err(|e| format!("sparse initializer '{name}': {e}"))?;
        initializers.insert(name, tensor);
    }

    // The main graph's initializers that it also lists as inputs (a subgraph's inputs are
    // its parameters, never defaults of initializers).
    let overridable = g
        .input
        .iter()
        .filter_map(|v| v.name.clone())
        .filter(|n| outer.is_none() && initializers.contains_key(n))
        .collect();
    // A subgraph's inputs are its formal parameters (positional), all of them.
    let inputs = g
        .input
        .iter()
        .filter(|v| outer.is_some() || !initializers.contains_key(v.name.as_deref().unwrap_or("")))
        .map(value_info_from_proto)
        .collect();
    let outputs = g.output.iter().map(value_info_from_proto).collect();
    let value_info = g
        .value_info
        .iter()
        .map(|v| {
            let vi = value_info_from_proto(v);
            (vi.name.clone(), vi)
        })
        .collect();

    // What a subgraph of one of this graph's nodes may read: everything visible here.
    let has_subgraphs = g.node.iter().any(|n| {
        n.attribute
            .iter()
            .any(|a| a.g.is_some() || !a.graphs.is_empty())
    });
    let mut visible: HashSet<String> = HashSet::new();
    if has_subgraphs {
        visible = outer.cloned().unwrap_or_default();
        visible.extend(initializers.keys().cloned());
        visible.extend(g.input.iter().filter_map(|v| v.name.clone()));
        for n in &g.node {
            visible.extend(n.output.iter().filter(|o| !o.is_empty()).cloned());
        }
    }

    let mut nodes = Vec::with_capacity(g.node.len());
    for (i, n) in g.node.iter().enumerate() {
        let name = n.name.clone().unwrap_or_default();
        let op_type = n.op_type.clone().unwrap_or_default();
        let who = if name.is_empty() {
            format!("node #{i} ({op_type})")
        } else {
            format!("node '{name}' ({op_type})")
        };
        let id = scope.next_id.get();
        scope.next_id.set(id + 1);
        let mut attrs = BTreeMap::new();
        for a in &n.attribute {
            let aname = a.name.clone().unwrap_or_default();
            let value = attribute_from_proto(
                a,
                ext,
                &mut |sg: &proto::GraphProto, ext: &mut ExternalData| {
                    let sub = graph_from_proto(sg, ext, scope, Some(&visible))?;
                    if let Some(r) = sub.outer_refs().iter().find(|r| !visible.contains(*r)) {
                        return Err(format!(
                        "subgraph reads '{r}', which neither it nor any enclosing graph defines"
                    ));
                    }
                    Ok(sub)
                },
            )
            .map_err(|e| format!("{who}, attribute '{aname}': {e}"))?;
            attrs.insert(aname, value);
        }
        nodes.push(Node {
            id,
            pos: Some(i),
            name,
            op_type,
            domain: n.domain.clone().unwrap_or_default(),
            parsed: Default::default(),
            inputs: n.input.clone(),
            outputs: n.output.clone(),
            attrs,
        });
    }

    let mut graph = Graph {
        name: g.name.clone().unwrap_or_default(),
        nodes,
        initializers,
        overridable,
        inputs,
        outputs,
        value_info,
        opsets: scope.opsets.clone(),
        ir_version: scope.ir_version,
        folded: HashMap::new(),
        value_index: Default::default(),
    };
    match outer {
        None => graph.sort_topologically(),
        Some(o) => graph.sort_topologically_in(o),
    }
    .map_err(|e| match outer {
        None => e.to_string(),
        Some(_) => format!("in subgraph '{}': {e}", graph.name),
    })?;
    graph.name_unnamed_nodes();
    // Folding starts at the main graph: a subgraph folds over its enclosing graphs' weights too.
    if outer.is_none() {
        crate::fold::fold_weights(&mut graph);
    }
    Ok(graph)
}

fn value_info_from_proto(v: &proto::ValueInfoProto) -> ValueInfo {
    let name = v.name.clone().unwrap_or_default();
    let mut dtype = None;
    let mut shape = None;
    if let Some(proto::type_proto::Value::TensorType(t)) =
        v.r#type.as_ref().and_then(|t| t.value.as_ref())
    {
        dtype = t.elem_type.and_then(DType::from_onnx);
        shape = t.shape.as_ref().map(|s| {
            s.dim
                .iter()
                .map(|d| match &d.value {
                    Some(proto::tensor_shape_proto::dimension::Value::DimValue(v)) if *v >= 0 => {
                        Dim::Fixed(*v as usize)
                    }
                    Some(proto::tensor_shape_proto::dimension::Value::DimParam(p))
                        if !p.is_empty() =>
                    {
                        Dim::Param(p.clone())
                    }
                    _ => Dim::Unknown,
                })
                .collect()
        });
    }
    ValueInfo { name, dtype, shape }
}

/// A subgraph converter (it needs the enclosing scope, which the caller knows).
type SubgraphFn<'a> =
    dyn FnMut(&proto::GraphProto, &mut ExternalData) -> std::result::Result<Graph, String> + 'a;

fn attribute_from_proto(
    a: &proto::AttributeProto,
    ext: &mut ExternalData,
    subgraph: &mut SubgraphFn,
) -> Result<Attribute, String> {
    use proto::attribute_proto::AttributeType as T;
    let ty = a
        .r#type
        .and_then(|t| T::try_from(t).ok())
        .unwrap_or(T::Undefined);
    let ty = if ty == T::Undefined {
        // Old files may omit the type: infer it from the field that is set.
        if a.f.is_some() {
            T::Float
        } else if a.i.is_some() {
            T::Int
        } else if a.s.is_some() {
            T::String
        } else if a.t.is_some() {
            T::Tensor
        } else if a.g.is_some() {
            T::Graph
        } else if !a.floats.is_empty() {
            T::Floats
        } else if !a.ints.is_empty() {
            T::Ints
        } else if !a.strings.is_empty() {
            T::Strings
        } else {
            T::Ints
        }
    } else {
        ty
    };
    if a.ref_attr_name.is_some() {
        return Err("attribute references (functions) are not supported".into());
    }
    Ok(match ty {
        T::Float => Attribute::Float(a.f.unwrap_or(0.0)),
        T::Int => Attribute::Int(a.i.unwrap_or(0)),
        T::String => {
            Attribute::String(String::from_utf8_lossy(a.s.as_deref().unwrap_or(&[])).into_owned())
        }
        T::Tensor => Attribute::Tensor(tensor_from_proto(
            a.t.as_ref().ok_or("tensor attribute without a tensor")?,
            Some(ext),
        )?),
        T::SparseTensor => match &a.sparse_tensor {
            Some(st) => Attribute::Tensor(sparse_from_proto(st, ext)?),
            None => return Err("sparse tensor attribute without a tensor".into()),
        },
        T::Floats => Attribute::Floats(a.floats.clone()),
        T::Ints => Attribute::Ints(a.ints.clone()),
        T::Strings => Attribute::Strings(
            a.strings
                .iter()
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect(),
        ),
        T::Graph => Attribute::Graph(std::sync::Arc::new(subgraph(
            a.g.as_ref().ok_or("graph attribute without a graph")?,
            ext,
        )?)),
        T::Graphs => Attribute::Graphs(
            a.graphs
                .iter()
                .map(|g| subgraph(g, ext).map(std::sync::Arc::new))
                .collect::<Result<_, _>>()?,
        ),
        T::Tensors | T::SparseTensors => Attribute::Unsupported("tensors"),
        T::TypeProto | T::TypeProtos => Attribute::Unsupported("type"),
        T::Undefined => Attribute::Unsupported("undefined"),
    })
}

/// Resolves external tensor data: each data file is memory-mapped once, and a tensor's bytes
/// are a slice of the map (nothing is read until a kernel touches them).
pub struct ExternalData {
    base: PathBuf,
    files: HashMap<String, Bytes>,
}

impl ExternalData {
    pub fn new(base: &Path) -> ExternalData {
        ExternalData {
            base: base.to_path_buf(),
            files: HashMap::new(),
        }
    }

    /// The bytes `offset..offset + length` of `location` (to the end when `length` is None),
    /// checked against the file's size.
    fn read(&mut self, location: &str, offset: u64, length: Option<u64>) -> Result<Bytes, String> {
        if Path::new(location).is_absolute() || location.split(['/', '\\']).any(|c| c == "..") {
            return Err(format!(
                "external data location '{location}' must be a relative path inside the model's folder"
            ));
        }
        let path = self.base.join(location);
        if !self.files.contains_key(location) {
            let map = map_file(&path)
                .map_err(|e| format!("external data file '{}': {e}", path.display()))?;
            self.files.insert(location.to_string(), map);
        }
        let map = &self.files[location];
        let size = map.len() as u64;
        let len = length.unwrap_or(size.saturating_sub(offset));
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(map.slice(offset as usize..end as usize)),
            _ => Err(format!(
                "external data file '{}' has {size} bytes, tensor needs bytes {offset}..{} (is the file truncated?)",
                path.display(),
                offset as u128 + len as u128
            )),
        }
    }
}

fn sparse_from_proto(
    st: &proto::SparseTensorProto,
    ext: &mut ExternalData,
) -> Result<Tensor, String> {
    let values = tensor_from_proto(
        st.values.as_ref().ok_or("sparse tensor without values")?,
        Some(ext),
    )?;
    let indices = tensor_from_proto(
        st.indices.as_ref().ok_or("sparse tensor without indices")?,
        Some(ext),
    )?;
    let shape: Vec<usize> = st.dims.iter().map(|&d| d.max(0) as usize).collect();
    let n: usize = shape.iter().product();
    let idx = indices
        .to_i64_vec()
        .ok_or("sparse indices must be integers")?;
    let nnz = values.len();
    let vals = values.to_f64_vec().ok_or("sparse values must be numeric")?;
    let mut dense = vec![0f64; n];
    let strides = crate::tensor::strides_of(&shape);
    for k in 0..nnz {
        let flat = if indices.rank() == 1 {
            idx[k]
        } else {
            (0..shape.len())
                .map(|d| idx[k * shape.len() + d] * strides[d] as i64)
                .sum()
        };
        if flat < 0 || flat as usize >= n {
            return Err(format!(
                "sparse index {flat} out of range for shape {shape:?}"
            ));
        }
        dense[flat as usize] = vals[k];
    }
    let t = Tensor::from_f64(shape, dense);
    Ok(crate::ops::cast::cast_tensor(&t, values.dtype()))
}

/// Converts a `TensorProto` into a tensor. `ext` resolves external data (None: refuse it).
pub fn tensor_from_proto(
    t: &proto::TensorProto,
    ext: Option<&mut ExternalData>,
) -> Result<Tensor, String> {
    let code = t.data_type.unwrap_or(0);
    let dtype = DType::from_onnx(code).ok_or_else(|| match code {
        0 => "tensor has no data type".to_string(),
        14 | 15 => "complex tensors are not supported".to_string(),
        24 => "float8e8m0 tensors are not supported".to_string(),
        25 | 26 => "2-bit tensors (uint2, int2) are not supported".to_string(),
        _ => format!("unknown tensor data type {code}"),
    })?;
    if t.dims.iter().any(|&d| d < 0) {
        return Err(format!("negative dimension in {:?}", t.dims));
    }
    let shape: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
    let n: usize = shape.iter().product();

    let external = t.data_location == Some(proto::tensor_proto::DataLocation::External as i32);
    let raw: Option<Bytes> = if external {
        let ext = ext.ok_or("external data is not allowed here")?;
        let mut location = None;
        let mut offset = 0u64;
        let mut length = None;
        for kv in &t.external_data {
            let v = kv.value.as_deref().unwrap_or("");
            match kv.key.as_deref().unwrap_or("") {
                "location" => location = Some(v.to_string()),
                "offset" => {
                    offset = v
                        .parse()
                        .map_err(|_| format!("bad external data offset '{v}'"))?
                }
                "length" => {
                    length = Some(
                        v.parse()
                            .map_err(|_| format!("bad external data length '{v}'"))?,
                    )
                }
                _ => {}
            }
        }
        let location = location.ok_or("external data without a location")?;
        Some(ext.read(&location, offset, length)?)
    } else {
        t.raw_data.clone()
    };

    let data = if let Some(raw) = raw {
        decode_raw(dtype, raw, n)?
    } else {
        decode_typed(dtype, t, n)?
    };
    Tensor::new(shape, data).map_err(|e| e.to_string())
}

/// A buffer from its `raw_data` bytes: read in place where the bytes allow it
/// ([`Buf::from_le_bytes`]: little-endian machine, aligned), copied otherwise.
fn decode_raw(dtype: DType, raw: Bytes, n: usize) -> Result<TensorData, String> {
    if dtype == DType::Str {
        return Err("string tensors cannot use raw_data".into());
    }
    let need = dtype.stored_bytes(n);
    if raw.len() != need {
        return Err(format!(
            "raw_data has {} bytes, {n} elements of {dtype} need {need}{}",
            raw.len(),
            if dtype.is_4bit() {
                " (packed two per byte)"
            } else {
                ""
            }
        ));
    }
    fn le<T: crate::tensor::Plain>(raw: Bytes) -> Buf<T> {
        Buf::from_le_bytes(raw).expect("length checked against the element size")
    }
    use crate::lowbit::{F8E4M3FN, F8E4M3FNUZ, F8E5M2, F8E5M2FNUZ};
    Ok(match dtype {
        DType::F32 => TensorData::F32(le(raw)),
        DType::F64 => TensorData::F64(le(raw)),
        DType::F16 => TensorData::F16(le(raw)),
        DType::BF16 => TensorData::BF16(le(raw)),
        DType::I8 => TensorData::I8(le(raw)),
        DType::U8 => TensorData::U8(le(raw)),
        DType::I16 => TensorData::I16(le(raw)),
        DType::U16 => TensorData::U16(le(raw)),
        DType::I32 => TensorData::I32(le(raw)),
        DType::U32 => TensorData::U32(le(raw)),
        DType::I64 => TensorData::I64(le(raw)),
        DType::U64 => TensorData::U64(le(raw)),
        DType::F8E4M3FN => TensorData::F8E4M3FN(le::<F8E4M3FN>(raw)),
        DType::F8E4M3FNUZ => TensorData::F8E4M3FNUZ(le::<F8E4M3FNUZ>(raw)),
        DType::F8E5M2 => TensorData::F8E5M2(le::<F8E5M2>(raw)),
        DType::F8E5M2FNUZ => TensorData::F8E5M2FNUZ(le::<F8E5M2FNUZ>(raw)),
        DType::Bool => TensorData::Bool(raw.iter().map(|&b| b != 0).collect()),
        DType::Str => unreachable!("rejected above"),
        _ => low_bit_from_bytes(dtype, &raw, n),
    })
}

/// A float8 / 4-bit buffer from its stored bytes (one per element for float8, packed low
/// nibble first for 4-bit types); the caller checked the byte count.
fn low_bit_from_bytes(dtype: DType, bytes: &[u8], n: usize) -> TensorData {
    use crate::lowbit::*;
    let nib = || unpack_nibbles(bytes, n).into_iter();
    match dtype {
        d if d.is_fp8() => crate::tensor::fp8_from_bits(d, bytes).expect("a float8 type"),
        DType::U4 => TensorData::U4(nib().map(U4::from_bits).collect()),
        DType::I4 => TensorData::I4(nib().map(I4::from_bits).collect()),
        DType::F4E2M1 => TensorData::F4E2M1(nib().map(F4E2M1::from_bits).collect()),
        other => unreachable!("{other} is not a low-bit type"),
    }
}

fn decode_typed(dtype: DType, t: &proto::TensorProto, n: usize) -> Result<TensorData, String> {
    let check = |len: usize, field: &str| {
        if len == n {
            Ok(())
        } else {
            Err(format!("{field} has {len} values, shape needs {n}"))
        }
    };
    let i32d = &t.int32_data;
    if dtype.is_low_bit() {
        // int32_data holds one float8 element, or one packed byte of two 4-bit elements,
        // per value (onnx.proto).
        let need = dtype.stored_bytes(n);
        if i32d.len() != need {
            return Err(format!(
                "int32_data has {} values, {n} elements of {dtype} need {need}{}",
                i32d.len(),
                if dtype.is_4bit() {
                    " (two per value)"
                } else {
                    ""
                }
            ));
        }
        let bytes: Vec<u8> = i32d.iter().map(|&x| x as u8).collect();
        return Ok(low_bit_from_bytes(dtype, &bytes, n));
    }
    Ok(match dtype {
        DType::F32 => {
            check(t.float_data.len(), "float_data")?;
            TensorData::F32(t.float_data.clone().into())
        }
        DType::F64 => {
            check(t.double_data.len(), "double_data")?;
            TensorData::F64(t.double_data.clone().into())
        }
        DType::I64 => {
            check(t.int64_data.len(), "int64_data")?;
            TensorData::I64(t.int64_data.clone().into())
        }
        DType::U32 | DType::U64 => {
            check(t.uint64_data.len(), "uint64_data")?;
            if dtype == DType::U32 {
                TensorData::U32(t.uint64_data.iter().map(|&x| x as u32).collect())
            } else {
                TensorData::U64(t.uint64_data.clone().into())
            }
        }
        DType::Str => {
            check(t.string_data.len(), "string_data")?;
            TensorData::Str(
                t.string_data
                    .iter()
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect(),
            )
        }
        _ => {
            check(i32d.len(), "int32_data")?;
            match dtype {
                DType::I32 => TensorData::I32(i32d.clone().into()),
                DType::I16 => TensorData::I16(i32d.iter().map(|&x| x as i16).collect()),
                DType::U16 => TensorData::U16(i32d.iter().map(|&x| x as u16).collect()),
                DType::I8 => TensorData::I8(i32d.iter().map(|&x| x as i8).collect()),
                DType::U8 => TensorData::U8(i32d.iter().map(|&x| x as u8).collect()),
                DType::Bool => TensorData::Bool(i32d.iter().map(|&x| x != 0).collect()),
                DType::F16 => {
                    TensorData::F16(i32d.iter().map(|&x| f16::from_bits(x as u16)).collect())
                }
                DType::BF16 => {
                    TensorData::BF16(i32d.iter().map(|&x| bf16::from_bits(x as u16)).collect())
                }
                _ => unreachable!("handled above"),
            }
        }
    })
}

/// Converts a tensor into a `TensorProto` (raw little-endian data; strings in string_data).
pub fn tensor_to_proto(name: &str, t: &Tensor) -> proto::TensorProto {
    let mut p = proto::TensorProto {
        dims: t.shape().iter().map(|&d| d as i64).collect(),
        data_type: Some(t.dtype().onnx_code()),
        name: Some(name.to_string()),
        ..Default::default()
    };
    if let TensorData::Str(v) = t.data() {
        p.string_data = v.iter().map(|s| s.as_bytes().to_vec()).collect();
    } else {
        // A buffer read in place from a map already is its raw_data: share it, no copy.
        let shared = crate::with_data!(t.data(), v => v.borrowed_bytes());
        p.raw_data = Some(shared.unwrap_or_else(|| raw_bytes(t.data()).into()));
    }
    p
}

/// The little-endian bytes of a numeric buffer as `raw_data` stores it (4-bit types packed).
pub fn raw_bytes(data: &TensorData) -> Vec<u8> {
    macro_rules! le {
        ($v:expr) => {
            $v.iter().flat_map(|x| x.to_le_bytes()).collect()
        };
    }
    match data {
        TensorData::F32(v) => le!(v),
        TensorData::F64(v) => le!(v),
        TensorData::F16(v) => le!(v),
        TensorData::BF16(v) => le!(v),
        TensorData::I8(v) => le!(v),
        TensorData::U8(v) => v.to_vec(),
        TensorData::I16(v) => le!(v),
        TensorData::U16(v) => le!(v),
        TensorData::I32(v) => le!(v),
        TensorData::U32(v) => le!(v),
        TensorData::I64(v) => le!(v),
        TensorData::U64(v) => le!(v),
        TensorData::Bool(v) => v.iter().map(|&b| b as u8).collect(),
        TensorData::Str(_) => Vec::new(),
        TensorData::F8E4M3FN(v) => v.iter().map(|x| x.to_bits()).collect(),
        TensorData::F8E4M3FNUZ(v) => v.iter().map(|x| x.to_bits()).collect(),
        TensorData::F8E5M2(v) => v.iter().map(|x| x.to_bits()).collect(),
        TensorData::F8E5M2FNUZ(v) => v.iter().map(|x| x.to_bits()).collect(),
        // 4-bit types: packed two per byte, first element in the low nibble (onnx.proto).
        TensorData::U4(v) => crate::lowbit::pack_nibbles(v.iter().map(|x| x.to_bits())),
        TensorData::I4(v) => crate::lowbit::pack_nibbles(v.iter().map(|x| x.to_bits())),
        TensorData::F4E2M1(v) => crate::lowbit::pack_nibbles(v.iter().map(|x| x.to_bits())),
    }
}

/// Reads a serialized `TensorProto` file (the conformance data's `input_0.pb`).
pub fn read_tensor_file(path: &Path) -> Result<(String, Tensor)> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let p = proto::TensorProto::decode(bytes.as_slice())
        .map_err(|e| Error::data(path, format!("not a TensorProto: {e}")))?;
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut ext = ExternalData::new(&base);
    let t = tensor_from_proto(&p, Some(&mut ext)).map_err(|e| Error::data(path, e))?;
    Ok((p.name.unwrap_or_default(), t))
}

/// Reads one input set in the ONNX test-data layout: `dir/input_K.pb` for the graph's K-th
/// input, keyed by the input's name (conformance data, and the models scripts/gen_models.py
/// writes).
pub fn read_input_set(graph: &Graph, dir: &Path) -> Result<crate::tensor::Feeds> {
    let mut feeds = crate::tensor::Feeds::new();
    for (i, vi) in graph.inputs.iter().enumerate() {
        let (_, t) = read_tensor_file(&dir.join(format!("input_{i}.pb")))?;
        feeds.insert(vi.name.clone(), t);
    }
    Ok(feeds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_proto_round_trip() {
        let t = Tensor::from_f32(vec![2, 2], vec![1.0, -2.0, 3.5, 0.0]);
        let p = tensor_to_proto("w", &t);
        assert_eq!(tensor_from_proto(&p, None).unwrap(), t);
        let t = Tensor::from_i64(vec![3], vec![1, -2, 1 << 40]);
        assert_eq!(
            tensor_from_proto(&tensor_to_proto("i", &t), None).unwrap(),
            t
        );
    }

    #[test]
    fn typed_fields_decode() {
        let p = proto::TensorProto {
            dims: vec![2],
            data_type: Some(10),
            int32_data: vec![0x3c00, 0xc000],
            ..Default::default()
        };
        let t = tensor_from_proto(&p, None).unwrap();
        assert_eq!(t.to_f32_vec().unwrap(), vec![1.0, -2.0]);
    }

    #[test]
    fn wrong_raw_length_is_an_error() {
        let p = proto::TensorProto {
            dims: vec![3],
            data_type: Some(1),
            raw_data: Some(vec![0; 8].into()),
            ..Default::default()
        };
        let e = tensor_from_proto(&p, None).unwrap_err();
        assert!(e.contains("8 bytes"), "{e}");
    }

    #[test]
    fn subgraphs_load_nested_and_unknown_outer_values_are_errors() {
        let vi = |name: &str| proto::ValueInfoProto {
            name: Some(name.into()),
            ..Default::default()
        };
        let graph_attr = |name: &str, g: proto::GraphProto| proto::AttributeProto {
            name: Some(name.into()),
            r#type: Some(proto::attribute_proto::AttributeType::Graph as i32),
            g: Some(g),
            ..Default::default()
        };
        // main: x -> If(c) whose then-branch holds another If whose branches output `reads`
        // directly (no node): an outer-scope reference two levels up.
        let model = |reads: &str| {
            let leaf = proto::GraphProto {
                name: Some("leaf".into()),
                output: vec![vi(reads)],
                ..Default::default()
            };
            let inner = proto::NodeProto {
                op_type: Some("If".into()),
                name: Some("inner_if".into()),
                input: vec!["c".into()],
                output: vec!["inner_y".into()],
                attribute: vec![
                    graph_attr("then_branch", leaf.clone()),
                    graph_attr("else_branch", leaf),
                ],
                ..Default::default()
            };
            let mid = proto::GraphProto {
                name: Some("mid".into()),
                node: vec![inner],
                output: vec![vi("inner_y")],
                ..Default::default()
            };
            let outer = proto::NodeProto {
                op_type: Some("If".into()),
                name: Some("outer_if".into()),
                input: vec!["c".into()],
                output: vec!["y".into()],
                attribute: vec![
                    graph_attr("then_branch", mid.clone()),
                    graph_attr("else_branch", mid),
                ],
                ..Default::default()
            };
            proto::ModelProto {
                ir_version: Some(8),
                opset_import: vec![proto::OperatorSetIdProto {
                    domain: Some(String::new()),
                    version: Some(17),
                }],
                graph: Some(proto::GraphProto {
                    node: vec![outer],
                    input: vec![vi("c"), vi("x")],
                    output: vec![vi("y")],
                    ..Default::default()
                }),
                ..Default::default()
            }
        };
        let p = Path::new("m.onnx");
        let m = model_from_proto(model("x"), p, Path::new(".")).unwrap();
        let outer = &m.graph.nodes[0];
        assert_eq!(outer.implicit_inputs(), ["c", "x"]);
        let mid = outer.attr_graph("then_branch").unwrap();
        assert_eq!(mid.nodes[0].implicit_inputs(), ["x"]);
        let e = model_from_proto(model("ghost"), p, Path::new("."))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'outer_if'") && e.contains("'inner_if'") && e.contains("'ghost'"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
    }

    /// A model `y = x + w` whose 64-element f32 initializer `w` lives in `w.bin` at `offset`.
    fn external_model(dir: &Path, offset: usize) -> (PathBuf, Vec<f32>) {
        let w: Vec<f32> = (0..64).map(|i| i as f32 - 3.5).collect();
        let mut data = vec![0xAAu8; offset];
        data.extend(w.iter().flat_map(|x| x.to_le_bytes()));
        std::fs::write(dir.join("w.bin"), &data).unwrap();
        let kv = |k: &str, v: String| proto::StringStringEntryProto {
            key: Some(k.into()),
            value: Some(v),
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
                node: vec![proto::NodeProto {
                    op_type: Some("Add".into()),
                    input: vec!["x".into(), "w".into()],
                    output: vec!["y".into()],
                    ..Default::default()
                }],
                initializer: vec![proto::TensorProto {
                    name: Some("w".into()),
                    dims: vec![64],
                    data_type: Some(1),
                    data_location: Some(proto::tensor_proto::DataLocation::External as i32),
                    external_data: vec![
                        kv("location", "w.bin".into()),
                        kv("offset", offset.to_string()),
                        kv("length", (64 * 4).to_string()),
                    ],
                    ..Default::default()
                }],
                input: vec![vi("x")],
                output: vec![vi("y")],
                ..Default::default()
            }),
            ..Default::default()
        };
        let path = dir.join("m.onnx");
        std::fs::write(&path, m.encode_to_vec()).unwrap();
        (path, w)
    }

    #[test]
    fn external_data_is_mapped_in_place() {
        let dir = tempfile::tempdir().unwrap();
        for (offset, in_place) in [(0, true), (64, true), (2, false)] {
            let (path, w) = external_model(dir.path(), offset);
            let m = load_model(&path).unwrap();
            let t = &m.graph.initializers["w"];
            assert_eq!(t.as_f32().unwrap(), w.as_slice());
            let TensorData::F32(b) = t.data() else {
                panic!("f32")
            };
            // Aligned data is read from the map; unaligned data is copied.
            assert_eq!(b.is_borrowed(), in_place && cfg!(target_endian = "little"));
            // Written back (export), borrowed data is shared, not copied.
            let p = tensor_to_proto("w", t);
            let raw = p.raw_data.as_deref().unwrap();
            assert_eq!(raw.as_ptr() == b.as_ptr().cast::<u8>(), b.is_borrowed());
            assert_eq!(tensor_from_proto(&p, None).unwrap(), *t);
        }
    }

    #[test]
    fn truncated_external_data_is_a_one_line_error() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = external_model(dir.path(), 8);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("w.bin"))
            .unwrap();
        f.set_len(100).unwrap();
        let e = load_model(&path).unwrap_err().to_string();
        assert!(
            e.contains("m.onnx")
                && e.contains("initializer 'w'")
                && e.contains("w.bin")
                && e.contains("has 100 bytes")
                && e.contains("8..264"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
        std::fs::remove_file(dir.path().join("w.bin")).unwrap();
        let e = load_model(&path).unwrap_err().to_string();
        assert!(e.contains("initializer 'w'") && e.contains("w.bin"), "{e}");
    }

    #[test]
    fn embedded_raw_data_is_a_slice_of_the_mapped_file() {
        // The decoded raw_data shares the map; aligned or not, the values are right.
        let dir = tempfile::tempdir().unwrap();
        let t = Tensor::from_f32(vec![300], (0..300).map(|i| i as f32 * 0.25).collect());
        let mut m = proto::ModelProto {
            ir_version: Some(8),
            opset_import: vec![proto::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(17),
            }],
            graph: Some(proto::GraphProto::default()),
            ..Default::default()
        };
        m.graph
            .as_mut()
            .unwrap()
            .initializer
            .push(tensor_to_proto("w", &t));
        let path = dir.path().join("e.onnx");
        std::fs::write(&path, m.encode_to_vec()).unwrap();
        let bytes = map_file(&path).unwrap();
        let decoded = decode_model_bytes(bytes.clone(), &path).unwrap();
        let raw = decoded.graph.as_ref().unwrap().initializer[0]
            .raw_data
            .clone()
            .unwrap();
        let range = bytes.as_ptr() as usize..bytes.as_ptr() as usize + bytes.len();
        assert!(
            range.contains(&(raw.as_ptr() as usize)),
            "raw_data points into the map"
        );
        assert_eq!(load_model(&path).unwrap().graph.initializers["w"], t);
    }

    #[test]
    fn nodes_keep_their_id_and_protobuf_position_through_the_sort() {
        let vi = |n: &str| proto::ValueInfoProto {
            name: Some(n.into()),
            ..Default::default()
        };
        let node = |op: &str, name: &str, i: &[&str], o: &str| proto::NodeProto {
            op_type: Some(op.into()),
            name: Some(name.into()),
            input: i.iter().map(|s| s.to_string()).collect(),
            output: vec![o.into()],
            ..Default::default()
        };
        let branch = |o: &str| proto::GraphProto {
            node: vec![node("Relu", "inner", &["x"], o)],
            output: vec![vi(o)],
            ..Default::default()
        };
        let mut cf = node("If", "cf", &["c"], "y");
        for (a, o) in [("then_branch", "t"), ("else_branch", "e")] {
            cf.attribute.push(proto::AttributeProto {
                name: Some(a.into()),
                r#type: Some(proto::attribute_proto::AttributeType::Graph as i32),
                g: Some(branch(o)),
                ..Default::default()
            });
        }
        // `late` reads what `early` produces but comes first in the file.
        let model = proto::ModelProto {
            ir_version: Some(8),
            opset_import: vec![proto::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(17),
            }],
            graph: Some(proto::GraphProto {
                node: vec![
                    node("Relu", "late", &["a"], "b"),
                    node("Relu", "early", &["x"], "a"),
                    cf,
                ],
                input: vec![vi("c"), vi("x")],
                output: vec![vi("b"), vi("y")],
                ..Default::default()
            }),
            ..Default::default()
        };
        let m = model_from_proto(model, Path::new("m.onnx"), Path::new(".")).unwrap();
        let got: Vec<(&str, usize, Option<usize>)> = m
            .graph
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.id, n.pos))
            .collect();
        assert_eq!(
            got,
            [
                ("early", 1, Some(1)),
                ("late", 0, Some(0)),
                ("cf", 2, Some(2))
            ]
        );
        // Subgraph nodes: numbered after their node, in attribute order; position in their
        // own graph.
        let cf = &m.graph.nodes[2];
        let then = &cf.attr_graph("then_branch").unwrap().nodes[0];
        let els = &cf.attr_graph("else_branch").unwrap().nodes[0];
        assert_eq!((then.id, then.pos), (3, Some(0)));
        assert_eq!((els.id, els.pos), (4, Some(0)));
        // The protobuf stays with the model, in file order.
        let g = m.proto.graph.as_ref().unwrap();
        for n in &m.graph.nodes {
            assert_eq!(g.node[n.pos.unwrap()].output, n.outputs);
        }
    }

    #[test]
    fn garbage_is_not_a_model() {
        let e =
            decode_model(b"this is not a protobuf file at all", Path::new("x.onnx")).unwrap_err();
        assert!(
            e.to_string().starts_with("x.onnx: not a valid ONNX model"),
            "{e}"
        );
        let e = decode_model(b"", Path::new("x.onnx")).unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
    }

    #[test]
    fn low_bit_tensors_round_trip_packed() {
        use crate::lowbit::{F4E2M1, F8E5M2FNUZ, I4};
        let t = Tensor::new(
            vec![5],
            TensorData::I4([-8, 7, -1, 0, 3].iter().map(|&v| I4::wrapping(v)).collect()),
        )
        .unwrap();
        let p = tensor_to_proto("w", &t);
        assert_eq!(p.raw_data.as_deref(), Some(&[0x78, 0x0F, 0x03][..]));
        assert_eq!(tensor_from_proto(&p, None).unwrap(), t);
        let t = Tensor::new(
            vec![2],
            TensorData::F4E2M1(
                vec![F4E2M1::from_f32(-6.0, true), F4E2M1::from_f32(0.5, true)].into(),
            ),
        )
        .unwrap();
        assert_eq!(
            tensor_from_proto(&tensor_to_proto("f", &t), None).unwrap(),
            t
        );
        let t = Tensor::new(
            vec![1],
            TensorData::F8E5M2FNUZ(vec![F8E5M2FNUZ::from_bits(0x80)].into()),
        )
        .unwrap();
        let back = tensor_from_proto(&tensor_to_proto("n", &t), None).unwrap();
        assert!(back.to_f32_vec().unwrap()[0].is_nan());
    }

    #[test]
    fn low_bit_int32_data_and_wrong_counts() {
        // float8: one element per int32_data value; 4-bit: one packed byte per value.
        let p = proto::TensorProto {
            dims: vec![2],
            data_type: Some(17),
            int32_data: vec![0x38, 0xC0],
            ..Default::default()
        };
        assert_eq!(
            tensor_from_proto(&p, None).unwrap().to_f32_vec().unwrap(),
            vec![1.0, -2.0]
        );
        let p = proto::TensorProto {
            dims: vec![3],
            data_type: Some(21),
            int32_data: vec![0x21, 0x03],
            ..Default::default()
        };
        assert_eq!(
            tensor_from_proto(&p, None).unwrap().to_i64_vec().unwrap(),
            vec![1, 2, 3]
        );
        let p = proto::TensorProto {
            dims: vec![3],
            data_type: Some(22),
            int32_data: vec![0x21, 0x03, 0],
            ..Default::default()
        };
        let e = tensor_from_proto(&p, None).unwrap_err();
        assert!(
            e.contains("int32_data has 3 values") && e.contains("need 2"),
            "{e}"
        );
        let p = proto::TensorProto {
            dims: vec![3],
            data_type: Some(23),
            raw_data: Some(vec![0; 3].into()),
            ..Default::default()
        };
        let e = tensor_from_proto(&p, None).unwrap_err();
        assert!(
            e.contains("3 bytes") && e.contains("need 2 (packed two per byte)"),
            "{e}"
        );
        let p = proto::TensorProto {
            dims: vec![1],
            data_type: Some(25),
            raw_data: Some(vec![0].into()),
            ..Default::default()
        };
        assert!(tensor_from_proto(&p, None).unwrap_err().contains("int2"));
    }
}
