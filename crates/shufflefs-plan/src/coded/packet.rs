//! The bytes of one coded transmission: samples of different sizes XORed into one packet.
//!
//! The planning layer ([`plan`](super::plan)) says which samples a packet combines; this
//! module turns a [`Transmission`] into bytes on the server ([`encode`]) and back into the
//! receiver's sample on a compute node ([`decode`]), with every decoded sample checked
//! against the CRC-32C the server computed from the source bytes before it may enter a cache.
//!
//! # Framing (version 1, all integers little-endian)
//!
//! ```text
//! offset  size        field
//! 0       4           magic "SFXP"
//! 4       1           version (1)
//! 5       3           zero
//! 8       4           parts k (1..=64)
//! 12      4           CRC-32C of the header (bytes 0..24+24k with this field zeroed)
//! 16      8           payload length P
//! 24      24 * k      per part: sample u32, receiver u32, len u64, crc u32, flags u32
//! 24+24k  P           payload: XOR of the readable parts, each zero-padded to P
//! ```
//!
//! `P` is the longest readable part's length, so a single-part packet (an uncoded unicast)
//! carries its plain bytes and nothing else; the header is 48 bytes then. `flags` bit 0 marks
//! a part the server could not read (its `len` and `crc` are 0 and it is not in the payload):
//! its receiver gets [`DecodeError::Unavailable`] and falls back to asking for the plain sample
//! later, while every other receiver decodes as usual, because the XOR it undoes is only over
//! the parts that are there. The header has its own CRC so a corrupt length or sample id is
//! reported as [`PacketError::HeaderCrc`] rather than read as a different sample. A packet's
//! length follows from its first 24 bytes (`frame_len`), so packets can be concatenated in
//! one message and `split` apart.
//!
//! # Why pad to the longest part
//!
//! The paper's packets are "one sample long" because its samples are unit-sized. With real
//! samples of different sizes, a receiver must XOR out every other part of its packet, so the
//! payload has to cover the longest one: shorter parts are zero-padded, which XOR leaves
//! alone. The alternative, cutting samples into fixed chunks and coding chunk by chunk,
//! would make a packet's parts no longer whole samples: Alg. 1's index sets are per sample,
//! chunk `j` of one sample would need partners from other samples' chunks with the very same
//! index set, and a receiver could only check a sample once all its chunks arrived through
//! different packets. Padding keeps a packet = one row of the encoding table, as in the paper,
//! and keeps each sample decodable from exactly one packet.
//!
//! The cost: a packet of parts `l_1..l_k` sends `max l` payload bytes where an uncoded scheme
//! sends `l_r` to each receiver, so coding saves `sum l - max l` bytes instead of the ideal
//! `(k-1) * mean l`. With samples of similar size (image datasets, fixed-length records) the
//! loss is small; with a heavy tail (a few very large samples among small ones) a packet that
//! pairs a 10 MB sample with 10 KB ones saves almost nothing, and every receiver also receives
//! the 10 MB. `padding` reports `max l * k - sum l` per packet so the server can count it.
//! The header costs 24 + 24k bytes, negligible beyond a few KB per sample.
//!
//! Which samples share a packet is free within a set's table, so the server should plan with
//! [`plan_by_size`](super::plan_by_size), which puts the longest samples of each column in
//! the same packets (it provably minimises the payload bytes of each table, and keeps the
//! packets per group of [`plan`](super::plan)). Measured (`benches/coded_packet.rs`, sizes
//! log-normal around 100 KB, alpha = 2/n, UberShuffle): with a coefficient of variation of 0.5
//! (ImageNet-like) the server sends 0.51 of the uncoded bytes when samples are paired by id
//! and 0.41 when paired by size, against 0.41 with all sizes equal (n = 4); at n = 20, 0.56
//! and 0.50 against 0.45. With CV 2 pairing by id loses most of the gain (0.67-0.70), by size
//! much less (0.42-0.57).
//!
//! # Speed
//!
//! XOR runs over 64-byte blocks of eight `u64` words (`chunks_exact`), which the compiler turns
//! into vector instructions; only a tail of fewer than 64 bytes goes word by word, then byte
//! by byte. `benches/coded_packet.rs` measures encode and decode in MB/s.

