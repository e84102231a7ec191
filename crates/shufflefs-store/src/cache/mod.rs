//! The per-rank cache folder on local SSD.
//!
//! ```text
//! CACHE/LOCK            flock held for the daemon's life; holds its pid for error messages
//! CACHE/state.json      settings + current epoch, replaced atomically (tmp, fsync, rename)
//! CACHE/manifest.bin    the dataset manifest, so a remount need not rescan the source
//! CACHE/job-token       written at start-up by a job whose number of ranks changed: marks
//!                       the folder as a live rank's (see `daemon::resize`)
//! CACHE/samples/<id>    one file per cached sample (the file backend, `files.rs`)
//! CACHE/tmp/<id>        samples being written; emptied at startup
//! CACHE/slots/<E>.bin   this rank's share at epoch E in chunk order, the last two epochs
//!                       (`slots.rs`): a resume reads it instead of walking the plan back
//! CACHE/segments/*.seg  records appended to segment files (the packed backend, `packed/`),
//!                       instead of samples/ and tmp/ (`--cache-layout`, `layout.rs`)
//! ```
//! Three layers: [`CacheDir`] owns the folder, its lock and the small state files;
//! a `CacheBackend` stores sample bytes by id (`backend.rs`: the trait, and the claims that
//! give each sample one writer; `files.rs`: one file per sample); [`SampleStore`] (`store.rs`)
//! knows which samples are present, their sizes and source times, fetches from the dataset
//! on demand and counts what the status shows. Nothing above the store knows how bytes lie
//! on disk, so a packed backend slots in without touching `vfs`, `fuse` or `exchange`.
//!
//! Every committed sample carries the CRC-32C of its bytes, taken as it was written. The
//! exchange checks it whenever a sample leaves this rank and checks received bytes against
//! the sender's value before they are committed, so a damaged sample never enters a view
//! through a transfer. A sample adopted from a rank on the same host
//! (`SampleStore::adopt_from_peer`) is checked the same way when copied; when hard-linked
//! it is the peer's own committed file, shared and never written again, and is checked when
//! it leaves this rank like every cached sample.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::dataset::manifest::Manifest;
use crate::plan::elastic::{Era, History};
use crate::plan::{ExchangeScope, HostLayout, PlanError, SampleId};

pub mod admission;
mod backend;
mod bitset;
pub(crate) mod early;
mod files;
pub mod footprint;
mod layout;
pub mod own;
mod packed;
pub(crate) mod planned;
pub(crate) mod prefetch;
pub(crate) mod private;
pub mod side;
pub mod slots;
mod store;
mod table;
pub mod trim;

pub use backend::{Borrowed, CacheBackend, ChecksumMismatch};
#[cfg(test)]
pub(crate) use backend::{Claim, Claims, Commit, Recovered, SampleWriter};
pub use files::FileBackend;
pub use layout::CacheLayout;
pub use own::remove_owned;
pub use packed::PackedBackend;
pub use store::source_errno;
pub use store::{Adopted, SampleStore, StoreStats};

/// Bump when the layout or the plan's output changes: old caches are then refused.
/// 3: the partial-local plan runs on positions (`plan::local`), so shares differ from 2's.
/// 4: a record index's offsets and lengths are encoded as fixed-width byte arrays
/// (`dataset::columns`), so a record manifest saved by 3 does not decode.
/// 5: a folder manifest's name ends likewise.
/// 6: sample ids are 64-bit: a record index's group starts are 8-byte words.
pub const FORMAT_VERSION: u32 = 6;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error(
        "cache folder {path} is in use by another shufflefs daemon{holder}; unmount it first or pick another --cache (ranks on one host need one folder each: --cache /path/sfs-{{rank}})"
    )]
    InUse { path: PathBuf, holder: String },
    #[error(
        "cache folder {path} is not usable: {source}. Pick a writable --cache folder on local disk"
    )]
    NotWritable { path: PathBuf, source: io::Error },
    #[error("cache folder {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "cache folder {path} is not empty and was not made by shufflefs (it holds {}); \
         shufflefs only takes an empty folder or its own cache, and changed nothing: pick a \
         new or empty --cache folder (with {{rank}} in it for several ranks on one host)",
        list_names(found)
    )]
    Foreign { path: PathBuf, found: Vec<String> },
    #[error(
        "cache folder {path} holds {what} that cannot be read ({detail}); remove the folder or pass --reset-cache"
    )]
    Corrupt {
        path: PathBuf,
        what: &'static str,
        detail: String,
    },
}

