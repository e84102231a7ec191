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

use std::sync::atomic::AtomicBool;

use crate::coded::groups::{Communicators, Route, group_mask};
use crate::coded::{Node, Transmission};
use crate::comm::{Batch, Comm, CommError};
use crate::plan::Rank;

use super::SERVER;

const TAG_UNICAST_HEAD: u16 = 0x5305;
const TAG_UNICAST: u16 = 0x5306;

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
}

impl Routes {
    /// Creates `comms` on `world` (server at world rank 0, compute node `i` at world rank
    /// `i + 1`): collective over the whole world, every rank passing the same `comms`; `me`
    /// is this rank's node, `None` on the server.
    pub fn create(
        world: &mut dyn Comm,
        me: Option<Node>,
        comms: Communicators,
    ) -> Result<Routes, CommError> {
        let all = all_nodes(comms.nodes());
        let mut handles = Vec::with_capacity(comms.len());
        for mask in comms.iter() {
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
        Ok(Routes { comms, handles })
    }

    /// Every group on the world communicator, for tests and `--communicators 1`.
    pub fn world(nodes: usize) -> Routes {
        let comms = Communicators::new(nodes, 1).expect("one communicator is a valid limit");
        let handles = comms.iter().map(|_| Handle::World).collect();
        Routes { comms, handles }
    }

    /// Communicators created (the world's not counted).
    pub fn created(&self) -> usize {
        (self.handles.iter())
            .filter(|h| matches!(h, Handle::Sub(_)))
            .count()
    }

    pub fn communicators(&self) -> &Communicators {
        &self.comms
    }

    /// The route of `tx`'s group.
    pub fn route(&self, tx: &Transmission) -> Route {
        self.comms
            .route(group_mask(tx))
            .expect("a plan's groups are non-empty sets of its nodes")
    }

    /// Whether compute node `node` receives what travels on `route`.
    pub fn reaches(&self, route: Route, node: Node) -> bool {
        self.comms.reached(route) & (1 << node) != 0
    }

    /// Sends `data` on `route` (the server) or receives it (a compute rank it reaches). Every
    /// rank `route` reaches, and the server, must call it for the same packet, in the same
    /// order of packets.
    pub fn deliver(
        &mut self,
        world: &mut dyn Comm,
        route: Route,
        data: Vec<u8>,
        abort: &AtomicBool,
    ) -> Result<Vec<u8>, CommError> {
        match route {
            Route::Comm(i) => match &mut self.handles[i] {
                Handle::Sub(comm) => comm.broadcast(SERVER, data),
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

fn all_nodes(n: usize) -> u64 {
    if n >= 64 { u64::MAX } else { (1u64 << n) - 1 }
}
