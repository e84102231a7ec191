//! Which job a start continues when the number of ranks may have changed (elastic restarts):
//! its history of world sizes, the epoch it reached, and the cache folders of ranks that no
//! longer exist on this host.
//!
//! Every rank reports the epoch and history of its own cache's state file; they must agree
//! (each one the longest history or an earlier part of it: a restart killed half-way leaves
//! some ranks one change behind), else the start is refused. If the world size now differs,
//! or differed before, each rank also looks for *orphans*: the folders `--cache` names for
//! the other rank numbers the job ever had (`{rank}` = 0 up to its largest world), that exist
//! on this host, carry a state file of this job (same source, seed, fraction, dataset and a
//! history that is part of ours), that no daemon holds (its lock) and that no rank of this
//! start marked as its own (a token every rank writes first, for filesystems shared by hosts
//! whose locks do not reach across them). Such a folder belongs to a rank that is gone, or
//! that runs on another host now. Its lock is taken, so no daemon starts on it meanwhile; `node::regrow` adopts from it what the new shares need and removes it. A
//! folder carrying anything else (no state file, another job's) is never touched. The job
//! goes on at the furthest epoch any of these state files saved, orphans' included.
//!
//! Under `--exchange-scope node` a change of world size is refused (see `plan::elastic`).

use std::io;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::cache::{CacheDir, CacheError, CacheState, SampleStore};
use crate::comm::{Comm, Reduce, decide};
use crate::config::{MountConfig, for_rank};
use crate::dataset::{Dataset, Manifest};
use crate::plan::ExchangeScope;
use crate::plan::Rank;
use crate::plan::elastic::{Era, History};

use super::StartError;

/// The job a start continues.
pub(crate) struct Job {
    pub history: History,
    pub epoch: u64,
    /// Folders of ranks that are gone from this host, locked; empty unless the job was
    /// ever resized.
    pub orphans: Vec<Orphan>,
}

/// A gone rank's cache folder on this host, locked by this daemon.
pub(crate) struct Orphan {
    pub dir: CacheDir,
    pub state: CacheState,
}

/// What a rank tells the others about a state file it found.
#[derive(Serialize, Deserialize)]
struct Seen {
    epoch: u64,
    eras: Vec<Era>,
}

impl Seen {
    fn of(state: &CacheState) -> Option<Seen> {
        let history = state.history().ok()?;
        Some(Seen {
            epoch: state.epoch,
            eras: history.eras().to_vec(),
        })
    }

    fn history(&self) -> Option<History> {
        History::from_eras(self.eras.clone()).ok()
    }
}

/// Collective: the job this start continues, or (in the inner `Err`, the same on every rank,
/// so a message each rank reached alike, for the start-up's refusal) why it cannot. `mine` is this rank's state file if it belongs to these settings (its world
/// size aside), `expected` the state this start would write.
pub(crate) fn find_job(
    comm: &mut dyn Comm,
    config: &MountConfig,
    mine: Option<&CacheState>,
    expected: &CacheState,
) -> Result<Result<Job, String>, StartError> {
    let template = config.cache.as_str();
    let world = comm.size();
    let mine = mine.and_then(Seen::of);
    let longest = match longest_history(comm, mine.as_ref())? {
        Ok(Some(longest)) => longest,
        // No rank has a cache of this job: a fresh start.
        Ok(None) => {
            return Ok(Ok(Job {
                history: History::new(world),
                epoch: 0,
                orphans: Vec::new(),
            }));
        }
        Err(why) => return Ok(Err(why)),
    };
    let resizing = longest.world() != world;
    if let Some(why) = fixed_world(config).filter(|_| resizing) {
        return Ok(Err(format!(
            "the cache was built by {} {why}, so the number of ranks cannot change; start {} \
             ranks as before, or pass --reset-cache",
            longest.describe(),
            longest.world()
        )));
    }
    let orphans = if resizing || longest.is_resized() {
        let own = for_rank(template, comm.rank());
        let token = mark_live(comm, &own)?;
        let largest = (longest.eras().iter().map(|e| e.world))
            .chain([world])
            .max()
            .unwrap_or(world);
        (0..largest)
            .filter_map(|r| orphan(&for_rank(template, r), &own, expected, &longest, &token))
            .collect()
    } else {
        Vec::new()
    };
    // The furthest epoch any state file saved, this rank's and its orphans': one all-reduce.
    let seen = (orphans.iter()).filter_map(|o| Seen::of(&o.state));
    let furthest = (mine.iter().chain(&seen.collect::<Vec<_>>()))
        .map(|s| s.epoch)
        .max()
        .unwrap_or(0);
    let epoch = comm.all_reduce(&[furthest], Reduce::Max)?;
    let epoch = epoch.first().copied().unwrap_or(furthest);
    Ok(longest
        .resized(epoch, world)
        .map(|history| Job {
            history,
            epoch,
            orphans,
        })
        .map_err(|e| e.to_string()))
}