use std::io;

use super::{MAX_NODES, Node, Transmission};
use crate::plan::SampleId;

const MAGIC: [u8; 4] = *b"SFXP";
/// The framing version this build writes and reads.
pub(crate) const VERSION: u8 = 1;
const FIXED: usize = 24;
const PART: usize = 24;
const UNREADABLE: u32 = 1;

/// One part of a packet as its header describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PartHeader {
    pub sample: SampleId,
    /// The node that decodes `sample` from this packet.
    pub receiver: Node,
    /// The plain sample's length in bytes (0 when not `readable`).
    pub len: u64,
    /// CRC-32C of the plain sample (0 when not `readable`).
    pub crc: u32,
    /// False when the server could not read the sample: it is not in the payload and its
    /// receiver must ask for it again.
    pub readable: bool,
}

/// A packet that cannot be built or parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PacketError {
    #[error("a coded packet needs at least one part")]
    Empty,
    #[error("{0} parts: a coded packet carries at most {MAX_NODES}, one per receiving node")]
    TooManyParts(usize),
    #[error("node {receiver} would receive two parts of one packet; each node decodes at most one")]
    DuplicateReceiver { receiver: Node },
    #[error("part for sample {sample} names receiver {receiver}; nodes are 0..{MAX_NODES}")]
    BadReceiver { sample: SampleId, receiver: u64 },
    #[error("packet of {len} bytes is shorter than its {need}-byte header")]
    Truncated { len: usize, need: usize },
    #[error("not a shufflefs coded packet (magic {0:02x?}, expected \"SFXP\")")]
    Magic([u8; 4]),
    #[error(
        "coded packet format version {0}; this build reads version {VERSION}: run the same shufflefs on every rank"
    )]
    Version(u8),
    #[error("coded packet header checksum mismatch: the packet was damaged in transit")]
    HeaderCrc,
    #[error("coded packet payload is {got} bytes but its header says {want}")]
    PayloadLen { got: usize, want: u64 },
    #[error("part for sample {sample} is {len} bytes, but the payload is {payload}")]
    PartLen {
        sample: SampleId,
        len: u64,
        payload: u64,
    },
}

/// Why a node could not decode its part; in every case but `Malformed` the caller asks the
/// server for the plain sample `wanted` instead, and nothing wrong enters the cache.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error(transparent)]
    Malformed(#[from] PacketError),
    #[error("cannot decode sample {wanted}: sample {sample} of the same packet is not cached here")]
    NotCached { sample: SampleId, wanted: SampleId },
    #[error(
        "cannot decode sample {wanted}: the cached copy of sample {sample} differs from the server's (length or CRC-32C); evict it"
    )]
    Stale { sample: SampleId, wanted: SampleId },
    #[error("sample {sample} decoded with a wrong CRC-32C: the packet was damaged")]
    Crc { sample: SampleId },
    #[error("the server could not read sample {sample} when it built the packet")]
    Unavailable { sample: SampleId },
}

impl DecodeError {
    /// The sample to ask the server for in plain, when one is known.
    #[cfg(test)]
    pub(crate) fn wanted(&self) -> Option<SampleId> {
        match *self {
            DecodeError::Malformed(_) => None,
            DecodeError::NotCached { wanted, .. } | DecodeError::Stale { wanted, .. } => {
                Some(wanted)
            }
            DecodeError::Crc { sample } | DecodeError::Unavailable { sample } => Some(sample),
        }
    }
}

/// `encode_report` without the read errors (they show as unreadable parts in `header`).
pub fn encode(
    tx: &Transmission,
    read: &mut dyn FnMut(SampleId) -> io::Result<Vec<u8>>,
) -> Result<Vec<u8>, PacketError> {
    encode_report(tx, read).map(|e| e.packet)
}

