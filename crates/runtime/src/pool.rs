//! The device's memory pool: allocated, peak and cached bytes under an optional limit.

use crate::{Result, RuntimeError};
use std::sync::Mutex;

/// Which usage a pooled buffer was created with; only equal kinds are reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// STORAGE | COPY_DST | COPY_SRC: arenas and persistent regions.
    Storage,
    /// MAP_READ | COPY_DST: readback.
    Staging,
}

impl Kind {
    pub(crate) fn usage(self) -> wgpu::BufferUsages {
        match self {
            Kind::Storage => wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            Kind::Staging => wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        }
    }
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) allocated: u64,
    pub(crate) peak: u64,
    pub(crate) cache: Vec<(Kind, u64, wgpu::Buffer)>,
}

impl State {
    pub(crate) fn cached(&self) -> u64 {
        self.cache.iter().map(|(_, s, _)| s).sum()
    }
}

/// The pool of one device.
#[derive(Default)]
pub(crate) struct Pool {
    pub(crate) limit: Option<u64>,
    pub(crate) state: Mutex<State>,
}

impl Pool {
    pub(crate) fn new(limit: Option<u64>) -> Self {
        Pool { limit, state: Mutex::new(State::default()) }
    }

    pub(crate) fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// Bytes still allocatable under the limit (cache counts as free: it can be released).
    pub(crate) fn available(&self) -> Option<u64> {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.limit.map(|l| l.saturating_sub(st.allocated))
    }
}

/// Makes room for `size` more bytes under the pool's limit, if it has one: fails if the
/// allocated bytes leave no room, else releases cached buffers, largest first, until the new
/// allocation fits beside what remains.
pub(crate) fn reserve(pool: &Pool, st: &mut State, size: u64, label: &str) -> Result<()> {
    if let Some(limit) = pool.limit {
        if st.allocated + size > limit {
            return Err(RuntimeError::DeviceMemory { what: label.into(), bytes: size, allocated: st.allocated, limit });
        }
        st.cache.sort_by_key(|(_, s, _)| *s);
        while st.allocated + st.cached() + size > limit {
            st.cache.pop();
        }
    }
    Ok(())
}

/// Bytes per texel of a (color) texture format.
pub(crate) fn texel_bytes(format: wgpu::TextureFormat) -> u64 {
    format.block_copy_size(None).expect("a color format") as u64
}

/// The bytes a buffer for `size` bytes takes: wgpu buffers here are at least 4 bytes.
pub(crate) fn buffer_bytes(size: u64) -> u64 {
    size.max(4)
}
