//! The integration target: ONNX conformance, whole-model checks against ONNX Runtime,
//! Polygraphy file interop and CLI end-to-end tests. One target so it links once.

mod attrs;
mod calib;
mod check_faults;
mod cli;
mod common;
mod conformance;
mod contrib;
mod control;
mod deploy;
mod dtypes;
mod export;
mod fusion;
mod fuzz;
mod hybrid;
mod layering;
mod models;
mod nanprop;
mod plan;
mod plan_ort;
mod polygraphy_cli;
mod precision;
mod qdq;
mod quantize;
mod real_models;
mod recurrent;
mod report;
mod search;
mod seeds;
mod strongly_typed;
mod transformers;
mod verify_engine;
