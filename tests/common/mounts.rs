//! The mount table as the tests see it (`/proc/self/mountinfo`), and unmounting whatever a
//! test left behind, so a failed test never leaves a mount on the machine.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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

/// Tears down a job started with `mount-helpers/shufflefs-launch --job JOB` as a user would
/// (`shufflefs-teardown --job JOB`), then checks that none of `mounts` is left: one left is
/// removed and, unless the test is already failing, fails it.
pub fn teardown_launched(job: &Path, mounts: impl IntoIterator<Item = PathBuf>) {
    let out = Command::new(super::repo().join("mount-helpers/shufflefs-teardown"))
        .env("SHUFFLEFS", super::BIN)
        .arg("--job")
        .arg(job)
        .output();
    for m in mounts {
        if is_mounted(&m) {
            force_unmount(&m);
            if !std::thread::panicking() {
                panic!("teardown left {} mounted: {out:?}", m.display());
            }
        }
    }
}

/// Small tmpfs mounts a test makes (caches that must fill, or be exactly so large),
/// unmounted (detached) however the test ends.
#[derive(Default)]
pub struct Tmpfs(pub Vec<PathBuf>);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`mount -o size=` syntax: `1250k`, `2M`) at `dir`, which must
    /// exist.
    pub fn add(&mut self, dir: &Path, size: &str) {
        let options = format!("size={size}");
        nix::mount::mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(options.as_str()),
        )
        .unwrap_or_else(|e| panic!("mount a {size} tmpfs at {}: {e}", dir.display()));
        self.0.push(dir.to_path_buf());
    }

    /// One tmpfs of `size` at `dir` (created).
    pub fn at(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let mut t = Tmpfs::default();
        t.add(dir, size);
        t
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}
