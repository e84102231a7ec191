//! Background staging: copy this rank's share from the source into the cache.
//!
//! One coordinator thread owns the work and is fed epochs through a channel; a new epoch
//! arriving mid-way abandons the old list (its samples may no longer be ours) and starts on
//! the new one. Copies run on a few threads because parallel filesystems reward concurrency.
//! A sample a reader opens before staging reaches it is fetched by that reader
//! (`SampleStore::ensure` makes sure it is copied once).
//!
//! A source that fails as a network filesystem does when its server goes away (EIO,
//! ENOTCONN, a timeout...) is retried: the share is staged again after a pause that doubles
//! from 1 s to 30 s, until a round ends without such a failure or a new epoch arrives. A
//! sample that is missing or changed at the source is that sample's problem, not retried.
//!
//! A store that refuses every request alike or does not answer at all (a connection refused,
//! a bucket's expired or rotated credentials: `ConnectionRefused`, see `dataset::s3::error`)
//! would answer every sample the same: once a round meets that answer it asks for no more
//! samples, logs one warning with the answer and the count of samples left, and the next
//! rounds probe the store with one request each (logged at debug) until it answers again.
//! Before the fix every round asked for every remaining sample and logged each failure (a
//! 1M share: ~1M failing requests and log lines a round).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError, channel};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use serde::Serialize;

use crate::cache::SampleStore;
use crate::plan::{EpochShares, Rank, SampleId};
use crate::sys::sync::Locked;

#[derive(Default)]
pub struct StagingProgress {
    pub epoch: AtomicU64,
    pub files_total: AtomicU64,
    pub files_done: AtomicU64,
    pub bytes_total: AtomicU64,
    pub bytes_done: AtomicU64,
    pub errors: AtomicU64,
    pub busy: AtomicBool,
    /// Set once the first share has been looked at; before that nothing is known.
    pub started: AtomicBool,
    pub last_error: Mutex<Option<String>>,
}

#[derive(Serialize)]
pub(crate) struct StagingSnapshot {
    pub state: &'static str,
    pub epoch: u64,
    pub files_done: u64,
    pub files_total: u64,
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub errors: u64,
    pub last_error: Option<String>,
}

impl StagingProgress {
    pub(crate) fn snapshot(&self) -> StagingSnapshot {
        let files_done = self.files_done.load(Ordering::Relaxed);
        let files_total = self.files_total.load(Ordering::Relaxed);
        StagingSnapshot {
            state: if !self.started.load(Ordering::Relaxed) {
                "starting"
            } else if self.busy.load(Ordering::Relaxed) {
                "staging"
            } else if files_done == files_total {
                "done"
            } else {
                "incomplete"
            },
            epoch: self.epoch.load(Ordering::Relaxed),
            files_done,
            files_total,
            bytes_done: self.bytes_done.load(Ordering::Relaxed),
            bytes_total: self.bytes_total.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            last_error: self.last_error.locked().clone(),
        }
    }
}

pub(crate) enum StagingCmd {
    /// Stage `current`'s share (dropping samples that left is the exchange thread's job,
    /// ordered before the next exchange can bring any of them back).
    Epoch { current: Arc<EpochShares> },
}

pub struct Staging {
    tx: Sender<StagingCmd>,
    pub progress: Arc<StagingProgress>,
}

impl Staging {
    pub(crate) fn start(store: Arc<SampleStore>, rank: Rank, threads: usize) -> Staging {
        let (tx, rx) = channel();
        let progress = Arc::new(StagingProgress::default());
        let p = progress.clone();
        thread::Builder::new()
            .name("staging".into())
            .spawn(move || run(&store, rank, threads.max(1), &rx, &p))
            .expect("spawn staging thread");
        Staging { tx, progress }
    }

    pub(crate) fn send(&self, cmd: StagingCmd) {
        let _ = self.tx.send(cmd);
    }
}

