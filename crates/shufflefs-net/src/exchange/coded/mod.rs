//! The coded exchange (UberShuffle): a server rank that holds the dataset sends
//! every compute rank the samples of its next share it does not cache, as XOR-coded
//! multicast packets several ranks decode at once with what they cache.
//!
//! # Who runs what
//! World rank 0 is the server (`shufflefs serve`, [`server`]); world rank `r + 1` is compute
//! rank `r`, compute node `r` of the paper. Both sides re-derive the same problem: the caches
//! `C^t` and shares `D^{t+1}` come from `plan::coded` (a function of the seed and the epoch),
//! and `coded::plan(&Instance, scheme)` is deterministic, so each compute rank knows, without
//! being told, what every packet carries and who decodes what (`client`).
//!
//! # Protocol of one step (into epoch `e`), on the world communicator
//! 1. *Hello*: each compute rank sends `[e, n]` and the `n` ids of its cache `C^{e-1}` it
//!    lacks beyond its share (a fresh cache at epoch 0, or samples a crash lost); `n = BYE`
//!    says the rank is leaving. The server answers each rank with plain samples (bundles, see
//!    `wire`) or, if any rank left or the ranks disagree on `e`, with *stop*: the coded
//!    exchange ends for good and every later epoch reads what it lacks from the source.
//! 2. *Sizes*: the server sends every compute rank the sizes of the step's missing samples
//!    (`sizes`), so that every rank pairs samples into packets by size alike.
//! 3. *Packets*: in plan order, in bursts of consecutive packets of one route, the server
//!    broadcasts each burst on the communicator its group routes to, or sends it
//!    point-to-point to a one-rank group ([`routes`]); every rank the route reaches takes
//!    part (steps in one global order cannot deadlock), receivers decode (`coded::packet`)
//!    and store what passes its CRC; the others drop the packet.
//! 4. *Fallback*: each compute rank sends `[e, n]` and the ids it could not decode (a cached
//!    sample missing or corrupt, a packet the server could not fill); the server sends them
//!    plainly. Only then is the exchange settled.
//! 5. *Totals*: the server sends every rank the step's packet bytes and what the uncoded
//!    scheme would have sent (`[packet_bytes, uncoded_bytes]`), for the status.
//!
//! Plain replies go as a sequence of bundles of at most `BUNDLE` bytes, each announced by
//! `[more, len]`, so no message nears MPI's size limit and no side holds a whole epoch.
//! Every rank's cache between steps is `C^t` (plus `D^{t+1}` once received): at the start of
//! a step a rank drops what is in neither `C^t` nor `D^{t+1}`; the current view `D^t` is part
//! of `C^t`. During the packets it also drops the samples of `C^t` in neither `D^t` nor
//! `C^{t+1}` once no later packet needs them as side information (`side`), so after a step
//! it holds `D^t ∪ C^{t+1}`.
//!
//! # Giving up
//! A step is not given up once started: every rank it involves said hello, so it ends in
//! bounded time, and a rank that dies makes the launcher end the job; giving up mid-step
//! would leave MPI transfers in flight (see `comm`). A daemon that is shutting down starts no
//! new step and says goodbye instead. The one exception is a server that died: a compute
//! rank on its host sees the process gone (`liveness`) and gives the step up at once, which
//! abandons its transfers and ends the daemon (exit code 3; the mount goes, the cache stays
//! at its epoch and a restart resumes). Ranks on other hosts wait for the launcher, which
//! ends the job once the server or a rank on its host exits.

use std::sync::atomic::AtomicBool;

use serde::Serialize;

use crate::comm::{Batch, Comm, CommError};
use crate::exchange::{ExchangeError, Phase};
use crate::plan::{Rank, SampleId};

pub(crate) mod client;
pub(crate) mod liveness;
pub mod routes;
pub mod server;
pub(crate) mod side;
pub(crate) mod sizes;
pub mod wire;

pub use client::CodedClient;
pub use liveness::ServerId;
pub use routes::Routes;
pub use server::{ServeSettings, Server, ServerSamples};

/// The server's world rank.
pub(crate) const SERVER: Rank = 0;

const TAG_HELLO: u16 = 0x5301;
const TAG_LIST: u16 = 0x5302;
const TAG_REPLY_HEAD: u16 = 0x5303;
const TAG_REPLY: u16 = 0x5304;
const TAG_SIZES: u16 = 0x530a;
const TAG_TOTALS: u16 = 0x530b;

