use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;

use super::scan::masked_crc;
use super::*;
use crate::dataset::manifest::Manifest;
use crate::dataset::names::Skipped;
use crate::dataset::{Dataset, RecordSource};

fn params(framing: Framing, grouping: Grouping) -> RecordParams {
    RecordParams {
        framing,
        record_size: 0,
        grouping,
        header_line: false,
    }
}

fn write_files(dir: &Path, files: &[Vec<u8>]) {
    for (i, bytes) in files.iter().enumerate() {
        std::fs::write(dir.join(format!("f{i:03}.dat")), bytes).unwrap();
    }
}

/// Checks the invariants every index keeps, against the records the test wrote:
/// offsets round-trip, groups are contiguous, never split a record, hold every record
/// exactly once, and start in one page (or are one record).
fn check_index(index: &RecordIndex, expected: &[(u32, u64, u64)]) {
    assert_eq!(index.records() as usize, expected.len());
    for (r, &want) in expected.iter().enumerate() {
        assert_eq!(index.record(r as u32), want, "record {r}");
    }
    let mut next = 0u32;
    for g in 0..index.groups() {
        let rs = index.group_records(g);
        assert_eq!(rs.start, next, "group {g} starts where the last ended");
        assert!(rs.end > rs.start, "group {g} is not empty");
        next = rs.end;
        let span = index.span(g);
        let (f0, s0, _) = index.record(rs.start);
        assert_eq!((span.file, span.start), (f0, s0));
        let mut end = s0;
        for r in rs.clone() {
            let (f, s, l) = index.record(r);
            assert_eq!(f, f0, "a group stays in one file");
            assert_eq!(s, end, "a group's records are contiguous");
            if index.params.grouping == Grouping::Pages && rs.len() > 1 {
                assert_eq!(s / PAGE, s0 / PAGE, "a group's records start in one page");
            }
            end = s + l;
        }
        assert_eq!(span.end, end);
        if index.params.grouping == Grouping::Records {
            assert_eq!(rs.len(), 1);
        }
    }
    assert_eq!(next, index.records(), "every record is in a group");
    assert!(index.table_bytes() <= 16 * index.records() as usize);
    index.validate().unwrap();
}

fn line_files() -> impl Strategy<Value = Vec<Vec<Vec<u8>>>> {
    let line = proptest::collection::vec(b'a'..=b'z', 0..900);
    proptest::collection::vec(proptest::collection::vec(line, 1..40), 1..4)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn lines_index_matches_the_lines(files in line_files(), records_mode in any::<bool>(), open_end in any::<bool>()) {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = Vec::new();
        let mut expected = Vec::new();
        for (f, lines) in files.iter().enumerate() {
            let mut b = Vec::new();
            for line in lines {
                expected.push((f as u32, b.len() as u64, line.len() as u64 + 1));
                b.extend_from_slice(line);
                b.push(b'\n');
            }
            if open_end && !lines.last().unwrap().is_empty() {
                b.pop();
                expected.last_mut().unwrap().2 -= 1;
            }
            bytes.push(b);
        }
        write_files(dir.path(), &bytes);
        let grouping = if records_mode { Grouping::Records } else { Grouping::Pages };
        let (index, skipped) = build_index(dir.path(), &params(Framing::Lines, grouping)).unwrap();
        prop_assert!(skipped.is_empty(), "{skipped:?}");
        check_index(&index, &expected);
        let m = Manifest::decode(&Manifest::from_records(index.clone(), skipped).encode()).unwrap();
        prop_assert_eq!(m.records().unwrap(), &index);
    }

    #[test]
    fn fixed_index_is_arithmetic(size in 1u64..10_000, lens in proptest::collection::vec(0u64..60_000, 1..4), records_mode in any::<bool>()) {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<Vec<u8>> = lens.iter().map(|&l| vec![7u8; l as usize]).collect();
        write_files(dir.path(), &files);
        let mut p = params(Framing::Fixed, if records_mode { Grouping::Records } else { Grouping::Pages });
        p.record_size = size;
        let mut expected = Vec::new();
        let mut f_out = 0;
        for &len in &lens {
            if len / size == 0 {
                continue;
            }
            expected.extend((0..len / size).map(|i| (f_out, i * size, size)));
            f_out += 1;
        }
        match build_index(dir.path(), &p) {
            Ok((index, skipped)) => {
                check_index(&index, &expected);
                let partial = lens.iter().filter(|&&l| l % size != 0 || l == 0).count();
                prop_assert_eq!(skipped.len(), partial);
            }
            Err(_) => prop_assert!(expected.is_empty()),
        }
    }
}

