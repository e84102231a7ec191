//! "Every rank agrees" as a value: the one place a phase's outcome becomes either what the
//! phase produced on this rank or the same [`StartError::Refused`] on every rank.
//!
//! Each phase runs on every rank and ends in a collective ([`agreed`]); a rank that failed
//! contributes its reason, and a verdict every rank reached from the same gathered data
//! ([`PhaseError::Shared`]) is reported once, by rank 0. Since the value travels with the
//! agreement, no phase needs to unwrap its result after the collective.

use super::StartError;
use crate::comm::{Comm, CommError};
use crate::plan::Rank;

/// Why a phase failed on this rank.
#[derive(Debug)]
pub enum PhaseError {
    /// This rank's own reason (a busy mount point, a locked cache): reported under its rank.
    Mine(String),
    /// A verdict every rank computed alike from the same gathered data: rank 0 reports it,
    /// the others only fail.
    Shared(String),
}

impl PhaseError {
    pub fn mine(e: impl std::fmt::Display) -> PhaseError {
        PhaseError::Mine(e.to_string())
    }
}

/// The refusal every rank reports: the one place `StartError::Refused` is built.
pub fn refusal(failures: Vec<(Rank, String)>, world: u32) -> StartError {
    StartError::Refused { failures, world }
}

/// This rank's value of a phase if every rank succeeded it, else the same refusal on every
/// rank, naming each failed rank and its reason.
pub fn agreed<T>(comm: &mut dyn Comm, mine: Result<T, PhaseError>) -> Result<T, StartError> {
    let rank = comm.rank();
    let (value, payload) = match mine {
        Ok(v) => (Some(v), Vec::new()),
        Err(PhaseError::Mine(m)) => (None, [&[REPORTED][..], m.as_bytes()].concat()),
        Err(PhaseError::Shared(m)) if rank == 0 => (None, [&[REPORTED][..], m.as_bytes()].concat()),
        Err(PhaseError::Shared(_)) => (None, vec![SILENT]),
    };
    let all = comm.all_gather(&payload)?;
    let failed = all.iter().any(|m| !m.is_empty());
    match value {
        Some(v) if !failed => Ok(v),
        _ => {
            let failures = all
                .iter()
                .enumerate()
                .filter(|(_, m)| m.first() == Some(&REPORTED))
                .map(|(r, m)| (r as Rank, String::from_utf8_lossy(&m[1..]).into_owned()))
                .collect();
            Err(refusal(failures, comm.size()))
        }
    }
}

/// A failure whose reason this rank's payload carries.
const REPORTED: u8 = 1;
/// A failure another rank reports.
const SILENT: u8 = 2;

/// The outcome of `comm::decide` (rank 0 decided, everybody holds its answer): rank 0's
/// error is the same refusal on every rank.
pub fn decided(
    comm: &dyn Comm,
    outcome: Result<Result<Vec<u8>, String>, CommError>,
) -> Result<Vec<u8>, StartError> {
    outcome?.map_err(|e| refusal(vec![(0, e)], comm.size()))
}