/// What a cache was built for; a remount must match it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CacheState {
    pub format: u32,
    pub source: String,
    pub seed: u64,
    pub fraction: f64,
    pub world_size: u32,
    pub rank: u32,
    pub manifest_fingerprint: u32,
    pub epoch: u64,
    /// `--exchange-scope`. Left out of the file when global, so a global cache's state file
    /// is what it was before the option existed; one without it (any older cache) is global.
    #[serde(default, skip_serializing_if = "ExchangeScope::is_global")]
    pub exchange_scope: ExchangeScope,
    /// Node scope only: each rank's host index (by first appearance) when the cache was
    /// built. The plan's history depends on it, so a resume must find the same layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<u32>>,
    /// The job's world sizes over time once it changed (elastic restarts, see
    /// `plan::elastic`); the plan's history depends on them. Empty for a job that always
    /// ran on `world_size` ranks, so such state files stay as they were.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub world_history: Vec<Era>,
    /// `--cache-layout`. Left out when `files`, so older state files (all `files`) load.
    #[serde(default, skip_serializing_if = "CacheLayout::is_files")]
    pub layout: CacheLayout,
    /// When rank 0 last scanned the source for this index (seconds since 1970); absent in
    /// caches made before it was recorded. Not a setting: never a difference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scanned_at: Option<u64>,
}

impl CacheState {
    /// The world sizes the cache's job ran with (checked: the last is `world_size`).
    pub fn history(&self) -> Result<History, PlanError> {
        if self.world_history.is_empty() {
            return Ok(History::new(self.world_size));
        }
        let history = History::from_eras(self.world_history.clone())?;
        if history.world() != self.world_size {
            return Err(PlanError::History(format!(
                "the last era has {} ranks, the state file says {}",
                history.world(),
                self.world_size
            )));
        }
        Ok(history)
    }

    /// Records `history`: its world size, and its eras once it changed.
    pub fn set_history(&mut self, history: &History) {
        self.world_size = history.world();
        self.world_history = if history.is_resized() {
            history.eras().to_vec()
        } else {
            Vec::new()
        };
    }

    /// Human-readable list of the settings that differ (epoch excluded).
    pub fn differences(&self, other: &CacheState) -> Vec<String> {
        let mut out = Vec::new();
        let mut check = |name: &str, a: String, b: String| {
            if a != b {
                out.push(format!("{name}: cache has {a}, now {b}"));
            }
        };
        check(
            "format version",
            self.format.to_string(),
            other.format.to_string(),
        );
        check("--source", self.source.clone(), other.source.clone());
        check("--seed", self.seed.to_string(), other.seed.to_string());
        check(
            "--fraction",
            self.fraction.to_string(),
            other.fraction.to_string(),
        );
        check(
            "world size",
            self.world_size.to_string(),
            other.world_size.to_string(),
        );
        check("rank", self.rank.to_string(), other.rank.to_string());
        check(
            "manifest",
            format!("{:08x}", self.manifest_fingerprint),
            format!("{:08x}", other.manifest_fingerprint),
        );
        check(
            "--exchange-scope",
            self.exchange_scope.to_string(),
            other.exchange_scope.to_string(),
        );
        check(
            "--cache-layout",
            self.layout.to_string(),
            other.layout.to_string(),
        );
        // Only where both are node scope: otherwise the scope line above says it all.
        if let (Some(was), Some(now)) = (&self.hosts, &other.hosts)
            && HostLayout::new(was) != HostLayout::new(now)
        {
            out.push(format!(
                "host layout (--exchange-scope node plans every move within a host): cache has {}, now {}; \
                 start the ranks with the same ranks sharing a host as before",
                HostLayout::new(was).describe(),
                HostLayout::new(now).describe()
            ));
        }
        out
    }
}

/// The locked cache folder: layout, state and manifest files.
pub struct CacheDir {
    root: PathBuf,
    _lock: File,
    scan: SourceScan,
    /// Where the side files (`--replicate`) are read from, if the source has any.
    replicated: Option<side::Replicated>,
}

