//! Page-cache mode's status and metrics documents: the files `.shufflefs/status` and
//! `.shufflefs/metrics` link to (see `ShuffleFs::status_file`), kept off the cache's disk.

use std::path::{Path, PathBuf};

use super::{METRICS_FILE, STATUS_FILE};

/// Where page-cache mode writes the status and metrics documents its links point to: a
/// private folder in memory (`/dev/shm/shufflefs-XXXXXX`, 0700, removed with the view), so
/// that a full cache disk, when the status matters most, never makes them unreadable (each
/// rendering is a new file renamed over the old); the cache folder where no such folder can
/// be made.
pub(super) struct PublishDir {
    pub(super) path: PathBuf,
    _memory: Option<tempfile::TempDir>,
}

/// Where [`PublishDir`] makes its folder.
const MEMORY: &str = "/dev/shm";

impl PublishDir {
    pub(super) fn new(cache: &Path) -> PublishDir {
        use std::os::unix::fs::PermissionsExt;
        sweep_dead_publish_dirs(Path::new(MEMORY));
        let private = std::fs::Permissions::from_mode(0o700);
        let prefix = format!("shufflefs-{}-{}-", pid_namespace(), std::process::id());
        let memory = (tempfile::Builder::new().prefix(&prefix))
            .permissions(private)
            .tempdir_in(MEMORY)
            .ok();
        let path = match &memory {
            Some(dir) => dir.path().to_path_buf(),
            None => cache.to_path_buf(),
        };
        PublishDir {
            path,
            _memory: memory,
        }
    }
}

/// This process's pid namespace (the number in `/proc/self/ns/pid`'s `pid:[N]`; 0 if
/// unknown): a pid names a process only within it, and containers may share `/dev/shm`.
fn pid_namespace() -> u64 {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .and_then(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
        })
        .unwrap_or(0)
}

/// Removes the folders a killed daemon of this user left in `dir`: named
/// `shufflefs-NS-PID-XXXXXX` for this pid namespace and a PID no longer running, owned by
/// this user, holding nothing but the documents [`PublishDir`] writes (so nothing shufflefs
/// did not make goes, and no live daemon's folder in another container sharing the folder).
fn sweep_dead_publish_dirs(dir: &Path) {
    let ns = pid_namespace().to_string();
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let me = nix::unistd::geteuid().as_raw();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = (name.to_str())
            .and_then(|n| n.strip_prefix("shufflefs-"))
            .and_then(|n| n.strip_prefix(ns.as_str()))
            .and_then(|n| n.strip_prefix('-'))
            .and_then(|n| n.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let path = entry.path();
        let ours = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir() && m.uid() == me);
        if !ours || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let only_documents = std::fs::read_dir(&path).is_ok_and(|files| {
            files.flatten().all(|f| {
                let n = f.file_name();
                n == STATUS_FILE || n == METRICS_FILE || n.to_string_lossy().starts_with('.')
            })
        });
        if only_documents {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{pid_namespace, sweep_dead_publish_dirs};
    use std::fs;

    #[test]
    fn only_a_dead_daemons_folders_of_documents_are_swept() {
        let shm = tempfile::tempdir().unwrap();
        let dead = 999_999_999u32; // past any pid_max
        let mine = std::process::id();
        let ns = pid_namespace();
        assert!(ns > 0);
        let folder = |name: &str, files: &[&str]| {
            let d = shm.path().join(name);
            fs::create_dir(&d).unwrap();
            for f in files {
                fs::write(d.join(f), "x").unwrap();
            }
            d
        };
        let gone = folder(
            &format!("shufflefs-{ns}-{dead}-a1"),
            &["status.json", ".status.json.x.tmp"],
        );
        let empty = folder(&format!("shufflefs-{ns}-{dead}-a2"), &[]);
        let alive = folder(&format!("shufflefs-{ns}-{mine}-b"), &["status.json"]);
        let foreign = folder(
            &format!("shufflefs-{ns}-{dead}-c"),
            &["status.json", "notes.txt"],
        );
        let elsewhere = folder(&format!("shufflefs-{}-{dead}-e", ns + 1), &["status.json"]);
        let other = folder("shufflefs-notapid-d", &[]);
        sweep_dead_publish_dirs(shm.path());
        assert!(!gone.exists() && !empty.exists());
        assert!(alive.exists() && foreign.exists() && other.exists() && elsewhere.exists());
    }
}
