//! `.shufflefs/status`: one JSON document describing this rank's daemon.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde::Serialize;

use crate::cache::SampleStore;
use crate::dataset::manifest::Index;
use crate::dataset::names::Skipped;
use crate::exchange::{ExchangeReport, ExchangeTracker};
use crate::node::coordinator::{AdvanceWait, Coordinator};
use crate::node::jobview::JobBoard;
use crate::node::metrics::{self, ExchangeTotals};
use crate::node::requests::Requests;
use crate::node::resumed::RegrowReport;
use crate::node::staging::{StagingProgress, StagingSnapshot};
use crate::plan::equal::EqualShares;

pub trait StatusReport: Send + Sync {
    fn render(&self) -> Vec<u8>;
    /// `.shufflefs/metrics`: Prometheus text (see `node::metrics`); empty by default.
    fn metrics(&self) -> Vec<u8> {
        Vec::new()
    }
}

#[derive(Serialize)]
struct CacheSnapshot {
    dir: PathBuf,
    /// `files` or `packed` (see `--cache-layout`).
    layout: crate::cache::CacheLayout,
    files: u64,
    bytes: u64,
    fetched_from_source: u64,
    /// Bytes of those samples: what this rank read from the source.
    fetched_bytes_from_source: u64,
    source_errors: u64,
    checksum_failures: u64,
    problems: Vec<String>,
    /// Requests to a bucket retried by this process (`dataset::s3`; 0 for a folder).
    store_retries: u64,
}

/// What the mount serves: `imagefolder`, `tree` (its folders are the `classes`), or
/// `records` with its framing and counts.
#[derive(Serialize)]
struct DatasetSnapshot {
    format: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    framing: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    record_size: Option<u64>,
    /// `pages` or `records` (`--group`).
    #[serde(skip_serializing_if = "Option::is_none")]
    group: Option<crate::dataset::Grouping>,
    #[serde(skip_serializing_if = "Option::is_none")]
    records: Option<u64>,
    /// The units of the plan: groups of records (`samples` counts the same).
    #[serde(skip_serializing_if = "Option::is_none")]
    groups: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    files: Option<usize>,
}

impl DatasetSnapshot {
    fn of(manifest: &crate::dataset::Manifest) -> DatasetSnapshot {
        match manifest.index() {
            Index::Folders(_) | Index::Tree(_) => DatasetSnapshot {
                format: if manifest.is_tree() {
                    "tree"
                } else {
                    "imagefolder"
                },
                framing: None,
                record_size: None,
                group: None,
                records: None,
                groups: None,
                files: None,
            },
            Index::Records(r) => DatasetSnapshot {
                format: "records",
                framing: Some(r.params.framing.name()),
                record_size: (r.params.record_size > 0).then_some(r.params.record_size),
                group: Some(r.params.grouping),
                records: Some(r.records()),
                groups: Some(r.groups()),
                files: Some(r.files.len()),
            },
        }
    }
}

#[derive(Serialize)]
struct Status<'a> {
    version: &'static str,
    pid: u32,
    rank: u32,
    world_size: u32,
    epoch: u64,
    ready_epochs: Vec<u64>,
    fraction: f64,
    /// Under `--exchange coded`: the fraction of the dataset each rank caches (the scheme and
    /// the packets are in each `exchange` entry's `coded`).
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_fraction: Option<f64>,
    seed: u64,
    /// `"global"` or `"node"` (see `--exchange-scope`).
    exchange_scope: crate::plan::ExchangeScope,
    /// Host of each rank, as the ranks found them (by processor name).
    hosts: &'a [u32],
    source: &'a str,
    mountpoint: &'a str,
    dataset: DatasetSnapshot,
    classes: u32,
    samples: u64,
    share_samples: usize,
    share_bytes: u64,
    staging: StagingSnapshot,
    /// Recent exchanges, oldest first; the last one is into `epoch + 1`.
    exchange: Vec<ExchangeReport>,
    cache: CacheSnapshot,
    skipped: &'a [Skipped],
    /// Only for a job whose number of ranks changed: how this start filled the share.
    #[serde(skip_serializing_if = "Option::is_none")]
    resize: Option<&'a RegrowReport>,
    /// Only while an advance waits: for which epoch, on what, and which peers.
    #[serde(skip_serializing_if = "Option::is_none")]
    advance_waiting: Option<AdvanceWait>,
    /// Where the index came from: scanned now, or loaded from the cache (`stale_possible`).
    source_scan: &'a crate::cache::SourceScan,
    /// Only with `--equal-shares`: what the view leaves out.
    #[serde(skip_serializing_if = "Option::is_none")]
    equal_shares: Option<EqualSnapshot>,
    /// How the kernel reads samples (set before mounting; absent in tests without a mount).
    #[serde(skip_serializing_if = "Option::is_none")]
    read_path: Option<&'a ReadPathSnapshot>,
    /// Kernel requests this mount answered, by kind (`node::requests`).
    fuse_requests: std::collections::BTreeMap<&'static str, u64>,
    /// Errors it answered: operation -> errno name -> count.
    fuse_errors: BTreeMap<&'static str, BTreeMap<String, u64>>,
    /// Only with `--replicate`: the side files, where this rank reads them, what it copied.
    #[serde(skip_serializing_if = "Option::is_none")]
    replicated: Option<&'a crate::cache::side::Replicated>,
    /// The whole job, one row per rank (see `node::jobview`): on every rank of a job of up
    /// to 64 ranks, else on each host's first rank.
    #[serde(skip_serializing_if = "Option::is_none")]
    job: Option<serde_json::Value>,
    /// Only when (1 + Q) x the share does not fit the cache: the partial cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    partial: Option<PartialSnapshot>,
}

