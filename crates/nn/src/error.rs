//! The crate's error type.

use fusegraph_ir::{IrError, TensorType};
use thiserror::Error;

/// An error building a layer, initializing a parameter or reading/writing a weight file.
#[derive(Debug, Error)]
pub enum NnError {
    /// Recording an op failed (shapes or dtypes the op's typing rule rejects).
    #[error(transparent)]
    Ir(#[from] IrError),
    /// Reading or writing a safetensors file failed.
    #[error(transparent)]
    Checkpoint(#[from] fusegraph_ir::safetensors::SafetensorsError),
    /// A parameter that [`crate::Params`] holds is absent from a loaded weight file.
    #[error("parameter `{name}` is missing")]
    Missing {
        /// The parameter's name.
        name: String,
    },
    /// A parameter value has a different dtype or shape than expected.
    #[error("parameter `{name}`: expected {expected}, got {got}")]
    Shape {
        /// The parameter's name.
        name: String,
        /// The type the layer (or the existing value) requires.
        expected: TensorType,
        /// The type found.
        got: TensorType,
    },
    /// A layer or initializer was configured inconsistently (e.g. `heads` does not divide
    /// `d_model`, a zero fan-in, an input of the wrong rank).
    #[error("{0}")]
    Config(String),
}

/// Result with [`NnError`].
pub type Result<T> = std::result::Result<T, NnError>;

/// A [`NnError::Config`] from anything printable.
pub(crate) fn config(msg: impl Into<String>) -> NnError {
    NnError::Config(msg.into())
}
