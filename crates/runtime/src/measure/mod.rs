//! Everything that measures the adapter: the cost model fusion weighs ([`cost`]), the
//! kernel forms ([`forms`]), the matmul tilings, families and split-k slice counts
//! ([`autotune`]). What they keep between runs (in memory per device, on disk per adapter
//! and driver) is [`crate::tuned`], which the device holds.
//!
//! Measuring compiles and runs small executables on the device, and compiling asks for
//! measured choices. One rule keeps that from recursing: while a thread measures
//! ([`during`]), every measured choice it asks for is the adapter's default (the cost
//! model's defaults, the default forms, the default tiling and family, no split), and
//! nothing new is measured. Each entry point checks [`measuring`] first; each measurement
//! runs inside [`during`].

pub(crate) mod autotune;
pub(crate) mod cost;
pub(crate) mod forms;

use std::cell::Cell;

thread_local! {
    /// Set while this thread measures the adapter.
    static MEASURING: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is measuring the adapter: measured choices then take the defaults.
pub(crate) fn measuring() -> bool {
    MEASURING.get()
}

/// Runs `f` as a measurement: [`measuring`] holds while it runs (and is unset again if it
/// panics).
pub(crate) fn during<T>(f: impl FnOnce() -> T) -> T {
    struct Unset;
    impl Drop for Unset {
        fn drop(&mut self) {
            MEASURING.set(false);
        }
    }
    MEASURING.set(true);
    let _unset = Unset;
    f()
}

impl crate::Device {
    /// The tilings, families, split counts and kernel forms measured on this device so far
    /// (or read from the disk cache).
    pub fn tuned(&self) -> crate::tuned::Tuned {
        let t = self.tuner.lock().unwrap_or_else(|p| p.into_inner());
        crate::tuned::Tuned {
            tilings: t.tilings.by_class.values().cloned().collect(),
            families: t.families.by_class.values().cloned().collect(),
            splits: t.splits.by_class.values().cloned().collect(),
            forms: t.forms.by_class.values().cloned().collect(),
        }
    }
}
