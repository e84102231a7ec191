//! Transports that misbehave on purpose, for tests: each wraps another `Comm` and changes
//! only its point-to-point transfers (collectives pass through; they run at setup, not in
//! the exchange under test).
//!
//! - [`Delaying`]: a pseudo-random sleep before each transfer, so arrivals from different
//!   peers reorder.
//! - [`Failing`]: a broken link: an error from the Nth transfer on, or from the one that
//!   takes the bytes sent past a budget.
//! - [`Slow`]: a thin link: sends capped at a number of bytes per second.
//!
//! A split of a wrapped transport is not wrapped: the doubles act on the communicator they
//! were given.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::{Batch, Comm, CommError};
use crate::plan::Rank;

/// Forwards everything but `transfer` to the wrapped transport.
macro_rules! delegate {
    () => {
        fn rank(&self) -> Rank {
            self.inner.rank()
        }
        fn size(&self) -> u32 {
            self.inner.size()
        }
        fn hosts(&self) -> &[u32] {
            self.inner.hosts()
        }
        fn all_gather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
            self.inner.all_gather(data)
        }
        fn broadcast(&mut self, root: Rank, data: Vec<u8>) -> Result<Vec<u8>, CommError> {
            self.inner.broadcast(root, data)
        }
        fn split(&mut self, color: u32) -> Result<Box<dyn Comm>, CommError> {
            self.inner.split(color)
        }
    };
}

/// Sleeps a pseudo-random while (under 1.5 ms) before each transfer.
pub struct Delaying<C> {
    inner: C,
    state: u64,
}

impl<C: Comm> Delaying<C> {
    /// Different seeds give different delays: seed each rank differently.
    pub fn new(inner: C, seed: u64) -> Delaying<C> {
        Delaying { inner, state: seed }
    }
}

impl<C: Comm> Comm for Delaying<C> {
    delegate!();

    fn transfer(&mut self, tag: u16, batch: Batch, abort: &AtomicBool) -> Result<Batch, CommError> {
        self.state = self
            .state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        thread::sleep(Duration::from_micros((self.state >> 33) % 1500));
        self.inner.transfer(tag, batch, abort)
    }
}

/// Fails every transfer from a given one on, like a link that broke: the failing call
/// moves nothing.
pub struct Failing<C> {
    inner: C,
    fail_at: Option<u64>,
    byte_budget: Option<u64>,
    transfers: u64,
    bytes: u64,
    broken: bool,
    /// Fail the next transfer once this is set (then clear it): a one-off fault a test
    /// injects at a moment of its choosing.
    armed: Option<Arc<AtomicBool>>,
}

impl<C: Comm> Failing<C> {
    /// Fails transfer number `n` (counting from 0) and every one after it.
    pub fn at_transfer(inner: C, n: u64) -> Failing<C> {
        Failing {
            inner,
            fail_at: Some(n),
            byte_budget: None,
            transfers: 0,
            bytes: 0,
            broken: false,
            armed: None,
        }
    }

    /// Fails the next transfer each time `armed` is set (clearing it); otherwise passes
    /// everything on.
    pub fn when_armed(inner: C, armed: Arc<AtomicBool>) -> Failing<C> {
        Failing {
            armed: Some(armed),
            ..Failing::after_bytes(inner, u64::MAX)
        }
    }

    /// Fails the transfer that would take the bytes sent past `budget`, and every later one.
    pub fn after_bytes(inner: C, budget: u64) -> Failing<C> {
        Failing {
            inner,
            fail_at: None,
            byte_budget: Some(budget),
            transfers: 0,
            bytes: 0,
            broken: false,
            armed: None,
        }
    }
}

impl<C: Comm> Comm for Failing<C> {
    delegate!();

    fn transfer(&mut self, tag: u16, batch: Batch, abort: &AtomicBool) -> Result<Batch, CommError> {
        let n = self.transfers;
        self.transfers += 1;
        if self
            .armed
            .as_ref()
            .is_some_and(|a| a.swap(false, Ordering::SeqCst))
        {
            return Err(CommError::Injected(format!(
                "transfer {n} of rank {} failed on request",
                self.rank()
            )));
        }
        let bytes = self.bytes + batch.sends.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
        self.broken |= self.fail_at.is_some_and(|at| n >= at)
            || self.byte_budget.is_some_and(|budget| bytes > budget);
        if self.broken {
            return Err(CommError::Injected(format!(
                "transfer {n} of rank {} failed",
                self.rank()
            )));
        }
        self.bytes = bytes;
        self.inner.transfer(tag, batch, abort)
    }
}

/// Caps the average rate of bytes sent, sleeping after each transfer as long as needed.
pub struct Slow<C> {
    inner: C,
    bytes_per_second: u64,
    start: Instant,
    sent: u64,
}

impl<C: Comm> Slow<C> {
    pub fn new(inner: C, bytes_per_second: u64) -> Slow<C> {
        Slow {
            inner,
            bytes_per_second: bytes_per_second.max(1),
            start: Instant::now(),
            sent: 0,
        }
    }
}

impl<C: Comm> Comm for Slow<C> {
    delegate!();

    fn transfer(&mut self, tag: u16, batch: Batch, abort: &AtomicBool) -> Result<Batch, CommError> {
        let bytes: u64 = batch.sends.iter().map(|(_, b)| b.len() as u64).sum();
        let done = self.inner.transfer(tag, batch, abort)?;
        self.sent += bytes;
        let due = Duration::from_secs_f64(self.sent as f64 / self.bytes_per_second as f64);
        if let Some(wait) = due.checked_sub(self.start.elapsed()) {
            thread::sleep(wait);
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::LocalComm;

    #[test]
    fn failing_breaks_at_its_transfer_and_slow_takes_its_time() {
        let mut world = LocalComm::world(2);
        let (b, a) = (world.pop().unwrap(), world.pop().unwrap());
        let abort = AtomicBool::new(false);
        let mut a = Failing::at_transfer(a, 1);
        let mut b = Slow::new(b, 10_000);
        a.sendrecv(1, Some((1, &[1; 10])), None, &abort).unwrap();
        let mut got = [0u8; 10];
        b.sendrecv(1, None, Some((0, &mut got)), &abort).unwrap();
        assert_eq!(got, [1; 10]);
        let e = a.sendrecv(1, Some((1, &[2])), None, &abort).unwrap_err();
        assert!(matches!(e, CommError::Injected(_)), "{e}");
        assert!(a.sendrecv(1, None, None, &abort).is_err(), "stays broken");
        let t0 = Instant::now();
        b.sendrecv(1, Some((0, &[0; 1000])), None, &abort).unwrap();
        assert!(
            t0.elapsed() >= Duration::from_millis(90),
            "1000 bytes at 10 kB/s"
        );

        let mut world = LocalComm::world(1);
        let mut c = Failing::after_bytes(world.pop().unwrap(), 4);
        c.sendrecv(1, Some((0, &[0; 4])), Some((0, &mut [0; 4])), &abort)
            .unwrap();
        let e = c.sendrecv(1, Some((0, &[0])), None, &abort).unwrap_err();
        assert!(matches!(e, CommError::Injected(_)), "{e}");
    }
}
