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
        assert_eq!(index.record(r as u64), want, "record {r}");
    }
    let mut next = 0u64;
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
            if index.params.grouping == Grouping::Pages && rs.end - rs.start > 1 {
                assert_eq!(s / PAGE, s0 / PAGE, "a group's records start in one page");
            }
            end = s + l;
        }
        assert_eq!(span.end, end);
        if index.params.grouping == Grouping::Records {
            assert_eq!(rs.end - rs.start, 1);
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
        text.contains(&format!(
            "a.tfrecord: byte offset {}: bad data CRC; bytes {}..{} (117 bytes) left out",
            off(1),
            off(1),
            off(2)
        )),
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
        let per_record = index.table_bytes() as f64 / index.records() as f64;
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
    let ids: Vec<u64> = (0..m.len()).rev().step_by(2).collect();
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
        // Group 1 starting inside file a.
        *g = [g.at(0), 1].into_iter().chain(g.iter().skip(2)).collect();
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

/// The bad regions of a walk, one `Skipped` a gap.
fn gaps<'a>(skipped: &'a [Skipped], file: &str) -> Vec<&'a str> {
    skipped
        .iter()
        .filter(|s| s.path.ends_with(file))
        .map(|s| s.reason.as_str())
        .collect()
}

/// A TFRecord header with a valid CRC for `len`, as a hostile or damaged file can hold.
fn tf_header(len: u64) -> Vec<u8> {
    let head = len.to_le_bytes();
    [&head[..], &masked_crc(&head).to_le_bytes()].concat()
}

/// A length of 2^62 whose CRC holds is a gap, not the end of the file: the walk resumes at
/// the next whole valid record, and the one gap is named with its byte range.
#[test]
fn tfrecord_resyncs_after_a_huge_length_with_a_valid_crc() {
    let dir = tempfile::tempdir().unwrap();
    let recs: Vec<Vec<u8>> = (0..60).map(|i| tf(&vec![i as u8; 30 + i])).collect();
    let before: Vec<u8> = recs[..10].concat();
    let bad_at = before.len();
    let mut file = before;
    file.extend(tf_header(1 << 62));
    file.extend(b"junk!!!");
    let good_at = file.len();
    file.extend(recs[10..].concat());
    std::fs::write(dir.path().join("a.tfrecord"), &file).unwrap();
    let (index, skipped) =
        build_index(dir.path(), &params(Framing::Tfrecord, Grouping::Pages)).unwrap();
    let text = reasons(&skipped);
    assert_eq!(index.records(), 60, "{text}");
    let gaps = gaps(&skipped, "a.tfrecord");
    assert_eq!(gaps.len(), 1, "{text}");
    assert!(
        gaps[0].starts_with(&format!(
            "byte offset {bad_at}: bad record length: its header says {} data bytes",
            1u64 << 62
        )),
        "{text}"
    );
    assert!(
        gaps[0].contains(&format!(
            "bytes {bad_at}..{good_at} (19 bytes) left out, resumed at the next valid record"
        )),
        "{text}"
    );
    assert_eq!(index.record(10), (0, good_at as u64, recs[10].len() as u64));
    let mut expected = Vec::new();
    let mut at = 0u64;
    for (i, r) in recs.iter().enumerate() {
        if i == 10 {
            at = good_at as u64;
        }
        expected.push((0, at, r.len() as u64));
        at += r.len() as u64;
    }
    check_index(&index, &expected);
}

/// A record whose length CRC holds but whose length is wrong (its data CRC then fails and
/// no header stands where it would end) costs only its own bytes; several bad records in a
/// row are one gap.
#[test]
fn tfrecord_lengths_are_trusted_only_as_far_as_the_next_header() {
    let dir = tempfile::tempdir().unwrap();
    let recs: Vec<Vec<u8>> = (0..8).map(|i| tf(&[b'a' + i as u8; 200])).collect();
    // Record 2 claims 50 data bytes: a valid header, a bad data CRC, no header after it.
    let mut short = recs[2].clone();
    short[..12].copy_from_slice(&tf_header(50));
    // Records 5 and 6 garbled: one gap from 5's start to 7's.
    let mut garbled = [recs[5].clone(), recs[6].clone()].concat();
    garbled[3] ^= 0x40;
    garbled[recs[5].len() + 2] ^= 0x40;
    let file = [
        &recs[0][..],
        &recs[1],
        &short,
        &recs[3],
        &recs[4],
        &garbled,
        &recs[7],
    ]
    .concat();
    std::fs::write(dir.path().join("a.tfrecord"), &file).unwrap();
    let (index, skipped) =
        build_index(dir.path(), &params(Framing::Tfrecord, Grouping::Records)).unwrap();
    let text = reasons(&skipped);
    assert_eq!(index.records(), 5, "{text}");
    let off = |i: usize| recs[..i].iter().map(Vec::len).sum::<usize>();
    let gaps = gaps(&skipped, "a.tfrecord");
    assert_eq!(gaps.len(), 2, "{text}");
    assert!(
        gaps[0].starts_with(&format!(
            "byte offset {}: bad data CRC, and no valid record",
            off(2)
        )),
        "{text}"
    );
    assert!(
        gaps[0].contains(&format!("bytes {}..{} (216 bytes)", off(2), off(3))),
        "{text}"
    );
    assert!(
        gaps[1].starts_with(&format!("byte offset {}: bad length CRC", off(5))),
        "{text}"
    );
    assert!(
        gaps[1].contains(&format!("bytes {}..{} (432 bytes)", off(5), off(7))),
        "{text}"
    );
    assert_eq!(index.record(4), (0, off(7) as u64, 216));
}

