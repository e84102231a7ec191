//! Child processes: the `shufflefs` binary with a clean environment, commands run with a
//! timeout, and waiting for processes that are not our children.

use std::ffi::OsString;
use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_shufflefs");

/// Variables by which the binary decides it runs under an MPI launcher; a test run that
/// itself sits under mpirun must not make single-rank daemons try to join that world.
const MPI_VARS: [&str; 4] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"];

/// `shufflefs` with no MPI variables and no stdin.
pub fn shufflefs() -> Command {
    let mut c = Command::new(BIN);
    for v in MPI_VARS {
        c.env_remove(v);
    }
    c.stdin(Stdio::null());
    c
}

/// `shufflefs` run by `sh -c SCRIPT` after `script`, which ends with `exec "$0" "$@"`
/// (the daemon then has the shell's pid, `$$` in the script).
pub fn shufflefs_after(script: &str) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(format!("{script}\nexec \"$0\" \"$@\""))
        .arg(BIN);
    for v in MPI_VARS {
        c.env_remove(v);
    }
    c.stdin(Stdio::null());
    c
}

/// `--source SRC --cache CACHE EXTRA... MOUNTPOINT`, the arguments after `mount`.
pub fn mount_args(source: &Path, cache: &Path, mnt: &Path, extra: &[&str]) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec![
        "--source".into(),
        source.into(),
        "--cache".into(),
        cache.into(),
    ];
    v.extend(extra.iter().map(OsString::from));
    v.push(mnt.into());
    v
}

/// Drains a pipe on a thread into a shared buffer.
pub(crate) fn drain(
    mut pipe: impl Read + Send + 'static,
    into: Arc<Mutex<Vec<u8>>>,
) -> mpsc::Receiver<()> {
    let (done_tx, done_rx) = mpsc::channel();
    thread::spawn(move || {
        let mut buf = [0u8; 8192];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => into.lock().unwrap().extend_from_slice(&buf[..n]),
            }
        }
        let _ = done_tx.send(());
    });
    done_rx
}

pub(crate) fn text(buf: &Arc<Mutex<Vec<u8>>>) -> String {
    String::from_utf8_lossy(&buf.lock().unwrap()).into_owned()
}

/// Whether process `pid` exists and is not a zombie.
pub fn pid_alive(pid: i32) -> bool {
    // A zombie still answers kill(0); it no longer runs anything, so it counts as gone.
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')),
        Err(_) => false,
    }
}

/// Waits until process `pid` (not our child) is gone, up to `timeout`.
pub fn wait_pid_gone(pid: i32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while pid_alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
    true
}

/// `child`'s exit status once it exits, within `timeout` (`None`: still running).
pub fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `cmd` to completion with piped output, killing it (and panicking) after `timeout`.
/// Output still held open by a grandchild after the command exits is not waited for.
pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn a command");
    let out = Arc::new(Mutex::new(Vec::new()));
    let err = Arc::new(Mutex::new(Vec::new()));
    let out_done = drain(child.stdout.take().unwrap(), out.clone());
    let err_done = drain(child.stderr.take().unwrap(), err.clone());
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for a command") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{cmd:?} did not finish within {timeout:?}\nstdout: {}\nstderr: {}",
                text(&out),
                text(&err)
            );
        }
        thread::sleep(Duration::from_millis(10));
    };
    let _ = out_done.recv_timeout(Duration::from_secs(5));
    let _ = err_done.recv_timeout(Duration::from_secs(5));
    Output {
        status,
        stdout: out.lock().unwrap().clone(),
        stderr: err.lock().unwrap().clone(),
    }
}
