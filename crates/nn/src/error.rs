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
    /// A checkpoint has no tensor for a parameter of the model.
    #[error("checkpoint {file}: no tensor for parameter `{param}`{}", expected.as_ref().map(|t| format!(" ({t})")).unwrap_or_default())]
    MissingKey {
        /// The key looked for.
        key: String,
        /// The model's parameter path (empty when a key was asked for directly).
        param: String,
        /// The parameter's type.
        expected: Option<TensorType>,
        /// The checkpoint.
        file: String,
    },
    /// A checkpoint tensor names no parameter of the model (and is not dropped by the key
    /// map).
    #[error("checkpoint {file}: tensor `{key}` matches no parameter of the model")]
    UnknownKey {
        /// The key.
        key: String,
        /// The checkpoint.
        file: String,
    },
    /// A checkpoint tensor's shape differs from its parameter's.
    #[error("checkpoint {file}: tensor `{key}` is {got}; parameter `{param}` is {expected}")]
    KeyShape {
        /// The key.
        key: String,
        /// The parameter's path.
        param: String,
        /// The parameter's type.
        expected: Box<TensorType>,
        /// The tensor's type in the file (after any transpose).
        got: Box<TensorType>,
        /// The checkpoint.
        file: String,
    },
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
    /// A GGUF file is malformed or holds what is not read here (its magic, version, a
    /// tensor's type, offset or size).
    #[error("GGUF {file}{}: {detail}", tensor.as_ref().map(|t| format!(", tensor `{t}`")).unwrap_or_default())]
    Gguf {
        /// The file.
        file: String,
        /// The tensor, where one is at fault.
        tensor: Option<String>,
        /// What is wrong.
        detail: String,
    },
    /// A model configuration (`config.json`) field holds a value this library does not
    /// support (an unknown architecture, activation or rotary type, an inconsistent width).
    #[error("config.json: `{field}` is {value}; supported: {supported}")]
    ConfigField {
        /// The field, dotted for nested ones (`rope_scaling.rope_type`).
        field: String,
        /// Its value as written.
        value: String,
        /// What is supported instead.
        supported: String,
    },
    /// A layer or initializer was configured inconsistently (e.g. `heads` does not divide
    /// `d_model`, a zero fan-in, an input of the wrong rank).
    #[error("{0}")]
    Config(String),
}

/// Result with [`NnError`].
pub type Result<T> = std::result::Result<T, NnError>;

/// A [`NnError::Config`] from anything printable.
/// An unsupported value of a config field, as a typed error.
pub(crate) fn unsupported(field: &str, value: impl std::fmt::Display, supported: &str) -> NnError {
    NnError::ConfigField { field: field.into(), value: value.to_string(), supported: supported.into() }
}

pub(crate) fn config(msg: impl Into<String>) -> NnError {
    NnError::Config(msg.into())
}