/// Each shard is walked on its own: a shard cut in the middle of a record costs the next
/// shard nothing, and the cut is named with its file and range.
#[test]
fn a_truncated_shard_costs_the_next_shard_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let recs: Vec<Vec<u8>> = (0..6).map(|i| tf(&[i as u8; 100])).collect();
    let a = [&recs[0][..], &recs[1], &recs[2][..60]].concat();
    std::fs::write(dir.path().join("a.tfrecord"), &a).unwrap();
    std::fs::write(dir.path().join("b.tfrecord"), recs[3..].concat()).unwrap();
    let (index, skipped) =
        build_index(dir.path(), &params(Framing::Tfrecord, Grouping::Pages)).unwrap();
    let text = reasons(&skipped);
    assert_eq!(index.records(), 5, "{text}");
    assert_eq!(index.record(2), (1, 0, 116), "b's first record");
    let cut = 2 * 116;
    assert_eq!(skipped.len(), 1, "{text}");
    assert!(
        text.contains(&format!("a.tfrecord: byte offset {cut}: truncated record: its header says 100 data bytes, the file ends 48 bytes after the header; bytes {cut}..{} (60 bytes) left out, to the end of the file", a.len())),
        "{text}"
    );

    // The same for tar: a shard cut inside a member, then a whole shard.
    let dir = tempfile::tempdir().unwrap();
    let mut a = [tar_member("s0.txt", b"0"), tar_member("s1.txt", b"1")].concat();
    a.extend(&tar_member("s2.txt", &[7u8; 900])[..700]);
    std::fs::write(dir.path().join("a.tar"), &a).unwrap();
    let b = [tar_member("s3.txt", b"3"), tar_member("s4.txt", b"4")].concat();
    std::fs::write(dir.path().join("b.tar"), &b).unwrap();
    let (index, skipped) =
        build_index(dir.path(), &params(Framing::Tar, Grouping::Records)).unwrap();
    let text = reasons(&skipped);
    assert_eq!(index.records(), 4, "{text}");
    assert_eq!(index.record(2), (1, 0, 1024), "b's first sample");
    assert!(
        text.contains("a.tar: byte offset 2048: truncated tar member s2.txt: its header says 900 bytes, the file ends 188 bytes after the header; bytes 2048..2748 (700 bytes) left out"),
        "{text}"
    );
}

/// A damaged tar header (bad checksum, or a size past the end with a valid checksum) is a
/// gap up to the next valid header; the members after it are served, and the sample that
/// lost a member to the gap is named as one without its pair.
#[test]
fn tar_resyncs_after_a_damaged_header() {
    let dir = tempfile::tempdir().unwrap();
    let sample = |i: usize| {
        [
            tar_member(&format!("s{i}.txt"), format!("text {i}").as_bytes()),
            tar_member(&format!("s{i}.cls"), b"1"),
        ]
        .concat()
    };
    let mut a: Vec<u8> = (0..3).flat_map(sample).collect();
    let bad_at = a.len();
    let mut s3 = sample(3);
    s3[5] ^= 0x20; // s3.txt's name: the checksum fails
    a.extend(s3);
    a.extend((4..6).flat_map(sample));
    let huge_at = a.len();
    let mut s6 = sample(6);
    s6[..512].copy_from_slice(&tar_header("s6.txt", 0o77_777_777_777));
    a.extend(s6);
    a.extend((7..9).flat_map(sample));
    std::fs::write(dir.path().join("a.tar"), &a).unwrap();
    let (index, skipped) =
        build_index(dir.path(), &params(Framing::Tar, Grouping::Records)).unwrap();
    let text = reasons(&skipped);
    assert_eq!(index.records(), 7, "samples 0-2, 4, 5, 7, 8: {text}");
    assert_eq!(index.record(3), (0, bad_at as u64 + 2048, 2048), "{text}");
    assert_eq!(index.record(5), (0, huge_at as u64 + 2048, 2048), "{text}");
    let gaps = gaps(&skipped, "a.tar");
    assert_eq!(gaps.len(), 4, "{text}");
    assert!(
        text.contains(&format!("byte offset {bad_at}: bad tar header checksum; bytes {bad_at}..{} (1024 bytes) left out, resumed at the next valid record", bad_at + 1024)),
        "{text}"
    );
    assert!(
        text.contains(&format!("byte offset {huge_at}: tar member s6.txt: its header says {} bytes (its checksum holds), more than the", 0o77_777_777_777u64)),
        "{text}"
    );
    for at in [bad_at + 1024, huge_at + 1024] {
        assert!(
            text.contains(&format!(
                "byte offset {at}: webdataset sample with members [.cls]"
            )),
            "{text}"
        );
    }
}

