//! Links planted by another user in the folders of `--metrics-file` and `--ready-file`
//! (folders others may write: a job folder, node_exporter's textfile folder) are never
//! written through. Before, the temporary of each write was `.NAME.<pid>.tmp`, opened with
//! O_CREAT|O_TRUNC: a link planted at that name had its target overwritten with the
//! daemon's rights, and was then renamed into place (this test failed so, with the daemon's
//! pid known as the shell's `$$` that execs it).

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;

/// Waits until `path` exists (the metrics thread's first write comes after the mount).
fn wait_for(path: &Path) {
    let deadline = Instant::now() + MOUNT_TIMEOUT;
    while fs::symlink_metadata(path).is_err() {
        assert!(
            Instant::now() < deadline,
            "{} never written",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn links_at_the_old_temporary_names_are_not_written_through() {
    if !require_fuse() {
        return;
    }
    let ds = standard_dataset();
    let victim = ds.path("victim");
    fs::write(&victim, "another user's file").unwrap();
    let (metrics, ready) = (ds.path("m.prom"), ds.path("job.ready"));
    // The links the other user plants: the pid-numbered temporaries, and the
    // number-free ones, beside both files.
    let script = format!(
        "for n in .m.prom.$$.tmp .job.ready.$$.tmp .m.prom.tmp .job.ready.tmp; do ln -s '{}' '{}'/$n || exit 9; done",
        victim.display(),
        metrics.parent().unwrap().display()
    );
    let extra = [
        "--metrics-file",
        metrics.to_str().unwrap(),
        "--ready-file",
        ready.to_str().unwrap(),
    ];
    let mnt = ds.path("mnt");
    let args = mount_args(&ds.root, &ds.path("cache"), &mnt, &extra);
    let daemon = match Daemon::try_start_with(shufflefs_after(&script), &mnt, &args) {
        Ok(d) => d,
        Err(r) => panic!("mount refused ({:?}): {}", r.status, r.stderr),
    };
    wait_for(&ready);
    wait_for(&metrics);
    assert_eq!(
        fs::read_to_string(&victim).unwrap(),
        "another user's file",
        "the link's target was written"
    );
    for file in [&metrics, &ready] {
        let meta = fs::symlink_metadata(file).unwrap();
        assert!(meta.is_file(), "{} is not a regular file", file.display());
    }
    assert!(
        fs::read_to_string(&metrics)
            .unwrap()
            .starts_with("# HELP shufflefs_")
    );
    let record: serde_json::Value = serde_json::from_slice(&fs::read(&ready).unwrap()).unwrap();
    assert_eq!(record["world_size"], 1);
    daemon.unmount().assert_clean();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "another user's file");
}
