//! `--format records` on one mounted rank: every framing read by its real loader
//! (`tests/loaders/check_records.py`) for 3 epochs, bad records reported and left out, and
//! part bytes through the kernel equal to the groups laid end to end.

use std::collections::BTreeSet;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::records::*;
use crate::common::*;

const COUNT: u32 = 600;
const EPOCHS: u32 = 3;

fn mount(dir: &Path, src: &Path, kind: &str, extra: &[&str]) -> Daemon {
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mut args = flags(kind);
    args.extend_from_slice(&["--seed", "7", "--part-size", "16K"]);
    args.extend_from_slice(extra);
    Daemon::mount(src, &dir.join("cache"), &mnt, &args)
}

#[test]
fn every_framing_is_read_by_its_loader_for_three_epochs() {
    if !require_fuse() {
        return;
    }
    let Some(python) = loaders_python() else {
        return;
    };
    for (kind, _) in KINDS {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        make_records(&src, kind, COUNT, 3);
        let daemon = mount(dir.path(), &src, kind, &[]);
        let st = daemon.status();
        assert_eq!(st["dataset"]["format"], "records", "{st}");
        assert_eq!(st["dataset"]["records"], COUNT, "{kind}: {st}");
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        let mut cmd = Command::new(&python);
        with_package(&mut cmd)
            .env("TF_CPP_MIN_LOG_LEVEL", "3")
            .arg(repo().join("tests/loaders/check_records.py"))
            .arg("--mount")
            .arg(dir.path().join("mnt"))
            .args([
                "--kind",
                kind,
                "--epochs",
                &EPOCHS.to_string(),
                "--record-size",
                "72",
            ])
            .arg("--out")
            .arg(&out);
        check(
            &format!("check_records.py --kind {kind}"),
            &run_with_timeout(&mut cmd, Duration::from_secs(300)),
        );
        let epochs: Vec<Vec<u64>> = (0..EPOCHS).map(|e| ids(&out, 0, e)).collect();
        for (e, list) in epochs.iter().enumerate() {
            assert_partition(
                std::slice::from_ref(list),
                COUNT,
                &format!("{kind} epoch {e}"),
            );
        }
        assert_ne!(epochs[0], epochs[1], "{kind}: a fresh order every epoch");
        assert_ne!(epochs[1], epochs[2], "{kind}: a fresh order every epoch");
        daemon.unmount().assert_clean();
    }
}

/// TFRecord framing, by hand: length, masked CRC of it, data, masked CRC of the data.
fn tf(data: &[u8]) -> Vec<u8> {
    let mask = |b: &[u8]| {
        crc32c::crc32c(b)
            .rotate_right(15)
            .wrapping_add(0xa282_ead8)
            .to_le_bytes()
    };
    let head = (data.len() as u64).to_le_bytes();
    [&head[..], &mask(&head), data, &mask(data)].concat()
}

/// Splits a TFRecord file into payloads (trusting the lengths).
fn payloads(mut bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        out.push(bytes[12..12 + len].to_vec());
        bytes = &bytes[16 + len..];
    }
    out
}

#[test]
fn bad_records_are_reported_and_everything_else_is_served() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let recs: Vec<Vec<u8>> = (0..50)
        .map(|i| tf(format!("rec-{i}|{}", "z".repeat(i * 13)).as_bytes()))
        .collect();
    let mut file = Vec::new();
    let mut bad_at = 0;
    for (i, r) in recs.iter().enumerate() {
        if i == 20 {
            bad_at = file.len();
            let mut r = r.clone();
            *r.last_mut().unwrap() ^= 0xff;
            file.extend(r);
        } else {
            file.extend(r);
        }
    }
    std::fs::write(src.join("a.tfrecord"), &file).unwrap();
    std::fs::write(src.join("b.tfrecord"), b"").unwrap();
    // A record cut short at the end of a shard.
    let cut = tf(b"rec-cut|");
    std::fs::write(src.join("c.tfrecord"), [&recs[0][..], &cut[..10]].concat()).unwrap();
    let daemon = mount(dir.path(), &src, "tfrecord", &["--group", "records"]);
    let st = daemon.status();
    let skipped = st["skipped"].to_string();
    assert!(
        skipped.contains("a.tfrecord")
            && skipped.contains(&format!("byte offset {bad_at}: bad data CRC")),
        "{skipped}"
    );
    assert!(
        skipped.contains("b.tfrecord") && skipped.contains("empty file"),
        "{skipped}"
    );
    assert!(
        skipped.contains("c.tfrecord")
            && skipped.contains(&format!("byte offset {}: truncated record", recs[0].len())),
        "{skipped}"
    );
    assert_eq!(
        st["dataset"]["records"], 50,
        "49 good records of a, 1 of c: {st}"
    );
    let epoch = dir.path().join("mnt/epoch-0");
    let mut seen = Vec::new();
    for part in names(&epoch) {
        seen.extend(payloads(&std::fs::read(epoch.join(part)).unwrap()));
    }
    let mut want: Vec<Vec<u8>> = recs
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 20)
        .map(|(_, r)| payloads(r).remove(0))
        .collect();
    want.push(payloads(&recs[0]).remove(0));
    seen.sort();
    want.sort();
    assert_eq!(seen, want);
    daemon.unmount().assert_clean();
}

