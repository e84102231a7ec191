//! How a packet reaches its group: the communicators of `coded::groups`, created once.
//!
//! MPI broadcasts only to a whole communicator, and one communicator per possible group
//! would be `2^M` of them. Open MPI names each communicator by a context id out of a table
//! the PML bounds (ob1 carries it in a 16-bit header field: `pml_max_contextid` = 65535;
//! running out is reported to hang rather than fail), and every member pays memory for each.
//! `coded::groups` (the paper's Section 4.3) picks a fixed set of at most `--communicators`
//! of them (default 1024, the module docs there explain the number), each the server plus
//! some compute ranks, and routes every group to its smallest superset in the set; members
//! outside the group receive the packet and drop it. A one-rank group (every uncoded packet)
//! is a point-to-point send, no communicator at all. A communicator of every compute rank is
//! the world communicator itself, so `--communicators 1` creates none.
//!
//! The set depends only on `(M, limit, alpha)`, so every rank builds the same one without
//! talking, and creates it with one collective split of the world communicator per
//! communicator, at start-up (before mounting): not per epoch, which would cost collectives
//! and context ids every step.
//!
//! # Broadcast or scatter-and-ring
//! How a multicast to a communicator leaves the server is up to MPI's broadcast algorithm,
//! and it is not always once: measured on emulated hosts (Open MPI 4.1, TCP), the server's
//! link carried 1.55x the packets' bytes with 4 ranks on exact communicators and up to 8x
//! with 8 ranks on the world communicator (a root that sends to every member). The paper's
//! Theorem 4 sends each byte from the server once: [`Multicast::Ring`] scatters a burst into
//! one chunk per member, point-to-point, and the members pass the chunks around a ring until
//! each holds all of them (`k - 1` steps, each member sending `(k - 1)/k` of the burst over
//! its own link). It needs no communicator at all (the communicator set then only says who
//! receives what), and the server, done after the scatter, goes on to the next burst while
//! the members still ring. [`Multicast::Broadcast`] uses the communicators and MPI's
//! broadcast.
//!
//! # Bursts
//! Every packet is a collective step its receivers must all reach, so one message per
//! packet makes the ranks march in lockstep, each packet paying a broadcast's latency and
//! the slowest member's scheduling (measured on emulated hosts: 24 ms per 100 KB packet, 6x
//! the uncoded time). Consecutive packets of one route (the plan lists a set's packets
//! together, an uncoded plan a rank's) therefore travel as one message, a `Burst` of at
//! most `BURST_PACKETS` packets and about `BURST_BYTES` (counted from the manifest's
//! sizes, which every rank has alike, so every rank cuts the same bursts without talking).

use std::sync::atomic::AtomicBool;

use crate::coded::groups::{Communicators, Route, group_mask};
use crate::coded::{Node, Transmission};
use crate::comm::{Batch, Comm, CommError};
use crate::plan::{Rank, SampleId};

use super::SERVER;
use super::liveness::ServerId;

/// Packets per burst at most.
pub(crate) const BURST_PACKETS: usize = 64;
/// Payload bytes per burst, about (a burst holds at least one packet).
pub(crate) const BURST_BYTES: u64 = 16 << 20;
/// Bytes a sample of unknown size counts for when cutting bursts.
const UNKNOWN_SIZE: u64 = 1 << 20;

/// Consecutive packets that travel as one message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Burst {
    pub route: Route,
    /// Indices into the step's packets.
    pub packets: std::ops::Range<usize>,
}

const TAG_UNICAST_HEAD: u16 = 0x5305;
const TAG_UNICAST: u16 = 0x5306;
const TAG_SCATTER_HEAD: u16 = 0x5307;
const TAG_SCATTER: u16 = 0x5309;
const TAG_RING: u16 = 0x5308;

/// How a burst reaches a group of several ranks (module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Multicast {
    /// Scatter from the server, then a ring among the members (the paper's Theorem 4).
    #[default]
    Ring,
    /// MPI's broadcast on the merged communicators.
    Broadcast,
}

