//! Device memory accounting: every buffer an executable holds comes from the device's pool,
//! which tracks allocated, reserved and peak bytes (the numbers users know from
//! `torch.cuda.memory_allocated()` and friends), enforces the device's `memory_limit`, and
//! caches released buffers for reuse until [`Device::empty_cache`].

use crate::{Device, Result, RuntimeError};
use std::sync::{Arc, Mutex};

/// Which usage a pooled buffer was created with; only equal kinds are reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// STORAGE | COPY_DST | COPY_SRC: arenas and persistent regions.
    Storage,
    /// MAP_READ | COPY_DST: readback.
    Staging,
}

impl Kind {
    fn usage(self) -> wgpu::BufferUsages {
        match self {
            Kind::Storage => wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            Kind::Staging => wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        }
    }
}

#[derive(Default)]
struct State {
    allocated: u64,
    peak: u64,
    cache: Vec<(Kind, u64, wgpu::Buffer)>,
}

impl State {
    fn cached(&self) -> u64 {
        self.cache.iter().map(|(_, s, _)| s).sum()
    }
}

/// The pool of one device.
#[derive(Default)]
pub(crate) struct Pool {
    limit: Option<u64>,
    state: Mutex<State>,
}

/// A buffer held by an executable; it returns to the pool's cache when dropped.
pub(crate) struct Allocation {
    pub(crate) buffer: Option<wgpu::Buffer>,
    pub(crate) size: u64,
    kind: Kind,
    device: Arc<Device>,
}

impl Allocation {
    pub(crate) fn buffer(&self) -> &wgpu::Buffer {
        self.buffer.as_ref().expect("present until dropped")
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            let mut st = self.device.pool.state.lock().unwrap_or_else(|p| p.into_inner());
            st.allocated -= self.size;
            st.cache.push((self.kind, self.size, buffer));
        }
    }
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

/// A texture held by an executable (the subgroup matmul's operands on CPU adapters, see
/// `fusegraph_wgsl::LowerOptions::texture_operands`), counted in the pool's allocated bytes
/// until dropped. Textures are not cached.
pub(crate) struct TextureAllocation {
    pub(crate) texture: wgpu::Texture,
    pub(crate) view: wgpu::TextureView,
    pub(crate) size: u64,
    device: Arc<Device>,
}

impl Drop for TextureAllocation {
    fn drop(&mut self) {
        let mut st = self.device.pool.state.lock().unwrap_or_else(|p| p.into_inner());
        st.allocated -= self.size;
    }
}

/// Makes room for `size` more bytes under the pool's limit, if it has one: fails if the
/// allocated bytes leave no room, else releases cached buffers, largest first, until the new
/// allocation fits beside what remains.
fn reserve(pool: &Pool, st: &mut State, size: u64, label: &str) -> Result<()> {
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

impl Device {
    /// Takes a buffer of at least `size` bytes (4 minimum) from the cache, or creates one,
    /// releasing cached buffers first if the limit requires it. A cached buffer may be up to
    /// 25% larger than asked, and no more than `slack` bytes larger (what the caller's own
    /// memory limit leaves); the extra is taken from `slack`.
    pub(crate) fn allocate(
        self: &Arc<Self>,
        kind: Kind,
        size: u64,
        slack: &mut u64,
        label: &str,
    ) -> Result<Allocation> {
        let size = buffer_bytes(size);
        let mut st = self.pool.state.lock().unwrap_or_else(|p| p.into_inner());
        // Best fit among cached buffers of this kind within the allowance.
        let most = size + (size / 4).min(*slack);
        let pick = st
            .cache
            .iter()
            .enumerate()
            .filter(|(_, (k, s, _))| *k == kind && *s >= size && *s <= most)
            .min_by_key(|(_, (_, s, _))| *s)
            .map(|(i, _)| i);
        let (size, buffer) = match pick {
            Some(i) => {
                let (_, s, b) = st.cache.swap_remove(i);
                *slack -= s - size;
                (s, b)
            }
            None => {
                reserve(&self.pool, &mut st, size, label)?;
                let b = self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size,
                    usage: kind.usage(),
                    mapped_at_creation: false,
                });
                (size, b)
            }
        };
        st.allocated += size;
        st.peak = st.peak.max(st.allocated);
        Ok(Allocation { buffer: Some(buffer), size, kind, device: self.clone() })
    }

    /// A `width`×`height` 2-D texture of `format` that kernels sample and copies write,
    /// counted against the limit like a buffer.
    pub(crate) fn allocate_texture(
        self: &Arc<Self>,
        format: wgpu::TextureFormat,
        width: u32,
        height: u32,
        label: &str,
    ) -> Result<TextureAllocation> {
        let size = width as u64 * height as u64 * texel_bytes(format);
        let mut st = self.pool.state.lock().unwrap_or_else(|p| p.into_inner());
        reserve(&self.pool, &mut st, size, label)?;
        let texture = self.device.create_texture(&wgpu::TextureDescriptor {
            label: Some(label),
            size: wgpu::Extent3d { width, height, depth_or_array_layers: 1 },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format,
            usage: wgpu::TextureUsages::TEXTURE_BINDING | wgpu::TextureUsages::COPY_DST,
            view_formats: &[],
        });
        let view = texture.create_view(&wgpu::TextureViewDescriptor::default());
        st.allocated += size;
        st.peak = st.peak.max(st.allocated);
        Ok(TextureAllocation { texture, view, size, device: self.clone() })
    }

    /// Bytes of device memory held by live executables (like `memory_allocated`).
    pub fn memory_allocated(&self) -> u64 {
        self.pool.state.lock().unwrap_or_else(|p| p.into_inner()).allocated
    }

    /// Bytes held by live executables plus released buffers kept for reuse (like
    /// `memory_reserved`).
    pub fn memory_reserved(&self) -> u64 {
        let st = self.pool.state.lock().unwrap_or_else(|p| p.into_inner());
        st.allocated + st.cached()
    }

    /// The highest [`Self::memory_allocated`] since the device opened or the last
    /// [`Self::reset_peak_memory_stats`] (like `max_memory_allocated`).
    pub fn max_memory_allocated(&self) -> u64 {
        self.pool.state.lock().unwrap_or_else(|p| p.into_inner()).peak
    }

    /// Resets the peak to the current allocation.
    pub fn reset_peak_memory_stats(&self) {
        let mut st = self.pool.state.lock().unwrap_or_else(|p| p.into_inner());
        st.peak = st.allocated;
    }

    /// Releases every cached buffer no executable uses (like `empty_cache`).
    pub fn empty_cache(&self) {
        self.pool.state.lock().unwrap_or_else(|p| p.into_inner()).cache.clear();
    }

    /// The device's memory limit, if one was set.
    pub fn memory_limit(&self) -> Option<u64> {
        self.pool.limit()
    }
}
