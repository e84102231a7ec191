//! The daemon's allocator: fewer glibc malloc arenas.
//!
//! glibc gives a thread that allocates while another holds an arena an arena of its own, up
//! to eight per core, and an arena keeps what was freed in it for its threads. A daemon's
//! threads (the FUSE workers, the exchange's disk threads, staging, the coordinator, the
//! prepare and fallback threads) each allocate at some point, so its resident memory grew
//! past its live heap by the arenas' free pages: at 10^7 one-record samples on 8 ranks of
//! the 2-core VM, anonymous memory summed over the daemons was 2,381 MiB with glibc's
//! default, 2,248 with 4 arenas and 2,102-2,133 with 2 (docs/performance.md). Small
//! allocations go through each thread's cache (tcache) without taking an arena's lock, and
//! the daemon's large buffers (frames, read buffers) are pooled, so two arenas cost little
//! contention. A `MALLOC_ARENA_MAX` set by the user wins.

/// Arenas the daemon's allocator keeps (see the module docs).
const ARENAS: i32 = 2;

/// Caps glibc's arenas at [`ARENAS`] unless `MALLOC_ARENA_MAX` is set. Call before the
/// daemon starts its threads.
pub fn fewer_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: `mallopt` only sets a parameter of glibc's allocator (it takes the
        // allocator's own lock); no memory is touched and no invariant of ours depends on it.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, ARENAS);
        }
    }
}

/// The memory this process may fill, page cache included: the machine's (`MemTotal`), or
/// its cgroup's limit where that is lower (a container's `memory.max`, which counts the
/// page cache of the files it reads). `None` if neither can be read.
pub fn memory_limit() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_total(&text));
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|text| cgroup_v2_path(&text).map(str::to_string))
        .and_then(|path| {
            let file = format!("/sys/fs/cgroup{path}/memory.max");
            std::fs::read_to_string(file).ok()
        })
        .and_then(|text| text.trim().parse::<u64>().ok());
    match (total, cgroup) {
        (Some(t), Some(c)) => Some(t.min(c)),
        (t, c) => t.or(c),
    }
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The cgroup v2 path of `/proc/self/cgroup` (its `0::PATH` line).
fn cgroup_v2_path(cgroup: &str) -> Option<&str> {
    cgroup.lines().find_map(|l| l.strip_prefix("0::"))
}

#[cfg(test)]
mod tests {
    use super::{cgroup_v2_path, mem_total};

    #[test]
    fn meminfo_and_cgroup_lines_are_read() {
        let meminfo = "MemTotal:       24551516 kB\nMemFree:         1234 kB\n";
        assert_eq!(mem_total(meminfo), Some(24_551_516 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(
            cgroup_v2_path("0::/user.slice/x.scope\n"),
            Some("/user.slice/x.scope")
        );
        assert_eq!(cgroup_v2_path("12:memory:/docker/abc\n"), None);
    }
}
