//! Operator kernels, one file per op family, and the registry that maps an ONNX `op_type`
//! to its kernel.
//!
//! A kernel receives the node (for attributes), the opset of its domain and its inputs
//! (`None` for an omitted optional input) and returns its outputs. Kernels compute in the
//! precision of their inputs' dtype (f32 for f32 tensors); reduced-precision emulation wraps
//! kernels from the outside (see docs/numerics.md).

pub mod cast;
pub mod control;
pub mod conv;
pub mod elementwise;
pub mod matmul;
pub mod movement;
pub mod norm;
pub mod pool;
pub mod qlinear;
pub mod quantize;
pub mod reduce;
pub mod resize;
pub mod softmax;
pub mod util;

use crate::graph::Node;
use crate::tensor::Tensor;
use std::collections::HashMap;
use std::sync::OnceLock;

/// What a kernel knows about the node it runs.
pub struct OpCtx<'a> {
    pub node: &'a Node,
    /// Opset version of the node's domain.
    pub opset: i64,
    /// Runs the node's subgraphs (If/Loop/Scan bodies) in the enclosing scope; None outside
    /// an interpreter.
    pub subgraphs: Option<&'a dyn SubgraphRunner>,
}

impl<'a> OpCtx<'a> {
    /// The context of a node without subgraphs.
    pub fn new(node: &'a Node, opset: i64) -> OpCtx<'a> {
        OpCtx {
            node,
            opset,
            subgraphs: None,
        }
    }
}

/// Runs the subgraphs of the node a kernel executes, with the interpreter, under the
/// precision the enclosing plan gives that node (see docs/numerics.md).
pub trait SubgraphRunner {
    /// Runs the subgraph of attribute `attr` with its formal inputs bound to `inputs`, in
    /// order; returns its outputs in declared order.
    fn run(&self, attr: &str, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, OpError>;
}

/// A kernel's failure, in words a user can act on; the interpreter adds node name and op.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct OpError(pub String);

pub type OpResult = Result<Vec<Tensor>, OpError>;

/// A kernel function.
pub type Kernel = fn(&OpCtx, &[Option<&Tensor>]) -> OpResult;

/// Returns early from a kernel with a formatted [`OpError`].
#[macro_export]
macro_rules! op_bail {
    ($($arg:tt)*) => {
        return Err($crate::ops::OpError(format!($($arg)*)))
    };
}

/// Ops that only move, select or reshape data, or compute shapes: they never change a value, so
/// they carry their input's precision and are never candidates in a precision search.
pub fn is_data_movement(op_type: &str) -> bool {
    matches!(
        op_type,
        "Reshape"
            | "Transpose"
            | "Shape"
            | "Size"
            | "Gather"
            | "GatherElements"
            | "GatherND"
            | "Concat"
            | "Split"
            | "Slice"
            | "Squeeze"
            | "Unsqueeze"
            | "Flatten"
            | "Identity"
            | "Constant"
            | "ConstantOfShape"
            | "Expand"
            | "Tile"
            | "Dropout"
            | "Range"
            | "DepthToSpace"
            | "SpaceToDepth"
            | "NonZero"
            | "Cast"
            | "CastLike"
            | "Pad"
            | "ScatterND"
            | "ScatterElements"
            | "OneHot"
            | "EyeLike"
            | "Trilu"
    )
}

/// Maps op types of the default ONNX domain to kernels.
#[derive(Default)]
pub struct Registry {
    kernels: HashMap<&'static str, Kernel>,
}

impl Registry {
    pub fn add(&mut self, op_type: &'static str, kernel: Kernel) {
        self.kernels.insert(op_type, kernel);
    }

    /// The kernel for an op of a domain, if mixprec has one.
    pub fn get(&self, domain: &str, op_type: &str) -> Option<Kernel> {
        if !(domain.is_empty() || domain == "ai.onnx") {
            return None;
        }
        self.kernels.get(op_type).copied()
    }

    pub fn op_types(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.kernels.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// The registry with every kernel mixprec ships.
    pub fn global() -> &'static Registry {
        static REGISTRY: OnceLock<Registry> = OnceLock::new();
        REGISTRY.get_or_init(|| {
            let mut r = Registry::default();
            cast::register(&mut r);
            control::register(&mut r);
            conv::register(&mut r);
            elementwise::register(&mut r);
            matmul::register(&mut r);
            movement::register(&mut r);
            norm::register(&mut r);
            pool::register(&mut r);
            qlinear::register(&mut r);
            quantize::register(&mut r);
            reduce::register(&mut r);
            resize::register(&mut r);
            softmax::register(&mut r);
            r
        })
    }
}
