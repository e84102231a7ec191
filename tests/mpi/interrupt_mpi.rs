//! A writer waiting on an advance that cannot finish can be killed, is told what it waits
//! for, and is released by an unmount, under real `mpirun -np 2`.
//!
//! Rank 0 moves on to epoch 1 alone, so its exchange into epoch 2 waits on rank 1, which
//! stays at epoch 0. `echo 2 > .shufflefs/epoch` on rank 0 then waits for as long as rank 1
//! does (forever, here). The kernel keeps such a writer in state D until the daemon
//! answers its request, whatever signal it gets, so the daemon must answer when the writer
//! is signalled (SIGKILL, or `timeout`'s SIGTERM), and every waiting writer when the mount
//! is detached (`shufflefs unmount --lazy`). Meanwhile rank 0's status says what it waits
//! for (`advance_waiting`).

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::common::mpi_job::MpiJob;
use crate::common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use shufflefs::sys::mounts::is_mounted;

/// A child process that must not outlive the test, even if it is stuck.
struct Writer(Child);

impl Writer {
    /// `sh -c 'echo 2 > MNT/.shufflefs/epoch'`, behind `prefix` (e.g. `timeout 2`).
    fn start(prefix: &[&str], mnt: &Path) -> Writer {
        let script = format!("echo 2 > '{}'", mnt.join(".shufflefs/epoch").display());
        let mut cmd = match prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg("sh");
                c
            }
            None => Command::new("sh"),
        };
        let child = cmd
            .arg("-c")
            .arg(script)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Writer(child)
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.0.id() as i32)
    }

    /// Its exit status once reaped, within `timeout`.
    fn exited_within(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Its state letter in `/proc` (`D`: waiting in the kernel), for the failure messages.
    fn state(&self) -> String {
        std::fs::read_to_string(format!("/proc/{}/stat", self.0.id()))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, r)| r.trim_start()[..1].to_string())
            })
            .unwrap_or_else(|| "gone".into())
    }

    /// Asserts it is still waiting after `wait`.
    #[track_caller]
    fn assert_waits(&mut self, wait: Duration) {
        assert!(
            self.exited_within(wait).is_none(),
            "the write of epoch 2 should wait on rank 1, which never exchanges"
        );
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.0.kill();
    }
}

#[test]
fn a_writer_waiting_on_a_peer_can_be_killed_and_is_released_by_an_unmount() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let ds = DatasetBuilder::new()
        .numbered_class("cat", 30, |i| 2_000 + i as u64)
        .numbered_class("dog", 30, |i| 3_000 + i as u64)
        .build();
    let mut job = MpiJob::start(&ds.base, 2, 3, 0.5, &[]);
    let (mnt0, mnt1) = (job.mounts[0].clone(), job.mounts[1].clone());
    // Epoch 1's exchange ran at mount; advancing rank 0 alone starts the one into epoch 2.
    std::fs::write(mnt0.join(".shufflefs/epoch"), "1\n").unwrap();
    assert!(job.status(0).get("advance_waiting").is_none());

    // (a) SIGKILL: reaped within seconds, not left in state D. (c) Meanwhile the status
    // and the log say what the advance waits for.
    let mut writer = Writer::start(&[], &mnt0);
    writer.assert_waits(Duration::from_millis(2500));
    let log = std::fs::read_to_string(ds.base.join("job.log")).unwrap();
    assert!(
        log.lines().any(|l| l.contains("an advance is waiting")
            && l.contains("target_epoch=2")
            && l.contains("peers=[1]")),
        "the log does not say what the advance waits for:\n{log}"
    );
    let waiting = job.status(0)["advance_waiting"].clone();
    assert_eq!(waiting["target_epoch"], 2, "{waiting}");
    assert_eq!(waiting["waiting_for"], "exchange", "{waiting}");
    assert_eq!(waiting["peers"], serde_json::json!([1]), "{waiting}");
    assert_eq!(waiting["requests"], 1, "{waiting}");
    assert_eq!(job.status(0)["epoch"], 1);
    kill(writer.pid(), Signal::SIGKILL).unwrap();
    let status = writer.exited_within(Duration::from_secs(5));
    assert!(
        status.is_some(),
        "the writer is still there 5 s after SIGKILL (state {})",
        writer.state()
    );
    wait_for_status(&mnt0, "the killed writer's advance to be withdrawn", |s| {
        s.get("advance_waiting").is_none()
    });

    // A lookup of `epoch-2` waits the same way, and dies the same way.
    let mut lookup = Writer(
        Command::new("stat")
            .arg(mnt0.join("epoch-2"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    lookup.assert_waits(Duration::from_millis(1000));
    kill(lookup.pid(), Signal::SIGKILL).unwrap();
    let status = lookup.exited_within(Duration::from_secs(5));
    assert!(
        status.is_some(),
        "the lookup is still there 5 s after SIGKILL (state {})",
        lookup.state()
    );

    // (b) `timeout 2`: SIGTERM after 2 s ends the writer, and timeout says so (124).
    let mut writer = Writer::start(&["timeout", "2"], &mnt0);
    let status = writer.exited_within(Duration::from_secs(8));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(124),
        "timeout's SIGTERM did not end the writer (state {})",
        writer.state()
    );
    assert_eq!(
        job.status(0)["epoch"],
        1,
        "an interrupted advance published"
    );

    // (d) A lazy unmount of rank 0 while a writer waits: the writer gets an error at once
    // (the daemon answers every waiter once its mount left the mount table), and both
    // daemons exit once rank 1 is unmounted too.
    let mut writer = Writer::start(&[], &mnt0);
    writer.assert_waits(Duration::from_millis(1000));
    let unmount0 = shufflefs()
        .args(["unmount", "--lazy", "--timeout", "30"])
        .arg(&mnt0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let status = writer.exited_within(Duration::from_secs(5));
    assert!(
        status.is_some_and(|s| !s.success()),
        "the writer waiting on the detached mount was not answered with an error: {status:?} (state {})",
        writer.state()
    );
    let stderr = std::io::read_to_string(writer.0.stderr.take().unwrap()).unwrap();
    eprintln!("the released writer said: {stderr}");
    let _ = shufflefs().arg("unmount").arg(&mnt1).output().unwrap();
    let ended = job.wait_within(Duration::from_secs(60));
    assert!(
        ended.is_some(),
        "the job did not end after both ranks were unmounted"
    );
    eprintln!("mpirun exited with {ended:?}");
    let mut unmount0 = Writer(unmount0);
    eprintln!(
        "shufflefs unmount --lazy exited with {:?}",
        unmount0.exited_within(Duration::from_secs(30))
    );
    for m in [&mnt0, &mnt1] {
        assert!(!is_mounted(m), "{} is still mounted", m.display());
    }
}
