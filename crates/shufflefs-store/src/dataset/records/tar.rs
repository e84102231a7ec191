//! The tar walk of the index pass: webdataset samples (consecutive members with the same
//! key) as records.
//!
//! Our own rather than the `tar` crate's: we need the byte offset of the extension headers
//! (GNU long names, pax) that belong to a member, so the record's range includes them, and to
//! carry on past a damaged header, which its entry iterator does not offer. Only what
//! webdataset shards use is read: ustar/GNU headers, `L` and pax `path`. A sample lacking a
//! member the others have (a member without its pair) is only known once every file is read,
//! so samples are kept ([`TarSamples`]) until then and then put in the table.
//!
//! # Resynchronising
//! A header block whose checksum fails, or whose size runs past the end of the file (a
//! truncated member, or a hostile size with a valid checksum), starts a *gap*: the walk looks
//! at each following 512-byte block for a valid header (checksum, size, ustar or old-style
//! magic, member inside the file) and resumes there, reporting the gap's byte range. Zero
//! blocks end the archive unless a valid header follows them (concatenated archives, or a
//! header zeroed by damage). A gap also ends the sample being collected, so no record's range
//! holds a gap's bytes.

use std::collections::HashMap;
use std::path::Path;

use super::MAX_RECORD;
use super::pass::{Ahead, RecordError, TableBuilder, left_out, lost, over_limit, path_of};
use crate::dataset::names::Skipped;

/// Tar records (webdataset samples) of every file, kept until all files are read: a sample
/// lacking a member the others have is only known once the common set is.
#[derive(Default)]
pub(super) struct TarSamples {
    /// (file, start, end, member-set id) per sample, in file order.
    samples: Vec<(u32, u64, u64, u32)>,
    sets: HashMap<Vec<String>, u32>,
}

impl TarSamples {
    fn push(&mut self, file: u32, start: u64, end: u64, mut exts: Vec<String>) {
        exts.sort();
        let next = self.sets.len() as u32;
        let set = *self.sets.entry(exts).or_insert(next);
        self.samples.push((file, start, end, set));
    }

    /// Keeps the samples with the most common member set; reports the rest.
    pub(super) fn into_table(
        self,
        source: &Path,
        files: &[(String, u64)],
        b: &mut TableBuilder,
        skipped: &mut Vec<Skipped>,
    ) -> Result<(), RecordError> {
        let mut counts = vec![0u64; self.sets.len()];
        for s in &self.samples {
            counts[s.3 as usize] += 1;
        }
        let Some(common) = (0..counts.len()).max_by_key(|&i| (counts[i], std::cmp::Reverse(i)))
        else {
            return Ok(());
        };
        let mut names = vec![String::new(); self.sets.len()];
        for (exts, id) in &self.sets {
            names[*id as usize] = format!("[.{}]", exts.join(", ."));
        }
        let mut current = None;
        for &(f, start, end, set) in &self.samples {
            let path = path_of(source, &files[f as usize].0);
            if set as usize != common {
                skipped.push(Skipped {
                    path: path.display().to_string(),
                    reason: format!(
                        "byte offset {start}: webdataset sample with members {} while the others have {}: a member without its pair; {}",
                        names[set as usize], names[common], left_out(start, end)
                    ),
                });
                continue;
            }
            if end - start > MAX_RECORD {
                skipped.push(Skipped {
                    path: path.display().to_string(),
                    reason: format!("byte offset {start}: {}", over_limit(start, end)),
                });
                continue;
            }
            if current != Some(f) {
                b.end_file(false);
                b.begin_file(&files[f as usize].0, files[f as usize].1);
                current = Some(f);
            }
            b.push(start, end - start)?;
        }
        b.end_file(false);
        Ok(())
    }
}

/// A tar header block's checksum holds (unsigned sum, or signed as some old tars wrote).
fn tar_checksum_ok(block: &[u8]) -> bool {
    let Some(stored) = octal(&block[148..156]) else {
        return false;
    };
    let field = |i: usize| {
        if (148..156).contains(&i) {
            b' '
        } else {
            block[i]
        }
    };
    let unsigned: u64 = (0..512).map(|i| u64::from(field(i))).sum();
    let signed: i64 = (0..512).map(|i| i64::from(field(i) as i8)).sum();
    stored == unsigned || stored as i64 == signed
}

