//! `Comm` over TCP ([`TcpComm`]): the transport for jobs without an MPI runtime (torchrun,
//! a Kubernetes job), meeting at one known address ([`Contract`], `rendezvous`).
//!
//! We move bytes with the standard library's blocking sockets and a thread per connection
//! (`links`): the exchange drives the transport from one thread through `post`/`progress`,
//! which maps onto a channel of completions without an async runtime in this crate. We
//! looked at crates before writing the framing and the collectives: tokio-util's length
//! codec would bring tokio into the network layer for an 18-byte header; timely's
//! communication crate, nng and ZeroMQ have their own process models and no tagged
//! point-to-point matching or collectives (and the last two are C libraries, which a wheel
//! without system dependencies must avoid). MPI's matching rules (`core`) and binomial-tree
//! collectives (below) are short enough to hold here, next to the tests both transports pass.
//!
//! Every communicator of one transport shares its sockets and threads (`core::Core`); a
//! split one tags its messages with a context of its own, as MPI's communicators do.

mod core;
mod links;
mod rendezvous;
mod wire;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use rendezvous::{Contract, PORT_OFFSET};

use self::core::{COLLECTIVE, Core};
use super::{Comm, CommError, Dir, Done, Op, Reduce, Ticket, host_indices, words};
use crate::plan::Rank;

/// One communicator over the TCP transport: the world, or a part `split` made.
pub struct TcpComm {
    core: Rc<RefCell<Core>>,
    /// Messages of this communicator carry it.
    ctx: u64,
    /// World rank of each of this communicator's ranks.
    members: Vec<u32>,
    rank: Rank,
    hosts: Vec<u32>,
    /// Splits done so far (the same on every member: splits are collective).
    splits: u64,
}

impl TcpComm {
    /// Meets the other ranks of `contract` and returns the world. Blocks until every rank
    /// has come to the rendezvous, or says why the job cannot start.
    pub fn connect(contract: &Contract) -> Result<TcpComm, CommError> {
        more_files();
        let joined = rendezvous::join(contract).map_err(CommError::Tcp)?;
        let names: Vec<&str> = joined.peers.iter().map(|(_, h)| h.as_str()).collect();
        let hosts = host_indices(&names);
        let world = joined.peers.len() as u32;
        let core = Core::new(contract.rank, joined.listener, joined.token, joined.peers);
        Ok(TcpComm {
            core: Rc::new(RefCell::new(core)),
            ctx: 0,
            members: (0..world).collect(),
            rank: contract.rank,
            hosts,
            splits: 0,
        })
    }

    fn world_of(&self, r: Rank) -> Result<u32, CommError> {
        (self.members.get(r as usize).copied()).ok_or_else(|| {
            CommError::Tcp(format!(
                "no rank {r} in a communicator of {}",
                self.members.len()
            ))
        })
    }

    /// A world rank's error in this communicator's numbering.
    fn ours(&self, e: CommError) -> CommError {
        match e {
            CommError::PeerGone(w) => match self.members.iter().position(|&m| m == w) {
                Some(r) => CommError::PeerGone(r as Rank),
                None => CommError::PeerGone(w),
            },
            other => other,
        }
    }

    /// A collective's message to `to` (nobody waits for its completion).
    fn put(&mut self, to: Rank, data: Vec<u8>) -> Result<(), CommError> {
        let w = self.world_of(to)?;
        let mut core = self.core.borrow_mut();
        let t = core
            .send(self.ctx, w, COLLECTIVE, data)
            .map_err(|e| self.ours(e))?;
        core.detach(self.ctx, &[t]);
        Ok(())
    }

    /// A collective's next message from `from`.
    fn get(&mut self, from: Rank) -> Result<Vec<u8>, CommError> {
        let w = self.world_of(from)?;
        let got = self.core.borrow_mut().take(self.ctx, w, COLLECTIVE);
        got.map_err(|e| self.ours(e))
    }

    /// Every rank's part at rank 0 (binomial tree: O(log M) rounds), as `(rank, part)`
    /// lists; empty elsewhere.
    fn gather(&mut self, mine: &[u8]) -> Result<Vec<(u32, Vec<u8>)>, CommError> {
        let n = self.size();
        let mut parts = vec![(self.rank, mine.to_vec())];
        let mut mask = 1u32;
        while mask < n {
            if self.rank & mask != 0 {
                self.put(self.rank - mask, encode_parts(&parts))?;
                return Ok(Vec::new());
            }
            if self.rank + mask < n {
                parts.extend(decode_parts(&self.get(self.rank + mask)?)?);
            }
            mask <<= 1;
        }
        parts.sort_by_key(|(r, _)| *r);
        Ok(parts)
    }

    /// Every rank's values combined at rank 0 along the same tree; empty elsewhere.
    fn reduce(&mut self, values: &[u64], op: Reduce) -> Result<Vec<u64>, CommError> {
        let (n, mut acc) = (self.size(), values.to_vec());
        let mut mask = 1u32;
        while mask < n {
            if self.rank & mask != 0 {
                let bytes = acc.iter().flat_map(|v| v.to_le_bytes()).collect();
                self.put(self.rank - mask, bytes)?;
                return Ok(Vec::new());
            }
            if self.rank + mask < n {
                let theirs = words(&self.get(self.rank + mask)?);
                acc = op.fold(&[acc, theirs]);
            }
            mask <<= 1;
        }
        Ok(acc)
    }
}

