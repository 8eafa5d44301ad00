//! Modules: structs of layers whose parameters are named by where they sit in the tree.
//!
//! A [`Param`] declares a parameter — its path (`h.0.attn.q.weight`), type and initializer —
//! without a value and without a graph: a module is plain data (`Send + Sync`), built once
//! and recorded into any number of graphs (a training step, an evaluation at another batch
//! size, a decode step). `forward` records the parameter's node in the input's builder the
//! first time ([`Param::get`]) and reuses it after. Values live elsewhere: on the host in
//! [`crate::Params`] (seeded by [`crate::Params::init`]) or on a device in a runtime's
//! parameter store.
//!
//! Paths come from [`Scope`]s passed down at construction (`scope.at("attn").at("q")`), as
//! candle's `VarBuilder` does; [`Module::visit`] walks a module's parameters in construction
//! order, and [`crate::module!`] writes `visit` for a struct from its field list. This is a
//! declarative macro, not a derive: no proc-macro crate to build, and a struct's visit order
//! is the order its fields are listed, visible at the impl.

use crate::error::Result;
use crate::init::Init;
use fusegraph_ir::{DType, GraphBuilder, Tensor, TensorType};

/// A declared parameter: path, type and initializer.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    path: String,
    ty: TensorType,
    init: Init,
}

impl Param {
    /// A parameter `path` of type `dtype[shape]`, initialized by `init`.
    pub fn new(path: impl Into<String>, dtype: DType, shape: &[usize], init: Init) -> Param {
        Param { path: path.into(), ty: TensorType::new(dtype, shape), init }
    }

    /// This parameter stored as `dtype` (its shape and initializer kept).
    pub fn stored_as(self, dtype: DType) -> Param {
        Param { ty: TensorType::new(dtype, self.ty.shape.clone()), ..self }
    }

    /// Its full name, dot-separated (`h.0.attn.q.weight`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Its type.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// Its dimensions.
    pub fn dims(&self) -> &[usize] {
        self.ty.shape.dims()
    }

    /// How its first value is drawn.
    pub fn init(&self) -> Init {
        self.init
    }

    /// Its `Parameter` node in `b`: recorded the first time, the same node after.
    pub fn get(&self, b: &GraphBuilder) -> Result<Tensor> {
        Ok(b.parameter(&self.path, self.ty.dtype, self.ty.shape.clone())?)
    }

    /// Its value in `b` as `compute` values: the parameter itself, or cast from its storage
    /// dtype (a bf16 or f16 weight read by an f32 layer; the cast fuses into the reading
    /// kernel, so the stored bytes are what moves).
    pub fn read(&self, b: &GraphBuilder, compute: DType) -> Result<Tensor> {
        let t = self.get(b)?;
        Ok(if t.dtype() == compute { t } else { t.cast(compute)? })
    }
}

/// A position in a module tree: the path prefix of the parameters created under it.
///
/// A scope also says which dtype its parameters are stored in ([`Scope::storing`]; f32 unless
/// set) and which its matrices are ([`Scope::storing_matrices`]), inherited by its children.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    prefix: String,
    dtype: DType,
    matrices: Matrices,
}

/// The dtype a scope stores its matrices in — [`crate::Linear`] weights and
/// [`crate::Embedding`] tables, the parameters a block type ([`DType::Q8_0`],
/// [`DType::Q4_0`]) can hold.
///
/// A matrix of a block type has its blocks along the axis a product contracts: a linear
/// weight is then stored `[out, in]` (PyTorch's and GGUF's layout, read transposed), an
/// embedding table `[vocab, dim]` as always. A matrix whose rows are not whole blocks of 32
/// is stored in the scope's dtype.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Matrices {
    /// In the scope's dtype.
    #[default]
    AsScope,
    /// Every matrix in this dtype.
    All(DType),
    /// The matrices whose paths are keys in their dtype; the others in the scope's.
    ByPath(std::sync::Arc<std::collections::BTreeMap<String, DType>>),
}

impl Default for Scope {
    fn default() -> Self {
        Scope { prefix: String::new(), dtype: DType::F32, matrices: Matrices::AsScope }
    }
}

impl Scope {
    /// The root: parameters under it are named by their own names, stored as f32.
    pub fn root() -> Scope {
        Scope::default()
    }

    /// This scope with its parameters (and its children's) stored as `dtype`: f32, f16, or
    /// bf16 (storage only: layers read such a parameter through a cast to their computing
    /// dtype, [`Param::read`]).
    pub fn storing(&self, dtype: DType) -> Scope {
        Scope { dtype, ..self.clone() }
    }

    /// This scope with its matrices (and its children's) stored as `matrices` says.
    pub fn storing_matrices(&self, matrices: Matrices) -> Scope {
        Scope { matrices, ..self.clone() }
    }

    /// The child scope `name` (`h`, `0`, `attn`): its parameters are named `{path}.{name}.…`.
    pub fn at(&self, name: impl std::fmt::Display) -> Scope {
        let name = name.to_string();
        let prefix = match self.prefix.is_empty() {
            true => name,
            false => format!("{}.{name}", self.prefix),
        };
        Scope { prefix, ..self.clone() }
    }