/// A NUL/space-terminated octal field.
fn octal(field: &[u8]) -> Option<u64> {
    let digits: Vec<u8> = field
        .iter()
        .copied()
        .skip_while(|&c| c == b' ')
        .take_while(|&c| c != 0 && c != b' ')
        .collect();
    if digits.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(std::str::from_utf8(&digits).ok()?, 8).ok()
}

/// A tar size field: octal, or GNU base-256 for large sizes.
fn tar_size(field: &[u8]) -> Option<u64> {
    if field[0] & 0x80 != 0 {
        let mut v = 0u64;
        for &c in &field[4..] {
            v = v << 8 | u64::from(c);
        }
        return Some(v);
    }
    octal(field)
}

fn cstr(b: &[u8]) -> &[u8] {
    &b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())]
}

/// webdataset's key and extension: the name up to the first dot of its last component.
fn split_key(name: &str) -> (&str, &str) {
    let base = name.rfind('/').map_or(0, |i| i + 1);
    match name[base..].find('.') {
        Some(dot) => (&name[..base + dot], &name[base + dot + 1..]),
        None => (name, ""),
    }
}

/// The `path` of a pax extended header, if it sets one.
fn pax_path(data: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(data).ok()?;
    text.lines()
        .filter_map(|l| l.split_once(' ').map(|(_, kv)| kv))
        .find_map(|kv| kv.strip_prefix("path=").map(str::to_owned))
}

/// Whether a valid header starts at `p`: a non-zero block with a valid checksum, a size,
/// a ustar magic (or none, as old tars have), and a member that fits the file.
fn header_at(data: &[u8], p: usize) -> bool {
    let n = data.len();
    if p + 512 > n {
        return false;
    }
    let block = &data[p..p + 512];
    let magic = &block[257..263];
    block.iter().any(|&c| c != 0)
        && (magic.starts_with(b"ustar") || magic.iter().all(|&c| c == 0))
        && tar_checksum_ok(block)
        && tar_size(&block[124..136]).is_some_and(|size| size <= (n - p - 512) as u64)
}

/// The first block from `from` on (in 512-byte steps) where a valid header starts, else
/// the end of the file.
fn resync(data: &[u8], from: usize, ahead: &mut Ahead) -> usize {
    let mut p = from;
    while p + 512 <= data.len() {
        if p.is_multiple_of(Ahead::WINDOW) {
            ahead.at(p);
        }
        if header_at(data, p) {
            return p;
        }
        p += 512;
    }
    data.len()
}

/// The walk's state between headers.
#[derive(Default)]
struct Walk {
    /// Extension headers seen for the next member: where they start, and its long name.
    ext_start: Option<usize>,
    long_name: Option<String>,
    /// The sample being collected: key, start, end, member extensions.
    sample: Option<(String, usize, usize, Vec<String>)>,
}

impl Walk {
    /// Ends the sample being collected (at a new key, a gap, the end of the file).
    fn flush(&mut self, file: u32, out: &mut TarSamples) {
        if let Some((_, start, end, exts)) = self.sample.take() {
            out.push(file, start as u64, end as u64, exts);
        }
    }

    /// A gap: the sample ends, and extension headers before it belong to no member.
    fn gap(&mut self, file: u32, out: &mut TarSamples) {
        self.flush(file, out);
        (self.ext_start, self.long_name) = (None, None);
    }

    /// The name of the member whose header is `block`.
    fn name(&mut self, block: &[u8]) -> String {
        self.long_name.take().unwrap_or_else(|| {
            let (name, prefix) = (cstr(&block[0..100]), cstr(&block[345..500]));
            let name = String::from_utf8_lossy(name);
            if prefix.is_empty() {
                name.into_owned()
            } else {
                format!("{}/{name}", String::from_utf8_lossy(prefix))
            }
        })
    }

