//! A bucket's ETags in the encoded manifest: a footer after everything else, present only
//! when there are ETags, so a folder's manifest (and the fingerprint of every cache made
//! before) is byte for byte what it was, and a bucket manifest saved before ETags were kept
//! still decodes (without them).
//!
//! Footer: the ETags (postcard), their encoded length (8 bytes, little-endian), then
//! [`MAGIC`]. It is found from the end, so the parts before it decode as they always did.

use serde::{Deserialize, Serialize};

use super::ManifestError;
use crate::dataset::footer;

/// ETags in one arena (a `String` each would cost 24 bytes and an allocation per object).
///
/// The ends are 64-bit: ETags run 34-70 bytes, so 32-bit ends wrapped past ~60-120M objects
/// and every rank but the scanning one rejected the manifest as corrupt. Postcard writes
/// both as the same varint, so manifests saved with 32-bit ends decode unchanged.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Etags {
    text: String,
    /// Where each ETag ends in `text`.
    end: Vec<u64>,
}

impl Etags {
    /// Room for `count` ETags of `text` bytes in all.
    #[cfg_attr(not(feature = "s3"), allow(dead_code))] // used by the S3 listing
    pub fn with_capacity(text: usize, count: usize) -> Etags {
        Etags {
            text: String::with_capacity(text),
            end: Vec::with_capacity(count),
        }
    }

    #[cfg_attr(not(feature = "s3"), allow(dead_code))] // used by the S3 listing
    pub fn push(&mut self, etag: &str) {
        self.text.push_str(etag);
        self.end.push(self.text.len() as u64);
    }

    #[cfg_attr(not(feature = "s3"), allow(dead_code))] // used by the S3 listing
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.end.get(i)? as usize;
        let start = match i {
            0 => 0,
            _ => self.end[i - 1] as usize,
        };
        self.text.get(start..end)
    }

    /// Bytes of ETag text in all (room to ask for when copying them).
    #[cfg_attr(not(feature = "s3"), allow(dead_code))] // used by the S3 listing
    pub fn text_len(&self) -> usize {
        self.text.len()
    }

    pub fn len(&self) -> usize {
        self.end.len()
    }

    pub fn is_empty(&self) -> bool {
        self.end.is_empty()
    }

    /// Whether the ends are in order and inside the text, at character boundaries.
    fn valid(&self) -> bool {
        let mut at = 0;
        self.end.iter().all(|&e| {
            let Ok(e) = usize::try_from(e) else {
                return false;
            };
            let ok = e >= at && self.text.is_char_boundary(e);
            at = e;
            ok
        }) && at <= self.text.len()
    }

    #[cfg_attr(not(feature = "s3"), allow(dead_code))] // used by the S3 listing
    pub fn shrink_to_fit(&mut self) {
        self.text.shrink_to_fit();
        self.end.shrink_to_fit();
    }
}

/// Ends a manifest that carries ETags.
const MAGIC: &[u8; 8] = b"\xffSFETAG1";

/// `bytes` with the footer of `etags` appended (nothing when there are none).
pub(super) fn encode(bytes: Vec<u8>, etags: &Etags) -> Vec<u8> {
    match etags.is_empty() {
        true => bytes,
        false => footer::append(bytes, etags, MAGIC),
    }
}

/// The bytes before the footer and the ETags in it (none without a footer).
pub(super) fn decode(bytes: &[u8]) -> Result<(&[u8], Etags), ManifestError> {
    let bad = || ManifestError::Decode("the ETag footer is corrupt".into());
    let (rest, etags) = footer::split::<Etags>(bytes, MAGIC).map_err(|_| bad())?;
    let etags = etags.unwrap_or_default();
    if !etags.valid() {
        return Err(bad());
    }
    Ok((rest, etags))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_etags_add_nothing_and_a_footer_round_trips() {
        assert_eq!(encode(b"abc".to_vec(), &Etags::default()), b"abc");
        let (rest, none) = decode(b"abc").unwrap();
        assert_eq!((rest, none.len()), (&b"abc"[..], 0));
        let mut etags = Etags::default();
        etags.push("\"e1\"");
        etags.push("\"e22\"");
        assert_eq!(
            (etags.get(0), etags.get(1), etags.get(2)),
            (Some("\"e1\""), Some("\"e22\""), None)
        );
        let bytes = encode(b"abc".to_vec(), &etags);
        let (rest, got) = decode(&bytes).unwrap();
        assert_eq!((rest, got), (&b"abc"[..], etags));
        let mut cut = bytes.clone();
        cut.remove(4);
        assert!(decode(&cut).is_err());
    }

    /// A footer written when the ends were `u32` decodes as it did.
    #[test]
    fn a_footer_with_32_bit_ends_still_decodes() {
        #[derive(Serialize)]
        struct Old {
            text: String,
            end: Vec<u32>,
        }
        let old = Old {
            text: "\"a\"\"bc\"".into(),
            end: vec![3, 7],
        };
        let mut bytes = postcard::to_allocvec(&old).unwrap();
        let len = bytes.len() as u64;
        bytes.extend_from_slice(&len.to_le_bytes());
        bytes.extend_from_slice(MAGIC);
        let (rest, etags) = decode(&bytes).unwrap();
        assert!(rest.is_empty());
        assert_eq!(
            (etags.get(0), etags.get(1)),
            (Some("\"a\""), Some("\"bc\""))
        );
    }

    /// ETags past 4 GiB of text (~60-120M objects) keep their places: 32-bit ends wrapped.
    #[test]
    fn etags_past_four_gib_of_text_keep_their_places() {
        // NUL bytes are valid UTF-8, and a zeroed allocation takes no memory until written.
        let filler = String::from_utf8(vec![0u8; (1 << 32) + 8]).unwrap();
        let mut etags = Etags {
            end: vec![filler.len() as u64],
            text: filler,
        };
        etags.push("\"past\"");
        assert_eq!(etags.get(1), Some("\"past\""));
        assert!(etags.valid());
    }
}
