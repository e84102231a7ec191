//! Sample names borrowed from a mapped encoding, so that the ranks of one host hold one copy.
//!
//! The names are most of a folder manifest (20 of its ~24 bytes per sample at 10^6 files)
//! and every rank needs them all: a rank serves any sample it is handed. Decoded per rank
//! they cost the whole dataset's names on every rank, eight copies on an 8-GPU node. The
//! encoding already holds them back to back (postcard writes a byte array as its length
//! and its bytes), so a manifest decoded from a mapping of its encoding
//! ([`Manifest::decode_mapped`](super::Manifest::decode_mapped)) points into the mapping
//! instead of copying them, and ranks mapping one file (one host's `memfd`, see
//! `daemon::startup::shared`) share its pages: the names count once per host.
//!
//! The decoder hands a visitor the borrowed slice without saying where it came from, so
//! `decode_mapped` names the mapping in a thread-local for the length of the decode, and a
//! slice found inside it becomes an offset into it. Anything else (a decode from a plain
//! buffer) copies, as before.

use std::cell::RefCell;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use memmap2::Mmap;
use serde::de::Visitor;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The names of a manifest's samples, back to back: owned, or a range of a mapping.
#[derive(Clone)]
pub(crate) enum Names {
    Owned(Vec<u8>),
    Mapped {
        map: Arc<Mmap>,
        start: usize,
        len: usize,
    },
}

impl Default for Names {
    fn default() -> Names {
        Names::Owned(Vec::new())
    }
}

impl Names {
    /// The owned bytes, copied out of the mapping first if they were mapped (only a manifest
    /// being built grows its names).
    pub(crate) fn to_mut(&mut self) -> &mut Vec<u8> {
        if let Names::Mapped { .. } = self {
            *self = Names::Owned(self.to_vec());
        }
        match self {
            Names::Owned(v) => v,
            Names::Mapped { .. } => unreachable!("made owned above"),
        }
    }

    /// Whether the names lie in a mapping.
    pub(crate) fn is_mapped(&self) -> bool {
        matches!(self, Names::Mapped { .. })
    }
}

impl Deref for Names {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Names::Owned(v) => v,
            Names::Mapped { map, start, len } => &map[*start..*start + *len],
        }
    }
}

impl PartialEq for Names {
    fn eq(&self, other: &Names) -> bool {
        **self == **other
    }
}

impl fmt::Debug for Names {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let how = if self.is_mapped() { "mapped" } else { "owned" };
        write!(f, "Names({} bytes, {how})", self.len())
    }
}

/// As bytes: the encoding a `Vec<u8>` of names always had (a length, then the bytes).
impl Serialize for Names {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self)
    }
}

thread_local! {
    /// The mapping `decode_mapped` is decoding from, on this thread, while it does.
    static DECODING: RefCell<Option<Arc<Mmap>>> = const { RefCell::new(None) };
}

/// Runs `decode` with names borrowed from `map` where the decoder lends slices of it.
pub(super) fn decoding_from<T>(map: &Arc<Mmap>, decode: impl FnOnce(&[u8]) -> T) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            DECODING.with(|d| d.borrow_mut().take());
        }
    }
    DECODING.with(|d| *d.borrow_mut() = Some(map.clone()));
    let _reset = Reset;
    decode(&map[..])
}

/// `bytes` as a range of the mapping being decoded from, if they lie in it.
fn within_mapping(bytes: &[u8]) -> Option<Names> {
    DECODING.with(|d| {
        let d = d.borrow();
        let map = d.as_ref()?;
        let base = map.as_ptr() as usize;
        let at = bytes.as_ptr() as usize;
        let inside = at >= base && at + bytes.len() <= base + map.len();
        inside.then(|| Names::Mapped {
            map: map.clone(),
            start: at - base,
            len: bytes.len(),
        })
    })
}

impl<'de> Deserialize<'de> for Names {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Names, D::Error> {
        struct Bytes;
        impl<'de> Visitor<'de> for Bytes {
            type Value = Names;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("sample names as bytes")
            }
            fn visit_borrowed_bytes<E>(self, v: &'de [u8]) -> Result<Names, E> {
                Ok(within_mapping(v).unwrap_or_else(|| Names::Owned(v.to_vec())))
            }
            fn visit_bytes<E>(self, v: &[u8]) -> Result<Names, E> {
                Ok(Names::Owned(v.to_vec()))
            }
            fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Names, E> {
                Ok(Names::Owned(v))
            }
        }
        d.deserialize_bytes(Bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapped(bytes: &[u8]) -> Arc<Mmap> {
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, bytes).unwrap();
        // SAFETY: a private temporary file nobody else writes.
        Arc::new(unsafe { Mmap::map(&f) }.unwrap())
    }

    #[test]
    fn names_in_the_mapping_are_borrowed_and_others_copied() {
        let names = Names::Owned(b"a.pngb.png".to_vec());
        let bytes = postcard::to_allocvec(&names).unwrap();
        assert_eq!(
            bytes,
            postcard::to_allocvec(&b"a.pngb.png".to_vec()).unwrap()
        );
        let map = mapped(&bytes);
        let got: Names = decoding_from(&map, |b| postcard::from_bytes(b).unwrap());
        assert!(got.is_mapped(), "{got:?}");
        assert_eq!(got, names);
        // Outside a mapped decode, or from another buffer: a copy.
        let plain: Names = postcard::from_bytes(&bytes).unwrap();
        assert!(!plain.is_mapped());
        let other: Names = decoding_from(&map, |_| postcard::from_bytes(&bytes).unwrap());
        assert!(!other.is_mapped());
        let mut grown = got.clone();
        grown.to_mut().extend_from_slice(b"c");
        assert_eq!(&*grown, b"a.pngb.pngc");
        assert_eq!(&*got, b"a.pngb.png");
    }
}