    /// A member of type `kind` named `name`, whose bytes (extension headers included) are
    /// `start..end` and whose data is `body`.
    fn member(
        &mut self,
        (kind, name, body): (u8, &str, &[u8]),
        (pos, start, end): (usize, usize, usize),
        (file, out): (u32, &mut TarSamples),
        skip: &mut impl FnMut(u64, String),
    ) {
        match kind {
            b'L' => {
                self.ext_start.get_or_insert(pos);
                self.long_name = Some(String::from_utf8_lossy(cstr(body)).into_owned());
            }
            b'x' => {
                self.ext_start.get_or_insert(pos);
                self.long_name = pax_path(body);
            }
            b'K' => {
                self.ext_start.get_or_insert(pos);
            }
            b'g' | b'5' => self.ext_start = None, // global header, folder: no record's bytes
            b'0' | 0 | b'7' => {
                self.ext_start = None;
                let (key, ext) = split_key(name);
                match &mut self.sample {
                    Some((k, _, e, exts)) if k == key => {
                        *e = end;
                        exts.push(ext.to_string());
                    }
                    _ => {
                        self.flush(file, out);
                        self.sample = Some((key.to_string(), start, end, vec![ext.to_string()]));
                    }
                }
            }
            other => {
                self.ext_start = None;
                skip(
                    start as u64,
                    format!(
                        "tar member {name} is not a regular file (type {:?}); left out",
                        other as char
                    ),
                );
            }
        }
    }
}

/// The walk of one tar file: its samples into `out` (see the module docs).
pub(super) fn tar_samples(
    data: &[u8],
    file: u32,
    out: &mut TarSamples,
    skip: &mut impl FnMut(u64, String),
    ahead: &mut Ahead,
) {
    let n = data.len();
    let mut pos = 0usize;
    let mut w = Walk::default();
    while pos < n {
        ahead.at(pos);
        if n - pos < 512 {
            let range = lost(pos as u64, n as u64, n as u64);
            skip(
                pos as u64,
                format!(
                    "truncated tar header: {} bytes left of 512; {range}",
                    n - pos
                ),
            );
            break;
        }
        let block = &data[pos..pos + 512];
        if block.iter().all(|&c| c == 0) {
            let next = resync(data, pos + 512, ahead);
            if next == n {
                break; // end of archive
            }
            w.gap(file, out);
            let range = lost(pos as u64, next as u64, n as u64);
            skip(
                pos as u64,
                format!("zero blocks (an end of archive) with a valid header after them; {range}"),
            );
            pos = next;
            continue;
        }
        let size = tar_size(&block[124..136]).filter(|_| tar_checksum_ok(block));
        let start = w.ext_start.unwrap_or(pos);
        let data_start = pos + 512;
        let Some(size) = size.filter(|&size| size <= (n - data_start) as u64) else {
            let next = resync(data, pos + 512, ahead);
            let why = match size {
                None => "bad tar header checksum".to_string(),
                Some(size) => past_end(&w.name(block), size, n - data_start, next == n),
            };
            w.gap(file, out);
            skip(
                start as u64,
                format!("{why}; {}", lost(start as u64, next as u64, n as u64)),
            );
            pos = next;
            continue;
        };
        let name = w.name(block);
        let end = (data_start + (size as usize).div_ceil(512) * 512).min(n);
        let body = &data[data_start..data_start + size as usize];
        w.member(
            (block[156], &name, body),
            (pos, start, end),
            (file, out),
            skip,
        );
        pos = end;
    }
    w.flush(file, out);
}

/// Why a member whose size runs `left` bytes past its header's end is a gap.
fn past_end(name: &str, size: u64, left: usize, at_end: bool) -> String {
    if at_end {
        format!(
            "truncated tar member {name}: its header says {size} bytes, the file ends {left} bytes after the header"
        )
    } else {
        format!(
            "tar member {name}: its header says {size} bytes (its checksum holds), more than the {left} bytes left in the file"
        )
    }
}
