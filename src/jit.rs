//! Shape-keyed compilation: [`Jit`] records and compiles a model function once per input
//! signature (names, shapes, dtypes) and reuses the executable after, like `jax.jit`.

use crate::{CompileOptions, Error, Executable, GraphBuilder, HostTensor, Outputs, ParamStore, Result, Tensor};
use crate::{FeedName, TensorType};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The inputs of one call: each feed's name and type, in order.
pub type Signature = Vec<(String, TensorType)>;

/// A model function compiled per input signature against a [`ParamStore`].
///
/// `model(b, inputs)` records the model into the fresh builder `b`, given one input tensor
/// per feed (named and typed as fed, in the feeds' order), and returns the outputs. The first
/// call with a signature records and compiles (a miss); later calls with the same names,
/// shapes and dtypes run the cached executable (a hit). Every executable binds the store, so
/// they all read the same parameters, trained or loaded in place.
///
/// ```no_run
/// use fusegraph::nn::{Forward, Linear, Params, Scope};
/// use fusegraph::{Device, HostTensor, Jit, ParamStore};
///
/// # fn main() -> fusegraph::Result<()> {
/// let fc = Linear::new(&Scope::root().at("fc"), 4, 2, true)?;
/// let store = ParamStore::new(&Device::shared()?);
/// store.insert_all(Params::of(&fc, 0)?.iter())?;
/// let jit = Jit::new(&store, Default::default(), |_, x| Ok(vec![fc.forward(&x[0])?.relu()?]));
/// for batch in [1, 7, 32, 7] {
///     let x = HostTensor::new([batch, 4], vec![0.5f32; batch * 4])?;
///     let y = jit.run(&[("x", &x)])?;
///     assert_eq!(y[0].shape().dims(), &[batch, 2]);
/// }
/// assert_eq!((jit.misses(), jit.hits()), (3, 1));
/// # Ok(()) }
/// ```
pub struct Jit<F> {
    store: ParamStore,
    opts: CompileOptions,
    model: F,
    cache: Mutex<HashMap<Signature, Arc<Executable>>>,
    hits: AtomicUsize,
    misses: AtomicUsize,
}

impl<F> Jit<F>
where
    F: Fn(&GraphBuilder, &[Tensor]) -> Result<Vec<Tensor>>,
{
    /// A jit of `model` whose executables bind `store` and compile with `opts`.
    pub fn new(store: &ParamStore, opts: CompileOptions, model: F) -> Self {
        Jit {
            store: store.clone(),
            opts,
            model,
            cache: Mutex::new(HashMap::new()),
            hits: AtomicUsize::new(0),
            misses: AtomicUsize::new(0),
        }
    }

    /// The executable for `signature`: from the cache, or recorded and compiled now.
    pub fn executable(&self, signature: &Signature) -> Result<Arc<Executable>> {
        if let Some(exe) = self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(signature) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(exe.clone());
        }
        let b = GraphBuilder::new();
        let inputs = signature
            .iter()
            .map(|(name, ty)| b.input(name, ty.dtype, ty.shape.clone()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let outputs = (self.model)(&b, &inputs)?;
        if outputs.is_empty() {
            return Err(Error::Config("jit: the model function returned no outputs".into()));
        }
        let ids: Vec<_> = outputs.iter().map(|t| t.id()).collect();
        let exe = Arc::new(self.store.compile(&b.graph(), &ids, &self.opts)?);
        self.misses.fetch_add(1, Ordering::Relaxed);
        // Two threads that missed at once both compiled; the first insert wins.
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        Ok(cache.entry(signature.clone()).or_insert(exe).clone())
    }

    /// Runs the model on `feeds` (by input name), compiling it first for a new signature.
    pub fn run<K: FeedName>(&self, feeds: &[(K, &HostTensor)]) -> Result<Outputs> {
        let signature =
            feeds.iter().map(|(k, v)| Ok((k.feed_name()?.into_owned(), v.ty()))).collect::<Result<Signature>>()?;
        let exe = self.executable(&signature)?;
        let named: Vec<(&str, &HostTensor)> =
            signature.iter().map(|(n, _)| n.as_str()).zip(feeds.iter().map(|f| f.1)).collect();
        Ok(exe.run(&named)?)
    }

    /// Calls that found their executable in the cache.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::Relaxed)
    }

    /// Calls that recorded and compiled.
    pub fn misses(&self) -> usize {
        self.misses.load(Ordering::Relaxed)
    }

    /// The signatures compiled so far.
    pub fn signatures(&self) -> Vec<Signature> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect()
    }

    /// The store the executables bind.
    pub fn store(&self) -> &ParamStore {
        &self.store
    }
}