impl Multicast {
    pub fn name(self) -> &'static str {
        match self {
            Multicast::Ring => "ring",
            Multicast::Broadcast => "broadcast",
        }
    }
}

/// Where this rank's handle on a communicator is.
enum Handle {
    /// A member, on a communicator of its own.
    Sub(Box<dyn Comm>),
    /// A member of the communicator of every compute rank: the world communicator.
    World,
    /// Not a member.
    None,
}

/// The communicators packets travel on, and this rank's part in each.
pub struct Routes {
    comms: Communicators,
    handles: Vec<Handle>,
    multicast: Multicast,
    /// The server's process, where the start-up learned it (see `liveness`).
    server: Option<ServerId>,
}

impl Routes {
    /// Creates `comms` on `world` (server at world rank 0, compute node `i` at world rank
    /// `i + 1`): collective over the whole world, every rank passing the same `comms`; `me`
    /// is this rank's node, `None` on the server.
    pub fn create(
        world: &mut dyn Comm,
        me: Option<Node>,
        comms: Communicators,
        multicast: Multicast,
    ) -> Result<Routes, CommError> {
        let all = all_nodes(comms.nodes());
        let mut handles = Vec::with_capacity(comms.len());
        for mask in comms.iter() {
            if multicast == Multicast::Ring {
                handles.push(Handle::None); // no communicator needed
                continue;
            }
            let member = me.is_none_or(|n| mask & (1 << n) != 0);
            if mask == all {
                handles.push(if member { Handle::World } else { Handle::None });
                continue;
            }
            let sub = world.split(u32::from(member))?;
            handles.push(if member {
                Handle::Sub(sub)
            } else {
                Handle::None
            });
        }
        Ok(Routes {
            comms,
            handles,
            multicast,
            server: None,
        })
    }

    /// Every group on the world communicator, for tests and `--communicators 1`.
    #[cfg(test)]
    pub(crate) fn world(nodes: usize) -> Routes {
        let comms = Communicators::new(nodes, 1).expect("one communicator is a valid limit");
        let handles = comms.iter().map(|_| Handle::World).collect();
        Routes {
            comms,
            handles,
            multicast: Multicast::Broadcast,
            server: None,
        }
    }

    /// The same routes to the server `id` (a compute rank on its host watches it while it
    /// waits, see `liveness`).
    pub fn with_server(mut self, id: ServerId) -> Routes {
        self.server = Some(id);
        self
    }

    /// The server's process, if known.
    pub(crate) fn server(&self) -> Option<&ServerId> {
        self.server.as_ref()
    }

    /// Communicators created (the world's not counted).
    pub fn created(&self) -> usize {
        (self.handles.iter())
            .filter(|h| matches!(h, Handle::Sub(_)))
            .count()
    }

    pub fn multicast(&self) -> Multicast {
        self.multicast
    }

    pub fn communicators(&self) -> &Communicators {
        &self.comms
    }

    /// The route of `tx`'s group.
    pub(crate) fn route(&self, tx: &Transmission) -> Route {
        self.comms
            .route(group_mask(tx))
            .expect("a plan's groups are non-empty sets of its nodes")
    }

    /// The step's packets cut into bursts; `size` is a sample's size in the manifest.
    pub(crate) fn bursts(
        &self,
        txs: &[Transmission],
        size: impl Fn(SampleId) -> Option<u64>,
    ) -> Vec<Burst> {
        let mut out: Vec<Burst> = Vec::new();
        let mut bytes = 0u64;
        for (i, tx) in txs.iter().enumerate() {
            let route = self.route(tx);
            let len = (tx.parts.iter())
                .map(|&(s, _)| size(s).unwrap_or(UNKNOWN_SIZE))
                .max()
                .unwrap_or(0);
            match out.last_mut() {
                Some(b)
                    if b.route == route
                        && b.packets.len() < BURST_PACKETS
                        && bytes + len <= BURST_BYTES =>
                {
                    b.packets.end = i + 1;
                    bytes += len;
                }
                _ => {
                    out.push(Burst {
                        route,
                        packets: i..i + 1,
                    });
                    bytes = len;
                }
            }
        }
        out
    }

