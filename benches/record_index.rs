//! Ready time of a record source: rank 0's one pass building the offset table, against a
//! plain sequential read of the same files (`cat SRC/* >/dev/null`). Target: at most 1.2x.
//!
//!     cargo bench --bench record_index                      # 2M records of 362 B (~724 MB)
//!     SHUFFLEFS_BENCH_RECORDS=19000000 cargo bench --bench record_index   # kdd size, ~7 GB
//!     SHUFFLEFS_BENCH_FRAMING=tfrecord cargo bench --bench record_index
//!
//! The source is 8 shard files of LIBSVM-like lines of 362 bytes (kdd/webspam), or the same
//! payloads as TFRecords. Both runs start cold: each file's pages are evicted with
//! `POSIX_FADV_DONTNEED` before each run (the files are synced, so every page goes). Each is run 3 times, alternating; the medians are compared. The
//! source goes to SHUFFLEFS_BENCH_DIR (default: the temporary folder) and is removed after.
//!
//! Last results (2 cores shared with other builds, load ~11; ext4 on a virtual disk; 2M records):
//!
//! | framing  | cat (cold)    | index (cold)  | index / cat   | warm cat / index | table       |
//! |----------|---------------|---------------|---------------|------------------|-------------|
//! | lines    | 1.04 / 0.71 s | 0.45 / 0.55 s | 0.44x / 0.77x | 0.14 / 0.21 s    | 12.35 B/rec |
//! | tfrecord | 1.33 s        | 0.68 s        | 0.51x         |                  | 12.37 B/rec |

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use shufflefs::dataset::Framing;
use shufflefs::dataset::records::{Grouping, RecordParams, build_index, scan::masked_crc};

const FILES: u64 = 8;
const LINE: usize = 362;

/// Evicts the source's pages (clean after `sync_all`) from the page cache: a cold start for
/// these files without dropping everyone else's cache on a shared machine.
fn drop_caches(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let f = File::open(e.unwrap().path()).unwrap();
        let _ = nix::fcntl::posix_fadvise(
            &f,
            0,
            0,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        );
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // `cargo bench` passes --bench; under `cargo test --all-targets`, a 20k-record smoke run.
    let full = std::env::args().any(|a| a == "--bench");
    let records: u64 = std::env::var("SHUFFLEFS_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 2_000_000 } else { 20_000 });
    let framing = match std::env::var("SHUFFLEFS_BENCH_FRAMING").as_deref() {
        Ok("tfrecord") => Framing::Tfrecord,
        _ => Framing::Lines,
    };
    let base = std::env::var_os("SHUFFLEFS_BENCH_DIR").map_or_else(std::env::temp_dir, Into::into);
    let dir = tempfile::tempdir_in(base).unwrap();
    let t = Instant::now();
    let mut bytes = 0u64;
    for f in 0..FILES {
        let mut out = BufWriter::with_capacity(
            1 << 20,
            File::create(dir.path().join(format!("part-{f:03}"))).unwrap(),
        );
        let mut line = vec![b' '; LINE];
        for i in (f * records / FILES)..((f + 1) * records / FILES) {
            let head = format!("{} 1:{i} ", i % 2);
            line[..head.len()].copy_from_slice(head.as_bytes());
            for (k, b) in line[head.len()..LINE - 1].iter_mut().enumerate() {
                *b = b'0' + ((i as usize + k) % 10) as u8;
            }
            line[LINE - 1] = b'\n';
            match framing {
                Framing::Tfrecord => {
                    let data = &line[..LINE - 1];
                    let len = (data.len() as u64).to_le_bytes();
                    out.write_all(&len).unwrap();
                    out.write_all(&masked_crc(&len).to_le_bytes()).unwrap();
                    out.write_all(data).unwrap();
                    out.write_all(&masked_crc(data).to_le_bytes()).unwrap();
                    bytes += 16 + data.len() as u64;
                }
                _ => {
                    out.write_all(&line).unwrap();
                    bytes += LINE as u64;
                }
            }
        }
        out.into_inner().unwrap().sync_all().unwrap();
    }
    println!(
        "{records} {} records, {:.0} MB in {FILES} files under {} (written in {:.1}s)",
        framing.name(),
        bytes as f64 / 1e6,
        dir.path().display(),
        t.elapsed().as_secs_f64()
    );
    let params = RecordParams {
        framing,
        record_size: 0,
        grouping: Grouping::Pages,
        header_line: false,
    };
    let (mut cat, mut index) = (Vec::new(), Vec::new());
    let mut table = 0;
    for _ in 0..3 {
        drop_caches(dir.path());
        let t = Instant::now();
        let ok = Command::new("sh")
            .arg("-c")
            .arg(format!("cat {}/* >/dev/null", dir.path().display()))
            .status()
            .unwrap()
            .success();
        assert!(ok);
        cat.push(t.elapsed().as_secs_f64());
        drop_caches(dir.path());
        let t = Instant::now();
        let (ix, skipped) = build_index(dir.path(), &params).unwrap();
        index.push(t.elapsed().as_secs_f64());
        assert!(skipped.is_empty() && ix.records() == records);
        table = ix.table_bytes();
    }
    // Warm (source in the page cache): what the pass costs in CPU beyond reading.
    let t = Instant::now();
    Command::new("sh")
        .arg("-c")
        .arg(format!("cat {}/* >/dev/null", dir.path().display()))
        .status()
        .unwrap();
    let warm_cat = t.elapsed().as_secs_f64();
    let t = Instant::now();
    build_index(dir.path(), &params).unwrap();
    let warm_index = t.elapsed().as_secs_f64();
    let (c, i) = (median(cat), median(index));
    println!(
        "cat SRC/* >/dev/null : {c:.2}s ({:.0} MB/s)",
        bytes as f64 / 1e6 / c
    );
    println!(
        "index build (1 pass) : {i:.2}s ({:.0} MB/s)",
        bytes as f64 / 1e6 / i
    );
    println!("ratio index/cat      : {:.2}x (target <= 1.2x)", i / c);
    println!("warm (page cache)    : cat {warm_cat:.2}s, index {warm_index:.2}s");
    println!(
        "offset table         : {:.1} MB, {:.2} bytes a record (budget 16)",
        table as f64 / 1e6,
        table as f64 / records as f64
    );
}
