//! The one owner of the epoch lifecycle.
//!
//! Every epoch goes through the states of [`EpochState`]: the exchange into it is announced,
//! runs and ends (done or failed); an advance request makes this rank hold the whole new
//! share (`prepare`: fetch from the source whatever the exchange did not deliver), the new
//! epoch is saved (`persist`, so a crash resumes there) and published; the kernel is then told
//! to forget the old epoch's names (invalidated). One worker thread owns these states and is
//! fed `Command`s, foyer-style: an advance carries the channel its answer goes to, and the
//! exchange and the kernel invalidation report back through the same queue. Nothing else
//! writes the current epoch, so there is no lock order to get wrong and no state compared as
//! a string.
//!
//! The coordinator is also the one owner of "is the next epoch ready"
//! (`Coordinator::is_ready`, the status's `ready_epochs`): the exchange's tracker
//! (`exchange::ExchangeTracker`) only counts what moved.
//!
//! Readers (every lookup) see the published epoch through [`Coordinator::current`], a
//! read-mostly snapshot the worker swaps at publication. The slow parts (fetching missing
//! samples) run on a thread of their own and report back, so the worker keeps answering
//! (status, a second advance request, the invalidation of the previous epoch) meanwhile.
//! What happens around publication (eviction, the next exchange, staging, kernel
//! invalidation) is the daemon's business, behind [`Effects`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cache::CacheError;
use crate::plan::unnamed::Unnamed;
use crate::plan::{EpochShares, Plan, Rank, SampleId, Step};
use crate::sys::sync::Locked;
use crate::sys::sync::RwLocked;

mod cancel;
mod worker;

pub use cancel::{Cancel, Cancelled};
use worker::Worker;

/// Where an epoch is in its life, on this rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EpochState {
    /// The exchange into it will run.
    Announced,
    /// Its exchange is running.
    Exchanging,
    /// Its exchange ended; an advance fetches from the source what it did not deliver.
    Exchanged(ExchangeOutcome),
    /// An advance is making this rank hold its whole share; its exchange ended so.
    Preparing(ExchangeOutcome),
    /// The current epoch.
    Published,
    /// Superseded, and the kernel was told to forget its names (or is being told).
    Invalidated,
}

/// How the exchange into an epoch ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExchangeOutcome {
    Done,
    /// It failed; the message says why. The samples it did not deliver come from the source.
    Failed(String),
    /// There is no exchange (one rank, or a test without one).
    Skipped,
}

/// Why an advance was refused or failed. Cloned to every request that waits for the same
/// advance, so a failed step's cause travels as its message (`reason`).
#[derive(Clone, Debug, thiserror::Error)]
pub(crate) enum AdvanceError {
    #[error("epoch {target} is behind the current epoch {current}")]
    Behind { target: u64, current: u64 },
    #[error("epochs advance one at a time: current is {current}, asked for {target}")]
    NotNext { target: u64, current: u64 },
    #[error("preparing epoch {target}: {reason}")]
    Prepare { target: u64, reason: String },
    #[error("saving epoch {target}: {reason}")]
    Persist { target: u64, reason: String },
    #[error("the daemon is shutting down")]
    ShuttingDown,
    /// The caller gave up waiting (it was signalled); the advance goes on only if another
    /// request still waits for it.
    #[error("the advance to epoch {target} was interrupted")]
    Interrupted { target: u64 },
}

/// What a published epoch changed.
pub struct EpochChange {
    pub previous: Arc<EpochShares>,
    pub current: Arc<EpochShares>,
}

/// The plan's step out of the current epoch: named, or with its arrivals still to be
/// named, by their senders in the exchange's first round (`exchange::arrivals`) or, where
/// that does not happen, by walking the plan back ([`Next::walked`]).
#[derive(Clone, Debug)]
pub enum Next {
    Named(Arc<Step>),
    Unnamed(Arc<Unnamed>),
}

impl Next {
    /// `rank`'s step out of `current`: unnamed for a per-rank plan (O(k)), else named.
    pub fn of(plan: &Plan, rank: Rank, current: &Arc<EpochShares>) -> Next {
        match plan.own_unnamed(rank, current) {
            Some(u) => Next::Unnamed(Arc::new(u)),
            None => Next::Named(Arc::new(plan.step(current))),
        }
    }

