//! Per-epoch part files of a record source: `epoch-N/part-00000.<ext>`, ...
//!
//! A record dataset is read by loaders that take files (`tf.data.TFRecordDataset`,
//! `load_svmlight_file`, `pandas.read_csv`, `tarfile`/webdataset), not folders of records.
//! So each epoch, this rank's groups (its share) are put in a fresh order (LIRS's index
//! shuffle, seeded by `(seed, epoch, rank)` so a remount shows the same view) and cut into
//! parts of about `--part-size` bytes, in the source's own framing:
//! - a part is whole groups back to back (a group is whole records, so a part never splits
//!   a record); a part ends with the first group that brings it to the target size;
//! - lines: the `--header-line` header starts every part, and a `\n` is added after a file's
//!   last line if it had none, so records stay apart;
//! - tar: every part ends with the two zero blocks that end an archive.
//!
//! The layout is plain arithmetic over the groups' sizes, which the index knows, so every
//! part's size is exact when the view is published, and a read at any offset maps to groups
//! by binary search. Bytes come through a closure (the `SampleStore` in the view: cached
//! groups from the cache, the rest from the source), so this file does no I/O and is tested
//! against plain concatenation.

use std::io;

use crate::plan::SampleId;

/// Item `i` of the layout is a group; parts are runs of items.
pub struct PartLayout {
    pub epoch: u64,
    ext: String,
    header: Vec<u8>,
    trailer: u64,
    /// Groups in view order.
    order: Vec<SampleId>,
    /// Each item's end offset within its part (header included, trailer not).
    item_end: Vec<u64>,
    /// Items followed by an added `\n` (at most one per source file), ascending.
    newline_after: Vec<u32>,
    /// Each part's first item; one more entry: `order.len()`.
    part_first: Vec<u32>,
}

impl PartLayout {
    /// Lays out `order` (groups in view order) into parts of about `target` bytes.
    /// `len(g)` is group `g`'s size and whether a `\n` follows it in the view.
    pub(crate) fn new(
        epoch: u64,
        order: Vec<SampleId>,
        len: impl Fn(SampleId) -> (u64, bool),
        target: u64,
        header: Vec<u8>,
        trailer: u64,
        ext: String,
    ) -> PartLayout {
        let hdr = header.len() as u64;
        let mut item_end = Vec::with_capacity(order.len());
        let (mut newline_after, mut part_first) = (Vec::new(), vec![0u32]);
        let mut cur = hdr;
        for (i, &g) in order.iter().enumerate() {
            if cur > hdr && cur + trailer >= target {
                part_first.push(i as u32);
                cur = hdr;
            }
            let (bytes, newline) = len(g);
            cur += bytes + u64::from(newline);
            if newline {
                newline_after.push(i as u32);
            }
            item_end.push(cur);
        }
        if !order.is_empty() {
            part_first.push(order.len() as u32);
        } else {
            part_first.clear();
        }
        PartLayout {
            epoch,
            ext,
            header,
            trailer,
            order,
            item_end,
            newline_after,
            part_first,
        }
    }

    pub(crate) fn parts(&self) -> u32 {
        self.part_first.len().saturating_sub(1) as u32
    }

    /// The items of part `p`.
    fn items(&self, p: u32) -> std::ops::Range<usize> {
        self.part_first[p as usize] as usize..self.part_first[p as usize + 1] as usize
    }

    /// Part `p`'s exact size in bytes.
    pub(crate) fn size(&self, p: u32) -> u64 {
        self.item_end[self.items(p).end - 1] + self.trailer
    }

    /// Groups of part `p`, in order.
    #[cfg(test)]
    pub(crate) fn groups(&self, p: u32) -> &[SampleId] {
        &self.order[self.items(p)]
    }

    pub(crate) fn name(&self, p: u32) -> String {
        format!("part-{p:05}.{}", self.ext)
    }

    /// The part `name` names, if it is one of this layout's (canonical names only).
    pub(crate) fn parse_name(&self, name: &str) -> Option<u32> {
        let digits = name.strip_prefix("part-")?.strip_suffix(&self.ext)?;
        let digits = digits.strip_suffix('.')?;
        let p: u32 = digits.parse().ok()?;
        (format!("{p:05}") == digits && p < self.parts()).then_some(p)
    }

