//! The cost model of `mixprec plan`: what an assignment of formats to layers costs on a
//! target GPU, by one of three objectives.
//!
//! - `latency`: per layer a roofline time, max(FLOPs / peak math of its format, bytes moved /
//!   memory bandwidth), plus the Q/DQ and Cast reformats at format boundaries (memory bound:
//!   bytes / bandwidth); microseconds.
//! - `bytes`: the bytes those layers and reformats move.
//! - `effective-bits`: ModelOpt's, the weights' bits weighted by their parameter counts.
//!
//! The targets' peaks are the vendors' datasheet figures (dense, without structured sparsity);
//! a JSON file overrides or adds a target ([`Target::resolve`]). What the model ignores is
//! listed in docs/plan.md.

use crate::error::{Error, Result};
use crate::precision::Precision;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// What `plan` minimizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CostObjective {
    Latency,
    Bytes,
    EffectiveBits,
}

impl CostObjective {
    pub fn parse(s: &str) -> Result<CostObjective> {
        Ok(match s {
            "latency" => CostObjective::Latency,
            "bytes" => CostObjective::Bytes,
            "effective-bits" => CostObjective::EffectiveBits,
            _ => {
                return Err(Error::Invalid(format!(
                    "--objective '{s}': expected latency, bytes or effective-bits"
                )))
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            CostObjective::Latency => "latency",
            CostObjective::Bytes => "bytes",
            CostObjective::EffectiveBits => "effective-bits",
        }
    }

    /// The unit costs are given in.
    pub fn unit(self) -> &'static str {
        match self {
            CostObjective::Latency => "us",
            CostObjective::Bytes => "B",
            CostObjective::EffectiveBits => "bits",
        }
    }
}

/// The formats a target's peak math is given for (its JSON keys).
const PEAK_KEYS: [&str; 5] = ["float32", "float16", "bfloat16", "fp8", "int8"];

/// A GPU: dense peak math per format and memory bandwidth.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Target {
    pub name: String,
    /// Where the figures come from.
    pub source: String,
    /// Memory bandwidth, GB/s (10^9 bytes per second).
    pub memory_bandwidth_gb_s: f64,
    /// Dense peak math, TFLOP/s (TOP/s for int8), by [`PEAK_KEYS`]; float32 is the TF32
    /// tensor-core figure (TensorRT builds float32 layers with TF32 by default).
    pub peak_tflops: BTreeMap<String, f64>,
}

impl Target {
    /// The built-in targets, from NVIDIA's datasheets (dense: half the "with sparsity" figures).
    pub fn builtin(name: &str) -> Option<Target> {
        let t = |name: &str, source: &str, bw: f64, peaks: [f64; 5]| Target {
            name: name.into(),
            source: source.into(),
            memory_bandwidth_gb_s: bw,
            peak_tflops: PEAK_KEYS
                .iter()
                .zip(peaks)
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        };
        match name.to_ascii_lowercase().as_str() {
            "h100" => Some(t(
                "h100",
                "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: TF32 989, BF16/FP16 1979, FP8 3958 TFLOPS, INT8 3958 TOPS (with sparsity; dense is half), HBM3 3.35 TB/s",
                3350.0,
                [494.5, 989.5, 989.5, 1979.0, 1979.0],
            )),
            "b200" => Some(t(
                "b200",
                "NVIDIA HGX B200 datasheet, per GPU: TF32 2.2, FP16/BF16 4.5, FP8 9 PFLOPS, INT8 9 POPS (with sparsity; dense is half), HBM3e 8 TB/s",
                8000.0,
                [1100.0, 2250.0, 2250.0, 4500.0, 4500.0],
            )),
            _ => None,
        }
    }

