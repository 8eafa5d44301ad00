//! Errors of graph construction, verification and parsing.

use thiserror::Error;

/// An error building, verifying or parsing a graph. Messages name the op and the types
/// involved, e.g. `matmul: lhs f32[2,3] and rhs f32[4,5]: inner dimensions 3 and 4 differ`.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum IrError {
    /// An op was given operands or attributes its typing rule rejects.
    #[error("{op}: {detail}")]
    Type {
        /// The op's mnemonic (`matmul`, `add`, ...).
        op: String,
        /// What was wrong, naming shapes and dtypes.
        detail: String,
    },
    /// A node id does not name a node of this graph.
    #[error("node %{0} is not in the graph")]
    UnknownNode(usize),
    /// Tensors from two different graph builders were combined.
    #[error("{op}: operands belong to different graphs")]
    ForeignTensor {
        /// The op's mnemonic.
        op: String,
    },
    /// The verifier found a broken invariant.
    #[error("verify: node %{node}: {detail}")]
    Verify {
        /// The offending node.
        node: usize,
        /// What is wrong.
        detail: String,
    },
    /// The text form could not be parsed.
    #[error("parse error at line {line}: {detail}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// What was wrong.
        detail: String,
    },
}

impl IrError {
    /// A typing error of `op`.
    pub fn ty(op: impl Into<String>, detail: impl Into<String>) -> Self {
        IrError::Type { op: op.into(), detail: detail.into() }
    }
}

/// Result with [`IrError`].
pub type Result<T, E = IrError> = std::result::Result<T, E>;
