//! Checks made before anything is mounted, each failing with a message that names the
//! thing and says what to do.

use std::fs;
use std::path::Path;

/// Why a folder cannot be mounted on; each message names the folder and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum MountpointError {
    #[error("mount point {0} does not exist; create it with `mkdir -p {0}`")]
    Missing(DisplayPath),
    #[error("mount point {0} is not a folder")]
    NotAFolder(DisplayPath),
    #[error(
        "mount point {0} is busy: something is already mounted there; unmount it first (`shufflefs unmount {0}`)"
    )]
    Busy(DisplayPath),
    #[error("mount point {0} is not empty; mount on an empty folder so nothing is hidden")]
    NotEmpty(DisplayPath),
    #[error(
        "mount point {0} is a dead mount left by a daemon that exited; unmount it with `shufflefs unmount {0}` (or `fusermount3 -u`)"
    )]
    DeadMount(DisplayPath),
    #[error("mount point {path}: {source}")]
    Io {
        path: DisplayPath,
        source: std::io::Error,
    },
}

/// A path as error messages show it.
#[derive(Debug)]
pub struct DisplayPath(pub std::path::PathBuf);

impl std::fmt::Display for DisplayPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.display().fmt(f)
    }
}

/// The mount point must exist, be a folder, be empty and not already be a mount. A dead
/// shufflefs mount left by a daemon that was killed is cleaned up first.
pub fn mountpoint(path: &Path) -> Result<(), MountpointError> {
    let p = || DisplayPath(path.to_path_buf());
    let mut meta = fs::metadata(path);
    if meta
        .as_ref()
        .is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN))
    {
        clean_dead_mount(path)?;
        meta = fs::metadata(path);
    }
    let meta = meta.map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => MountpointError::Missing(p()),
        _ => MountpointError::Io { path: p(), source },
    })?;
    if !meta.is_dir() {
        return Err(MountpointError::NotAFolder(p()));
    }
    if is_mounted(path) {
        return Err(MountpointError::Busy(p()));
    }
    let mut entries =
        fs::read_dir(path).map_err(|source| MountpointError::Io { path: p(), source })?;
    if entries.next().is_some() {
        return Err(MountpointError::NotEmpty(p()));
    }
    Ok(())
}

/// `path` answers "transport endpoint is not connected": a FUSE mount whose daemon died. If
/// it is a shufflefs mount nothing can be lost by detaching it, so do that.
fn clean_dead_mount(path: &Path) -> Result<(), MountpointError> {
    let absolute = path
        .parent()
        .and_then(|p| {
            fs::canonicalize(if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            })
            .ok()
        })
        .zip(path.file_name())
        .map(|(dir, name)| dir.join(name));
    let is_ours =
        absolute.is_some_and(|abs| mounts().any(|m| Path::new(&m.target) == abs && m.is_ours()));
    if !is_ours || !detach(path) {
        return Err(MountpointError::DeadMount(DisplayPath(path.to_path_buf())));
    }
    tracing::warn!(mountpoint = %path.display(), "removed a dead shufflefs mount left by a daemon that was killed");
    Ok(())
}

/// Lazily unmounts `path`: it leaves the namespace at once, files already open keep working,
/// and the daemon's session ends when the last one is closed. Root detaches directly, others
/// go through fusermount3.
pub fn detach(path: &Path) -> bool {
    nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH).is_ok()
        || std::process::Command::new("fusermount3")
            .arg("-uz")
            .arg(path)
            .output()
            .is_ok_and(|o| o.status.success())
}

/// Whether `path` is the target of a mount, from `/proc/self/mountinfo`.
pub fn is_mounted(path: &Path) -> bool {
    let Ok(canonical) = fs::canonicalize(path) else {
        return false;
    };
    mounts().any(|m| Path::new(&m.target) == canonical)
}

/// The device (`MAJ:MIN`) of the newest FUSE mount at `path`, from `/proc/self/mountinfo`,
/// without touching the mount itself (its daemon may not be answering).
pub fn fuse_device(path: &Path) -> Option<String> {
    let target = absolute(path)?;
    mounts()
        .filter(|m| Path::new(&m.target) == target && m.fstype.starts_with("fuse"))
        .last()
        .map(|m| m.device)
}

/// Whether a mount of device `device` (`MAJ:MIN`, as [`fuse_device`] gives it) is still in
/// this process's mount table: a lazily detached mount is not, though its connection
/// lives on while files are open there.
pub fn device_mounted(device: &str) -> bool {
    mounts().any(|m| m.device == device)
}

