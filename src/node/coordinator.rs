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
//! ([`Coordinator::is_ready`], the status's `ready_epochs`): the exchange's tracker
//! (`exchange::ExchangeTracker`) only counts what moved.
//!
//! Readers (every lookup) see the published epoch through [`Coordinator::current`], a
//! read-mostly snapshot the worker swaps at publication. The slow parts (fetching missing
//! samples) run on a thread of their own and report back, so the worker keeps answering
//! (status, a second advance request, the invalidation of the previous epoch) meanwhile.
//! What happens around publication (eviction, the next exchange, staging, kernel
//! invalidation) is the daemon's business, behind [`Effects`].

use std::collections::BTreeMap;
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, RwLock};
use std::thread;
use std::time::Duration;

use crate::plan::{EpochShares, Plan, Rank, Step};

mod worker;

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

/// The last epoch there can be: the view's inode numbers have room for 30 bits of it (a
/// billion epochs).
pub const MAX_EPOCH: u64 = (1 << 30) - 1;

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

impl Shared {
    fn states(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, EpochState>> {
        self.states.lock().unwrap_or_else(|e| e.into_inner())
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
        self.shared.state(epoch)
    }

    /// Whether `epoch`'s exchange completed (for the epoch after the current one: the
    /// status's `ready_epochs`). The one answer to "is the next epoch ready", whatever
    /// exchange runs; the exchange's tracker only counts its progress.
    pub fn is_ready(&self, epoch: u64) -> bool {
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
        fn start_exchange(&self, step: Arc<Step>, _: Vec<u32>) -> bool {
            self.started.lock().unwrap().push(step.next.epoch);
            true
        }
        fn prepare(&self, _: &Step, _: &ExchangeOutcome) -> Result<(), String> {
            match self.fail.load(Ordering::SeqCst) {
                true => Err("disk on fire".into()),
                false => Ok(()),
            }
        }
        fn persist(&self, _: u64) -> Result<(), String> {
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
}
