//! The job-wide view: every rank's summary ([`RankRow`]: epoch, staging, exchange progress
//! and rate, given-up peers, source fallbacks, problems, cache use), gathered up a tree of
//! hosts to rank 0 about once a second and sent back down it (`tree`, `gather`), so that
//! any host's mount shows the whole job (the status's `job` object, `shufflefs status
//! MOUNT`).
//!
//! It must not disturb the exchange: it runs on a communicator of its own (split from the
//! job's at start-up, so no message of it can match one of the exchange's), in small
//! fixed-size frames sent without waiting (`wire`), at a bounded rate (`fanout`), and
//! nothing ever waits for a peer, so a rank that lags only turns stale in the table, and one
//! that leaves says so in a last row (`gather`). MPI belongs to one
//! thread, so the view cannot have a thread of its own: the [`Gatherer`] is a state machine
//! that thread drives, through [`Viewed`], a transport wrapper that ticks it whenever the
//! exchange polls its transport, when the loop idles ([`Comm::idle`]) and before
//! collectives. The table
//! itself is a [`JobBoard`] that the status reads from any thread.

mod board;
mod fanout;
mod gather;
mod row;
#[cfg(feature = "testing")]
pub mod sim;
mod tree;
mod wire;

pub use board::JobBoard;
pub use gather::Gatherer;
#[cfg(test)]
use row::RankRow;
pub use row::{Parts, Sampler, hostname};

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::comm::{Comm, CommError, Done, Op, Ticket};
use crate::plan::Rank;

/// Starts the job view over `comm`'s ranks. Collective (it splits `comm`, and the ranks
/// trade host names): every rank calls it at the same point of start-up. `observe` runs
/// before each of this rank's rows (the metrics' totals keep up with it). `None` if the
/// split failed (the job runs without view).
pub fn start(
    comm: &mut dyn Comm,
    board: Arc<JobBoard>,
    parts: Parts,
    observe: impl Fn() + 'static,
) -> Option<Gatherer> {
    let started = comm.split(0).and_then(|mut own| {
        let names = own.all_gather(row::hostname().as_bytes())?;
        Ok((own, names))
    });
    match started {
        Ok((own, names)) => {
            let names = names
                .iter()
                .map(|n| String::from_utf8_lossy(n).into_owned());
            board.set_hosts(names.collect());
            let mut sampler = Sampler::new(parts);
            let row = move || {
                observe();
                sampler.row()
            };
            Some(Gatherer::new(own, board, Box::new(row)))
        }
        Err(e) => {
            tracing::warn!(error = %e, "no job view: could not make its communicator");
            None
        }
    }
}

/// A transport that ticks the job view as it is used: see the module docs.
pub struct Viewed<'a> {
    pub inner: &'a mut dyn Comm,
    pub view: &'a mut Gatherer,
}

impl Comm for Viewed<'_> {
    fn rank(&self) -> Rank {
        self.inner.rank()
    }
    fn size(&self) -> u32 {
        self.inner.size()
    }
    fn hosts(&self) -> &[u32] {
        self.inner.hosts()
    }
    // A collective may wait long (the coded exchange broadcasts every packet): the view
    // ticks before each, so its rows keep coming between packets.
    fn all_gather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
        self.view.tick();
        self.inner.all_gather(data)
    }
    fn broadcast(&mut self, root: Rank, data: Vec<u8>) -> Result<Vec<u8>, CommError> {
        self.view.tick();
        self.inner.broadcast(root, data)
    }
    fn all_reduce(
        &mut self,
        values: &[u64],
        op: crate::comm::Reduce,
    ) -> Result<Vec<u64>, CommError> {
        self.view.tick();
        self.inner.all_reduce(values, op)
    }
    fn split(&mut self, color: u32) -> Result<Box<dyn Comm>, CommError> {
        self.inner.split(color)
    }
    fn post(&mut self, op: Op) -> Result<Ticket, CommError> {
        self.inner.post(op)
    }
    // Ticked inside an exchange too, so rows stay live while streams run: `tick` is a
    // no-op but every `POLL`, and the view's frames are small. (It was off for a while: the
    // cluster test `slow_steady` failed with it, from a race in the slow-peer leave that
    // the changed timing made likelier, since fixed, see `exchange::executor::stop`.)
    fn progress(&mut self, wait: Duration, abort: &AtomicBool) -> Result<Vec<Done>, CommError> {
        self.view.tick();
        self.inner.progress(wait, abort)
    }
    fn detach(&mut self, tickets: &[Ticket]) {
        self.inner.detach(tickets)
    }
    fn cancel(&mut self, tickets: &[Ticket]) {
        self.inner.cancel(tickets)
    }
    fn idle(&mut self) {
        self.view.tick();
        self.inner.idle()
    }
}

#[cfg(test)]
mod tests;
