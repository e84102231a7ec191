//! `--read-path auto` (the default): which read path a mount uses, from its share and the
//! machine, decided once before mounting (the kernel learns it at INIT and at the first
//! OPEN, and no mount can change it afterwards).
//!
//! Round trips per file decide small-file reads. With `passthrough` every open is a request
//! to the daemon and every close another (answered without the reader waiting), and the
//! kernel marks a file's access time stale after each read through a backing file
//! (`fuse_file_accessed` in fs/fuse/passthrough.c; only a read-only superblock skips it, and
//! the epoch control file needs writes), so the next `fstat` of that file, which Python's
//! `open()` makes, is a GETATTR: three requests per file read again, measured with
//! `strace` of the daemon on Linux 6.18. With `page-cache` the kernel opens without asking
//! and keeps the pages it read: a file read before costs no request at all, and one read
//! for the first time costs a LOOKUP and one READ, whose bytes the daemon copies out of the
//! cache file. That copy is what passthrough saves: it costs CPU per byte, and a share that
//! does not fit in memory is read cold every epoch. Hence the rule:
//!
//! - a cache without a file per sample (`--cache-layout packed`) or a record source keeps
//!   `passthrough` (served by the daemon where there is no file to pass; what it always did),
//!   and so does a partial cache (its read-through samples are fetched per open, not per
//!   READ), a view shown to other users (`--allow-other`: page-cache's status links lead
//!   into the mounting user's private folder) and samples whose sizes cannot be learned;
//! - samples averaging over [`LARGE_SAMPLE`] bytes: `passthrough` (the per-open requests
//!   are small next to the bytes, which then never cross the daemon);
//! - a share larger than its part of the memory ([`memory_budget`]): `passthrough`;
//! - otherwise `page-cache`.

use crate::sys::kernel::ReadPath;

/// Mean sample size above which a share is read with passthrough: a first read through the
/// page-cache path copies the bytes through the daemon (~110 us of daemon CPU per cold
/// 100-120 KiB file on the 2-core VM, growing with the size), while passthrough's open and
/// release cost ~34 us whatever the size; a file read again costs page-cache nothing and
/// passthrough the same ~34 us (and a GETATTR).
pub const LARGE_SAMPLE: u64 = 256 << 10;

/// What the choice looks at: this rank's share, as the mount serves it first.
#[derive(Clone, Copy, Debug)]
pub struct Share {
    pub samples: u64,
    /// Its bytes as the cache-fit estimate counts them (in the cache's blocks); `None` where
    /// there is no estimate.
    pub bytes: Option<u64>,
    /// Whether each sample is a cache file of its own (`--cache-layout files` with a
    /// file-per-sample format); else the daemon serves reads whatever the read path.
    pub file_per_sample: bool,
    /// Whether the share does not fit the cache (a partial cache, docs/partial-cache.md):
    /// samples it does not keep are read through from the source, and without opens every
    /// READ of such a sample (and a LOOKUP that learns its size) would fetch it again.
    pub partial: bool,
    /// Whether other users read the view (`--allow-other`): page-cache mode's status and
    /// metrics are links into the mounting user's private folder, which they cannot follow,
    /// where passthrough serves them as files with the modes the view shows.
    pub allow_other: bool,
}

/// What the choice looks at: the machine.
#[derive(Clone, Copy, Debug)]
pub struct Machine {
    /// Memory this process may fill, page cache included (`sys::memory::memory_limit`).
    pub memory: Option<u64>,
    /// Ranks of this job on this host, which share its memory.
    pub ranks_here: u32,
}

/// A read path and why it was taken (logged, and shown by the status).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub path: ReadPath,
    pub why: String,
}

/// The page cache one rank may count on: half the memory, split among the host's ranks
/// (the rest is the training process's, and the kernel's).
pub fn memory_budget(machine: Machine) -> Option<u64> {
    machine
        .memory
        .map(|m| m / 2 / u64::from(machine.ranks_here.max(1)))
}

/// The read path for `requested` (itself unless it is [`ReadPath::Auto`]).
pub fn choose(requested: ReadPath, share: Share, machine: Machine) -> Choice {
    let chosen = |path, why: String| Choice { path, why };
    if requested != ReadPath::Auto {
        return chosen(requested, "--read-path".into());
    }
    if !share.file_per_sample {
        let why = "auto: no cache file per sample (packed cache or record source)";
        return chosen(ReadPath::Passthrough, why.into());
    }
    if share.partial {
        let why = "auto: a partial cache (the share does not fit --cache-size or the disk)";
        return chosen(ReadPath::Passthrough, why.into());
    }
    if share.allow_other {
        let why = "auto: --allow-other (other users read the status, which page-cache mode links into the mounting user's private folder)";
        return chosen(ReadPath::Passthrough, why.into());
    }
    let Some(bytes) = share.bytes else {
        let why =
            "auto: the samples' sizes are unknown (none of the probed samples could be sized)";
        return chosen(ReadPath::Passthrough, why.into());
    };
    let share = Share {
        bytes: Some(bytes),
        ..share
    };
    let mean = bytes.checked_div(share.samples).unwrap_or(0);
    if mean > LARGE_SAMPLE {
        let why = format!(
            "auto: samples average {}, over {}",
            size(mean),
            size(LARGE_SAMPLE)
        );
        return chosen(ReadPath::Passthrough, why);
    }
    match memory_budget(machine) {
        Some(budget) if bytes > budget => {
            let why = format!(
                "auto: the share ({}) does not fit its part of memory ({}: half of {} over {} ranks on this host)",
                size(bytes),
                size(budget),
                size(machine.memory.unwrap_or(0)),
                machine.ranks_here.max(1)
            );
            chosen(ReadPath::Passthrough, why)
        }
        None => chosen(
            ReadPath::Passthrough,
            "auto: the machine's memory is unknown".into(),
        ),
        Some(budget) => {
            let why = format!(
                "auto: small samples (average {}) and the share ({}) fits its part of memory ({})",
                size(mean),
                size(bytes),
                size(budget)
            );
            chosen(ReadPath::PageCache, why)
        }
    }
}