/// Whether `state` is a cache of these settings, its world size aside: one of this job,
/// maybe of another number of ranks.
pub(crate) fn belongs(state: &CacheState, expected: &CacheState) -> bool {
    differences(state, expected).is_empty()
}

/// What differs between `state` and `expected` besides the world size. With another world
/// size the folder's rank (and host layout) do not matter either: `node::regrow` works from
/// what a folder holds, so a rank may start on a folder another rank used (a per-host
/// `--cache` without `{rank}`, ranks placed differently); its samples go to their owners.
pub(crate) fn differences(state: &CacheState, expected: &CacheState) -> Vec<String> {
    let resized = state.world_size != expected.world_size;
    let (rank, hosts) = match resized {
        true => (state.rank, state.hosts.clone()),
        false => (expected.rank, expected.hosts.clone()),
    };
    state.differences(&CacheState {
        world_size: state.world_size,
        rank,
        hosts,
        ..expected.clone()
    })
}

/// The orphans as stores to take samples from (one that cannot be read is left alone).
pub(crate) fn open_orphans(
    orphans: Vec<Orphan>,
    manifest: &Arc<Manifest>,
    dataset: &Arc<dyn Dataset>,
) -> Vec<SampleStore> {
    orphans
        .into_iter()
        .filter_map(|o| {
            let root = o.dir.root().to_path_buf();
            // A gone rank's folder has the job's layout: `belongs` checked its state.
            o.dir
                .backend(o.state.layout, manifest.len())
                .map_err(io::Error::other)
                .and_then(|backend| {
                    SampleStore::with_backend(o.dir, backend, manifest.clone(), dataset.clone())
                        .map_err(io::Error::other)
                })
                .map_err(|e| tracing::warn!(folder = %root.display(), error = %e, "cannot read the cache of a gone rank; left alone"))
                .ok()
        })
        .collect()
}

/// The file by which a live rank marks its cache folder (see [`mark_live`]).
const LIVE_MARK: &str = "job-token";

/// Collective: every rank writes this start's token (rank 0's random pick) into its cache
/// folder, and all have done so on return. The lock alone tells a live rank's folder from a
/// gone one's, but a folder on a filesystem shared by several hosts may not see the locks of
/// the others; the token does: a folder carrying it belongs to a rank of this start.
fn mark_live(comm: &mut dyn Comm, own: &Path) -> Result<String, StartError> {
    use std::hash::BuildHasher;
    let pick = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
    let token = decide(comm, || {
        Ok::<_, String>(format!("{pick:016x}").into_bytes())
    })?
    .map_err(|_| StartError::Malformed("start token"))?;
    let token = String::from_utf8(token).map_err(|_| StartError::Malformed("start token"))?;
    if let Err(e) = crate::cache::write_atomic(own, LIVE_MARK, token.as_bytes()) {
        tracing::warn!(error = %e, "cannot mark the cache folder as in use by this start");
    }
    // A barrier: one all-reduce (an empty all-gather still hands every rank M lengths).
    comm.all_reduce(&[0], Reduce::Max)?;
    Ok(token)
}

/// Why a job of these settings can never change its number of ranks, if it cannot: the one
/// place where a mode that pins the world size says so (see the module docs).
fn fixed_world(config: &MountConfig) -> Option<&'static str> {
    match config.scope() {
        ExchangeScope::Node => Some(
            "under --exchange-scope node, which keeps each host's samples where epoch 0 put \
             them (with the same ranks per host)",
        ),
        ExchangeScope::Global => None,
    }
}

/// Collective: the longest history of the ranks' state files (the highest such rank's), or
/// `None` when no rank has one; `Err` when some rank's history is not an earlier part of it
/// (the caches belong to different jobs), naming the first such rank's. Two all-reduces
/// and a broadcast of one history (three when they differ): no rank gathers every rank's.
fn longest_history(
    comm: &mut dyn Comm,
    mine: Option<&Seen>,
) -> Result<Result<Option<History>, String>, StartError> {
    let rank = comm.rank();
    let mine = mine.and_then(Seen::history);
    // Longest first, then the highest rank: (eras, rank + 1) in one word, 0 for none.
    let key = mine.as_ref().map_or(0, |h| {
        ((h.eras().len() as u64) << 32) | (u64::from(rank) + 1)
    });
    let top = comm.all_reduce(&[key], Reduce::Max)?;
    let holder = match top.first().map(|t| t & u64::from(u32::MAX)) {
        None | Some(0) => return Ok(Ok(None)),
        Some(r) => (r - 1) as Rank,
    };
    let longest = share_history(comm, holder, mine.as_ref())?;
    let odd = (mine.as_ref())
        .filter(|h| !h.is_prefix_of(&longest))
        .map_or(u64::MAX, |_| u64::from(rank));
    let first = comm.all_reduce(&[odd], Reduce::Min)?;
    match first.first() {
        Some(&r) if r != u64::MAX => {
            let other = share_history(comm, r as Rank, mine.as_ref())?;
            Ok(Err(format!(
                "the cache folders belong to different jobs (one ran with {}, another with {}); \
                 pass --reset-cache to rebuild them",
                longest.describe(),
                other.describe()
            )))
        }
        _ => Ok(Ok(Some(longest))),
    }
}

