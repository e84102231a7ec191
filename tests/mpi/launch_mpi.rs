//! Launching and stopping a job without looking at other hosts' mounts, under real `mpirun`
//! on this machine: rank 0's `--ready-file` (written only once every rank's mount answers,
//! removed as it stops), `mount-helpers/shufflefs-launch` (with `--np` and with any
//! `--launcher` prefix) and `mount-helpers/shufflefs-teardown` (SIGTERM to the launcher's
//! group, which mpirun forwards to every rank), which leaves no mount, no daemon and no
//! folder the daemons made, also when a reader holds a sample open or the launcher is gone.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::mpi_job::{mpirun, write_source};
use crate::common::*;

const TIMEOUT: Duration = Duration::from_secs(120);

fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string()
}

/// `--source DIR/src --cache DIR/cache{rank} DIR/m/mnt{rank}` (the mount points missing).
fn mount_args(dir: &Path) -> Vec<String> {
    let p = |s: &str| dir.join(s).to_str().unwrap().to_string();
    vec![
        "--source".into(),
        p("src"),
        "--cache".into(),
        p("cache{rank}"),
        p("m/mnt{rank}"),
    ]
}

fn mounts(dir: &Path, ranks: u32) -> Vec<PathBuf> {
    (0..ranks).map(|r| dir.join(format!("m/mnt{r}"))).collect()
}

/// Every mount of the job gone, every daemon gone, the folders they made gone.
#[track_caller]
fn assert_nothing_left(dir: &Path, ranks: u32, pids: &[i32]) {
    for m in mounts(dir, ranks) {
        assert!(!is_mounted(&m), "{} is still mounted", m.display());
    }
    for &pid in pids {
        assert!(
            wait_pid_gone(pid, Duration::from_secs(10)),
            "daemon {pid} still runs"
        );
    }
    assert!(!dir.join("m").exists(), "the made mount points are left");
}

/// Unmounts whatever a failed test left.
struct Cleanup<'a>(&'a Path, u32);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if self.0.join("job").exists() {
            let _ = teardown(self.0);
        }
        for m in mounts(self.0, self.1) {
            force_unmount(&m);
        }
    }
}

fn script(name: &str) -> Command {
    let mut cmd = Command::new(repo().join("mount-helpers").join(name));
    for v in ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"] {
        cmd.env_remove(v);
    }
    cmd.env("SHUFFLEFS", BIN).stdin(Stdio::null());
    cmd
}

/// `shufflefs-launch OPTIONS --job DIR/job -- MOUNT-ARGS`; panics with its output on failure.
fn launch(dir: &Path, options: &[&str]) -> String {
    let out = run_with_timeout(
        script("shufflefs-launch")
            .args(options)
            .arg("--job")
            .arg(dir.join("job"))
            .arg("--")
            .args(mount_args(dir)),
        TIMEOUT,
    );
    let log = fs::read_to_string(dir.join("job.log")).unwrap_or_default();
    assert!(
        out.status.success(),
        "shufflefs-launch failed: {}\n{log}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn teardown(dir: &Path) -> Output {
    run_with_timeout(
        script("shufflefs-teardown")
            .arg("--job")
            .arg(dir.join("job")),
        TIMEOUT,
    )
}

/// The launcher printed one line per rank, `RANK HOST MOUNT`, and every mount answers:
/// the daemons' pids.
#[track_caller]
fn check_printed(dir: &Path, printed: &str, ranks: u32) -> Vec<i32> {
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), ranks as usize, "one line per rank:\n{printed}");
    let host = hostname();
    lines
        .iter()
        .zip(mounts(dir, ranks))
        .enumerate()
        .map(|(r, (line, mnt))| {
            let expected = format!("{r} {host} {}", mnt.display());
            assert_eq!(*line, expected);
            let status = read_status(&mnt);
            assert_eq!(status["rank"], r as u64);
            status["pid"].as_i64().unwrap() as i32
        })
        .collect()
}

