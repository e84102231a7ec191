//! Talking to the other ranks.
//!
//! `Comm` is everything the daemon asks of MPI: collectives at setup (agree on settings,
//! ship the manifest), groups (which ranks share a host, sub-communicators) for strategies
//! that treat on-node and off-node links differently, and, for the exchange, point-to-point
//! messages with known lengths, several peers in flight at once.
//! `LocalComm` runs M ranks as threads of one process over channels, so tests exercise the
//! same code paths as `mpirun` without it; `MpiComm` is the real thing; `doubles` wraps
//! either to delay, slow down or break it.
//!
//! Exactly one thread owns a `Comm` (the daemon's main thread, see `daemon.rs`): MPI is
//! initialised with `Threading::Funneled` and every other thread reaches it through channels.
//! That is also why [`Comm::split`] hands back a `Box<dyn Comm>` without `Send`: an MPI
//! sub-communicator may only be used by the thread that owns MPI.
//!
//! # Giving up
//! Point-to-point waits watch an abort flag, so a shutdown can interrupt an exchange whose
//! peer went away. What giving up costs depends on the transport, and the error says which:
//! - [`CommError::Aborted`]: nothing is left in flight; the transport is still sound (the
//!   protocol with that peer is not: the caller treats the exchange as failed).
//! - [`CommError::Abandoned`]: MPI cannot withdraw a posted transfer, so the transport kept
//!   the buffers of the transfers still in flight (leaked, MPI may still use them) and will
//!   refuse every later point-to-point call. Such a process must not finalize MPI (it would
//!   wait for transfers that never end); `MpiComm` makes sure it does not, and the caller
//!   should end the process soon (the daemon exits with code 3, which makes the launcher end
//!   the job: the other ranks unmount on its SIGTERM).

#[cfg(any(test, feature = "testing"))]
pub mod conformance;
#[cfg(any(test, feature = "testing"))]
pub mod doubles;
mod local;
#[cfg(feature = "mpi")]
mod mpi;
mod tcp;

#[cfg(feature = "testing")]
pub use local::LocalComm;
#[cfg(not(feature = "testing"))]
pub use local::LocalComm;
#[cfg(feature = "mpi")]
pub use mpi::MpiComm;
pub use tcp::{Contract, PORT_OFFSET, TcpComm};

/// Whether this process was started by an MPI launcher (Open MPI, MPICH/Hydra, PMIx, Slurm):
/// read from the environment, so a build without the `mpi` feature can say it cannot run
/// there.
pub fn launched_by_mpi() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::plan::Rank;

#[derive(Debug, thiserror::Error)]
pub enum CommError {
    #[error("MPI: {0}")]
    Mpi(String),
    /// The TCP transport: a full sentence naming the rank or address and the fix.
    #[error("{0}")]
    Tcp(String),
    #[error("peer rank {0} went away")]
    PeerGone(Rank),
    #[error("expected {expected} bytes from rank {from}, got {got}")]
    Length {
        from: Rank,
        expected: usize,
        got: usize,
    },
    /// Gave up on the abort flag with nothing left in flight.
    #[error("gave up: the daemon is shutting down")]
    Aborted,
    /// Gave up on the abort flag with transfers still in flight: see the module docs.
    #[error(
        "gave up with transfers in flight: the daemon is shutting down and this transport cannot be finalized"
    )]
    Abandoned,
    /// A fault injected by a test double (`doubles::Failing`).
    #[error("injected fault: {0}")]
    Injected(String),
}

/// Point-to-point messages in flight together: what to send to whom, and for each expected
/// message its sender and a buffer of exactly its length. Buffers are owned so that a
/// transport that must give up mid-transfer can keep them instead of leaving MPI writing into
/// freed memory; on success they come back (received ones filled) in the same order, for reuse.
#[derive(Debug, Default)]
pub struct Batch {
    pub sends: Vec<(Rank, Vec<u8>)>,
    pub recvs: Vec<(Rank, Vec<u8>)>,
}

/// Which way a posted message goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    Send,
    Recv,
}

