//! The mount's readahead window, raised so large samples stream in large requests.
//!
//! Without passthrough (`--read-path page-cache` or `daemon`, or a kernel without it) the
//! kernel asks the daemon for a file's bytes in requests as large as the mount's readahead
//! window, 128 KiB by default: a 1 GiB sample costs 8192 round trips, and streaming ran at
//! half the disk's speed. The window belongs to the mount's backing device info
//! (`/sys/class/bdi/MAJ:MIN/read_ahead_kb`), which only root may change. It must be raised
//! after the FUSE handshake: the kernel lowers it to what the daemon's INIT reply offers,
//! and that reply may offer no more than the kernel's current window. FUSE caps a request
//! at 1 MiB (256 pages), so 1 MiB is what we ask for. Passthrough reads are unaffected:
//! they use the cache file's own readahead.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The window to raise to, in KiB: FUSE's largest read request.
pub const WINDOW_KB: u64 = 1024;

/// Where the window of the filesystem with device number `dev` is set.
pub fn sysfs_path(dev: u64) -> PathBuf {
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    PathBuf::from(format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb"))
}

/// Raises the readahead window of the filesystem mounted at `mountpoint` to at least
/// `kb` KiB, once the mount answers. Returns the window now in effect. Best effort: the
/// caller logs a failure (not root, sysfs read-only in a container) and carries on.
pub fn raise(mountpoint: &Path, kb: u64) -> std::io::Result<u64> {
    // The mount answers only after the handshake, which is what we need. One open folder
    // for both questions, so an unmount in between cannot make us tune the disk below.
    let root = std::fs::File::open(mountpoint)?;
    if nix::sys::statfs::fstatfs(&root)?.filesystem_type() != nix::sys::statfs::FUSE_SUPER_MAGIC {
        return Err(std::io::Error::other(format!(
            "{} is no longer a FUSE mount",
            mountpoint.display()
        )));
    }
    let path = sysfs_path(root.metadata()?.dev());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_device_as_sysfs_does() {
        let dev = nix::sys::stat::makedev(0, 40);
        assert_eq!(
            sysfs_path(dev),
            Path::new("/sys/class/bdi/0:40/read_ahead_kb")
        );
        let dev = nix::sys::stat::makedev(259, 1 << 12);
        assert_eq!(
            sysfs_path(dev),
            Path::new("/sys/class/bdi/259:4096/read_ahead_kb")
        );
    }
}
