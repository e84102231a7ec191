//! Talking to the other ranks.
//!
//! `Comm` is everything the daemon asks of MPI: collectives at setup (agree on settings,
//! ship the manifest) and, for the exchange, point-to-point messages with known lengths.
//! `LocalComm` runs M ranks as threads of one process over channels, so tests exercise the
//! same code paths as `mpirun` without it; `MpiComm` is the real thing.
//!
//! Exactly one thread owns a `Comm` (the daemon's main thread, see `daemon.rs`): MPI is
//! initialised with `Threading::Funneled` and every other thread reaches it through channels.

mod local;
mod mpi;

pub use local::LocalComm;
pub use mpi::{MpiComm, launched_by_mpi};

use std::sync::atomic::AtomicBool;

use crate::plan::Rank;

#[derive(Debug, thiserror::Error)]
pub enum CommError {
    #[error("MPI: {0}")]
    Mpi(String),
    #[error("peer rank {0} went away")]
    PeerGone(Rank),
    #[error("abandoned: the daemon is shutting down")]
    Aborted,
}

pub trait Comm {
    fn rank(&self) -> Rank;
    fn size(&self) -> u32;
    /// Every rank contributes `data`; every rank gets all contributions in rank order.
    fn all_gather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>, CommError>;
    /// `root`'s `data` (ignored elsewhere) reaches every rank.
    fn broadcast(&mut self, root: Rank, data: Vec<u8>) -> Result<Vec<u8>, CommError>;
    /// Sends `send` to one rank while receiving exactly `recv.len()` bytes from another
    /// (either side may be absent), like `MPI_Sendrecv`: the receive is posted before the
    /// send, so ranks pairing up in a shift (`to = r+d`, `from = r-d`) cannot deadlock.
    /// Messages of one pair and tag arrive in order. Each message is at most 1 GiB.
    /// Gives up with `CommError::Aborted` once `abort` is set.
    fn sendrecv(
        &mut self,
        tag: u16,
        send: Option<(Rank, &[u8])>,
        recv: Option<(Rank, &mut [u8])>,
        abort: &AtomicBool,
    ) -> Result<(), CommError>;
}

/// The world of one, for a daemon started without a launcher.
pub fn single() -> LocalComm {
    LocalComm::world(1).pop().expect("one rank")
}

/// Every rank proposes a value; rank 0's answer, or its error, is what everybody gets.
/// Used so that a failure seen by rank 0 (say, an empty source) stops all ranks cleanly.
///
/// The outcome travels as a trailing byte (0: the value, 1: an error message), so the value,
/// up to a whole manifest, is moved through the broadcast and never copied.
pub fn decide<T, E>(
    comm: &mut dyn Comm,
    at_root: impl FnOnce() -> Result<T, E>,
) -> Result<Result<Vec<u8>, String>, CommError>
where
    T: Into<Vec<u8>>,
    E: std::fmt::Display,
{
    let msg = if comm.rank() == 0 {
        let (mut msg, outcome) = match at_root() {
            Ok(v) => (v.into(), 0u8),
            Err(e) => (e.to_string().into_bytes(), 1u8),
        };
        msg.push(outcome);
        msg
    } else {
        Vec::new()
    };
    let mut got = comm.broadcast(0, msg)?;
    Ok(match got.pop() {
        Some(0) => Ok(got),
        Some(_) => Err(String::from_utf8_lossy(&got).into_owned()),
        None => Err("rank 0 sent nothing".into()),
    })
}

/// Every rank reports `Ok` or its own error; all ranks learn whether everybody is fine.
/// Returns the list of `(rank, message)` failures, the same on every rank.
pub fn agree(
    comm: &mut dyn Comm,
    mine: Result<(), String>,
) -> Result<Vec<(Rank, String)>, CommError> {
    let payload = match &mine {
        Ok(()) => Vec::new(),
        Err(e) if e.is_empty() => b"failed".to_vec(),
        Err(e) => e.as_bytes().to_vec(),
    };
    let all = comm.all_gather(&payload)?;
    Ok(all
        .into_iter()
        .enumerate()
        .filter(|(_, m)| !m.is_empty())
        .map(|(r, m)| (r as Rank, String::from_utf8_lossy(&m).into_owned()))
        .collect())
}