/// One point-to-point message to post ([`Comm::post`]): to or from `peer`, with `tag`. A
/// receive's buffer has exactly the expected message's length.
#[derive(Debug)]
pub struct Op {
    pub dir: Dir,
    pub peer: Rank,
    pub tag: u16,
    pub buf: Vec<u8>,
}

impl Op {
    pub fn send(peer: Rank, tag: u16, buf: Vec<u8>) -> Op {
        Op {
            dir: Dir::Send,
            peer,
            tag,
            buf,
        }
    }

    pub fn recv(peer: Rank, tag: u16, buf: Vec<u8>) -> Op {
        Op {
            dir: Dir::Recv,
            peer,
            tag,
            buf,
        }
    }
}

/// How [`Comm::all_reduce`] combines the ranks' values, element by element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    Max,
    Min,
    /// Wrapping on overflow.
    Sum,
}

impl Reduce {
    /// `a` and `b` combined.
    pub fn apply(self, a: u64, b: u64) -> u64 {
        match self {
            Reduce::Max => a.max(b),
            Reduce::Min => a.min(b),
            Reduce::Sum => a.wrapping_add(b),
        }
    }

    /// Element-wise combination of the ranks' lists (`all[r]` is rank r's), as many values
    /// as the shortest list.
    pub fn fold(self, all: &[Vec<u64>]) -> Vec<u64> {
        let len = all.iter().map(Vec::len).min().unwrap_or(0);
        (0..len)
            .map(|i| {
                all.iter()
                    .map(|v| v[i])
                    .reduce(|a, b| self.apply(a, b))
                    .unwrap_or(0)
            })
            .collect()
    }
}

/// Names a posted message; unique within one transport.
pub type Ticket = u64;

/// A posted message that completed: a send's buffer back (possibly emptied, for reuse) or a
/// receive's buffer filled.
#[derive(Debug)]
pub struct Done {
    pub ticket: Ticket,
    pub buf: Vec<u8>,
}

pub trait Comm {
    fn rank(&self) -> Rank;
    fn size(&self) -> u32;
    /// The host of each rank (indices in order of first appearance, so rank 0 is on host 0),
    /// the same list on every rank.
    fn hosts(&self) -> &[u32];
    /// Every rank contributes `data`; every rank gets all contributions in rank order.
    fn all_gather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>, CommError>;
    /// `root`'s `data` (ignored elsewhere) reaches every rank.
    fn broadcast(&mut self, root: Rank, data: Vec<u8>) -> Result<Vec<u8>, CommError>;
    /// Collective: every rank passes as many `values`; every rank gets their element-wise
    /// combination by `op` (`MPI_Allreduce`: O(log M) steps and O(len) bytes at each rank,
    /// where an all-gather hands every rank M x len). What start-up agreements use: whether
    /// any rank failed, the job's largest epoch, the smallest room. By default (a wrapper
    /// that does not forward it) built on [`Comm::all_gather`], which gives the same answer.
    fn all_reduce(&mut self, values: &[u64], op: Reduce) -> Result<Vec<u64>, CommError> {
        let mine: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let all: Vec<Vec<u64>> = (self.all_gather(&mine)?.iter()).map(|b| words(b)).collect();
        Ok(op.fold(&all))
    }
    /// Collective: the ranks that pass the same `color` form a new communicator, numbered
    /// in their order here. Hosts carry over (renumbered by first appearance).
    fn split(&mut self, color: u32) -> Result<Box<dyn Comm>, CommError>;