#[test]
fn the_ready_file_appears_once_every_rank_answers_and_goes_on_stop() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let _cleanup = Cleanup(dir, 3);
    write_source(dir, 2, 12, 3000);
    let ready = dir.join("job.ready");
    let mut child = mpirun(3)
        .arg(BIN)
        .arg("mount")
        .arg("--ready-file")
        .arg(&ready)
        .args(mount_args(dir))
        .stdout(Stdio::null())
        .stderr(fs::File::create(dir.join("job.log")).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while !ready.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            let log = fs::read_to_string(dir.join("job.log")).unwrap_or_default();
            panic!("the job exited before it was ready: {status}\n{log}");
        }
        assert!(Instant::now() < deadline, "no ready file in time");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Every rank's mount answers the moment the file exists.
    let record: Value = serde_json::from_slice(&fs::read(&ready).unwrap()).unwrap();
    assert_eq!(record["world_size"], 3);
    assert_eq!(record["epoch"], 0);
    let mut pids = Vec::new();
    for (r, mnt) in mounts(dir, 3).iter().enumerate() {
        let rank = &record["ranks"][r];
        assert_eq!(rank["rank"], r as u64);
        assert_eq!(rank["host"], hostname().as_str());
        assert_eq!(rank["mountpoint"], mnt.to_str().unwrap());
        let status = read_status(mnt);
        assert_eq!(status["pid"], rank["pid"], "rank {r}'s pid");
        pids.push(status["pid"].as_i64().unwrap() as i32);
    }
    // SIGTERM to mpirun: it forwards it to every rank, which unmounts.
    // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + TIMEOUT;
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "mpirun did not exit on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!ready.exists(), "the ready file outlived the job");
    assert_nothing_left(dir, 3, &pids);
}

#[test]
fn a_refused_rank_means_no_ready_file_and_no_made_mount_points() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let _cleanup = Cleanup(dir, 3);
    write_source(dir, 2, 12, 3000);
    let busy = dir.join("m/mnt1");
    fs::create_dir_all(&busy).unwrap();
    fs::write(busy.join("x"), b"x").unwrap();
    let ready = dir.join("job.ready");
    let out = run_with_timeout(
        mpirun(3)
            .arg(BIN)
            .arg("mount")
            .arg("--ready-file")
            .arg(&ready)
            .args(mount_args(dir)),
        TIMEOUT,
    );
    assert!(!out.status.success(), "the job should have been refused");
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not empty"));
    assert!(!ready.exists(), "a refused job wrote a ready file");
    let left: Vec<_> = fs::read_dir(dir.join("m"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["mnt1"], "only the folder that was there before");
}

#[test]
fn launch_with_np_prints_every_rank_and_teardown_leaves_nothing() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let _cleanup = Cleanup(dir, 3);
    write_source(dir, 2, 12, 3000);
    let printed = launch(dir, &["--np", "3"]);
    let pids = check_printed(dir, &printed, 3);
    let job = fs::read_to_string(dir.join("job")).unwrap();
    assert!(
        job.contains("launcher_pgid=") && job.contains("ready_file="),
        "{job}"
    );
    let out = teardown(dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_nothing_left(dir, 3, &pids);
    assert!(!dir.join("job").exists() && !dir.join("job.ready").exists());
}

#[test]
fn launch_with_a_launcher_prefix_and_teardown() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let _cleanup = Cleanup(dir, 2);
    write_source(dir, 2, 12, 3000);
    let printed = launch(dir, &["--launcher", "mpirun -np 2 --oversubscribe"]);
    let pids = check_printed(dir, &printed, 2);
    let out = teardown(dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_nothing_left(dir, 2, &pids);
}

/// `shufflefs-launch` again with the `--job` of a job that runs is refused before it
/// touches anything: the job file, ready file and log stay the running job's, so teardown
/// still stops it (before, the second launch rewrote them, failed, and teardown exited 0
/// leaving the daemons and mounts).
#[test]
fn launching_over_a_running_job_is_refused_and_teardown_still_stops_it() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let _cleanup = Cleanup(dir, 2);
    write_source(dir, 2, 12, 3000);
    let pids = check_printed(dir, &launch(dir, &["--np", "2"]), 2);
    let files = ["job", "job.ready", "job.log", "job.ranks"];
    let before: Vec<String> = files
        .iter()
        .map(|f| fs::read_to_string(dir.join(f)).unwrap())
        .collect();
    let again = run_with_timeout(
        script("shufflefs-launch")
            .args(["--np", "2", "--job"])
            .arg(dir.join("job"))
            .arg("--")
            .args(mount_args(dir)),
        TIMEOUT,
    );
    let said = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(2), "{said}");
    assert!(
        said.contains("is running") && said.contains("shufflefs-teardown --job"),
        "{said}"
    );
    for (f, was) in files.iter().zip(&before) {
        assert_eq!(
            &fs::read_to_string(dir.join(f)).unwrap(),
            was,
            "{f} changed"
        );
    }
    let out = teardown(dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_nothing_left(dir, 2, &pids);
}

