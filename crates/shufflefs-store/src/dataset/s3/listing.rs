//! `ListObjectsV2` by hand: pages of up to 1,000 keys, each handed to the caller as it
//! arrives (one page in memory at a time), keys as the exact bytes the store holds.
//!
//! Keys are asked for with `encoding-type=url`: XML 1.0 cannot carry most control
//! characters, so a key with a tab or a NUL would otherwise make the page unreadable; with
//! it the store percent-encodes each key (spaces as `+` on AWS) and we decode them. A store
//! that ignores the parameter (it does not echo `EncodingType`) sends keys as they are.
//! Which keys can be files is the caller's business ([`keys`](super::keys)): this module
//! refuses no key.

use std::ops::ControlFlow;

use serde::Deserialize;

use super::client::Client;
use super::error::StoreError;

/// One listed object.
#[derive(Debug)]
pub(crate) struct Object {
    pub key: String,
    pub size: u64,
    pub etag: Option<String>,
    /// The key was UTF-8 (S3 keys are; a store that is not S3 may send other bytes, and
    /// such a key, shown with U+FFFD, could not be asked for again).
    pub utf8: bool,
}

/// A page of a `ListObjectsV2` answer: what we read of it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Page {
    #[serde(default)]
    contents: Vec<Content>,
    #[serde(default)]
    is_truncated: bool,
    next_continuation_token: Option<String>,
    encoding_type: Option<String>,
    /// The folders (`PREFIX/NAME/`) a listing with a delimiter rolls keys up into.
    #[serde(default)]
    common_prefixes: Vec<CommonPrefix>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CommonPrefix {
    prefix: String,
}

/// What one listing asks for beyond the client's prefix.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Ask<'a> {
    /// Only the first page, of at most this many keys.
    pub max_keys: Option<usize>,
    /// Keys after this one only (S3 lists in UTF-8 byte order).
    pub start_after: Option<&'a str>,
    /// Roll keys deeper than the prefix's own level up into their folders
    /// ([`Listed::Folder`]), as `delimiter=/` does.
    pub folders: bool,
}

/// One item of a listing: an object, or (asked for with [`Ask::folders`]) a folder's key
/// prefix, ending in '/', and whether it was UTF-8 (as [`Object::utf8`]).
#[derive(Debug)]
pub(crate) enum Listed {
    Object(Object),
    Folder(String, bool),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Content {
    key: String,
    size: u64,
    #[serde(rename = "ETag")]
    e_tag: Option<String>,
}

/// Lists every object under `client`'s prefix (`PREFIX/`, or the whole bucket), calling
/// `each` for each in the store's order; with `max_keys`, only the first page of at most
/// that many. Returns the number of pages.
pub(crate) fn list(
    client: &Client,
    max_keys: Option<usize>,
    each: &mut dyn FnMut(Object),
) -> Result<usize, StoreError> {
    let ask = Ask {
        max_keys,
        ..Ask::default()
    };
    let done = list_with(client, ask, &mut |item| {
        if let Listed::Object(o) = item {
            each(o);
        }
        ControlFlow::Continue(())
    })?;
    Ok(done.pages)
}

/// How a listing ended: its pages, and whether the store had more after the last one
/// (a listing of one page, [`Ask::max_keys`], that was cut short).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pages {
    pub pages: usize,
    pub more: bool,
}

/// Lists under `client`'s prefix as `ask` says, calling `each` for each item in the
/// store's order (a page's objects, then its folders) until it says stop; the next page
/// is asked for only while `each` goes on.
pub(crate) fn list_with(
    client: &Client,
    ask: Ask,
    each: &mut dyn FnMut(Listed) -> ControlFlow<()>,
) -> Result<Pages, StoreError> {
    let prefix = match client.url.prefix.is_empty() {
        true => String::new(),
        false => format!("{}/", client.url.prefix),
    };
    let max = ask.max_keys.map(|m| m.to_string());
    let mut token: Option<String> = None;
    let mut seen = std::collections::HashSet::new();
    let mut pages = 0;
    loop {
        let mut query = vec![("encoding-type", "url"), ("list-type", "2")];
        if let Some(token) = &token {
            query.insert(0, ("continuation-token", token.as_str()));
        }
        if ask.folders {
            query.insert(query.len() - 2, ("delimiter", "/"));
        }
        if let Some(max) = &max {
            query.push(("max-keys", max.as_str()));
        }
        if !prefix.is_empty() {
            query.push(("prefix", prefix.as_str()));
        }
        if let Some(after) = ask.start_after.filter(|_| token.is_none()) {
            query.push(("start-after", after));
        }
        let url = client.signed.bucket_url(&query);
        let (_, body) = client.run(client.signed.get_bytes(&url, &[], None, |_| Ok(())))?;
        let page = parse(&body)?;
        pages += 1;
        let encoded = page.encoding_type.as_deref() == Some("url");
        let key = |k: String| match encoded {
            true => decode(&k),
            false => (k, true),
        };
        let objects = page.contents.into_iter().map(|c| {
            let (key, utf8) = key(c.key);
            Listed::Object(Object {
                key,
                size: c.size,
                etag: c.e_tag,
                utf8,
            })
        });
        let folders = (page.common_prefixes.into_iter()).map(|p| {
            let (prefix, utf8) = key(p.prefix);
            Listed::Folder(prefix, utf8)
        });
        for item in objects.chain(folders) {
            if each(item).is_break() {
                let more = true;
                return Ok(Pages { pages, more });
            }
        }
        if !page.is_truncated || ask.max_keys.is_some() {
            let more = page.is_truncated;
            return Ok(Pages { pages, more });
        }
        let next = next_token(page.next_continuation_token, &mut seen, &client.url.bucket)?;
        token = Some(next);
    }
}

