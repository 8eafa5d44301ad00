//! naga validation of generated WGSL, so shader bugs show up without a GPU.

use thiserror::Error;

/// A shader that naga rejected.
#[derive(Debug, Error)]
#[error("invalid WGSL: {message}\n--- shader ---\n{source_text}")]
pub struct ValidateError {
    /// naga's diagnostic.
    pub message: String,
    /// The offending shader.
    pub source_text: String,
}

/// Parses and validates `wgsl` with naga (all capabilities the lowering may use).
pub fn validate(wgsl: &str) -> Result<naga::Module, ValidateError> {
    let module = naga::front::wgsl::parse_str(wgsl)
        .map_err(|e| ValidateError { message: e.emit_to_string(wgsl), source_text: wgsl.to_string() })?;
    let mut validator =
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all());
    validator
        .validate(&module)
        .map_err(|e| ValidateError { message: e.emit_to_string(wgsl), source_text: wgsl.to_string() })?;
    Ok(module)
}
