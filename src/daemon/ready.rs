//! The job's ready record (`--ready-file PATH`): written by rank 0 once every rank's mount
//! answers, removed when rank 0 stops.
//!
//! On a cluster the mounts live on many hosts and a launcher sees only its own, so it cannot
//! wait on each rank's `.shufflefs/status`. The ranks can tell instead: after the mount
//! (the agreed last phase of start-up) and before the first exchange, each rank checks that
//! its own mount answers (a lookup and `getattr` of its status file through the kernel), and
//! the ranks gather the outcome with each rank's host and mount point. Only if every rank
//! answered does rank 0 write the record, atomically (temporary file and rename in the same
//! folder), so a reader sees either nothing or the whole record. A file left from before is
//! removed as rank 0 starts, and the record is removed as soon as rank 0's mount ends, so a
//! file that exists always describes a live job. The gather runs whether or not a path was
//! given, so ranks started with different command lines cannot disagree on it.
//!
//! Rank 0 also prints the record on one line of its stdout (after [`READY_LINE`]), which
//! mpirun and srun forward to the launcher's host even where it does not share rank 0's
//! file system.
//!
//! The record (see docs/status.md, "Ready file"):
//! `{"world_size": N, "epoch": E, "ranks": [{"rank", "host", "mountpoint", "pid"}, ...]}`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::comm::Comm;
use crate::config::MountConfig;
use crate::sys::replace::{Replace, replace};

/// The start of the line on rank 0's stdout that carries the record (one line of JSON).
pub(crate) const READY_LINE: &str = "shufflefs: job ready ";

/// One rank's line of the record.
#[derive(Debug, Serialize, Deserialize)]
struct RankRecord {
    rank: u32,
    host: String,
    mountpoint: PathBuf,
    pid: u32,
}

/// The whole record rank 0 writes.
#[derive(Debug, Serialize)]
struct JobRecord {
    world_size: u32,
    epoch: u64,
    ranks: Vec<RankRecord>,
}

/// The record as written by this rank: removed on drop (rank 0 with `--ready-file` only).
#[derive(Debug, Default)]
pub(crate) struct ReadyFile {
    written: Option<PathBuf>,
}

/// Rank 0 removes a ready file left from before, so nothing says ready while it starts.
pub(crate) fn clear_stale(config: &MountConfig, rank: u32) {
    if let (0, Some(path)) = (rank, &config.ready_file) {
        if path.exists() && !is_ready_record(path) {
            tracing::error!(path = %path.display(), "--ready-file names something that is not a shufflefs ready record: leaving it alone (the record will go to rank 0's stdout only)");
            return;
        }
        match std::fs::remove_file(path) {
            Ok(()) => {
                tracing::info!(path = %path.display(), "removed a ready file left from before")
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove the old ready file")
            }
        }
    }
}

/// Collective, once every rank mounted: each rank checks its mount answers; if every one
/// does, rank 0 writes the record (when a path was given).
pub(crate) fn agree(
    config: &MountConfig,
    comm: &mut dyn Comm,
    mountpoint: &Path,
    epoch: u64,
) -> ReadyFile {
    let rank = comm.rank();
    let mine = answers(mountpoint).then(|| RankRecord {
        rank,
        host: hostname(),
        mountpoint: crate::sys::mounts::absolute(mountpoint)
            .unwrap_or_else(|| mountpoint.to_path_buf()),
        pid: std::process::id(),
    });
    let payload = mine.map_or_else(Vec::new, |r| serde_json::to_vec(&r).unwrap_or_default());
    let all = match comm.all_gather(&payload) {
        Ok(all) => all,
        Err(e) => {
            tracing::warn!(error = %e, "could not learn whether every rank's mount answers; no ready file");
            return ReadyFile::default();
        }
    };
    let (Some(path), 0) = (&config.ready_file, rank) else {
        return ReadyFile::default();
    };
    let ranks: Vec<RankRecord> = all
        .iter()
        .filter_map(|b| serde_json::from_slice(b).ok())
        .collect();
    if ranks.len() != all.len() {
        let missing: Vec<usize> = (0..all.len())
            .filter(|&r| !ranks.iter().any(|x| x.rank as usize == r))
            .collect();
        tracing::error!(?missing, path = %path.display(), "not every rank's mount answers; not writing the ready file");
        return ReadyFile::default();
    }
    let record = JobRecord {
        world_size: comm.size(),
        epoch,
        ranks,
    };
    // Also on stdout, which mpirun and srun forward to the launcher's host: a launcher that
    // cannot see rank 0's file system (or where the file cannot be written) reads it there.
    if let Ok(line) = serde_json::to_string(&record) {
        println!("{READY_LINE}{line}");
        let _ = std::io::Write::flush(&mut std::io::stdout());
    }
    if path.exists() && !is_ready_record(path) {
        tracing::error!(path = %path.display(), "cannot write the ready file: its path holds something that is not a shufflefs ready record, left alone (the record is on rank 0's stdout)");
        return ReadyFile::default();
    }
    match write_atomically(path, &record) {
        Ok(()) => {
            tracing::info!(path = %path.display(), "every rank's mount answers; wrote the ready file");
            ReadyFile {
                written: Some(path.clone()),
            }
        }
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "cannot write the ready file");
            ReadyFile::default()
        }
    }
}

impl Drop for ReadyFile {
    fn drop(&mut self) {
        if let Some(path) = self.written.take() {
            let _ = std::fs::remove_file(&path);
            tracing::info!(path = %path.display(), "removed the ready file");
        }
    }
}