/// `--job NAME` without a slash is the file NAME in the current folder, never one of that
/// name on `$PATH` (before, `source NAME` read `$PATH`'s first: here a script that leaves a
/// mark); and a file that is not a job record is refused unread.
#[test]
fn teardown_reads_a_bare_job_name_from_the_current_folder_only() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let bin = dir.join("bin");
    fs::create_dir(&bin).unwrap();
    let mark = dir.join("sourced-from-path");
    let on_path = format!("#!/bin/sh\ntouch '{}'\n", mark.display());
    fs::write(bin.join("myjob"), on_path).unwrap();
    fs::set_permissions(
        bin.join("myjob"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // A job whose launcher is gone (no pid is that high).
    let work = dir.join("work");
    fs::create_dir(&work).unwrap();
    fs::write(
        work.join("myjob"),
        "launcher_pid=999999999\nlauncher_pgid=999999999\n",
    )
    .unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let run = |job: &str| {
        run_with_timeout(
            script("shufflefs-teardown")
                .args(["--job", job])
                .current_dir(&work)
                .env("PATH", &path),
            TIMEOUT,
        )
    };
    let out = run("myjob");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!mark.exists(), "teardown sourced myjob from $PATH");
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("launcher 999999999 is not running"), "{said}");
    assert!(!work.join("myjob").exists(), "the job file is removed");

    fs::write(
        work.join("train.sh"),
        format!("touch '{}'\n", mark.display()),
    )
    .unwrap();
    let out = run("train.sh");
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("not a job file"), "{said}");
    assert!(
        !mark.exists(),
        "teardown ran a file that is not a job record"
    );

    // Known keys whose values would run code, or name pid 1, when sourced: refused unread
    // (before, `source` ran the substitutions, and pid 1 was signalled).
    for (name, record) in [
        (
            "sub",
            format!("launcher_pid=$(touch '{}')\n", mark.display()),
        ),
        (
            "tick",
            format!("log=x; touch '{}'\nlauncher_pid=2\n", mark.display()),
        ),
        ("one", "launcher_pid=1\nlauncher_pgid=1\n".to_string()),
    ] {
        fs::write(work.join(name), record).unwrap();
        let out = run(name);
        let said = String::from_utf8_lossy(&out.stderr);
        if name == "tick" {
            // Read as data: a log path with a space in it, and a launcher long gone.
            assert!(out.status.success(), "{name}: {said}");
        } else {
            assert_eq!(out.status.code(), Some(2), "{name}: {said}");
            assert!(said.contains("not a job file"), "{name}: {said}");
        }
        assert!(
            !mark.exists(),
            "{name}: teardown ran code from a job record"
        );
    }
}

/// Links planted at the job's file names (the job file, its log and ranks file) in a
/// folder other users may write are replaced, never written through, and teardown deletes
/// none of their targets (before, the job record and the log overwrote root's files, and
/// teardown removed the ranks file's target).
#[test]
fn links_planted_at_the_job_files_are_never_written_through() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let _cleanup = Cleanup(dir, 2);
    write_source(dir, 2, 12, 3000);
    let victims = dir.join("victims");
    fs::create_dir(&victims).unwrap();
    for name in ["job", "job.log", "job.ranks"] {
        let victim = victims.join(name);
        fs::write(&victim, "VICTIM\n").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join(name)).unwrap();
    }
    let printed = launch(dir, &["--np", "2"]);
    let pids = check_printed(dir, &printed, 2);
    let out = teardown(dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_nothing_left(dir, 2, &pids);
    for name in ["job", "job.log", "job.ranks"] {
        let got = fs::read_to_string(victims.join(name)).unwrap_or_default();
        assert_eq!(
            got, "VICTIM\n",
            "{name}'s link was written through or its target removed"
        );
    }
}

