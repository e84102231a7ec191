//! The one seam between the node and an exchange implementation.
//!
//! The node's serve loop (`node::serve`) runs one exchange per epoch and does not care
//! how the bytes travel: partial-local shuffling between the ranks ([`Partial`]) or coded
//! multicast from a server rank (`coded::CodedClient`). Each implementation says what it
//! needs through this trait, so adding a mode adds an implementation, not a branch in the
//! node.

use std::sync::atomic::AtomicBool;

use super::{ExchangeConfig, ExchangeError, ExchangeTracker, Peers, Topology, executor};
use crate::cache::SampleStore;
use crate::comm::Comm;
use crate::plan::{SampleId, Step};

/// Told once per exchange, as soon as this rank holds what it needs (or with the error
/// that ended the exchange first); the exchange itself may go on draining late messages.
pub type Settled<'a> = &'a mut dyn FnMut(Result<(), &ExchangeError>);

/// What an exchange works on besides the transport: this rank's cache, where it reports
/// progress, and the flag that says the daemon is going away.
#[derive(Clone, Copy)]
pub struct ExchangeCtx<'a> {
    pub store: &'a SampleStore,
    pub tracker: &'a ExchangeTracker,
    pub abort: &'a AtomicBool,
}

/// One rank's exchanges between epochs, epoch after epoch, on the thread that owns the
/// transport.
pub trait EpochExchange {
    /// This rank's part of the exchange into `step.next.epoch`; every rank of `comm` calls
    /// it for the same step. Calls `settled` once; returns once every message completed.
    fn run(
        &mut self,
        comm: &mut dyn Comm,
        step: &Step,
        ctx: ExchangeCtx<'_>,
        settled: Settled<'_>,
    ) -> Result<(), ExchangeError>;

    /// Drops `left`, the samples that left this rank's share, before the next exchange.
    /// By default they go from the cache; an exchange that keeps the cache's contents
    /// itself may keep some of them.
    fn evict(&mut self, store: &SampleStore, left: Vec<SampleId>) {
        for id in left {
            if let Err(e) = store.remove(id) {
                tracing::warn!(sample = id, error = %e, "could not drop a sample that left the share");
            }
        }
    }

    /// No exchange follows: says so to whoever expects one.
    fn finish(&mut self, _comm: &mut dyn Comm) {}
}

/// Partial-local shuffling between the ranks of the communicator it runs on: a schedule
/// from [`ExchangeConfig::strategy`], executed with the wire protocol of `executor`; ranks
/// that share a disk ([`Peers`]) hand samples over through it.
pub struct Partial {
    pub cfg: ExchangeConfig,
    pub peers: Peers,
}

impl EpochExchange for Partial {
    fn run(
        &mut self,
        comm: &mut dyn Comm,
        step: &Step,
        ctx: ExchangeCtx<'_>,
        settled: Settled<'_>,
    ) -> Result<(), ExchangeError> {
        let hosts = comm.hosts().to_vec();
        let topology = Topology {
            me: comm.rank(),
            hosts: &hosts,
            disks: &self.peers.disks,
        };
        let schedule = (self.cfg.strategy.strategy()).schedule(topology, &step.transfers);
        let run = executor::Ctx {
            store: ctx.store,
            tracker: ctx.tracker,
            peers: &self.peers,
            hosts: &hosts,
            me: comm.rank(),
            target: step.next.epoch,
            cfg: self.cfg,
            abort: ctx.abort,
        };
        executor::execute(comm, &run, &schedule, settled)
    }
}
