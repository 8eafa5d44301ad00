//! ONNX models into fusegraph graphs.
//!
//! [`OnnxModel::open`] reads a `ModelProto` (through `prost`; the messages are in
//! [`proto`]) and checks its default-domain opset (13 to 21). [`OnnxModel::import`] records
//! the graph's nodes, in order, into a [`GraphBuilder`] for concrete input shapes (a symbolic
//! dimension such as a batch takes the size given for it): each node maps onto the IR's
//! primitives and composites ([`ops`]). Initializers become parameters (their values in
//! [`Imported::params`], for a runtime's parameter store) except small and integer ones,
//! which are values known at import, as `Constant` nodes are: a node whose inputs are all
//! known is evaluated at import by the CPU reference (shape arithmetic — `Shape`, `Gather`
//! on a shape, `Concat`, `Unsqueeze`, `ConstantOfShape`, … — folds away), and the inputs
//! that must be static (a `Reshape`'s shape, a `Slice`'s bounds, a `Pad`'s pads) are.
//!
//! ONNX's int64 tensors are i32 here (the IR's integer type; values outside its range are
//! an error naming the tensor); doubles are f32. An unsupported op is
//! [`OnnxError::Unsupported`], listing every such node before anything is recorded.
//!
//! Invariants: depends on `ir` and `reference` only; importing never touches a device.

mod einsum;
mod node;
pub mod ops;
pub mod proto;
mod window;

use fusegraph_ir::{DType, GraphBuilder, HostTensor, IrError, Tensor};
use prost::Message;
use proto::{ModelProto, NodeProto, TensorProto};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Errors reading or importing an ONNX model.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The bytes are not a `ModelProto`, or it has no graph.
    #[error("{path}: not an ONNX model ({detail})")]
    Format {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
    /// The default domain's opset is outside what is read.
    #[error("opset {0} of the default domain: opsets 13 to 21 are read")]
    Opset(i64),
    /// Nodes whose op this importer does not map, every one of them.
    #[error("{} unsupported node(s): {}", .0.len(), .0.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", "))]
    Unsupported(Vec<UnsupportedNode>),
    /// A node that cannot be imported as it is (an attribute value, a dynamic input that
    /// must be static, shapes that do not fit).
    #[error("node `{node}` ({op}): {detail}")]
    Node {
        /// The node's name (or its first output's, where it has none).
        node: String,
        /// Its op type.
        op: String,
        /// What was wrong.
        detail: String,
    },
    /// A tensor (an initializer, a constant, external data) that cannot be read.
    #[error("tensor `{name}`: {detail}")]
    Tensor {
        /// The tensor's name.
        name: String,
        /// What was wrong.
        detail: String,
    },
    /// A graph input without a size for one of its dimensions, or of an unread type.
    #[error("input `{name}`: {detail}")]
    Input {
        /// The input's name.
        name: String,
        /// What was wrong.
        detail: String,
    },
}

/// Result with [`OnnxError`].
pub type Result<T, E = OnnxError> = std::result::Result<T, E>;

/// A node of an op this importer does not map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsupportedNode {
    /// Its op type (`Einsum`).
    pub op_type: String,
    /// Its name.
    pub name: String,
    /// Its domain (empty for ONNX's own).
    pub domain: String,
    /// The opset of its domain.
    pub opset: i64,
}

impl std::fmt::Display for UnsupportedNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let domain = if self.domain.is_empty() { "ai.onnx" } else { &self.domain };
        write!(f, "{} `{}` ({domain} opset {})", self.op_type, self.name, self.opset)
    }
}

/// A dimension of a graph input as the model declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dim {
    /// A size.
    Fixed(usize),
    /// A named size (`batch`), given at import.
    Named(String),
    /// Neither.
    Unknown,
}

/// A graph input: its name, element type and declared dimensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputInfo {
    /// Its name.
    pub name: String,
    /// Its element type here (int64 as i32).
    pub dtype: DType,
    /// Its dimensions as declared.
    pub dims: Vec<Dim>,
}