/// A job file whose launcher pid now belongs to another process (a different group than
/// recorded) is a job that ended: teardown signals nothing (before, it sent SIGTERM to the
/// unrelated process and exited 0).
#[test]
fn teardown_never_signals_a_reused_pid() {
    let tmp = tempfile::tempdir().unwrap();
    let mut other = Command::new("sleep").arg("60").spawn().unwrap();
    let job = tmp.path().join("stale");
    let record = format!("launcher_pid={}\nlauncher_pgid=4242\n", other.id());
    fs::write(&job, record).unwrap();
    let out = run_with_timeout(
        script("shufflefs-teardown").args([
            "--job".as_ref(),
            job.as_os_str(),
            "--timeout".as_ref(),
            "3".as_ref(),
        ]),
        TIMEOUT,
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("is not running any more"), "{said}");
    assert!(
        other.try_wait().unwrap().is_none(),
        "teardown killed an unrelated process"
    );
    let _ = other.kill();
    let _ = other.wait();
}

/// A reader holding a sample open does not keep a mount behind: its daemon detaches on
/// SIGTERM (mpirun kills it a second later; the detached mount is already gone).
#[test]
fn teardown_with_a_sample_open_leaves_no_mount() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let _cleanup = Cleanup(dir, 2);
    write_source(dir, 2, 12, 3000);
    let pids = check_printed(dir, &launch(dir, &["--np", "2"]), 2);
    let mnt0 = &mounts(dir, 2)[0];
    let class = fs::read_dir(mnt0.join("current")).unwrap().next().unwrap();
    let sample = fs::read_dir(class.unwrap().path()).unwrap().next().unwrap();
    let file = fs::File::open(sample.unwrap().path()).expect("open a sample");
    let out = teardown(dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_nothing_left(dir, 2, &pids);
    drop(file);
}

/// The launcher and its daemons killed outright leave dead mounts: teardown, finding the
/// launcher gone, unmounts what is left on this host.
#[test]
fn teardown_after_everything_was_killed_removes_the_dead_mounts() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let _cleanup = Cleanup(dir, 2);
    write_source(dir, 2, 12, 3000);
    let pids = check_printed(dir, &launch(dir, &["--np", "2"]), 2);
    let job = fs::read_to_string(dir.join("job")).unwrap();
    let launcher: i32 = job
        .lines()
        .find_map(|l| l.strip_prefix("launcher_pid="))
        .unwrap()
        .parse()
        .unwrap();
    for pid in pids.iter().chain([&launcher]) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    assert!(wait_pid_gone(launcher, Duration::from_secs(10)));
    let out = teardown(dir);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("not running any more"), "{said}");
    for m in mounts(dir, 2) {
        assert!(!is_mounted(&m), "{} is still mounted", m.display());
    }
    assert!(
        !dir.join("job.ready").exists(),
        "the ready file left by rank 0"
    );
}

/// Where rank 0 cannot write the ready file (on a cluster: the launcher's folder is not
/// shared with rank 0's host), the launcher reads the same record from the launcher's output.
#[test]
fn launch_reads_the_record_from_the_output_when_the_file_is_not_there() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let _cleanup = Cleanup(dir, 2);
    write_source(dir, 2, 12, 3000);
    // A folder in the way: the file can be neither removed nor written.
    fs::create_dir_all(dir.join("job.ready/in-the-way")).unwrap();
    let pids = check_printed(dir, &launch(dir, &["--np", "2"]), 2);
    let log = fs::read_to_string(dir.join("job.log")).unwrap();
    assert!(log.contains("cannot write the ready file"), "{log}");
    let out = teardown(dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_nothing_left(dir, 2, &pids);
}

/// `--wait-staged` into a pipe (a log, not a terminal): plain `staging` lines on stderr, the
/// last at 100% of every rank's share, stdout still only the ranks.
#[test]
fn launch_wait_staged_shows_staging_progress_in_a_log() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let _cleanup = Cleanup(dir, 3);
    let (classes, per_class, bytes) = (2, 24, 3000);
    write_source(dir, classes, per_class, bytes);
    let total: usize = (0..classes * per_class)
        .map(|k| bytes + (k % per_class) as usize * 97)
        .sum();
    let out = run_with_timeout(
        script("shufflefs-launch")
            .env("SHUFFLEFS_PROGRESS_EVERY", "0.1")
            .args(["--np", "3", "--wait-staged", "--job"])
            .arg(dir.join("job"))
            .arg("--")
            .args(mount_args(dir)),
        TIMEOUT,
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "shufflefs-launch failed: {stderr}");
    let pids = check_printed(dir, &stdout, 3);
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(!lines.is_empty(), "no progress line");
    assert!(
        lines.iter().all(|l| l.starts_with("staging  ")) && !stderr.contains('\r'),
        "{stderr}"
    );
    let last = lines.last().unwrap();
    let whole = format!("{0:.1} kB / {0:.1} kB  100%", total as f64 / 1000.0);
    assert!(
        last.contains(&whole) && last.ends_with("(3 ranks)"),
        "{last}"
    );
    for m in mounts(dir, 3) {
        assert_eq!(read_status(&m)["staging"]["state"], "done");
    }
    assert!(teardown(dir).status.success());
    assert_nothing_left(dir, 3, &pids);
}

