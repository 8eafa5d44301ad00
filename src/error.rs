//! The facade's error type: every layer's errors in one enum, so model code can use `?` on
//! recording, layers, gradients, compiling and running alike.

use crate::{IrError, RuntimeError};
use fusegraph_nn::NnError;
use fusegraph_passes::GradError;

/// An error recording, differentiating, compiling or running a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Recording an op failed (shapes or dtypes the op rejects).
    #[error("{0}")]
    Ir(#[from] IrError),
    /// A layer, parameter or optimizer error.
    #[error("{0}")]
    Nn(#[from] NnError),
    /// Differentiation failed.
    #[error("{0}")]
    Grad(#[from] GradError),
    /// Compiling or running on the device failed.
    #[error("{0}")]
    Runtime(#[from] RuntimeError),
    /// A collective operation between processes failed, or the processes disagree
    /// (`fusegraph::distributed`).
    #[error("distributed: {0}")]
    Distributed(String),
    /// An inconsistent configuration (the message says what and where).
    #[error("{0}")]
    Config(String),
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