/// Raises this process's open-file limit to its hard limit: a rank holds up to three
/// sockets per peer it talks to (a connection each way and the one its reader keeps to close
/// on shutdown), past the common soft limit of 1,024 from a few hundred peers on.
fn more_files() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for both calls.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// `(rank, bytes)` parts back to back: count, then rank, length and bytes of each.
fn encode_parts(parts: &[(u32, Vec<u8>)]) -> Vec<u8> {
    let len: usize = parts.iter().map(|(_, p)| 12 + p.len()).sum();
    let mut out = Vec::with_capacity(4 + len);
    out.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for (r, p) in parts {
        out.extend_from_slice(&r.to_le_bytes());
        out.extend_from_slice(&(p.len() as u64).to_le_bytes());
        out.extend_from_slice(p);
    }
    out
}

fn decode_parts(mut b: &[u8]) -> Result<Vec<(u32, Vec<u8>)>, CommError> {
    let bad = || CommError::Tcp("a collective's message is cut short".into());
    let mut take = |n: usize| -> Result<&[u8], CommError> {
        let (head, rest) = b.split_at_checked(n).ok_or_else(bad)?;
        b = rest;
        Ok(head)
    };
    let count = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes"));
    let mut parts = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let r = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes"));
        let len = u64::from_le_bytes(take(8)?.try_into().expect("8 bytes"));
        parts.push((r, take(usize::try_from(len).map_err(|_| bad())?)?.to_vec()));
    }
    Ok(parts)
}

/// The context of the `split`-th split of `ctx` by `color` (SplitMix64 of the three): the
/// same on every member, distinct from its parent's and siblings'.
fn child_context(ctx: u64, split: u64, color: u32) -> u64 {
    let mut z = ctx ^ split.rotate_left(32) ^ u64::from(color).rotate_left(17);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    // Odd (never the world's 0) and below u64::MAX (the acknowledgements').
    ((z ^ (z >> 31)) | 1) & (u64::MAX >> 1)
}

impl Comm for TcpComm {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn size(&self) -> u32 {
        self.members.len() as u32
    }

    fn hosts(&self) -> &[u32] {
        &self.hosts
    }

    fn all_gather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
        let parts = self.gather(data)?;
        let all = self.broadcast(0, encode_parts(&parts))?;
        Ok(decode_parts(&all)?.into_iter().map(|(_, p)| p).collect())
    }

    /// Binomial tree from `root`: O(log M) rounds, each rank sends to at most log M others.
    fn broadcast(&mut self, root: Rank, data: Vec<u8>) -> Result<Vec<u8>, CommError> {
        let n = self.size();
        let rel = (self.rank + n - root % n) % n;
        let mut data = data;
        let mut mask = 1u32;
        while mask < n {
            if rel & mask != 0 {
                data = self.get((rel - mask + root) % n)?;
                break;
            }
            mask <<= 1;
        }
        mask >>= 1;
        while mask > 0 {
            if rel + mask < n {
                self.put((rel + mask + root) % n, data.clone())?;
            }
            mask >>= 1;
        }
        Ok(data)
    }

    fn all_reduce(&mut self, values: &[u64], op: Reduce) -> Result<Vec<u64>, CommError> {
        let at_root = self.reduce(values, op)?;
        let bytes = self.broadcast(0, at_root.iter().flat_map(|v| v.to_le_bytes()).collect())?;
        Ok(words(&bytes))
    }

    fn split(&mut self, color: u32) -> Result<Box<dyn Comm>, CommError> {
        let colors: Vec<u32> = (self.all_gather(&color.to_le_bytes())?.iter())
            .map(|c| u32::from_le_bytes(c.as_slice().try_into().unwrap_or_default()))
            .collect();
        let ours: Vec<usize> = (0..colors.len()).filter(|&r| colors[r] == color).collect();
        let members: Vec<u32> = ours.iter().map(|&r| self.members[r]).collect();
        let rank = ours
            .iter()
            .position(|&r| r == self.rank as usize)
            .expect("this rank") as Rank;
        let hosts = host_indices(&ours.iter().map(|&r| self.hosts[r]).collect::<Vec<_>>());
        let ctx = child_context(self.ctx, self.splits, color);
        self.splits += 1;
        Ok(Box::new(TcpComm {
            core: self.core.clone(),
            ctx,
            members,
            rank,
            hosts,
            splits: 0,
        }))
    }

    fn post(&mut self, op: Op) -> Result<Ticket, CommError> {
        if op.tag == COLLECTIVE {
            return Err(CommError::Tcp(format!(
                "tag {COLLECTIVE} is the collectives'"
            )));
        }
        let w = self.world_of(op.peer)?;
        let mut core = self.core.borrow_mut();
        let posted = match op.dir {
            Dir::Send => core.send(self.ctx, w, op.tag, op.buf),
            Dir::Recv => Ok(core.recv(self.ctx, w, op.tag, op.buf.len())),
        };
        posted.map_err(|e| self.ours(e))
    }

    fn progress(&mut self, wait: Duration, abort: &AtomicBool) -> Result<Vec<Done>, CommError> {
        let until = Instant::now() + wait;
        let mut core = self.core.borrow_mut();
        loop {
            core.pump(Duration::ZERO);
            let done = core.completed(self.ctx).map_err(|e| self.ours(e))?;
            if !done.is_empty() {
                return Ok(done);
            }
            if abort.load(Ordering::Relaxed) {
                core.abandon(self.ctx);
                return Err(CommError::Aborted);
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Vec::new());
            }
            core.pump(left.min(Duration::from_millis(20)));
        }
    }

    fn detach(&mut self, tickets: &[Ticket]) {
        self.core.borrow_mut().detach(self.ctx, tickets);
    }

    fn cancel(&mut self, tickets: &[Ticket]) {
        self.core.borrow_mut().cancel(self.ctx, tickets);
    }
}

#[cfg(test)]
mod tests;
