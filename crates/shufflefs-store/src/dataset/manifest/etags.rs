//! A bucket's ETags in the encoded manifest: a footer after everything else, present only
//! when there are ETags, so a folder's manifest (and the fingerprint of every cache made
//! before) is byte for byte what it was, and a bucket manifest saved before ETags were kept
//! still decodes (without them).
//!
//! Footer: the ETags (postcard), their encoded length (8 bytes, little-endian), then
//! [`MAGIC`]. It is found from the end, so the parts before it decode as they always did.
//!
//! In memory and in the footer an ETag of S3's usual shape (a quoted MD5 in lowercase hex:
//! every object not uploaded in parts) is its 16 bytes; any other shape (a multipart
//! upload's `"…-N"`, another store's form) is kept as text beside them. As text, 10^7 ETags
//! were 42 B an object (34 B of text and an 8-byte end), the largest per-sample part of a
//! bucket's manifest on every rank. A footer written as text ([`MAGIC_TEXT`], caches made
//! before) still decodes, into this form, and is encoded as text again: the manifest's
//! bytes, and so the fingerprint its cache's state names, stay what they were, and the
//! cache remounts as it did (it takes the smaller footer once it is listed anew:
//! `--rescan`, `--reset-cache`).

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::ManifestError;
use crate::dataset::footer;

/// A bucket's ETags, one per object in the manifest's order.
///
/// Where every ETag is of another shape (a store that does not give MD5s) this costs 24 B
/// an object more than text alone did (a zero digest and the index); S3, MinIO and Ceph
/// give MD5s for objects not uploaded in parts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Etags {
    /// Each object's ETag as the 16 bytes of its MD5 where it is a quoted lowercase hex
    /// MD5; zeros where it is not (then it is in `others`).
    digests: Vec<[u8; 16]>,
    /// The objects whose ETag has another shape, by index (increasing), as given.
    others: Others,
    /// Decoded from a text footer (a cache made before the digests): encoded as text again,
    /// so the manifest's bytes, and the fingerprint the cache's state names, stay the same.
    #[serde(skip)]
    as_text: bool,
}

/// ETags of other shapes in one arena (a `String` each would cost 24 bytes and an
/// allocation per object). The ends are 64-bit: ETags run 34-70 bytes, so 32-bit ends
/// wrapped past ~60-120M objects.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Others {
    /// The index of each object kept here, increasing.
    at: Vec<u64>,
    text: String,
    /// Where each one's text ends in `text`.
    end: Vec<u64>,
}

/// The 16 bytes of `etag` when it is `"` + 32 lowercase hex digits + `"`.
fn digest(etag: &str) -> Option<[u8; 16]> {
    let hex = etag.strip_prefix('"')?.strip_suffix('"')?.as_bytes();
    if hex.len() != 32 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; 16];
    for (o, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        *o = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

/// `digest` written back as the ETag it came from.
fn quoted_hex(digest: &[u8; 16]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(34);
    s.push('"');
    for b in digest {
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 15)] as char);
    }
    s.push('"');
    s
}

impl Etags {
    /// Room for `count` ETags, `other_text` bytes of them not of the usual shape.
    #[cfg_attr(not(feature = "s3"), allow(dead_code))] // used by the S3 listing
    pub fn with_capacity(other_text: usize, count: usize) -> Etags {
        Etags {
            digests: Vec::with_capacity(count),
            others: Others {
                text: String::with_capacity(other_text),
                ..Others::default()
            },
            as_text: false,
        }
    }

    #[cfg_attr(not(feature = "s3"), allow(dead_code))] // used by the S3 listing
    pub fn push(&mut self, etag: &str) {
        match digest(etag) {
            Some(d) => self.digests.push(d),
            None => {
                let o = &mut self.others;
                o.at.push(self.digests.len() as u64);
                o.text.push_str(etag);
                o.end.push(o.text.len() as u64);
                self.digests.push([0; 16]);
            }
        }
    }

