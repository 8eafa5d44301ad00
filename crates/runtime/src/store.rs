//! [`ParamStore`]: parameters that live once on a device and are bound by any number of
//! executables.

use crate::memory::Allocation;
use crate::pool::Kind;
use crate::{Device, Result, RuntimeError};
use fusegraph_ir::safetensors::{self, SafetensorsError};
use fusegraph_ir::{HostTensor, TensorType};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Named parameters on one device, each in a buffer of its own, shared by every executable
/// compiled against the store ([`ParamStore::compile`]).
///
/// An executable binds the store's buffers directly: a training step's updates write them in
/// place, and an evaluation executable (another batch size, another graph) reads the new
/// values on its next run, with no copy. Values computed from parameters alone
/// ([`crate::CompileOptions::hoist_parameters`]) run again after any write to the store.
///
/// The buffers come from the device's pool: [`Device::memory`] counts each
/// parameter once however many executables bind it, and the device's `memory_limit` covers
/// the store and the executables together. A name's type is fixed when it is first inserted;
/// a buffer is never moved or freed while the store lives, so executables' bindings stay
/// valid. Cloning the store clones a handle to the same parameters.
#[derive(Clone)]
pub struct ParamStore {
    inner: Arc<Inner>,
}

struct Inner {
    device: Arc<Device>,
    entries: RwLock<BTreeMap<String, Entry>>,
    /// Bumped by every write: inserts, loads, and runs that update parameters.
    generation: AtomicU64,
}

struct Entry {
    ty: TensorType,
    alloc: Allocation,
}

impl std::fmt::Debug for ParamStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParamStore").field("parameters", &self.len()).field("bytes", &self.bytes()).finish()
    }
}

impl ParamStore {
    /// An empty store on `device`.
    pub fn new(device: &Arc<Device>) -> ParamStore {
        ParamStore {
            inner: Arc::new(Inner {
                device: device.clone(),
                entries: RwLock::new(BTreeMap::new()),
                generation: AtomicU64::new(0),
            }),
        }
    }

    /// The device the parameters live on.
    pub fn device(&self) -> &Arc<Device> {
        &self.inner.device
    }

