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
