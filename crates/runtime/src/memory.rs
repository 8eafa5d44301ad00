//! Device memory accounting: every buffer an executable holds comes from the device's pool,
//! which tracks allocated, reserved and peak bytes (the numbers users know from
//! `torch.cuda.memory().allocated` and friends), enforces the device's `memory_limit`, and
//! caches released buffers for reuse until [`Device::empty_cache`].

use crate::pool::{buffer_bytes, reserve, texel_bytes, Kind};
use crate::{Device, Result};
use std::sync::Arc;

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

/// A texture held by an executable (the subgroup matmul's operands where it reads textures, see
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

    /// The device memory statistics now: allocated, reserved, peak and limit.
    pub fn memory(&self) -> MemoryStats {
        let st = self.pool.state.lock().unwrap_or_else(|p| p.into_inner());
        MemoryStats {
            allocated: st.allocated,
            reserved: st.allocated + st.cached(),
            peak: st.peak,
            limit: self.pool.limit(),
        }
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
}

/// [`Device::memory`]: what PyTorch's `memory_allocated`, `memory_reserved` and
/// `max_memory_allocated` report, and the limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes of device memory held by live executables and parameter stores.
    pub allocated: u64,
    /// `allocated` plus released buffers kept for reuse ([`Device::empty_cache`] frees
    /// them).
    pub reserved: u64,
    /// The highest `allocated` since the device opened or the last
    /// [`Device::reset_peak_memory_stats`].
    pub peak: u64,
    /// The device's memory limit (`DeviceOptions::memory_limit`), if one was set.
    pub limit: Option<u64>,
}

/// A buffer outside the pool (readback and timestamp buffers, a run's own), at least 4 bytes.
pub(crate) fn buffer(device: &Device, label: &str, size: u64, usage: wgpu::BufferUsages) -> wgpu::Buffer {
    device.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: buffer_bytes(size),
        usage,
        mapped_at_creation: false,
    })
}