/// Whether `path` holds a ready record (this job's or an earlier one's): the only kind of
/// file at `--ready-file` that rank 0 removes or replaces, so a mistyped path never costs a
/// user's file.
fn is_ready_record(path: &Path) -> bool {
    let Ok(bytes) = std::fs::read(path) else {
        return false;
    };
    serde_json::from_slice::<serde_json::Value>(&bytes)
        .is_ok_and(|v| v.get("world_size").is_some() && v.get("ranks").is_some())
}

/// Whether this rank's mount answers through the kernel.
fn answers(mountpoint: &Path) -> bool {
    std::fs::metadata(mountpoint.join(".shufflefs/status")).is_ok()
}

/// The host name of this rank (its UTS namespace's, as `hostname` prints it).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// The record replaces `path` whole (`sys::replace`: a launcher polling it never reads
/// half of one, and no link planted in a shared folder is written through).
fn write_atomically(path: &Path, record: &JobRecord) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(record).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let how = Replace {
        mode: 0o666,
        durable: false,
    };
    replace(path, &bytes, how)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};
    use crate::comm::LocalComm;

    fn config(dir: &Path) -> MountConfig {
        let ready = dir.join("job.ready");
        let argv = ["shufflefs", "mount", "--source", "/s", "--cache", "/c"];
        let tail = ["--ready-file", ready.to_str().unwrap(), "/m-{rank}"];
        match Cli::parse_from(argv.iter().chain(&tail)).command {
            Command::Mount(args) => MountConfig::try_from(args).unwrap(),
            _ => unreachable!(),
        }
    }

    /// Runs `agree` on three ranks whose "mounts" are folders holding `.shufflefs/status`
    /// (what a live mount answers), except those in `dead`: whether rank 0 wrote the file.
    fn agree_with(dead: &[u32]) -> Option<serde_json::Value> {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let handles: Vec<_> = LocalComm::world(3)
            .into_iter()
            .map(|mut comm| {
                let (config, dir) = (config.clone(), tmp.path().to_path_buf());
                let live = !dead.contains(&comm.rank());
                std::thread::spawn(move || {
                    let mnt = dir.join(format!("m-{}", comm.rank()));
                    std::fs::create_dir_all(mnt.join(".shufflefs")).unwrap();
                    if live {
                        std::fs::write(mnt.join(".shufflefs/status"), b"{}").unwrap();
                    }
                    let file = agree(&config, &mut comm, &mnt, 4);
                    let read = |p: &PathBuf| std::fs::read(p).unwrap();
                    let record = file.written.as_ref().map(read);
                    drop(file);
                    let path = config.ready_file.unwrap();
                    assert!(
                        record.is_none() || !path.exists(),
                        "removed with its holder"
                    );
                    record.map(|b| serde_json::from_slice(&b).unwrap())
                })
            })
            .collect();
        let mut records = handles.into_iter().map(|h| h.join().unwrap());
        let first = records.next().unwrap();
        assert!(records.all(|r| r.is_none()), "only rank 0 writes");
        first
    }

    #[test]
    fn written_only_when_every_rank_answers() {
        let record = agree_with(&[]).expect("every rank answers: written");
        assert_eq!(record["world_size"], 3);
        assert_eq!(record["epoch"], 4);
        for r in 0..3 {
            assert_eq!(record["ranks"][r]["rank"], r);
            let mnt = record["ranks"][r]["mountpoint"].as_str().unwrap();
            assert!(mnt.ends_with(&format!("m-{r}")), "{mnt}");
        }
        assert!(
            agree_with(&[2]).is_none(),
            "a rank that does not answer: no file"
        );
    }

    /// A file at `--ready-file` that is not a ready record is neither removed at start nor
    /// replaced once the ranks agree.
    #[test]
    fn a_foreign_file_at_the_path_is_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let path = config.ready_file.clone().unwrap();
        std::fs::write(&path, b"my notes").unwrap();
        clear_stale(&config, 0);
        let mut comm = LocalComm::world(1).pop().unwrap();
        let mnt = tmp.path().join("m-0");
        std::fs::create_dir_all(mnt.join(".shufflefs")).unwrap();
        std::fs::write(mnt.join(".shufflefs/status"), b"{}").unwrap();
        let file = agree(&config, &mut comm, &mnt, 0);
        assert!(file.written.is_none());
        drop(file);
        assert_eq!(std::fs::read(&path).unwrap(), b"my notes");
    }

    #[test]
    fn the_record_replaces_the_file_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("sub/job.ready");
        let record = JobRecord {
            world_size: 1,
            epoch: 2,
            ranks: vec![RankRecord {
                rank: 0,
                host: "h".into(),
                mountpoint: "/m".into(),
                pid: 7,
            }],
        };
        write_atomically(&path, &record).unwrap();
        std::fs::write(&path, br#"{"world_size": 9, "epoch": 0, "ranks": []}"#).unwrap();
        assert!(is_ready_record(&path), "an earlier job's record");
        write_atomically(&path, &record).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(v["world_size"], 1);
        assert_eq!(v["epoch"], 2);
        assert_eq!(v["ranks"][0]["host"], "h");
        assert_eq!(v["ranks"][0]["mountpoint"], "/m");
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file left");
        drop(ReadyFile {
            written: Some(path.clone()),
        });
        assert!(!path.exists());
    }
}