/// The served payloads of epoch 0, sorted.
fn served(dir: &Path) -> Vec<Vec<u8>> {
    let epoch = dir.join("mnt/epoch-0");
    let mut seen = Vec::new();
    for part in names(&epoch) {
        seen.extend(payloads(&std::fs::read(epoch.join(part)).unwrap()));
    }
    seen.sort();
    seen
}

/// Through a mount: a length of 2^62 whose CRC holds loses only its own
/// bytes (the 50 records after it are served, the one gap named by file and range), and a
/// shard cut in a record costs the next shard nothing (its first record is served, the cut
/// is named).
#[test]
fn a_hostile_length_and_a_cut_shard_lose_only_their_bytes() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let recs: Vec<Vec<u8>> = (0..56)
        .map(|i| tf(format!("rec-{i}|{}", "y".repeat(i * 7)).as_bytes()))
        .collect();
    let head = (1u64 << 62).to_le_bytes();
    let crc = masked(&head);
    let bad_at = recs[0].len();
    let a = [&recs[0][..], &head, &crc, &recs[1..51].concat()].concat();
    std::fs::write(src.join("a.tfrecord"), &a).unwrap();
    let cut_at = recs[51].len();
    let b = [&recs[51][..], &recs[52][..20]].concat();
    std::fs::write(src.join("b.tfrecord"), &b).unwrap();
    std::fs::write(src.join("c.tfrecord"), recs[53..].concat()).unwrap();
    let daemon = mount(dir.path(), &src, "tfrecord", &["--group", "records"]);
    let st = daemon.status();
    let skipped = st["skipped"].as_array().unwrap().clone();
    let text = st["skipped"].to_string();
    assert_eq!(skipped.len(), 2, "one gap, one cut: {text}");
    assert!(
        text.contains("a.tfrecord")
            && text.contains(&format!("byte offset {bad_at}: bad record length"))
            && text.contains(&format!(
                "bytes {bad_at}..{} (12 bytes) left out",
                bad_at + 12
            )),
        "{text}"
    );
    assert!(
        text.contains("b.tfrecord")
            && text.contains(&format!("byte offset {cut_at}: truncated record"))
            && text.contains(&format!("bytes {cut_at}..{} (20 bytes) left out", b.len())),
        "{text}"
    );
    assert_eq!(st["dataset"]["records"], 55, "all but record 52: {st}");
    let mut want: Vec<Vec<u8>> = recs
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 52)
        .map(|(_, r)| payloads(r).remove(0))
        .collect();
    want.sort();
    assert_eq!(served(dir.path()), want);
    daemon.unmount().assert_clean();
}

/// A ustar member `name` holding `data` (header, data, padding to 512 bytes).
fn tar_member(name: &str, data: &[u8]) -> Vec<u8> {
    let mut h = vec![0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..108].copy_from_slice(b"0000644\0");
    h[124..136].copy_from_slice(format!("{:011o}\0", data.len()).as_bytes());
    h[136..148].copy_from_slice(b"00000000000\0");
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h.extend(data);
    h.resize(h.len().div_ceil(512) * 512, 0);
    h
}