/// Where this mount's index came from, for the status: scanned now, or loaded from the
/// cache (then files added, changed or removed in the source since are not seen).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct SourceScan {
    /// When the index was built from the source (seconds since 1970), if known.
    pub scanned_at: Option<u64>,
    /// Whether this mount scanned the source (a first mount, `--rescan`, a rebuilt cache).
    pub scanned_this_mount: bool,
    /// Whether the view may show what the source no longer holds (or miss what it gained).
    pub stale_possible: bool,
    /// After `--rescan` found another index: cached samples kept, and dropped (gone or
    /// changed in the source).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped: Option<u64>,
}

impl CacheDir {
    /// Whether `root` may become (or is) a cache folder: missing, empty, or a shufflefs
    /// cache already; otherwise [`CacheError::Foreign`] names what is in it (see `own`).
    pub fn check_takeable(root: &Path) -> Result<(), CacheError> {
        let found = own::foreign_entries(root).map_err(|source| CacheError::NotWritable {
            path: root.to_path_buf(),
            source,
        })?;
        if found.is_empty() {
            return Ok(());
        }
        Err(CacheError::Foreign {
            path: root.to_path_buf(),
            found,
        })
    }

    /// Creates (if needed) and locks `root`. Fails if another daemon holds it, or if it is a
    /// folder of someone else's (`check_takeable`).
    pub fn open(root: &Path) -> Result<CacheDir, CacheError> {
        let not_writable = |source| CacheError::NotWritable {
            path: root.to_path_buf(),
            source,
        };
        Self::check_takeable(root)?;
        private::create_dir(root).map_err(not_writable)?;
        let lock_path = root.join("LOCK");
        let mut lock = private::file_options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(not_writable)?;
        if lock.try_lock().is_err() {
            return Err(CacheError::InUse {
                path: root.to_path_buf(),
                holder: holder(&lock_path),
            });
        }
        lock.set_len(0).map_err(not_writable)?;
        write!(lock, "{}", std::process::id()).map_err(not_writable)?;
        let marker = root.join(own::MARKER);
        if !marker.exists() {
            private::create_file(&marker)
                .and_then(|mut f| {
                    f.write_all(
                        b"a shufflefs cache folder: shufflefs removes only its own files in it\n",
                    )
                })
                .map_err(not_writable)?;
        }
        Ok(CacheDir {
            root: root.to_path_buf(),
            _lock: lock,
            scan: SourceScan::default(),
            replicated: None,
        })
    }

    /// Where this mount's index came from (see [`SourceScan`]).
    pub fn source_scan(&self) -> &SourceScan {
        &self.scan
    }

    pub fn set_source_scan(&mut self, scan: SourceScan) {
        self.scan = scan;
    }

    /// Where the side files are read from (see [`side`]), if the source has any.
    pub fn replicated(&self) -> Option<&side::Replicated> {
        self.replicated.as_ref()
    }

    pub fn set_replicated(&mut self, replicated: side::Replicated) {
        self.replicated = Some(replicated);
    }

    /// Gives each cached sample file (`files` layout) the id `carry` says, with its length
    /// and mtime, or drops it (`None`): what `--rescan` keeps of a cache built on another
    /// index. Files move through `tmp/` so that no new name meets an old one; a crash half
    /// way leaves files under `tmp/` (removed at the next start) and no state file (the
    /// caller forgot it first), so the next start rebuilds rather than misnames. Returns
    /// (kept, dropped).
    pub fn carry_samples(
        &self,
        carry: &dyn Fn(SampleId, (u64, Option<std::time::SystemTime>)) -> Option<SampleId>,
    ) -> Result<(u64, u64), CacheError> {
        let (samples, tmp) = (self.root.join("samples"), self.root.join("tmp"));
        let io = self.io_err();
        let entries = match fs::read_dir(&samples) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((0, 0)),
            Err(e) => return Err(io(e)),
        };
        private::create_dir(&tmp).map_err(&io)?;
        let (mut moved, mut dropped) = (Vec::new(), 0);
        for entry in entries {
            let entry = entry.map_err(&io)?;
            let name = entry.file_name();
            // Only our own files: a sample id, a regular file.
            let Some(id) = name
                .to_str()
                .and_then(|n| own::is_sample_name(n).then(|| n.parse().ok()))
                .flatten()
            else {
                continue;
            };
            let meta = entry.metadata().map_err(&io)?;
            if !meta.is_file() {
                continue;
            }
            match carry(id, (meta.len(), meta.modified().ok())) {
                Some(new) => {
                    fs::rename(entry.path(), tmp.join(format!("{new}"))).map_err(&io)?;
                    moved.push(new);
                }
                None => {
                    fs::remove_file(entry.path()).map_err(&io)?;
                    dropped += 1;
                }
            }
        }
        for new in &moved {
            fs::rename(tmp.join(format!("{new}")), samples.join(format!("{new}"))).map_err(&io)?;
        }
        Ok((moved.len() as u64, dropped))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Releases the folder lock early: a rank that is done serving but waits for its peers
    /// in MPI finalize lets `shufflefs unmount` (and a new daemon) see that it is finished.
    pub fn unlock(&self) {
        let _ = self._lock.unlock();
    }