    /// This scope's path (empty at the root).
    pub fn path(&self) -> &str {
        &self.prefix
    }

    /// The parameter `name` of this scope, in the scope's dtype, with `shape` and `init`.
    pub fn param(&self, name: &str, shape: &[usize], init: Init) -> Param {
        Param::new(self.at(name).prefix, self.dtype, shape, init)
    }

    /// The dtype of the matrix `name` of this scope whose rows (along the axis a product
    /// contracts) are `row` long: as [`Matrices`] says, the scope's dtype where that is a
    /// block type and `row` is not whole blocks.
    pub fn matrix_dtype(&self, name: &str, row: usize) -> DType {
        let path = self.at(name).prefix;
        let d = match &self.matrices {
            Matrices::AsScope => self.dtype,
            Matrices::All(d) => *d,
            Matrices::ByPath(m) => m.get(&path).copied().unwrap_or(self.dtype),
        };
        match d.block() {
            Some((elems, _)) if row % elems != 0 => self.dtype,
            _ => d,
        }
    }
}

/// A tree of parameters: a layer, a block, a model.
pub trait Module {
    /// Calls `f` with every parameter, in a fixed order (construction order for the library's
    /// layers).
    fn visit(&self, f: &mut dyn FnMut(&Param));

    /// Every parameter, in [`Module::visit`] order.
    fn params(&self) -> Vec<Param> {
        let mut out = Vec::new();
        self.visit(&mut |p| out.push(p.clone()));
        out
    }

    /// The total number of elements over all parameters.
    fn num_elements(&self) -> usize {
        let mut n = 0;
        self.visit(&mut |p| n += p.ty().shape.numel());
        n
    }

    /// Each parameter's `Parameter` node in `b`, with its path, in visit order (what
    /// optimizers take).
    fn tensors(&self, b: &GraphBuilder) -> Result<Vec<(String, Tensor)>> {
        self.params().into_iter().map(|p| Ok((p.path.clone(), p.get(b)?))).collect()
    }
}

/// A module applied to one tensor.
pub trait Forward: Module {
    /// Records the module applied to `x` into `x`'s graph.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
}

impl Module for Param {
    fn visit(&self, f: &mut dyn FnMut(&Param)) {
        f(self)
    }
}

impl<M: Module> Module for Option<M> {
    fn visit(&self, f: &mut dyn FnMut(&Param)) {
        if let Some(m) = self {
            m.visit(f)
        }
    }
}

impl<M: Module> Module for Vec<M> {
    fn visit(&self, f: &mut dyn FnMut(&Param)) {
        for m in self {
            m.visit(f)
        }
    }
}

impl<A: Module, B: Module> Module for (A, B) {
    fn visit(&self, f: &mut dyn FnMut(&Param)) {
        self.0.visit(f);
        self.1.visit(f);
    }
}

impl<M: Module + ?Sized> Module for Box<M> {
    fn visit(&self, f: &mut dyn FnMut(&Param)) {
        (**self).visit(f)
    }
}

/// Layers applied one after another; its parameters are its layers', in order.
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Forward + Send + Sync>>,
}

impl Sequential {
    /// No layers: the identity.
    pub fn new() -> Self {
        Sequential::default()
    }

    /// Appends `layer`.
    pub fn push(mut self, layer: impl Forward + Send + Sync + 'static) -> Self {
        self.layers.push(Box::new(layer));
        self
    }

    /// The number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether it has no layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

impl Module for Sequential {
    fn visit(&self, f: &mut dyn FnMut(&Param)) {
        for l in &self.layers {
            l.visit(f)
        }
    }
}

impl Forward for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.layers.iter().try_fold(x.clone(), |h, l| l.forward(&h))
    }
}

/// Implements [`Module`] for a struct from the fields that hold its parameters, visited in
/// the order listed:
///
/// ```
/// use fusegraph_nn::{module, Linear, Module, Scope};
///
/// struct Mlp { fc1: Linear, fc2: Linear, dropout: f64 }
/// module!(Mlp { fc1, fc2 });
///
/// let s = Scope::root();
/// let m = Mlp { fc1: Linear::new(&s.at("fc1"), 4, 8, true)?, fc2: Linear::new(&s.at("fc2"), 8, 2, true)?, dropout: 0.0 };
/// let paths: Vec<String> = m.params().iter().map(|p| p.path().to_string()).collect();
/// assert_eq!(paths, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]);
/// # Ok::<(), fusegraph_nn::NnError>(())
/// ```
#[macro_export]
macro_rules! module {
    ($ty:ty { $($field:ident),* $(,)? }) => {
        impl $crate::Module for $ty {
            fn visit(&self, f: &mut dyn FnMut(&$crate::Param)) {
                $( $crate::Module::visit(&self.$field, f); )*
            }
        }
    };
}
