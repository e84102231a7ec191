//! The bytes on the wire of the coded exchange: plain-sample bundles and request lists
//! (owned here), and coded packets (a stand-in for `coded::packet`, which the byte-layer
//! branch provides; once merged, [`encode_packet`] and [`decode_packet`] call it and this
//! copy goes).
//!
//! Packet layout (stand-in, same fields as `coded::packet`): `u32` part count, then per part
//! `sample u32, receiver u32, len u64, crc32c u32`, then the XOR of the parts' bytes, each
//! zero-padded to the longest. A one-part packet is the plain sample behind its header.
//! Decoding XORs out every other part (which the receiver caches), cuts the result to the
//! part's length and checks its CRC before anything is stored.

use std::io;

use crate::coded::{Node, Transmission};
use crate::plan::SampleId;

const PART: usize = 4 + 4 + 8 + 4;

/// Why a packet could not be decoded by this rank.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PacketError {
    #[error("malformed packet")]
    Malformed,
    #[error("sample {sample} needed to decode the packet is not cached")]
    NotCached { sample: SampleId },
    #[error("decoded sample {sample} fails its CRC")]
    Crc { sample: SampleId },
}

/// The packet of `tx`, reading each part's bytes with `read`.
pub fn encode_packet(
    tx: &Transmission,
    read: &mut dyn FnMut(SampleId) -> io::Result<Vec<u8>>,
) -> io::Result<Vec<u8>> {
    let mut parts = Vec::with_capacity(tx.parts.len());
    for &(s, r) in &tx.parts {
        parts.push((s, r, read(s)?));
    }
    let longest = parts.iter().map(|p| p.2.len()).max().unwrap_or(0);
    let mut out = Vec::with_capacity(4 + PART * parts.len() + longest);
    out.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for (s, r, bytes) in &parts {
        out.extend_from_slice(&s.to_le_bytes());
        out.extend_from_slice(&(*r as u32).to_le_bytes());
        out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(bytes).to_le_bytes());
    }
    let start = out.len();
    out.resize(start + longest, 0);
    for (_, _, bytes) in &parts {
        xor_into(&mut out[start..], bytes);
    }
    Ok(out)
}

fn xor_into(acc: &mut [u8], bytes: &[u8]) {
    for (a, b) in acc.iter_mut().zip(bytes) {
        *a ^= b;
    }
}

struct Header {
    sample: SampleId,
    receiver: Node,
    len: usize,
    crc: u32,
}

fn headers(packet: &[u8]) -> Result<(Vec<Header>, &[u8]), PacketError> {
    let n = u32::from_le_bytes(
        packet
            .get(..4)
            .ok_or(PacketError::Malformed)?
            .try_into()
            .expect("4 bytes"),
    ) as usize;
    let body = 4 + n.checked_mul(PART).ok_or(PacketError::Malformed)?;
    let table = packet.get(4..body).ok_or(PacketError::Malformed)?;
    let hs: Vec<Header> = table
        .chunks_exact(PART)
        .map(|c| Header {
            sample: u32::from_le_bytes(c[0..4].try_into().expect("4")),
            receiver: u32::from_le_bytes(c[4..8].try_into().expect("4")) as Node,
            len: u64::from_le_bytes(c[8..16].try_into().expect("8")) as usize,
            crc: u32::from_le_bytes(c[16..20].try_into().expect("4")),
        })
        .collect();
    let payload = &packet[body..];
    if n == 0 || hs.iter().any(|h| h.len > payload.len()) {
        return Err(PacketError::Malformed);
    }
    Ok((hs, payload))
}

