//! `shufflefs unmount` touches only shufflefs mounts (item 7): a tmpfs, or a
//! folder that is no mount point, is refused with what it is and left alone. And a plain
//! unmount is not blocked by a process holding the control file: the mount is detached
//! (as on SIGTERM), while an open sample file still refuses it (`bad_input`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

fn unmount(mnt: &std::path::Path, timeout_s: u64) -> std::process::Output {
    run_with_timeout(
        shufflefs()
            .arg("unmount")
            .arg("--timeout")
            .arg(timeout_s.to_string())
            .arg(mnt),
        Duration::from_secs(timeout_s + 30),
    )
}

#[test]
fn unmount_refuses_a_tmpfs_and_a_plain_folder() {
    if !require_fuse() || !require_root("mounts a tmpfs") {
        return;
    }
    let data = standard_dataset();
    let tt = data.dir("tt");
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&tt)
        .status()
        .unwrap();
    assert!(ok.success(), "mount -t tmpfs failed");
    std::fs::write(tt.join("keep"), b"precious").unwrap();
    let out = unmount(&tt, 5);
    let still = is_mounted(&tt);
    let kept = std::fs::read(tt.join("keep")).ok();
    force_unmount(&tt);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the tmpfs was unmounted: {err}");
    assert!(still, "the tmpfs is gone");
    assert_eq!(kept.as_deref(), Some(&b"precious"[..]));
    for needle in [
        "tmpfs mount",
        "not a shufflefs mount",
        "nothing was unmounted",
    ] {
        assert!(err.contains(needle), "{needle:?} not in: {err}");
    }
    assert!(err.contains(tt.to_str().unwrap()), "{err}");

    let plain = data.dir("plain");
    let out = unmount(&plain, 5);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("not mounted") && err.contains("nothing was unmounted"),
        "{err}"
    );
}

/// A process that holds `.shufflefs/epoch` open (a trainer that writes it every epoch)
/// does not make a plain unmount fail: the mount is detached at once and the daemon exits
/// when the file is closed.
#[test]
fn unmount_with_the_control_file_held_open_detaches() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let mnt = data.dir("mnt");
    let d = Daemon::mount(&data.root, &data.path("cache"), &mnt, &[]);
    let pid = d.pid() as i32;
    let epoch = mnt.join(".shufflefs/epoch");
    let mut holder = Command::new("sh")
        .arg("-c")
        .arg(format!("exec 3>'{}'; sleep 3", epoch.display()))
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    // The holder has the file open once its fd shows.
    let deadline = Instant::now() + Duration::from_secs(10);
    let fd3 = format!("/proc/{}/fd/3", holder.id());
    while std::fs::read_link(&fd3).is_err() {
        assert!(
            Instant::now() < deadline,
            "the holder did not open the control file"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let started = Instant::now();
    let out = unmount(&mnt, 30);
    let _ = holder.wait();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "unmount failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("detached"), "{stdout}");
    assert!(started.elapsed() < Duration::from_secs(25));
    assert!(!is_mounted(&mnt), "still mounted");
    assert!(
        wait_pid_gone(pid, Duration::from_secs(10)),
        "daemon {pid} runs on"
    );
    d.unmount();
}
