//! The bytes of a segment file: a sequence of records, each a fixed 48-byte header followed
//! by its data (none for a tombstone). Little-endian throughout; no padding between records.
//!
//! ```text
//! offset size field
//!      0    4 magic "SFR1" (shufflefs record, layout 1)
//!      4    1 kind: 1 = data, 2 = tombstone
//!      5    3 sample id, bits 32..56 (zero in caches written before 64-bit ids)
//!      8    4 sample id, bits 0..32
//!     12    4 CRC-32C of the data
//!     16    8 data length in bytes
//!     24    8 sequence number (see below)
//!     32    8 source modification time, nanoseconds since 1970 (0 = unknown)
//!     40    4 CRC-32C of bytes 0..40 (the header's own checksum)
//!     44    4 zero
//! ```
//!
//! The header checksum is what lets a scan tell a record from a torn or never-written tail:
//! a header that fails it ends the segment's valid part. The sequence number orders every
//! record this cache ever wrote (a counter kept across restarts as the highest one found plus
//! one): for each id the record with the highest number wins, a tombstone winning meaning
//! "removed". Compaction copies a record with its number unchanged, so a copy and its
//! original (both present after a crash mid-compaction) are interchangeable.

use std::io;

/// Bytes of a record header.
pub(crate) const HEADER: usize = 48;

const MAGIC: [u8; 4] = *b"SFR1";

/// The largest sample id a header holds (56 bits: far past any dataset's count).
pub(crate) const MAX_ID: u64 = (1 << 56) - 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Data,
    Tombstone,
}

/// A record header, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub kind: Kind,
    /// Below 2^56 ([`MAX_ID`]).
    pub id: u64,
    pub crc: u32,
    pub len: u64,
    pub seq: u64,
    pub mtime: u64,
}

impl Header {
    pub(crate) fn tombstone(id: u64, seq: u64) -> Header {
        Header {
            kind: Kind::Tombstone,
            id,
            crc: 0,
            len: 0,
            seq,
            mtime: 0,
        }
    }

    /// Header plus data.
    pub(crate) fn record_len(&self) -> u64 {
        HEADER as u64 + self.len
    }

    pub(crate) fn encode(&self) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = match self.kind {
            Kind::Data => 1,
            Kind::Tombstone => 2,
        };
        debug_assert!(self.id <= MAX_ID, "sample id {} past 56 bits", self.id);
        let id = self.id.to_le_bytes();
        b[5..8].copy_from_slice(&id[4..7]);
        b[8..12].copy_from_slice(&id[0..4]);
        b[12..16].copy_from_slice(&self.crc.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b[24..32].copy_from_slice(&self.seq.to_le_bytes());
        b[32..40].copy_from_slice(&self.mtime.to_le_bytes());
        let own = crc32c::crc32c(&b[..40]);
        b[40..44].copy_from_slice(&own.to_le_bytes());
        b
    }

    /// The header in `b`, or why it is not one (`InvalidData`).
    pub(crate) fn decode(b: &[u8; HEADER]) -> io::Result<Header> {
        let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_string());
        if b[0..4] != MAGIC {
            return Err(bad("no record magic"));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if crc32c::crc32c(&b[..40]) != u32_at(40) {
            return Err(bad("record header fails its checksum"));
        }
        let kind = match b[4] {
            1 => Kind::Data,
            2 => Kind::Tombstone,
            _ => return Err(bad("unknown record kind")),
        };
        let h = Header {
            kind,
            id: u64::from(u32_at(8)) | u64::from(u32_at(4) >> 8) << 32,
            crc: u32_at(12),
            len: u64_at(16),
            seq: u64_at(24),
            mtime: u64_at(32),
        };
        if kind == Kind::Tombstone && h.len != 0 {
            return Err(bad("tombstone with data"));
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_any_flipped_bit_is_caught() {
        let h = Header {
            kind: Kind::Data,
            id: 77,
            crc: 0xdead_beef,
            len: 362,
            seq: 9,
            mtime: 1_700_000_000_123_456_789,
        };
        let b = h.encode();
        assert_eq!(Header::decode(&b).unwrap(), h);
        for bit in 0..(44 * 8) {
            let mut c = b;
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(Header::decode(&c).is_err(), "bit {bit}");
        }
        assert!(Header::decode(&[0u8; HEADER]).is_err());
        let big = Header {
            id: MAX_ID - 5,
            ..h
        };
        assert_eq!(Header::decode(&big.encode()).unwrap(), big);
        let t = Header::tombstone(3, 10);
        assert_eq!(Header::decode(&t.encode()).unwrap(), t);
        assert_eq!(t.record_len(), HEADER as u64);
    }
}