/// `n` of a hello from a rank that is leaving.
const BYE: u64 = u64::MAX;
/// Largest plain-sample bundle (a bigger sample travels alone).
pub(crate) const BUNDLE: usize = 32 << 20;

/// What the status shows of a coded exchange on a compute rank.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CodedReport {
    pub scheme: &'static str,
    /// `ring` or `broadcast` (`--multicast`).
    pub multicast: &'static str,
    /// Packets the plan sends in this step (all groups).
    pub packets_planned: u64,
    /// Packets this rank received (those of its communicators) and their bytes.
    pub packets_received: u64,
    pub packet_bytes_received: u64,
    /// Samples decoded from packets (CRC checked) and stored.
    pub samples_decoded: u64,
    /// Packets meant for this rank it could not decode (a cached sample missing or corrupt).
    pub decode_failures: u64,
    /// Samples the server sent plainly after a decode failure.
    pub fallback_samples: u64,
    /// Cached samples (not of the share) the server sent plainly because this rank lacked
    /// them: the initial cache fill, or what a crash lost.
    pub cache_fill_samples: u64,
    pub plain_bytes_received: u64,
    /// Bytes of the samples of the next share this rank lacked that came (decoded, or
    /// plainly after a failed decode): what `bytes_to_receive` counts, so the exchange's
    /// `bytes_received` (its progress against that total) is this, not the wire bytes
    /// above, which also carry the cache fill, the packets' headers and padding, and
    /// packets whose part was for another rank. Not shown: `bytes_received` is.
    #[serde(skip)]
    pub share_bytes_received: u64,
    /// Seconds spent decoding packets (reading the cached parts, XOR, CRC).
    pub decode_seconds: f64,
    /// Bytes of every packet the server sent in this step (all groups, headers and padding
    /// included), and what the uncoded scheme would have sent for the same step (one packet
    /// per missing sample): the server's saving is their ratio.
    pub server_packet_bytes: u64,
    pub uncoded_packet_bytes: u64,
}

/// A request from a compute rank: the target epoch and sample ids, or leaving.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Request {
    Want { epoch: u64, ids: Vec<SampleId> },
    Bye,
}

fn comm_err(target: u64, e: CommError) -> ExchangeError {
    ExchangeError::Comm {
        phase: Phase::Coded,
        target_epoch: target,
        peers: vec![SERVER],
        source: e,
    }
}

/// Compute side: sends a request to the server.
fn send_request(world: &mut dyn Comm, req: &Request, abort: &AtomicBool) -> Result<(), CommError> {
    let (epoch, n, list) = match req {
        Request::Want { epoch, ids } => (*epoch, ids.len() as u64, super::encode_ids(ids)),
        Request::Bye => (0, BYE, Vec::new()),
    };
    let mut head = epoch.to_le_bytes().to_vec();
    head.extend_from_slice(&n.to_le_bytes());
    world.transfer(
        TAG_HELLO,
        Batch {
            sends: vec![(SERVER, head)],
            recvs: vec![],
        },
        abort,
    )?;
    if !list.is_empty() {
        world.transfer(
            TAG_LIST,
            Batch {
                sends: vec![(SERVER, list)],
                recvs: vec![],
            },
            abort,
        )?;
    }
    Ok(())
}

/// Server side: one request from each of the world ranks `1..size`, in rank order.
fn recv_requests(world: &mut dyn Comm, abort: &AtomicBool) -> Result<Vec<Request>, CommError> {
    let ranks: Vec<Rank> = (1..world.size()).collect();
    let heads = world.transfer(
        TAG_HELLO,
        Batch {
            sends: vec![],
            recvs: ranks.iter().map(|&r| (r, vec![0; 16])).collect(),
        },
        abort,
    )?;
    let parsed: Vec<(u64, u64)> = heads
        .recvs
        .iter()
        .map(|(_, b)| {
            (
                u64::from_le_bytes(b[..8].try_into().expect("8")),
                u64::from_le_bytes(b[8..].try_into().expect("8")),
            )
        })
        .collect();
    let lists = world.transfer(
        TAG_LIST,
        Batch {
            sends: vec![],
            recvs: (ranks.iter().zip(&parsed))
                .filter(|(_, (_, n))| *n != BYE && *n > 0)
                .map(|(&r, (_, n))| (r, vec![0; *n as usize * super::ID_BYTES]))
                .collect(),
        },
        abort,
    )?;
    let mut lists = lists.recvs.into_iter();
    Ok(parsed
        .into_iter()
        .map(|(epoch, n)| match n {
            BYE => Request::Bye,
            0 => Request::Want {
                epoch,
                ids: Vec::new(),
            },
            _ => Request::Want {
                epoch,
                ids: super::decode_ids(&lists.next().expect("one list per request").1).collect(),
            },
        })
        .collect())
}