fn run(
    store: &SampleStore,
    rank: Rank,
    threads: usize,
    rx: &Receiver<StagingCmd>,
    progress: &StagingProgress,
) {
    let mut pending = rx.recv().ok();
    let mut scrubbed = false;
    let mut backoff = RETRY_FIRST;
    // The last round met a store-wide answer: the next one probes first.
    let mut probing = false;
    while let Some(StagingCmd::Epoch { current }) = pending.take() {
        let mine = current.share(rank);
        progress.epoch.store(current.epoch, Ordering::Relaxed);
        progress
            .files_total
            .store(mine.len() as u64, Ordering::Relaxed);
        // Sizes not known yet (never read) count once staging learns them.
        progress.bytes_total.store(
            mine.iter().filter_map(|&i| store.size(i)).sum(),
            Ordering::Relaxed,
        );
        // With each sample, whether its size is in `bytes_total` already: one a reader
        // fetches meanwhile must still be added when staging gets to it.
        let missing: Vec<Missing> = mine
            .iter()
            .filter(|&&i| !store.contains(i))
            // A partial cache stages only what it keeps this epoch (so its reads hit once
            // staging got to them: the plan's hit rate is a floor); the rest is read from
            // the source.
            .filter(|&&i| store.partial().is_none_or(|p| p.wanted(i)))
            .map(|&i| Missing::new(i, store.size(i).is_some()))
            .collect();
        let present = (mine.len() - missing.len()) as u64;
        progress.files_done.store(present, Ordering::Relaxed);
        let present_bytes = mine
            .iter()
            .filter(|&&i| store.contains(i))
            .filter_map(|&i| store.size(i))
            .sum();
        progress.bytes_done.store(present_bytes, Ordering::Relaxed);
        progress.busy.store(!missing.is_empty(), Ordering::Relaxed);
        progress.started.store(true, Ordering::Relaxed);
        let started = std::time::Instant::now();
        store.will_stage(&missing.iter().map(|m| m.id()).collect::<Vec<_>>());
        let round;
        (pending, round) = stage_probing(store, &missing, threads, rx, progress, probing);
        progress.busy.store(false, Ordering::Relaxed);
        if pending.is_none() && round.unreachable > 0 {
            let left = missing.iter().filter(|m| !store.contains(m.id())).count();
            let logged = probing && round.refused.is_some();
            probing = round.refused.is_some();
            pending = retry_after(rx, &mut backoff, (&round, left, logged), current);
            continue;
        }
        if probing && pending.is_none() {
            tracing::info!(epoch = current.epoch, "staging: the source answers again");
        }
        probing = false;
        backoff = RETRY_FIRST;
        if pending.is_none() && !missing.is_empty() {
            tracing::info!(
                epoch = current.epoch,
                files = missing.len(),
                secs = started.elapsed().as_secs_f64(),
                "staging finished"
            );
        }
        if pending.is_none() && !scrubbed {
            scrubbed = true;
            pending = scrub(store, rx);
        }
        if pending.is_none() {
            pending = rx.recv().ok();
        }
    }
}

/// A sample to stage, and whether its size is in `bytes_total` already (a reader may fetch
/// it meanwhile: its size must still be added when staging gets to it). In one word, the
/// flag in the top bit (ids stay below 2^61, the views' inode room), as the list holds
/// every sample of a first fill: 8 bytes a share sample rather than 16.
#[derive(Clone, Copy, Debug)]
struct Missing(u64);

impl Missing {
    const COUNTED: u64 = 1 << 63;

    fn new(id: SampleId, counted: bool) -> Missing {
        debug_assert!(id < Missing::COUNTED, "sample id {id} past 2^63");
        Missing(id | if counted { Missing::COUNTED } else { 0 })
    }

    fn id(self) -> SampleId {
        self.0 & !Missing::COUNTED
    }

    fn counted(self) -> bool {
        self.0 & Missing::COUNTED != 0
    }
}

const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// After a `round` in which samples failed as an unreachable source does (`left` samples
/// not staged; `logged`: a store-wide answer was logged already, this round only probed):
/// waits `backoff` (doubled for next time) for a newer epoch, else stages `current` again.
fn retry_after(
    rx: &Receiver<StagingCmd>,
    backoff: &mut Duration,
    (round, left, logged): (&Round, usize, bool),
    current: Arc<EpochShares>,
) -> Option<StagingCmd> {
    let retry_in_secs = backoff.as_secs_f64();
    match &round.refused {
        None => tracing::warn!(
            epoch = current.epoch,
            samples = round.unreachable,
            retry_in_secs,
            "staging: the source did not answer; retrying"
        ),
        Some(error) if !logged => tracing::warn!(
            epoch = current.epoch,
            samples_left = left,
            %error,
            retry_in_secs,
            "staging: the source did not answer or refused every request alike; retrying with one request per round until it answers"
        ),
        Some(error) => {
            tracing::debug!(epoch = current.epoch, samples_left = left, %error, retry_in_secs, "staging: the source still refuses")
        }
    }
    let wait = *backoff;
    *backoff = (*backoff * 2).min(RETRY_MAX);
    match rx.recv_timeout(wait) {
        Ok(cmd) => Some(cmd),
        Err(RecvTimeoutError::Timeout) => Some(StagingCmd::Epoch { current }),
        Err(RecvTimeoutError::Disconnected) => None,
    }
}

