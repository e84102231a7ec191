//! A source that hangs (a parallel filesystem stuck on one file) must not stall the mount:
//! a request that has to copy a sample from the source waits off the request threads, so
//! cached samples and the control files keep answering, even with one request thread.

use std::fs;
use std::io::Write;
use std::sync::mpsc;
use std::time::Duration;

use crate::common::*;

#[test]
fn a_sample_stuck_on_the_source_does_not_stall_other_reads() {
    if !require_fuse() {
        return;
    }
    let data = DatasetBuilder::new()
        .class("fast", &[("one.bin", 3000)])
        .class("slow", &[("stuck.bin", 10)])
        .build();
    let (cache, mnt) = (data.path("cache"), data.dir("mnt"));
    // First mount: scan and save the manifest. The remount reuses it without a rescan, so
    // the sample can turn into a FIFO, whose open blocks until somebody writes to it.
    Daemon::mount(&data.root, &cache, &mnt, &[])
        .unmount()
        .assert_clean();
    for f in fs::read_dir(cache.join("samples")).unwrap() {
        fs::remove_file(f.unwrap().path()).unwrap();
    }
    let fifo = data.root.join("slow/stuck.bin");
    fs::remove_file(&fifo).unwrap();
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();

    let d = Daemon::mount(&data.root, &cache, &mnt, &["--fuse-threads", "1"]);
    let e0 = mnt.join("epoch-0");
    wait_for_status(&mnt, "the fast sample to be staged", |s| {
        s["staging"]["files_done"].as_u64() == Some(1)
    });
    let (stuck_tx, stuck_rx) = mpsc::channel();
    let stuck_path = e0.join("slow/stuck.bin");
    std::thread::spawn(move || {
        let _ = stuck_tx.send(fs::read(stuck_path));
    });
    std::thread::sleep(Duration::from_millis(300));

    // Meanwhile everything else answers; on a watchdog, so a stalled mount fails the test.
    let (ok_tx, ok_rx) = mpsc::channel();
    let (fast, m) = (e0.join("fast/one.bin"), mnt.clone());
    std::thread::spawn(move || {
        let bytes = fs::read(&fast).unwrap();
        let status = read_status(&m);
        let _ = ok_tx.send((bytes, status));
    });
    let answered = ok_rx.recv_timeout(Duration::from_secs(30));
    let still_stuck = stuck_rx.try_recv().is_err();
    // Unblock the source either way, so the mount can end.
    let mut w = fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    w.write_all(b"now here\n").unwrap();
    drop(w);
    let (bytes, status) =
        answered.expect("a cached sample and the status answer while the source hangs");
    assert!(bytes == data.sample("fast", "one.bin").bytes());
    assert_eq!(status["staging"]["files_total"], 2, "{status:#}");
    assert!(still_stuck, "the stuck sample waited for its source");
    let got = stuck_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the stuck read finishes once the source answers");
    assert_eq!(got.unwrap(), b"now here\n");
    d.unmount().assert_clean();
}
