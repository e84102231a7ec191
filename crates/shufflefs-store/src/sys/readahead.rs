//! The mount's readahead window, raised so large samples stream in large requests.
//!
//! Without passthrough (`--read-path page-cache` or `daemon`, or a kernel without it) the
//! kernel asks the daemon for a file's bytes in requests as large as the mount's readahead
//! window, 128 KiB by default: a 1 GiB sample costs 8192 round trips, and streaming ran at
//! half the disk's speed. The window belongs to the mount's backing device info
//! (`/sys/class/bdi/MAJ:MIN/read_ahead_kb`, MAJ:MIN from the mount table), which only root
//! may change. It must be raised after the FUSE handshake: the kernel lowers it to what
//! the daemon's INIT reply offers, and that reply may offer no more than the kernel's
//! current window. FUSE caps a request
//! at 1 MiB (256 pages), so 1 MiB is what we ask for. Passthrough reads are unaffected:
//! they use the cache file's own readahead.

use std::path::{Path, PathBuf};

use crate::sys::mounts;

/// The window to raise to, in KiB: FUSE's largest read request.
pub const WINDOW_KB: u64 = 1024;

/// Raises the readahead window of the FUSE filesystem mounted at `mountpoint` to at least
/// `kb` KiB; call it once the handshake is done (fuser's `Session::new` does it). Returns
/// the window now in effect. Touches only the mount table and sysfs, never the mount, so
/// it needs no request thread. Best effort: the caller logs a failure (not root, sysfs
/// read-only in a container) and carries on.
pub fn raise(mountpoint: &Path, kb: u64) -> std::io::Result<u64> {
    let device = mounts::fuse_device(mountpoint).ok_or_else(|| {
        std::io::Error::other(format!("no FUSE mount at {}", mountpoint.display()))
    })?;
    let path = PathBuf::from(format!("/sys/class/bdi/{device}/read_ahead_kb"));
    let current: u64 = std::fs::read_to_string(&path)?
        .trim()
        .parse()
        .map_err(std::io::Error::other)?;
    if current >= kb {
        return Ok(current);
    }
    std::fs::write(&path, format!("{kb}\n"))?;
    Ok(kb)
}
