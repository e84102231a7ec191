//! One rank's moving parts, without the kernel: the epoch [`coordinator`], background
//! `staging` from the source, the [`status`] document, [`resume`] after a crash, and
//! `regrow` after a restart with another number of ranks.
//!
//! [`Node::start`] wires them for one rank: the daemon puts a FUSE session in front of the
//! node's `vfs::ShuffleFs` and runs [`serve`] on the thread that owns MPI, with the exchange
//! that the job's mode picks ([`EpochExchange`]); tests run
//! several nodes in one process over `LocalComm`, with no kernel and no MPI.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cache::SampleStore;
use crate::comm::Comm;
use crate::exchange::{
    EpochExchange, ExchangeConfig, ExchangeCtx, ExchangeError, ExchangeState, ExchangeTracker,
};
use crate::plan::{EpochShares, Plan, Rank, SampleId, Step};
use crate::sys::sync::Locked;

pub mod coordinator;
mod epoch_log;
pub mod jobview;
/// The job view of many ranks in one thread, for the benches.
#[cfg(feature = "testing")]
pub use jobview::sim as jobview_sim;
pub(crate) mod metrics;
pub mod regrow;
pub mod requests;
pub mod resume;
pub mod resumed;
pub mod saved;
pub(crate) mod staging;
pub mod status;

use coordinator::{Coordinator, EffectError, Effects, EpochChange, ExchangeOutcome, Next};
use staging::{Staging, StagingCmd};
use status::DaemonStatus;

/// Work for the thread that owns the transport.
pub enum ExchangeCmd {
    /// Drop the samples that left, then run the exchange for `next` (naming its arrivals
    /// first if they are not).
    Run { evict: Vec<SampleId>, next: Next },
    /// The node is going away.
    Shutdown,
}

/// Settings of one node.
pub struct NodeConfig {
    pub exchange: ExchangeConfig,
    pub staging_threads: usize,
    /// Shown in the status.
    pub source: String,
    pub mountpoint: String,
    /// Run the exchange between epochs (false: a node that only reads, as in view tests).
    pub exchanges: bool,
    /// Host of each rank (`Comm::hosts`), shown in the status.
    pub hosts: Vec<u32>,
}

/// One rank's parts, started.
pub struct Node {
    pub store: Arc<SampleStore>,
    pub coordinator: Coordinator,
    pub staging: Arc<Staging>,
    pub tracker: Arc<ExchangeTracker>,
    pub status: Arc<DaemonStatus>,
    effects: Arc<NodeEffects>,
}

impl Node {
    /// Starts rank `rank`'s node at `current` (resumed or epoch 0), and returns the queue
    /// of exchanges for [`serve`].
    pub fn start(
        store: Arc<SampleStore>,
        plan: Plan,
        rank: Rank,
        resumed: resumed::Resumed,
        cfg: NodeConfig,
    ) -> (Node, Receiver<ExchangeCmd>) {
        let (exchange_tx, exchange_rx) = channel();
        let tracker = Arc::new(ExchangeTracker::default());
        let staging = Arc::new(Staging::start(store.clone(), rank, cfg.staging_threads));
        let effects = Arc::new(NodeEffects {
            store: store.clone(),
            plan: plan.clone(),
            rank,
            tracker: tracker.clone(),
            staging: staging.clone(),
            exchange_tx,
            exchanges: cfg.exchanges,
            invalidate_tx: Mutex::new(None),
            fallback_stall: cfg.exchange.fallback_stall,
            epoch_log: epoch_log::EpochLog::new(&store.stats),
        });
        staging.send(StagingCmd::Epoch {
            current: Arc::new(resumed.current.clone()),
        });
        let resize = resumed.resize.clone();
        let coordinator = Coordinator::start(
            plan,
            rank,
            resumed.current,
            Some(resumed.next),
            effects.clone(),
        );
        let status = Arc::new(DaemonStatus {
            source: cfg.source,
            hosts: cfg.hosts,
            mountpoint: cfg.mountpoint,
            store: store.clone(),
            epochs: coordinator.clone(),
            staging: staging.progress.clone(),
            exchange: tracker.clone(),
            resize,
            equal_shares: std::sync::OnceLock::new(),
            job: Arc::default(),
            totals: Default::default(),
            partial: std::sync::OnceLock::new(),
            read_path: std::sync::OnceLock::new(),
            requests: Arc::default(),
        });
        let node = Node {
            store,
            coordinator,
            staging,
            tracker,
            status,
            effects,
        };
        (node, exchange_rx)
    }

