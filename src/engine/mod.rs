//! Did the engine obey? `verify-engine` reads a TensorRT engine's layer information
//! (`trtexec --exportLayerInfo` JSON or `polygraphy inspect model --show layers` text), maps
//! its layers back to ONNX nodes and lists every node whose precision in the engine differs
//! from the plan or from the exported model's own types (TensorRT has been seen to ignore
//! requested precisions silently: NVIDIA/TensorRT issues #4505, #3224, #2407).
//!
//! - [`layers`]: reading the two file formats into [`layers::LayerInfo`];
//! - [`names`]: TensorRT layer names (fused, `PWN(...)`, Myelin ranges, reformats, derived
//!   suffixes, `Metadata`) to ONNX nodes;
//! - [`verify`]: the comparison, returning an [`verify::EngineReport`]. The CLI prints it.

pub mod layers;
pub mod names;
pub mod verify;

pub use layers::{read_layer_info, EngineType, LayerInfo};
pub use verify::{expected_from_model, expected_from_plan, verify, EngineReport, Verdict};