/// The token of the page after a truncated one, unless it is missing, empty or one given
/// before (a store that would otherwise be listed forever, or its keys twice).
fn next_token(
    next: Option<String>,
    seen: &mut std::collections::HashSet<String>,
    bucket: &str,
) -> Result<String, StoreError> {
    let why = match next {
        None => "without NextContinuationToken",
        Some(t) if t.is_empty() => "with an empty NextContinuationToken",
        Some(t) if !seen.insert(t.clone()) => "with a NextContinuationToken given before",
        Some(t) => return Ok(t),
    };
    Err(StoreError::Malformed(format!(
        "bucket {bucket:?}: a truncated listing page {why} (the store would be listed forever); \
         check the store at AWS_ENDPOINT_URL"
    )))
}

/// A page, or why the body is not one (a proxy's error page answered with 200 would
/// otherwise read as an empty page: every field has a default).
fn parse(body: &[u8]) -> Result<Page, StoreError> {
    let malformed = |why: String| {
        let start: String = String::from_utf8_lossy(body).chars().take(200).collect();
        StoreError::Malformed(format!(
            "a listing page that is not S3's XML ({why}): {start}"
        ))
    };
    if memchr::memmem::find(body, b"<ListBucketResult").is_none() {
        return Err(malformed("no ListBucketResult".into()));
    }
    quick_xml::de::from_reader(body).map_err(|e| malformed(e.to_string()))
}

/// A key as `encoding-type=url` sent it: `+` is a space, `%XX` a byte; and whether those
/// bytes are UTF-8 (S3 keys are; only a store that is not S3 could send others: the key is
/// then shown with U+FFFD, and skipped by the caller, since a GET could not name it).
fn decode(key: &str) -> (String, bool) {
    let spaced = key.replace('+', " ");
    let bytes: Vec<u8> = percent_encoding::percent_decode_str(&spaced).collect();
    match String::from_utf8(bytes) {
        Ok(key) => (key, true),
        Err(e) => (String::from_utf8_lossy(e.as_bytes()).into_owned(), false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncated_page_needs_a_new_token() {
        let mut seen = std::collections::HashSet::new();
        assert_eq!(next_token(Some("t1".into()), &mut seen, "b").unwrap(), "t1");
        assert_eq!(next_token(Some("t2".into()), &mut seen, "b").unwrap(), "t2");
        for (bad, why) in [
            (None, "without"),
            (Some(String::new()), "empty"),
            (Some("t1".to_string()), "given before"),
        ] {
            let e = next_token(bad, &mut seen, "my-bucket").unwrap_err();
            assert!(matches!(e, StoreError::Malformed(_)), "{e:?}");
            let text = e.to_string();
            assert!(
                text.contains("\"my-bucket\"") && text.contains(why),
                "{text}"
            );
        }
    }

    #[test]
    fn a_page_parses_with_encoded_keys() {
        let xml = br#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name>
<Prefix>p/</Prefix><KeyCount>2</KeyCount><MaxKeys>1000</MaxKeys><EncodingType>url</EncodingType>
<IsTruncated>true</IsTruncated>
<Contents><Key>p/t%09ab</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>
<ETag>&quot;abc&quot;</ETag><Size>5</Size><StorageClass>STANDARD</StorageClass></Contents>
<Contents><Key>p/a+b%2Bc</Key><Size>0</Size></Contents>
<NextContinuationToken>tok/=</NextContinuationToken></ListBucketResult>"#;
        let page = parse(xml).unwrap();
        assert!(page.is_truncated);
        assert_eq!(page.next_continuation_token.as_deref(), Some("tok/="));
        assert_eq!(page.encoding_type.as_deref(), Some("url"));
        assert_eq!(decode(&page.contents[0].key), ("p/t\tab".into(), true));
        assert_eq!(page.contents[0].e_tag.as_deref(), Some("\"abc\""));
        assert_eq!(decode(&page.contents[1].key), ("p/a b+c".into(), true));
        assert_eq!(decode("p/c/x%FF.jpg"), ("p/c/x\u{FFFD}.jpg".into(), false));
        assert_eq!(page.contents[1].size, 0);
        let empty = parse(b"<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>");
        assert!(empty.unwrap().contents.is_empty());
        assert!(parse(b"<html>proxy error</html>").is_err());
    }
}
