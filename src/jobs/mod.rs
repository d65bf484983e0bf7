//! Each command as a library job: options as the user gave them, validated once into a typed
//! config, run to a typed outcome, reporting through hooks and events (the library never
//! prints). The CLI (`src/cli`) and the Python package are shells over these jobs: the CLI
//! turns flags into a config and prints the outcome, the Python package does the same with
//! keyword arguments and Python objects.

pub mod calibrate;
pub mod check;
pub mod convert;
pub mod debug_precision;
pub mod inspect;
pub mod options;
pub mod plan;
pub mod plan_cost;
pub mod plan_worker;
pub mod quantize;
pub mod ranges;
pub mod run;
pub mod search_worker;
pub mod verify_engine;
pub mod worker_thread;
