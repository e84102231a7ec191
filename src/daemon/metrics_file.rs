//! `--metrics-file`: a thread that writes this rank's metrics (`node::metrics`) every
//! [`EVERY`], atomically (a temporary file in the same folder, then a rename, as
//! node_exporter's textfile collector expects), and once more as it stops. The file stays
//! after the daemon exits: the collector then shows the job's last values, as it does for
//! any batch job.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{RecvTimeoutError, Sender, channel};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::node::status::StatusReport;
use crate::sys::replace::{Replace, can_write_beside, replace};

pub(crate) const EVERY: Duration = Duration::from_secs(5);

/// The writer; dropping it writes a last time and ends the thread.
pub(crate) struct MetricsFile {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// `template` with `{rank}` and `{host}` replaced.
pub(crate) fn path_for(template: &str, rank: u32, host: &str) -> PathBuf {
    PathBuf::from(
        template
            .replace("{rank}", &rank.to_string())
            .replace("{host}", host),
    )
}

/// Refuses a `template` that ranks of one host would share: without `{rank}`, while some
/// host (`hosts`: each rank's host) runs more than one rank, they would overwrite each
/// other's file every few seconds. Every rank decides alike (start-up's settings phase).
pub(crate) fn check(template: Option<&str>, hosts: &[u32]) -> Result<(), String> {
    let Some(template) = template.filter(|t| !t.contains("{rank}")) else {
        return Ok(());
    };
    let mut seen = std::collections::HashSet::new();
    match hosts.iter().find(|&&h| !seen.insert(h)) {
        None => Ok(()),
        Some(_) => Err(format!(
            "--metrics-file {template} lacks {{rank}} while a host runs several ranks: they \
             would overwrite each other's file; put {{rank}} in the name"
        )),
    }
}

/// [`check_path`] for this rank's file of `template` (none: nothing to check).
pub(crate) fn check_rank(template: Option<&str>, rank: u32) -> Result<(), String> {
    let host = crate::node::jobview::hostname();
    template.map_or(Ok(()), |t| check_path(&path_for(t, rank, &host)))
}

/// How every metrics file shufflefs writes begins (`node::metrics` renders its families
/// in order, each under a `# HELP shufflefs_…` line).
const OURS: &[u8] = b"# HELP shufflefs_";

/// Refuses this rank's metrics `path` before anything is mounted, rather than a warning
/// nobody reads and a file never written: its folder must exist and take a file, and a
/// file already there must be one shufflefs wrote (empty, or beginning with [`OURS`]):
/// shufflefs never overwrites a file it did not create.
pub(crate) fn check_path(path: &Path) -> Result<(), String> {
    let shown = path.display();
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !folder.is_dir() {
        return Err(format!(
            "--metrics-file {shown}: the folder {} does not exist; create it (mkdir -p {}) \
             or give a path in an existing folder",
            folder.display(),
            folder.display()
        ));
    }
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("--metrics-file {shown}: {e}")),
        Ok(m) if !m.is_file() => {
            return Err(format!(
                "--metrics-file {shown} exists and is not a regular file; give another path"
            ));
        }
        Ok(_) if !written_by_us(path) => {
            return Err(format!(
                "--metrics-file {shown} exists and is not a metrics file shufflefs wrote (it \
                 does not begin with \"# HELP shufflefs_\"): shufflefs never overwrites a \
                 file it did not create; move it away or give another path"
            ));
        }
        Ok(_) => {}
    }
    // The folder takes a file: the temporary one `write` would make, made and removed.
    can_write_beside(path).map_err(|e| {
        format!(
            "--metrics-file {shown}: cannot write in the folder {}: {e}",
            folder.display()
        )
    })?;
    Ok(())
}

