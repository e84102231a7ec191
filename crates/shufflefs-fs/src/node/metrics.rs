//! `.shufflefs/metrics` and `--metrics-file`: what the status tracks, as Prometheus metrics.
//!
//! Encoded with `prometheus-client` (the Prometheus project's own Rust client). It writes
//! OpenMetrics; node_exporter's textfile collector, the convention for batch jobs, reads the
//! Prometheus text format, where a counter's `# HELP`/`# TYPE` lines name its `_total`
//! sample and there is no `# EOF`. So [`render`] renames those lines and leaves the marker
//! out: the text is then valid in both formats. Every series carries a `rank` label, so
//! the files of several ranks on one host (one collector) never repeat a series.
//!
//! Counters must only grow, but the exchange tracker keeps the last few exchanges only:
//! [`ExchangeTotals`] remembers what each exchange had moved when last seen, and adds an
//! exchange to a running total when it leaves the tracker. It is looked at every second by
//! the job view and at every rendering.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode_registry;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::exchange::ExchangeReport;
use crate::plan::Rank;
use crate::sys::sync::Locked;

/// The metric names, in one place (counters without their `_total`, which encoding adds).
pub(crate) mod names {
    pub const EPOCH: &str = "shufflefs_epoch";
    pub const WORLD_SIZE: &str = "shufflefs_world_size";
    pub const EXCHANGE_BYTES: &str = "shufflefs_exchange_bytes";
    pub const EXCHANGE_TARGET: &str = "shufflefs_exchange_target_epoch";
    pub const EXCHANGE_DONE: &str = "shufflefs_exchange_done_bytes";
    pub const EXCHANGE_EXPECTED: &str = "shufflefs_exchange_expected_bytes";
    pub const GIVEN_UP: &str = "shufflefs_exchange_given_up_peers";
    pub const FALLBACKS: &str = "shufflefs_source_fallback_samples";
    pub const SOURCE_SAMPLES: &str = "shufflefs_source_samples";
    pub const SOURCE_BYTES: &str = "shufflefs_source_bytes";
    pub const SOURCE_ERRORS: &str = "shufflefs_source_errors";
    pub const CHECKSUM_FAILURES: &str = "shufflefs_checksum_failures";
    pub const STAGING_DONE_SAMPLES: &str = "shufflefs_staging_done_samples";
    pub const STAGING_EXPECTED_SAMPLES: &str = "shufflefs_staging_expected_samples";
    pub const STAGING_DONE_BYTES: &str = "shufflefs_staging_done_bytes";
    pub const STAGING_EXPECTED_BYTES: &str = "shufflefs_staging_expected_bytes";
    pub const CACHE_BYTES: &str = "shufflefs_cache_bytes";
    pub const CACHE_SAMPLES: &str = "shufflefs_cache_samples";
    pub const OPENS: &str = "shufflefs_opens";
    pub const FUSE_REQUESTS: &str = "shufflefs_fuse_requests";
    pub const FUSE_ERRORS: &str = "shufflefs_fuse_errors";
    pub const LAST_UPDATE: &str = "shufflefs_last_update_timestamp_seconds";
    pub const PARTIAL_CACHE_SIZE: &str = "shufflefs_partial_cache_size_bytes";
    pub const PARTIAL_HIT: &str = "shufflefs_partial_hit_ratio";
    pub const PARTIAL_EXPECTED_HIT: &str = "shufflefs_partial_expected_hit_ratio";
    pub const PARTIAL_SOURCE: &str = "shufflefs_partial_epoch_source_bytes";
    pub const PARTIAL_EXPECTED_SOURCE: &str = "shufflefs_partial_expected_epoch_source_bytes";
}

/// What one exchange moved with one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Moved {
    Sent,
    Received,
    /// Samples the peer should have sent, fetched from the source instead.
    Fallback,
}

type Key = (Moved, Rank);

/// The peer of an exchange that names none (the coded exchange's server, outside the
/// ranks): its `peer_host` is `server`.
pub(crate) const SERVER: Rank = Rank::MAX;

/// Running totals over every exchange of this mount (see the module docs).
#[derive(Default)]
pub(crate) struct ExchangeTotals {
    inner: Mutex<Totals>,
}

#[derive(Default)]
struct Totals {
    /// Per exchange still in the tracker, what it had moved when last seen.
    seen: BTreeMap<u64, BTreeMap<Key, u64>>,
    /// Exchanges gone from the tracker, summed.
    retired: BTreeMap<Key, u64>,
}

