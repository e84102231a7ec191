//! The one owner of the epoch lifecycle.
//!
//! Every epoch goes through the states of [`EpochState`]: the exchange into it is announced,
//! runs and ends (done or failed); an advance request makes this rank hold the whole new
//! share (`prepare`: fetch from the source whatever the exchange did not deliver), the new
//! epoch is saved (`persist`, so a crash resumes there) and published; the kernel is then told
//! to forget the old epoch's names (invalidated). One worker thread owns these states and is
//! fed [`Command`]s, foyer-style: an advance carries the channel its answer goes to, and the
//! exchange and the kernel invalidation report back through the same queue. Nothing else
//! writes the current epoch, so there is no lock order to get wrong and no state compared as
//! a string.
//!
//! Readers (every lookup) see the published epoch through [`Coordinator::current`], a
//! read-mostly snapshot the worker swaps at publication. The slow parts (fetching missing
//! samples) run on a thread of their own and report back, so the worker keeps answering
//! (status, a second advance request, the invalidation of the previous epoch) meanwhile.
//! What happens around publication (eviction, the next exchange, staging, kernel
//! invalidation) is the daemon's business, behind [`Effects`].

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use crate::plan::{EpochShares, Plan, Rank, Step};
use crate::vfs::error::FsError;
use crate::vfs::inodes::MAX_EPOCH;

/// Where an epoch is in its life, on this rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EpochState {
    /// The exchange into it will run.
    Announced,
    /// Its exchange is running.
    Exchanging,
    /// Its exchange ended; an advance fetches from the source what it did not deliver.
    Exchanged(ExchangeOutcome),
    /// An advance is making this rank hold its whole share.
    Preparing,
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

/// Why an advance was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum AdvanceError {
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
}

impl From<AdvanceError> for FsError {
    fn from(e: AdvanceError) -> FsError {
        match e {
            AdvanceError::Behind { .. } | AdvanceError::NotNext { .. } => {
                FsError::Invalid(e.to_string())
            }
            AdvanceError::Prepare { .. } | AdvanceError::Persist { .. } => {
                FsError::Io(std::io::Error::other(e.to_string()))
            }
            AdvanceError::ShuttingDown => FsError::ShuttingDown,
        }
    }
}

/// What a published epoch changed.
pub struct EpochChange {
    pub previous: Arc<EpochShares>,
    pub current: Arc<EpochShares>,
    /// The plan's step out of `current`, whose exchange starts now.
    pub next: Arc<Step>,
}

/// What the coordinator asks of the rest of the daemon.
pub trait Effects: Send + Sync + 'static {
    /// Starts the exchange of `step` (for the first epoch: `evict` is empty) after dropping
    /// `evict`; returns false if no exchange will report back (the state is then
    /// `Exchanged(Skipped)`).
    fn start_exchange(&self, step: Arc<Step>, evict: Vec<u32>) -> bool;
    /// Makes this rank hold every sample of `step.next`'s share. Runs on its own thread.
    fn prepare(&self, step: &Step, exchange: &ExchangeOutcome) -> Result<(), String>;
    /// Saves `epoch` as the one to resume at.
    fn persist(&self, epoch: u64) -> Result<(), String>;
    /// After publication (staging, kernel invalidation). Returns whether the invalidation
    /// of `change.previous` will be reported through [`Coordinator::invalidated`].
    fn published(&self, change: &EpochChange) -> bool;
}

/// How long an advance by a control-file write waits for the kernel to forget the old epoch.
const INVALIDATION_WAIT: Duration = Duration::from_secs(5);

enum Command {
    Advance {
        target: u64,
        /// Answer only once the kernel forgot the old epoch (a control-file write: the
        /// writer expects `epoch-N` gone when `write` returns; a lookup cannot wait for
        /// that, since the kernel holds the folder lock it needs).
        after_invalidation: bool,
        reply: Sender<Result<(), AdvanceError>>,
    },
    ExchangeStarted(u64),
    ExchangeEnded(u64, ExchangeOutcome),
    Prepared(u64, Result<(), String>),
    Invalidated(u64),
    Shutdown,
}