    /// Fills `buf` from offset `offset` of part `p`; short only at its end. `read(g, off,
    /// buf)` reads group `g`'s bytes at `off` (short only at the group's end).
    pub(crate) fn read(
        &self,
        p: u32,
        offset: u64,
        buf: &mut [u8],
        mut read: impl FnMut(SampleId, u64, &mut [u8]) -> io::Result<usize>,
    ) -> io::Result<usize> {
        let size = self.size(p);
        let end = offset.saturating_add(buf.len() as u64).min(size);
        let items = self.items(p);
        let hdr = self.header.len() as u64;
        let body_end = self.item_end[items.end - 1];
        let mut pos = offset;
        while pos < end {
            let out = &mut buf[(pos - offset) as usize..(end - offset) as usize];
            let n = if pos < hdr {
                let h = &self.header[pos as usize..];
                let n = h.len().min(out.len());
                out[..n].copy_from_slice(&h[..n]);
                n
            } else if pos >= body_end {
                out.fill(0); // the tar trailer
                out.len()
            } else {
                let i = items.start + self.item_end[items.clone()].partition_point(|&e| e <= pos);
                let start = if i == items.start {
                    hdr
                } else {
                    self.item_end[i - 1]
                };
                let newline = self.newline_after.binary_search(&(i as u32)).is_ok();
                let group_len = self.item_end[i] - start - u64::from(newline);
                let within = pos - start;
                if within < group_len {
                    let want = ((group_len - within) as usize).min(out.len());
                    let got = read(self.order[i], within, &mut out[..want])?;
                    if got < want {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!(
                                "group {} ended after {} of its {group_len} bytes",
                                self.order[i],
                                within + got as u64
                            ),
                        ));
                    }
                    got
                } else {
                    out[0] = b'\n';
                    1
                }
            };
            pos += n as u64;
        }
        Ok((end.saturating_sub(offset)) as usize)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Group `g`'s bytes: a pure function of (g, offset), `len(g)` long.
    fn byte(g: SampleId, o: u64) -> u8 {
        (g * 31 + o * 7) as u8 | 1
    }

    fn concat(l: &PartLayout, p: u32, lens: &[(u64, bool)]) -> Vec<u8> {
        let mut v = l.header.clone();
        for &g in l.groups(p) {
            let (n, nl) = lens[g as usize];
            v.extend((0..n).map(|o| byte(g, o)));
            if nl {
                v.push(b'\n');
            }
        }
        v.extend(std::iter::repeat_n(0, l.trailer as usize));
        v
    }

    fn reader(
        lens: &[(u64, bool)],
    ) -> impl FnMut(SampleId, u64, &mut [u8]) -> io::Result<usize> + '_ {
        move |g, off, buf| {
            let n = lens[g as usize].0.saturating_sub(off).min(buf.len() as u64) as usize;
            for (i, b) in buf[..n].iter_mut().enumerate() {
                *b = byte(g, off + i as u64);
            }
            Ok(n)
        }
    }

    #[test]
    fn names_are_canonical() {
        let l = PartLayout::new(0, vec![0, 1], |_| (10, false), 10, vec![], 0, "csv".into());
        assert_eq!(l.parts(), 2);
        assert_eq!(l.name(1), "part-00001.csv");
        assert_eq!(l.parse_name("part-00001.csv"), Some(1));
        for bad in [
            "part-1.csv",
            "part-00002.csv",
            "part-00001.tar",
            "part-00001csv",
            "x",
        ] {
            assert_eq!(l.parse_name(bad), None, "{bad}");
        }
        let empty = PartLayout::new(0, vec![], |_| (10, false), 10, vec![], 0, "csv".into());
        assert_eq!(empty.parts(), 0);
    }

    proptest! {
        /// Parts hold every group once, in order; sizes are exact; a read at any offset
        /// equals the same range of the concatenation.
        #[test]
        fn reads_match_concatenation(
            lens in proptest::collection::vec((1u64..3000, proptest::bool::weighted(0.1)), 0..40),
            target in 1u64..20_000,
            header in proptest::collection::vec(1u8..255, 0..20),
            tar in any::<bool>(),
            reads in proptest::collection::vec((0u64..60_000, 0usize..9000), 1..20),
        ) {
            let n = lens.len() as u64;
            let order: Vec<u64> = (0..n).rev().collect();
            let trailer = if tar { 1024 } else { 0 };
            let l = PartLayout::new(3, order.clone(), |g| lens[g as usize], target, header, trailer, "x".into());
            let all: Vec<u64> = (0..l.parts()).flat_map(|p| l.groups(p).to_vec()).collect();
            prop_assert_eq!(&all, &order);
            for p in 0..l.parts() {
                let whole = concat(&l, p, &lens);
                prop_assert_eq!(whole.len() as u64, l.size(p));
                if p + 1 < l.parts() {
                    prop_assert!(l.size(p) >= target, "only the last part is under the target");
                }
                for &(off, len) in &reads {
                    let off = off % (whole.len() as u64 + 10);
                    let mut buf = vec![0u8; len];
                    let got = l.read(p, off, &mut buf, reader(&lens)).unwrap();
                    let lo = (off as usize).min(whole.len());
                    let hi = (lo + len).min(whole.len());
                    prop_assert_eq!(&buf[..got], &whole[lo..hi]);
                }
            }
        }
    }
}