    /// Whether a daemon holds the lock of the cache folder at `root`.
    pub fn is_locked(root: &Path) -> bool {
        match File::open(root.join("LOCK")) {
            Ok(f) => f.try_lock_shared().is_err(),
            Err(_) => false,
        }
    }

    pub(crate) fn io_err(&self) -> impl Fn(io::Error) -> CacheError + '_ {
        |source| CacheError::Io {
            path: self.root.clone(),
            source,
        }
    }

    pub fn load_state(&self) -> Result<Option<CacheState>, CacheError> {
        match fs::read(self.root.join("state.json")) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|e| CacheError::Corrupt {
                        path: self.root.clone(),
                        what: "a state file",
                        detail: e.to_string(),
                    })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io_err()(e)),
        }
    }

    pub fn save_state(&self, state: &CacheState) -> Result<(), CacheError> {
        let bytes = serde_json::to_vec_pretty(state).expect("state serializes");
        write_atomic(&self.root, "state.json", &bytes).map_err(self.io_err())
    }

    /// The saved manifest, if there is one whose encoding has `fingerprint` (the one the
    /// state file names); a missing or stale one is `None`, and the source is scanned.
    pub fn load_manifest(&self, fingerprint: u32) -> Result<Option<Manifest>, CacheError> {
        match fs::read(self.root.join("manifest.bin")) {
            Ok(bytes) if crate::dataset::manifest::fingerprint_of(&bytes) != fingerprint => {
                Ok(None)
            }
            Ok(bytes) => Manifest::decode(&bytes)
                .map(Some)
                .map_err(|e| CacheError::Corrupt {
                    path: self.root.clone(),
                    what: "a manifest",
                    detail: e.to_string(),
                }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io_err()(e)),
        }
    }

    /// Saves the encoded manifest, unless the file already holds exactly these bytes.
    ///
    /// No fsync: the state file names the manifest by fingerprint and `load_manifest` uses
    /// only a file that matches it, so a save torn or lost by a crash costs the next start a
    /// rescan, nothing else. (With the fsync, saving took ~0.05 s of start-up at 1 M samples.)
    /// The comparison reads the saved file a piece at a time, not whole beside the manifest.
    pub fn save_manifest(&self, encoded: &[u8]) -> Result<(), CacheError> {
        if same_contents(&self.root.join("manifest.bin"), encoded) {
            return Ok(());
        }
        replace(&self.root, "manifest.bin", encoded, false).map_err(self.io_err())
    }

    /// Removes a saved manifest, if any (a rank whose cache never reads it: see the start-up).
    pub fn forget_manifest(&self) -> Result<(), CacheError> {
        match fs::remove_file(self.root.join("manifest.bin")) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(self.io_err()(e)),
            _ => Ok(()),
        }
    }

    /// Forgets the saved state (the cache is being rebuilt for other settings).
    pub fn forget_state(&self) -> Result<(), CacheError> {
        match fs::remove_file(self.root.join("state.json")) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(self.io_err()(e)),
            _ => Ok(()),
        }
    }

    /// The backend storing this folder's samples: one file per sample.
    pub(crate) fn file_backend(&self, samples: u64) -> Result<FileBackend, CacheError> {
        self.file_backend_for(samples, 1)
    }

    /// [`CacheDir::file_backend`] for a job of `world` ranks (`table`).
    fn file_backend_for(&self, samples: u64, world: u32) -> Result<FileBackend, CacheError> {
        FileBackend::open_for(&self.root, samples, world).map_err(|source| {
            CacheError::NotWritable {
                path: self.root.clone(),
                source,
            }
        })
    }

    /// The backend of `layout` storing this folder's samples.
    pub fn backend(
        &self,
        layout: CacheLayout,
        samples: u64,
    ) -> Result<Box<dyn CacheBackend>, CacheError> {
        self.backend_for(layout, samples, 1)
    }

    /// [`CacheDir::backend`] for a job of `world` ranks (`table`).
    pub fn backend_for(
        &self,
        layout: CacheLayout,
        samples: u64,
        world: u32,
    ) -> Result<Box<dyn CacheBackend>, CacheError> {
        Ok(match layout {
            CacheLayout::Files => Box::new(self.file_backend_for(samples, world)?),
            CacheLayout::Packed => Box::new(
                PackedBackend::open(&self.root, samples, world).map_err(|source| {
                    CacheError::NotWritable {
                        path: self.root.clone(),
                        source,
                    }
                })?,
            ),
        })
    }

    /// Deletes what the layouts other than `layout` stored here (a cache being rebuilt in
    /// another layout would otherwise keep the old copy's disk space).
    pub fn remove_other_layouts(&self, layout: CacheLayout) -> Result<(), CacheError> {
        let others: &[&str] = match layout {
            CacheLayout::Files => &[packed::SEGMENTS],
            CacheLayout::Packed => &["samples", "tmp"],
        };
        for name in others {
            let left = own::remove_sub(&self.root, name).map_err(self.io_err())?;
            if !left.is_empty() {
                tracing::warn!(folder = %self.root.display(), left = ?left, "left files shufflefs did not make");
            }
        }
        Ok(())
    }
}