/// One line of `/proc/self/mountinfo`: where, what type, from what, on which device.
struct MountEntry {
    device: String,
    target: String,
    fstype: String,
    source: String,
}

impl MountEntry {
    /// A shufflefs mount (`daemon::mounted` mounts with FSName and Subtype "shufflefs"):
    /// "fuse shufflefs" when root mounts directly, "fuse.shufflefs ..." through fusermount3.
    fn is_ours(&self) -> bool {
        self.fstype == "fuse.shufflefs" || (self.fstype == "fuse" && self.source == "shufflefs")
    }
}

/// What the mount table says is mounted at a path.
#[derive(Debug, PartialEq, Eq)]
pub enum MountKind {
    /// Nothing: the path is not a mount point.
    None,
    Shufflefs,
    /// Another file system, e.g. `tmpfs` from `tmpfs`.
    Other {
        fstype: String,
        source: String,
    },
}

/// What is mounted at `path` (the newest mount there), found without touching the mount
/// itself when its folder name suffices (its daemon may not be answering), else through
/// the path's canonical form (a link to a mount point).
pub fn mount_kind(path: &Path) -> MountKind {
    let newest = |target: &Path| mounts().filter(|m| Path::new(&m.target) == target).last();
    let entry = absolute(path)
        .and_then(|t| newest(&t))
        .or_else(|| fs::canonicalize(path).ok().and_then(|t| newest(&t)));
    match entry {
        None => MountKind::None,
        Some(m) if m.is_ours() => MountKind::Shufflefs,
        Some(m) => MountKind::Other {
            fstype: m.fstype,
            source: m.source,
        },
    }
}

/// `path` made absolute through its parent only (the last component is not followed).
pub fn absolute(path: &Path) -> Option<std::path::PathBuf> {
    match (path.parent(), path.file_name()) {
        (Some(p), Some(name)) if !p.as_os_str().is_empty() => {
            Some(fs::canonicalize(p).ok()?.join(name))
        }
        (Some(_), Some(name)) => Some(std::env::current_dir().ok()?.join(name)),
        _ => fs::canonicalize(path).ok(),
    }
}

/// Every file that a process this user can see holds open under the mount at `path`
/// (open files, working and root folders), from `/proc/PID/{fd/*,cwd,root}`. The names
/// are read from the links, never through the mount.
pub fn open_under(path: &Path) -> Vec<std::path::PathBuf> {
    let Some(root) = absolute(path) else {
        return Vec::new();
    };
    let Ok(procs) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for p in procs.flatten() {
        if !p
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let dir = p.path();
        let fds = fs::read_dir(dir.join("fd")).into_iter().flatten().flatten();
        let links = fds
            .map(|fd| fd.path())
            .chain([dir.join("cwd"), dir.join("root")]);
        found.extend(
            links
                .filter_map(|l| fs::read_link(l).ok())
                .filter(|t| t.starts_with(&root)),
        );
    }
    found
}

/// This process's mount table (empty if it cannot be read).
fn mounts() -> impl Iterator<Item = MountEntry> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let entries: Vec<MountEntry> = info
        .lines()
        .filter_map(|line| {
            let device = line.split(' ').nth(2)?.to_string();
            let target = unescape_mountinfo(line.split(' ').nth(4)?);
            // After " - ": fstype, source, super options.
            let mut rest = line.split(" - ").nth(1)?.split(' ');
            let (fstype, source) = (rest.next()?.to_string(), rest.next()?.to_string());
            Some(MountEntry {
                device,
                target,
                fstype,
                source,
            })
        })
        .collect();
    entries.into_iter()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape_mountinfo(r"/x\134y"), r"/x\y");
        assert_eq!(unescape_mountinfo(r"/x\0"), r"/x\0");
    }

    #[test]
    fn mountpoint_checks() {
        let dir = tempfile::tempdir().unwrap();
        assert!(mountpoint(dir.path()).is_ok());
        assert!(matches!(
            mountpoint(&dir.path().join("missing")),
            Err(MountpointError::Missing(_))
        ));
        fs::write(dir.path().join("f"), b"x").unwrap();
        assert!(matches!(
            mountpoint(dir.path()),
            Err(MountpointError::NotEmpty(_))
        ));
        assert!(matches!(
            mountpoint(&dir.path().join("f")),
            Err(MountpointError::NotAFolder(_))
        ));
        assert!(is_mounted(Path::new("/proc")));
    }
}
