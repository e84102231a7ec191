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

/// Writes `bytes` to `path` through a temporary file beside it (hidden, and not ending in
/// .prom, so a collector never reads it).
fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
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
