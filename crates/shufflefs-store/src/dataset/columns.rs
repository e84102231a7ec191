//! Per-sample columns of an index borrowed from a mapped encoding, so that the ranks of one
//! host hold one copy.
//!
//! The large parts of an index are per sample: a folder manifest's names (20 of its ~24
//! bytes per sample at 10^6 files), a record index's offsets and lengths (12 bytes per
//! record). Every rank needs them all (a rank serves any sample it is handed), so decoded
//! per rank they cost the whole dataset on every rank, eight copies on an 8-GPU node. Their
//! encoding holds each column back to back as one byte array (postcard writes a byte array
//! as its length and its bytes; a [`Words`] column is its values' little-endian bytes), so a
//! manifest decoded from a mapping of its encoding (`Manifest::decode_mapped`) points into
//! the mapping instead of copying them, and ranks mapping one file (one host's `memfd`, see
//! `daemon::startup::shared`) share its pages: the columns count once per host.
//!
//! The decoder hands a visitor the borrowed slice without saying where it came from, so
//! [`decoding_from`] names the mapping in a thread-local for the length of the decode, and
//! a slice found inside it becomes an offset into it. Anything else (a decode from a plain
//! buffer) copies.
//!
//! A leaf module: the manifest and the record index both use it.

use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::Arc;

use memmap2::Mmap;
use serde::de::{Error, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Bytes of a column: owned, or a range of a mapping.
#[derive(Clone)]
pub(crate) enum Bytes {
    Owned(Vec<u8>),
    Mapped {
        map: Arc<Mmap>,
        start: usize,
        len: usize,
    },
}

impl Bytes {
    /// The owned bytes, copied out of the mapping first if they were mapped (only an index
    /// being built grows a column).
    pub(crate) fn to_mut(&mut self) -> &mut Vec<u8> {
        if let Bytes::Mapped { .. } = self {
            *self = Bytes::Owned(self.to_vec());
        }
        match self {
            Bytes::Owned(v) => v,
            Bytes::Mapped { .. } => unreachable!("made owned above"),
        }
    }

    /// Whether the bytes lie in a mapping.
    pub(crate) fn is_mapped(&self) -> bool {
        matches!(self, Bytes::Mapped { .. })
    }
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Owned(v) => v,
            Bytes::Mapped { map, start, len } => &map[*start..*start + *len],
        }
    }
}

impl PartialEq for Bytes {
    fn eq(&self, other: &Bytes) -> bool {
        **self == **other
    }
}

impl Eq for Bytes {}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let how = if self.is_mapped() { "mapped" } else { "owned" };
        write!(f, "Bytes({} bytes, {how})", self.len())
    }
}

/// As a byte array: what a `Vec<u8>` of names always was (a length, then the bytes).
impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self)
    }
}

thread_local! {
    /// The mapping `decoding_from` is decoding from, on this thread, while it does, and
    /// whether its columns were checked elsewhere.
    static DECODING: RefCell<Option<(Arc<Mmap>, bool)>> = const { RefCell::new(None) };
}

/// Runs `decode` over `map` with columns borrowed from it where the decoder lends slices of
/// it. `checked`: another decode of these very bytes (the host's first rank's, of the file
/// it wrote) already checked every value, so the per-value checks of borrowed columns may be
/// skipped ([`checked_elsewhere`]): they would touch every page of the mapping, which then
/// counts in this process's resident memory though only its share's pages are ever read.
pub(crate) fn decoding_from<T>(
    map: &Arc<Mmap>,
    checked: bool,
    decode: impl FnOnce(&[u8]) -> T,
) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            DECODING.with(|d| d.borrow_mut().take());
        }
    }
    DECODING.with(|d| *d.borrow_mut() = Some((map.clone(), checked)));
    let _reset = Reset;
    decode(&map[..])
}

/// Whether a column borrowed from the mapping being decoded from may skip its per-value
/// checks (see [`decoding_from`]); false outside such a decode.
pub(crate) fn checked_elsewhere(column: &Bytes) -> bool {
    column.is_mapped() && DECODING.with(|d| d.borrow().as_ref().is_some_and(|(_, c)| *c))
}

/// `bytes` as a range of the mapping being decoded from, if they lie in it.
fn within_mapping(bytes: &[u8]) -> Option<Bytes> {
    DECODING.with(|d| {
        let d = d.borrow();
        let (map, _) = d.as_ref()?;
        let base = map.as_ptr() as usize;
        let at = bytes.as_ptr() as usize;
        let inside = at >= base && at + bytes.len() <= base + map.len();
        inside.then(|| Bytes::Mapped {
            map: map.clone(),
            start: at - base,
            len: bytes.len(),
        })
    })
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        struct Array;
        impl<'de> Visitor<'de> for Array {
            type Value = Bytes;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a byte array")
            }
            fn visit_borrowed_bytes<E>(self, v: &'de [u8]) -> Result<Bytes, E> {
                Ok(within_mapping(v).unwrap_or_else(|| Bytes::Owned(v.to_vec())))
            }
            fn visit_bytes<E>(self, v: &[u8]) -> Result<Bytes, E> {
                Ok(Bytes::Owned(v.to_vec()))
            }
            fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Bytes, E> {
                Ok(Bytes::Owned(v))
            }
        }
        d.deserialize_bytes(Array)
    }
}

/// A fixed-width value a [`Words`] column holds.
pub trait Word: Copy {
    const WIDTH: usize;
    fn read(le: &[u8]) -> Self;
    fn write(self, out: &mut Vec<u8>);
}