    /// Whether compute node `node` receives what travels on `route`.
    pub(crate) fn reaches(&self, route: Route, node: Node) -> bool {
        self.comms.reached(route) & (1 << node) != 0
    }

    /// Sends `data` on `route` (the server) or receives it (a compute rank it reaches). Every
    /// rank `route` reaches, and the server, must call it for the same packet, in the same
    /// order of packets.
    pub(crate) fn deliver(
        &mut self,
        world: &mut dyn Comm,
        route: Route,
        data: Vec<u8>,
        abort: &AtomicBool,
    ) -> Result<Vec<u8>, CommError> {
        match route {
            Route::Comm(i) if self.multicast == Multicast::Ring => {
                let members: Vec<Node> = (0..self.comms.nodes())
                    .filter(|&n| self.comms.members(i) & (1 << n) != 0)
                    .collect();
                ring(world, &members, data, abort)
            }
            Route::Comm(i) => match &mut self.handles[i] {
                Handle::Sub(comm) => {
                    // `world` may tick the job view as it is used; a broadcast on a
                    // communicator of its own would not: let it tick between packets.
                    world.idle();
                    comm.broadcast(SERVER, data)
                }
                Handle::World => world.broadcast(SERVER, data),
                Handle::None => unreachable!("only members take part in a broadcast"),
            },
            Route::Unicast(node) if world.rank() == SERVER => {
                let to = node as Rank + 1;
                let head = (data.len() as u64).to_le_bytes().to_vec();
                let batch = |buf| Batch {
                    sends: vec![(to, buf)],
                    recvs: vec![],
                };
                world.transfer(TAG_UNICAST_HEAD, batch(head), abort)?;
                world.transfer(TAG_UNICAST, batch(data), abort)?;
                Ok(Vec::new())
            }
            Route::Unicast(_) => {
                let recv = |len: usize| Batch {
                    sends: vec![],
                    recvs: vec![(SERVER, vec![0; len])],
                };
                let head = world.transfer(TAG_UNICAST_HEAD, recv(8), abort)?;
                let len = u64::from_le_bytes(head.recvs[0].1[..8].try_into().expect("8"));
                let mut body = world.transfer(TAG_UNICAST, recv(len as usize), abort)?;
                Ok(body.recvs.pop().expect("one receive").1)
            }
        }
    }
}

/// Chunk `j` of `k` of a message of `len` bytes.
fn chunk(len: usize, k: usize, j: usize) -> std::ops::Range<usize> {
    j * len / k..(j + 1) * len / k
}

/// Theorem 4's multicast of `data` (the server's) to `members` (compute nodes, ascending):
/// the server sends each member the length and one chunk; the members pass the chunks
/// around a ring. Returns the whole message on a member, nothing on the server.
fn ring(
    world: &mut dyn Comm,
    members: &[Node],
    data: Vec<u8>,
    abort: &AtomicBool,
) -> Result<Vec<u8>, CommError> {
    let k = members.len();
    let rank_of = |n: Node| n as Rank + 1;
    let sends = |sends: Vec<(Rank, Vec<u8>)>| Batch {
        sends,
        recvs: vec![],
    };
    let recv = |from: Rank, len: usize| Batch {
        sends: vec![],
        recvs: vec![(from, vec![0; len])],
    };
    if world.rank() == SERVER {
        let len = data.len();
        let heads = (members.iter())
            .map(|&n| (rank_of(n), (len as u64).to_le_bytes().to_vec()))
            .collect();
        world.transfer(TAG_SCATTER_HEAD, sends(heads), abort)?;
        let chunks = (members.iter().enumerate())
            .map(|(j, &n)| (rank_of(n), data[chunk(len, k, j)].to_vec()))
            .collect();
        world.transfer(TAG_SCATTER, sends(chunks), abort)?;
        return Ok(Vec::new());
    }
    let me = world.rank() as usize - 1;
    let j = (members.iter())
        .position(|&n| n == me)
        .expect("only members take part in a ring");
    let head = world.transfer(TAG_SCATTER_HEAD, recv(SERVER, 8), abort)?;
    let len = u64::from_le_bytes(head.recvs[0].1[..8].try_into().expect("8")) as usize;
    let mut out = vec![0u8; len];
    let mine = world.transfer(TAG_SCATTER, recv(SERVER, chunk(len, k, j).len()), abort)?;
    out[chunk(len, k, j)].copy_from_slice(&mine.recvs[0].1);
    let (right, left) = (members[(j + 1) % k], members[(j + k - 1) % k]);
    for r in 0..k - 1 {
        // Pass on the chunk received last round; receive the one before it from the left.
        let send = (j + k - r) % k;
        let get = (j + k - r - 1) % k;
        let batch = Batch {
            sends: vec![(rank_of(right), out[chunk(len, k, send)].to_vec())],
            recvs: vec![(rank_of(left), vec![0; chunk(len, k, get).len()])],
        };
        let got = world.transfer(TAG_RING, batch, abort)?;
        out[chunk(len, k, get)].copy_from_slice(&got.recvs[0].1);
    }
    Ok(out)
}