    /// `--target`: a built-in name (h100, b200) or a JSON file (docs/plan.md, "Targets"):
    /// `{"name", "source", "memory_bandwidth_gb_s", "peak_tflops": {float32, float16,
    /// bfloat16, fp8, int8}}`, every field required unless `"base"` names a built-in target
    /// whose figures it overrides.
    pub fn resolve(spec: &str) -> Result<Target> {
        if let Some(t) = Target::builtin(spec) {
            return Ok(t);
        }
        let path = Path::new(spec);
        if !spec.ends_with(".json") && !path.exists() {
            return Err(Error::Invalid(format!(
                "--target '{spec}': unknown target; built in are h100 and b200, or give a JSON cost file"
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| Error::Data {
            path: path.into(),
            msg: format!("cannot read the cost file: {e}"),
        })?;
        Target::from_json(&text).map_err(|msg| Error::Data {
            path: path.into(),
            msg,
        })
    }

    /// A target from a cost file's text; the error says which field is wrong.
    pub fn from_json(text: &str) -> std::result::Result<Target, String> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let obj = v.as_object().ok_or("expected a JSON object")?;
        let base = match obj.get("base") {
            None => None,
            Some(b) => {
                let name = b.as_str().ok_or("\"base\": expected a target name")?;
                Some(Target::builtin(name).ok_or_else(|| {
                    format!("\"base\": unknown target '{name}' (built in: h100, b200)")
                })?)
            }
        };
        let string = |key: &str, base: Option<&String>| -> std::result::Result<String, String> {
            match obj.get(key) {
                Some(serde_json::Value::String(s)) => Ok(s.clone()),
                Some(_) => Err(format!("\"{key}\": expected a string")),
                None => base.cloned().ok_or(format!("missing field \"{key}\"")),
            }
        };
        let positive = |v: &serde_json::Value, key: &str| -> std::result::Result<f64, String> {
            match v.as_f64() {
                Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
                _ => Err(format!("\"{key}\": expected a number >= 0")),
            }
        };
        let name = string("name", base.as_ref().map(|b| &b.name))?;
        let source = string("source", base.as_ref().map(|b| &b.source))?;
        let memory_bandwidth_gb_s = match obj.get("memory_bandwidth_gb_s") {
            Some(v) => positive(v, "memory_bandwidth_gb_s")?,
            None => base
                .as_ref()
                .map(|b| b.memory_bandwidth_gb_s)
                .ok_or("missing field \"memory_bandwidth_gb_s\"")?,
        };
        if memory_bandwidth_gb_s <= 0.0 {
            return Err("\"memory_bandwidth_gb_s\": expected a number > 0".into());
        }
        let peaks = obj.get("peak_tflops");
        let peaks = match peaks {
            Some(p) => Some(p.as_object().ok_or("\"peak_tflops\": expected an object")?),
            None => None,
        };
        if let Some(p) = peaks {
            if let Some(k) = p.keys().find(|k| !PEAK_KEYS.contains(&k.as_str())) {
                return Err(format!(
                    "\"peak_tflops\": unknown format \"{k}\" (expected {})",
                    PEAK_KEYS.join(", ")
                ));
            }
        }
        let mut peak_tflops = BTreeMap::new();
        for key in PEAK_KEYS {
            let value = match peaks.and_then(|p| p.get(key)) {
                Some(v) => positive(v, &format!("peak_tflops.{key}"))?,
                None => match &base {
                    Some(b) => b.peak_tflops[key],
                    None => return Err(format!("missing field \"peak_tflops.{key}\"")),
                },
            };
            peak_tflops.insert(key.to_string(), value);
        }
        Ok(Target {
            name,
            source,
            memory_bandwidth_gb_s,
            peak_tflops,
        })
    }

    /// Dense peak math of `p`, FLOP/s (0: the target has no such math).
    pub fn peak(&self, p: Precision) -> f64 {
        self.peak_tflops.get(peak_key(p)).copied().unwrap_or(0.0) * 1e12
    }
}

/// The [`Target::peak_tflops`] key of a precision.
fn peak_key(p: Precision) -> &'static str {
    match p {
        Precision::Float32 => "float32",
        Precision::Float16 => "float16",
        Precision::BFloat16 => "bfloat16",
        Precision::Fp8E4M3 | Precision::Fp8E5M2 => "fp8",
        Precision::Int8 => "int8",
    }
}

/// How a value is stored between kernels: what a reformat converts between.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Storage {
    F32,
    F16,
    BF16,
    Int8,
    Fp8E4M3,
    Fp8E5M2,
}

