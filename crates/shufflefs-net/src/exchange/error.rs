//! How an exchange fails. Two kinds matter to the caller: the transport failed (`Comm`: no
//! later message can be trusted to arrive, and after [`CommError::Abandoned`] the process
//! must end, see `comm`), or this rank failed locally but still served its peers to the end
//! (everything else: its peers' exchanges are unaffected, and what it lacks comes from the
//! source).

use std::fmt;
use std::io;

use crate::comm::CommError;
use crate::plan::{Rank, SampleId};

/// The part of the protocol a transport failure hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Sizes,
    Samples,
    Confirm,
    /// Talking to the server of the coded exchange.
    Coded,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Sizes => "exchanging sample sizes",
            Phase::Samples => "exchanging samples",
            Phase::Confirm => "confirming the exchange",
            Phase::Coded => "coded exchange with the server",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The transport failed while talking to `peers` (those of the round it hit).
    #[error(
        "{phase} for epoch {target_epoch} with ranks {}: {source}",
        slash(peers)
    )]
    Comm {
        phase: Phase,
        target_epoch: u64,
        peers: Vec<Rank>,
        #[source]
        source: CommError,
    },
    /// A received sample could not be written to the cache.
    #[error("storing received sample {sample} in the cache: {source}")]
    Store {
        sample: SampleId,
        #[source]
        source: io::Error,
    },
    /// The cache could not be made durable after the last round.
    #[error("making received samples durable: {0}")]
    Sync(#[source] io::Error),
    /// Something else on this rank (a disk thread that ended early).
    #[error("{0}")]
    Local(String),
}

impl ExchangeError {
    /// The transport's error, if the transport is what failed.
    pub(crate) fn comm(&self) -> Option<&CommError> {
        match self {
            ExchangeError::Comm { source, .. } => Some(source),
            ExchangeError::Store { .. } | ExchangeError::Sync(_) | ExchangeError::Local(_) => None,
        }
    }

    /// Whether transfers were left in flight: the process must end without finalizing MPI.
    pub fn is_abandoned(&self) -> bool {
        matches!(self.comm(), Some(CommError::Abandoned))
    }
}

fn slash(peers: &[Rank]) -> String {
    let names: Vec<String> = peers.iter().map(Rank::to_string).collect();
    names.join("/")
}