/// A built packet and the parts the server could not read (they are marked unreadable in it).
#[derive(Debug)]
pub(crate) struct Encoded {
    pub packet: Vec<u8>,
    /// Read by the tests; the server sends them as unreadable parts and moves on.
    #[cfg_attr(not(test), allow(dead_code))]
    pub unreadable: Vec<(SampleId, io::Error)>,
}

/// Builds `tx`'s packet, reading each part's plain bytes with `read`. A part whose read fails
/// is sent as unreadable (see the module docs) and returned with its error so the server can
/// log it; the packet still carries the other parts.
pub(crate) fn encode_report(
    tx: &Transmission,
    read: &mut dyn FnMut(SampleId) -> io::Result<Vec<u8>>,
) -> Result<Encoded, PacketError> {
    let k = tx.parts.len();
    if k == 0 {
        return Err(PacketError::Empty);
    }
    if k > MAX_NODES {
        return Err(PacketError::TooManyParts(k));
    }
    let mut seen = 0u64;
    for &(sample, receiver) in &tx.parts {
        if receiver >= MAX_NODES {
            return Err(PacketError::BadReceiver {
                sample,
                receiver: receiver as u64,
            });
        }
        if seen >> receiver & 1 == 1 {
            return Err(PacketError::DuplicateReceiver { receiver });
        }
        seen |= 1 << receiver;
    }
    let mut failed = Vec::new();
    let bodies: Vec<Option<Vec<u8>>> = tx
        .parts
        .iter()
        .map(|&(s, _)| match read(s) {
            Ok(bytes) => Some(bytes),
            Err(e) => {
                failed.push((s, e));
                None
            }
        })
        .collect();
    let payload = bodies.iter().flatten().map(Vec::len).max().unwrap_or(0);
    let head = FIXED + PART * k;
    let mut out = vec![0u8; head + payload];
    out[0..4].copy_from_slice(&MAGIC);
    out[4] = VERSION;
    out[8..12].copy_from_slice(&(k as u32).to_le_bytes());
    out[16..24].copy_from_slice(&(payload as u64).to_le_bytes());
    for (i, (&(sample, receiver), body)) in tx.parts.iter().zip(&bodies).enumerate() {
        let p = &mut out[FIXED + PART * i..FIXED + PART * (i + 1)];
        // A coded run holds under 2^32 samples (`plan::placement::RandomPlacement::new`).
        let sample = u32::try_from(sample).expect("a coded run's sample ids fit 32 bits");
        p[0..4].copy_from_slice(&sample.to_le_bytes());
        p[4..8].copy_from_slice(&(receiver as u32).to_le_bytes());
        match body {
            Some(b) => {
                p[8..16].copy_from_slice(&(b.len() as u64).to_le_bytes());
                p[16..20].copy_from_slice(&crc32c::crc32c(b).to_le_bytes());
            }
            None => p[20..24].copy_from_slice(&UNREADABLE.to_le_bytes()),
        }
    }
    let crc = crc32c::crc32c(&out[..head]);
    out[12..16].copy_from_slice(&crc.to_le_bytes());
    let body = &mut out[head..];
    let mut first = true;
    for b in bodies.iter().flatten() {
        if first {
            body[..b.len()].copy_from_slice(b);
            first = false;
        } else {
            xor_into(&mut body[..b.len()], b);
        }
    }
    Ok(Encoded {
        packet: out,
        unreadable: failed,
    })
}

/// What `packet` carries, checked (header CRC, lengths, distinct receivers), without touching
/// the payload: a node learns from it whether the packet has a part for it at all.
#[cfg(test)]
pub(crate) fn header(packet: &[u8]) -> Result<Vec<PartHeader>, PacketError> {
    parse(packet).map(|(parts, _)| parts)
}

