//! mixprec: find which layers of an ONNX network must stay in higher precision.
//!
//! Data flows one way: `onnx` (protobuf ⇄ IR) → `graph` → `exec` (interpreter over `ops`
//! kernels) → comparison, search and export; `jobs` are the commands. The CLI (crates/cli) and
//! the Python package (python/) only turn arguments into a job's config and render its outcome.

pub mod calib;
pub mod compare;
pub mod data;
pub mod decode;
pub mod engine;
pub mod error;
pub mod event;
pub mod exec;
pub mod export;
pub mod fold;
pub mod golden;
pub mod graph;
pub mod infer;
pub mod inspect;
pub mod jobs;
pub mod lowbit;
pub mod mapped;
pub mod numeric;
pub mod onnx;
pub mod ops;
pub mod precision;
pub mod process;
pub mod quantize;
pub mod search;
pub mod tensor;
pub mod threads;

pub use error::{Error, Result};
pub use exec::{Feeds, Interpreter, RunOptions, RunResult};
pub use graph::{Graph, Node};
pub use onnx::{load_model, Model};
pub use tensor::{DType, Tensor, TensorData};
