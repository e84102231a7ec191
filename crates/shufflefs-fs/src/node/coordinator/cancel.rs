//! A per-request cancellation token: what lets a waiting advance give up.
//!
//! An advance waits on its peers for as long as they take, which may be forever (a peer's
//! trainer died). The request that asked for it (a lookup of `epoch-N`, a write to
//! `.shufflefs/epoch`) keeps its caller in the kernel until answered, so the binding hands
//! every such request a token, set when the caller is signalled (the kernel's INTERRUPT, or
//! what stands in for it) or when the mount goes away; the wait polls it and answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

/// Why a wait was cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cancelled {
    /// The caller was signalled (or is gone): answer EINTR.
    Interrupted,
    /// The mount is going away: answer that the daemon is shutting down.
    ShuttingDown,
}

/// Set once, read by the waiter; cheap to clone (the clones share the flag).
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<AtomicU8>);

const LIVE: u8 = 0;
const INTERRUPTED: u8 = 1;
const SHUTTING_DOWN: u8 = 2;

impl Cancel {
    /// A token nobody sets (callers outside the kernel binding: tests, tools).
    pub(crate) fn never() -> Cancel {
        Cancel::default()
    }

    /// Cancels the wait; the first reason given stays.
    pub(crate) fn cancel(&self, why: Cancelled) {
        let v = match why {
            Cancelled::Interrupted => INTERRUPTED,
            Cancelled::ShuttingDown => SHUTTING_DOWN,
        };
        let _ = self
            .0
            .compare_exchange(LIVE, v, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Why the wait was cancelled, if it was.
    pub(crate) fn cancelled(&self) -> Option<Cancelled> {
        match self.0.load(Ordering::SeqCst) {
            LIVE => None,
            INTERRUPTED => Some(Cancelled::Interrupted),
            _ => Some(Cancelled::ShuttingDown),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_reason_stays_and_clones_share_it() {
        let c = Cancel::never();
        let seen = c.clone();
        assert_eq!(seen.cancelled(), None);
        c.cancel(Cancelled::Interrupted);
        c.cancel(Cancelled::ShuttingDown);
        assert_eq!(seen.cancelled(), Some(Cancelled::Interrupted));
    }
}