fn tf(data: &[u8]) -> Vec<u8> {
    let head = (data.len() as u64).to_le_bytes();
    let mut v = head.to_vec();
    v.extend(masked_crc(&head).to_le_bytes());
    v.extend(data);
    v.extend(masked_crc(data).to_le_bytes());
    v
}

fn reasons(skipped: &[Skipped]) -> String {
    skipped
        .iter()
        .map(|s| format!("{}: {}", s.path, s.reason))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn tfrecord_bad_crcs_and_truncation_lose_only_their_record() {
    let dir = tempfile::tempdir().unwrap();
    let recs: Vec<Vec<u8>> = (0..6).map(|i| tf(&vec![i as u8; 100 + i])).collect();
    let mut bad_data = recs[1].clone();
    bad_data[20] ^= 1;
    let mut bad_len = recs[3].clone();
    bad_len[9] ^= 1;
    let file: Vec<u8> = [
        &recs[0],
        &bad_data,
        &recs[2],
        &bad_len,
        &recs[4],
        &recs[5][..30],
    ]
    .concat();
    std::fs::write(dir.path().join("a.tfrecord"), &file).unwrap();
    std::fs::write(dir.path().join("b.tfrecord"), b"").unwrap();
    let (index, skipped) =
        build_index(dir.path(), &params(Framing::Tfrecord, Grouping::Records)).unwrap();
    let text = reasons(&skipped);
    assert_eq!(index.records(), 3, "{text}");
    let off = |i: usize| recs[..i].iter().map(Vec::len).sum::<usize>();
    assert!(
        text.contains(&format!("a.tfrecord: byte offset {}: bad data CRC", off(1))),
        "{text}"
    );
    assert!(
        text.contains(&format!("byte offset {}: bad length CRC", off(3))),
        "{text}"
    );
    assert!(
        text.contains(&format!("byte offset {}: truncated record", off(5))),
        "{text}"
    );
    assert!(text.contains("b.tfrecord: empty file"), "{text}");
    assert_eq!(index.record(2), (0, off(4) as u64, recs[4].len() as u64));
    assert_eq!(index.ext, "tfrecord");
}

#[test]
fn records_over_2_gib_are_left_out() {
    let dir = tempfile::tempdir().unwrap();
    // A sparse file: a valid header saying 3 GiB, then the next record after it.
    let big = 3u64 << 30;
    let head = big.to_le_bytes();
    let mut bytes = head.to_vec();
    bytes.extend(masked_crc(&head).to_le_bytes());
    let path = dir.path().join("big.tfrecord");
    std::fs::write(&path, &bytes).unwrap();
    let f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.set_len(12 + big + 4).unwrap();
    drop(f);
    let mut tail = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    std::io::Write::write_all(&mut tail, &tf(b"after")).unwrap();
    let (index, skipped) =
        build_index(dir.path(), &params(Framing::Tfrecord, Grouping::Pages)).unwrap();
    let text = reasons(&skipped);
    assert!(
        text.contains("byte offset 0: record of 3221225488 bytes is over the 2 GiB limit"),
        "{text}"
    );
    assert_eq!(index.records(), 1);
    assert_eq!(index.record(0).1, 12 + big + 4);
}

/// A ustar header block for `name` of `size` bytes.
fn tar_header(name: &str, size: u64) -> Vec<u8> {
    let mut h = vec![0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..108].copy_from_slice(b"0000644\0");
    h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    h[136..148].copy_from_slice(b"00000000000\0");
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

fn tar_member(name: &str, data: &[u8]) -> Vec<u8> {
    let mut v = tar_header(name, data.len() as u64);
    v.extend(data);
    v.resize(v.len().div_ceil(512) * 512, 0);
    v
}

#[test]
fn tar_samples_pair_by_key_and_lone_members_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Vec::new();
    for i in 0..4 {
        a.extend(tar_member(&format!("s{i}.txt"), b"hello"));
        if i != 2 {
            a.extend(tar_member(&format!("s{i}.cls"), b"1"));
        }
    }
    let lone_at = 2 * 2048;
    // A truncated last member.
    let mut trunc = tar_header("s9.txt", 5000);
    trunc.extend([1u8; 100]);
    let trunc_at = a.len();
    a.extend(&trunc);
    std::fs::write(dir.path().join("a.tar"), &a).unwrap();
    let (index, skipped) =
        build_index(dir.path(), &params(Framing::Tar, Grouping::Records)).unwrap();
    let text = reasons(&skipped);
    assert_eq!(index.records(), 3, "{text}");
    assert!(text.contains(&format!("byte offset {lone_at}: webdataset sample with members [.txt] while the others have [.cls, .txt]")), "{text}");
    assert!(
        text.contains(&format!(
            "byte offset {trunc_at}: truncated tar member s9.txt"
        )),
        "{text}"
    );
    assert_eq!(index.record(0), (0, 0, 2048));
    assert_eq!(index.record(2), (0, 3 * 2048 - 1024, 2048));
    assert_eq!(index.trailer_len(), TAR_TRAILER);
}

#[test]
fn lines_header_and_open_end() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.csv"), b"id,x\n1,2\n3,4").unwrap();
    std::fs::write(dir.path().join("b.csv"), b"id,x\n5,6\n").unwrap();
    let mut p = params(Framing::Lines, Grouping::Records);
    p.header_line = true;
    let (index, _) = build_index(dir.path(), &p).unwrap();
    assert_eq!(index.header, b"id,x\n");
    assert_eq!(index.records(), 3);
    assert_eq!(index.record(1), (0, 9, 3));
    assert!(index.needs_newline(1) && !index.needs_newline(0) && !index.needs_newline(2));
    assert_eq!(index.ext, "csv");
}