/// Reply heads: `[more, len]`; `more = STOP` ends the coded exchange.
const MORE: u64 = 1;
const LAST: u64 = 0;
const STOP: u64 = 2;

fn send_head(
    world: &mut dyn Comm,
    to: Rank,
    more: u64,
    bundle: Vec<u8>,
    abort: &AtomicBool,
) -> Result<(), CommError> {
    let mut head = more.to_le_bytes().to_vec();
    head.extend_from_slice(&(bundle.len() as u64).to_le_bytes());
    let mut sends = vec![(to, head)];
    world.transfer(
        TAG_REPLY_HEAD,
        Batch {
            sends: std::mem::take(&mut sends),
            recvs: vec![],
        },
        abort,
    )?;
    if !bundle.is_empty() {
        world.transfer(
            TAG_REPLY,
            Batch {
                sends: vec![(to, bundle)],
                recvs: vec![],
            },
            abort,
        )?;
    }
    Ok(())
}

/// Compute side: the next reply piece, `(more, bundle)`.
fn recv_piece(world: &mut dyn Comm, abort: &AtomicBool) -> Result<(u64, Vec<u8>), CommError> {
    let head = world.transfer(
        TAG_REPLY_HEAD,
        Batch {
            sends: vec![],
            recvs: vec![(SERVER, vec![0; 16])],
        },
        abort,
    )?;
    let b = &head.recvs[0].1;
    let more = u64::from_le_bytes(b[..8].try_into().expect("8"));
    let len = u64::from_le_bytes(b[8..].try_into().expect("8")) as usize;
    if len == 0 {
        return Ok((more, Vec::new()));
    }
    let mut body = world.transfer(
        TAG_REPLY,
        Batch {
            sends: vec![],
            recvs: vec![(SERVER, vec![0; len])],
        },
        abort,
    )?;
    Ok((more, body.recvs.pop().expect("one").1))
}

/// Server side: the same `bytes` to every compute rank on `tag` (each knows the length).
fn send_all(
    world: &mut dyn Comm,
    tag: u16,
    bytes: &[u8],
    abort: &AtomicBool,
) -> Result<(), CommError> {
    let sends = (1..world.size()).map(|r| (r, bytes.to_vec())).collect();
    world.transfer(
        tag,
        Batch {
            sends,
            recvs: vec![],
        },
        abort,
    )?;
    Ok(())
}

/// Compute side: `len` bytes from the server on `tag`.
fn recv_exact(
    world: &mut dyn Comm,
    tag: u16,
    len: usize,
    abort: &AtomicBool,
) -> Result<Vec<u8>, CommError> {
    let mut got = world.transfer(
        tag,
        Batch {
            sends: vec![],
            recvs: vec![(SERVER, vec![0; len])],
        },
        abort,
    )?;
    Ok(got.recvs.pop().expect("one receive").1)
}

/// Server side: step 5's totals to every compute rank.
fn send_totals(
    world: &mut dyn Comm,
    packet_bytes: u64,
    uncoded_bytes: u64,
    abort: &AtomicBool,
) -> Result<(), CommError> {
    let mut b = packet_bytes.to_le_bytes().to_vec();
    b.extend_from_slice(&uncoded_bytes.to_le_bytes());
    send_all(world, TAG_TOTALS, &b, abort)
}

/// Compute side: step 5's totals, `(packet_bytes, uncoded_bytes)`.
fn recv_totals(world: &mut dyn Comm, abort: &AtomicBool) -> Result<(u64, u64), CommError> {
    let b = recv_exact(world, TAG_TOTALS, 16, abort)?;
    let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8"));
    Ok((word(0), word(8)))
}
