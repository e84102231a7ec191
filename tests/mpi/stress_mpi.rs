//! Under load: real `mpirun -np 4`, 8 reader processes per mount (32 at once), 5 epochs, each
//! reader opening every file of its epoch in a random order with random partial reads, every
//! byte compared with the source (`tests/stress/reader.py`); zero errors allowed. Then readers
//! that keep reading are running when every rank is unmounted (`shufflefs unmount --lazy`, as a
//! SIGTERM from `shufflefs-teardown` does for a mount with files open): the readers end, the
//! daemons exit, nothing stays mounted.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::mpi_job::MpiJob;
use crate::common::*;
use shufflefs::sys::mounts::is_mounted;

const RANKS: u32 = 4;
const READERS: usize = 8;
const EPOCHS: u64 = 5;

fn reader(view: &Path, source: &Path, seed: usize, until_gone: bool) -> Child {
    let mut cmd = Command::new("python3");
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/stress/reader.py"))
        .arg(view)
        .arg(source)
        .arg(seed.to_string());
    if until_gone {
        cmd.arg("--until-gone");
    }
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(child: Child, what: &str) -> String {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn eight_readers_per_rank_over_five_epochs_then_unmount_under_load() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let source = dir.join("src");
    for c in 0..4u32 {
        let class = source.join(format!("class {c}"));
        std::fs::create_dir_all(&class).unwrap();
        for i in 0..60u32 {
            let len = (i * 7919 + c * 104_729) % 200_000;
            let bytes: Vec<u8> = (0..len).map(|o| (o ^ (i * 31 + c * 7)) as u8).collect();
            std::fs::write(class.join(format!("{i:03}.bin")), bytes).unwrap();
        }
    }
    let job = MpiJob::start(dir, RANKS, 4, 0.4, &[]);
    let mut total = 0u64;
    for epoch in 0..EPOCHS {
        let readers: Vec<_> = (0..RANKS as usize)
            .flat_map(|r| {
                let view = job.mounts[r].join(format!("epoch-{epoch}"));
                let source = source.clone();
                (0..READERS).map(move |i| (r, reader(&view, &source, r * 100 + i, false)))
            })
            .collect();
        for (r, child) in readers {
            let out = finish(child, &format!("reader on rank {r}, epoch {epoch}"));
            total += out.trim().parse::<u64>().unwrap();
        }
    }
    assert!(total > 0);
    for r in 0..RANKS as usize {
        let st = job.status(r);
        assert_eq!(st["epoch"], EPOCHS - 1);
        assert_eq!(st["cache"]["checksum_failures"], 0, "{st:#}");
        assert_eq!(st["cache"]["source_errors"], 0, "{st:#}");
    }

    // Unmount while readers are busy.
    let readers: Vec<_> = (0..RANKS as usize)
        .flat_map(|r| {
            let view = job.mounts[r].join(format!("epoch-{}", EPOCHS - 1));
            let source = source.clone();
            (0..READERS).map(move |i| reader(&view, &source, 1000 + i, true))
        })
        .collect();
    // Every reader has listed its view and is reading before anything is unmounted.
    let mut started = Vec::new();
    for mut child in readers {
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert!(line.starts_with("listed"), "reader did not start: {line:?}");
        started.push((child, out));
    }
    let mut job = job;
    for m in &job.mounts {
        let out = shufflefs()
            .args(["unmount", "--lazy", "--timeout", "30"])
            .arg(m)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    for (child, mut stdout) in started {
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).unwrap();
        finish(child, "reader during unmount");
        assert!(rest.contains("mount gone"), "{rest}");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while job.child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "daemons still running after the unmount; job log:\n{}",
            std::fs::read_to_string(dir.join("job.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for m in std::mem::take(&mut job.mounts) {
        assert!(!is_mounted(&m), "{} still mounted", m.display());
    }
}
