//! One way to take a lock, for every crate above this one: [`Locked::locked`], and
//! [`RwLocked::read_locked`] / [`RwLocked::write_locked`].
//!
//! A lock is poisoned when a thread panicked while holding it. The daemon takes such a lock
//! anyway: what each of its locks guards (tables, queues, counters, caches of handles) is
//! whole between statements, so the state a panicking thread left is still one a reader can
//! use, and refusing it would turn one failed request into a daemon that fails every later
//! one. Taking it in one place (instead of `lock().unwrap_or_else(..)` at every call, in
//! several spellings and seven local helpers before) also leaves one place to swap in a
//! model checker's mutex (loom, shuttle) later. Condition variables' waits still say it
//! where they wait.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// [`Mutex::lock`] that takes a poisoned lock too (see the module docs).
pub trait Locked<T: ?Sized> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`RwLock::read`] and [`RwLock::write`] that take a poisoned lock too.
pub trait RwLocked<T: ?Sized> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLocked<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::Locked;
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_poisoned_lock_is_taken_with_what_it_held() {
        let m = Arc::new(Mutex::new(vec![1]));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let mut g = m2.lock().unwrap();
            g.push(2);
            panic!("poisons the lock");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*m.locked(), vec![1, 2]);
    }
}