/// Whether `e` is how a source behind a network (sshfs, NFS, a parallel filesystem) fails
/// while its server is away, rather than a problem of one sample. An object store's
/// failures carry no errno, only their kind (`dataset::s3`).
fn source_unreachable(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    if matches!(e.kind(), K::ConnectionRefused | K::TimedOut) {
        return true;
    }
    matches!(
        crate::cache::source_errno(e),
        Some(
            libc::EIO
                | libc::ENOTCONN
                | libc::ETIMEDOUT
                | libc::ECONNRESET
                | libc::ECONNABORTED
                | libc::ECONNREFUSED
                | libc::EHOSTUNREACH
                | libc::ENETUNREACH
                | libc::ESTALE
        )
    )
}

/// Checks the whole cache once, after the first share is staged (`SampleStore::scrub`):
/// copies that rotted while no daemon ran are dropped (and fetched again when needed) before
/// a reader asks for them. Returns early with the next command if one arrives; the scrub is
/// then not resumed, as every read still checks a copy not checked since it changed.
fn scrub(store: &SampleStore, rx: &Receiver<StagingCmd>) -> Option<StagingCmd> {
    let next = std::cell::Cell::new(None);
    let started = std::time::Instant::now();
    let failed = store.scrub(&|| match rx.try_recv() {
        Ok(cmd) => {
            next.set(Some(cmd));
            false
        }
        Err(TryRecvError::Empty) => true,
        Err(TryRecvError::Disconnected) => false,
    });
    let next = next.into_inner();
    tracing::info!(
        failed,
        complete = next.is_none(),
        secs = started.elapsed().as_secs_f64(),
        "cache scrub finished"
    );
    next
}

/// Whether `e` is an answer every request to the source would get (the store away or
/// refusing this job's credentials: `dataset::s3::error` gives both this kind, as does a
/// refused connection), so asking for another sample only repeats it.
fn store_wide(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::ConnectionRefused
}

/// How a round of staging ended.
#[derive(Debug, Default)]
struct Round {
    /// Samples that failed as an unreachable source does.
    unreachable: u64,
    /// The first store-wide answer ([`store_wide`]) of the round, after which it asked for
    /// no more samples.
    refused: Option<String>,
}

/// [`stage`]; with `probing` (the last round met a store-wide answer), one sample first,
/// and the rest only if the source answered it.
fn stage_probing(
    store: &SampleStore,
    missing: &[Missing],
    threads: usize,
    rx: &Receiver<StagingCmd>,
    progress: &StagingProgress,
    probing: bool,
) -> (Option<StagingCmd>, Round) {
    if !probing || missing.is_empty() {
        return stage(store, missing, threads, rx, progress);
    }
    let (next, round) = stage(store, &missing[..1], 1, rx, progress);
    if next.is_some() || round.unreachable > 0 {
        return (next, round);
    }
    stage(store, &missing[1..], threads, rx, progress)
}

/// Copies `missing` into the cache; returns early with the next command if one arrives, and
/// stops asking for samples after a store-wide answer. Also returns how the round ended.
fn stage(
    store: &SampleStore,
    missing: &[Missing],
    threads: usize,
    rx: &Receiver<StagingCmd>,
    progress: &StagingProgress,
) -> (Option<StagingCmd>, Round) {
    let unreachable = AtomicU64::new(0);
    let refused = std::sync::OnceLock::new();
    let shared = (&unreachable, &refused);
    let next = stage_counting(store, missing, threads, rx, progress, shared);
    let round = Round {
        unreachable: unreachable.into_inner(),
        refused: refused.into_inner(),
    };
    (next, round)
}

