//! Runtime errors.

use fusegraph_ir::{IrError, TensorType};
use thiserror::Error;

/// An error choosing a device, compiling or running.
#[derive(Debug, Error)]
pub enum RuntimeError {
    /// `FUSEGRAPH_BACKEND` (or the options) named a backend that does not exist.
    #[error("unknown backend `{name}` (expected vulkan, gl, metal or dx12)")]
    UnknownBackend {
        /// The name given.
        name: String,
    },
    /// No adapter was found for the backends tried.
    #[error("no GPU adapter found (tried {tried}); on Linux install a Vulkan driver (e.g. `mesa-vulkan-drivers`) or Mesa's EGL")]
    NoAdapter {
        /// The backends tried.
        tried: String,
    },
    /// The adapter refused to create a device.
    #[error("could not create a device on {adapter}: {detail}")]
    RequestDevice {
        /// The adapter's name.
        adapter: String,
        /// wgpu's reason.
        detail: String,
    },
    /// A device or compile option that cannot be honoured on this adapter, or is out of
    /// range.
    #[error("option `{option}`: {detail}")]
    InvalidOption {
        /// The option's name.
        option: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The graph is malformed or an op was misused.
    #[error(transparent)]
    Ir(#[from] IrError),
    /// A graph input had no feed.
    #[error("run: missing feed `{name}` (expected {expected})")]
    MissingFeed {
        /// The input name.
        name: String,
        /// Its type.
        expected: TensorType,
    },
    /// A feed names no input of the graph.
    #[error("run: feed `{name}` is not an input of this executable (inputs: {inputs})")]
    UnknownFeed {
        /// The name given.
        name: String,
        /// The names the executable takes.
        inputs: String,
    },
    /// A feed was named by a tensor handle that is not an input.
    #[error("run: feed {node} ({ty}) is not an input; feed the inputs the graph was recorded with")]
    NotAnInput {
        /// The node and its op.
        node: String,
        /// Its type.
        ty: TensorType,
    },
    /// A feed or parameter value had the wrong type.
    #[error("{what} `{name}`: expected {expected}, got {got}")]
    WrongType {
        /// "feed" or "parameter".
        what: &'static str,
        /// The name.
        name: String,
        /// The declared type.
        expected: TensorType,
        /// The type given.
        got: TensorType,
    },
    /// A feed from another run's output (`Feed::Output`) that cannot be taken: no
    /// such output, another element type or count than the input's, another device, or a
    /// value overwritten since.
    #[error("feed `{name}` from a submitted run's output: {reason}")]
    ChainedFeed {
        /// The input fed.
        name: String,
        /// What was wrong.
        reason: String,
    },
    /// A parameter was never given a value.
    #[error("run: parameter `{name}` ({ty}) has no value; call set_parameter first")]
    MissingParameter {
        /// The parameter name.
        name: String,
        /// Its type.
        ty: TensorType,
    },
    /// `set_parameter` named no parameter of the graph.
    #[error("set_parameter: `{name}` is not a parameter of this executable")]
    UnknownParameter {
        /// The name given.
        name: String,
    },
    /// A parameter update or read names a parameter the compiled graph does not read.
    #[error(
        "parameter `{name}` is not used by the compiled graph (nothing reads it), so it cannot be updated or read"
    )]
    UnusedUpdate {
        /// The parameter name.
        name: String,
    },
    /// A kernel needs more storage bindings than the adapter allows.
    #[error("kernel `{kernel}` needs {needed} storage buffers; the adapter allows {limit} per shader stage")]
    TooManyBindings {
        /// The kernel's label.
        kernel: String,
        /// Bindings needed.
        needed: usize,
        /// The adapter's limit.
        limit: u32,
    },
    /// A buffer or binding would exceed an adapter limit.
    #[error("{what} needs {bytes} bytes; the adapter allows {limit}")]
    TooLarge {
        /// What was being allocated.
        what: String,
        /// Bytes needed.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// The plan does not fit the memory limit, even after rematerialization. Nothing was
    /// allocated or dispatched.
    #[error("{}", resource_exhausted_message(.graph, *.needed, *.persistent, *.arena, *.staging, *.limit, *.lower_bound, .largest))]
    ResourceExhausted {
        /// What was being compiled.
        graph: String,
        /// Bytes the plan needs: persistent + arena + staging.
        needed: u64,
        /// Parameters and constants.
        persistent: u64,
        /// Inputs and intermediates.
        arena: u64,
        /// Readback.
        staging: u64,
        /// The limit in force.
        limit: u64,
        /// The peak of live arena bytes of the schedule (no plan of this schedule's arena can
        /// be smaller without rematerialization).
        lower_bound: u64,
        /// The largest tensors live at the peak: (description, bytes).
        largest: Vec<(String, u64)>,
    },
    /// The device's memory limit would be exceeded by an allocation.
    #[error("OOM: allocating {bytes} bytes for {what} would exceed the device memory limit of {limit} bytes ({allocated} already allocated)")]
    DeviceMemory {
        /// What was being allocated.
        what: String,
        /// Bytes requested.
        bytes: u64,
        /// Bytes allocated by live executables.
        allocated: u64,
        /// The device limit.
        limit: u64,
    },
    /// A checkpoint lacks a parameter the store holds. Nothing was loaded.
    #[error("checkpoint {file}: parameter `{name}` ({ty}) is missing")]
    MissingInCheckpoint {
        /// The parameter's name.
        name: String,
        /// Its type in the store.
        ty: TensorType,
        /// The checkpoint (a path).
        file: String,
    },
    /// An executable bound to a parameter store reads a parameter the store lacks.
    #[error("compile: parameter `{name}` ({ty}) is not in the parameter store (it holds {held} parameters); insert it first")]
    NotInStore {
        /// The parameter's name.
        name: String,
        /// The type the graph declares.
        ty: TensorType,
        /// How many parameters the store holds.
        held: usize,
    },
    /// Reading or writing a safetensors file failed.
    #[error(transparent)]
    Checkpoint(fusegraph_ir::safetensors::SafetensorsError),
    /// wgpu reported an error (a bug in fusegraph if it ever appears).
    #[error("wgpu error during {during}: {detail}")]
    Wgpu {
        /// What fusegraph was doing.
        during: String,
        /// wgpu's message.
        detail: String,
    },
}

/// Result with [`RuntimeError`].
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

#[allow(clippy::too_many_arguments)] // One per field of the error it formats.
fn resource_exhausted_message(
    graph: &str,
    needed: u64,
    persistent: u64,
    arena: u64,
    staging: u64,
    limit: u64,
    lower_bound: u64,
    largest: &[(String, u64)],
) -> String {
    let tensors: Vec<String> = largest.iter().map(|(d, b)| format!("{d} ({b} bytes)")).collect();
    format!(
        "OOM when allocating the plan for {graph}: needs {needed} bytes (parameters {persistent}, arena {arena}, staging {staging}), limit {limit}; lower bound {lower_bound}; largest live tensors at the peak: {}",
        if tensors.is_empty() { "none".to_string() } else { tensors.join(", ") }
    )
}