/// Up to five of `names`, and how many more.
/// The lock holder, as " (pid N)" for [`CacheError::InUse`]. The holder writes its pid right
/// after it takes the lock, so a daemon started at the same moment (ranks sharing a folder)
/// may find the file still empty: it looks again for a moment before saying "unknown".
fn holder(lock_path: &Path) -> String {
    for _ in 0..50 {
        let pid = fs::read_to_string(lock_path).unwrap_or_default();
        let pid = pid.trim();
        if !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) {
            return format!(" (pid {pid})");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    " (pid unknown)".to_string()
}

fn list_names(names: &[String]) -> String {
    let shown: Vec<&str> = names.iter().take(5).map(String::as_str).collect();
    match names.len() {
        n if n > 5 => format!("{} and {} more", shown.join(", "), n - 5),
        _ => shown.join(", "),
    }
}

/// Writes `name` under `dir` so that a crash leaves the old or the new content, never a mix.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    replace(dir, name, bytes, true)
}

/// Writes `name` under a temporary name, then renames it over the old one; `durable` adds
/// the fsyncs that make the new content survive a crash (without them a crash may leave the
/// old content, the new, or an empty file).
fn replace(dir: &Path, name: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
    let how = crate::sys::replace::Replace {
        mode: private::FILE_MODE,
        durable,
    };
    crate::sys::replace::replace(&dir.join(name), bytes, how)
}

