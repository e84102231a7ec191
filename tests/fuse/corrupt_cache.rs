//! Corrupt bytes in a cache folder never reach a reader (item 4): a byte flipped
//! in every cached sample, while mounted and again while unmounted, on both cache layouts,
//! through a real mount; every sample read through the view has its source's bytes and the
//! status counts each bad copy.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::common::*;

/// Flips byte 7 of every cached sample of 8 bytes or more, in place, as a stray write or
/// bit rot would; returns how many were flipped. Files layout: every file under `samples/`;
/// packed: every data record of every segment (48-byte headers, "SFR1", kind at 4, data
/// length at 16, see `cache/packed/format.rs`).
fn flip_every_sample(cache: &Path, packed: bool) -> u64 {
    let mut flipped = 0;
    let dir = cache.join(if packed { "segments" } else { "samples" });
    for path in fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()) {
        let bytes = fs::read(&path).unwrap();
        let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
        let mut flip = |at: usize| {
            file.write_all_at(&[bytes[at] ^ 0x5a], at as u64).unwrap();
            flipped += 1;
        };
        if !packed {
            if bytes.len() >= 8 {
                flip(7);
            }
            continue;
        }
        let mut pos = 0;
        while bytes.len() >= pos + 48 && bytes[pos..pos + 4] == *b"SFR1" {
            let len = u64::from_le_bytes(bytes[pos + 16..pos + 24].try_into().unwrap()) as usize;
            if bytes[pos + 4] == 1 && len >= 8 {
                flip(pos + 48 + 7);
            }
            pos += 48 + len;
        }
    }
    flipped
}

fn assert_every_sample_whole(view: &Path, data: &Dataset) {
    for s in &data.samples {
        let p = view.join(s.rel());
        let bytes = fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
        assert!(
            bytes == s.bytes(),
            "{} differs from the source",
            p.display()
        );
    }
}

fn failures(mnt: &Path) -> u64 {
    read_status(mnt)["cache"]["checksum_failures"]
        .as_u64()
        .unwrap()
}

fn flipped_bytes_never_reach_a_reader(layout: &str) {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let (cache, mnt) = (data.path("cache"), data.dir("mnt"));
    let args = ["--seed", "3", "--cache-layout", layout];
    let packed = layout == "packed";

    let d = Daemon::mount(&data.root, &cache, &mnt, &args);
    wait_staging_done(&mnt);
    let live = flip_every_sample(&cache, packed);
    assert_every_sample_whole(&mnt.join("epoch-0"), &data);
    assert_eq!(failures(&mnt), live, "{:#}", read_status(&mnt));
    d.unmount().assert_clean();

    let away = flip_every_sample(&cache, packed);
    let d = Daemon::mount(&data.root, &cache, &mnt, &args);
    wait_staging_done(&mnt);
    assert_every_sample_whole(&mnt.join("epoch-0"), &data);
    let s = read_status(&mnt);
    if !packed {
        // The packed layout's recovery drops rotten records before anything counts them.
        assert_eq!(failures(&mnt), away, "{s:#}");
    }
    // Every sample flipped was fetched again (`away` also counts the packed layout's dead
    // records, the copies replaced in the first life).
    assert!(
        s["cache"]["fetched_from_source"].as_u64().unwrap() >= live,
        "{s:#}"
    );
    d.unmount().assert_clean();
}

#[test]
fn flipped_bytes_in_cached_files_never_reach_a_reader() {
    flipped_bytes_never_reach_a_reader("files");
}

#[test]
fn flipped_bytes_in_packed_segments_never_reach_a_reader() {
    flipped_bytes_never_reach_a_reader("packed");
}