/// What [`OnnxModel::import`] recorded.
#[derive(Debug)]
pub struct Imported {
    /// The graph inputs, in the model's order, as `Input` nodes of the same names.
    pub inputs: Vec<(String, Tensor)>,
    /// The graph outputs, in the model's order.
    pub outputs: Vec<(String, Tensor)>,
    /// The values of the parameters the graph reads (the initializers that stayed tensors),
    /// by parameter name.
    pub params: BTreeMap<String, HostTensor>,
}

/// A value during import: known on the host, or a node of the graph being recorded.
#[derive(Clone, Debug)]
pub enum Value {
    /// Known at import (a constant, a small or integer initializer, a folded result).
    Known(HostTensor),
    /// A node of the graph.
    Node(Tensor),
}

/// The most elements a value computed at import may have; larger results are recorded as
/// nodes (a large constant would be baked into kernels).
const FOLD_LIMIT: usize = 4096;

/// An ONNX model, read and checked.
#[derive(Clone, Debug)]
pub struct OnnxModel {
    model: ModelProto,
    path: PathBuf,
    opset: i64,
}

impl OnnxModel {
    /// Reads the model at `path` (external data files are read relative to its folder).
    pub fn open(path: &Path) -> Result<OnnxModel> {
        let bytes = std::fs::read(path).map_err(|source| OnnxError::Io { path: path.into(), source })?;
        OnnxModel::from_bytes(&bytes, path)
    }

