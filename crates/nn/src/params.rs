//! Named parameter values on the host, their seeded initialization, and safetensors I/O.

use crate::error::{NnError, Result};
use crate::init::{Init, Rng};
use crate::module::{Module, Param};
use fusegraph_ir::safetensors;
use fusegraph_ir::{DType, GraphBuilder, HostTensor, Tensor};
use std::collections::BTreeMap;
use std::path::Path;

/// Named parameter values on the host (a state dict), drawn by seeded initializers.
///
/// [`Params::init`] gives every parameter of a [`Module`] that has no value yet one drawn by
/// its [`Init`] from a PCG generator seeded by [`Params::new`], in the module's visit
/// order: the same model and seed always give the same values. [`Params::parameter`] records a
/// parameter node and initializes it in one call (optimizers create their state this way).
/// [`Params::as_map`] is what `fusegraph_reference::evaluate` takes, and what a device
/// parameter store is filled from.
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

    /// The values of `module`'s parameters drawn from a generator seeded with `seed`.
    pub fn of(module: &dyn Module, seed: u64) -> Result<Self> {
        let mut p = Params::new(seed);
        p.init(module)?;
        Ok(p)
    }

    /// Gives every parameter of `module` without a value one drawn by its initializer, in
    /// visit order; a parameter that has a value must have its type ([`NnError::Shape`]).
    pub fn init(&mut self, module: &dyn Module) -> Result<()> {
        let mut err = None;
        module.visit(&mut |p| {
            if err.is_none() {
                err = self.declare(p).err();
            }
        });
        err.map_or(Ok(()), Err)
    }

    /// Gives `p` a value drawn by its initializer unless it has one (of its type).
    pub fn declare(&mut self, p: &Param) -> Result<()> {
        if let Some(v) = self.values.get(p.path()) {
            if v.ty() != *p.ty() {
                return Err(NnError::Shape { name: p.path().to_string(), expected: p.ty().clone(), got: v.ty() });
            }
            return Ok(());
        }
        let data = p.init().sample(&mut self.rng, p.ty().shape.numel())?;
        self.values.insert(p.path().to_string(), HostTensor::from_f64(p.ty().dtype, p.ty().shape.clone(), &data)?);
        Ok(())
    }

    /// The value of `name`, if any.
    pub fn get(&self, name: &str) -> Option<&HostTensor> {
        self.values.get(name)
    }

    /// Sets (or replaces) the value of `name`. No type check: a later [`Params::declare`] of
    /// another type will report [`NnError::Shape`].
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

    /// The values by name, taken out.
    pub fn into_map(self) -> BTreeMap<String, HostTensor> {
        self.values
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
        let p = Param::new(name, dtype, shape, init);
        self.declare(&p)?;
        p.get(b)
    }

    /// Writes every parameter to a safetensors file at `path` (see
    /// [`fusegraph_ir::safetensors`]).
    pub fn save_safetensors(&self, path: &Path) -> Result<()> {
        Ok(safetensors::write(path, self.values.iter().map(|(n, t)| (n.as_str(), t)))?)
    }

    /// Reads a safetensors file written by [`Params::save_safetensors`] or another library.
    ///
    /// Every parameter this set already holds must be in the file ([`NnError::Missing`]) with
    /// the same dtype and shape ([`NnError::Shape`]); its value is replaced. Tensors of the file
    /// that this set lacks are added. On error nothing is changed.
    pub fn load_safetensors(&mut self, path: &Path) -> Result<()> {
        let loaded = safetensors::read(path)?;
        for (name, old) in &self.values {
            match loaded.get(name) {
                None => return Err(NnError::Missing { name: name.clone() }),
                Some(t) if t.ty() != old.ty() => {
                    return Err(NnError::Shape { name: name.clone(), expected: old.ty(), got: t.ty() })
                }
                Some(_) => {}
            }
        }
        self.values.extend(loaded);
        Ok(())
    }
}