/// A burst's message: `u32` count, the packets' lengths (`u64` each), the packets.
pub(crate) fn pack(packets: &[Vec<u8>]) -> Vec<u8> {
    let total: usize = packets.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(4 + 8 * packets.len() + total);
    out.extend_from_slice(&(packets.len() as u32).to_le_bytes());
    for p in packets {
        out.extend_from_slice(&(p.len() as u64).to_le_bytes());
    }
    for p in packets {
        out.extend_from_slice(p);
    }
    out
}

/// The packets of a burst's message, `None` if it is not `count` well-formed packets.
pub(crate) fn unpack(msg: &[u8], count: usize) -> Option<Vec<&[u8]>> {
    let n = u32::from_le_bytes(msg.get(..4)?.try_into().ok()?) as usize;
    if n != count {
        return None;
    }
    let lens = msg.get(4..4 + 8 * n)?;
    let mut at = 4 + 8 * n;
    let mut out = Vec::with_capacity(n);
    for l in lens.chunks_exact(8) {
        let len = usize::try_from(u64::from_le_bytes(l.try_into().ok()?)).ok()?;
        out.push(msg.get(at..at.checked_add(len)?)?);
        at += len;
    }
    (at == msg.len()).then_some(out)
}

fn all_nodes(n: usize) -> u64 {
    if n >= 64 { u64::MAX } else { (1u64 << n) - 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_cut_runs_of_one_route_by_count_and_bytes() {
        let routes = Routes::world(3);
        let tx = |parts: Vec<(SampleId, Node)>, group: Vec<Node>| Transmission { parts, group };
        let mut txs = vec![tx(vec![(0, 0)], vec![0]); 70];
        txs.push(tx(vec![(1, 1)], vec![1]));
        txs.push(tx(vec![(2, 0), (3, 1)], vec![0, 1]));
        let b = routes.bursts(&txs, |_| Some(10));
        let spans: Vec<_> = b.iter().map(|b| b.packets.clone()).collect();
        assert_eq!(spans, vec![0..64, 64..70, 70..71, 71..72]);
        assert_eq!(b[0].route, Route::Unicast(0));
        // Large samples: one packet per burst once the bytes cap is reached.
        let b = routes.bursts(&txs[..3], |_| Some(BURST_BYTES));
        assert_eq!(b.len(), 3);
    }

    #[test]
    fn packed_bursts_round_trip_and_reject_damage() {
        let packets = vec![vec![1u8, 2, 3], vec![], vec![9; 1000]];
        let msg = pack(&packets);
        let got = unpack(&msg, 3).unwrap();
        assert_eq!(got, vec![&[1u8, 2, 3][..], &[][..], &[9u8; 1000][..]]);
        assert!(unpack(&msg, 2).is_none());
        assert!(unpack(&msg[..msg.len() - 1], 3).is_none());
        assert!(unpack(&[], 0).is_none());
    }
}