    /// A model from its encoding; `path` names it in errors and locates external data.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<OnnxModel> {
        let format = |detail: String| OnnxError::Format { path: path.into(), detail };
        let model = ModelProto::decode(bytes).map_err(|e| format(e.to_string()))?;
        if model.graph.is_none() {
            return Err(format("no graph".into()));
        }
        let opset = model
            .opset_import
            .iter()
            .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
            .map(|o| o.version)
            .ok_or_else(|| format("no opset for the default domain".into()))?;
        if !(13..=21).contains(&opset) {
            return Err(OnnxError::Opset(opset));
        }
        Ok(OnnxModel { model, path: path.into(), opset })
    }

    fn graph(&self) -> &proto::GraphProto {
        self.model.graph.as_ref().expect("checked when read")
    }

    /// The default domain's opset.
    pub fn opset(&self) -> i64 {
        self.opset
    }

    /// The graph inputs that are not initializers.
    pub fn inputs(&self) -> Result<Vec<InputInfo>> {
        let g = self.graph();
        let inits: std::collections::BTreeSet<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
        g.input
            .iter()
            .filter(|i| !inits.contains(i.name.as_str()))
            .map(|i| {
                let err = |detail: &str| OnnxError::Input { name: i.name.clone(), detail: detail.into() };
                let t = i.r#type.as_ref().and_then(|t| t.tensor_type.as_ref()).ok_or_else(|| err("not a tensor"))?;
                let dtype = dtype_of(t.elem_type).ok_or_else(|| err(&format!("element type {}", t.elem_type)))?;
                let dims = t
                    .shape
                    .as_ref()
                    .map(|s| {
                        s.dim
                            .iter()
                            .map(|d| match (&d.dim_value, &d.dim_param) {
                                (Some(v), _) if *v >= 0 => Dim::Fixed(*v as usize),
                                (_, Some(p)) if !p.is_empty() => Dim::Named(p.clone()),
                                _ => Dim::Unknown,
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                Ok(InputInfo { name: i.name.clone(), dtype, dims })
            })
            .collect()
    }

    /// The graph outputs' names.
    pub fn output_names(&self) -> Vec<String> {
        self.graph().output.iter().map(|o| o.name.clone()).collect()
    }

    /// The op types of the graph's nodes, each once, sorted.
    pub fn op_types(&self) -> Vec<String> {
        let set: std::collections::BTreeSet<&str> = self.graph().node.iter().map(|n| n.op_type.as_str()).collect();
        set.into_iter().map(str::to_string).collect()
    }

    /// Every node whose op this importer does not map.
    pub fn unsupported(&self) -> Vec<UnsupportedNode> {
        self.graph()
            .node
            .iter()
            .filter(|n| {
                !(n.domain.is_empty() || n.domain == "ai.onnx") || !ops::SUPPORTED.contains(&n.op_type.as_str())
            })
            .map(|n| UnsupportedNode {
                op_type: n.op_type.clone(),
                name: node_name(n),
                domain: n.domain.clone(),
                opset: self.model.opset_import.iter().find(|o| o.domain == n.domain).map_or(self.opset, |o| o.version),
            })
            .collect()
    }

    /// Records the graph into `b` for inputs of the shapes `shapes` gives (by input name;
    /// an input not named takes its declared shape, which must then be fixed).
    pub fn import(&self, b: &GraphBuilder, shapes: &BTreeMap<String, Vec<usize>>) -> Result<Imported> {
        self.import_specialized(b, shapes, &BTreeMap::new())
    }

    /// [`OnnxModel::import`] at the shapes of the values `feeds` gives each input (what a
    /// run will feed).
    pub fn import_for(&self, b: &GraphBuilder, feeds: &BTreeMap<String, HostTensor>) -> Result<Imported> {
        let shapes = feeds.iter().map(|(k, v)| (k.clone(), v.shape().dims().to_vec())).collect();
        self.import(b, &shapes)
    }

    /// [`OnnxModel::import`] with some inputs' values known at import (`known`, by input
    /// name): the graph is specialized to them as to a shape — they are constants, and the
    /// inputs that must be static (a `Reshape`'s shape, a reduction's axes, a `Slice`'s
    /// bounds) may come from them. They are not among [`Imported::inputs`].
    pub fn import_specialized(
        &self,
        b: &GraphBuilder,
        shapes: &BTreeMap<String, Vec<usize>>,
        known: &BTreeMap<String, HostTensor>,
    ) -> Result<Imported> {
        let unsupported = self.unsupported();
        if !unsupported.is_empty() {
            return Err(OnnxError::Unsupported(unsupported));
        }
        let g = self.graph();
        let mut values: BTreeMap<String, Value> = BTreeMap::new();
        let mut params = BTreeMap::new();
        for t in &g.initializer {
            let host = self.tensor(t)?;
            // Integer and small float tensors are known at import (shapes, axes, scalars);
            // the weights are parameters.
            let known = match host.dtype() {
                DType::F32 | DType::F16 => host.shape().numel() <= 64,
                DType::BF16 => false,
                _ => true,
            };
            let value = if known {
                Value::Known(host)
            } else {
                let name = param_name(&t.name);
                let node =
                    b.parameter(&name, host.dtype(), host.shape().clone()).map_err(|e| tensor_err(&t.name, e))?;
                params.insert(name, host);
                Value::Node(node)
            };
            values.insert(t.name.clone(), value);
        }
        let mut inputs = Vec::new();
        for info in self.inputs()? {
            if let Some(v) = known.get(&info.name) {
                let v = if v.dtype() == info.dtype {
                    v.clone()
                } else {
                    HostTensor::from_f64(info.dtype, v.shape().clone(), &v.to_f64())
                        .map_err(|e| OnnxError::Input { name: info.name.clone(), detail: e.to_string() })?
                };
                values.insert(info.name.clone(), Value::Known(v));
                continue;
            }
            let dims = match shapes.get(&info.name) {
                Some(d) => d.clone(),
                None => info
                    .dims
                    .iter()
                    .map(|d| match d {
                        Dim::Fixed(n) => Ok(*n),
                        other => Err(OnnxError::Input {
                            name: info.name.clone(),
                            detail: format!("dimension {other:?} needs a size (give the input's shape)"),
                        }),
                    })
                    .collect::<Result<Vec<_>>>()?,
            };
            if dims.len() != info.dims.len() && !info.dims.is_empty() {
                let detail = format!("{} dimensions given for {} declared", dims.len(), info.dims.len());
                return Err(OnnxError::Input { name: info.name.clone(), detail });
            }
            let t = b
                .input(&info.name, info.dtype, dims)
                .map_err(|e| OnnxError::Input { name: info.name.clone(), detail: e.to_string() })?;
            values.insert(info.name.clone(), Value::Node(t.clone()));
            inputs.push((info.name, t));
        }
        for node in &g.node {
            let ins: Vec<Option<Value>> = node
                .input
                .iter()
                .map(|name| match name.as_str() {
                    "" => Ok(None),
                    n => values
                        .get(n)
                        .cloned()
                        .map(Some)
                        .ok_or_else(|| node::node_err(node, format!("input `{n}` is not defined before it"))),
                })
                .collect::<Result<_>>()?;
            let outs = self.apply(b, node, &ins)?;
            for (name, v) in node.output.iter().zip(outs) {
                if !name.is_empty() {
                    values.insert(name.clone(), v);
                }
            }
        }
        let mut outputs = Vec::new();
        for name in self.output_names() {
            let v = values.get(&name).ok_or_else(|| OnnxError::Tensor {
                name: name.clone(),
                detail: "a graph output no node computes".into(),
            })?;
            outputs.push((name.clone(), node::tensor(b, v).map_err(|e| tensor_err(&name, e))?));
        }
        Ok(Imported { inputs, outputs, params })
    }

    /// `node` applied to `ins`: evaluated at import where every input is known and the
    /// results are small, else recorded into `b`.
    fn apply(&self, b: &GraphBuilder, node: &NodeProto, ins: &[Option<Value>]) -> Result<Vec<Value>> {
        if let Some(known) = ops::known_result(node, ins, self.opset)? {
            return Ok(known);
        }
        if ins.iter().flatten().all(|v| matches!(v, Value::Known(_))) {
            let scratch = GraphBuilder::new();
            let outs = ops::apply(&scratch, node, ins, self.opset)?;
            if outs.iter().all(|t| t.shape().numel() <= FOLD_LIMIT) {
                let g = scratch.graph();
                let ids: Vec<_> = outs.iter().map(Tensor::id).collect();
                let none = BTreeMap::new();
                let values = fusegraph_reference::evaluate(&g, &ids, &none, &none)
                    .map_err(|e| node::node_err(node, format!("evaluating at import: {e}")))?;
                return Ok(values.into_iter().map(Value::Known).collect());
            }
        }
        Ok(ops::apply(b, node, ins, self.opset)?.into_iter().map(Value::Node).collect())
    }

    /// An initializer's or constant's values (external data read from the model's folder).
    pub fn tensor(&self, t: &TensorProto) -> Result<HostTensor> {
        let external = if t.data_location == 1 {
            let entry = |k: &str| t.external_data.iter().find(|e| e.key == k).map(|e| e.value.clone());
            let err = |detail: String| OnnxError::Tensor { name: t.name.clone(), detail };
            let location = entry("location").ok_or_else(|| err("external data without a location".into()))?;
            let file = self.path.parent().unwrap_or(Path::new(".")).join(&location);
            let bytes = std::fs::read(&file).map_err(|e| err(format!("{}: {e}", file.display())))?;
            let num = |k: &str| entry(k).map(|v| v.parse::<usize>().map_err(|_| err(format!("{k} `{v}`")))).transpose();
            let offset = num("offset")?.unwrap_or(0);
            let end = match num("length")? {
                Some(len) => offset + len,
                None => bytes.len(),
            };
            if end > bytes.len() || offset > end {
                return Err(err(format!("bytes {offset}..{end} of {} ({} bytes)", file.display(), bytes.len())));
            }
            Some(bytes[offset..end].to_vec())
        } else {
            None
        };
        host_tensor(t, external.as_deref())
    }
}

/// The name a node goes by in errors: its own, else its first output's.
pub(crate) fn node_name(n: &NodeProto) -> String {
    if n.name.is_empty() {
        n.output.first().cloned().unwrap_or_default()
    } else {
        n.name.clone()
    }
}

/// A parameter's name for an initializer: the same, where it is not empty.
fn param_name(name: &str) -> String {
    if name.is_empty() {
        "initializer".into()
    } else {
        name.into()
    }
}

fn tensor_err(name: &str, e: IrError) -> OnnxError {
    OnnxError::Tensor { name: name.into(), detail: e.to_string() }
}

/// The IR dtype of ONNX's `TensorProto.DataType` `t`, where it is read: float, float16,
/// bfloat16, double (as f32), the integers (as i32, uint32 as u32) and bool.
pub fn dtype_of(t: i32) -> Option<DType> {
    Some(match t {
        1 | 11 => DType::F32,
        10 => DType::F16,
        16 => DType::BF16,
        2..=7 => DType::I32,
        12 => DType::U32,
        9 => DType::Bool,
        _ => return None,
    })
}

/// A `TensorProto`'s values (from `raw` where its data is external).
pub fn host_tensor(t: &TensorProto, raw: Option<&[u8]>) -> Result<HostTensor> {
    let err = |detail: String| OnnxError::Tensor { name: t.name.clone(), detail };
    let dims: Vec<usize> =
        t.dims.iter().map(|&d| usize::try_from(d).map_err(|_| err(format!("dimension {d}")))).collect::<Result<_>>()?;
    let n: usize = dims.iter().product();
    let raw = raw.unwrap_or(&t.raw_data);
    let from_raw = !raw.is_empty();
    let chunks = |size: usize| -> Result<Vec<&[u8]>> {
        if raw.len() != n * size {
            return Err(err(format!("{} bytes for {n} elements of {size}", raw.len())));
        }
        Ok(raw.chunks_exact(size).collect())
    };
    let ints = |v: Vec<i64>| -> Result<Vec<f64>> {
        // Saturate the int64 extremes exports use for "to the end" (a Slice's ends).
        v.into_iter()
            .map(|x| match i32::try_from(x) {
                Ok(x) => Ok(x as f64),
                Err(_) if x == i64::MAX || x == i64::MIN || x.abs() >= 1 << 40 => {
                    Ok(x.clamp(i32::MIN as i64, i32::MAX as i64) as f64)
                }
                Err(_) => Err(err(format!("int64 value {x} does not fit i32"))),
            })
            .collect()
    };
    let values: Vec<f64> = match t.data_type {
        1 if from_raw => chunks(4)?.iter().map(|c| f32::from_le_bytes((*c).try_into().expect("4")) as f64).collect(),
        1 => t.float_data.iter().map(|&x| x as f64).collect(),
        11 if from_raw => chunks(8)?.iter().map(|c| f64::from_le_bytes((*c).try_into().expect("8"))).collect(),
        11 => t.double_data.clone(),
        10 | 16 => {
            let bits: Vec<u16> = if from_raw {
                chunks(2)?.iter().map(|c| u16::from_le_bytes((*c).try_into().expect("2"))).collect()
            } else {
                t.int32_data.iter().map(|&x| x as u16).collect()
            };
            let half = |b: u16| {
                if t.data_type == 10 {
                    fusegraph_ir::f16::from_bits(b).to_f64()
                } else {
                    fusegraph_ir::bf16::from_bits(b).to_f64()
                }
            };
            bits.into_iter().map(half).collect()
        }
        7 if from_raw => ints(chunks(8)?.iter().map(|c| i64::from_le_bytes((*c).try_into().expect("8"))).collect())?,
        7 => ints(t.int64_data.clone())?,
        6 if from_raw => chunks(4)?.iter().map(|c| i32::from_le_bytes((*c).try_into().expect("4")) as f64).collect(),
        2 | 3 | 4 | 5 | 6 | 9 if !from_raw => t.int32_data.iter().map(|&x| x as f64).collect(),
        2 | 9 => chunks(1)?.iter().map(|c| c[0] as f64).collect(),
        3 => chunks(1)?.iter().map(|c| c[0] as i8 as f64).collect(),
        4 => chunks(2)?.iter().map(|c| u16::from_le_bytes((*c).try_into().expect("2")) as f64).collect(),
        5 => chunks(2)?.iter().map(|c| i16::from_le_bytes((*c).try_into().expect("2")) as f64).collect(),
        12 if from_raw => chunks(4)?.iter().map(|c| u32::from_le_bytes((*c).try_into().expect("4")) as f64).collect(),
        12 => t.uint64_data.iter().map(|&x| x as f64).collect(),
        other => return Err(err(format!("element type {other} is not read"))),
    };
    if values.len() != n {
        return Err(err(format!("{} values for dims {dims:?}", values.len())));
    }
    let dtype = dtype_of(t.data_type).expect("a read type");
    HostTensor::from_f64(dtype, dims, &values).map_err(|e| err(e.to_string()))
}