    /// The epoch this step leads into.
    pub fn target(&self) -> u64 {
        match self {
            Next::Named(step) => step.next.epoch,
            Next::Unnamed(u) => u.target(),
        }
    }

    /// The ranks `rank` moves samples with in this step, ascending.
    fn peers(&self, rank: Rank) -> Vec<Rank> {
        match self {
            Next::Named(step) => {
                let mut peers: Vec<_> = (step.transfers.iter())
                    .filter_map(|t| match (t.from == rank, t.to == rank) {
                        (true, false) => Some(t.to),
                        (false, true) => Some(t.from),
                        _ => None,
                    })
                    .collect();
                peers.sort_unstable();
                peers.dedup();
                peers
            }
            Next::Unnamed(u) => u.peers(),
        }
    }

    /// The named step: as it is, or walked back (O(k · epoch)).
    pub(crate) fn walked(&self, plan: &Plan) -> Arc<Step> {
        match self {
            Next::Named(step) => step.clone(),
            Next::Unnamed(u) => Arc::new(plan.walked(u)),
        }
    }
}

/// Why a step of [`Effects`] failed (the advance fails, the current epoch stays).
#[derive(Debug, thiserror::Error)]
pub enum EffectError {
    /// Reading or saving the cache's state file.
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("the cache's state file vanished")]
    StateVanished,
    /// Any other I/O failure (the thread that prepares an epoch could not start).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// What the coordinator asks of the rest of the daemon.
pub trait Effects: Send + Sync + 'static {
    /// Starts the exchange of `next` (for the first epoch: `evict` is empty) after dropping
    /// `evict`; returns false if no exchange will report back (the state is then
    /// `Exchanged(Skipped)`). An exchange that names `next`'s arrivals says so through
    /// `Coordinator::named` before it reports its end.
    fn start_exchange(&self, next: Next, evict: Vec<SampleId>) -> bool;
    /// Makes this rank hold every sample of `step.next`'s share. Runs on its own thread.
    fn prepare(&self, step: &Step, exchange: &ExchangeOutcome) -> Result<(), EffectError>;
    /// Saves `current`'s epoch as the one to resume at (and this rank's share of it).
    fn persist(&self, current: &EpochShares) -> Result<(), EffectError>;
    /// After publication (staging, kernel invalidation). Returns whether the invalidation
    /// of `change.previous` will be reported through `Coordinator::invalidated`.
    fn published(&self, change: &EpochChange) -> bool;
    /// The peers whose part of the exchange into `target` has not arrived yet, for the
    /// status and the log of a waiting advance; empty if not known.
    fn awaited_peers(&self, _target: u64) -> Vec<u32> {
        Vec::new()
    }
}

/// What advances wait for, as the status shows it (`advance_waiting`) and the log says.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct AdvanceWait {
    pub target_epoch: u64,
    /// `"exchange"` (peers must send their part; they may not have reached the current
    /// epoch yet), `"source"` (fetching what the exchange did not deliver) or
    /// `"invalidation"` (published; the kernel is forgetting the old epoch's names).
    pub waiting_for: &'static str,
    /// For `"exchange"`: the ranks whose part has not arrived.
    pub peers: Vec<u32>,
    /// Requests waiting (lookups of the folder, writes to the control file).
    pub requests: usize,
    /// How long the oldest of them has waited.
    pub seconds: f64,
}

/// The last epoch there can be: the view's inode numbers have room for 29 bits of it (half
/// a billion epochs).
pub(crate) const MAX_EPOCH: u64 = (1 << 29) - 1;

/// How long an advance by a control-file write waits for the kernel to forget the old epoch.
const INVALIDATION_WAIT: Duration = Duration::from_secs(5);

/// How often a waiting advance looks at its cancellation token.
const CANCEL_POLL: Duration = Duration::from_millis(50);

/// When a waiting advance first says in the log what it waits for, and how often again.
const WAIT_LOG_AFTER: Duration = Duration::from_secs(2);
const WAIT_LOG_EVERY: Duration = Duration::from_secs(30);

