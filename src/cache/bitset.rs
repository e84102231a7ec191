//! [`Bitset`]: which samples a backend holds, one bit per sample id.
//!
//! A leaf module of its own because both backends (`files.rs`, `packed/`) keep one: while it
//! lived in `store.rs`, the backends imported the store that is built on them.

use std::sync::atomic::{AtomicU64, Ordering};

/// A fixed-size set of sample ids, safe to update from many threads.
pub(crate) struct Bitset(Vec<AtomicU64>);

impl Bitset {
    pub(crate) fn new(len: u64) -> Bitset {
        Bitset((0..len.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }
    pub(crate) fn get(&self, i: u64) -> bool {
        self.0[(i / 64) as usize].load(Ordering::Acquire) & (1 << (i % 64)) != 0
    }
    /// Sets bit `i`; returns whether it was already set.
    pub(crate) fn set(&self, i: u64) -> bool {
        self.0[(i / 64) as usize].fetch_or(1 << (i % 64), Ordering::AcqRel) & (1 << (i % 64)) != 0
    }
    pub(crate) fn len(&self) -> u64 {
        (self.0.len() * 64) as u64
    }
    /// Clears bit `i`; returns whether it was set.
    pub(crate) fn clear(&self, i: u64) -> bool {
        self.0[(i / 64) as usize].fetch_and(!(1 << (i % 64)), Ordering::AcqRel) & (1 << (i % 64))
            != 0
    }
}