/// `bytes` in the largest binary unit it fills (rounded down): `1000 B`, `110 KiB`.
fn size(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut i = 0;
    while i + 1 < units.len() && bytes >> (10 * (i + 1)) > 0 {
        i += 1;
    }
    format!("{} {}", bytes >> (10 * i), units[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn share(samples: u64, bytes: u64) -> Share {
        Share {
            samples,
            bytes: Some(bytes),
            file_per_sample: true,
            partial: false,
            allow_other: false,
        }
    }

    fn machine(memory: u64, ranks_here: u32) -> Machine {
        Machine {
            memory: Some(memory),
            ranks_here,
        }
    }

    #[test]
    fn small_files_that_fit_use_the_page_cache() {
        let c = choose(ReadPath::Auto, share(20_000, 2 * GIB), machine(24 * GIB, 1));
        assert_eq!(c.path, ReadPath::PageCache, "{}", c.why);
        assert!(c.why.contains("fits"), "{}", c.why);
    }

    #[test]
    fn large_samples_pass_through() {
        let c = choose(ReadPath::Auto, share(1, GIB), machine(24 * GIB, 1));
        assert_eq!(c.path, ReadPath::Passthrough);
        assert!(c.why.contains("average 1 GiB, over 256 KiB"), "{}", c.why);
        let just = share(10, 10 * LARGE_SAMPLE);
        assert_eq!(
            choose(ReadPath::Auto, just, machine(GIB, 1)).path,
            ReadPath::PageCache
        );
        let over = share(10, 10 * LARGE_SAMPLE + 10);
        assert_eq!(
            choose(ReadPath::Auto, over, machine(GIB, 1)).path,
            ReadPath::Passthrough
        );
    }

    #[test]
    fn a_share_past_its_part_of_memory_passes_through() {
        // 24 GiB, 8 ranks: 1.5 GiB each.
        let fits = share(10_000, GIB + GIB / 2);
        assert_eq!(
            choose(ReadPath::Auto, fits, machine(24 * GIB, 8)).path,
            ReadPath::PageCache
        );
        let big = share(10_000, GIB + GIB / 2 + 1);
        let c = choose(ReadPath::Auto, big, machine(24 * GIB, 8));
        assert_eq!(c.path, ReadPath::Passthrough);
        assert!(c.why.contains("8 ranks"), "{}", c.why);
        let unknown = Machine {
            memory: None,
            ranks_here: 1,
        };
        assert_eq!(
            choose(ReadPath::Auto, fits, unknown).path,
            ReadPath::Passthrough
        );
    }

    #[test]
    fn packed_caches_record_sources_and_partial_caches_keep_passthrough() {
        let packed = Share {
            file_per_sample: false,
            ..share(10, 10)
        };
        assert_eq!(
            choose(ReadPath::Auto, packed, machine(GIB, 1)).path,
            ReadPath::Passthrough
        );
        let partial = Share {
            partial: true,
            ..share(10, 10)
        };
        let c = choose(ReadPath::Auto, partial, machine(GIB, 1));
        assert_eq!(c.path, ReadPath::Passthrough);
        assert!(c.why.contains("partial cache"), "{}", c.why);
    }

    #[test]
    fn unknown_sizes_and_other_users_keep_passthrough() {
        let unknown = Share {
            bytes: None,
            ..share(10, 0)
        };
        let c = choose(ReadPath::Auto, unknown, machine(GIB, 1));
        assert_eq!(c.path, ReadPath::Passthrough);
        assert!(c.why.contains("unknown"), "{}", c.why);
        let others = Share {
            allow_other: true,
            ..share(10, 10)
        };
        let c = choose(ReadPath::Auto, others, machine(GIB, 1));
        assert_eq!(c.path, ReadPath::Passthrough);
        assert!(c.why.contains("--allow-other"), "{}", c.why);
    }

    #[test]
    fn sizes_read_in_their_unit() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(1023), "1023 B");
        assert_eq!(size(110 << 10), "110 KiB");
        assert_eq!(size(12 * GIB + 5), "12 GiB");
    }

    #[test]
    fn an_empty_share_uses_the_page_cache() {
        assert_eq!(
            choose(ReadPath::Auto, share(0, 0), machine(GIB, 1)).path,
            ReadPath::PageCache
        );
    }

    #[test]
    fn a_path_asked_for_is_kept() {
        for path in [ReadPath::Passthrough, ReadPath::PageCache, ReadPath::Daemon] {
            let c = choose(path, share(1, GIB), machine(GIB, 1));
            assert_eq!(c.path, path);
        }
    }
}
