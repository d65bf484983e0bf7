//! Typed errors of the library. Each names the file, tensor, node or option at fault, so the
//! CLI can print one clear line.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    // The io error is part of the message, not a `source`: the CLI prints the whole chain,
    // which would repeat it.
    #[error("{}: {cause}", path.display())]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{}: not a valid ONNX model: {msg}", path.display())]
    Model { path: PathBuf, msg: String },
    /// Every op of the model (subgraphs included) that mixprec has no kernel for, all at
    /// once: a user learns the whole list from one run, not one op per attempt.
    #[error("{}", unsupported_message(.0))]
    UnsupportedOps(Vec<UnsupportedOp>),
    #[error("node '{node}' ({op}): {msg}")]
    Op {
        node: String,
        op: String,
        msg: String,
    },
    /// An attribute of a node that its op rejects (wrong type, length or value), found when
    /// the model is loaded.
    #[error("node '{node}' ({op}): attribute '{attr}': {msg}")]
    Attr {
        node: String,
        op: String,
        attr: String,
        msg: String,
    },
    #[error("input '{name}': {msg}")]
    Input { name: String, msg: String },
    #[error("{}: {msg}", path.display())]
    Data { path: PathBuf, msg: String },
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One op (domain, type, opset) mixprec does not support, with how often the model uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsupportedOp {
    /// `ai.onnx` for the default domain.
    pub domain: String,
    pub op: String,
    pub opset: i64,
    /// Nodes using it, subgraph bodies included.
    pub count: usize,
    /// The first such node, by path inside subgraphs (`If_0/then_branch/Conv_3`).
    pub first_node: String,
}

fn unsupported_message(ops: &[UnsupportedOp]) -> String {
    let items: Vec<String> = ops
        .iter()
        .map(|u| {
            let nodes = if u.count == 1 {
                format!("node '{}'", u.first_node)
            } else {
                format!("{} nodes, first '{}'", u.count, u.first_node)
            };
            format!(
                "'{}' (domain '{}', opset {}): {nodes}",
                u.op, u.domain, u.opset
            )
        })
        .collect();
    let n = ops.len();
    let s = if n == 1 { "" } else { "s" };
    format!(
        "{n} op{s} of the model {} not supported by mixprec: {}",
        if n == 1 { "is" } else { "are" },
        items.join("; ")
    )
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            cause: source,
        }
    }

    pub fn data(path: impl Into<PathBuf>, msg: impl Into<String>) -> Error {
        Error::Data {
            path: path.into(),
            msg: msg.into(),
        }
    }

    pub fn input(name: impl Into<String>, msg: impl Into<String>) -> Error {
        Error::Input {
            name: name.into(),
            msg: msg.into(),
        }
    }

    /// This error of a node inside subgraph `attr` of node `outer`, with the node named by its
    /// path (`If_0/then_branch/Conv_3`).
    pub fn in_subgraph(self, outer: &str, attr: &str) -> Error {
        let path = |inner: String| format!("{outer}/{attr}/{inner}");
        match self {
            Error::Op { node, op, msg } => Error::Op {
                node: path(node),
                op,
                msg,
            },
            Error::Attr {
                node,
                op,
                attr,
                msg,
            } => Error::Attr {
                node: path(node),
                op,
                attr,
                msg,
            },
            e => e,
        }
    }
}
