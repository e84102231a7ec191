//! The TFRecord walk of the index pass: length (8 bytes LE), masked CRC-32C of the length,
//! data, masked CRC-32C of the data.
//!
//! # Resynchronising
//! A length is trusted only as far as what it points at: a record whose length CRC holds
//! but whose data CRC fails, or which is over 2 GiB, is skipped by its length only if a
//! valid header (or the end of the file) stands right after it. Anything else that is not
//! a whole valid record (a bad length CRC, a length past the end of the file with a valid
//! CRC, as a 2^62 length can have, a bad data CRC with no header after it) is a *gap*: the
//! walk looks byte by byte for the next offset where a whole record validates (length CRC,
//! length inside the file, data CRC) and resumes there. Each gap is one [`Skipped`] entry
//! with its byte range, so every lost byte is named, and no valid record after a bad one
//! is lost. A false resync needs two 32-bit CRCs to hold by chance.
//!
//! [`Skipped`]: crate::dataset::names::Skipped

use super::MAX_RECORD;
use super::pass::{Ahead, RecordError, TableBuilder, left_out, lost, over_limit};

/// TFRecord's masked CRC-32C.
pub fn masked_crc(bytes: &[u8]) -> u32 {
    mask(crc32c::crc32c(bytes))
}

fn mask(crc: u32) -> u32 {
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn le_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("4 bytes"))
}

/// What stands at an offset of the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    /// A whole valid record of this many bytes (header and CRCs included).
    Record(usize),
    /// A valid header of a record over 2 GiB (its data is not checked) of this many bytes.
    OverLimit(usize),
    /// A valid header whose record of this many bytes fails its data CRC.
    BadData(usize),
    /// A valid header whose length goes past the end of the file.
    PastEnd(u64),
    BadLengthCrc,
    /// Under 12 bytes left.
    Short,
}

/// The length of the record at `p` (header and CRCs included), if it fits the file.
fn total_at(data: &[u8], p: usize) -> Option<usize> {
    le_u64(&data[p..])
        .checked_add(16)
        .filter(|&total| total <= (data.len() - p) as u64)
        .map(|total| total as usize)
}

/// Whether a header with a valid length CRC starts at `p` and its record fits the file.
fn header_at(data: &[u8], p: usize) -> bool {
    // The length test first: it is cheaper than the CRC and rejects nearly every offset
    // of a damaged region (a random 64-bit length does not fit the file).
    p + 12 <= data.len()
        && total_at(data, p).is_some()
        && masked_crc(&data[p..p + 8]) == le_u32(&data[p + 8..])
}

fn at(data: &[u8], p: usize, ahead: &mut Ahead) -> At {
    if data.len() - p < 12 {
        return At::Short;
    }
    if masked_crc(&data[p..p + 8]) != le_u32(&data[p + 8..]) {
        return At::BadLengthCrc;
    }
    let Some(total) = total_at(data, p) else {
        return At::PastEnd(le_u64(&data[p..]));
    };
    if total as u64 > MAX_RECORD {
        return At::OverLimit(total);
    }
    let crc = mask(ahead.crc32c(data, p + 12..p + total - 4));
    if crc == le_u32(&data[p + total - 4..]) {
        At::Record(total)
    } else {
        At::BadData(total)
    }
}

/// The first offset from `from` on where a record validates (or one over 2 GiB whose header
/// does), else the end of the file.
fn resync(data: &[u8], from: usize, ahead: &mut Ahead) -> usize {
    let n = data.len();
    let mut p = from;
    while p + 16 <= n {
        if p.is_multiple_of(Ahead::WINDOW) {
            ahead.at(p);
        }
        if header_at(data, p) && matches!(at(data, p, ahead), At::Record(_) | At::OverLimit(_)) {
            return p;
        }
        p += 1;
    }
    n
}

/// The walk of one TFRecord file (see the module docs).
pub(super) fn tfrecords(
    data: &[u8],
    b: &mut TableBuilder,
    skip: &mut impl FnMut(u64, String),
    ahead: &mut Ahead,
) -> Result<(), RecordError> {
    let n = data.len();
    // Where a skipped record's length leads is trusted if a header or the end is there.
    let boundary = |p: usize| p == n || header_at(data, p);
    let mut pos = 0usize;
    while pos < n {
        ahead.at(pos);
        let found = at(data, pos, ahead);
        match found {
            At::Record(total) => {
                b.push(pos as u64, total as u64)?;
                pos += total;
            }
            At::OverLimit(total) if boundary(pos + total) => {
                skip(pos as u64, over_limit(pos as u64, (pos + total) as u64));
                pos += total;
            }
            At::BadData(total) if boundary(pos + total) => {
                let range = left_out(pos as u64, (pos + total) as u64);
                skip(pos as u64, format!("bad data CRC; {range}"));
                pos += total;
            }
            _ => {
                let next = resync(data, pos + 1, ahead);
                let why = gap_reason(found, pos, n, next);
                skip(
                    pos as u64,
                    format!("{why}; {}", lost(pos as u64, next as u64, n as u64)),
                );
                pos = next;
            }
        }
    }
    Ok(())
}

/// Why the bytes from `pos` are a gap (up to `next`, the next valid record or `n`).
fn gap_reason(found: At, pos: usize, n: usize, next: usize) -> String {
    let left = n - pos;
    match found {
        At::Short => {
            format!("truncated record: {left} bytes left, a record header needs 12")
        }
        At::PastEnd(len) if next == n => format!(
            "truncated record: its header says {len} data bytes, the file ends {} bytes after the header",
            left - 12
        ),
        At::PastEnd(len) => format!(
            "bad record length: its header says {len} data bytes (its CRC holds), more than the {} bytes left in the file",
            left - 12
        ),
        At::BadLengthCrc => "bad length CRC".into(),
        At::BadData(total) => format!(
            "bad data CRC, and no valid record where its {total} bytes would end (offset {})",
            pos + total
        ),
        At::OverLimit(total) => format!(
            "a header says {total} bytes (over the 2 GiB limit), and no valid record where they would end (offset {})",
            pos + total
        ),
        At::Record(_) => unreachable!("a valid record is not a gap"),
    }
}
