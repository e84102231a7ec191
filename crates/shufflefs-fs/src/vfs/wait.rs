//! Which requests may wait, and on what.
//!
//! The binding answers most requests on a few request threads (about one per core: every
//! idle one costs a wake-up per request). A request that may wait must not hold one of
//! them, so the logic says up front whether it may, and on what; the binding only decides
//! where such work runs. Fetches share a bounded pool, where a DataLoader opening hundreds
//! of samples not staged yet queues hundreds of them; a request that advances the epoch
//! (waiting on the exchange) must not wait its turn behind them, so it is told apart. It
//! still waits for the samples the next share needs (an advance makes sure this rank holds
//! all of them). Advances are few (one per reader that reaches the next epoch) and run one
//! at a time.
//!
//! A request that advances may wait for as long as a peer takes to reach the current epoch:
//! forever, if its trainer died. Its caller sits in the kernel until the daemon answers (a
//! FUSE request cannot be withdrawn from the kernel's side, not even by SIGKILL), so every
//! such request carries a [`Cancel`] token, and the wait answers (EINTR, or EIO when the
//! mount goes away) as soon as the binding sets it: when the caller is signalled, and for
//! every waiter when the mount is unmounted or detached.

pub use crate::node::coordinator::{Cancel, Cancelled};
use crate::vfs::ShuffleFs;
use crate::vfs::inodes::Node;

/// Whether answering a request may wait, and on what.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Answered from memory or the cache at once.
    No,
    /// May fetch a sample from the source (not cached, or its size not known yet).
    Source,
    /// May advance the epoch: waits on the exchange, then on the next share's samples.
    Advance,
}

impl ShuffleFs {
    /// Whether answering a request about `node` may wait: on the source, for a sample not
    /// cached or of unknown size, or on the exchange, for the next epoch's folder (looking
    /// it up advances).
    pub fn wait(&self, node: Node) -> Wait {
        match node {
            // `holds` first: it also bounds `id` (an inode number the kernel never got from us
            // answers ENOENT without waiting).
            Node::Sample(id)
                if self.holds(id)
                    && (!self.store.contains(id) || self.store.size(id).is_none()) =>
            {
                Wait::Source
            }
            Node::EpochDir(e) if e > self.epochs.epoch() => Wait::Advance,
            _ => Wait::No,
        }
    }

    /// [`ShuffleFs::wait`] by inode number; an unknown one answers at once (ENOENT).
    pub fn wait_ino(&self, ino: u64) -> Wait {
        Node::from_ino(ino).map_or(Wait::No, |node| self.wait(node))
    }

    /// Whether a read of `ino` without an open may wait: a part's groups may not be cached.
    pub(crate) fn read_wait_ino(&self, ino: u64) -> Wait {
        match Node::from_ino(ino) {
            Some(Node::Part(..)) => Wait::Source,
            _ => self.wait_ino(ino),
        }
    }

    /// Whether answering a request about `node` may wait at all (see [`ShuffleFs::wait`]).
    pub fn may_wait(&self, node: Node) -> bool {
        self.wait(node) != Wait::No
    }
}