impl ExchangeTotals {
    /// Takes `reports` (the tracker's) in; the totals so far.
    pub(crate) fn observe(&self, reports: &[ExchangeReport]) -> BTreeMap<Key, u64> {
        let mut t = self.inner.locked();
        let oldest = reports.first().map_or(u64::MAX, |r| r.target_epoch);
        let gone: Vec<u64> = t.seen.range(..oldest).map(|(e, _)| *e).collect();
        for e in gone {
            for (k, v) in t.seen.remove(&e).unwrap_or_default() {
                *t.retired.entry(k).or_default() += v;
            }
        }
        for r in reports {
            let now = t.seen.entry(r.target_epoch).or_default();
            if r.coded.is_some() {
                // The coded client tells no peers: what it moved, it moved with the server.
                // (Any other exchange names its peers, and one without any, of a job of
                // one rank, say, moved nothing: no `server` series of zeros.)
                for (k, v) in [
                    (Moved::Sent, r.bytes_sent),
                    (Moved::Received, r.bytes_received),
                ] {
                    let held = now.entry((k, SERVER)).or_default();
                    *held = (*held).max(v);
                }
            }
            for p in &r.peers {
                for (k, v) in [
                    (Moved::Sent, p.bytes_sent),
                    (Moved::Received, p.bytes_received),
                    (Moved::Fallback, p.fetched_from_source),
                ] {
                    let held = now.entry((k, p.rank)).or_default();
                    *held = (*held).max(v);
                }
            }
        }
        let mut all = t.retired.clone();
        for (k, v) in t.seen.values().flatten() {
            *all.entry(*k).or_default() += v;
        }
        all
    }
}

