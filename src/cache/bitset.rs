//! [`Bitset`]: which samples a backend holds, one bit per sample id.
//!
//! A leaf module of its own because both backends (`files.rs`, `packed/`) keep one: while it
//! lived in `store.rs`, the backends imported the store that is built on them.

use std::sync::atomic::{AtomicU64, Ordering};

/// A fixed-size set of sample ids, safe to update from many threads.
pub struct Bitset(Vec<AtomicU64>);

impl Bitset {
    pub fn new(len: u32) -> Bitset {
        Bitset((0..len.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }
    pub fn get(&self, i: u32) -> bool {
        self.0[(i / 64) as usize].load(Ordering::Acquire) & (1 << (i % 64)) != 0
    }
    /// Sets bit `i`; returns whether it was already set.
    pub fn set(&self, i: u32) -> bool {
        self.0[(i / 64) as usize].fetch_or(1 << (i % 64), Ordering::AcqRel) & (1 << (i % 64)) != 0
    }
    pub fn len(&self) -> u32 {
        (self.0.len() * 64) as u32
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Clears bit `i`; returns whether it was set.
    pub fn clear(&self, i: u32) -> bool {
        self.0[(i / 64) as usize].fetch_and(!(1 << (i % 64)), Ordering::AcqRel) & (1 << (i % 64))
            != 0
    }
}