/// The samples `me` decodes from `packet` (none if it carries nothing for `me`), given
/// `cached` (the receiver's cached bytes of a sample, `None` if not cached). Every decoded
/// sample has passed its CRC.
pub fn decode_packet(
    packet: &[u8],
    me: Node,
    cached: &mut dyn FnMut(SampleId) -> Option<Vec<u8>>,
) -> Result<Vec<(SampleId, Vec<u8>)>, PacketError> {
    let (hs, payload) = headers(packet)?;
    let mut out = Vec::new();
    for (i, h) in hs.iter().enumerate().filter(|(_, h)| h.receiver == me) {
        let mut acc = payload.to_vec();
        for (j, other) in hs.iter().enumerate() {
            if j == i {
                continue;
            }
            let bytes = cached(other.sample).ok_or(PacketError::NotCached {
                sample: other.sample,
            })?;
            if bytes.len() != other.len {
                return Err(PacketError::Crc { sample: h.sample });
            }
            xor_into(&mut acc, &bytes);
        }
        acc.truncate(h.len);
        if crc32c::crc32c(&acc) != h.crc {
            return Err(PacketError::Crc { sample: h.sample });
        }
        out.push((h.sample, acc));
    }
    Ok(out)
}

/// A bundle entry whose sample the server could not read.
const UNREADABLE: u64 = u64::MAX;

/// Plain samples for one rank: per sample `id u32, len u64, crc32c u32, bytes`; a sample the
/// server could not read has `len = u64::MAX` and no bytes.
#[derive(Default)]
pub struct Bundle(pub Vec<u8>);

impl Bundle {
    pub fn push(&mut self, id: SampleId, bytes: io::Result<&[u8]>) {
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
pub struct Plain<'a> {
    pub id: SampleId,
    pub crc: u32,
    pub bytes: Option<&'a [u8]>,
}

/// The entries of a bundle; `Err` if it is cut short.
pub fn unbundle(mut b: &[u8]) -> Result<Vec<Plain<'_>>, PacketError> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let head = b.get(..16).ok_or(PacketError::Malformed)?;
        let id = u32::from_le_bytes(head[0..4].try_into().expect("4"));
        let len = u64::from_le_bytes(head[4..12].try_into().expect("8"));
        let crc = u32::from_le_bytes(head[12..16].try_into().expect("4"));
        b = &b[16..];
        if len == UNREADABLE {
            out.push(Plain {
                id,
                crc,
                bytes: None,
            });
            continue;
        }
        let len = usize::try_from(len).map_err(|_| PacketError::Malformed)?;
        let bytes = b.get(..len).ok_or(PacketError::Malformed)?;
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

    fn bytes(id: SampleId, len: usize) -> Vec<u8> {
        (0..len)
            .map(|o| crate::dataset::synthetic_byte(id, o as u64))
            .collect()
    }

    #[test]
    fn parts_of_different_sizes_decode_exactly() {
        let tx = Transmission {
            parts: vec![(1, 0), (2, 1), (3, 2)],
            group: vec![0, 1, 2],
        };
        let lens = [0usize, 10, 333, 57];
        let p = encode_packet(&tx, &mut |s| Ok(bytes(s, lens[s as usize]))).unwrap();
        for (me, want) in [(0usize, 1u32), (1, 2), (2, 3)] {
            let got = decode_packet(&p, me, &mut |s| Some(bytes(s, lens[s as usize]))).unwrap();
            assert_eq!(got, vec![(want, bytes(want, lens[want as usize]))]);
        }
        assert_eq!(decode_packet(&p, 5, &mut |_| None).unwrap(), vec![]);
        assert_eq!(
            decode_packet(&p, 0, &mut |s| (s != 3).then(|| bytes(s, lens[s as usize]))),
            Err(PacketError::NotCached { sample: 3 })
        );
        // A cached copy that differs is caught by the CRC, never stored.
        assert_eq!(
            decode_packet(&p, 0, &mut |s| Some(vec![7; lens[s as usize]])),
            Err(PacketError::Crc { sample: 1 })
        );
        assert_eq!(
            decode_packet(&p[..7], 0, &mut |_| None),
            Err(PacketError::Malformed)
        );
    }

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
