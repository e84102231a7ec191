//! "Every rank agrees" as a value: the one place a phase's outcome becomes either what the
//! phase produced on this rank or the same [`StartError::Refused`] on every rank.
//!
//! Each phase runs on every rank and ends in a collective ([`agreed`]): one all-reduce of
//! "did any rank fail" (O(log M) steps, a word at each rank), and only when one did, an
//! all-gather of the reasons. A rank that failed contributes its reason, and a verdict every rank reached from the same gathered data
//! ([`PhaseError::Shared`]) is reported once, by rank 0. Since the value travels with the
//! agreement, no phase needs to unwrap its result after the collective.

use super::StartError;
use crate::comm::{Comm, CommError, gather_if_any};
use crate::plan::Rank;

/// Why a phase failed on this rank.
#[derive(Debug)]
pub(crate) enum PhaseError {
    /// This rank's own reason (a busy mount point, a locked cache): reported under its rank.
    Mine(String),
    /// A verdict every rank computed alike from the same gathered data: rank 0 reports it,
    /// the others only fail.
    Shared(String),
}

impl PhaseError {
    pub(crate) fn mine(e: impl std::fmt::Display) -> PhaseError {
        PhaseError::Mine(e.to_string())
    }
}

/// The refusal every rank reports: the one place `StartError::Refused` is built.
pub(crate) fn refusal(failures: Vec<(Rank, String)>, world: u32) -> StartError {
    StartError::Refused { failures, world }
}

/// This rank's value of a phase if every rank succeeded it, else the same refusal on every
/// rank, naming each failed rank and its reason.
pub(crate) fn agreed<T>(comm: &mut dyn Comm, mine: Result<T, PhaseError>) -> Result<T, StartError> {
    let rank = comm.rank();
    let (value, payload) = match mine {
        Ok(v) => (Some(v), Vec::new()),
        Err(PhaseError::Mine(m)) => (None, [&[REPORTED][..], m.as_bytes()].concat()),
        Err(PhaseError::Shared(m)) if rank == 0 => (None, [&[REPORTED][..], m.as_bytes()].concat()),
        Err(PhaseError::Shared(_)) => (None, vec![SILENT]),
    };
    // One all-reduce when every rank succeeded; the reasons are gathered only on a failure.
    let all = gather_if_any(comm, &payload)?;
    match (value, all) {
        (Some(v), None) => Ok(v),
        (_, all) => {
            let all = all.unwrap_or_default();
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
pub(crate) fn decided(
    comm: &dyn Comm,
    outcome: Result<Result<Vec<u8>, String>, CommError>,
) -> Result<Vec<u8>, StartError> {
    outcome?.map_err(|e| refusal(vec![(0, e)], comm.size()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::LocalComm;

    /// Runs `mine(rank)` through `agreed` on every rank of a world of three.
    fn run(mine: fn(u32) -> Result<u32, PhaseError>) -> Vec<Result<u32, String>> {
        let handles: Vec<_> = LocalComm::world(3)
            .into_iter()
            .map(|mut comm| {
                std::thread::spawn(move || {
                    let rank = comm.rank();
                    agreed(&mut comm, mine(rank)).map_err(|e| e.to_string())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn every_rank_gets_its_value_or_the_same_refusal() {
        assert_eq!(run(|r| Ok(r * 10)), [Ok(0), Ok(10), Ok(20)]);
        let own = run(|r| match r {
            1 => Err(PhaseError::Mine("busy".into())),
            _ => Ok(r),
        });
        assert!(
            own.iter().all(|r| r == &Err("rank 1: busy".into())),
            "{own:?}"
        );
        // A verdict all ranks reached alike is said once, by rank 0.
        let shared = run(|_| Err(PhaseError::Shared("differ".into())));
        assert!(
            shared.iter().all(|r| r == &Err("rank 0: differ".into())),
            "{shared:?}"
        );
    }
}
