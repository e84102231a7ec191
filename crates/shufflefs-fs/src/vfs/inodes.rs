//! The inode scheme and names of the mounted tree.
//!
//! ```text
//! /                              ino 1
//! /.shufflefs/                   ino 2
//! /.shufflefs/status             ino 3   JSON, regenerated at each open
//! /.shufflefs/epoch              ino 4   read: current epoch; write N+1: advance
//! /current -> epoch-N            ino 5
//! /.shufflefs/metrics            ino 6   Prometheus text, regenerated at each open
//! /epoch-N/                      kind 1: (1 << 62) | N
//! /epoch-N/<class>/              kind 2: (2 << 62) | N << 32 | class
//! /epoch-N/<class>/<sample>      kind 3: (3 << 62) | sample id           (61 bits)
//! /epoch-N/part-<P>.<ext>        kind 3: (3 << 62) | 1 << 61 | N << 32 | P   (record sources)
//! /epoch-N/.../<side file>       kind 0: 1 << 32 | index                (--replicate)
//! ```
//! A side file's bytes never change, so like a sample it keeps one inode in every epoch.
//! A part's bytes differ every epoch, so its inode names the epoch (kind 3 with bit 61 set;
//! a sample's has it clear, which leaves 61 bits for 64-bit sample ids). The epoch field
//! has 29 bits, which bounds [`MAX_EPOCH`].
//! Every inode number *is* its node: nothing is allocated on lookup, so `forget` has nothing
//! to free and the daemon's memory does not grow with the number of files the kernel caches.
//! Views never change once published, so the kernel may cache entries and attributes for as
//! long as it likes. A sample keeps one inode in every epoch that lists it (its bytes never
//! change): a sample this rank keeps from epoch N to N+1 is the same kernel inode, and
//! whatever the kernel cached for it (attributes, and in page-cache mode its pages) carries
//! over instead of being fetched again.

use std::ffi::OsStr;

use crate::plan::SampleId;

pub const ROOT: u64 = 1;
pub(crate) const CTL_DIR_NAME: &str = ".shufflefs";
pub const CURRENT_NAME: &str = "current";
pub(crate) const STATUS_NAME: &str = "status";
pub(crate) const EPOCH_CTL_NAME: &str = "epoch";
pub(crate) const METRICS_NAME: &str = "metrics";
/// Epochs are limited to 29 bits by the inode layout (half a billion epochs); the
/// coordinator publishes none beyond.
pub(crate) use crate::node::coordinator::MAX_EPOCH;

/// The bits of a sample's inode that hold its id (ids are far below 2^61).
const SAMPLE_BITS: u64 = (1 << 61) - 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    Root,
    CtlDir,
    Status,
    EpochCtl,
    Current,
    Metrics,
    EpochDir(u64),
    ClassDir(u64, u32),
    Sample(SampleId),
    /// Part `.1` of epoch `.0`'s view of a record source (see `vfs::parts`).
    Part(u64, u32),
    /// Side file `.0` (`--replicate`), in whichever folder and epoch shows it.
    Side(u32),
}

impl Node {
    pub fn ino(self) -> u64 {
        match self {
            Node::Root => ROOT,
            Node::CtlDir => 2,
            Node::Status => 3,
            Node::EpochCtl => 4,
            Node::Current => 5,
            Node::Metrics => 6,
            Node::EpochDir(e) => 1 << 62 | e,
            Node::ClassDir(e, c) => 2 << 62 | e << 32 | u64::from(c),
            Node::Sample(s) => 3 << 62 | (s & SAMPLE_BITS),
            Node::Part(e, p) => 3 << 62 | 1 << 61 | e << 32 | u64::from(p),
            Node::Side(i) => 1 << 32 | u64::from(i),
        }
    }

    pub fn from_ino(ino: u64) -> Option<Node> {
        let low = ino & ((1 << 62) - 1);
        let (epoch, index) = (low >> 32, (low & 0xFFFF_FFFF) as u32);
        Some(match ino >> 62 {
            0 => match ino {
                1 => Node::Root,
                2 => Node::CtlDir,
                3 => Node::Status,
                4 => Node::EpochCtl,
                5 => Node::Current,
                6 => Node::Metrics,
                _ if ino >> 32 == 1 => Node::Side(ino as u32),
                _ => return None,
            },
            1 if low <= MAX_EPOCH => Node::EpochDir(low),
            2 => Node::ClassDir(epoch, index),
            3 if low >> 61 == 0 => Node::Sample(low),
            3 => Node::Part(epoch & MAX_EPOCH, index),
            _ => return None,
        })
    }

    pub(crate) fn is_dir(self) -> bool {
        matches!(
            self,
            Node::Root | Node::CtlDir | Node::EpochDir(_) | Node::ClassDir(..)
        )
    }
}

pub fn epoch_dir_name(epoch: u64) -> String {
    format!("epoch-{epoch}")
}

/// Parses `epoch-N` in canonical form only (`epoch-01` is not `epoch-1`).
pub(crate) fn parse_epoch_dir(name: &OsStr) -> Option<u64> {
    let digits = name.to_str()?.strip_prefix("epoch-")?;
    let n: u64 = digits.parse().ok()?;
    (n.to_string() == digits && n <= MAX_EPOCH).then_some(n)
}

/// Parses what a user writes to `.shufflefs/epoch`: one decimal number, surrounding space
/// allowed (a second number is refused: one write, one epoch).
pub(crate) fn parse_epoch_value(data: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(data).ok()?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok().filter(|&n| n <= MAX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_roundtrip() {
        for node in [
            Node::Root,
            Node::CtlDir,
            Node::Status,
            Node::EpochCtl,
            Node::Current,
            Node::Metrics,
            Node::EpochDir(0),
            Node::EpochDir(MAX_EPOCH),
            Node::ClassDir(7, 0),
            Node::ClassDir(MAX_EPOCH, u32::MAX),
            Node::Sample(0),
            Node::Sample(u32::MAX.into()),
            Node::Sample(5_000_000_000),
            Node::Sample(SAMPLE_BITS),
            Node::Part(0, 0),
            Node::Part(MAX_EPOCH, u32::MAX),
            Node::Side(0),
            Node::Side(u32::MAX),
        ] {
            assert_eq!(Node::from_ino(node.ino()), Some(node), "{node:?}");
        }
        assert_eq!(Node::from_ino(0), None);
        assert_eq!(Node::from_ino(3 << 62 | 1 << 61), Some(Node::Part(0, 0)));
        assert_eq!(
            Node::from_ino(3 << 62 | 1 << 32),
            Some(Node::Sample(1 << 32))
        );
        assert_eq!(Node::from_ino(7), None);
    }

    #[test]
    fn names_parse_strictly() {
        assert_eq!(parse_epoch_dir(OsStr::new("epoch-12")), Some(12));
        for bad in [
            "epoch-01",
            "epoch-",
            "epoch--1",
            "epoch-1x",
            "epoch-99999999999",
            "Epoch-1",
        ] {
            assert_eq!(parse_epoch_dir(OsStr::new(bad)), None, "{bad}");
        }
        assert_eq!(parse_epoch_value(b"3\n"), Some(3));
        assert_eq!(parse_epoch_value(b" 4 "), Some(4));
        for bad in [
            &b"-1"[..],
            b"",
            b"abc",
            b"1.5",
            b"+2",
            b"\xff",
            b"99999999999999999999",
            b"4\n5\n6",
            b"4 5",
        ] {
            assert_eq!(parse_epoch_value(bad), None, "{bad:?}");
        }
    }
}