/// Whether the file at `path` holds exactly `bytes` (read in pieces; false if unreadable).
fn same_contents(path: &Path, bytes: &[u8]) -> bool {
    use std::io::Read;
    let Ok(mut file) = fs::File::open(path) else {
        return false;
    };
    if file.metadata().map(|m| m.len()).ok() != Some(bytes.len() as u64) {
        return false;
    }
    let mut piece = vec![0u8; 1 << 20];
    let mut rest = bytes;
    loop {
        match file.read(&mut piece) {
            Ok(0) => return rest.is_empty(),
            Ok(n) if n <= rest.len() && piece[..n] == rest[..n] => rest = &rest[n..],
            Ok(_) | Err(_) => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A manifest is saved unless the same bytes are there (compared a piece at a time),
    /// and forgotten without complaint when there is none.
    #[test]
    fn a_saved_manifest_is_compared_replaced_and_forgotten() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CacheDir::open(&tmp.path().join("c")).unwrap();
        let path = dir.root().join("manifest.bin");
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        assert!(!same_contents(&path, &big));
        dir.save_manifest(&big).unwrap();
        assert!(same_contents(&path, &big));
        let mut other = big.clone();
        other[2_500_000] ^= 1;
        assert!(!same_contents(&path, &other));
        assert!(!same_contents(&path, &big[..big.len() - 1]));
        dir.save_manifest(&other).unwrap();
        assert_eq!(fs::read(&path).unwrap(), other);
        dir.forget_manifest().unwrap();
        assert!(!path.exists());
        dir.forget_manifest().unwrap();
    }

    /// A second daemon on a held folder is told the holder's pid and how ranks share a host.
    #[test]
    fn a_held_folder_names_its_holder_and_the_rank_template() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("c");
        let _held = CacheDir::open(&root).unwrap();
        let err = CacheDir::open(&root).err().expect("refused").to_string();
        let pid = format!("(pid {})", std::process::id());
        assert!(err.contains(&pid), "{err}");
        assert!(err.contains("--cache /path/sfs-{rank}"), "{err}");
        // A holder that has not written its pid yet is "unknown", not an empty pid.
        fs::write(root.join("LOCK"), "").unwrap();
        let err = CacheDir::open(&root).err().expect("refused").to_string();
        assert!(err.contains("(pid unknown)"), "{err}");
    }

    fn state() -> CacheState {
        CacheState {
            format: FORMAT_VERSION,
            source: "/data".into(),
            seed: 7,
            fraction: 0.3,
            world_size: 4,
            rank: 1,
            manifest_fingerprint: 0xabcd,
            epoch: 3,
            exchange_scope: ExchangeScope::Global,
            hosts: None,
            world_history: Vec::new(),
            layout: CacheLayout::Files,
            scanned_at: None,
        }
    }

    /// A resized job records its eras; the world size stays the current one, and a state
    /// whose eras contradict it is refused.
    #[test]
    fn world_history_round_trips_and_is_checked() {
        let mut s = state();
        let history = History::new(4)
            .resized(2, 2)
            .unwrap()
            .resized(5, 3)
            .unwrap();
        s.set_history(&history);
        assert_eq!(s.world_size, 3);
        let text = serde_json::to_string(&s).unwrap();
        assert!(
            text.contains(r#""world_history":[{"epoch":0,"world":4}"#),
            "{text}"
        );
        let loaded: CacheState = serde_json::from_str(&text).unwrap();
        assert_eq!(loaded.history().unwrap(), history);
        s.world_size = 2;
        assert!(s.history().is_err());
        s.set_history(&History::new(2));
        assert!(s.world_history.is_empty() && s.history().unwrap() == History::new(2));
    }

    /// A state file written before `--exchange-scope` existed loads as global scope, and a
    /// global one is still written without the new fields.
    #[test]
    fn old_state_files_are_global_and_global_ones_unchanged() {
        let old = r#"{"format": FORMAT, "source": "/data", "seed": 7, "fraction": 0.3,
            "world_size": 4, "rank": 1, "manifest_fingerprint": 43981, "epoch": 3}"#;
        let old = old.replace("FORMAT", &FORMAT_VERSION.to_string());
        let loaded: CacheState = serde_json::from_str(&old).unwrap();
        assert_eq!(loaded, state());
        let written = serde_json::to_string(&state()).unwrap();
        assert!(!written.contains("exchange_scope") && !written.contains("hosts"));
    }

    #[test]
    fn node_scope_state_round_trips() {
        let node = CacheState {
            exchange_scope: ExchangeScope::Node,
            hosts: Some(vec![0, 0, 1, 1]),
            ..state()
        };
        let text = serde_json::to_string(&node).unwrap();
        assert!(text.contains(r#""exchange_scope":"node""#), "{text}");
        assert_eq!(serde_json::from_str::<CacheState>(&text).unwrap(), node);
    }

    #[test]
    fn scope_and_host_layout_are_differences() {
        let node = |hosts: &[u32]| CacheState {
            exchange_scope: ExchangeScope::Node,
            hosts: Some(hosts.to_vec()),
            ..state()
        };
        assert_eq!(
            state().differences(&node(&[0, 0, 1, 1])),
            ["--exchange-scope: cache has global, now node"]
        );
        // Relabelled hosts are the same layout.
        assert!(
            node(&[0, 0, 1, 1])
                .differences(&node(&[5, 5, 2, 2]))
                .is_empty()
        );
        let diff = node(&[0, 0, 1, 1]).differences(&node(&[0, 1, 2, 3]));
        assert_eq!(diff.len(), 1);
        assert!(
            diff[0]
                .contains("cache has 2 hosts (ranks 0-1 | 2-3), now 4 hosts (ranks 0 | 1 | 2 | 3)"),
            "{}",
            diff[0]
        );
    }
}