    fn entries(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Entry>> {
        self.inner.entries.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The number of parameters.
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    /// Whether the store holds no parameter.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of device memory the parameters take.
    pub fn bytes(&self) -> u64 {
        self.entries().values().map(|e| e.alloc.size).sum()
    }

    /// Every parameter's name and type, sorted by name.
    pub fn parameters(&self) -> Vec<(String, TensorType)> {
        self.entries().iter().map(|(n, e)| (n.clone(), e.ty.clone())).collect()
    }

    /// The type of `name`, if the store holds it.
    pub fn ty(&self, name: &str) -> Option<TensorType> {
        self.entries().get(name).map(|e| e.ty.clone())
    }

    /// How many writes the store has seen (inserts, loads, updating runs); executables compare
    /// it to know when values they derived from parameters are out of date.
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    /// Records a write to the parameters and returns the new generation.
    pub(crate) fn bump(&self) -> u64 {
        self.inner.generation.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The buffer of `name`.
    pub(crate) fn buffer(&self, name: &str) -> Option<wgpu::Buffer> {
        self.entries().get(name).map(|e| e.alloc.buffer().clone())
    }

    /// Sets (or adds) one parameter: see [`ParamStore::insert_all`].
    pub fn insert(&self, name: &str, value: &HostTensor) -> Result<()> {
        self.insert_all([(name, value)])
    }

    /// Sets the value of every `(name, value)`: a name the store holds keeps its buffer and
    /// must keep its type ([`RuntimeError::WrongType`]); a new name gets a buffer from the
    /// device's pool ([`RuntimeError::DeviceMemory`] past the device's memory limit). All or
    /// nothing: on error no value is written and no buffer added.
    pub fn insert_all<'a, S: AsRef<str> + 'a>(
        &self,
        values: impl IntoIterator<Item = (S, &'a HostTensor)>,
    ) -> Result<()> {
        let values: Vec<(S, &HostTensor)> = values.into_iter().collect();
        let mut entries = self.inner.entries.write().unwrap_or_else(|p| p.into_inner());
        let mut added: BTreeMap<String, Entry> = BTreeMap::new();
        for (name, value) in &values {
            let name = name.as_ref();
            match entries.get(name).map(|e| &e.ty).or_else(|| added.get(name).map(|e| &e.ty)) {
                Some(ty) if *ty != value.ty() => {
                    return Err(RuntimeError::WrongType {
                        what: "store parameter",
                        name: name.into(),
                        expected: ty.clone(),
                        got: value.ty(),
                    })
                }
                Some(_) => {}
                None => {
                    let mut slack = 0;
                    let bytes = value.ty().buffer_bytes() as u64;
                    let alloc =
                        self.inner.device.allocate(Kind::Storage, bytes, &mut slack, &format!("parameter `{name}`"))?;
                    added.insert(name.to_string(), Entry { ty: value.ty(), alloc });
                }
            }
        }
        entries.extend(added);
        let queue = &self.inner.device.queue;
        for (name, value) in &values {
            queue.write_buffer(entries[name.as_ref()].alloc.buffer(), 0, &value.to_bytes());
        }
        self.bump();
        Ok(())
    }

    /// The current value of `name` (after every submitted update), read back from the device.
    pub fn get(&self, name: &str) -> Result<HostTensor> {
        let mut all = self.read(&[name])?;
        Ok(all.remove(name).expect("read returns every name asked"))
    }

    /// Every parameter's current value, read back in one submit.
    pub fn read_all(&self) -> Result<BTreeMap<String, HostTensor>> {
        let names: Vec<String> = self.entries().keys().cloned().collect();
        self.read(&names)
    }

    /// The values of `names`, read back in one submit.
    pub fn read<S: AsRef<str>>(&self, names: &[S]) -> Result<BTreeMap<String, HostTensor>> {
        let entries = self.entries();
        let d = &self.inner.device;
        let mut parts = Vec::new();
        let mut offset = 0u64;
        for name in names {
            let name = name.as_ref();
            let e = entries.get(name).ok_or_else(|| RuntimeError::UnknownParameter { name: name.into() })?;
            let size = e.ty.buffer_bytes() as u64;
            parts.push((name, e, offset, size));
            offset += size.next_multiple_of(4);
        }
        if parts.is_empty() {
            return Ok(BTreeMap::new());
        }
        let read = crate::memory::buffer(
            d,
            "fusegraph store readback",
            offset,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        );
        let mut encoder =
            d.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("fusegraph read store") });
        for &(_, e, at, size) in &parts {
            encoder.copy_buffer_to_buffer(e.alloc.buffer(), 0, &read, at, size.next_multiple_of(4));
        }
        d.queue.submit([encoder.finish()]);
        read.map_async(wgpu::MapMode::Read, .., |_| {});
        let wgpu_err = |e: &dyn std::fmt::Display| RuntimeError::Wgpu {
            during: "reading the parameter store".into(),
            detail: e.to_string(),
        };
        d.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| wgpu_err(&e))?;
        let out = {
            let view = read.get_mapped_range(..).map_err(|e| wgpu_err(&e))?;
            parts
                .iter()
                .map(|&(name, e, at, size)| {
                    Ok((name.to_string(), HostTensor::from_bytes(&e.ty, &view[at as usize..(at + size) as usize])?))
                })
                .collect::<Result<BTreeMap<_, _>>>()
        };
        read.unmap();
        out
    }

    /// Writes every parameter to a safetensors file at `path` (through a temporary file, so a
    /// failure leaves any previous file whole).
    pub fn save_safetensors(&self, path: &Path) -> Result<()> {
        let values = self.read_all()?;
        Ok(safetensors::write(path, values.iter().map(|(n, t)| (n.as_str(), t)))?)
    }

    /// Loads a safetensors file: every parameter the store holds must be in it
    /// ([`RuntimeError::MissingInCheckpoint`]) with its type ([`RuntimeError::WrongType`]);
    /// tensors the store lacks are added. All or nothing: on error the store is unchanged.
    pub fn load_safetensors(&self, path: &Path) -> Result<()> {
        let file = safetensors::read(path)?;
        self.load(&file, &path.display().to_string())
    }

    /// [`ParamStore::load_safetensors`] from tensors already in memory; `source` names them
    /// in errors.
    pub fn load(&self, tensors: &BTreeMap<String, HostTensor>, source: &str) -> Result<()> {
        for (name, ty) in self.parameters() {
            match tensors.get(&name) {
                None => return Err(RuntimeError::MissingInCheckpoint { name, ty, file: source.to_string() }),
                Some(t) if t.ty() != ty => {
                    return Err(RuntimeError::WrongType { what: "checkpoint tensor", name, expected: ty, got: t.ty() })
                }
                Some(_) => {}
            }
        }
        self.insert_all(tensors.iter())
    }
}

impl From<SafetensorsError> for RuntimeError {
    fn from(e: SafetensorsError) -> Self {
        RuntimeError::Checkpoint(e)
    }
}