/// Whether the file at `path` is empty or begins as every metrics file shufflefs writes.
fn written_by_us(path: &Path) -> bool {
    use std::io::Read;
    let mut head = Vec::with_capacity(OURS.len());
    let read =
        std::fs::File::open(path).and_then(|f| f.take(OURS.len() as u64).read_to_end(&mut head));
    read.is_ok() && (head.is_empty() || head == OURS)
}

impl MetricsFile {
    pub(crate) fn start(path: PathBuf, status: Arc<dyn StatusReport>) -> MetricsFile {
        let (tx, rx) = channel();
        let spawned = std::thread::Builder::new()
            .name("metrics-file".into())
            .spawn(move || {
                let mut warned = false;
                loop {
                    if let Err(e) = write(&path, &status.metrics()) {
                        if !warned {
                            tracing::warn!(path = %path.display(), error = %e, "cannot write the metrics file");
                        }
                        warned = true;
                    }
                    match rx.recv_timeout(EVERY) {
                        Err(RecvTimeoutError::Timeout) => {}
                        // Told to stop, or the daemon is gone: a last write.
                        _ => {
                            let _ = write(&path, &status.metrics());
                            return;
                        }
                    }
                }
            });
        match spawned {
            Ok(thread) => MetricsFile {
                stop: Some(tx),
                thread: Some(thread),
            },
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the metrics file's thread");
                MetricsFile {
                    stop: None,
                    thread: None,
                }
            }
        }
    }
}

impl Drop for MetricsFile {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Writes `bytes` to `path` through a temporary file beside it (`sys::replace`: hidden,
/// and not ending in .prom, so a collector never reads it).
fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let how = Replace {
        mode: 0o666,
        durable: false,
    };
    replace(path, bytes, how)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl StatusReport for Fixed {
        fn render(&self) -> Vec<u8> {
            Vec::new()
        }
        fn metrics(&self) -> Vec<u8> {
            b"shufflefs_epoch{rank=\"0\"} 1\n".to_vec()
        }
    }

    #[test]
    fn a_file_name_without_rank_is_refused_when_a_host_runs_several_ranks() {
        assert!(check(None, &[0, 0]).is_ok());
        assert!(check(Some("/m/sfs-{rank}.prom"), &[0, 0]).is_ok());
        assert!(check(Some("/m/sfs-{host}.prom"), &[0, 1, 2]).is_ok());
        let e = check(Some("/m/sfs-{host}.prom"), &[0, 1, 1]).unwrap_err();
        assert!(e.contains("lacks {rank}"), "{e}");
    }

    #[test]
    fn a_missing_folder_or_a_file_shufflefs_did_not_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nofolder/m-0.prom");
        let e = check_path(&missing).unwrap_err();
        assert!(e.contains("nofolder") && e.contains("mkdir -p"), "{e}");

        let mine = dir.path().join("m-0.prom");
        std::fs::write(&mine, "my own data").unwrap();
        let e = check_path(&mine).unwrap_err();
        assert!(
            e.contains("m-0.prom") && e.contains("never overwrites"),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&mine).unwrap(), "my own data");

        // Empty, or one shufflefs wrote (a remount over the last job's file): accepted.
        std::fs::write(&mine, "").unwrap();
        check_path(&mine).unwrap();
        std::fs::write(&mine, "# HELP shufflefs_epoch The epoch\n").unwrap();
        check_path(&mine).unwrap();
        check_path(&dir.path().join("new.prom")).unwrap();
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "the check leaves no temporary file");
    }

    #[test]
    fn the_file_is_written_at_once_and_at_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let template = format!("{}/sfs-{{host}}-{{rank}}.prom", dir.path().display());
        let path = path_for(&template, 3, "node7");
        assert!(path.ends_with("sfs-node7-3.prom"));
        let writer = MetricsFile::start(path.clone(), Arc::new(Fixed));
        // The first write, then it is removed: the last write makes it again.
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while !path.exists() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::remove_file(&path).unwrap();
        drop(writer);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "shufflefs_epoch{rank=\"0\"} 1\n");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file is left");
    }
}
