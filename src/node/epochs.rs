//! Which epoch is current, and the one way to move to the next.
//!
//! Advancing is serialized: it derives the next ownership from the plan, lets the
//! `prepare` hook make this rank hold its new share (the exchange, when there is one),
//! writes the new epoch to the cache's state file (atomically: a crash leaves the old or
//! the new epoch), and only then publishes it. Listeners (eviction, staging, the kernel
//! cache invalidation) hear about it after publication.

use std::sync::{Arc, Mutex, RwLock};

use crate::plan::{EpochShares, Plan, Rank, SampleId, Step};
use crate::vfs::error::FsError;
use crate::vfs::inodes::MAX_EPOCH;

/// What changed when an epoch was published.
pub struct EpochChange {
    pub previous: Arc<EpochShares>,
    pub current: Arc<EpochShares>,
}

type Listener = Box<dyn Fn(&EpochChange) + Send + Sync>;
type Hook = Box<dyn Fn(&Step) -> Result<(), String> + Send + Sync>;

pub struct Epochs {
    plan: Plan,
    rank: Rank,
    current: RwLock<Arc<EpochShares>>,
    /// The step out of the current epoch, computed once and shared with the exchange.
    next: Mutex<Option<Arc<Step>>>,
    advancing: Mutex<()>,
    prepare: Hook,
    persist: Hook,
    listeners: Mutex<Vec<Listener>>,
}

impl Epochs {
    /// Starts at `epoch` (0 for a fresh cache, the saved one on resume).
    pub fn new(plan: Plan, rank: Rank, epoch: u64, prepare: Hook, persist: Hook) -> Epochs {
        let current = plan.shares_at(epoch);
        Epochs::starting_at(plan, rank, current, None, prepare, persist)
    }

    /// Starts at `current`, with the plan's step out of it if the caller already has it
    /// (the daemon does: resuming walked the plan there).
    pub fn starting_at(
        plan: Plan,
        rank: Rank,
        current: EpochShares,
        next: Option<Step>,
        prepare: Hook,
        persist: Hook,
    ) -> Epochs {
        let next = next.filter(|s| s.next.epoch == current.epoch + 1);
        Epochs {
            plan,
            rank,
            current: RwLock::new(Arc::new(current)),
            next: Mutex::new(next.map(Arc::new)),
            advancing: Mutex::new(()),
            prepare,
            persist,
            listeners: Mutex::default(),
        }
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn rank(&self) -> Rank {
        self.rank
    }

    pub fn current(&self) -> Arc<EpochShares> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn epoch(&self) -> u64 {
        self.current().epoch
    }

    /// The plan's step from the current epoch to the next (cached).
    pub fn next_step(&self) -> Arc<Step> {
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let cur = self.current();
        match &*next {
            Some(step) if step.next.epoch == cur.epoch + 1 => step.clone(),
            _ => {
                let step = Arc::new(self.plan.step(&cur));
                *next = Some(step.clone());
                step
            }
        }
    }

    pub fn subscribe(&self, listener: Listener) {
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(listener);
    }

    /// Makes `target` the current epoch. `target == current` is a no-op; anything other than
    /// `current + 1` is refused, and the current view keeps working.
    pub fn advance_to(&self, target: u64) -> Result<(), FsError> {
        let _serial = self.advancing.lock().unwrap_or_else(|e| e.into_inner());
        let previous = self.current();
        let cur = previous.epoch;
        if target == cur {
            return Ok(());
        }
        if target < cur {
            return Err(FsError::Invalid(format!(
                "epoch {target} is behind the current epoch {cur}"
            )));
        }
        if target != cur + 1 || target > MAX_EPOCH {
            return Err(FsError::Invalid(format!(
                "epochs advance one at a time: current is {cur}, asked for {target}"
            )));
        }
        let step = self.next_step();
        (self.prepare)(&step).map_err(|e| {
            FsError::Io(std::io::Error::other(format!(
                "preparing epoch {target}: {e}"
            )))
        })?;
        (self.persist)(&step).map_err(|e| {
            FsError::Io(std::io::Error::other(format!("saving epoch {target}: {e}")))
        })?;
        let current = Arc::new(step.next.clone());
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = current.clone();
        tracing::info!(
            epoch = target,
            samples = current.share(self.rank).len(),
            "epoch published"
        );
        let change = EpochChange { previous, current };
        for listener in self
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            listener(&change);
        }
        Ok(())
    }
}

/// Samples of `share` whose ids fall in `range`, using that both are sorted.
pub fn share_in_range(share: &[SampleId], range: std::ops::Range<SampleId>) -> &[SampleId] {
    let lo = share.partition_point(|&s| s < range.start);
    let hi = share.partition_point(|&s| s < range.end);
    &share[lo..hi]
}