/// A tar shard with a damaged header mid-archive: the gap is named by file and range, and
/// every sample after it is served.
#[test]
fn a_damaged_tar_header_loses_only_its_sample() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let sample = |i: usize| {
        [
            tar_member(&format!("s{i:03}.txt"), format!("<text {i:03}>").as_bytes()),
            tar_member(&format!("s{i:03}.cls"), b"1"),
        ]
        .concat()
    };
    let mut a: Vec<u8> = (0..10).flat_map(sample).collect();
    let bad_at = a.len();
    let mut s10 = sample(10);
    s10[2] ^= 0x01; // the name of s010.txt: its header's checksum fails
    a.extend(s10);
    a.extend((11..40).flat_map(sample));
    a.extend([0u8; 1024]);
    std::fs::write(src.join("a.tar"), &a).unwrap();
    let daemon = mount(dir.path(), &src, "tar", &["--group", "records"]);
    let st = daemon.status();
    let text = st["skipped"].to_string();
    assert!(
        text.contains("a.tar")
            && text.contains(&format!(
                "byte offset {bad_at}: bad tar header checksum; bytes {bad_at}..{} (1024 bytes) left out",
                bad_at + 1024
            )),
        "{text}"
    );
    assert_eq!(st["dataset"]["records"], 39, "all but sample 10: {st}");
    let epoch = dir.path().join("mnt/epoch-0");
    let mut served = Vec::new();
    for part in names(&epoch) {
        served.extend(std::fs::read(epoch.join(part)).unwrap());
    }
    let text = String::from_utf8_lossy(&served);
    for i in 0..40 {
        let want = usize::from(i != 10);
        let n = text.matches(&format!("<text {i:03}>")).count();
        assert_eq!(n, want, "sample {i} served {n} times");
    }
    daemon.unmount().assert_clean();
}

/// TFRecord's masked CRC-32C.
fn masked(b: &[u8]) -> Vec<u8> {
    crc32c::crc32c(b)
        .rotate_right(15)
        .wrapping_add(0xa282_ead8)
        .to_le_bytes()
        .to_vec()
}

#[test]
fn reads_at_any_offset_match_the_whole_part() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    make_records(&src, "csv", 2000, 2);
    let daemon = mount(dir.path(), &src, "csv", &[]);
    let epoch = dir.path().join("mnt/epoch-0");
    let header = b"id,label,x0,x1\n";
    let mut lines = BTreeSet::new();
    for part in names(&epoch) {
        let path = epoch.join(&part);
        let whole = std::fs::read(&path).unwrap();
        assert_eq!(
            whole.len() as u64,
            std::fs::metadata(&path).unwrap().len(),
            "{part}: size exact"
        );
        assert!(whole.starts_with(header), "{part} starts with the header");
        assert!(whole.ends_with(b"\n"), "{part} ends with a whole line");
        let f = std::fs::File::open(&path).unwrap();
        for (off, len) in [
            (0, 1),
            (7, 5000),
            (4095, 2),
            (whole.len() as u64 - 3, 100),
            (123, 40_000),
        ] {
            let mut buf = vec![0u8; len];
            let n = f.read_at(&mut buf, off).unwrap();
            let lo = (off as usize).min(whole.len());
            assert_eq!(
                &buf[..n],
                &whole[lo..(lo + len).min(whole.len())],
                "{part} at {off}"
            );
        }
        for line in whole[header.len()..]
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
        {
            assert!(lines.insert(line.to_vec()), "a line twice");
        }
    }
    let mut source_lines = BTreeSet::new();
    for f in names(&src) {
        let bytes = std::fs::read(src.join(f)).unwrap();
        source_lines.extend(
            bytes
                .split(|&b| b == b'\n')
                .skip(1)
                .filter(|l| !l.is_empty())
                .map(<[u8]>::to_vec),
        );
    }
    assert_eq!(lines, source_lines, "the parts hold the source's lines");
    daemon.unmount().assert_clean();
}

#[test]
fn record_options_are_checked_and_a_cached_index_needs_the_same_settings() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    make_records(&src, "svm", 300, 2);
    let (cache, mnt) = (dir.path().join("cache"), dir.path().join("mnt"));
    std::fs::create_dir_all(&mnt).unwrap();
    let refused = |extra: &[&str], needle: &str| {
        mount_refused(&mnt, &mount_args(&src, &cache, &mnt, extra), true).assert_mentions(needle);
    };
    refused(
        &["--format", "records", "--framing", "fixed"],
        "--framing fixed needs --record-size",
    );
    refused(&["--framing", "tar"], "add --format records");
    refused(
        &["--format", "records", "--part-size", "0"],
        "at least 1 byte",
    );
    let missing = dir.path().join("nope");
    mount_refused(
        &mnt,
        &mount_args(&missing, &cache, &mnt, &["--format", "records"]),
        true,
    )
    .assert_mentions("does not exist");

    // Built once, reused by a remount with the same settings...
    let d = mount(dir.path(), &src, "svm", &[]);
    let groups = d.status()["dataset"]["groups"].clone();
    // One rank holds every record; the ready line counts records and their page groups.
    let want = format!("300 records of 300 in {groups} page groups of {groups}");
    assert!(
        d.ready_line.contains(&want),
        "{} lacks {want}",
        d.ready_line
    );
    d.unmount().assert_clean();
    let d = mount(dir.path(), &src, "svm", &[]);
    assert!(
        d.stderr().contains("manifest loaded from the cache"),
        "the remount reuses the index"
    );
    d.unmount().assert_clean();
    // ...but never with another grouping: the cache is refused until --reset-cache.
    let mut args = flags("svm");
    args.extend_from_slice(&["--seed", "7", "--group", "records"]);
    mount_refused(&mnt, &mount_args(&src, &cache, &mnt, &args), true)
        .assert_mentions("built with other settings");
    args.push("--reset-cache");
    let d = Daemon::mount(&src, &cache, &mnt, &args);
    let st = d.status();
    assert_eq!(st["dataset"]["group"], "records");
    assert_eq!(st["dataset"]["groups"], 300);
    assert_ne!(st["dataset"]["groups"], groups);
    assert!(
        d.ready_line.contains("300 records of 300)"),
        "{}",
        d.ready_line
    );
    d.unmount().assert_clean();
}