/// What the metrics are made of (read from the node by `status`).
pub(crate) struct Input<'a> {
    pub rank: Rank,
    pub world: u32,
    pub epoch: u64,
    pub totals: BTreeMap<Key, u64>,
    /// The host name of a rank, for `peer_host`.
    pub host_of: &'a dyn Fn(Rank) -> String,
    pub latest: Option<&'a ExchangeReport>,
    /// `("done", samples, bytes)` then `("total", samples, bytes)`.
    pub staging: [(&'static str, u64, u64); 2],
    pub source_samples: u64,
    pub source_bytes: u64,
    pub source_errors: u64,
    pub checksum_failures: u64,
    pub cache_bytes: u64,
    pub cache_samples: u64,
    /// Samples, parts and side files opened through the mount.
    pub reads: u64,
    /// Kernel requests answered, by kind (`node::requests`).
    pub requests: Vec<(&'static str, u64)>,
    /// Errors answered, by operation and errno name.
    pub errors: Vec<(&'static str, String, u64)>,
    /// A share larger than its cache (`None` when it fits): from the status's `partial`.
    pub partial: Option<Partial>,
}

/// What the metrics show of a partial cache (the status's `partial`, docs/partial-cache.md).
#[derive(Clone, Debug, Default)]
pub(crate) struct Partial {
    pub cache_size_bytes: u64,
    /// Of the last whole epoch; `None` before one ended.
    pub hit_rate: Option<f64>,
    pub expected_hit_rate: f64,
    pub source_bytes_per_epoch: Option<u64>,
    pub expected_source_bytes_per_epoch: u64,
}

fn gauge(registry: &mut Registry, name: &str, help: &str, v: u64) {
    let g: Gauge = Gauge::default();
    g.set(i64::try_from(v).unwrap_or(i64::MAX));
    registry.register(name, help, g);
}

fn counter(registry: &mut Registry, name: &str, help: &str, v: u64) {
    let c: Counter = Counter::default();
    c.inc_by(v);
    registry.register(name, help, c);
}

type Labels = Vec<(&'static str, String)>;

/// The metrics as Prometheus text (see the module docs).
pub(crate) fn render(i: &Input) -> String {
    use names::*;
    let rank = [("rank".into(), i.rank.to_string().into())];
    let mut r = Registry::with_labels(rank.into_iter());
    gauge(&mut r, EPOCH, "The epoch this rank serves", i.epoch);
    gauge(&mut r, WORLD_SIZE, "Ranks in the job", u64::from(i.world));
    exchange(&mut r, i);
    counter(
        &mut r,
        SOURCE_SAMPLES,
        "Samples read from the source",
        i.source_samples,
    );
    counter(
        &mut r,
        SOURCE_BYTES,
        "Bytes of samples read from the source",
        i.source_bytes,
    );
    counter(
        &mut r,
        SOURCE_ERRORS,
        "Failed reads of the source",
        i.source_errors,
    );
    let help = "Samples whose bytes did not match their checksum";
    counter(&mut r, CHECKSUM_FAILURES, help, i.checksum_failures);
    let [(_, done, done_bytes), (_, total, total_bytes)] = i.staging;
    let help = "Samples of this epoch's share staged from the source so far";
    gauge(&mut r, STAGING_DONE_SAMPLES, help, done);
    let help = "Samples of this epoch's share to stage from the source";
    gauge(&mut r, STAGING_EXPECTED_SAMPLES, help, total);
    gauge(&mut r, STAGING_DONE_BYTES, "Bytes of the same", done_bytes);
    let help = "Bytes of this epoch's share to stage";
    gauge(&mut r, STAGING_EXPECTED_BYTES, help, total_bytes);
    gauge(
        &mut r,
        CACHE_BYTES,
        "Bytes in this rank's cache",
        i.cache_bytes,
    );
    gauge(
        &mut r,
        CACHE_SAMPLES,
        "Samples in this rank's cache",
        i.cache_samples,
    );
    let help = "Samples, parts and side files opened through the mount, passthrough opens included (page-cache mode reads the cache directly and opens nothing here)";
    counter(&mut r, OPENS, help, i.reads);
    let requests = Family::<Labels, Counter>::default();
    for &(op, n) in &i.requests {
        requests
            .get_or_create(&vec![("op", op.to_string())])
            .inc_by(n);
    }
    let help =
        "Kernel requests this mount answered, by kind (lookup, getattr, open, read, release, ...)";
    r.register(FUSE_REQUESTS, help, requests);
    fuse_errors(&mut r, &i.errors);
    let help = "When this text was made (Unix time): a writer that stopped shows as an old value";
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let g: Gauge<f64, AtomicU64> = Gauge::default();
    g.set(now.map_or(0.0, |d| (d.as_millis() as f64) / 1000.0));
    r.register(LAST_UPDATE, help, g);
    if let Some(p) = &i.partial {
        partial(&mut r, p);
    }
    let mut text = String::new();
    encode_registry(&mut text, &r).expect("writing to a String cannot fail");
    prometheus_text(&text)
}

/// A partial cache (docs/partial-cache.md): its size, the hit ratio and source bytes of the
/// last whole epoch (absent before one ended) against what the plan expected.
/// `shufflefs_fuse_errors_total{op,errno}`.
fn fuse_errors(r: &mut Registry, errors: &[(&'static str, String, u64)]) {
    let family = Family::<Labels, Counter>::default();
    for (op, errno, n) in errors {
        let labels = vec![("op", op.to_string()), ("errno", errno.clone())];
        family.get_or_create(&labels).inc_by(*n);
    }
    let help = "Errors this mount answered the kernel, by operation and errno (ENOENT lookups are routine)";
    r.register(names::FUSE_ERRORS, help, family);
}

fn partial(r: &mut Registry, p: &Partial) {
    use names::*;
    let help = "The cache's room when the share does not fit it (--cache-size)";
    gauge(r, PARTIAL_CACHE_SIZE, help, p.cache_size_bytes);
    let ratio = |r: &mut Registry, name: &str, help: &str, v: f64| {
        let g: Gauge<f64, AtomicU64> = Gauge::default();
        g.set(v);
        r.register(name, help, g);
    };
    if let Some(hit) = p.hit_rate {
        let help = "Share of the samples read in the last epoch that the cache held (0 to 1)";
        ratio(r, PARTIAL_HIT, help, hit);
    }
    let help = "Hit ratio the planned kept sets give, simulated on the plan at mount";
    ratio(r, PARTIAL_EXPECTED_HIT, help, p.expected_hit_rate);
    if let Some(bytes) = p.source_bytes_per_epoch {
        let help = "Bytes read from the source in the last whole epoch";
        gauge(r, PARTIAL_SOURCE, help, bytes);
    }
    let help = "Bytes per epoch the plan expected to read from the source";
    gauge(
        r,
        PARTIAL_EXPECTED_SOURCE,
        help,
        p.expected_source_bytes_per_epoch,
    );
}

/// The exchange's metrics: running totals per direction and peer host, and the latest one.
fn exchange(r: &mut Registry, i: &Input) {
    use names::*;
    let bytes = Family::<Labels, Counter>::default();
    let mut fallbacks = 0;
    for (&(moved, peer), &v) in &i.totals {
        let direction = match moved {
            Moved::Sent => "sent",
            Moved::Received => "received",
            Moved::Fallback => {
                fallbacks += v;
                continue;
            }
        };
        let host = match peer {
            SERVER => "server".to_string(),
            _ => (i.host_of)(peer),
        };
        let l = vec![("direction", direction.to_string()), ("peer_host", host)];
        bytes.get_or_create(&l).inc_by(v);
    }
    let help = "Bytes moved by the exchanges, per direction and peer host (a disk hand-off on one host counts too)";
    r.register(EXCHANGE_BYTES, help, bytes);
    let help = "Samples the exchanges did not deliver, fetched from the source instead";
    counter(r, FALLBACKS, help, fallbacks);
    let latest = i.latest;
    let target = latest.map_or(0, |x| x.target_epoch);
    let help = "The epoch the latest exchange moves samples into (0 before any)";
    gauge(r, EXCHANGE_TARGET, help, target);
    let mean = i.cache_bytes.checked_div(i.cache_samples).unwrap_or(0);
    let (done, total) = latest.map_or((0, 0), |x| {
        let done = x.bytes_sent + x.bytes_received;
        (done, x.bytes_to_send + x.expected_bytes_to_receive(mean))
    });
    let help = "The latest exchange's bytes sent and received so far";
    gauge(r, EXCHANGE_DONE, help, done);
    let help = "The latest exchange's bytes to send and receive in all";
    gauge(r, EXCHANGE_EXPECTED, help, total);
    let given_up = latest.map_or(0, |x| x.peers.iter().filter(|p| p.given_up).count());
    let help = "Peers the latest exchange stopped waiting for";
    gauge(r, GIVEN_UP, help, given_up as u64);
}

/// OpenMetrics text as the Prometheus text format reads it (see the module docs).
fn prometheus_text(open_metrics: &str) -> String {
    let lines: Vec<&str> = open_metrics.lines().filter(|l| *l != "# EOF").collect();
    let mut out = String::with_capacity(open_metrics.len() + 64);
    for (n, line) in lines.iter().enumerate() {
        let counter_name = |l: &str| {
            let name = l.strip_prefix("# TYPE ")?.strip_suffix(" counter")?;
            Some(name.to_string())
        };
        let next_is_counter = lines.get(n + 1).and_then(|l| counter_name(l));
        let renamed = match (counter_name(line), next_is_counter) {
            (Some(name), _) => format!("# TYPE {name}_total counter"),
            (None, Some(name)) if line.starts_with(&format!("# HELP {name} ")) => line.replacen(
                &format!("# HELP {name} "),
                &format!("# HELP {name}_total "),
                1,
            ),
            _ => line.to_string(),
        };
        out.push_str(&renamed);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::PeerReport;

    fn report(epoch: u64, sent: u64) -> ExchangeReport {
        ExchangeReport {
            target_epoch: epoch,
            bytes_sent: sent,
            bytes_to_send: 100,
            peers: vec![PeerReport {
                rank: 1,
                bytes_sent: sent,
                given_up: true,
                fetched_from_source: 1,
                ..PeerReport::default()
            }],
            ..ExchangeReport::default()
        }
    }

    fn input<'a>(totals: BTreeMap<Key, u64>, latest: Option<&'a ExchangeReport>) -> Input<'a> {
        Input {
            rank: 2,
            world: 4,
            epoch: 3,
            totals,
            host_of: &|r| format!("node{r}"),
            latest,
            staging: [("done", 5, 500), ("total", 10, 1000)],
            source_samples: 7,
            source_bytes: 700,
            source_errors: 0,
            checksum_failures: 0,
            cache_bytes: 1234,
            cache_samples: 12,
            reads: 9,
            requests: vec![("lookup", 4), ("open", 3)],
            errors: vec![("write", "EROFS".into(), 2)],
            partial: None,
        }
    }

    #[test]
    fn a_partial_cache_shows_its_hit_ratio_against_the_plan() {
        let mut i = input(BTreeMap::new(), None);
        assert!(!render(&i).contains("shufflefs_partial_"));
        i.partial = Some(Partial {
            cache_size_bytes: 30_000_000,
            expected_hit_rate: 0.5,
            hit_rate: Some(0.475),
            source_bytes_per_epoch: Some(12_000),
            expected_source_bytes_per_epoch: 11_000,
        });
        let text = render(&i);
        for line in [
            "shufflefs_partial_cache_size_bytes{rank=\"2\"} 30000000",
            "shufflefs_partial_hit_ratio{rank=\"2\"} 0.475",
            "shufflefs_partial_expected_hit_ratio{rank=\"2\"} 0.5",
            "shufflefs_partial_epoch_source_bytes{rank=\"2\"} 12000",
            "shufflefs_partial_expected_epoch_source_bytes{rank=\"2\"} 11000",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }

    #[test]
    fn totals_only_grow_as_exchanges_leave_the_tracker() {
        let totals = ExchangeTotals::default();
        let t = totals.observe(&[report(1, 10)]);
        assert_eq!(t[&(Moved::Sent, 1)], 10);
        let t = totals.observe(&[report(1, 30), report(2, 5)]);
        assert_eq!(t[&(Moved::Sent, 1)], 35);
        // Exchange 1 left the tracker: kept in the total.
        let t = totals.observe(&[report(2, 7), report(3, 1)]);
        assert_eq!(t[&(Moved::Sent, 1)], 38);
        assert_eq!(t[&(Moved::Fallback, 1)], 3);
    }

    #[test]
    fn a_report_without_peers_counts_as_moved_with_the_server() {
        let coded = ExchangeReport {
            target_epoch: 1,
            bytes_received: 70,
            coded: Some(crate::exchange::coded::CodedReport::default()),
            ..ExchangeReport::default()
        };
        let t = ExchangeTotals::default().observe(&[coded]);
        assert_eq!(t[&(Moved::Received, SERVER)], 70);
        let mut i = input(t, None);
        i.rank = 0;
        let text = render(&i);
        let line = "shufflefs_exchange_bytes_total{rank=\"0\",direction=\"received\",peer_host=\"server\"} 70";
        assert!(text.lines().any(|l| l == line), "{text}");
    }

    #[test]
    fn an_exchange_without_peers_that_is_not_coded_shows_no_server() {
        let alone = ExchangeReport {
            target_epoch: 1,
            ..ExchangeReport::default()
        };
        let t = ExchangeTotals::default().observe(&[alone]);
        assert!(t.keys().all(|&(_, peer)| peer != SERVER), "{t:?}");
        let text = render(&input(t, None));
        assert!(!text.contains("peer_host=\"server\""), "{text}");
    }

    #[test]
    fn counters_are_named_as_the_prometheus_text_format_wants() {
        let totals = ExchangeTotals::default().observe(&[report(4, 50)]);
        let latest = report(4, 50);
        let text = render(&input(totals, Some(&latest)));
        for line in [
            "# TYPE shufflefs_exchange_bytes_total counter",
            "shufflefs_exchange_bytes_total{rank=\"2\",direction=\"sent\",peer_host=\"node1\"} 50",
            "# TYPE shufflefs_epoch gauge",
            "shufflefs_epoch{rank=\"2\"} 3",
            "shufflefs_staging_expected_samples{rank=\"2\"} 10",
            "shufflefs_staging_done_bytes{rank=\"2\"} 500",
            "shufflefs_source_fallback_samples_total{rank=\"2\"} 1",
            "shufflefs_exchange_expected_bytes{rank=\"2\"} 100",
            "shufflefs_exchange_done_bytes{rank=\"2\"} 50",
            "shufflefs_exchange_given_up_peers{rank=\"2\"} 1",
            "shufflefs_opens_total{rank=\"2\"} 9",
            "# TYPE shufflefs_fuse_requests_total counter",
            "shufflefs_fuse_requests_total{rank=\"2\",op=\"lookup\"} 4",
            "shufflefs_fuse_requests_total{rank=\"2\",op=\"open\"} 3",
            "shufflefs_fuse_errors_total{rank=\"2\",op=\"write\",errno=\"EROFS\"} 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        assert!(text.contains("# HELP shufflefs_opens_total Samples, parts"));
        assert!(text.contains("# TYPE shufflefs_last_update_timestamp_seconds gauge"));
        assert!(!text.contains("state=\""));
        assert!(!text.contains("# EOF"));
    }
}
