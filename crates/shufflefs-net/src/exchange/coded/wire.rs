//! Plain samples on the wire of the coded exchange: what the server sends a rank that
//! lacks a cached sample or could not decode a packet. Coded packets themselves are
//! `coded::packet`'s.

use std::io;

use crate::plan::SampleId;

/// Why a bundle of plain samples could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed bundle of plain samples (cut short)")]
pub(crate) struct Malformed;

/// A bundle entry whose sample the server could not read.
const UNREADABLE: u64 = u64::MAX;

/// Plain samples for one rank: per sample `id u64, len u64, crc32c u32, bytes`; a sample the
/// server could not read has `len = u64::MAX` and no bytes.
#[derive(Default)]
pub(crate) struct Bundle(pub Vec<u8>);

impl Bundle {
    pub(crate) fn push(&mut self, id: SampleId, bytes: io::Result<&[u8]>) {
        self.0.extend_from_slice(&id.to_le_bytes());
        match bytes {
            Ok(b) => {
                self.0.extend_from_slice(&(b.len() as u64).to_le_bytes());
                self.0.extend_from_slice(&crc32c::crc32c(b).to_le_bytes());
                self.0.extend_from_slice(b);
            }
            Err(_) => {
                self.0.extend_from_slice(&UNREADABLE.to_le_bytes());
                self.0.extend_from_slice(&0u32.to_le_bytes());
            }
        }
    }
}

/// One entry of a received bundle: `None` bytes where the server could not read it.
pub(crate) struct Plain<'a> {
    pub id: SampleId,
    pub crc: u32,
    pub bytes: Option<&'a [u8]>,
}

/// The entries of a bundle; `Err` if it is cut short.
pub(crate) fn unbundle(mut b: &[u8]) -> Result<Vec<Plain<'_>>, Malformed> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let head = b.get(..20).ok_or(Malformed)?;
        let id = u64::from_le_bytes(head[0..8].try_into().expect("8"));
        let len = u64::from_le_bytes(head[8..16].try_into().expect("8"));
        let crc = u32::from_le_bytes(head[16..20].try_into().expect("4"));
        b = &b[20..];
        if len == UNREADABLE {
            out.push(Plain {
                id,
                crc,
                bytes: None,
            });
            continue;
        }
        let len = usize::try_from(len).map_err(|_| Malformed)?;
        let bytes = b.get(..len).ok_or(Malformed)?;
        b = &b[len..];
        out.push(Plain {
            id,
            crc,
            bytes: Some(bytes),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_round_trip() {
        let mut b = Bundle::default();
        b.push(4, Ok(&[1, 2, 3]));
        b.push(9, Err(io::Error::other("gone")));
        b.push(5, Ok(&[]));
        let got = unbundle(&b.0).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!((got[0].id, got[0].bytes), (4, Some(&[1u8, 2, 3][..])));
        assert_eq!(got[0].crc, crc32c::crc32c(&[1, 2, 3]));
        assert_eq!((got[1].id, got[1].bytes), (9, None));
        assert_eq!((got[2].id, got[2].bytes), (5, Some(&[][..])));
        assert!(unbundle(&b.0[..5]).is_err());
    }
}