impl Storage {
    fn bytes(self) -> f64 {
        match self {
            Storage::F32 => 4.0,
            Storage::F16 | Storage::BF16 => 2.0,
            Storage::Int8 | Storage::Fp8E4M3 | Storage::Fp8E5M2 => 1.0,
        }
    }

    /// What a layer in `p` writes: its own type, float32 for int8/fp8 (the output is
    /// dequantized, as exported).
    fn written_by(p: Precision) -> Storage {
        match p {
            Precision::Float16 => Storage::F16,
            Precision::BFloat16 => Storage::BF16,
            _ => Storage::F32,
        }
    }

    /// What a layer in `p` reads an input as: a quantized operand in its 8-bit type, other
    /// inputs of an int8/fp8 layer in float32, a float layer's in its type.
    fn read_by(p: Precision, quantized_operand: bool) -> Storage {
        match p {
            Precision::Int8 if quantized_operand => Storage::Int8,
            Precision::Fp8E4M3 if quantized_operand => Storage::Fp8E4M3,
            Precision::Fp8E5M2 if quantized_operand => Storage::Fp8E5M2,
            p => Storage::written_by(p),
        }
    }
}

/// Weight bits per parameter of a layer in `p` (ModelOpt's effective bits).
fn weight_bits(p: Precision, quantized_operand: bool) -> f64 {
    Storage::read_by(p, quantized_operand).bytes() * 8.0
}

/// Where a layer's activation input comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Node `i`'s output.
    Layer(usize),
    /// A graph input (float32) or the output of a layer whose precision is not chosen.
    Fixed,
}

/// An activation input of a layer.
#[derive(Clone, Debug)]
pub struct CostInput {
    /// The value read (its [`crate::graph::ValueId`] index): a reformat is shared by every
    /// reader of one value that wants one type.
    pub value: usize,
    pub source: Source,
    /// Elements of the value (first input set).
    pub elements: u64,
    /// Quantized by an int8/fp8 layer (`OpDef::is_quantized_operand`).
    pub quantized_operand: bool,
    /// Read inside a fused kernel (the epilogue chain it belongs to): never stored.
    pub internal: bool,
}

/// A weight input of a layer.
#[derive(Clone, Debug)]
pub struct CostWeight {
    pub elements: u64,
    pub quantized_operand: bool,
}

/// What kind of layer, for the cost model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Its precision is chosen: it computes in it.
    Compute,
    /// Data movement: carries its first input's storage, moves it once.
    Movement,
    /// Neither (folded, integer ops, subgraph holders): the same in every assignment; left out.
    Fixed,
}

/// One node as the cost model sees it.
#[derive(Clone, Debug)]
pub struct CostLayer {
    pub kind: LayerKind,
    pub flops: u64,
    pub inputs: Vec<CostInput>,
    pub weights: Vec<CostWeight>,
    /// Elements of its outputs (first input set).
    pub output_elements: u64,
    /// Its output is read only inside its fused kernel (an epilogue chain's intermediate).
    pub internal_output: bool,
}

/// An assignment's modeled cost, by every objective.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Cost {
    /// Roofline time, microseconds.
    pub latency_us: f64,
    /// Bytes moved by the layers and the reformats.
    pub bytes: f64,
    /// Weight bits weighted by parameter count (0 without weights).
    pub effective_bits: f64,
    /// Reformats (Casts, Q/DQ) at format boundaries.
    pub reformats: usize,
}