enum Command {
    Advance {
        /// Names the request, so that a caller that gives up can withdraw it.
        id: u64,
        target: u64,
        /// Answer only once the kernel forgot the old epoch (a control-file write: the
        /// writer expects `epoch-N` gone when `write` returns; a lookup cannot wait for
        /// that, since the kernel holds the folder lock it needs).
        after_invalidation: bool,
        reply: Sender<Result<(), AdvanceError>>,
    },
    /// The exchange named the arrivals of the step into `step.next.epoch`.
    Named(Arc<Step>),
    ExchangeStarted(u64),
    ExchangeEnded(u64, ExchangeOutcome),
    /// The epoch was prepared (with the step, named if it was not).
    Prepared(u64, Result<Arc<Step>, EffectError>),
    Invalidated(u64),
    /// The caller of advance `id` stopped waiting (see [`Cancel`]).
    Withdraw(u64),
    Shutdown,
}

/// What readers share with the worker.
struct Shared {
    plan: Plan,
    rank: Rank,
    current: RwLock<Arc<EpochShares>>,
    states: Mutex<BTreeMap<u64, EpochState>>,
    /// Advances whose callers wait: id -> (target, since).
    waits: Mutex<BTreeMap<u64, (u64, Instant)>>,
    /// The ranks the exchange into the next epoch moves samples with (from the plan).
    exchange_peers: Mutex<Vec<Rank>>,
    next_id: AtomicU64,
    /// The mount is going away with readers still holding it (`give_up_waits`): every
    /// advance waiting, and any asked later, fails as shutting down.
    stopping: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn states(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, EpochState>> {
        self.states.locked()
    }

    fn state(&self, epoch: u64) -> Option<EpochState> {
        self.states().get(&epoch).cloned()
    }
}

/// A handle on the coordinator: cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct Coordinator {
    shared: Arc<Shared>,
    tx: Sender<Command>,
    /// Asked which peers a waiting advance waits for.
    effects: Arc<dyn Effects>,
}

impl Coordinator {
    /// Starts the worker at `current` (with the plan's step out of it if the caller has it)
    /// and starts the exchange into the next epoch.
    pub fn start(
        plan: Plan,
        rank: Rank,
        current: EpochShares,
        next: Option<Step>,
        effects: Arc<dyn Effects>,
    ) -> Coordinator {
        let current = Arc::new(current);
        let next = match next.filter(|s| s.next.epoch == current.epoch + 1) {
            Some(step) => Next::Named(Arc::new(step)),
            None => Next::of(&plan, rank, &current),
        };
        let epoch = current.epoch;
        let shared = Arc::new(Shared {
            plan,
            rank,
            current: RwLock::new(current),
            states: Mutex::new(BTreeMap::from([(epoch, EpochState::Published)])),
            waits: Mutex::default(),
            exchange_peers: Mutex::default(),
            next_id: AtomicU64::new(0),
            stopping: std::sync::atomic::AtomicBool::new(false),
        });
        let (tx, rx) = channel();
        let handle = Coordinator {
            shared: shared.clone(),
            tx: tx.clone(),
            effects: effects.clone(),
        };
        let mut worker = Worker {
            shared,
            effects,
            tx,
            next,
            waiting: Vec::new(),
            after_invalidation: Vec::new(),
        };
        thread::Builder::new()
            .name("epochs".into())
            .spawn(move || {
                worker.start_next_exchange(Vec::new());
                worker.run(&rx);
            })
            .expect("spawn the epoch coordinator");
        handle
    }

    pub fn plan(&self) -> &Plan {
        &self.shared.plan
    }

    pub(crate) fn rank(&self) -> Rank {
        self.shared.rank
    }

    /// The published epoch's shares.
    pub fn current(&self) -> Arc<EpochShares> {
        self.shared.current.read_locked().clone()
    }

    pub fn epoch(&self) -> u64 {
        self.current().epoch
    }

    /// The state of `epoch` on this rank, if it is the current or the next one.
    pub fn state(&self, epoch: u64) -> Option<EpochState> {
        self.shared.state(epoch)
    }

    /// Whether `epoch`'s exchange completed (for the epoch after the current one: the
    /// status's `ready_epochs`). The one answer to "is the next epoch ready", whatever
    /// exchange runs; the exchange's tracker only counts its progress.
    pub(crate) fn is_ready(&self, epoch: u64) -> bool {
        matches!(
            self.state(epoch),
            Some(
                EpochState::Exchanged(ExchangeOutcome::Done)
                    | EpochState::Preparing(ExchangeOutcome::Done)
            )
        )
    }