/// A share larger than its cache (docs/partial-cache.md): what the planned kept
/// sets are expected to give (simulated on the plan at mount) and what was measured
/// (`null` where this build does not measure it yet).
#[derive(Clone, Debug, Serialize)]
pub struct PartialSnapshot {
    pub cache_size_bytes: u64,
    /// Samples kept at epoch 0.
    pub kept_samples: u64,
    pub expected_hit_rate: f64,
    pub hit_rate: Option<f64>,
    pub source_bytes_per_epoch: Option<u64>,
    pub expected_source_bytes_per_epoch: u64,
}

pub struct DaemonStatus {
    pub source: String,
    pub hosts: Vec<u32>,
    pub mountpoint: String,
    pub store: Arc<SampleStore>,
    pub epochs: Coordinator,
    pub staging: Arc<StagingProgress>,
    pub exchange: Arc<ExchangeTracker>,
    /// How a resized job's share was filled at start-up (see `node::regrow`).
    pub resize: Option<RegrowReport>,
    /// Under `--equal-shares`: what the view leaves out (set once the view is made).
    pub equal_shares: std::sync::OnceLock<Arc<EqualShares>>,
    /// The job view this rank holds (see `node::jobview`), empty until it starts.
    pub(crate) job: Arc<JobBoard>,
    /// Running totals of the exchanges, for the metrics' counters.
    pub(crate) totals: ExchangeTotals,
    /// When the share does not fit the cache (set once at start).
    pub partial: std::sync::OnceLock<PartialSnapshot>,
    /// The read path the mount uses and why (set once, before mounting).
    pub read_path: std::sync::OnceLock<ReadPathSnapshot>,
    /// Kernel requests answered, by kind (the FUSE adapter counts them).
    pub requests: Arc<Requests>,
}

/// The status's `read_path`: the one the mount uses (`passthrough`, `page-cache`,
/// `daemon`) and why (`--read-path`, or the `auto` rule that chose it).
#[derive(Clone, Debug, Serialize)]
pub struct ReadPathSnapshot {
    pub path: &'static str,
    pub why: String,
}

impl PartialSnapshot {
    /// With what the store measured: the last whole epoch's hit rate and source bytes (the
    /// current epoch's hit rate so far before one ended; `null` before any read).
    fn measured(&self, store: &SampleStore) -> PartialSnapshot {
        let Some(gate) = store.partial() else {
            return self.clone();
        };
        let (last, now) = gate.measured();
        PartialSnapshot {
            hit_rate: last.unwrap_or(now).hit_rate(),
            source_bytes_per_epoch: last.map(|l| l.source_bytes),
            ..self.clone()
        }
    }
}

/// Under `--equal-shares drop`: the samples every view holds, and the ids this rank's view
/// leaves out of its share this epoch.
#[derive(Serialize)]
struct EqualSnapshot {
    mode: &'static str,
    view_samples: usize,
    left_out: Vec<crate::plan::SampleId>,
}