impl Cost {
    pub fn by(&self, objective: CostObjective) -> f64 {
        match objective {
            CostObjective::Latency => self.latency_us,
            CostObjective::Bytes => self.bytes,
            CostObjective::EffectiveBits => self.effective_bits,
        }
    }
}

/// The layers of a graph with the facts their cost needs, priced on one target.
#[derive(Clone, Debug)]
pub struct CostModel {
    pub layers: Vec<CostLayer>,
    pub target: Target,
}

impl CostModel {
    /// The cost of `precisions` (one per layer; only [`LayerKind::Compute`] layers' count).
    pub fn cost(&self, precisions: &[Precision]) -> Cost {
        let n = self.layers.len();
        let bw = self.target.memory_bandwidth_gb_s * 1e9;
        let mut storage = vec![Storage::F32; n];
        let mut cost = Cost::default();
        let (mut bits, mut params) = (0.0, 0.0);
        // (value, type): every reformat once (export shares one Cast or Q/DQ pair per tensor
        // and type).
        let mut reformats: BTreeSet<(usize, Storage)> = BTreeSet::new();
        let mut reformat_bytes = 0.0;
        let source_storage = |s: Source, storage: &[Storage]| match s {
            Source::Layer(j) => storage[j],
            Source::Fixed => Storage::F32,
        };
        for (i, l) in self.layers.iter().enumerate() {
            match l.kind {
                LayerKind::Fixed => {}
                LayerKind::Movement => {
                    let s = l
                        .inputs
                        .first()
                        .map_or(Storage::F32, |x| source_storage(x.source, &storage));
                    storage[i] = s;
                    let moved = (l.inputs.first().map_or(0, |x| x.elements) + l.output_elements)
                        as f64
                        * s.bytes();
                    cost.bytes += moved;
                    cost.latency_us += moved / bw * 1e6;
                }
                LayerKind::Compute => {
                    let p = precisions[i];
                    let out = Storage::written_by(p);
                    storage[i] = out;
                    let mut bytes = 0.0;
                    for w in &l.weights {
                        bytes +=
                            w.elements as f64 * Storage::read_by(p, w.quantized_operand).bytes();
                        bits += w.elements as f64 * weight_bits(p, w.quantized_operand);
                        params += w.elements as f64;
                    }
                    for x in l.inputs.iter().filter(|x| !x.internal) {
                        let have = source_storage(x.source, &storage);
                        let want = Storage::read_by(p, x.quantized_operand);
                        bytes += x.elements as f64 * want.bytes();
                        if have != want && reformats.insert((x.value, want)) {
                            reformat_bytes += x.elements as f64 * (have.bytes() + want.bytes());
                        }
                    }
                    if !l.internal_output {
                        bytes += l.output_elements as f64 * out.bytes();
                    }
                    let peak = self.target.peak(p);
                    let math = if peak > 0.0 {
                        l.flops as f64 / peak
                    } else {
                        f64::INFINITY
                    };
                    cost.bytes += bytes;
                    cost.latency_us += math.max(bytes / bw) * 1e6;
                }
            }
        }
        cost.bytes += reformat_bytes;
        cost.latency_us += reformat_bytes / bw * 1e6;
        cost.reformats = reformats.len();
        cost.effective_bits = if params > 0.0 { bits / params } else { 0.0 };
        cost
    }

