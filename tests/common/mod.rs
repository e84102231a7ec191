//! Helpers shared by the integration tests that start real `shufflefs` daemons.
//!
//! - [`require_fuse`] / [`require_mpi`]: skip (or, under CI, fail) when the machine lacks them.
//! - [`DatasetBuilder`]: an ImageFolder tree in a temp folder whose bytes are a pure function
//!   of (file, offset), so any read can be checked.
//! - [`Daemon`]: a `shufflefs mount --foreground` child that is always unmounted and reaped,
//!   even when the test panics.
//! - [`mount_refused`]: runs a mount that must fail and checks it left no mount behind.
//!
//! Each test binary uses a different subset of these, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod mpi_job;
pub mod records;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fmt::Debug;
use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_shufflefs");
/// How long a mount may take to report "mounted" (or fail).
pub const MOUNT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a daemon may take to exit once unmounted.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long to wait for the daemon's background work (staging) to reach a state.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(30);

/// Variables by which the binary decides it runs under an MPI launcher; a test run that
/// itself sits under mpirun must not make single-rank daemons try to join that world.
const MPI_VARS: [&str; 4] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"];

// ---------------------------------------------------------------------------------------
// Skips
// ---------------------------------------------------------------------------------------

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Whether an executable called `name` is on `PATH`.
pub fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| {
            fs::metadata(dir.join(name))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

fn require(what: &str, var: &str, missing: Option<String>) -> bool {
    let Some(why) = missing else {
        return true;
    };
    if std::env::var(var).is_ok_and(|v| v == "1") {
        panic!("{var}=1 but {what} is not usable here: {why}");
    }
    eprintln!("SKIPPED: {what} is not usable here ({why}); set {var}=1 to fail instead");
    false
}

/// True when real FUSE mounts can be made: `/dev/fuse` exists and `fusermount3` is on
/// `PATH` (or we are root). Otherwise prints a skip note and returns false, or panics when
/// `SHUFFLEFS_REQUIRE_FUSE=1` (CI).
pub fn require_fuse() -> bool {
    let missing = if !Path::new("/dev/fuse").exists() {
        Some("/dev/fuse does not exist".to_string())
    } else if !is_root() && !on_path("fusermount3") {
        Some("fusermount3 is not on PATH and we are not root".to_string())
    } else {
        None
    };
    require("FUSE", "SHUFFLEFS_REQUIRE_FUSE", missing)
}

/// True when `mpirun` is on `PATH`. Otherwise prints a skip note and returns false, or panics
/// when `SHUFFLEFS_REQUIRE_MPI=1` (CI).
pub fn require_mpi() -> bool {
    let missing = (!on_path("mpirun")).then(|| "mpirun is not on PATH".to_string());
    require("MPI", "SHUFFLEFS_REQUIRE_MPI", missing)
}

/// True when emulated hosts (`mount-helpers/shufflefs-cluster`) can run here: root, `ip`,
/// `tc`, `nsenter`, `unshare`, `mpirun`, `python3` and `/dev/fuse`. Otherwise prints a skip
/// note and returns false, or panics when `SHUFFLEFS_REQUIRE_CLUSTER=1` (CI).
pub fn require_cluster() -> bool {
    let tools = ["ip", "tc", "nsenter", "unshare", "mpirun", "python3"];
    let missing = if !is_root() {
        Some("network namespaces need root".to_string())
    } else if !Path::new("/dev/fuse").exists() {
        Some("/dev/fuse does not exist".to_string())
    } else {
        tools
            .iter()
            .find(|t| !on_path(t))
            .map(|tool| format!("{tool} is not on PATH"))
    };
    require("emulated hosts", "SHUFFLEFS_REQUIRE_CLUSTER", missing)
}

// ---------------------------------------------------------------------------------------
// Datasets
// ---------------------------------------------------------------------------------------

/// The expected bytes `offset..offset+len` of the file with key `key`.
pub fn expected_bytes(key: u32, offset: u64, len: u64) -> Vec<u8> {
    (offset..offset + len)
        .map(|o| shufflefs::dataset::synthetic_byte(key, o))
        .collect()
}

/// One sample file of a test dataset.
#[derive(Clone, Debug)]
pub struct Sample {
    pub class: String,
    pub name: String,
    /// Determines the content: byte `o` is `synthetic_byte(key, o)`.
    pub key: u32,
    pub size: u64,
}

impl Sample {
    /// `<class>/<name>`, relative to the dataset root or to an `epoch-N/` folder.
    pub fn rel(&self) -> PathBuf {
        Path::new(&self.class).join(&self.name)
    }

    pub fn bytes(&self) -> Vec<u8> {
        expected_bytes(self.key, 0, self.size)
    }

    /// The expected result of reading up to `len` bytes at `offset`.
    pub fn range(&self, offset: u64, len: u64) -> Vec<u8> {
        let start = offset.min(self.size);
        let end = offset.saturating_add(len).min(self.size);
        expected_bytes(self.key, start, end - start)
    }
}

#[derive(Default)]
pub struct DatasetBuilder {
    classes: Vec<(String, Vec<(String, u64)>)>,
    dangling: Vec<(String, String)>,
    nested: Vec<(String, String)>,
}

impl DatasetBuilder {
    pub fn new() -> DatasetBuilder {
        DatasetBuilder::default()
    }

    /// A class folder holding `files` as `(name, size)`; an empty slice makes an empty class.
    pub fn class(mut self, name: &str, files: &[(&str, u64)]) -> DatasetBuilder {
        self.classes.push((
            name.to_string(),
            files.iter().map(|&(n, s)| (n.to_string(), s)).collect(),
        ));
        self
    }

    pub fn empty_class(self, name: &str) -> DatasetBuilder {
        self.class(name, &[])
    }

    /// A class of `count` files with long-ish names, so listings span several kernel buffers.
    pub fn numbered_class(
        mut self,
        name: &str,
        count: usize,
        size: impl Fn(usize) -> u64,
    ) -> DatasetBuilder {
        self.classes.push((
            name.to_string(),
            (0..count)
                .map(|i| {
                    (
                        format!("sample-with-a-rather-long-name-{i:05}.jpg"),
                        size(i),
                    )
                })
                .collect(),
        ));
        self
    }

    /// A symlink `class/name` pointing at nothing.
    pub fn dangling_link(mut self, class: &str, name: &str) -> DatasetBuilder {
        self.dangling.push((class.to_string(), name.to_string()));
        self
    }

    /// A sub-folder inside a class folder (not a sample; the scan skips it).
    pub fn nested_folder(mut self, class: &str, name: &str) -> DatasetBuilder {
        self.nested.push((class.to_string(), name.to_string()));
        self
    }

    pub fn build(self) -> Dataset {
        let tmp = tempfile::Builder::new()
            .prefix("shufflefs-test-")
            .tempdir()
            .expect("create a temp folder");
        let base = fs::canonicalize(tmp.path()).expect("canonicalize the temp folder");
        // Views show who may reach the source (`vfs::access`): a 0700 temp folder above it
        // would make every view 0400/0500.
        fs::set_permissions(&base, fs::Permissions::from_mode(0o755)).expect("chmod 0755");
        let root = base.join("src");
        fs::create_dir(&root).expect("create the source folder");
        let mut samples = Vec::new();
        let mut classes = Vec::new();
        for (class, files) in &self.classes {
            fs::create_dir_all(root.join(class)).expect("create a class folder");
            classes.push(class.clone());
            for (name, size) in files {
                let sample = Sample {
                    class: class.clone(),
                    name: name.clone(),
                    key: samples.len() as u32 + 1,
                    size: *size,
                };
                fs::write(root.join(sample.rel()), sample.bytes()).expect("write a sample");
                samples.push(sample);
            }
        }
        let mut dangling = Vec::new();
        for (class, name) in &self.dangling {
            let link = root.join(class).join(name);
            fs::create_dir_all(link.parent().unwrap()).expect("create a class folder");
            std::os::unix::fs::symlink(base.join("no-such-target"), &link)
                .expect("create a dangling link");
            dangling.push(link);
        }
        let mut nested = Vec::new();
        for (class, name) in &self.nested {
            let dir = root.join(class).join(name);
            fs::create_dir_all(&dir).expect("create a nested folder");
            fs::write(dir.join("inside.jpg"), b"not a sample").expect("write a nested file");
            nested.push(dir);
        }
        classes.sort();
        classes.dedup();
        Dataset {
            _tmp: tmp,
            base,
            root,
            classes,
            samples,
            dangling,
            nested,
        }
    }
}

/// A test dataset and a scratch area for its cache and mount folders; all deleted on drop.
pub struct Dataset {
    _tmp: TempDir,
    /// Canonical path of the temp folder; `src/` is the dataset.
    pub base: PathBuf,
    /// The `--source` folder.
    pub root: PathBuf,
    /// Class folder names, sorted.
    pub classes: Vec<String>,
    pub samples: Vec<Sample>,
    pub dangling: Vec<PathBuf>,
    pub nested: Vec<PathBuf>,
}

impl Dataset {
    /// A path in the scratch area (not created).
    pub fn path(&self, name: &str) -> PathBuf {
        self.base.join(name)
    }

    /// An empty folder in the scratch area, e.g. a mount point.
    pub fn dir(&self, name: &str) -> PathBuf {
        let p = self.path(name);
        fs::create_dir_all(&p).expect("create a scratch folder");
        p
    }

    pub fn sample(&self, class: &str, name: &str) -> &Sample {
        self.samples
            .iter()
            .find(|s| s.class == class && s.name == name)
            .unwrap_or_else(|| panic!("no sample {class}/{name} in the test dataset"))
    }

    pub fn total_bytes(&self) -> u64 {
        self.samples.iter().map(|s| s.size).sum()
    }

    /// What an `epoch-N/` of a world of one must list: every class, every sample.
    pub fn expected_listing(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut out: BTreeMap<String, BTreeSet<String>> = self
            .classes
            .iter()
            .map(|c| (c.clone(), BTreeSet::new()))
            .collect();
        for s in &self.samples {
            out.get_mut(&s.class).unwrap().insert(s.name.clone());
        }
        out
    }
}

/// The dataset most mount tests use: odd names, an empty class, an empty file, a file larger
/// than one FUSE read, a class that needs several readdir replies, and a dangling link.
/// A file name of 255 bytes, the longest Linux allows.
pub const LONG_NAME: &str = concat!(
    "llllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllll",
    "llllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllll",
    "lllllllllllllllllllllllllllllllllllllllllllllllllll.bin"
);

pub fn standard_dataset() -> Dataset {
    DatasetBuilder::new()
        .class(
            "cat",
            &[
                ("a.jpg", 1000),
                ("b.jpg", 4096),
                ("c.jpg", 1),
                ("empty.bin", 0),
                ("large.bin", 300_000),
            ],
        )
        .class(
            "dog house",
            &[
                ("spaced name.png", 777),
                ("ünïcødé.jpg", 2048),
                ("日本語.bin", 333),
                ("line\nbreak.jpg", 12),
                (LONG_NAME, 55),
            ],
        )
        .class("ñandú", &[("x", 10)])
        .empty_class("empty")
        .numbered_class("many", 150, |i| (i * 37 % 500) as u64 + 1)
        .dangling_link("dog house", "gone.jpg")
        .build()
}

// ---------------------------------------------------------------------------------------
// Mount table
// ---------------------------------------------------------------------------------------

/// `path` made absolute without touching it if it is a dead mount (canonicalize would fail).
pub fn canonical(path: &Path) -> PathBuf {
    if let Ok(p) = fs::canonicalize(path) {
        return p;
    }
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => fs::canonicalize(parent)
            .map(|p| p.join(name))
            .unwrap_or_else(|_| path.to_path_buf()),
        _ => path.to_path_buf(),
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..=i + 3].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// How many mounts `/proc/self/mountinfo` lists at `path`.
pub fn mount_count(path: &Path) -> usize {
    let target = canonical(path);
    let info = fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo");
    info.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|t| unescape_mountinfo(t) == target.as_os_str().as_bytes())
        .count()
}