impl StatusReport for DaemonStatus {
    fn render(&self) -> Vec<u8> {
        let cur = self.epochs.current();
        let rank = self.epochs.rank();
        let params = self.epochs.plan().params();
        let manifest = self.store.manifest();
        let share = cur.share(rank);
        let stats = &self.store.stats;
        let status = Status {
            version: env!("CARGO_PKG_VERSION"),
            pid: std::process::id(),
            rank,
            world_size: params.world,
            epoch: cur.epoch,
            ready_epochs: if self.epochs.is_ready(cur.epoch + 1) {
                vec![cur.epoch, cur.epoch + 1]
            } else {
                vec![cur.epoch]
            },
            fraction: params.fraction,
            cache_fraction: self.epochs.plan().coded_shares().map(|c| c.alpha()),
            seed: params.seed,
            exchange_scope: self.epochs.plan().scope(),
            hosts: &self.hosts,
            source: &self.source,
            mountpoint: &self.mountpoint,
            dataset: DatasetSnapshot::of(manifest),
            classes: manifest.class_count(),
            samples: manifest.len(),
            share_samples: share.len(),
            share_bytes: share.iter().filter_map(|&i| self.store.size(i)).sum(),
            staging: self.staging.snapshot(),
            exchange: self.exchange.snapshot(),
            cache: CacheSnapshot {
                dir: self.store.dir().root().to_path_buf(),
                layout: self.store.layout(),
                files: stats.files.load(Ordering::Relaxed),
                bytes: stats.bytes.load(Ordering::Relaxed),
                fetched_from_source: stats.fetched_from_source.load(Ordering::Relaxed),
                fetched_bytes_from_source: (stats.fetched_bytes_from_source)
                    .load(Ordering::Relaxed),
                source_errors: stats.source_errors.load(Ordering::Relaxed),
                checksum_failures: stats.checksum_failures.load(Ordering::Relaxed),
                problems: stats.problems(),
                store_retries: crate::dataset::s3::store_retries(),
            },
            skipped: &manifest.skipped,
            resize: self.resize.as_ref(),
            advance_waiting: self.epochs.waiting(),
            source_scan: self.store.dir().source_scan(),
            replicated: self.store.dir().replicated(),
            equal_shares: self.equal_shares.get().map(|e| EqualSnapshot {
                mode: "drop",
                view_samples: e.view_size(),
                left_out: e.left_out(&cur).to_vec(),
            }),
            job: self.job.json(),
            partial: self.partial.get().map(|p| p.measured(&self.store)),
            read_path: self.read_path.get(),
            fuse_requests: self.requests.snapshot().into_iter().collect(),
            fuse_errors: self.fuse_errors(),
        };
        let mut out = serde_json::to_vec_pretty(&status).expect("status serializes");
        out.push(b'\n');
        out
    }

    fn metrics(&self) -> Vec<u8> {
        self.metrics_text().into_bytes()
    }
}

impl DaemonStatus {
    /// The job view this rank holds (empty until the daemon starts it).
    pub fn job(&self) -> &Arc<JobBoard> {
        &self.job
    }

    /// The errors the mount answered, by operation and errno (the status's `fuse_errors`).
    fn fuse_errors(&self) -> BTreeMap<&'static str, BTreeMap<String, u64>> {
        let mut out: BTreeMap<&'static str, BTreeMap<String, u64>> = BTreeMap::new();
        for (op, errno, n) in self.requests.errors() {
            out.entry(op).or_default().insert(errno, n);
        }
        out
    }

    /// The metrics' input, read now.
    fn metrics_text(&self) -> String {
        let rank = self.epochs.rank();
        let reports = self.exchange.snapshot();
        let stats = &self.store.stats;
        let staging = self.staging.snapshot();
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let host_of = |r: u32| match self.job.host_name(r) {
            Some(name) => name,
            None => format!("host-{}", self.hosts.get(r as usize).copied().unwrap_or(0)),
        };
        metrics::render(&metrics::Input {
            rank,
            world: self.epochs.plan().params().world,
            epoch: self.epochs.epoch(),
            totals: self.totals.observe(&reports),
            host_of: &host_of,
            latest: reports.last(),
            staging: [
                ("done", staging.files_done, staging.bytes_done),
                ("total", staging.files_total, staging.bytes_total),
            ],
            source_samples: load(&stats.fetched_from_source),
            source_bytes: load(&stats.fetched_bytes_from_source),
            source_errors: load(&stats.source_errors),
            checksum_failures: load(&stats.checksum_failures),
            cache_bytes: load(&stats.bytes),
            cache_samples: load(&stats.files),
            reads: load(&stats.reads),
            requests: self.requests.snapshot(),
            errors: self.requests.errors(),
            partial: (self.partial.get()).map(|p| {
                let p = p.measured(&self.store);
                metrics::Partial {
                    cache_size_bytes: p.cache_size_bytes,
                    hit_rate: p.hit_rate,
                    expected_hit_rate: p.expected_hit_rate,
                    source_bytes_per_epoch: p.source_bytes_per_epoch,
                    expected_source_bytes_per_epoch: p.expected_source_bytes_per_epoch,
                }
            }),
        })
    }

    /// Brings the exchange totals up to date (the job view does, every second).
    pub fn observe_exchanges(&self) {
        self.totals.observe(&self.exchange.snapshot());
    }
}