    /// The formats among `formats` the target has no math for.
    pub fn unsupported(&self, formats: &[Precision]) -> Vec<Precision> {
        formats
            .iter()
            .copied()
            .filter(|&p| self.target.peak(p) <= 0.0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matmul(source: Source, k: u64, n: u64, internal: bool) -> CostLayer {
        CostLayer {
            kind: LayerKind::Compute,
            flops: 2 * k * n,
            inputs: vec![CostInput {
                value: match source {
                    Source::Layer(j) => j + 1,
                    Source::Fixed => 0,
                },
                source,
                elements: k,
                quantized_operand: true,
                internal: false,
            }],
            weights: vec![CostWeight {
                elements: k * n,
                quantized_operand: true,
            }],
            output_elements: n,
            internal_output: internal,
        }
    }

    fn model(layers: Vec<CostLayer>) -> CostModel {
        CostModel {
            layers,
            target: Target::builtin("h100").unwrap(),
        }
    }

    #[test]
    fn roofline_takes_the_slower_of_math_and_memory() {
        // 1x4096 @ 4096x4096: 33.5 MFLOP; in float16 32 MiB of weights. Memory bound: the
        // time is the bytes over 3.35 TB/s, not the FLOPs over 989.5 TFLOP/s.
        let m = model(vec![matmul(Source::Fixed, 4096, 4096, false)]);
        let c = m.cost(&[Precision::Float16]);
        let bytes = (4096.0 * 4096.0 + 4096.0 + 4096.0) * 2.0;
        // Plus the Cast of the float32 input to float16: 4 + 2 bytes per element.
        let reformat = 4096.0 * 6.0;
        assert_eq!(c.bytes, bytes + reformat);
        let expected = (bytes + reformat) / 3350e9 * 1e6;
        assert!((c.latency_us - expected).abs() < 1e-9, "{c:?}");
        assert_eq!(c.reformats, 1);
        // A compute-bound layer: a batch of 65536 rows (the flops grow, the weights do not).
        let mut big = matmul(Source::Fixed, 4096, 4096, false);
        big.flops *= 65536;
        let c = model(vec![big]).cost(&[Precision::Int8]);
        let math = 2.0 * 4096.0 * 4096.0 * 65536.0 / 1979e12 * 1e6;
        let reformat = 4096.0 * 5.0 / 3350e9 * 1e6;
        assert!((c.latency_us - math - reformat).abs() < 1e-6, "{c:?}");
    }

    #[test]
    fn int8_is_cheaper_than_float16_which_is_cheaper_than_float32() {
        let m = model(vec![
            matmul(Source::Fixed, 1024, 1024, false),
            matmul(Source::Layer(0), 1024, 1024, false),
        ]);
        let cost = |p| m.cost(&[p, p]).latency_us;
        assert!(cost(Precision::Int8) < cost(Precision::Float16));
        assert!(cost(Precision::Float16) < cost(Precision::Float32));
        assert_eq!(cost(Precision::Int8), cost(Precision::Fp8E4M3));
    }

    #[test]
    fn every_format_boundary_costs_a_reformat() {
        let m = model(vec![
            matmul(Source::Fixed, 256, 256, false),
            matmul(Source::Layer(0), 256, 256, false),
        ]);
        // float16 → float16: only the graph input's Cast.
        assert_eq!(
            m.cost(&[Precision::Float16, Precision::Float16]).reformats,
            1
        );
        // float16 → int8: the float16 output is quantized to int8 as well.
        let mixed = m.cost(&[Precision::Float16, Precision::Int8]);
        assert_eq!(mixed.reformats, 2);
        // float32 → float32: nothing to convert.
        assert_eq!(
            m.cost(&[Precision::Float32, Precision::Float32]).reformats,
            0
        );
        // The reformats' bytes are part of the cost: the input's Cast (4 + 2 bytes per
        // element) and the float16 value's Q (2 + 1).
        let layer0 = 256.0 * 256.0 * 2.0 + 256.0 * 2.0 + 256.0 * 2.0;
        let layer1 = 256.0 * 256.0 + 256.0 + 256.0 * 4.0;
        assert_eq!(mixed.bytes, layer0 + layer1 + 256.0 * 6.0 + 256.0 * 3.0);
    }

    #[test]
    fn readers_of_one_value_in_one_type_share_its_reformat() {
        // Two float16 layers read the graph input (value 0): one Cast, as the export writes.
        let m = model(vec![
            matmul(Source::Fixed, 256, 256, false),
            matmul(Source::Fixed, 256, 256, false),
        ]);
        assert_eq!(m.cost(&[Precision::Float16; 2]).reformats, 1);
        // In two types: a Cast and a Q/DQ pair.
        assert_eq!(m.cost(&[Precision::Float16, Precision::Int8]).reformats, 2);
    }

    #[test]
    fn a_fused_epilogue_moves_no_intermediate() {
        let relu = |internal_in: bool| CostLayer {
            kind: LayerKind::Compute,
            flops: 256,
            inputs: vec![CostInput {
                value: 1,
                source: Source::Layer(0),
                elements: 256,
                quantized_operand: false,
                internal: internal_in,
            }],
            weights: vec![],
            output_elements: 256,
            internal_output: false,
        };
        let fused = model(vec![matmul(Source::Fixed, 256, 256, true), relu(true)]);
        let apart = model(vec![matmul(Source::Fixed, 256, 256, false), relu(false)]);
        let p = [Precision::Float16, Precision::Float16];
        // The intermediate's write and read: 256 elements × 2 bytes, twice.
        assert_eq!(
            apart.cost(&p).bytes - fused.cost(&p).bytes,
            256.0 * 2.0 * 2.0
        );
    }

    #[test]
    fn effective_bits_weight_each_layer_by_its_parameters() {
        let m = model(vec![
            matmul(Source::Fixed, 100, 30, false),   // 3000 parameters
            matmul(Source::Layer(0), 30, 10, false), // 300 parameters
        ]);
        let c = m.cost(&[Precision::Int8, Precision::Float16]);
        assert!((c.effective_bits - (3000.0 * 8.0 + 300.0 * 16.0) / 3300.0).abs() < 1e-12);
        assert_eq!(m.cost(&[Precision::Float32; 2]).effective_bits, 32.0);
    }

    #[test]
    fn cost_files_name_what_is_missing_or_wrong() {
        let full = r#"{"name": "l4", "source": "datasheet", "memory_bandwidth_gb_s": 300,
            "peak_tflops": {"float32": 60, "float16": 121, "bfloat16": 121, "fp8": 242, "int8": 242}}"#;
        let t = Target::from_json(full).unwrap();
        assert_eq!(t.name, "l4");
        assert_eq!(t.peak(Precision::Int8), 242e12);
        let missing = full.replace("\"memory_bandwidth_gb_s\": 300,", "");
        assert_eq!(
            Target::from_json(&missing).unwrap_err(),
            "missing field \"memory_bandwidth_gb_s\""
        );
        let no_int8 = full.replace(", \"int8\": 242", "");
        assert_eq!(
            Target::from_json(&no_int8).unwrap_err(),
            "missing field \"peak_tflops.int8\""
        );
        let odd = full.replace("\"int8\"", "\"int4\"");
        assert!(Target::from_json(&odd)
            .unwrap_err()
            .contains("unknown format \"int4\""));
        // With a base, only the figures that change.
        let over = Target::from_json(
            r#"{"base": "h100", "name": "h100-pcie", "memory_bandwidth_gb_s": 2000}"#,
        )
        .unwrap();
        assert_eq!(over.memory_bandwidth_gb_s, 2000.0);
        assert_eq!(over.peak(Precision::Fp8E4M3), 1979e12);
        assert!(Target::from_json(r#"{"base": "a100"}"#)
            .unwrap_err()
            .contains("unknown target 'a100'"));
        let e = Target::resolve("a100").unwrap_err().to_string();
        assert!(e.contains("unknown target") && e.contains("h100"), "{e}");
    }

    #[test]
    fn a_target_without_a_format_s_math_says_so() {
        let t = Target::from_json(r#"{"base": "h100", "name": "a100", "peak_tflops": {"fp8": 0}}"#)
            .unwrap();
        let m = CostModel {
            layers: vec![],
            target: t,
        };
        assert_eq!(
            m.unsupported(&[Precision::Int8, Precision::Fp8E4M3]),
            vec![Precision::Fp8E4M3]
        );
    }
}