/// Zero blocks end an archive only if no valid header follows them: concatenated archives
/// (or a header zeroed by damage) keep the members after them.
#[test]
fn tar_zero_blocks_followed_by_members_are_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = [tar_member("s0.txt", b"0"), vec![0u8; 1024]].concat();
    a.extend([tar_member("s1.txt", b"1"), vec![0u8; 10240]].concat());
    std::fs::write(dir.path().join("a.tar"), &a).unwrap();
    let (index, skipped) =
        build_index(dir.path(), &params(Framing::Tar, Grouping::Records)).unwrap();
    let text = reasons(&skipped);
    assert_eq!(index.records(), 2, "{text}");
    assert_eq!(index.record(1), (0, 2048, 1024));
    assert_eq!(skipped.len(), 1, "the trailing zeros are the end: {text}");
    assert!(text.contains("byte offset 1024: zero blocks (an end of archive) with a valid header after them; bytes 1024..2048"), "{text}");
}

/// A header line over 1 MiB is not held: the file is named and left out.
#[test]
fn a_huge_header_line_is_not_held() {
    let dir = tempfile::tempdir().unwrap();
    let mut long = vec![b'h'; (1 << 20) + 5];
    long.extend(b"\n1,2\n");
    std::fs::write(dir.path().join("a.csv"), &long).unwrap();
    std::fs::write(dir.path().join("b.csv"), b"x,y\n3,4\n").unwrap();
    let mut p = params(Framing::Lines, Grouping::Records);
    p.header_line = true;
    let (index, skipped) = build_index(dir.path(), &p).unwrap();
    assert_eq!(index.records(), 1);
    assert_eq!(index.header, b"x,y\n");
    assert!(
        reasons(&skipped).contains(
            "a.csv: byte offset 0: the header line (--header-line) is over 1048576 bytes"
        )
    );
}

fn max_rss_kib() -> i64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    assert_eq!(rc, 0);
    // SAFETY: filled above.
    unsafe { usage.assume_init() }.ru_maxrss
}

/// The lines walk streams: a 200 MB line is not held in memory (the map behind the walk
/// is dropped). Ignored by default (it writes 200 MB); run it alone, as in
/// `cargo test --lib a_long_line_is_scanned -- --ignored --test-threads=1`, or under
/// `/usr/bin/time -v` for the process's peak.
#[test]
#[ignore]
fn a_long_line_is_scanned_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("one.txt");
    {
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..200 {
            std::io::Write::write_all(&mut f, &chunk).unwrap();
        }
        std::io::Write::write_all(&mut f, b"\nshort\n").unwrap();
    }
    let before = max_rss_kib();
    let (index, _) = build_index(dir.path(), &params(Framing::Lines, Grouping::Pages)).unwrap();
    let grew = max_rss_kib() - before;
    eprintln!("peak RSS grew by {grew} KiB over the scan");
    assert_eq!(index.records(), 2);
    assert!(
        grew < 64 << 10,
        "peak RSS grew by {grew} KiB scanning a 200 MB line"
    );
}

/// With `--header-line`, a later file whose first line is not the header (a shard cut from
/// a headed file) loses that line as its header: it is named, not left to the log.
#[test]
fn a_first_line_unlike_the_header_is_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.csv"), b"id,x\n1,2\n").unwrap();
    std::fs::write(dir.path().join("b.csv"), b"3,4\n5,6\n").unwrap();
    let mut p = params(Framing::Lines, Grouping::Records);
    p.header_line = true;
    let (index, skipped) = build_index(dir.path(), &p).unwrap();
    assert_eq!(index.records(), 2);
    let text = reasons(&skipped);
    assert_eq!(skipped.len(), 1, "{text}");
    assert!(
        text.contains("b.csv: byte offset 0: the first line (4 bytes) differs from the header of"),
        "{text}"
    );
}