    /// Makes `target` the current epoch: `current` is a no-op, anything but `current + 1`
    /// is refused (the current view keeps working). Blocks until published.
    #[cfg(test)]
    pub(crate) fn advance_to(&self, target: u64) -> Result<(), AdvanceError> {
        self.advance(target, false, &Cancel::never())
    }

    /// [`advance_to`](Self::advance_to), giving up when `cancel` is set (its caller was
    /// signalled, or the mount goes away).
    pub(crate) fn advance_to_until(
        &self,
        target: u64,
        cancel: &Cancel,
    ) -> Result<(), AdvanceError> {
        self.advance(target, false, cancel)
    }

    /// [`advance_and_forget`](Self::advance_and_forget), giving up when `cancel` is set.
    pub(crate) fn advance_and_forget_until(
        &self,
        target: u64,
        cancel: &Cancel,
    ) -> Result<(), AdvanceError> {
        self.advance(target, true, cancel)
    }

    /// Asks the worker to advance and waits for its answer, or for `cancel`: then the
    /// request is withdrawn (an advance nobody waits for any more does not start preparing;
    /// one already preparing still publishes).
    fn advance(
        &self,
        target: u64,
        after_invalidation: bool,
        cancel: &Cancel,
    ) -> Result<(), AdvanceError> {
        let (reply, answer) = channel();
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let _waiting = WaitEntry::new(&self.shared, id, target);
        self.send(Command::Advance {
            id,
            target,
            after_invalidation,
            reply,
        });
        let mut log_at = Instant::now() + WAIT_LOG_AFTER;
        loop {
            match answer.recv_timeout(CANCEL_POLL) {
                Ok(result) => return result,
                Err(RecvTimeoutError::Disconnected) => return Err(AdvanceError::ShuttingDown),
                Err(RecvTimeoutError::Timeout) => {}
            }
            let stopping = || {
                (self.shared.stopping.load(Ordering::Relaxed)).then_some(Cancelled::ShuttingDown)
            };
            if let Some(why) = cancel.cancelled().or_else(stopping) {
                self.send(Command::Withdraw(id));
                // It may have been answered meanwhile: then that answer stands; and one
                // published already (waiting for the kernel to forget the old epoch) did
                // what was asked.
                if let Ok(result) = answer.try_recv() {
                    return result;
                }
                if self.epoch() >= target {
                    return Ok(());
                }
                tracing::info!(target_epoch = target, reason = ?why, "a waiting advance was given up by its caller");
                return Err(match why {
                    Cancelled::Interrupted => AdvanceError::Interrupted { target },
                    Cancelled::ShuttingDown => AdvanceError::ShuttingDown,
                });
            }
            if Instant::now() >= log_at {
                log_at += WAIT_LOG_EVERY;
                self.log_wait();
            }
        }
    }

    /// Says in the log what advances wait for (see [`Coordinator::waiting`]).
    fn log_wait(&self) {
        if let Some(w) = self.waiting() {
            tracing::info!(
                target_epoch = w.target_epoch,
                waiting_for = w.waiting_for,
                peers = ?w.peers,
                requests = w.requests,
                seconds = w.seconds.round(),
                "an advance is waiting"
            );
        }
    }