pub fn is_mounted(path: &Path) -> bool {
    mount_count(path) > 0
}

/// Removes every mount at `path` whatever state it is in (lazy unmounts; never fails).
pub fn force_unmount(path: &Path) {
    for _ in 0..4 {
        if !is_mounted(path) {
            return;
        }
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if is_mounted(path) {
            let c = std::ffi::CString::new(canonical(path).as_os_str().as_bytes()).unwrap();
            // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
            unsafe {
                libc::umount2(c.as_ptr(), libc::MNT_DETACH);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------------------

/// `shufflefs` with no MPI variables and no stdin.
pub fn shufflefs() -> Command {
    let mut c = Command::new(BIN);
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
fn drain(mut pipe: impl Read + Send + 'static, into: Arc<Mutex<Vec<u8>>>) -> mpsc::Receiver<()> {
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

fn text(buf: &Arc<Mutex<Vec<u8>>>) -> String {
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

/// What a daemon left when it stopped.
#[derive(Debug)]
pub struct Stopped {
    /// The daemon's own exit status (None if it had to be killed).
    pub status: Option<ExitStatus>,
    /// The `shufflefs unmount` run that stopped it.
    pub unmount: Option<Output>,
    pub stderr: String,
}

impl Stopped {
    /// Asserts the clean path: `shufflefs unmount` succeeded and the daemon exited 0.
    #[track_caller]
    pub fn assert_clean(&self) {
        let um = self.unmount.as_ref().expect("shufflefs unmount was run");
        assert!(
            um.status.success(),
            "shufflefs unmount failed: {:?}\nstdout: {}\nstderr: {}",
            um.status,
            String::from_utf8_lossy(&um.stdout),
            String::from_utf8_lossy(&um.stderr)
        );
        assert!(
            self.status.is_some_and(|s| s.success()),
            "daemon did not exit 0 after unmount: {:?}\nstderr:\n{}",
            self.status,
            self.stderr
        );
    }
}

/// A mount that refused to start.
#[derive(Debug)]
pub struct Refusal {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Refusal {
    /// Asserts the exit was non-zero and stderr names `needle`.
    #[track_caller]
    pub fn assert_mentions(&self, needle: &str) {
        assert!(
            !self.status.success(),
            "expected a failure, got {:?}",
            self.status
        );
        assert!(
            self.stderr.contains(needle),
            "stderr should mention {needle:?}:\n{}",
            self.stderr
        );
    }
}

/// A foreground `shufflefs mount` child. Dropping it unmounts (with `shufflefs unmount`,
/// falling back to lazy unmounts), waits for the process and kills it if it hangs.
pub struct Daemon {
    child: Option<Child>,
    pub mnt: PathBuf,
    /// The "... mounted ..." line.
    pub ready_line: String,
    stderr: Arc<Mutex<Vec<u8>>>,
    stderr_done: mpsc::Receiver<()>,
}

impl Daemon {
    /// Starts `shufflefs mount --foreground ARGS` and waits for it to report "mounted";
    /// panics with its stderr if it fails.
    #[track_caller]
    pub fn start(mnt: &Path, args: &[OsString]) -> Daemon {
        match Daemon::try_start(mnt, args) {
            Ok(d) => d,
            Err(r) => panic!(
                "shufflefs mount {args:?} failed ({:?}):\n{}",
                r.status, r.stderr
            ),
        }
    }

    /// The usual case: `--source SRC --cache CACHE EXTRA... MNT`.
    #[track_caller]
    pub fn mount(source: &Path, cache: &Path, mnt: &Path, extra: &[&str]) -> Daemon {
        Daemon::start(mnt, &mount_args(source, cache, mnt, extra))
    }

    /// Like [`Daemon::start`], but a refusal is returned instead of panicking.
    pub fn try_start(mnt: &Path, args: &[OsString]) -> Result<Daemon, Refusal> {
        let mut cmd = shufflefs();
        cmd.arg("mount")
            .arg("--foreground")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: only async-signal-safe prctl runs between fork and exec. If the test
        // process dies without running our Drop (killed by a CI timeout), the daemon gets
        // SIGTERM and unmounts itself. The signal follows the spawning *thread*; a Daemon is
        // always stopped by the test thread that started it, before that thread ends.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn shufflefs");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let stderr_done = drain(child.stderr.take().unwrap(), stderr.clone());
        let (line_tx, line_rx) = mpsc::channel::<String>();
        let stdout = child.stdout.take().unwrap();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line_tx.send(line).is_err() {
                    // Nobody listens any more; keep draining so the daemon never blocks.
                    continue;
                }
            }
        });
        let deadline = Instant::now() + MOUNT_TIMEOUT;
        let mut seen = Vec::new();
        loop {
            match line_rx.recv_timeout(Duration::from_millis(50)) {
                Ok(line) if line.contains(" mounted ") => {
                    return Ok(Daemon {
                        child: Some(child),
                        mnt: mnt.to_path_buf(),
                        ready_line: line,
                        stderr,
                        stderr_done,
                    });
                }
                Ok(line) => seen.push(line),
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                    if let Some(status) = child.try_wait().expect("wait for shufflefs") {
                        let _ = stderr_done.recv_timeout(Duration::from_secs(5));
                        return Err(Refusal {
                            status,
                            stdout: seen.join("\n"),
                            stderr: text(&stderr),
                        });
                    }
                    if Instant::now() > deadline {
                        let _ = child.kill();
                        let _ = child.wait();
                        force_unmount(mnt);
                        panic!(
                            "shufflefs mount {args:?} printed no \"mounted\" line within {MOUNT_TIMEOUT:?}\nstdout: {}\nstderr:\n{}",
                            seen.join("\n"),
                            text(&stderr)
                        );
                    }
                }
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The epoch named in the "mounted" line.
    pub fn ready_epoch(&self) -> u64 {
        let rest = self
            .ready_line
            .split("(epoch ")
            .nth(1)
            .unwrap_or_else(|| panic!("no epoch in {:?}", self.ready_line));
        rest.split(',').next().unwrap().parse().unwrap()
    }

    /// Everything the daemon wrote to stderr so far (its log).
    pub fn stderr(&self) -> String {
        text(&self.stderr)
    }

    pub fn status(&self) -> Value {
        read_status(&self.mnt)
    }

    /// Whether the daemon process has exited (reaping it if so).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Sends `signal` to the daemon.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
        let rc = unsafe { libc::kill(self.pid() as i32, signal) };
        assert_eq!(rc, 0, "kill({}, {signal})", self.pid());
    }

    /// Waits for the daemon to exit by itself (after a signal, say), up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            if Instant::now() > deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Unmounts with `shufflefs unmount` and waits for the daemon; see [`Stopped`].
    pub fn unmount(mut self) -> Stopped {
        self.stop()
    }

    fn stop(&mut self) -> Stopped {
        let Some(mut child) = self.child.take() else {
            return Stopped {
                status: None,
                unmount: None,
                stderr: self.stderr(),
            };
        };
        let mut status = child.try_wait().ok().flatten();
        let mut unmount = None;
        if status.is_none() || is_mounted(&self.mnt) {
            // `shufflefs unmount` waits for the daemon pid to go away, and the daemon is our
            // child: reap it meanwhile, or its zombie would look alive.
            let spawned = shufflefs()
                .arg("unmount")
                .arg("--timeout")
                .arg(EXIT_TIMEOUT.as_secs().to_string())
                .arg(&self.mnt)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn();
            if let Ok(mut um) = spawned {
                let deadline = Instant::now() + EXIT_TIMEOUT + Duration::from_secs(5);
                loop {
                    if status.is_none() {
                        status = child.try_wait().ok().flatten();
                    }
                    if um.try_wait().ok().flatten().is_some() {
                        unmount = um.wait_with_output().ok();
                        break;
                    }
                    if Instant::now() > deadline {
                        let _ = um.kill();
                        unmount = um.wait_with_output().ok();
                        break;
                    }
                    thread::sleep(Duration::from_millis(10));
                }
            }
        }
        if is_mounted(&self.mnt) {
            force_unmount(&self.mnt);
        }
        let deadline = Instant::now() + EXIT_TIMEOUT;
        while status.is_none() {
            status = child.try_wait().ok().flatten();
            if status.is_some() {
                break;
            }
            if Instant::now() > deadline {
                eprintln!(
                    "shufflefs daemon {} did not exit after unmount; killing it",
                    child.id()
                );
                let _ = child.kill();
                let _ = child.wait();
                force_unmount(&self.mnt);
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let _ = self.stderr_done.recv_timeout(Duration::from_secs(5));
        Stopped {
            status,
            unmount,
            stderr: self.stderr(),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_some() {
            let stopped = self.stop();
            if thread::panicking() {
                eprintln!(
                    "daemon at {} stopped ({:?}); its stderr:\n{}",
                    self.mnt.display(),
                    stopped.status,
                    stopped.stderr
                );
            }
        }
    }
}

/// A mount made by a detached (forked) daemon: unmounted on drop, its daemon waited for and
/// killed if it hangs.
pub struct DetachedMount {
    pub mnt: PathBuf,
    pub pid: Option<i32>,
}

impl Drop for DetachedMount {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let _ = run_with_timeout(
                shufflefs()
                    .arg("unmount")
                    .arg("--timeout")
                    .arg("10")
                    .arg(&self.mnt),
                Duration::from_secs(15),
            );
            force_unmount(&self.mnt);
        }
        if let Some(pid) = self.pid
            && !wait_pid_gone(pid, EXIT_TIMEOUT)
        {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
            force_unmount(&self.mnt);
        }
    }
}

/// Runs a mount that must fail: `shufflefs mount [--foreground] ARGS`. Returns its exit
/// status and output, and asserts it left no new mount at `mnt`. If it unexpectedly
/// mounts, cleans up and panics.
#[track_caller]
pub fn mount_refused(mnt: &Path, args: &[OsString], foreground: bool) -> Refusal {
    let before = mount_count(mnt);
    let refusal = if foreground {
        match Daemon::try_start(mnt, args) {
            Ok(d) => {
                let line = d.ready_line.clone();
                drop(d);
                panic!("shufflefs mount {args:?} should have failed but mounted: {line}");
            }
            Err(r) => r,
        }
    } else {
        let out = run_with_timeout(shufflefs().arg("mount").args(args), MOUNT_TIMEOUT);
        if out.status.success() {
            let _guard = DetachedMount {
                mnt: mnt.to_path_buf(),
                pid: None,
            };
            panic!(
                "detached shufflefs mount {args:?} should have failed but succeeded: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        Refusal {
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    };
    let after = mount_count(mnt);
    if after > before {
        force_unmount(mnt);
    }
    assert_eq!(
        after,
        before,
        "a refused mount left a mount behind at {}; stderr:\n{}",
        mnt.display(),
        refusal.stderr
    );
    assert!(
        !refusal.status.success(),
        "refused mount exited 0; stderr:\n{}",
        refusal.stderr
    );
    refusal
}

// ---------------------------------------------------------------------------------------
// Looking at a mounted view
// ---------------------------------------------------------------------------------------

/// Parses `MNT/.shufflefs/status`.
#[track_caller]
pub fn read_status(mnt: &Path) -> Value {
    let path = mnt.join(".shufflefs/status");
    let bytes = fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "status is not JSON ({e}):\n{}",
            String::from_utf8_lossy(&bytes)
        )
    })
}

/// Polls the status until `pred` holds; panics with the last status after the timeout.
#[track_caller]
pub fn wait_for_status(mnt: &Path, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + STATUS_TIMEOUT;
    loop {
        let s = read_status(mnt);
        if pred(&s) {
            return s;
        }
        if Instant::now() > deadline {
            panic!("status never showed {what} within {STATUS_TIMEOUT:?}:\n{s:#}");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the current epoch's share is fully staged into the cache.
#[track_caller]
pub fn wait_staging_done(mnt: &Path) -> Value {
    wait_for_status(mnt, "staging done", |s| {
        let st = &s["staging"];
        st["state"] == "done"
            && st["epoch"] == s["epoch"]
            && st["files_total"] == s["share_samples"]
            && st["files_done"] == st["files_total"]
    })
}

/// The names in a folder, sorted.
#[track_caller]
pub fn names(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| {
            e.expect("read a folder entry")
                .file_name()
                .into_string()
                .expect("UTF-8 name")
        })
        .collect()
}

/// `class -> sample names` of an `epoch-N/` folder.
#[track_caller]
pub fn listing(epoch_dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    names(epoch_dir)
        .into_iter()
        .map(|c| {
            let files = names(&epoch_dir.join(&c));
            (c, files)
        })
        .collect()
}

/// Reads `MNT/.shufflefs/epoch`.
#[track_caller]
pub fn read_epoch(mnt: &Path) -> u64 {
    let s = fs::read_to_string(mnt.join(".shufflefs/epoch")).expect("read the epoch file");
    assert!(
        s.ends_with('\n'),
        "epoch file content {s:?} lacks a newline"
    );
    s.trim()
        .parse()
        .unwrap_or_else(|_| panic!("epoch file holds {s:?}"))
}

/// Runs the shell's `echo VALUE > MNT/.shufflefs/epoch`, the way users advance by hand.
pub fn shell_echo_epoch(mnt: &Path, value: &str) -> ExitStatus {
    Command::new("sh")
        .arg("-c")
        .arg("echo \"$1\" > \"$2\"")
        .arg("sh")
        .arg(value)
        .arg(mnt.join(".shufflefs/epoch"))
        .status()
        .expect("run sh")
}

/// Writes `value` to `MNT/.shufflefs/epoch` (open with truncation, as `echo N >` does).
pub fn write_epoch(mnt: &Path, value: impl AsRef<[u8]>) -> io::Result<()> {
    fs::write(mnt.join(".shufflefs/epoch"), value)
}

/// Asserts `r` failed with errno `errno`.
#[track_caller]
pub fn assert_errno<T: Debug>(r: io::Result<T>, errno: i32, what: &str) {
    match r {
        Ok(v) => panic!("{what}: expected errno {errno}, got success {v:?}"),
        Err(e) => assert_eq!(
            e.raw_os_error(),
            Some(errno),
            "{what}: expected errno {errno}, got {e:?}"
        ),
    }
}

/// Asserts `path` answers ENOENT within a second (an old epoch's kernel entries are
/// invalidated asynchronously after an advance).
#[track_caller]
pub fn assert_gone_soon(path: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(1);
    while fs::symlink_metadata(path).is_ok() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(2));
    }
    assert_not_found(fs::symlink_metadata(path), what);
}

/// Asserts `r` failed with ENOENT.
#[track_caller]
pub fn assert_not_found<T: Debug>(r: io::Result<T>, what: &str) {
    assert_errno(r, libc::ENOENT, what);
}

// ---------------------------------------------------------------------------------------
// Python loaders
// ---------------------------------------------------------------------------------------

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The venv's python (`SHUFFLEFS_PYTHON`, else `mount-helpers/install-python.sh`'s) if it
/// runs `imports`, else `None` (skip; a failure under SHUFFLEFS_REQUIRE_LOADERS=1). `what`
/// names the packages in the message.
pub fn venv_python(imports: &str, what: &str) -> Option<PathBuf> {
    let python = std::env::var_os("SHUFFLEFS_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".cache/shufflefs/venv/bin/python"))
        })
        .filter(|p| p.exists());
    let usable = python.as_ref().is_some_and(|p| {
        Command::new(p)
            .args(["-c", imports])
            .env("TF_CPP_MIN_LOG_LEVEL", "3")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if usable {
        return python;
    }
    let why = format!("no Python venv with {what}; run `source mount-helpers/install-python.sh`");
    assert!(
        std::env::var("SHUFFLEFS_REQUIRE_LOADERS").as_deref() != Ok("1"),
        "SHUFFLEFS_REQUIRE_LOADERS=1 but {why}"
    );
    eprintln!("SKIPPED: {why}; set SHUFFLEFS_REQUIRE_LOADERS=1 to fail instead");
    None
}

/// Panics with both streams unless `out` succeeded.
pub fn check(what: &str, out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({})\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
