//! Trailers of an encoded manifest: a value (postcard), its encoded length (8 bytes,
//! little-endian), then an 8-byte magic naming its kind. Found from the end, so the bytes
//! before one decode as they always did: a manifest written before a kind of trailer existed
//! decodes unchanged, and each kind (ETags, owners) is there only when it has something to
//! say.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// `bytes` with `value`'s trailer appended.
pub(crate) fn append<T: Serialize>(mut bytes: Vec<u8>, value: &T, magic: &[u8; 8]) -> Vec<u8> {
    let start = bytes.len();
    // Exactly the room it needs: growing by doubling would hold up to twice a large
    // manifest's encoding (10^7 ETags are ~400 MB).
    let size = postcard::experimental::serialized_size(value).unwrap_or(0);
    bytes.reserve_exact(size + 16);
    bytes = postcard::to_extend(value, bytes).expect("serializing into a Vec cannot fail");
    let len = (bytes.len() - start) as u64;
    bytes.extend_from_slice(&len.to_le_bytes());
    bytes.extend_from_slice(magic);
    bytes
}

/// A corrupt trailer: its length or its value does not decode.
#[derive(Debug)]
pub(crate) struct Corrupt;

/// The bytes before the trailer ending in `magic`, and its value (`None` without one).
pub(crate) fn split<'a, T: DeserializeOwned>(
    bytes: &'a [u8],
    magic: &[u8; 8],
) -> Result<(&'a [u8], Option<T>), Corrupt> {
    let Some(rest) = bytes.strip_suffix(magic.as_slice()) else {
        return Ok((bytes, None));
    };
    let split = rest.len().checked_sub(8).ok_or(Corrupt)?;
    let len = u64::from_le_bytes(rest[split..].try_into().expect("8 bytes"));
    let at = usize::try_from(len)
        .ok()
        .and_then(|len| split.checked_sub(len))
        .ok_or(Corrupt)?;
    let value = postcard::from_bytes(&rest[at..split]).map_err(|_| Corrupt)?;
    Ok((&rest[..at], Some(value)))
}