    /// The ETag of object `i` as the store gave it.
    #[cfg_attr(not(feature = "s3"), allow(dead_code))] // used by the S3 listing
    pub fn get(&self, i: usize) -> Option<Cow<'_, str>> {
        let d = self.digests.get(i)?;
        let o = &self.others;
        match o.at.binary_search(&(i as u64)) {
            Ok(k) => {
                let start = match k {
                    0 => 0,
                    _ => o.end[k - 1] as usize,
                };
                o.text.get(start..o.end[k] as usize).map(Cow::Borrowed)
            }
            Err(_) => Some(Cow::Owned(quoted_hex(d))),
        }
    }

    /// Bytes of ETag text kept as text (room to ask for when copying them).
    #[cfg_attr(not(feature = "s3"), allow(dead_code))] // used by the S3 listing
    pub fn text_len(&self) -> usize {
        self.others.text.len()
    }

    pub fn len(&self) -> usize {
        self.digests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// Whether the other-shaped ones name objects in order, and their ends are in order
    /// and inside the text, at character boundaries.
    fn valid(&self) -> bool {
        let o = &self.others;
        let objects = o.at.windows(2).all(|w| w[0] < w[1])
            && o.at.last().is_none_or(|&i| i < self.digests.len() as u64)
            && o.at.len() == o.end.len();
        let mut at = 0;
        objects
            && o.end.iter().all(|&e| {
                let Ok(e) = usize::try_from(e) else {
                    return false;
                };
                let ok = e >= at && o.text.is_char_boundary(e);
                at = e;
                ok
            })
            && at <= o.text.len()
    }

    #[cfg_attr(not(feature = "s3"), allow(dead_code))] // used by the S3 listing
    pub fn shrink_to_fit(&mut self) {
        self.digests.shrink_to_fit();
        let o = &mut self.others;
        o.at.shrink_to_fit();
        o.text.shrink_to_fit();
        o.end.shrink_to_fit();
    }
}

/// Ends a manifest that carries ETags.
const MAGIC: &[u8; 8] = b"\xffSFETAG2";
/// Ended one whose ETags were all text ([`TextEtags`]): caches made before the digests.
const MAGIC_TEXT: &[u8; 8] = b"\xffSFETAG1";

/// The footer as it was written before: every ETag as text.
#[derive(Serialize, Deserialize)]
struct TextEtags {
    text: String,
    end: Vec<u64>,
}

impl TextEtags {
    fn into_etags(self) -> Option<Etags> {
        let mut out = Etags::with_capacity(0, self.end.len());
        let mut start = 0;
        for &end in &self.end {
            let end = usize::try_from(end).ok()?;
            out.push(self.text.get(start..end)?);
            start = end;
        }
        out.as_text = true;
        Some(out)
    }

    fn of(etags: &Etags) -> TextEtags {
        let (mut text, mut end) = (String::new(), Vec::with_capacity(etags.len()));
        for i in 0..etags.len() {
            text.push_str(&etags.get(i).unwrap_or_default());
            end.push(text.len() as u64);
        }
        TextEtags { text, end }
    }
}

/// `bytes` with the footer of `etags` appended (nothing when there are none): as text where
/// they were decoded from text (see `Etags::as_text`).
pub(super) fn encode(bytes: Vec<u8>, etags: &Etags) -> Vec<u8> {
    match (etags.is_empty(), etags.as_text) {
        (true, _) => bytes,
        (false, true) => footer::append(bytes, &TextEtags::of(etags), MAGIC_TEXT),
        (false, false) => footer::append(bytes, etags, MAGIC),
    }
}