    /// What advances wait for, if any does: the status's `advance_waiting`.
    pub(crate) fn waiting(&self) -> Option<AdvanceWait> {
        let (target, since, requests) = {
            let waits = self.shared.waits.locked();
            let &(target, since) = waits.values().min_by_key(|(_, since)| *since)?;
            (target, since, waits.len())
        };
        let waiting_for = match self.state(target) {
            Some(EpochState::Exchanged(_) | EpochState::Preparing(_)) => "source",
            Some(EpochState::Published | EpochState::Invalidated) => "invalidation",
            _ => "exchange",
        };
        let peers = match waiting_for {
            "exchange" => Some(self.effects.awaited_peers(target))
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| {
                    // Not known to the exchange yet (it has not started): every peer it
                    // will move samples with.
                    let peers = self.shared.exchange_peers.lock();
                    peers.unwrap_or_else(|e| e.into_inner()).clone()
                }),
            _ => Vec::new(),
        };
        Some(AdvanceWait {
            target_epoch: target,
            waiting_for,
            peers,
            requests,
            seconds: since.elapsed().as_secs_f64(),
        })
    }

    /// The exchange named the arrivals of the step into `step.next.epoch`.
    pub(crate) fn named(&self, step: Arc<Step>) {
        self.send(Command::Named(step));
    }

    /// The exchange into `target` started.
    pub(crate) fn exchange_started(&self, target: u64) {
        self.send(Command::ExchangeStarted(target));
    }

    /// The exchange into `target` ended.
    pub(crate) fn exchange_ended(&self, target: u64, outcome: ExchangeOutcome) {
        self.send(Command::ExchangeEnded(target, outcome));
    }

    /// The kernel forgot epoch `old`'s names.
    pub fn invalidated(&self, old: u64) {
        self.send(Command::Invalidated(old));
    }

    /// Fails every advance waiting, and any asked later, with `ShuttingDown`, while the
    /// worker goes on (the exchange in flight still ends and is reported): the mount was
    /// detached on a signal and its readers must not wait for an epoch this rank will not
    /// publish.
    pub fn give_up_waits(&self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
    }

    /// Stops the worker; advances waiting or asked later fail with `ShuttingDown`.
    pub fn shutdown(&self) {
        self.send(Command::Shutdown);
    }

    fn send(&self, cmd: Command) {
        let _ = self.tx.send(cmd);
    }
}

/// A caller waiting on an advance, listed in `Shared::waits` while it waits.
struct WaitEntry<'a> {
    shared: &'a Shared,
    id: u64,
}

impl<'a> WaitEntry<'a> {
    fn new(shared: &'a Shared, id: u64, target: u64) -> WaitEntry<'a> {
        shared.waits.locked().insert(id, (target, Instant::now()));
        WaitEntry { shared, id }
    }
}

impl Drop for WaitEntry<'_> {
    fn drop(&mut self) {
        self.shared.waits.locked().remove(&self.id);
    }
}

/// [`Effects`] of a rank with no exchange and nothing to save: every advance publishes at
/// once. For tests of the view logic and for tools that only read.
pub struct NoExchange;

impl Effects for NoExchange {
    fn start_exchange(&self, _: Next, _: Vec<SampleId>) -> bool {
        false
    }
    fn prepare(&self, _: &Step, _: &ExchangeOutcome) -> Result<(), EffectError> {
        Ok(())
    }
    fn persist(&self, _: &EpochShares) -> Result<(), EffectError> {
        Ok(())
    }
    fn published(&self, _: &EpochChange) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PlanParams;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Effects whose exchanges report back only when the test says so, and whose prepare
    /// fails while `fail` is set.
    #[derive(Default)]
    struct Manual {
        fail: AtomicBool,
        started: Mutex<Vec<u64>>,
    }

    impl Effects for Manual {
        fn start_exchange(&self, next: Next, _: Vec<SampleId>) -> bool {
            self.started.lock().unwrap().push(next.target());
            true
        }
        fn prepare(&self, _: &Step, _: &ExchangeOutcome) -> Result<(), EffectError> {
            match self.fail.load(Ordering::SeqCst) {
                true => Err(std::io::Error::other("disk on fire").into()),
                false => Ok(()),
            }
        }
        fn persist(&self, _: &EpochShares) -> Result<(), EffectError> {
            Ok(())
        }
        fn published(&self, _: &EpochChange) -> bool {
            false
        }
    }

    fn start(effects: Arc<Manual>) -> Coordinator {
        let plan = Plan::new(PlanParams {
            samples: 40,
            world: 2,
            fraction: 0.5,
            seed: 9,
        })
        .unwrap();
        let initial = plan.initial();
        Coordinator::start(plan, 0, initial, None, effects)
    }

    #[test]
    fn an_advance_waits_for_the_exchange_and_walks_the_states() {
        let effects = Arc::new(Manual::default());
        let c = start(effects.clone());
        let advancing = {
            let c = c.clone();
            thread::spawn(move || c.advance_to(1))
        };
        thread::sleep(Duration::from_millis(50));
        assert_eq!(c.epoch(), 0, "published before its exchange ended");
        c.exchange_started(1);
        c.exchange_ended(1, ExchangeOutcome::Done);
        advancing.join().unwrap().unwrap();
        assert_eq!(c.epoch(), 1);
        assert_eq!(c.state(1), Some(EpochState::Published));
        assert_eq!(c.state(0), Some(EpochState::Invalidated));
        assert_eq!(c.state(2), Some(EpochState::Announced));
        assert_eq!(*effects.started.lock().unwrap(), vec![1, 2]);
        c.advance_to(1).unwrap(); // the current epoch again: a no-op
        c.shutdown();
    }

