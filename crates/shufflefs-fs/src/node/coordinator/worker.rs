//! The coordinator's worker: the one thread that changes epoch states (see the parent
//! module's docs).

use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::thread;
use std::time::{Duration, Instant};

use super::{
    AdvanceError, Command, EffectError, Effects, EpochChange, EpochState, ExchangeOutcome,
    INVALIDATION_WAIT, MAX_EPOCH, Next, Shared,
};
use crate::plan::{SampleId, Step};
use crate::sys::sync::Locked;
use crate::sys::sync::RwLocked;

type Reply = Sender<Result<(), AdvanceError>>;

pub(super) struct Worker {
    pub(super) shared: Arc<Shared>,
    pub(super) effects: Arc<dyn Effects>,
    /// For the prepare thread to report back.
    pub(super) tx: Sender<Command>,
    /// The plan's step out of the current epoch.
    pub(super) next: Next,
    /// Advances into `next` waiting for it to be prepared: (id, reply, after_invalidation).
    pub(super) waiting: Vec<(u64, Reply, bool)>,
    /// Advances published, waiting for the kernel to forget `epoch` (or the deadline).
    pub(super) after_invalidation: Vec<(Reply, u64, Instant)>,
}

impl Worker {
    pub(super) fn run(&mut self, rx: &Receiver<Command>) {
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
                    id,
                    target,
                    after_invalidation,
                    reply,
                } => self.advance(id, target, after_invalidation, reply),
                Command::Withdraw(id) => self.waiting.retain(|(i, ..)| *i != id),
                Command::Named(step) => {
                    if matches!(&self.next, Next::Unnamed(u) if u.target() == step.next.epoch) {
                        self.next = Next::Named(step);
                    }
                }
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
        for (_, reply, _) in self.waiting.drain(..) {
            let _ = reply.send(Err(AdvanceError::ShuttingDown));
        }
        for (reply, ..) in self.after_invalidation.drain(..) {
            let _ = reply.send(Ok(()));
        }
    }

    fn current(&self) -> u64 {
        self.shared.current.read_locked().epoch
    }

    fn state(&self, epoch: u64) -> Option<EpochState> {
        self.shared.state(epoch)
    }

    fn set(&self, epoch: u64, state: EpochState) {
        self.shared.states().insert(epoch, state);
    }

    fn set_if(&self, epoch: u64, state: EpochState, from: impl Fn(&EpochState) -> bool) {
        if let Some(s) = self.shared.states().get_mut(&epoch).filter(|s| from(s)) {
            *s = state;
        }
    }

    fn forget_old_states(&self, old: u64) {
        self.shared.states().retain(|&e, _| e >= old);
    }

    fn advance(&mut self, id: u64, target: u64, after_invalidation: bool, reply: Reply) {
        let current = self.current();
        let refused = if target == current {
            let _ = reply.send(Ok(()));
            return;
        } else if target < current {
            AdvanceError::Behind { target, current }
        } else if target != current + 1 || target > MAX_EPOCH {
            AdvanceError::NotNext { target, current }
        } else {
            self.waiting.push((id, reply, after_invalidation));
            self.prepare_if_asked();
            return;
        };
        let _ = reply.send(Err(refused));
    }

    /// Starts preparing the next epoch if an advance waits for it and its exchange ended.
    fn prepare_if_asked(&mut self) {
        let target = self.next.target();
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
        self.set(target, EpochState::Preparing(outcome.clone()));
        let (effects, next, tx) = (self.effects.clone(), self.next.clone(), self.tx.clone());
        let plan = self.shared.plan.clone();
        let spawned = thread::Builder::new()
            .name("prepare-epoch".into())
            .spawn(move || {
                // Named by the exchange, or (none ran, or it failed first) walked here.
                let step = next.walked(&plan);
                let result = effects.prepare(&step, &outcome).map(|()| step);
                let _ = tx.send(Command::Prepared(target, result));
            });
        if let Err(e) = spawned {
            let _ = self.tx.send(Command::Prepared(target, Err(e.into())));
        }
    }

    fn prepared(&mut self, target: u64, result: Result<Arc<Step>, EffectError>) {
        let persisted = result
            .map_err(|e| AdvanceError::Prepare {
                target,
                reason: e.to_string(),
            })
            .and_then(|step| {
                self.next = Next::Named(step.clone());
                self.effects
                    .persist(&step.next)
                    .map(|()| step)
                    .map_err(|e| AdvanceError::Persist {
                        target,
                        reason: e.to_string(),
                    })
            });
        let step = match persisted {
            Ok(step) => step,
            Err(e) => {
                tracing::warn!(error = %e, "advance failed; the current epoch stays");
                // A later advance prepares again (what was fetched meanwhile stays cached); a
                // failed exchange was reported when this attempt began, so it is not again.
                let exchange = match self.state(target) {
                    Some(EpochState::Preparing(ExchangeOutcome::Done)) => ExchangeOutcome::Done,
                    _ => ExchangeOutcome::Skipped,
                };
                self.set(target, EpochState::Exchanged(exchange));
                for (_, reply, _) in self.waiting.drain(..) {
                    let _ = reply.send(Err(e.clone()));
                }
                return;
            }
        };
        self.publish(&step);
    }

    /// Makes `step.next` the current epoch and starts the exchange out of it.
    fn publish(&mut self, step: &Step) {
        let rank = self.shared.rank;
        let current = Arc::new(step.next.clone());
        let previous = std::mem::replace(&mut *self.shared.current.write_locked(), current.clone());
        let target = current.epoch;
        self.set(target, EpochState::Published);
        self.set(previous.epoch, EpochState::Invalidated);
        tracing::info!(
            epoch = target,
            samples = current.share(rank).len(),
            "epoch published"
        );
        self.next = Next::of(&self.shared.plan, rank, &current);
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
        };
        let reports_invalidation = self.effects.published(&change);
        self.start_next_exchange(evict);
        let deadline = Instant::now() + INVALIDATION_WAIT;
        for (_, reply, after_invalidation) in self.waiting.drain(..) {
            if after_invalidation && reports_invalidation {
                self.after_invalidation
                    .push((reply, previous.epoch, deadline));
            } else {
                let _ = reply.send(Ok(()));
            }
        }
    }

    pub(super) fn start_next_exchange(&mut self, evict: Vec<SampleId>) {
        let target = self.next.target();
        let peers = self.next.peers(self.shared.rank);
        *self.shared.exchange_peers.locked() = peers;
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
