//! Which communicator carries a packet to its group.
//!
//! A packet must reach every member of its group, and MPI broadcasts only to a whole
//! communicator. One communicator per possible group would be `2^M` of them, far beyond what
//! MPI allows: Open MPI names each communicator by a context id out of a table bounded by
//! the PML (`pml_max_contextid`; ob1 carries it in a 16-bit header field, so about 65,000,
//! and every rank of the job pays memory per communicator); MPICH allows 2,048. The paper's
//! Section 4.3 merges groups into a bounded set of communicators, each group routed to one
//! that contains it; members outside the group receive the packet and drop it.
//!
//! Today every group routes to the world communicator (server and all compute ranks), one
//! communicator in all, so the bound holds trivially at any M: the server's link still sends
//! each packet once (MPI's broadcast trees and pipelines forward it through the receivers),
//! but every compute rank receives every packet. Merged sub-communicators (`coded::groups`,
//! created once at start-up with one collective split each) plug in behind [`Routes::route`]
//! and [`Routes::broadcast`] without touching the exchange.

use crate::coded::Node;
use crate::comm::{Comm, CommError};

use super::SERVER;

/// The communicators packets travel on and the route of every group.
pub struct Routes {
    /// Members (compute nodes) of each communicator, as a bit mask.
    members: Vec<u64>,
}

impl Routes {
    /// Every group on the world communicator of `nodes` compute ranks and the server.
    pub fn world(nodes: usize) -> Routes {
        let all = if nodes >= 64 {
            u64::MAX
        } else {
            (1u64 << nodes) - 1
        };
        Routes { members: vec![all] }
    }

    /// Communicators in use (for the docs' bound and the status).
    pub fn count(&self) -> usize {
        self.members.len()
    }

    /// The communicator that carries packets to `group`.
    pub fn route(&self, group: &[Node]) -> usize {
        let mask = group.iter().fold(0u64, |m, &n| m | 1 << n);
        self.members
            .iter()
            .position(|&c| c & mask == mask)
            .expect("the world communicator contains every group")
    }

    /// Whether compute node `node` belongs to communicator `channel`.
    pub fn is_member(&self, channel: usize, node: Node) -> bool {
        self.members[channel] & (1 << node) != 0
    }

    /// Broadcasts `data` (the server's; ignored elsewhere) on `channel`: every member and
    /// the server must call it for the same packet.
    pub fn broadcast(
        &mut self,
        world: &mut dyn Comm,
        channel: usize,
        data: Vec<u8>,
    ) -> Result<Vec<u8>, CommError> {
        debug_assert_eq!(channel, 0, "only the world communicator exists today");
        world.broadcast(SERVER, data)
    }
}