/// A `python3` for `--wait-staged` (`SHUFFLEFS_PYTHON`) whose progress never ends, as if
/// staging went on: what ends the wait must then come from the launcher itself.
fn endless_progress(dir: &Path) -> PathBuf {
    let path = dir.join("python-staging-forever");
    fs::write(
        &path,
        format!(
            "#!/bin/sh\ncase \"$1\" in -m) echo \"$@\" >{}; echo $$ >{}; exec sleep 600 ;; esac\nexec python3 \"$@\"\n",
            dir.join("progress.args").display(),
            dir.join("progress.pid").display()
        ),
    )
    .unwrap();
    fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

/// `shufflefs-launch --np 3 OPTIONS --job DIR/job -- MOUNT-ARGS` with `python` for the
/// progress, run to its end.
fn launch_waiting(dir: &Path, python: &Path, options: &[&str]) -> Output {
    run_with_timeout(
        script("shufflefs-launch")
            .env("SHUFFLEFS_PYTHON", python)
            .args(["--np", "3", "--wait-staged"])
            .args(options)
            .arg("--job")
            .arg(dir.join("job"))
            .arg("--")
            .args(mount_args(dir)),
        TIMEOUT,
    )
}

/// A rank killed while `--wait-staged` waits: the launch fails, saying the daemons exited,
/// and leaves no progress process behind.
#[test]
fn launch_wait_staged_fails_when_a_rank_dies_during_staging() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let _cleanup = Cleanup(dir, 3);
    write_source(dir, 2, 12, 3000);
    let python = endless_progress(dir);
    let killer = {
        let (ranks, mount) = (dir.join("job.ranks"), mounts(dir, 3).remove(1));
        std::thread::spawn(move || {
            let deadline = Instant::now() + TIMEOUT;
            while !ranks.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let pid = read_status(&mount)["pid"].as_i64().unwrap() as i32;
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        })
    };
    let out = launch_waiting(dir, &python, &[]);
    killer.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the launch succeeded: {stderr}");
    assert!(
        stderr.contains("the daemons exited before every share was staged"),
        "{stderr}"
    );
    let progress: i32 = fs::read_to_string(dir.join("progress.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        wait_pid_gone(progress, Duration::from_secs(5)),
        "the progress was left running"
    );
}

/// Without the Python package the wait fails at once with its own error, and
/// `--staging-timeout` ends a wait that goes on; the job runs on either way.
#[test]
fn launch_wait_staged_fails_without_the_package_or_past_its_deadline() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let _cleanup = Cleanup(dir, 3);
    write_source(dir, 2, 12, 3000);
    // -I -S: neither PYTHONPATH (the checkout) nor site-packages (an installed package).
    let isolated = dir.join("python-isolated");
    fs::write(&isolated, "#!/bin/sh\nexec python3 -I -S \"$@\"\n").unwrap();
    fs::set_permissions(
        &isolated,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let checks: [(&Path, &[&str], &str); 2] = [
        (&isolated, &[], "needs the shufflefs Python package"),
        (
            &endless_progress(dir),
            &["--staging-timeout", "1"],
            "not every share was staged after 1s",
        ),
    ];
    for (python, options, says) in checks {
        let out = launch_waiting(dir, python, options);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "the launch succeeded: {stderr}");
        assert!(
            stderr.contains(says) && stderr.contains("shufflefs-teardown"),
            "{stderr}"
        );
        for m in mounts(dir, 3) {
            assert!(read_status(&m)["rank"].as_u64().is_some());
        }
        assert!(teardown(dir).status.success());
    }
    // The progress line is told the way out of a wait an error holds up.
    let args = fs::read_to_string(dir.join("progress.args")).unwrap();
    assert!(
        args.contains("--way-out giving up after --staging-timeout 1s"),
        "{args}"
    );
}