#[test]
fn bad_sources_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = params(Framing::Lines, Grouping::Pages);
    let err = build_index(&dir.path().join("nope"), &p)
        .unwrap_err()
        .to_string();
    assert!(err.contains("does not exist"), "{err}");
    let err = build_index(dir.path(), &p).unwrap_err().to_string();
    assert!(err.contains("holds no record files"), "{err}");
    std::fs::write(dir.path().join("empty.svm"), b"").unwrap();
    let err = build_index(dir.path(), &p).unwrap_err().to_string();
    assert!(err.contains("no usable records"), "{err}");
}

/// The table's memory: at most 16 bytes a record, no allocation per record. 200k records
/// of 362 bytes (the kdd layout) stand in for 19M: the cost per record does not change.
#[test]
fn table_costs_at_most_16_bytes_a_record() {
    let dir = tempfile::tempdir().unwrap();
    let line = [b'x'; 361];
    let mut bytes = Vec::with_capacity(200_000 * 362);
    for _ in 0..200_000 {
        bytes.extend_from_slice(&line);
        bytes.push(b'\n');
    }
    std::fs::write(dir.path().join("kdd.svm"), &bytes).unwrap();
    for grouping in [Grouping::Pages, Grouping::Records] {
        let (index, _) = build_index(dir.path(), &params(Framing::Lines, grouping)).unwrap();
        let per_record = index.table_bytes() as f64 / f64::from(index.records());
        assert!(
            per_record <= 16.0,
            "{grouping:?}: {per_record} bytes a record"
        );
        // 19M records: at most 304 MB.
        assert!(per_record * 19e6 <= 304e6);
    }
    assert!(
        std::mem::size_of::<RecordIndex>() < 512,
        "no per-record fields"
    );
}

#[test]
fn batch_reads_equal_single_reads() {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<Vec<u8>> = (0..3)
        .map(|f| (0..5000u32).map(|i| (i * 7 + f) as u8 | 1).collect())
        .collect();
    write_files(dir.path(), &files);
    let mut p = params(Framing::Fixed, Grouping::Records);
    p.record_size = 1000;
    let (index, skipped) = build_index(dir.path(), &p).unwrap();
    let m = Arc::new(Manifest::from_records(index, skipped));
    let src = RecordSource::new(dir.path().to_path_buf(), m.clone());
    let ids: Vec<u32> = (0..m.len()).rev().step_by(2).collect();
    let mut got = Vec::new();
    src.read_batch(&ids, &mut |id, bytes| got.push((id, bytes.unwrap())));
    assert_eq!(got.len(), ids.len());
    for (id, bytes) in got {
        let mut one = Vec::new();
        src.copy_to(id, &mut one).unwrap();
        assert_eq!(bytes, one, "group {id}");
        let (f, start, len) = m.records().unwrap().record(id);
        assert_eq!(
            bytes,
            files[f as usize][start as usize..(start + len) as usize]
        );
    }
    assert!(
        src.describe(5)
            .contains("f001.dat bytes 0..1000 (records 5..6)"),
        "{}",
        src.describe(5)
    );
}

