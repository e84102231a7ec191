//! What a sample takes on the cache's disk: a partial cache's size is a bound on
//! the disk, not on file bytes. In the one-file-per-sample layout every file takes whole
//! blocks of its filesystem, so a 50,000-byte sample takes 53,248 bytes of 4 KiB blocks;
//! counting file bytes let two ranks sharing a small disk fill it (each thought it held
//! 0.98 MB and took 1.17 MB). The gate (`super::admission`), the store's held bytes and the
//! sizes the fit phase plans with (`daemon::startup::fit`) all count sizes rounded up to
//! the block, so the plan and the gate agree. The packed layout appends records into a few
//! large segment files and counts its segments' bytes itself (`CacheBackend::disk_bytes`):
//! its samples count as they are (a block of 1).

use std::path::Path;

use super::CacheLayout;

/// The unit a `layout` cache in `root` takes disk space in: the filesystem's block size
/// (statvfs `f_bsize`, else the folder's `st_blksize`, else 4 KiB) for one file per sample,
/// 1 for the packed layout.
pub fn block_of(root: &Path, layout: CacheLayout) -> u64 {
    use std::os::unix::fs::MetadataExt;
    if layout == CacheLayout::Packed {
        return 1;
    }
    let statvfs = nix::sys::statvfs::statvfs(root).map(|s| s.block_size());
    let found = statvfs
        .ok()
        .or_else(|| std::fs::metadata(root).ok().map(|m| m.blksize()));
    found.filter(|&b| b > 0).unwrap_or(4096)
}

/// `bytes` rounded up to whole `block`s.
pub fn on_disk(bytes: u64, block: u64) -> u64 {
    bytes.div_ceil(block.max(1)).saturating_mul(block.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_whole_blocks() {
        assert_eq!(on_disk(0, 4096), 0);
        assert_eq!(on_disk(1, 4096), 4096);
        assert_eq!(on_disk(50_000, 4096), 53_248);
        assert_eq!(on_disk(8192, 4096), 8192);
        assert_eq!(on_disk(7, 1), 7);
        // Rounding a sum of rounded sizes changes nothing.
        assert_eq!(
            on_disk(on_disk(5, 4096) + on_disk(9000, 4096), 4096),
            4096 + 12_288
        );
    }
}
