//! What a rank knows of the whole job: the latest row of every rank and when it was made.
//! Written by the gatherer on the thread that owns MPI, read by the status (FUSE threads).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::row::RankRow;
use crate::sys::sync::Locked;

/// A row older than this is marked `stale_s` (rows come about once a second; on ranks
/// other than 0, the table's interval is added, see `fanout`).
pub(crate) const STALE: Duration = Duration::from_secs(3);

#[derive(Default)]
pub struct JobBoard {
    table: Mutex<Option<Table>>,
    /// Every rank's host name, learned as the view starts.
    hosts: std::sync::OnceLock<Vec<String>>,
    /// When a row is marked stale, if not after [`STALE`] (ranks that get the table less
    /// often than every second, see `fanout`).
    stale_after: std::sync::OnceLock<Duration>,
}

struct Table {
    world: u32,
    started: Instant,
    updated: Option<SystemTime>,
    /// Rank 0 left: no row will come any more.
    ended: bool,
    /// Each rank's latest row and when its rank made it (on this rank's clock).
    rows: BTreeMap<u32, (RankRow, Instant)>,
}

impl JobBoard {
    /// From now on this rank holds the view of a job of `world` ranks.
    pub(crate) fn start(&self, world: u32) {
        *self.table.locked() = Some(Table {
            world,
            started: Instant::now(),
            updated: None,
            ended: false,
            rows: BTreeMap::new(),
        });
    }

    /// Rows older than `after` are stale (set once, as the view starts).
    pub(crate) fn stale_after(&self, after: Duration) {
        let _ = self.stale_after.set(after);
    }

    /// Every rank's host name, in rank order (set once).
    pub(crate) fn set_hosts(&self, names: Vec<String>) {
        let _ = self.hosts.set(names);
    }

    /// The host name of `rank`, once the view started.
    pub(crate) fn host_name(&self, rank: u32) -> Option<String> {
        self.hosts.get()?.get(rank as usize).cloned()
    }

    /// `row` as its rank made it at `made`, received from another rank (rank 0: a row from
    /// a rank; the others: the table from rank 0): the view is `updated` now. An older row
    /// than the one held is ignored.
    pub(crate) fn put(&self, row: RankRow, made: Instant) {
        self.insert(row, made, true);
    }

    /// This rank's own row: it does not make the view `updated` (it says nothing of the
    /// others), except in a job of one rank, where it is the whole job.
    pub(crate) fn put_own(&self, row: RankRow, made: Instant) {
        self.insert(row, made, false);
    }

    fn insert(&self, row: RankRow, made: Instant, received: bool) {
        let mut table = self.table.locked();
        let Some(t) = table.as_mut() else { return };
        if (t.rows.get(&row.rank)).is_some_and(|(_, held)| *held > made) {
            return;
        }
        if received || t.world == 1 {
            t.updated = Some(SystemTime::now());
        }
        t.rows.insert(row.rank, (row, made));
    }

    /// Rank 0 left: the view shows the job as it last was, and says so (`ended`).
    pub(crate) fn end(&self) {
        if let Some(t) = self.table.locked().as_mut() {
            t.ended = true;
        }
    }

    /// Every row held with its age now, in rank order.
    pub(crate) fn rows(&self) -> Vec<(Duration, RankRow)> {
        let table = self.table.locked();
        let Some(t) = table.as_ref() else {
            return Vec::new();
        };
        (t.rows.values())
            .map(|(row, made)| (made.elapsed(), row.clone()))
            .collect()
    }

    /// The status's `job` object, `None` while this rank holds no view. Its `updated_unix_ms`
    /// is when a row last came from another rank (see `put`). A rank not heard
    /// from yet has only `rank` and `stale_s` (seconds since the view started).
    pub(crate) fn json(&self) -> Option<Value> {
        let table = self.table.locked();
        let t = table.as_ref()?;
        // Nothing received yet: as of the view's start.
        let updated = (t.updated).unwrap_or_else(|| SystemTime::now() - t.started.elapsed());
        let stale = self.stale_after.get().copied().unwrap_or(STALE);
        let ranks: Vec<Value> = (0..t.world)
            .map(|r| match t.rows.get(&r) {
                Some((row, made)) => {
                    let mut v = serde_json::to_value(row).unwrap_or(Value::Null);
                    let age = made.elapsed();
                    if age > stale && !row.left {
                        v["stale_s"] = json!(tenths(age));
                    }
                    v
                }
                None => json!({"rank": r, "stale_s": tenths(t.started.elapsed())}),
            })
            .collect();
        let mut job = json!({"updated_unix_ms": unix_ms(updated), "ranks": ranks});
        if t.ended {
            job["ended"] = json!(true);
        }
        Some(job)
    }
}

fn tenths(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_stale_ranks_are_marked() {
        let board = JobBoard::default();
        assert!(board.json().is_none());
        board.start(3);
        let now = Instant::now();
        let row = |rank| RankRow {
            rank,
            epoch: u64::from(rank),
            ..RankRow::default()
        };
        board.put_own(row(0), now);
        // Only this rank's own row: the view is as old as its start.
        let before = board.json().unwrap()["updated_unix_ms"].as_u64().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        board.put_own(row(0), Instant::now());
        assert_eq!(board.json().unwrap()["updated_unix_ms"], before);
        board.put(row(2), now - Duration::from_secs(10));
        assert!(board.json().unwrap()["updated_unix_ms"].as_u64().unwrap() >= before + 20);
        // An older row than the one held does not replace it.
        board.put(row(0), now - Duration::from_secs(5));
        let job = board.json().unwrap();
        let ranks = job["ranks"].as_array().unwrap();
        assert_eq!(ranks.len(), 3);
        assert!(ranks[0].get("stale_s").is_none());
        assert_eq!(ranks[0]["staging"]["done"], 0);
        assert_eq!(ranks[1]["rank"], 1);
        assert!(ranks[1]["stale_s"].is_number() && ranks[1].get("host").is_none());
        assert!(ranks[2]["stale_s"].as_f64().unwrap() >= 10.0);
        assert_eq!(ranks[2]["epoch"], 2);
        assert!(job["updated_unix_ms"].as_u64().unwrap() > 1_600_000_000_000);
    }
}