    /// Starts one point-to-point message without waiting for it (`MPI_Isend`/`MPI_Irecv`).
    /// Messages of one pair and tag are matched in the order they were posted, on both
    /// sides. Each message is at most 1 GiB. A send may complete before its receive is
    /// posted, or only once it is (as MPI's rendezvous does): a protocol must never make a
    /// send wait for a receive its peer posts only after that send completed.
    fn post(&mut self, op: Op) -> Result<Ticket, CommError>;
    /// Drives posted messages and returns those that completed since the last call: waits
    /// up to `wait` for at least one (returns at once if some did). Gives up once `abort` is
    /// set: [`CommError::Aborted`] or [`CommError::Abandoned`], see the module docs.
    fn progress(&mut self, wait: Duration, abort: &AtomicBool) -> Result<Vec<Done>, CommError>;
    /// Stops caring about posted messages: a detached receive still takes its message off
    /// the wire (so later ones of the pair match as before) and its bytes are dropped; a
    /// detached send still goes out. Their buffers are freed once the transport is done
    /// with them, and [`Comm::progress`] never returns them.
    fn detach(&mut self, tickets: &[Ticket]);
    /// Withdraws posted receives whose messages will never be sent (a stream its sender
    /// cut short): unlike a detached one, a cancelled receive takes nothing off the wire
    /// and does not keep the transport from finishing. By default they are detached, which
    /// is enough for a transport that can drop a receive nobody sends to.
    fn cancel(&mut self, tickets: &[Ticket]) {
        self.detach(tickets)
    }
    /// Said by the thread that owns the transport while it has nothing to do (the exchange
    /// loop between exchanges), every fraction of a second: a wrapper may do background work
    /// here (the job view, `node::jobview::Viewed`). Nothing by default.
    fn idle(&mut self) {}

    /// Moves a batch of point-to-point messages, all in flight at once: every receive is
    /// posted before any send, so ranks that pair up in any pattern where each send has its
    /// receive in the peer's batch of the same step cannot deadlock. Messages of one pair and
    /// tag arrive in order.
    ///
    /// Only for callers with nothing else posted: it consumes every completion. Gives up once
    /// `abort` is set, as [`Comm::progress`] does.
    fn transfer(&mut self, tag: u16, batch: Batch, abort: &AtomicBool) -> Result<Batch, CommError> {
        let n_recv = batch.recvs.len();
        let mut tickets = Vec::with_capacity(n_recv + batch.sends.len());
        let mut peers = Vec::with_capacity(tickets.capacity());
        let ops = (batch.recvs.into_iter().map(|(p, b)| Op::recv(p, tag, b)))
            .chain(batch.sends.into_iter().map(|(p, b)| Op::send(p, tag, b)));
        for op in ops {
            peers.push(op.peer);
            match self.post(op) {
                Ok(t) => tickets.push(t),
                Err(e) => {
                    self.detach(&tickets);
                    return Err(e);
                }
            }
        }
        let mut done: Vec<Option<Vec<u8>>> = (0..tickets.len()).map(|_| None).collect();
        let mut left = tickets.len();
        while left > 0 {
            let completed = match self.progress(Duration::from_millis(50), abort) {
                Ok(c) => c,
                Err(e) => {
                    let pending: Vec<Ticket> = (tickets.iter().zip(&done))
                        .filter(|(_, d)| d.is_none())
                        .map(|(t, _)| *t)
                        .collect();
                    self.detach(&pending);
                    return Err(e);
                }
            };
            for d in completed {
                if let Some(i) = tickets.iter().position(|&t| t == d.ticket) {
                    done[i] = Some(d.buf);
                    left -= 1;
                }
            }
        }
        let mut bufs = peers.into_iter().zip(done.into_iter().flatten());
        let recvs = bufs.by_ref().take(n_recv).collect();
        let sends = bufs.collect();
        Ok(Batch { sends, recvs })
    }

    /// [`Comm::transfer`] on borrowed buffers (copied in and out).
    fn sendrecv_many(
        &mut self,
        tag: u16,
        sends: &[(Rank, &[u8])],
        recvs: &mut [(Rank, &mut [u8])],
        abort: &AtomicBool,
    ) -> Result<(), CommError> {
        let batch = Batch {
            sends: sends.iter().map(|&(to, d)| (to, d.to_vec())).collect(),
            recvs: recvs
                .iter()
                .map(|(from, b)| (*from, vec![0; b.len()]))
                .collect(),
        };
        let done = self.transfer(tag, batch, abort)?;
        for ((_, buf), (_, got)) in recvs.iter_mut().zip(done.recvs) {
            buf.copy_from_slice(&got);
        }
        Ok(())
    }

