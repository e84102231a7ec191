//! The lines walk of the index pass: one record per `\n`-terminated line.
//!
//! Lines resynchronise by themselves (every `\n` ends a record), so the only record left
//! out is one over 2 GiB. The walk streams: it looks for `\n` window by window and keeps
//! nothing of a line but its start, so a 200 MB line costs no more memory than a short
//! one (the windows behind are dropped from the map, see [`Ahead`]).

use super::MAX_RECORD;
use super::pass::{Ahead, RecordError, TableBuilder, over_limit};

/// The longest header line kept (`--header-line`): it is repeated at the top of every part.
const MAX_HEADER: usize = 1 << 20;

/// The header line (with its `\n`) and where the records start; `Err(MAX_HEADER)` when the
/// first line is longer (it is not held, and the file's records are left out).
pub(super) fn header_line(data: &[u8]) -> Result<(Vec<u8>, usize), usize> {
    let head = &data[..data.len().min(MAX_HEADER + 1)];
    let end = match memchr::memchr(b'\n', head) {
        Some(i) if i < MAX_HEADER => i + 1,
        _ if data.len() <= MAX_HEADER => data.len(),
        _ => return Err(MAX_HEADER),
    };
    let mut line = data[..end].to_vec();
    if line.last() != Some(&b'\n') {
        line.push(b'\n');
    }
    Ok((line, end))
}

/// Lines from `from` on; returns whether the last one lacks its `\n`.
pub(super) fn lines(
    data: &[u8],
    from: usize,
    b: &mut TableBuilder,
    skip: &mut impl FnMut(u64, String),
    ahead: &mut Ahead,
) -> Result<bool, RecordError> {
    let mut start = from;
    let mut record = |b: &mut TableBuilder, start: usize, end: usize| {
        let len = (end - start) as u64;
        if len > MAX_RECORD {
            skip(start as u64, over_limit(start as u64, end as u64));
            Ok(())
        } else {
            b.push(start as u64, len)
        }
    };
    // Window by window, so the read-ahead stays ahead of the scan and the map behind it
    // is dropped.
    let mut at = from;
    while at < data.len() {
        ahead.at(at);
        let stop = (at + Ahead::WINDOW).min(data.len());
        for nl in memchr::memchr_iter(b'\n', &data[at..stop]) {
            let end = at + nl + 1;
            record(b, start, end)?;
            start = end;
        }
        at = stop;
    }
    let open = start < data.len();
    if open {
        record(b, start, data.len())?;
    }
    Ok(open)
}