/// An index from the cache or a peer is checked before use: nothing it says can make a
/// lookup go out of bounds or a group span two files.
#[test]
fn decoded_indexes_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a"), b"x\ny\n").unwrap();
    std::fs::write(dir.path().join("b"), b"z\n").unwrap();
    let (index, _) = build_index(dir.path(), &params(Framing::Lines, Grouping::Pages)).unwrap();
    assert_eq!(index.groups(), 2);
    index.validate().unwrap();
    let mut short = index.clone();
    short.files[0].len = 3;
    assert!(short.validate().unwrap_err().contains("outside its file"));
    let mut merged = index.clone();
    merged.files[1].first_group = 0;
    assert!(merged.validate().is_err());
    let mut spanning = index.clone();
    if let Table::Offsets {
        group_first: Some(g),
        ..
    } = &mut spanning.table
    {
        g[1] = 1; // group 1 starting inside file a
    }
    assert!(spanning.validate().unwrap_err().contains("spans two files"));
    let mut evil = index;
    evil.files[1].name = "../etc".into();
    assert!(evil.validate().is_err());
    let bytes = Manifest::from_records(evil, Vec::new()).encode();
    assert!(Manifest::decode(&bytes).is_err());
}

#[test]
fn a_tar_sample_over_2_gib_and_a_cut_fixed_record_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let big = 3u64 << 30;
    let mut bytes = tar_member("a.txt", b"1");
    bytes.extend(tar_header("b.txt", big));
    let path = dir.path().join("s.tar");
    std::fs::write(&path, &bytes).unwrap();
    let f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.set_len(bytes.len() as u64 + big).unwrap(); // sparse: no 3 GiB written
    drop(f);
    let mut tail = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    std::io::Write::write_all(&mut tail, &tar_member("c.txt", b"3")).unwrap();
    let (index, skipped) = build_index(dir.path(), &params(Framing::Tar, Grouping::Pages)).unwrap();
    let text = reasons(&skipped);
    assert!(
        text.contains(
            "s.tar: byte offset 1024: record of 3221225984 bytes is over the 2 GiB limit"
        ),
        "{text}"
    );
    assert_eq!(index.records(), 2);

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rows.bin"), [5u8; 250]).unwrap();
    let mut p = params(Framing::Fixed, Grouping::Pages);
    p.record_size = 100;
    let (index, skipped) = build_index(dir.path(), &p).unwrap();
    assert_eq!(index.records(), 2);
    let text = reasons(&skipped);
    assert!(
        text.contains(
            "rows.bin: truncated record at byte offset 200: 50 bytes, --record-size is 100"
        ),
        "{text}"
    );
}

/// A GNU long-name (`L`) or pax (`x`) header, then the member it names under a short
/// stand-in name.
fn long_member(kind: u8, name: &str, data: &[u8]) -> Vec<u8> {
    let text = match kind {
        b'x' => {
            let rec = format!(" path={name}\n");
            // The length prefix counts itself.
            let n = (rec.len() + 3..)
                .find(|n| n.to_string().len() + rec.len() == *n)
                .unwrap();
            format!("{n}{rec}")
        }
        _ => name.to_string(),
    };
    let mut ln = tar_header("././@LongLink", text.len() as u64 + 1);
    ln[156] = kind;
    ln[148..156].copy_from_slice(b"        ");
    let sum: u64 = ln.iter().map(|&b| u64::from(b)).sum();
    ln[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let mut body = text.into_bytes();
    body.resize(body.len().div_ceil(512).max(1) * 512, 0);
    [ln, body, tar_member("stand-in", data)].concat()
}

/// A GNU long-name or pax header belongs to the member after it: the record starts at it,
/// and the long name gives the key.
#[test]
fn tar_long_names_stay_with_their_member() {
    let dir = tempfile::tempdir().unwrap();
    let long = format!("{}/sample0", "d".repeat(120));
    let mut a = long_member(b'L', &format!("{long}.txt"), b"x");
    a.extend(long_member(b'x', &format!("{long}.cls"), b"1"));
    a.extend(tar_member("s1.txt", b"y"));
    a.extend(tar_member("s1.cls", b"2"));
    std::fs::write(dir.path().join("a.tar"), &a).unwrap();
    let (index, skipped) =
        build_index(dir.path(), &params(Framing::Tar, Grouping::Records)).unwrap();
    assert!(skipped.is_empty(), "{}", reasons(&skipped));
    assert_eq!(index.records(), 2);
    assert_eq!(
        index.record(0),
        (0, 0, 4096),
        "both long-named members, headers included"
    );
    assert_eq!(index.record(1), (0, 4096, 2048));
}
