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
    #[error(
        "node '{node}': op '{op}' (domain '{domain}', opset {opset}) is not supported by mixprec"
    )]
    UnsupportedOp {
        node: String,
        op: String,
        domain: String,
        opset: i64,
    },
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
            Error::UnsupportedOp {
                node,
                op,
                domain,
                opset,
            } => Error::UnsupportedOp {
                node: path(node),
                op,
                domain,
                opset,
            },
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