/// The bytes before the footer and the ETags in it (none without a footer).
pub(super) fn decode(bytes: &[u8]) -> Result<(&[u8], Etags), ManifestError> {
    let bad = || ManifestError::Decode("the ETag footer is corrupt".into());
    let (rest, etags) = footer::split::<Etags>(bytes, MAGIC).map_err(|_| bad())?;
    let (rest, etags) = match etags {
        Some(etags) => (rest, etags),
        None => {
            let (rest, text) = footer::split::<TextEtags>(bytes, MAGIC_TEXT).map_err(|_| bad())?;
            let etags = text.map(TextEtags::into_etags);
            (
                rest,
                etags
                    .map(|e| e.ok_or_else(bad))
                    .transpose()?
                    .unwrap_or_default(),
            )
        }
    };
    if !etags.valid() {
        return Err(bad());
    }
    Ok((rest, etags))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MD5: &str = "\"d41d8cd98f00b204e9800998ecf8427e\"";

    #[test]
    fn no_etags_add_nothing_and_a_footer_round_trips() {
        assert_eq!(encode(b"abc".to_vec(), &Etags::default()), b"abc");
        let (rest, none) = decode(b"abc").unwrap();
        assert_eq!((rest, none.len()), (&b"abc"[..], 0));
        let mut etags = Etags::default();
        for e in ["\"e1\"", MD5, "\"e22\"", "", MD5] {
            etags.push(e);
        }
        let got: Vec<_> = (0..6).map(|i| etags.get(i)).collect();
        let want = ["\"e1\"", MD5, "\"e22\"", "", MD5].map(|e| Some(Cow::Borrowed(e)));
        assert_eq!(got[..5], want);
        assert_eq!(got[5], None);
        let bytes = encode(b"abc".to_vec(), &etags);
        let (rest, got) = decode(&bytes).unwrap();
        assert_eq!((rest, got), (&b"abc"[..], etags));
        let mut cut = bytes.clone();
        cut.remove(4);
        assert!(decode(&cut).is_err());
    }

    /// S3's usual ETags take 16 bytes each; other shapes (multipart, upper case, not hex,
    /// unquoted) are kept as given, never mistaken for a digest.
    #[test]
    fn md5_etags_are_sixteen_bytes_and_other_shapes_stay_text() {
        let mut etags = Etags::default();
        etags.push(MD5);
        assert_eq!(
            (etags.text_len(), etags.get(0)),
            (0, Some(Cow::Borrowed(MD5)))
        );
        let odd = [
            "\"d41d8cd98f00b204e9800998ecf8427e-12\"",
            "\"D41D8CD98F00B204E9800998ECF8427E\"",
            "\"z41d8cd98f00b204e9800998ecf8427e\"",
            "d41d8cd98f00b204e9800998ecf8427e",
            "\"d41d8cd98f00b204e9800998ecf8427\"",
        ];
        for e in odd {
            etags.push(e);
        }
        for (i, e) in odd.iter().enumerate() {
            assert_eq!(etags.get(i + 1).as_deref(), Some(*e));
        }
        assert_eq!(etags.text_len(), odd.iter().map(|e| e.len()).sum::<usize>());
        let encoded = postcard::to_allocvec(&etags).unwrap();
        assert!(
            encoded.len() < 6 * 16 + etags.text_len() + 32,
            "{}",
            encoded.len()
        );
    }

    /// A text footer (caches made before the digests, with 32- or 64-bit ends) decodes into
    /// the same ETags.
    #[test]
    fn a_text_footer_still_decodes() {
        #[derive(Serialize)]
        struct Old {
            text: String,
            end: Vec<u32>,
        }
        let old = Old {
            text: format!("\"a\"{MD5}\"bc\""),
            end: vec![3, 37, 41],
        };
        let mut bytes = postcard::to_allocvec(&old).unwrap();
        let len = bytes.len() as u64;
        bytes.extend_from_slice(&len.to_le_bytes());
        bytes.extend_from_slice(MAGIC_TEXT);
        let (rest, etags) = decode(&bytes).unwrap();
        assert!(rest.is_empty());
        assert_eq!(etags.text_len(), 7, "the digest left the text");
        let got: Vec<_> = (0..3).map(|i| etags.get(i).unwrap().into_owned()).collect();
        assert_eq!(got, ["\"a\"", MD5, "\"bc\""]);
        assert_eq!(
            encode(Vec::new(), &etags),
            bytes,
            "encoded again as it was saved"
        );
        let mut wrong = postcard::to_allocvec(&Old {
            text: "\"a\"".into(),
            end: vec![9],
        })
        .unwrap();
        let len = wrong.len() as u64;
        wrong.extend_from_slice(&len.to_le_bytes());
        wrong.extend_from_slice(MAGIC_TEXT);
        assert!(decode(&wrong).is_err(), "an end past the text");
    }

    /// Other-shaped ETags past 4 GiB of text keep their places: 32-bit ends wrapped.
    #[test]
    fn etags_past_four_gib_of_text_keep_their_places() {
        // NUL bytes are valid UTF-8, and a zeroed allocation takes no memory until written.
        let filler = String::from_utf8(vec![0u8; (1 << 32) + 8]).unwrap();
        let mut etags = Etags {
            digests: vec![[0; 16]],
            others: Others {
                at: vec![0],
                end: vec![filler.len() as u64],
                text: filler,
            },
            as_text: false,
        };
        etags.push("\"past\"");
        assert_eq!(etags.get(1).as_deref(), Some("\"past\""));
        assert!(etags.valid());
    }
}
