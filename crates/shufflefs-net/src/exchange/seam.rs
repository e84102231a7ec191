//! The one seam between the node and an exchange implementation.
//!
//! The node's serve loop (`node::serve`) runs one exchange per epoch and does not care
//! how the bytes travel: partial-local shuffling between the ranks ([`Partial`]) or coded
//! multicast from a server rank (`coded::CodedClient`). Each implementation says what it
//! needs through this trait, so adding a mode adds an implementation, not a branch in the
//! node.

use std::sync::atomic::AtomicBool;

use super::{ExchangeConfig, ExchangeError, ExchangeTracker, Peers, Schedule, Topology, executor};
use crate::cache::SampleStore;
use crate::comm::Comm;
use crate::plan::{Rank, SampleId, Step};

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
            store.forget(id);
        }
    }

    /// No exchange follows: says so to whoever expects one.
    fn finish(&mut self, _comm: &mut dyn Comm) {}

    /// Whether `peer` takes part in the exchange into `target` (and so in the round that
    /// names its arrivals first, `exchange::arrivals`): a peer that left, or was left out
    /// for being far slower, does not, on both sides alike.
    fn takes_part(&self, _peer: Rank, _target: u64) -> bool {
        true
    }
}

/// Partial-local shuffling between the ranks of the communicator it runs on: a schedule
/// from [`ExchangeConfig::strategy`], executed with the wire protocol of `executor`; ranks
/// that share a disk ([`Peers`]) hand samples over through it.
pub struct Partial {
    pub cfg: ExchangeConfig,
    pub peers: Peers,
}

impl EpochExchange for Partial {
    fn takes_part(&self, peer: Rank, target: u64) -> bool {
        self.peers.left.takes_part(peer, target)
    }

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
        let mut schedule = (self.cfg.strategy.strategy()).schedule(topology, &step.transfers);
        let target = step.next.epoch;
        self.leave_out_the_left(&mut schedule, target, ctx.tracker);
        let run = executor::Ctx {
            store: ctx.store,
            tracker: ctx.tracker,
            peers: &self.peers,
            hosts: &hosts,
            me: comm.rank(),
            target,
            cfg: self.cfg,
            abort: ctx.abort,
            leaving: false,
        };
        executor::execute(comm, &run, &schedule, settled)
    }
}

impl Partial {
    /// This rank stops: it serves the exchange into `step.next.epoch` (the one after the
    /// last it ran) without taking or giving a sample, so that peers already in it, or
    /// going to run it, complete it; its confirmations tell them it left, so their later
    /// exchanges leave it out (see `peers::Left`) and fetch its samples from the
    /// source. Peers that left before take no part. Returns once every peer's messages of
    /// that exchange completed: only a peer that stays and never advances holds it, as it
    /// would hold MPI finalize.
    ///
    /// Why one more exchange: the ranks' exchanges are never more than one apart (a rank
    /// starts the exchange into `t + 1` only once its exchange into `t`, with every
    /// peer's messages, completed), so when this rank stops after the exchange into `t`,
    /// no peer has posted messages for any exchange past `t + 1`, and a peer that learns
    /// of the leave in `t + 1` posts none to this rank later.
    pub fn leave(
        &mut self,
        comm: &mut dyn Comm,
        store: &SampleStore,
        tracker: &ExchangeTracker,
        step: &Step,
    ) -> Result<(), ExchangeError> {
        let hosts = comm.hosts().to_vec();
        let topology = Topology {
            me: comm.rank(),
            hosts: &hosts,
            disks: &self.peers.disks,
        };
        let mut schedule = (self.cfg.strategy.strategy()).schedule(topology, &step.transfers);
        let target = step.next.epoch;
        self.leave_out_the_left(&mut schedule, target, tracker);
        let never = AtomicBool::new(false);
        let run = executor::Ctx {
            store,
            tracker,
            peers: &self.peers,
            hosts: &hosts,
            me: comm.rank(),
            target,
            cfg: self.cfg,
            abort: &never,
            leaving: true,
        };
        executor::execute(comm, &run, &schedule, &mut |_| {})
    }

    /// Drops the streams of peers that left before the exchange into `target`; the
    /// status shows them given up, and their samples come from the source. For a peer left
    /// out for being slow it also shows what the plan would have had it send (a rank that
    /// left sends nothing it could owe).
    fn leave_out_the_left(&self, schedule: &mut Schedule, target: u64, tracker: &ExchangeTracker) {
        let left = &self.peers.left;
        for round in &mut schedule.rounds {
            round.ops.retain(|op| {
                let peer = op.stream().peer;
                let stays = left.takes_part(peer, target);
                if !stays {
                    let owed = match !op.is_outgoing() && left.slow(peer) {
                        true => op.stream().samples.len() as u64,
                        false => 0,
                    };
                    tracker.update(target, |r| {
                        let p = r.peer(peer);
                        p.given_up = true;
                        p.samples_to_receive += owed;
                    });
                }
                stays
            });
        }
    }
}