/// Parses and checks the header; returns the parts and the payload.
fn parse(packet: &[u8]) -> Result<(Vec<PartHeader>, &[u8]), PacketError> {
    let (k, head) = check_fixed(packet)?;
    let want = u64_at(packet, 16);
    let payload = &packet[head..];
    if payload.len() as u64 != want {
        return Err(PacketError::PayloadLen {
            got: payload.len(),
            want,
        });
    }
    let (parts, longest) = part_headers(packet, k, want)?;
    if longest != want {
        return Err(PacketError::PayloadLen {
            got: payload.len(),
            want: longest,
        });
    }
    Ok((parts, payload))
}

/// Checks the fixed header (magic, version, part count) and the header's CRC; returns the
/// number of parts and where the payload starts.
fn check_fixed(packet: &[u8]) -> Result<(usize, usize), PacketError> {
    let truncated = |need| PacketError::Truncated {
        len: packet.len(),
        need,
    };
    if packet.len() < FIXED {
        return Err(truncated(FIXED));
    }
    let magic: [u8; 4] = packet[0..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(PacketError::Magic(magic));
    }
    if packet[4] != VERSION {
        return Err(PacketError::Version(packet[4]));
    }
    let k = u32_at(packet, 8) as usize;
    if k == 0 {
        return Err(PacketError::Empty);
    }
    if k > MAX_NODES {
        return Err(PacketError::TooManyParts(k));
    }
    let head = FIXED + PART * k;
    if packet.len() < head {
        return Err(truncated(head));
    }
    let mut zeroed = [0u8; FIXED];
    zeroed.copy_from_slice(&packet[..FIXED]);
    zeroed[12..16].fill(0);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&zeroed), &packet[FIXED..head]);
    if crc != u32_at(packet, 12) || packet[5..8] != [0, 0, 0] {
        return Err(PacketError::HeaderCrc);
    }
    Ok((k, head))
}

/// The `k` part entries of a header whose CRC matched, checked (receivers in range and
/// distinct, no part longer than the payload of `want` bytes); and the longest readable part.
fn part_headers(packet: &[u8], k: usize, want: u64) -> Result<(Vec<PartHeader>, u64), PacketError> {
    let mut seen = 0u64;
    let mut longest = 0;
    let mut parts = Vec::with_capacity(k);
    for i in 0..k {
        let at = FIXED + PART * i;
        let sample = u64::from(u32_at(packet, at));
        let receiver = u64::from(u32_at(packet, at + 4));
        let len = u64_at(packet, at + 8);
        let readable = u32_at(packet, at + 20) & UNREADABLE == 0;
        if receiver >= MAX_NODES as u64 {
            return Err(PacketError::BadReceiver { sample, receiver });
        }
        let receiver = receiver as Node;
        if seen >> receiver & 1 == 1 {
            return Err(PacketError::DuplicateReceiver { receiver });
        }
        seen |= 1 << receiver;
        if len > want {
            return Err(PacketError::PartLen {
                sample,
                len,
                payload: want,
            });
        }
        if readable {
            longest = longest.max(len);
        }
        parts.push(PartHeader {
            sample,
            receiver,
            len,
            crc: u32_at(packet, at + 16),
            readable,
        });
    }
    Ok((parts, longest))
}

/// Decodes the part addressed to `me` (at most one: receivers are distinct): the payload
/// XOR every other readable part, taken from `cached` and checked against its header entry
/// first, then truncated to the part's length and CRC-checked. A packet with nothing for `me`
/// gives an empty vector without calling `cached`.
pub fn decode(
    packet: &[u8],
    me: Node,
    cached: &mut dyn FnMut(SampleId) -> Option<Vec<u8>>,
) -> Result<Vec<(SampleId, Vec<u8>)>, DecodeError> {
    let (parts, payload) = parse(packet)?;
    let Some(mine) = parts.iter().find(|p| p.receiver == me) else {
        return Ok(Vec::new());
    };
    let wanted = mine.sample;
    if !mine.readable {
        return Err(DecodeError::Unavailable { sample: wanted });
    }
    let len = mine.len as usize;
    let mut out = payload[..len].to_vec();
    for other in parts.iter().filter(|p| p.receiver != me && p.readable) {
        let sample = other.sample;
        let bytes = cached(sample).ok_or(DecodeError::NotCached { sample, wanted })?;
        if bytes.len() as u64 != other.len || crc32c::crc32c(&bytes) != other.crc {
            return Err(DecodeError::Stale { sample, wanted });
        }
        let n = bytes.len().min(len);
        xor_into(&mut out[..n], &bytes[..n]);
    }
    if crc32c::crc32c(&out) != mine.crc {
        return Err(DecodeError::Crc { sample: wanted });
    }
    Ok(vec![(wanted, out)])
}