/// Counts a failed copy of sample `id` (`unreachable`, `refused`: see [`Round`]); a
/// store-wide answer is logged once per round, by the caller.
fn staging_failed(
    id: SampleId,
    e: &std::io::Error,
    progress: &StagingProgress,
    (unreachable, refused): (&AtomicU64, &std::sync::OnceLock<String>),
) {
    if source_unreachable(e) {
        unreachable.fetch_add(1, Ordering::Relaxed);
    }
    if store_wide(e) {
        let _ = refused.set(e.to_string());
    } else {
        // A bad sample is reported, not fatal: readers get EIO for it alone.
        tracing::warn!(sample = id, error = %e, "staging failed for a sample");
    }
    progress.errors.fetch_add(1, Ordering::Relaxed);
    *progress.last_error.locked() = Some(e.to_string());
}

fn stage_counting(
    store: &SampleStore,
    missing: &[Missing],
    threads: usize,
    rx: &Receiver<StagingCmd>,
    progress: &StagingProgress,
    shared: (&AtomicU64, &std::sync::OnceLock<String>),
) -> Option<StagingCmd> {
    let next_index = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let running = AtomicU64::new(threads as u64);
    thread::scope(|scope| {
        for _ in 0..threads {
            let (next_index, stop, running) = (&next_index, &stop, &running);
            scope.spawn(move || {
                while !stop.load(Ordering::Relaxed) && shared.1.get().is_none() {
                    let i = next_index.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some((id, counted)) = missing.get(i).map(|m| (m.id(), m.counted())) else {
                        break;
                    };
                    match store.ensure(id) {
                        Ok(()) => {
                            let size = store.size(id).unwrap_or(0);
                            progress.files_done.fetch_add(1, Ordering::Relaxed);
                            progress.bytes_done.fetch_add(size, Ordering::Relaxed);
                            if !counted {
                                progress.bytes_total.fetch_add(size, Ordering::Relaxed);
                            }
                        }
                        // The partial cache is full: not a failure.
                        Err(e) if crate::cache::admission::is_not_kept(&e) => {}
                        Err(e) => staging_failed(id, &e, progress, shared),
                    }
                }
                running.fetch_sub(1, Ordering::Release);
            });
        }
        // This thread owns the channel: it watches for a newer epoch while the copies run.
        while running.load(Ordering::Acquire) > 0 {
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(cmd) => {
                    stop.store(true, Ordering::Relaxed);
                    return Some(cmd);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    stop.store(true, Ordering::Relaxed);
                    return None;
                }
            }
        }
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::CacheDir;
    use crate::dataset::ImageFolder;

    /// A sample whose size was unknown when the totals were taken, and which a reader
    /// fetched before staging got to it, still counts once in each total.
    #[test]
    fn a_sample_fetched_by_a_reader_first_counts_once_in_both_totals() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        std::fs::create_dir_all(src.join("c")).unwrap();
        for (i, len) in [300usize, 700].into_iter().enumerate() {
            std::fs::write(src.join(format!("c/{i}")), vec![7u8; len]).unwrap();
        }
        let manifest = Arc::new(crate::dataset::scan::scan(&src).unwrap());
        let source = Arc::new(ImageFolder::new(src, manifest.clone()));
        let dir = CacheDir::open(&tmp.path().join("cache")).unwrap();
        let store = SampleStore::new(dir, manifest, source).unwrap();
        // What `run` saw: both missing, neither size known (so `bytes_total` is 0).
        let missing = [Missing::new(0, false), Missing::new(1, false)];
        store.ensure(1).unwrap(); // a reader was quicker
        let progress = StagingProgress::default();
        let (_tx, rx) = channel();
        assert!(stage(&store, &missing, 2, &rx, &progress).0.is_none());
        let s = progress.snapshot();
        assert_eq!((s.bytes_done, s.bytes_total), (1000, 1000));
    }

    /// An ImageFolder whose server is away (EIO) for the first `away` copies.
    struct AwayFor {
        inner: ImageFolder,
        away: AtomicU64,
    }

    impl crate::dataset::Dataset for AwayFor {
        fn copy_to(
            &self,
            id: SampleId,
            out: &mut dyn std::io::Write,
        ) -> std::io::Result<crate::dataset::Copied> {
            let left = self.away.load(Ordering::Relaxed);
            if left > 0 {
                self.away.store(left - 1, Ordering::Relaxed);
                return Err(std::io::Error::from_raw_os_error(libc::EIO));
            }
            self.inner.copy_to(id, out)
        }
        fn read_at(&self, id: SampleId, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
            self.inner.read_at(id, offset, buf)
        }
        fn describe(&self, id: SampleId) -> String {
            self.inner.describe(id)
        }
    }

    /// A source whose store refuses every request (rotated credentials), counting them.
    struct Refusing {
        inner: ImageFolder,
        refusing: AtomicBool,
        asked: AtomicU64,
    }

    impl crate::dataset::Dataset for Refusing {
        fn copy_to(
            &self,
            id: SampleId,
            out: &mut dyn std::io::Write,
        ) -> std::io::Result<crate::dataset::Copied> {
            self.asked.fetch_add(1, Ordering::Relaxed);
            if self.refusing.load(Ordering::Relaxed) {
                let refused = "HTTP 403 InvalidAccessKeyId: check AWS_ACCESS_KEY_ID";
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    refused,
                ));
            }
            self.inner.copy_to(id, out)
        }
        fn read_at(&self, id: SampleId, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
            self.inner.read_at(id, offset, buf)
        }
        fn describe(&self, id: SampleId) -> String {
            self.inner.describe(id)
        }
    }

    /// A round that meets a store-wide answer asks for no more samples (at most one per
    /// thread was in flight), and a probing round asks once; once the store answers, the
    /// probe's round stages everything. Failed before the fix: a round asked for all 200.
    #[test]
    fn a_store_refusing_everything_is_asked_once_per_thread_then_probed() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        std::fs::create_dir_all(src.join("c")).unwrap();
        for i in 0..200 {
            std::fs::write(src.join(format!("c/{i:03}")), vec![i as u8; 10]).unwrap();
        }
        let manifest = Arc::new(crate::dataset::scan::scan(&src).unwrap());
        let source = Arc::new(Refusing {
            inner: ImageFolder::new(src, manifest.clone()),
            refusing: AtomicBool::new(true),
            asked: AtomicU64::new(0),
        });
        let dir = CacheDir::open(&tmp.path().join("cache")).unwrap();
        let store = SampleStore::new(dir, manifest, source.clone()).unwrap();
        let missing: Vec<Missing> = (0..200).map(|i| Missing::new(i, true)).collect();
        let progress = StagingProgress::default();
        let (_tx, rx) = channel();
        let (next, round) = stage(&store, &missing, 4, &rx, &progress);
        assert!(next.is_none());
        let asked = source.asked.load(Ordering::Relaxed);
        assert!(
            (1..=4).contains(&asked),
            "{asked} requests in the first round"
        );
        assert_eq!(round.unreachable, asked);
        assert!(round.refused.unwrap().contains("InvalidAccessKeyId"));
        let (_, probe) = stage_probing(&store, &missing, 4, &rx, &progress, true);
        assert_eq!(source.asked.load(Ordering::Relaxed), asked + 1, "one probe");
        assert!(probe.refused.is_some());
        source.refusing.store(false, Ordering::Relaxed);
        let (_, round) = stage_probing(&store, &missing, 4, &rx, &progress, true);
        assert_eq!((round.unreachable, round.refused), (0, None));
        assert!((0..200).all(|i| store.contains(i)));
    }

    /// A source that answers EIO (sshfs without its server) is staged again after a pause,
    /// and staging ends done once it answers; the log and `last_error` named it meanwhile.
    #[test]
    fn staging_retries_a_source_that_went_away() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        std::fs::create_dir_all(src.join("c")).unwrap();
        for i in 0..4 {
            std::fs::write(src.join(format!("c/{i}")), vec![i as u8; 100]).unwrap();
        }
        let manifest = Arc::new(crate::dataset::scan::scan(&src).unwrap());
        let source = Arc::new(AwayFor {
            inner: ImageFolder::new(src.clone(), manifest.clone()),
            away: AtomicU64::new(3),
        });
        let dir = CacheDir::open(&tmp.path().join("cache")).unwrap();
        let store = Arc::new(SampleStore::new(dir, manifest.clone(), source).unwrap());
        let plan = crate::plan::Plan::new(crate::plan::PlanParams {
            samples: manifest.len(),
            world: 1,
            fraction: 0.5,
            seed: 1,
        })
        .unwrap();
        let staging = Staging::start(store.clone(), 0, 1);
        staging.send(StagingCmd::Epoch {
            current: Arc::new(plan.initial()),
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let s = staging.progress.snapshot();
            if s.state == "done" && s.files_done == 4 {
                assert_eq!(s.errors, 3, "{:?}", s.last_error);
                assert!(s.last_error.unwrap().contains(&*src.to_string_lossy()));
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "staging never finished"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}