    /// Where to tell [`serve`] to stop ([`ExchangeCmd::Shutdown`]).
    pub fn exchange_queue(&self) -> Sender<ExchangeCmd> {
        self.effects.exchange_tx.clone()
    }

    /// From now on, the old epochs whose kernel entries must be dropped, for whoever talks
    /// to the kernel; it reports each one done through `Coordinator::invalidated`. Until
    /// this is called (and in tests without a kernel) advances wait for no invalidation.
    pub fn invalidations(&self) -> Receiver<u64> {
        let (tx, rx) = channel();
        *self.effects.invalidate_tx.locked() = Some(tx);
        rx
    }
}

/// How often the exchange loop, waiting for the next exchange, lets the transport idle.
const IDLE: Duration = Duration::from_millis(200);

/// Runs the exchanges of `queue` with `exchange` on the calling thread, which owns `comm`,
/// until told to shut down; then [`EpochExchange::finish`]. A failed exchange is reported
/// to the coordinator (advancing then fetches from the source); a transport that had to
/// abandon transfers in flight ends the loop with its error, since nothing more can go
/// through it.
pub fn serve(
    comm: &mut dyn Comm,
    node: &Node,
    queue: &Receiver<ExchangeCmd>,
    exchange: &mut dyn EpochExchange,
    abort: &AtomicBool,
) -> Result<(), ExchangeError> {
    let ctx = ExchangeCtx {
        store: &node.store,
        tracker: &node.tracker,
        abort,
    };
    loop {
        // Between exchanges the transport idles every fraction of a second (see `Comm::idle`).
        let cmd = match queue.recv_timeout(IDLE) {
            Ok(cmd) => cmd,
            Err(RecvTimeoutError::Timeout) => {
                comm.idle();
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        let ExchangeCmd::Run { evict, next } = cmd else {
            break;
        };
        exchange.evict(&node.store, evict);
        let target = next.target();
        // Running from its first round on: naming what arrives waits for the peers as the
        // streams would (the status shows which peers it waits for).
        node.coordinator.exchange_started(target);
        node.tracker
            .update(target, |r| r.state = ExchangeState::Running);
        let step = named(comm, node, next, &*exchange, abort);
        let step = kept_only(
            comm,
            node,
            step,
            &|peer| exchange.takes_part(peer, target),
            abort,
        );
        // The coordinator hears as soon as this rank holds what it needs; the exchange
        // itself goes on until its late messages are drained.
        let mut settled = |result: Result<(), &ExchangeError>| {
            let outcome = match result {
                Ok(()) => ExchangeOutcome::Done,
                Err(e) => {
                    tracing::error!("{e}");
                    ExchangeOutcome::Failed(e.to_string())
                }
            };
            node.coordinator.exchange_ended(target, outcome);
        };
        let ran = exchange.run(comm, &step, ctx, &mut settled);
        if let (Ok(()), Some(partial)) = (&ran, node.store.partial()) {
            // Leavers already read make room within the epoch (`cache::early`).
            for id in partial.exchange_done(target) {
                let _ = node.store.remove(id);
            }
        }
        if let Err(e) = ran {
            if e.is_abandoned() {
                return Err(e);
            }
            tracing::warn!("exchange into epoch {target} ended with: {e}");
        }
    }
    exchange.finish(comm);
    Ok(())
}

/// `step` as a partial cache takes it: only what each receiver keeps moves (see
/// `plan::keep`), agreed with the peers (`exchange::kept`); as it is without a partial cache.
fn kept_only(
    comm: &mut dyn Comm,
    node: &Node,
    step: Arc<Step>,
    takes_part: &dyn Fn(Rank) -> bool,
    abort: &AtomicBool,
) -> Arc<Step> {
    let from = step.next.epoch.saturating_sub(1);
    let Some(hs) = node.store.partial().and_then(|p| p.handshake(from)) else {
        return step;
    };
    match crate::exchange::kept::filter(comm, &hs, &step, takes_part, abort) {
        Ok(filtered) => Arc::new(filtered),
        Err(e) => {
            // Nothing moves for this rank: what it and its receivers keep comes from the
            // source as they read it.
            tracing::warn!(
                "agreeing with the peers what a partial cache takes through the exchange into epoch {}: {e}; this rank moves nothing",
                step.next.epoch
            );
            Arc::new(Step {
                next: step.next.clone(),
                transfers: Vec::new(),
            })
        }
    }
}

/// `next`, named: by its senders (`exchange::arrivals`: one round with the peers it moves
/// samples with, which run it for the same epoch) or, where they cannot tell, by walking
/// the plan back. The coordinator hears the named step before the exchange's end.
fn named(
    comm: &mut dyn Comm,
    node: &Node,
    next: Next,
    exchange: &dyn EpochExchange,
    abort: &AtomicBool,
) -> Arc<Step> {
    let Next::Unnamed(unnamed) = next else {
        return next.walked(&node.effects.plan);
    };
    let (plan, target) = (&node.effects.plan, unnamed.target());
    let takes_part = |peer| exchange.takes_part(peer, target);
    let step = crate::exchange::arrivals::told_or_walked(comm, plan, &unnamed, &takes_part, abort);
    let step = Arc::new(step);
    node.coordinator.named(step.clone());
    step
}

/// The daemon's side of the epoch lifecycle.
struct NodeEffects {
    store: Arc<SampleStore>,
    /// The plan, to save this rank's slots of each epoch under (`saved`).
    plan: Plan,
    rank: Rank,
    tracker: Arc<ExchangeTracker>,
    staging: Arc<Staging>,
    exchange_tx: Sender<ExchangeCmd>,
    exchanges: bool,
    invalidate_tx: Mutex<Option<Sender<u64>>>,
    fallback_stall: Duration,
    epoch_log: epoch_log::EpochLog,
}

impl Effects for NodeEffects {
    fn start_exchange(&self, next: Next, evict: Vec<SampleId>) -> bool {
        if !self.exchanges {
            // No exchange: what left the share goes now.
            for id in evict {
                let _ = self.store.remove(id);
                self.store.forget(id);
            }
            return false;
        }
        self.tracker.announce(next.target());
        self.exchange_tx
            .send(ExchangeCmd::Run { evict, next })
            .is_ok()
    }

    fn prepare(&self, step: &Step, _exchange: &ExchangeOutcome) -> Result<(), EffectError> {
        let by_peer = fetch_missing(&self.store, self.rank, step, self.fallback_stall);
        self.tracker.update(step.next.epoch, |r| {
            for (peer, n) in by_peer {
                r.peer(peer).fetched_from_source += n;
            }
        });
        Ok(())
    }

    fn persist(&self, current: &EpochShares) -> Result<(), EffectError> {
        let epoch = current.epoch;
        // Before the state names the epoch, so a resume there finds its share saved.
        saved::save(self.store.dir().root(), &self.plan, self.rank, current);
        let dir = self.store.dir();
        let saved = dir
            .load_state()
            .map_err(EffectError::from)
            .and_then(|state| {
                let mut state = state.ok_or(EffectError::StateVanished)?;
                state.epoch = epoch;
                Ok(dir.save_state(&state)?)
            });
        // The advance fails (the current epoch stays); the status says why (a full cache
        // disk, say), or the job table would show no problem at all.
        if let Err(e) = &saved {
            (self.store.stats).report_problem(format!("saving epoch {epoch} failed: {e}"));
        }
        saved
    }

    /// The peers whose stream into `target` is not complete and not given up.
    fn awaited_peers(&self, target: u64) -> Vec<u32> {
        let reports = self.tracker.snapshot();
        let Some(report) = reports.iter().find(|r| r.target_epoch == target) else {
            return Vec::new();
        };
        (report.peers.iter())
            .filter(|p| p.seconds == 0.0 && !p.given_up)
            .map(|p| p.rank)
            .collect()
    }

    fn published(&self, change: &EpochChange) -> bool {
        let epoch = change.current.epoch;
        let report = (self.tracker.snapshot().into_iter()).find(|r| r.target_epoch == epoch);
        let samples = change.current.share(self.rank).len();
        (self.epoch_log).published(epoch, samples, report.as_ref(), &self.store.stats);
        if let Some(partial) = self.store.partial() {
            partial.epoch(change.current.epoch);
        }
        self.staging.send(StagingCmd::Epoch {
            current: change.current.clone(),
        });
        let tx = self.invalidate_tx.locked();
        // Nobody listening (no kernel): nothing to wait for.
        tx.as_ref()
            .is_some_and(|tx| tx.send(change.previous.epoch).is_ok())
    }
}

/// Makes sure every sample of `step.next`'s share for `rank` is cached: anything the
/// exchange could not deliver comes from the source, on a few threads. A bad sample is
/// reported, not fatal: `ensure` names it in the status, and readers get EIO for it alone
/// (or its bytes, if its source file comes back). A source that stops answering does not
/// hold the epoch: once no fetch succeeded for `stall`, this returns (reported in the
/// status's problems) and the fetches left go on in the background, so a reader of one of
/// those samples waits for the source, never the whole view. A failed fetch is no answer:
/// a store that refuses connections fails each fetch after its retries, and counting those
/// as progress held the epoch for all of them (102 s to 590 s). Returns, per peer
/// that should have delivered some of them, how many were fetched in its stead.
pub fn fetch_missing(
    store: &Arc<SampleStore>,
    rank: Rank,
    step: &Step,
    stall: Duration,
) -> Vec<(Rank, u64)> {
    let target = step.next.epoch;
    let missing: Vec<_> = step
        .next
        .share(rank)
        .iter()
        .copied()
        .filter(|&id| !store.contains(id))
        // A partial cache fetches what it keeps when it is read (the rest: from the source).
        .filter(|_| store.partial().is_none())
        .collect();
    if missing.is_empty() {
        return Vec::new();
    }
    tracing::warn!(
        target_epoch = target,
        samples = missing.len(),
        "samples not delivered by the exchange; fetching from the source"
    );
    let sender: HashMap<SampleId, Rank> = (step.transfers.iter())
        .filter(|t| t.to == rank)
        .map(|t| (t.sample, t.from))
        .collect();
    let total = missing.len();
    let done_rx = spawn_fetchers(store, missing);
    let mut by_peer: BTreeMap<Rank, u64> = BTreeMap::new();
    let (mut failed, mut finished) = (0usize, 0usize);
    let mut until = std::time::Instant::now() + stall;
    while finished < total {
        let wait = until.saturating_duration_since(std::time::Instant::now());
        match done_rx.recv_timeout(wait) {
            Ok((id, ok)) => {
                finished += 1;
                if ok {
                    until = std::time::Instant::now() + stall;
                }
                match (ok, sender.get(&id)) {
                    (true, Some(&peer)) => *by_peer.entry(peer).or_default() += 1,
                    (true, None) => {}
                    (false, _) => failed += 1,
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                let left = total - finished;
                let what = format!(
                    "the source answered none of {left} fetches for {stall:?} while filling epoch {target} (samples the exchange did not deliver); the epoch is published and those samples are read from the source when asked"
                );
                tracing::error!("{what}");
                store.stats.report_problem(what);
                break;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    if failed > 0 {
        tracing::warn!(
            target_epoch = target,
            samples = failed,
            "samples could not be fetched from the source; reads of them fail until they can be (see the status's problems)"
        );
    }
    by_peer.into_iter().collect()
}

/// Fetches `missing` from the source on a few threads; each fetch reports its sample and
/// whether it is cached now on the returned channel, which closes when they are all done.
fn spawn_fetchers(store: &Arc<SampleStore>, missing: Vec<SampleId>) -> Receiver<(SampleId, bool)> {
    const THREADS: usize = 4;
    let total = missing.len();
    let queue = Arc::new(Mutex::new(missing));
    let (done_tx, done_rx) = channel::<(SampleId, bool)>();
    for _ in 0..THREADS.min(total) {
        let (store, queue, done_tx) = (store.clone(), queue.clone(), done_tx.clone());
        let spawned = std::thread::Builder::new()
            .name("fallback".into())
            .spawn(move || {
                loop {
                    let next = queue.locked().pop();
                    let Some(id) = next else { break };
                    if done_tx.send((id, store.ensure(id).is_ok())).is_err() {
                        break;
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start a fallback fetch thread");
        }
    }
    done_rx
}
