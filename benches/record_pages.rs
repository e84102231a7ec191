//! Page reads saved by page-aware grouping (LIRS Figure 6), for records of half a page.
//!
//!     cargo bench --bench record_pages            # 64 MiB source
//!     SHUFFLEFS_BENCH_MB=512 cargo bench --bench record_pages
//!
//! A file of 2048-byte records (two per 4 KiB page) is indexed twice, `--group pages` and
//! `--group records`, and one epoch is read in a seeded random order of the units, as the
//! view does (positioned reads of each unit's byte range, as `RecordSource` makes them,
//! with `POSIX_FADV_RANDOM` so readahead does not load neighbours either way). The paper's setting is a dataset larger than memory, where the page holding a
//! record is evicted before its neighbour is read; the bench models that by evicting every
//! unit's pages right after reading it (`POSIX_FADV_DONTNEED`), starting from a cold file.
//! Page transfers are counted two ways: pages not resident (`mincore`) when a unit is about
//! to be read, and the device bytes the process read (`/proc/self/io` `read_bytes`, 0 on
//! filesystems without a block device, such as tmpfs). The paper reports up to 50% saved.
//!
//! Last results (2 shared cores, ext4 on a virtual disk, 64 MiB, two runs):
//!
//! | group   | units | pages loaded | device MiB read | seconds     |
//! |---------|-------|--------------|-----------------|-------------|
//! | records | 32768 | 32768        | 128.0           | 4.06 / 2.93 |
//! | pages   | 16384 | 16384        | 64.0            | 2.30 / 1.21 |
//!
//! Grouping saves 50.0% of page loads (the paper: up to 50%).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::time::Instant;

use shufflefs::dataset::records::{Grouping, RecordParams, build_index};
use shufflefs::dataset::{Framing, Manifest};

const RECORD: u64 = 2048;
const PAGE: u64 = 4096;

fn read_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| {
                    l.strip_prefix("read_bytes: ")
                        .map(|v| v.trim().parse().ok())
                })
                .flatten()
        })
        .unwrap_or(0)
}

fn evict(file: &File, offset: u64, len: u64) {
    let _ = nix::fcntl::posix_fadvise(
        file,
        offset as i64,
        len as i64,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    );
}

/// Pages of `[start, end)` not in the page cache.
fn missing_pages(map: &memmap2::Mmap, start: u64, end: u64) -> u64 {
    let first = start / PAGE * PAGE;
    let pages = (end - first).div_ceil(PAGE) as usize;
    let mut vec = vec![0u8; pages];
    // SAFETY: the range lies inside the mapping (records end within the file) and `vec`
    // has one byte per page of it, as mincore(2) requires.
    let rc = unsafe {
        libc::mincore(
            map.as_ptr().add(first as usize) as *mut libc::c_void,
            (end - first) as usize,
            vec.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    vec.iter().filter(|&&b| b & 1 == 0).count() as u64
}

/// A seeded shuffle (xorshift; the bench needs repeatability, not the plan's stream).
fn shuffled(n: u64, seed: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..n).collect();
    let mut x = seed | 1;
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` lists benches; nothing to list
    }
    // `cargo bench` passes --bench; under `cargo test --all-targets`, a 4 MiB smoke run.
    let full = std::env::args().any(|a| a == "--bench");
    let mb: u64 = std::env::var("SHUFFLEFS_BENCH_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 64 } else { 4 });
    let base = std::env::var_os("SHUFFLEFS_BENCH_DIR").map_or_else(std::env::temp_dir, Into::into);
    let dir = tempfile::tempdir_in(base).unwrap();
    let path = dir.path().join("records.bin");
    let records = mb * (1 << 20) / RECORD;
    {
        let mut f = File::create(&path).unwrap();
        let mut rec = vec![0u8; RECORD as usize];
        for i in 0..records {
            rec[..8].copy_from_slice(&i.to_le_bytes());
            f.write_all(&rec).unwrap();
        }
        f.sync_all().unwrap();
    }
    let file = File::open(&path).unwrap();
    // SAFETY: read-only map of a file this bench wrote and no one changes.
    let map = unsafe { memmap2::Mmap::map(&file).unwrap() };
    println!(
        "{records} records of {RECORD} B ({mb} MiB) in {}",
        path.display()
    );
    println!(
        "{:<8} {:>8} {:>14} {:>16} {:>10}",
        "group", "units", "pages loaded", "device MiB read", "seconds"
    );
    let mut loaded = Vec::new();
    for grouping in [Grouping::Records, Grouping::Pages] {
        let params = RecordParams {
            framing: Framing::Fixed,
            record_size: RECORD,
            grouping,
            header_line: false,
        };
        let (index, skipped) = build_index(dir.path(), &params).unwrap();
        let m = Manifest::from_records(index, skipped);
        // Random reads: no readahead, which would load the neighbours whatever the unit.
        let _ = nix::fcntl::posix_fadvise(
            &file,
            0,
            0,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_RANDOM,
        );
        evict(&file, 0, 0); // cold start: the whole file out of the page cache
        let (io0, t0) = (read_bytes(), Instant::now());
        let mut pages = 0;
        let mut buf = vec![0u8; PAGE as usize * 2];
        for g in shuffled(m.len(), 42) {
            let span = m.records().unwrap().span(g);
            pages += missing_pages(&map, span.start, span.end);
            let len = (span.end - span.start) as usize;
            file.read_exact_at(&mut buf[..len], span.start).unwrap();
            // Memory smaller than the dataset: the unit's pages are gone before the next.
            // (Whole pages: DONTNEED keeps a page the range covers only in part.)
            let first = span.start / PAGE * PAGE;
            evict(&file, first, span.end.div_ceil(PAGE) * PAGE - first);
        }
        let secs = t0.elapsed().as_secs_f64();
        let dev = (read_bytes() - io0) as f64 / f64::from(1 << 20);
        println!(
            "{:<8} {:>8} {:>14} {:>16.1} {:>10.3}",
            format!("{grouping:?}").to_lowercase(),
            m.len(),
            pages,
            dev,
            secs
        );
        loaded.push(pages);
    }
    let saved = 1.0 - loaded[1] as f64 / loaded[0] as f64;
    println!(
        "page loads saved by grouping: {:.1}% (paper: up to 50%)",
        saved * 100.0
    );
}