/// What readers share with the worker.
struct Shared {
    plan: Plan,
    rank: Rank,
    current: RwLock<Arc<EpochShares>>,
    states: Mutex<BTreeMap<u64, EpochState>>,
}

/// A handle on the coordinator: cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct Coordinator {
    shared: Arc<Shared>,
    tx: Sender<Command>,
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
        let next = next
            .filter(|s| s.next.epoch == current.epoch + 1)
            .unwrap_or_else(|| plan.step(&current));
        let epoch = current.epoch;
        let shared = Arc::new(Shared {
            plan,
            rank,
            current: RwLock::new(Arc::new(current)),
            states: Mutex::new(BTreeMap::from([(epoch, EpochState::Published)])),
        });
        let (tx, rx) = channel();
        let handle = Coordinator {
            shared: shared.clone(),
            tx: tx.clone(),
        };
        let mut worker = Worker {
            shared,
            effects,
            tx,
            next: Arc::new(next),
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

    pub fn rank(&self) -> Rank {
        self.shared.rank
    }

    /// The published epoch's shares.
    pub fn current(&self) -> Arc<EpochShares> {
        self.shared
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn epoch(&self) -> u64 {
        self.current().epoch
    }

    /// The state of `epoch` on this rank, if it is the current or the next one.
    pub fn state(&self, epoch: u64) -> Option<EpochState> {
        let states = self.shared.states.lock().unwrap_or_else(|e| e.into_inner());
        states.get(&epoch).cloned()
    }

    /// Whether the next epoch's exchange completed (the status's `ready_epochs`).
    pub fn next_is_ready(&self) -> bool {
        self.state(self.epoch() + 1) == Some(EpochState::Exchanged(ExchangeOutcome::Done))
    }

    /// Makes `target` the current epoch: `current` is a no-op, anything but `current + 1`
    /// is refused (the current view keeps working). Blocks until published.
    pub fn advance_to(&self, target: u64) -> Result<(), AdvanceError> {
        self.advance(target, false)
    }

    /// [`advance_to`](Self::advance_to), returning only once the kernel was told to forget
    /// the old epoch (bounded by a few seconds).
    pub fn advance_and_forget(&self, target: u64) -> Result<(), AdvanceError> {
        self.advance(target, true)
    }

    fn advance(&self, target: u64, after_invalidation: bool) -> Result<(), AdvanceError> {
        let (reply, answer) = channel();
        self.send(Command::Advance {
            target,
            after_invalidation,
            reply,
        });
        answer.recv().unwrap_or(Err(AdvanceError::ShuttingDown))
    }

    /// The exchange into `target` started.
    pub fn exchange_started(&self, target: u64) {
        self.send(Command::ExchangeStarted(target));
    }

    /// The exchange into `target` ended.
    pub fn exchange_ended(&self, target: u64, outcome: ExchangeOutcome) {
        self.send(Command::ExchangeEnded(target, outcome));
    }

    /// The kernel forgot epoch `old`'s names.
    pub fn invalidated(&self, old: u64) {
        self.send(Command::Invalidated(old));
    }

    /// Stops the worker; advances waiting or asked later fail with `ShuttingDown`.
    pub fn shutdown(&self) {
        self.send(Command::Shutdown);
    }

    fn send(&self, cmd: Command) {
        let _ = self.tx.send(cmd);
    }
}

type Reply = Sender<Result<(), AdvanceError>>;

struct Worker {
    shared: Arc<Shared>,
    effects: Arc<dyn Effects>,
    /// For the prepare thread to report back.
    tx: Sender<Command>,
    /// The plan's step out of the current epoch.
    next: Arc<Step>,
    /// Advances into `next` waiting for it to be prepared: (reply, after_invalidation).
    waiting: Vec<(Reply, bool)>,
    /// Advances published, waiting for the kernel to forget `epoch` (or the deadline).
    after_invalidation: Vec<(Reply, u64, Instant)>,
}

impl Worker {
    fn run(&mut self, rx: &Receiver<Command>) {
        loop {
            let cmd = match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(cmd) => cmd,
                Err(RecvTimeoutError::Timeout) => {
                    self.expire_invalidation_waits();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            };
            match cmd {
                Command::Advance {
                    target,
                    after_invalidation,
                    reply,
                } => self.advance(target, after_invalidation, reply),
                Command::ExchangeStarted(target) => {
                    self.set_if(target, EpochState::Exchanging, |s| {
                        *s == EpochState::Announced
                    });
                }
                Command::ExchangeEnded(target, outcome) => {
                    self.set_if(target, EpochState::Exchanged(outcome), |s| {
                        matches!(s, EpochState::Announced | EpochState::Exchanging)
                    });
                    self.prepare_if_asked();
                }
                Command::Prepared(target, result) => self.prepared(target, result),
                Command::Invalidated(old) => {
                    self.set(old, EpochState::Invalidated);
                    self.forget_old_states(old);
                    let (done, still): (Vec<_>, Vec<_>) =
                        std::mem::take(&mut self.after_invalidation)
                            .into_iter()
                            .partition(|(_, epoch, _)| *epoch <= old);
                    self.after_invalidation = still;
                    done.into_iter().for_each(|(r, ..)| drop(r.send(Ok(()))));
                }
                Command::Shutdown => break,
            }
        }
        for (reply, _) in self.waiting.drain(..) {
            let _ = reply.send(Err(AdvanceError::ShuttingDown));
        }
        for (reply, ..) in self.after_invalidation.drain(..) {
            let _ = reply.send(Ok(()));
        }
    }

    fn current(&self) -> u64 {
        self.shared
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .epoch
    }

    fn state(&self, epoch: u64) -> Option<EpochState> {
        let states = self.shared.states.lock().unwrap_or_else(|e| e.into_inner());
        states.get(&epoch).cloned()
    }

    fn set(&self, epoch: u64, state: EpochState) {
        let mut states = self.shared.states.lock().unwrap_or_else(|e| e.into_inner());
        states.insert(epoch, state);
    }

    fn set_if(&self, epoch: u64, state: EpochState, from: impl Fn(&EpochState) -> bool) {
        let mut states = self.shared.states.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = states.get_mut(&epoch).filter(|s| from(s)) {
            *s = state;
        }
    }

    fn forget_old_states(&self, old: u64) {
        let mut states = self.shared.states.lock().unwrap_or_else(|e| e.into_inner());
        states.retain(|&e, _| e >= old);
    }

    fn advance(&mut self, target: u64, after_invalidation: bool, reply: Reply) {
        let current = self.current();
        let refused = if target == current {
            let _ = reply.send(Ok(()));
            return;
        } else if target < current {
            AdvanceError::Behind { target, current }
        } else if target != current + 1 || target > MAX_EPOCH {
            AdvanceError::NotNext { target, current }
        } else {
            self.waiting.push((reply, after_invalidation));
            self.prepare_if_asked();
            return;
        };
        let _ = reply.send(Err(refused));
    }

    /// Starts preparing the next epoch if an advance waits for it and its exchange ended.
    fn prepare_if_asked(&mut self) {
        let target = self.next.next.epoch;
        let Some(EpochState::Exchanged(outcome)) = self.state(target) else {
            return;
        };
        if self.waiting.is_empty() {
            return;
        }
        if let ExchangeOutcome::Failed(error) = &outcome {
            tracing::warn!(
                target_epoch = target,
                error,
                "exchange incomplete; fetching the rest from the source"
            );
        }
        self.set(target, EpochState::Preparing);
        let (effects, step, tx) = (self.effects.clone(), self.next.clone(), self.tx.clone());
        let spawned = thread::Builder::new()
            .name("prepare-epoch".into())
            .spawn(move || {
                let result = effects.prepare(&step, &outcome);
                let _ = tx.send(Command::Prepared(target, result));
            });
        if let Err(e) = spawned {
            let _ = self.tx.send(Command::Prepared(target, Err(e.to_string())));
        }
    }

    fn prepared(&mut self, target: u64, result: Result<(), String>) {
        let persisted = result
            .map_err(|reason| AdvanceError::Prepare { target, reason })
            .and_then(|()| {
                self.effects
                    .persist(target)
                    .map_err(|reason| AdvanceError::Persist { target, reason })
            });
        if let Err(e) = persisted {
            tracing::warn!(error = %e, "advance failed; the current epoch stays");
            // A later advance prepares again (what was fetched meanwhile stays cached); the
            // exchange's own outcome was reported when this attempt began.
            self.set(target, EpochState::Exchanged(ExchangeOutcome::Skipped));
            for (reply, _) in self.waiting.drain(..) {
                let _ = reply.send(Err(AdvanceError::Prepare {
                    target,
                    reason: e.to_string(),
                }));
            }
            return;
        }
        self.publish();
    }

    fn publish(&mut self) {
        let rank = self.shared.rank;
        let current = Arc::new(self.next.next.clone());
        let previous = std::mem::replace(
            &mut *self
                .shared
                .current
                .write()
                .unwrap_or_else(|e| e.into_inner()),
            current.clone(),
        );
        let target = current.epoch;
        self.set(target, EpochState::Published);
        self.set(previous.epoch, EpochState::Invalidated);
        tracing::info!(
            epoch = target,
            samples = current.share(rank).len(),
            "epoch published"
        );
        self.next = Arc::new(self.shared.plan.step(&current));
        let mine = current.share(rank);
        let evict = previous
            .share(rank)
            .iter()
            .copied()
            .filter(|id| mine.binary_search(id).is_err())
            .collect();
        let change = EpochChange {
            previous: previous.clone(),
            current,
            next: self.next.clone(),
        };
        let reports_invalidation = self.effects.published(&change);
        self.start_next_exchange(evict);
        let deadline = Instant::now() + INVALIDATION_WAIT;
        for (reply, after_invalidation) in self.waiting.drain(..) {
            if after_invalidation && reports_invalidation {
                self.after_invalidation
                    .push((reply, previous.epoch, deadline));
            } else {
                let _ = reply.send(Ok(()));
            }
        }
    }

    fn start_next_exchange(&mut self, evict: Vec<u32>) {
        let target = self.next.next.epoch;
        self.set(target, EpochState::Announced);
        if !self.effects.start_exchange(self.next.clone(), evict) {
            self.set(target, EpochState::Exchanged(ExchangeOutcome::Skipped));
        }
    }

    fn expire_invalidation_waits(&mut self) {
        let now = Instant::now();
        let (late, still): (Vec<_>, Vec<_>) = std::mem::take(&mut self.after_invalidation)
            .into_iter()
            .partition(|(.., deadline)| *deadline <= now);
        self.after_invalidation = still;
        for (reply, ..) in late {
            let _ = reply.send(Ok(()));
        }
    }
}

/// [`Effects`] of a rank with no exchange and nothing to save: every advance publishes at
/// once. For tests of the view logic and for tools that only read.
pub struct NoExchange;

impl Effects for NoExchange {
    fn start_exchange(&self, _: Arc<Step>, _: Vec<u32>) -> bool {
        false
    }
    fn prepare(&self, _: &Step, _: &ExchangeOutcome) -> Result<(), String> {
        Ok(())
    }
    fn persist(&self, _: u64) -> Result<(), String> {
        Ok(())
    }
    fn published(&self, _: &EpochChange) -> bool {
        false
    }
}
