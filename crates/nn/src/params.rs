//! Named parameter values on the host, their seeded initialization, and safetensors I/O.

use crate::error::{NnError, Result};
use crate::init::{Init, Rng};
use fusegraph_ir::{DType, GraphBuilder, HostData, HostTensor, Shape, Tensor, TensorType};
use half::f16;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::path::Path;

/// Named parameter values on the host, created by layers with seeded initializers.
///
/// Layers call [`Params::parameter`], which records a `Parameter` node in the graph and, the
/// first time a name is seen, draws its value from a xorshift generator seeded by
/// [`Params::new`]. Building the same model in the same order with the same seed therefore
/// gives the same values; building it again with the same `Params` (say for another batch
/// size) reuses the values already there. [`Params::as_map`] is what
/// `fusegraph_reference::evaluate` and the runtime take as parameter values.
#[derive(Clone, Debug)]
pub struct Params {
    values: BTreeMap<String, HostTensor>,
    rng: Rng,
}

impl Default for Params {
    /// `Params::new(0)`.
    fn default() -> Self {
        Params::new(0)
    }
}

impl Params {
    /// An empty set whose initializers draw from a generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Params { values: BTreeMap::new(), rng: Rng::new(seed) }
    }

    /// The value of `name`, if any.
    pub fn get(&self, name: &str) -> Option<&HostTensor> {
        self.values.get(name)
    }

    /// Sets (or replaces) the value of `name`. No type check: a later
    /// [`Params::parameter`] of another type will report [`NnError::Shape`].
    pub fn insert(&mut self, name: &str, value: HostTensor) {
        self.values.insert(name.to_string(), value);
    }

    /// Every `(name, value)`, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &HostTensor)> {
        self.values.iter()
    }

    /// The number of parameters.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are no parameters.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The total number of elements over all parameters.
    pub fn num_elements(&self) -> usize {
        self.values.values().map(|t| t.shape().numel()).sum()
    }

    /// The values by name, as `fusegraph_reference::evaluate` takes them.
    pub fn as_map(&self) -> &BTreeMap<String, HostTensor> {
        &self.values
    }

    /// Records a `Parameter` node `name` of type `dtype[shape]` in `b`, initializing its value
    /// with `init` if `name` has none yet. If it has one, its type must be `dtype[shape]`
    /// ([`NnError::Shape`] otherwise) and it is kept.
    pub fn parameter(
        &mut self,
        b: &GraphBuilder,
        name: &str,
        dtype: DType,
        shape: &[usize],
        init: Init,
    ) -> Result<Tensor> {
        self.parameter_with(b, name, dtype, shape, |rng, n| init.sample(rng, n))
    }

    /// [`Params::parameter`] with the initial values drawn by `values(rng, numel)`.
    pub(crate) fn parameter_with(
        &mut self,
        b: &GraphBuilder,
        name: &str,
        dtype: DType,
        shape: &[usize],
        values: impl FnOnce(&mut Rng, usize) -> Result<Vec<f64>>,
    ) -> Result<Tensor> {
        let expected = TensorType::new(dtype, shape);
        if let Some(v) = self.values.get(name) {
            if v.ty() != expected {
                return Err(NnError::Shape { name: name.to_string(), expected, got: v.ty() });
            }
        }
        let t = b.parameter(name, dtype, shape)?;
        if !self.values.contains_key(name) {
            let data = values(&mut self.rng, expected.shape.numel())?;
            self.values.insert(name.to_string(), HostTensor::from_f64(dtype, shape, &data)?);
        }
        Ok(t)
    }

    /// Writes every parameter to a safetensors file at `path`: f32, f16, i32 and u32 as
    /// themselves (little-endian), bool as `BOOL` (one byte per element, 0 or 1).
    pub fn save_safetensors(&self, path: &Path) -> Result<()> {
        let encoded: Vec<(&String, Dtype, Vec<usize>, Vec<u8>)> = self
            .values
            .iter()
            .map(|(name, t)| {
                let (dtype, bytes) = encode(t.data());
                (name, dtype, t.shape().dims().to_vec(), bytes)
            })
            .collect();
        let mut views = Vec::with_capacity(encoded.len());
        for (name, dtype, shape, bytes) in &encoded {
            let view = TensorView::new(*dtype, shape.clone(), bytes).map_err(st_err)?;
            views.push((name.as_str(), view));
        }
        let bytes = safetensors::serialize(views, None).map_err(st_err)?;
        std::fs::write(path, bytes).map_err(|source| NnError::Io { path: path.to_path_buf(), source })
    }

    /// Reads a safetensors file written by [`Params::save_safetensors`] (or by another
    /// library, for the dtypes F32, F16, I32, U32, BOOL and U8 — the last two read as bool).
    ///
    /// Every parameter this set already holds must be in the file ([`NnError::Missing`]) with
    /// the same dtype and shape ([`NnError::Shape`]); its value is replaced. Tensors of the file
    /// that this set lacks are added. On error nothing is changed.
    pub fn load_safetensors(&mut self, path: &Path) -> Result<()> {
        let bytes = std::fs::read(path).map_err(|source| NnError::Io { path: path.to_path_buf(), source })?;
        let file = SafeTensors::deserialize(&bytes).map_err(st_err)?;
        let mut loaded = BTreeMap::new();
        for (name, view) in file.iter() {
            let t = decode(name, &view)?;
            if let Some(old) = self.values.get(name) {
                if old.ty() != t.ty() {
                    return Err(NnError::Shape { name: name.to_string(), expected: old.ty(), got: t.ty() });
                }
            }
            loaded.insert(name.to_string(), t);
        }
        if let Some(name) = self.values.keys().find(|n| !loaded.contains_key(*n)) {
            return Err(NnError::Missing { name: name.clone() });
        }
        self.values.extend(loaded);
        Ok(())
    }
}

fn st_err(e: impl std::fmt::Display) -> NnError {
    NnError::SafeTensors(e.to_string())
}

/// The safetensors dtype and little-endian bytes of host data.
fn encode(d: &HostData) -> (Dtype, Vec<u8>) {
    match d {
        HostData::F32(v) => (Dtype::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        HostData::F16(v) => (Dtype::F16, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        HostData::I32(v) => (Dtype::I32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        HostData::U32(v) => (Dtype::U32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        HostData::Bool(v) => (Dtype::BOOL, v.iter().map(|&x| x as u8).collect()),
    }
}

/// A host tensor from a safetensors view.
fn decode(name: &str, view: &TensorView<'_>) -> Result<HostTensor> {
    let shape = Shape::new(view.shape());
    let raw = view.data();
    let words = || raw.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]);
    let t = match view.dtype() {
        Dtype::F32 => HostTensor::new(shape, words().map(f32::from_le_bytes).collect::<Vec<_>>()),
        Dtype::I32 => HostTensor::new(shape, words().map(i32::from_le_bytes).collect::<Vec<_>>()),
        Dtype::U32 => HostTensor::new(shape, words().map(u32::from_le_bytes).collect::<Vec<_>>()),
        Dtype::F16 => HostTensor::new(shape, raw.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]])).collect()),
        Dtype::BOOL | Dtype::U8 => HostTensor::new(shape, raw.iter().map(|&x| x != 0).collect::<Vec<_>>()),
        other => {
            return Err(NnError::SafeTensors(format!(
                "tensor `{name}` has dtype {other:?}, which fusegraph lacks (F32, F16, I32, U32, BOOL, U8 load)"
            )))
        }
    };
    Ok(t?)
}