    /// Sends `send` to one rank while receiving exactly `recv.len()` bytes from another
    /// (either side may be absent), like `MPI_Sendrecv`: the receive is posted before the
    /// send, so ranks pairing up in a shift (`to = r+d`, `from = r-d`) cannot deadlock.
    fn sendrecv(
        &mut self,
        tag: u16,
        send: Option<(Rank, &[u8])>,
        recv: Option<(Rank, &mut [u8])>,
        abort: &AtomicBool,
    ) -> Result<(), CommError> {
        let sends: Vec<_> = send.into_iter().collect();
        let mut recvs: Vec<_> = recv.into_iter().collect();
        self.sendrecv_many(tag, &sends, &mut recvs, abort)
    }
}

/// So a boxed transport (a sub-communicator, say) can be wrapped by a double.
impl<C: Comm + ?Sized> Comm for Box<C> {
    fn rank(&self) -> Rank {
        (**self).rank()
    }
    fn size(&self) -> u32 {
        (**self).size()
    }
    fn hosts(&self) -> &[u32] {
        (**self).hosts()
    }
    fn all_gather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
        (**self).all_gather(data)
    }
    fn broadcast(&mut self, root: Rank, data: Vec<u8>) -> Result<Vec<u8>, CommError> {
        (**self).broadcast(root, data)
    }
    fn all_reduce(&mut self, values: &[u64], op: Reduce) -> Result<Vec<u64>, CommError> {
        (**self).all_reduce(values, op)
    }
    fn split(&mut self, color: u32) -> Result<Box<dyn Comm>, CommError> {
        (**self).split(color)
    }
    fn post(&mut self, op: Op) -> Result<Ticket, CommError> {
        (**self).post(op)
    }
    fn progress(&mut self, wait: Duration, abort: &AtomicBool) -> Result<Vec<Done>, CommError> {
        (**self).progress(wait, abort)
    }
    fn detach(&mut self, tickets: &[Ticket]) {
        (**self).detach(tickets)
    }
    fn cancel(&mut self, tickets: &[Ticket]) {
        (**self).cancel(tickets)
    }
    fn idle(&mut self) {
        (**self).idle()
    }
}

/// Little-endian `u64`s of `bytes` (a trailing part shorter than 8 bytes is ignored).
pub(crate) fn words(bytes: &[u8]) -> Vec<u64> {
    (bytes.chunks_exact(8))
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

/// Host indices for per-rank host names: equal names share an index, numbered in order of
/// first appearance.
pub(crate) fn host_indices<T: PartialEq>(names: &[T]) -> Vec<u32> {
    let mut seen: Vec<&T> = Vec::new();
    names
        .iter()
        .map(|n| match seen.iter().position(|s| *s == n) {
            Some(i) => i as u32,
            None => {
                seen.push(n);
                (seen.len() - 1) as u32
            }
        })
        .collect()
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

/// Collective: every rank's `mine` when some rank has something to say (a non-empty
/// `mine`), else `None`. One all-reduce of a flag when nobody does (the common case of a
/// start-up agreement: O(log M) steps, O(1) bytes at each rank); the all-gather, whose
/// every rank receives M payloads, only when someone does (a refusal).
pub fn gather_if_any(comm: &mut dyn Comm, mine: &[u8]) -> Result<Option<Vec<Vec<u8>>>, CommError> {
    let any = comm.all_reduce(&[u64::from(!mine.is_empty())], Reduce::Max)?;
    if any.first().is_none_or(|&a| a == 0) {
        return Ok(None);
    }
    comm.all_gather(mine).map(Some)
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
    let Some(all) = gather_if_any(comm, &payload)? else {
        return Ok(Vec::new());
    };
    Ok(all
        .into_iter()
        .enumerate()
        .filter(|(_, m)| !m.is_empty())
        .map(|(r, m)| (r as Rank, String::from_utf8_lossy(&m).into_owned()))
        .collect())
}