/// Payload bytes spent on zero padding: `max len * readable parts - sum len`. Zero for a
/// single-part packet and for parts of equal length.
#[cfg(test)]
pub(crate) fn padding(parts: &[PartHeader]) -> u64 {
    let readable = parts.iter().filter(|p| p.readable);
    let longest = readable.clone().map(|p| p.len).max().unwrap_or(0);
    readable.map(|p| longest - p.len).sum()
}

/// The length of the packet that starts `buf`, from its fixed fields alone (the rest is
/// checked by [`header`]), so several packets can travel concatenated in one message (the
/// paper's Section 4.3 concatenates the packets that share a communicator).
#[cfg(test)]
pub(crate) fn frame_len(buf: &[u8]) -> Result<usize, PacketError> {
    if buf.len() < FIXED {
        return Err(PacketError::Truncated {
            len: buf.len(),
            need: FIXED,
        });
    }
    let magic: [u8; 4] = buf[0..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(PacketError::Magic(magic));
    }
    let k = u32_at(buf, 8) as usize;
    if k > MAX_NODES {
        return Err(PacketError::TooManyParts(k));
    }
    let payload = u64_at(buf, 16);
    usize::try_from(payload)
        .ok()
        .and_then(|p| p.checked_add(FIXED + PART * k))
        .ok_or(PacketError::PayloadLen {
            got: buf.len(),
            want: payload,
        })
}

/// Splits a message of concatenated packets into the packets, each still to be checked by
/// [`header`] or [`decode`]; a message cut short is an error, never a shorter list.
#[cfg(test)]
pub(crate) fn split(mut buf: &[u8]) -> Result<Vec<&[u8]>, PacketError> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let len = frame_len(buf)?;
        if buf.len() < len {
            return Err(PacketError::Truncated {
                len: buf.len(),
                need: len,
            });
        }
        let (one, rest) = buf.split_at(len);
        out.push(one);
        buf = rest;
    }
    Ok(out)
}

/// Bytes of a packet whose readable parts have these lengths (header included), before
/// building it: what the server's link carries for one transmission.
pub fn packet_len(part_lens: &[u64]) -> u64 {
    (FIXED + PART * part_lens.len()) as u64 + part_lens.iter().copied().max().unwrap_or(0)
}

/// `dst ^= src`, equal lengths, over 64-byte blocks of `u64` words.
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "xor_into needs equal lengths");
    const BLOCK: usize = 64;
    let mut d = dst.chunks_exact_mut(BLOCK);
    let mut s = src.chunks_exact(BLOCK);
    for (db, sb) in (&mut d).zip(&mut s) {
        for (dw, sw) in db.chunks_exact_mut(8).zip(sb.chunks_exact(8)) {
            let x = u64::from_ne_bytes((&*dw).try_into().expect("8 bytes"))
                ^ u64::from_ne_bytes(sw.try_into().expect("8 bytes"));
            dw.copy_from_slice(&x.to_ne_bytes());
        }
    }
    let (dt, st) = (d.into_remainder(), s.remainder());
    let mut dw = dt.chunks_exact_mut(8);
    let mut sw = st.chunks_exact(8);
    for (a, b) in (&mut dw).zip(&mut sw) {
        let x = u64::from_ne_bytes((&*a).try_into().expect("8 bytes"))
            ^ u64::from_ne_bytes(b.try_into().expect("8 bytes"));
        a.copy_from_slice(&x.to_ne_bytes());
    }
    for (a, b) in dw.into_remainder().iter_mut().zip(sw.remainder()) {
        *a ^= b;
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests;