/// Collective: `holder`'s history (`mine` there) on every rank.
fn share_history(
    comm: &mut dyn Comm,
    holder: Rank,
    mine: Option<&History>,
) -> Result<History, StartError> {
    let sent = match (comm.rank() == holder, mine) {
        (true, Some(h)) => serde_json::to_vec(h.eras()).expect("serializes"),
        _ => Vec::new(),
    };
    let got = comm.broadcast(holder, sent)?;
    (serde_json::from_slice::<Vec<Era>>(&got).ok())
        .and_then(|eras| History::from_eras(eras).ok())
        .ok_or(StartError::Malformed("cache history"))
}

/// The folder at `path`, locked, if it is an orphan of this job (see the module docs). Its
/// state file is read before the lock is taken, so another job's folder is not even locked.
fn orphan(
    path: &Path,
    own: &Path,
    expected: &CacheState,
    history: &History,
    token: &str,
) -> Option<Orphan> {
    let canonical = |p: &Path| std::fs::canonicalize(p).ok();
    let read = |path: &Path| -> Option<CacheState> {
        serde_json::from_slice(&std::fs::read(path.join("state.json")).ok()?).ok()
    };
    let ours = |state: &CacheState| {
        let expected = CacheState {
            rank: state.rank,
            ..expected.clone()
        };
        belongs(state, &expected) && state.history().is_ok_and(|h| h.is_prefix_of(history))
    };
    let live = || std::fs::read_to_string(path.join(LIVE_MARK)).is_ok_and(|t| t == token);
    if canonical(path) == canonical(own) || live() {
        return None;
    }
    let state = read(path)?;
    if !ours(&state) {
        tracing::info!(folder = %path.display(), "cache folder of another job or settings; left alone");
        return None;
    }
    let dir = match CacheDir::open(path) {
        Ok(dir) => dir,
        Err(CacheError::InUse { .. }) => return None, // a live daemon's
        Err(e) => {
            tracing::warn!(error = %e, "cannot look into a cache folder of a gone rank; left alone");
            return None;
        }
    };
    // Read again under the lock: a daemon may have used it until just now.
    let state = dir.load_state().ok().flatten().filter(ours)?;
    if live() {
        return None;
    }
    tracing::info!(folder = %path.display(), rank = state.rank, epoch = state.epoch, "found the cache of a rank gone from this host");
    Some(Orphan { dir, state })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::FORMAT_VERSION;

    fn state(rank: u32, seed: u64) -> CacheState {
        CacheState {
            format: FORMAT_VERSION,
            source: "/data".into(),
            seed,
            fraction: 0.5,
            world_size: 4,
            rank,
            manifest_fingerprint: 7,
            epoch: 3,
            exchange_scope: ExchangeScope::Global,
            hosts: None,
            world_history: Vec::new(),
            layout: Default::default(),
            scanned_at: None,
        }
    }

    /// Only an unheld folder of this job that no live rank marked is an orphan; another
    /// job's folder is not even locked (its LOCK file is never created).
    #[test]
    fn what_counts_as_an_orphan() {
        let tmp = tempfile::tempdir().unwrap();
        let folder = |name: &str, s: Option<CacheState>| {
            let path = tmp.path().join(name);
            std::fs::create_dir_all(&path).unwrap();
            if let Some(s) = s {
                std::fs::write(path.join("state.json"), serde_json::to_vec(&s).unwrap()).unwrap();
            }
            path
        };
        let own = folder("own", None);
        let expected = CacheState {
            world_size: 2,
            ..state(0, 5)
        };
        let history = History::new(4);
        let find = |path: &Path| orphan(path, &own, &expected, &history, "t0k");

        let gone = folder("gone", Some(state(3, 5)));
        let found = find(&gone).expect("an orphan");
        assert_eq!(found.state.rank, 3);
        assert!(find(&gone).is_none(), "locked by the first look");
        drop(found);

        let foreign = folder("foreign", Some(state(3, 6)));
        assert!(find(&foreign).is_none());
        assert!(
            !foreign.join("LOCK").exists(),
            "another job's folder was touched"
        );
        assert!(find(&folder("empty", None)).is_none());
        assert!(find(&own).is_none());

        let marked = folder("marked", Some(state(1, 5)));
        std::fs::write(marked.join(LIVE_MARK), "t0k").unwrap();
        assert!(find(&marked).is_none(), "a live rank's folder");
        std::fs::write(marked.join(LIVE_MARK), "old").unwrap();
        assert!(find(&marked).is_some(), "marked by an earlier start");

        let later = History::new(3);
        let other_history = folder("other-history", Some(state(2, 5)));
        assert!(orphan(&other_history, &own, &expected, &later, "t0k").is_none());
    }
}