    /// The next epoch is ready once its exchange ended well, and stays so while an
    /// advance prepares it, even one that fails.
    #[test]
    fn the_next_epoch_is_ready_once_its_exchange_is_done() {
        let effects = Arc::new(Manual::default());
        let c = start(effects.clone());
        c.exchange_started(1);
        assert!(!c.is_ready(1), "running");
        c.exchange_ended(1, ExchangeOutcome::Done);
        effects.fail.store(true, Ordering::SeqCst);
        assert!(matches!(c.advance_to(1), Err(AdvanceError::Prepare { .. })));
        assert!(
            c.is_ready(1),
            "a failed prepare keeps the exchange's outcome"
        );
        effects.fail.store(false, Ordering::SeqCst);
        c.advance_to(1).unwrap();
        assert!(!c.is_ready(2), "the exchange into 2 only just started");
        c.exchange_ended(2, ExchangeOutcome::Failed("peer left".into()));
        assert!(!c.is_ready(2), "a failed exchange leaves samples to fetch");
        c.shutdown();
    }

    #[test]
    fn refused_and_failed_advances_keep_the_current_epoch() {
        let effects = Arc::new(Manual::default());
        let c = start(effects.clone());
        assert!(matches!(c.advance_to(2), Err(AdvanceError::NotNext { .. })));
        c.exchange_ended(1, ExchangeOutcome::Failed("peer left".into()));
        effects.fail.store(true, Ordering::SeqCst);
        assert!(matches!(c.advance_to(1), Err(AdvanceError::Prepare { .. })));
        assert_eq!(c.epoch(), 0);
        effects.fail.store(false, Ordering::SeqCst);
        c.advance_to(1).unwrap();
        assert!(matches!(
            c.advance_to(0),
            Err(AdvanceError::Behind {
                target: 0,
                current: 1
            })
        ));
        c.shutdown();
        assert!(matches!(c.advance_to(2), Err(AdvanceError::ShuttingDown)));
    }

    /// A caller that gives up is answered at once; its advance is withdrawn, so the end
    /// of the exchange does not publish an epoch nobody asked for any more.
    #[test]
    fn a_cancelled_advance_answers_at_once_and_is_withdrawn() {
        let c = start(Arc::new(Manual::default()));
        let cancel = Cancel::never();
        let advancing = {
            let (c, cancel) = (c.clone(), cancel.clone());
            thread::spawn(move || c.advance_and_forget_until(1, &cancel))
        };
        thread::sleep(Duration::from_millis(100));
        let w = c.waiting().expect("the advance waits");
        assert_eq!(
            (w.target_epoch, w.waiting_for, w.requests),
            (1, "exchange", 1)
        );
        assert!(!w.peers.is_empty(), "the plan's exchange peers: {w:?}");
        let asked = std::time::Instant::now();
        cancel.cancel(Cancelled::Interrupted);
        assert!(matches!(
            advancing.join().unwrap(),
            Err(AdvanceError::Interrupted { target: 1 })
        ));
        assert!(asked.elapsed() < Duration::from_secs(1));
        assert_eq!(c.waiting(), None);
        c.exchange_ended(1, ExchangeOutcome::Done);
        thread::sleep(Duration::from_millis(100));
        assert_eq!(c.epoch(), 0, "published for nobody");
        assert_eq!(
            c.state(1),
            Some(EpochState::Exchanged(ExchangeOutcome::Done))
        );
        // A later caller finds it prepared; one cancelled for a shutdown is told so.
        c.advance_to_until(1, &Cancel::never()).unwrap();
        let cancel = Cancel::never();
        cancel.cancel(Cancelled::ShuttingDown);
        assert!(matches!(
            c.advance_to_until(2, &cancel),
            Err(AdvanceError::ShuttingDown)
        ));
        c.shutdown();
    }
}