#[test]
fn parts_read_the_same_without_opens() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    make_records(&src, "tar", 200, 2);
    let daemon = mount(dir.path(), &src, "tar", &["--read-path", "page-cache"]);
    let epoch = dir.path().join("mnt/epoch-0");
    let mut members = 0;
    for part in names(&epoch) {
        let bytes = std::fs::read(epoch.join(&part)).unwrap();
        assert!(
            bytes.ends_with(&[0u8; 1024]),
            "{part}: end-of-archive blocks"
        );
        let mut pos = 0;
        while bytes[pos..pos + 512].iter().any(|&b| b != 0) {
            let size = usize::from_str_radix(
                std::str::from_utf8(&bytes[pos + 124..pos + 135]).unwrap(),
                8,
            )
            .unwrap();
            pos += 512 + size.div_ceil(512) * 512;
            members += 1;
        }
    }
    assert_eq!(members, 400, "every member of every sample, once");
    daemon.unmount().assert_clean();
}

/// Parts are a function of (seed, epoch, rank): a remount resumes the epoch it left with the
/// very same parts, byte for byte.
#[test]
fn a_remount_shows_the_same_parts_of_the_same_epoch() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    make_records(&src, "fixed", 3000, 3);
    let read_epoch = |e: u32| -> Vec<(String, Vec<u8>)> {
        let d = dir.path().join(format!("mnt/epoch-{e}"));
        names(&d)
            .into_iter()
            .map(|p| (p.clone(), std::fs::read(d.join(p)).unwrap()))
            .collect()
    };
    let d = mount(dir.path(), &src, "fixed", &["--fraction", "0.5"]);
    let first = read_epoch(0);
    let second = read_epoch(1); // advances
    assert_ne!(first, second, "a new order in a new epoch");
    d.unmount().assert_clean();
    let d = mount(dir.path(), &src, "fixed", &["--fraction", "0.5"]);
    assert_eq!(d.ready_epoch(), 1);
    assert_eq!(read_epoch(1), second, "the same parts after a remount");
    d.unmount().assert_clean();
}

/// After an advance the old epoch's parts are gone, but a part opened before stays readable.
#[test]
fn an_open_part_outlives_its_epoch() {
    if !require_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    make_records(&src, "tfrecord", 400, 2);
    let d = mount(dir.path(), &src, "tfrecord", &["--fraction", "1"]);
    let old = dir.path().join("mnt/epoch-0/part-00000.tfrecord");
    let want = std::fs::read(&old).unwrap();
    let f = std::fs::File::open(&old).unwrap();
    write_epoch(&dir.path().join("mnt"), "1").unwrap();
    assert_errno(std::fs::metadata(&old), libc::ENOENT, "an old epoch's part");
    let mut got = vec![0u8; want.len() + 10];
    let n = f.read_at(&mut got, 0).unwrap();
    assert_eq!(&got[..n], &want[..], "the open part reads as it was");
    drop(f);
    d.unmount().assert_clean();
}

/// The README's record example: a linear SVM trained on the parts with scikit-learn.
#[test]
fn svm_example_trains_on_parts() {
    if !require_fuse() {
        return;
    }
    let Some(python) = loaders_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    make_records(&src, "svm", 3000, 3);
    let d = mount(dir.path(), &src, "svm", &[]);
    let out = check(
        "train_svm.py",
        &run_with_timeout(
            with_package(&mut Command::new(&python))
                .arg(repo().join("mount-helpers/examples/train_svm.py"))
                .arg("--mount")
                .arg(dir.path().join("mnt"))
                .args(["--epochs", "3"]),
            Duration::from_secs(300),
        ),
    );
    assert_eq!(out.matches("3000 records in").count(), 3, "{out}");
    let acc: f64 = out
        .split("last_acc=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no last_acc in {out}"));
    assert!(acc > 0.8, "the label is learnable from feature 2: {out}");
    d.unmount().assert_clean();
}