impl Word for u32 {
    const WIDTH: usize = 4;
    fn read(le: &[u8]) -> u32 {
        u32::from_le_bytes(le.try_into().expect("4 bytes"))
    }
    fn write(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

impl Word for u64 {
    const WIDTH: usize = 8;
    fn read(le: &[u8]) -> u64 {
        u64::from_le_bytes(le.try_into().expect("8 bytes"))
    }
    fn write(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

/// Fixed-width values, kept (and encoded) as their little-endian bytes so that a decode
/// from a mapping borrows them; read one at a time (no alignment asked of the mapping).
#[derive(Clone, PartialEq, Eq)]
pub struct Words<T> {
    bytes: Bytes,
    word: PhantomData<T>,
}

impl<T: Word> Words<T> {
    pub(crate) const fn new() -> Words<T> {
        Words {
            bytes: Bytes::Owned(Vec::new()),
            word: PhantomData,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes.len() / T::WIDTH
    }

    /// Value `i`, if there is one.
    pub(crate) fn get(&self, i: usize) -> Option<T> {
        let at = i.checked_mul(T::WIDTH)?;
        self.bytes.get(at..at + T::WIDTH).map(T::read)
    }

    /// Value `i`; panics past the end, as indexing a slice does.
    pub(crate) fn at(&self, i: usize) -> T {
        match self.get(i) {
            Some(v) => v,
            None => panic!("value {i} of a column of {}", self.len()),
        }
    }

    pub(crate) fn push(&mut self, v: T) {
        v.write(self.bytes.to_mut());
    }

    /// Room for `n` more words.
    #[cfg_attr(not(feature = "s3"), allow(dead_code))] // used by the S3 listing
    pub(crate) fn reserve_exact(&mut self, n: usize) {
        self.bytes.to_mut().reserve_exact(n * T::WIDTH);
    }

    pub(crate) fn first(&self) -> Option<T> {
        self.get(0)
    }

    pub(crate) fn last(&self) -> Option<T> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = T> + '_ {
        self.bytes.chunks_exact(T::WIDTH).map(T::read)
    }

    /// Bytes of memory it holds of its own (none when mapped).
    pub(crate) fn owned_bytes(&self) -> usize {
        match &self.bytes {
            Bytes::Owned(v) => v.capacity(),
            Bytes::Mapped { .. } => 0,
        }
    }

    pub(crate) fn shrink_to_fit(&mut self) {
        if let Bytes::Owned(v) = &mut self.bytes {
            v.shrink_to_fit();
        }
    }

    #[cfg(any(test, feature = "testing"))]
    pub fn is_mapped(&self) -> bool {
        self.bytes.is_mapped()
    }

    /// See [`checked_elsewhere`].
    pub(crate) fn checked_elsewhere(&self) -> bool {
        checked_elsewhere(&self.bytes)
    }
}

impl<T: Word> FromIterator<T> for Words<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Words<T> {
        let mut w = Words::new();
        for v in iter {
            w.push(v);
        }
        w
    }
}

impl<T: Word + fmt::Debug> fmt::Debug for Words<T> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let how = if self.bytes.is_mapped() {
            "mapped"
        } else {
            "owned"
        };
        write!(f, "Words({} values, {how})", self.len())
    }
}

impl<T> Serialize for Words<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.bytes.serialize(s)
    }
}

impl<'de, T: Word> Deserialize<'de> for Words<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Words<T>, D::Error> {
        let bytes = Bytes::deserialize(d)?;
        if bytes.len() % T::WIDTH != 0 {
            return Err(D::Error::custom("a column's length is not whole values"));
        }
        Ok(Words {
            bytes,
            word: PhantomData,
        })
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
    fn bytes_in_the_mapping_are_borrowed_and_others_copied() {
        let names = Bytes::Owned(b"a.pngb.png".to_vec());
        let bytes = postcard::to_allocvec(&names).unwrap();
        assert_eq!(
            bytes,
            postcard::to_allocvec(&b"a.pngb.png".to_vec()).unwrap()
        );
        let map = mapped(&bytes);
        let got: Bytes = decoding_from(&map, false, |b| postcard::from_bytes(b).unwrap());
        assert!(got.is_mapped(), "{got:?}");
        assert_eq!(got, names);
        // Outside a mapped decode, or from another buffer: a copy.
        let plain: Bytes = postcard::from_bytes(&bytes).unwrap();
        assert!(!plain.is_mapped());
        let other: Bytes = decoding_from(&map, false, |_| postcard::from_bytes(&bytes).unwrap());
        assert!(!other.is_mapped());
        let mut grown = got.clone();
        grown.to_mut().extend_from_slice(b"c");
        assert_eq!(&*grown, b"a.pngb.pngc");
        assert_eq!(&*got, b"a.pngb.png");
    }

    #[test]
    fn words_read_back_from_an_odd_offset_of_a_mapping() {
        let values: Words<u64> = [0, 7, u64::MAX, 1 << 40].into_iter().collect();
        // A leading byte puts the column at an odd offset.
        let bytes = postcard::to_allocvec(&(1u8, &values)).unwrap();
        let map = mapped(&bytes);
        let (_, got): (u8, Words<u64>) =
            decoding_from(&map, false, |b| postcard::from_bytes(b).unwrap());
        assert!(got.is_mapped());
        assert_eq!(got, values);
        assert_eq!(got.iter().collect::<Vec<_>>(), [0, 7, u64::MAX, 1 << 40]);
        assert_eq!((got.len(), got.at(2), got.get(4)), (4, u64::MAX, None));
        assert_eq!((got.first(), got.last()), (Some(0), Some(1 << 40)));
        let torn = postcard::to_allocvec(&Bytes::Owned(vec![1, 2, 3])).unwrap();
        assert!(postcard::from_bytes::<Words<u32>>(&torn).is_err());
    }
}
