//! `--source s3://BUCKET/PREFIX`: a dataset in an S3-compatible object store (AWS S3, MinIO,
//! Ceph RGW, ...): `object_store`'s configuration, credentials, signer and HTTP client, with
//! our own `ListObjectsV2` and GET requests ([`signed`], [`listing`]; why there). The objects
//! under the prefix are the files: `PREFIX/CLASS/NAME` for ImageFolder, any key for
//! `--format tree`; keys no file can be named are skipped ([`keys`]).
//!
//! Only rank 0 talks to the bucket before the mount: it checks that the bucket answers
//! ([`check_source`]) and lists the prefix once ([`build_index`]: past the first page in
//! ranges of folders listed by several threads at once, [`ranges`]); the index then travels
//! to the other ranks over MPI as a folder scan's does, so they make no listing calls.
//! After that every rank GETs the objects it stages or fetches on demand (a ranged GET for
//! a read at an offset), at most [`CONCURRENCY`] at once; records (`--format records`) as
//! coalesced ranged GETs of page groups ([`records`]). `--replicate` is not served from a
//! bucket yet and is refused at startup.
//!
//! The hooks elsewhere are few: `Format::{check_source, build_index, open}` send an
//! `s3://` source here, the configuration refuses what is not supported, the staging
//! threads default to [`CONCURRENCY`] for a bucket, and staging announces what it is about
//! to copy (`Dataset::will_read`) so that record groups are fetched as coalesced runs, and
//! `--rescan` keeps a cached object whose listed ETag and size are unchanged
//! ([`still_same`]).

use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

use super::manifest::{Manifest, ManifestError};
use super::{Copied, Dataset, Format, RecordParams};
use crate::plan::SampleId;

mod client;
mod error;
mod folders;
mod keys;
mod list;
mod listing;
mod profile;
mod ranges;
mod records;
mod signed;

pub(crate) use client::CONCURRENCY;
use client::{Client, S3Url};

/// The bucket and prefix of `source` when it is an `s3://` URL (an error for a malformed
/// one), `None` for a path.
pub(crate) fn url_of(source: &Path) -> Option<Result<S3Url, String>> {
    S3Url::parse(source.to_str()?)
}

/// `--staging-threads` left out: 4 for a folder (a parallel filesystem rewards a few
/// readers), [`CONCURRENCY`] for a bucket, where each thread holds one GET in flight.
pub fn default_staging_threads(source: &Path) -> usize {
    if is_s3(source) { CONCURRENCY } else { 4 }
}

/// Whether `source` names a bucket rather than a folder.
pub fn is_s3(source: &Path) -> bool {
    url_of(source).is_some()
}

fn client(source: &Path) -> Result<Client, ManifestError> {
    let url = url_of(source)
        .expect("only s3:// sources come here")
        .map_err(ManifestError::Store)?;
    Client::new(url).map_err(ManifestError::Store)
}

/// Retries this process's requests to a bucket made so far (0 without one).
pub fn store_retries() -> u64 {
    signed::STORE_RETRIES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Refuses on the command line what a bucket source does not support yet, a malformed
/// `s3://` URL, and every other URL scheme (`gs://`, `az://`, `http://`, ...): this build
/// compiles `object_store`'s S3 client only, so those would otherwise be taken for a folder
/// named `gs:` and fail later with a confusing "no such folder".
pub fn check_args(source: &Path, _format: Format, replicate: bool) -> Result<(), String> {
    let text = source.to_string_lossy();
    if let Some(scheme) = other_scheme(&text) {
        return Err(format!(
            "--source {text}: {scheme}:// sources are not supported. Supported: a folder path, \
             or s3://BUCKET/PREFIX for AWS S3 or any S3-compatible store (MinIO, Ceph RGW, \
             Cloudflare R2, ...) at AWS_ENDPOINT_URL; Google Cloud Storage and Azure Blob \
             clients are not built in (a GCS bucket may be reachable through its S3-compatible \
             XML API with HMAC keys, untested). See docs/s3.md"
        ));
    }
    let Some(url) = url_of(source) else {
        return Ok(());
    };
    url?;
    if replicate {
        return Err(format!(
            "--source {}: --replicate is not served from a bucket yet; copy the side files next to the mount, or drop --replicate",
            source.display()
        ));
    }
    Ok(())
}

/// The scheme of `text` when it is a URL (`SCHEME://...`) other than `s3://`.
fn other_scheme(text: &str) -> Option<&str> {
    let (scheme, _) = text.split_once("://")?;
    let url_like = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    (url_like && scheme != "s3").then_some(scheme)
}

/// Checks at mount that the bucket exists and is readable with these credentials (one
/// listing request of one key): a missing bucket, a refused one, or no answer is named
/// with the fix. The keys it returns are not looked at (an odd key is the listing's to skip).
pub(crate) fn check_source(source: &Path) -> Result<(), ManifestError> {
    let client = client(source)?;
    let probe = listing::list(&client, Some(1), &mut |_| {});
    probe
        .map(|_| ())
        .map_err(|e| ManifestError::Store(refusal(&client.url, e)))
}

/// Why the bucket of `url` cannot be a source, and what to do about it.
fn refusal(url: &S3Url, e: error::StoreError) -> String {
    use error::StoreError as E;
    let fix = match &e {
        E::NotFound { .. } | E::StoreWide { status: 404, .. } => {
            "the bucket does not exist at this endpoint: check the bucket name and AWS_ENDPOINT_URL / AWS_REGION"
        }
        E::NoCredentials(_) => {
            "no credentials were found: set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE (see docs/s3.md), or AWS_SKIP_SIGNATURE=true for a public bucket"
        }
        E::Forbidden { .. } | E::StoreWide { .. } => {
            "these credentials may not list it: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE's) and the bucket policy (s3:ListBucket, s3:GetObject)"
        }
        E::Refused { status: 301, .. } => {
            "the bucket is in another region: set AWS_REGION to the bucket's region"
        }
        E::Unreachable { .. } | E::Changed { .. } | E::Refused { .. } | E::Malformed(_) => {
            "the store did not answer as S3 does: check AWS_ENDPOINT_URL (and AWS_ALLOW_HTTP=true for a plain-http endpoint) and the network"
        }
    };
    format!(
        "--source {url}: bucket {:?} refused: {fix} ({e})",
        url.bucket
    )
}

/// Rank 0's one listing of the prefix as `format`'s index.
pub(crate) fn build_index(
    source: &Path,
    format: Format,
    records: &RecordParams,
) -> Result<Manifest, ManifestError> {
    if format == Format::Records {
        return records::build_index(&client(source)?, source, records);
    }
    list::build_index(&client(source)?, format)
}

/// `--rescan` over a bucket: whether the cached copy (`len` bytes) of sample `old_id` of the
/// cache's index is still object `new_id` of the new listing. A bucket has no file to look
/// at (a folder's `still_valid` compares the file's size and time); the two listings' ETags
/// and sizes tell instead: the same ETag (an object rewritten gets a new one, even with the
/// same size) and the listed size the cached length. No ETag in either index (a cache made
/// before ETags were kept): not known to be the same, so fetched again.
pub fn still_same(
    old: &Manifest,
    old_id: SampleId,
    new: &Manifest,
    new_id: SampleId,
    len: u64,
) -> bool {
    match (old.etag(old_id as usize), new.etag(new_id as usize)) {
        (Some(a), Some(b)) => a == b && new.size(new_id) == Some(len),
        _ => false,
    }
}

/// The reader of the bucket's samples, as `manifest` names them.
/// A client that cannot be built (this rank's environment lacks what rank 0's had) makes
/// every read fail with the reason, as an unreadable folder would.
pub(crate) fn open(source: &Path, manifest: Arc<Manifest>) -> Arc<dyn Dataset> {
    let client = client(source).map_err(|e| e.to_string());
    let name = source.display().to_string();
    if manifest.records().is_some() {
        return Arc::new(records::S3Records::new(client, name, manifest));
    }
    Arc::new(S3Source {
        client,
        name,
        manifest,
    })
}

/// A bucket's objects as samples.
struct S3Source {
    client: Result<Client, String>,
    /// The source as given, for errors before a client exists.
    name: String,
    manifest: Arc<Manifest>,
}

impl S3Source {
    fn client(&self) -> io::Result<&Client> {
        self.client
            .as_ref()
            .map_err(|e| io::Error::new(io::ErrorKind::ConnectionRefused, e.clone()))
    }

    fn relative(&self, id: SampleId) -> String {
        self.manifest
            .relative_path(id)
            .to_string_lossy()
            .into_owned()
    }
}

impl Dataset for S3Source {
    fn copy_to(&self, id: SampleId, out: &mut dyn Write) -> io::Result<Copied> {
        let etag = self.manifest.etag(id as usize);
        let (len, mtime) = self
            .client()?
            .get_to(&self.relative(id), etag.as_deref(), out)?;
        Ok(Copied { len, mtime })
    }

    fn read_at(&self, id: SampleId, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let range = match self.manifest.size(id) {
            Some(size) if offset >= size => return Ok(0),
            Some(size) => Some(offset..size.min(offset + buf.len() as u64)),
            None => None,
        };
        let ranged = range.is_some();
        let etag = self.manifest.etag(id as usize);
        let (bytes, _) = self
            .client()?
            .get(&self.relative(id), range, etag.as_deref())?;
        let bytes = match ranged {
            true => &bytes[..],
            false => bytes.get(offset as usize..).unwrap_or(&[]),
        };
        let n = bytes.len().min(buf.len());
        buf[..n].copy_from_slice(&bytes[..n]);
        Ok(n)
    }

    fn describe(&self, id: SampleId) -> String {
        match &self.client {
            Ok(c) => format!("s3://{}/{}", c.url.bucket, c.url.key(&self.relative(id))),
            Err(_) => format!("{}/{}", self.name, self.relative(id)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(source: &str, format: Format, replicate: bool) -> String {
        check_args(Path::new(source), format, replicate).unwrap_err()
    }

    #[test]
    fn what_a_bucket_cannot_serve_yet_is_refused_on_the_command_line() {
        let ok = |s: &str| check_args(Path::new(s), Format::Imagefolder, false);
        assert_eq!(ok("s3://b/p"), Ok(()));
        assert_eq!(ok("/data/train"), Ok(()));
        assert!(refusal("s3:///p", Format::Imagefolder, false).contains("no bucket name"));
        assert_eq!(
            check_args(Path::new("s3://b/p"), Format::Records, false),
            Ok(())
        );
        assert!(refusal("s3://b/p", Format::Tree, true).contains("--replicate"));
        for (url, scheme) in [
            ("gs://b/p", "gs"),
            ("gcs://b/p", "gcs"),
            ("az://container/p", "az"),
            ("abfss://c@acct.dfs.core.windows.net/p", "abfss"),
            ("https://host/b/p", "https"),
            ("file:///data", "file"),
        ] {
            let text = refusal(url, Format::Imagefolder, false);
            assert!(
                text.contains(&format!("{scheme}:// sources are not supported")),
                "{text}"
            );
            assert!(text.contains("s3://BUCKET/PREFIX") && text.contains("AWS_ENDPOINT_URL"));
        }
        assert_eq!(
            ok("/data/odd://name"),
            Ok(()),
            "a path that only contains ://"
        );
        assert_eq!(default_staging_threads(Path::new("s3://b")), CONCURRENCY);
        assert_eq!(default_staging_threads(Path::new("/data")), 4);
    }

    #[test]
    fn a_rescan_keeps_objects_whose_etag_and_size_are_unchanged() {
        let listing = |etags: &[&str]| {
            let files = vec![(b"1".to_vec(), 10), (b"2".to_vec(), 20)];
            let mut m = Manifest::from_parts(vec![(b"c".to_vec(), files)]).unwrap();
            let mut all = super::super::manifest::Etags::default();
            etags.iter().for_each(|e| all.push(e));
            if !etags.is_empty() {
                m.set_etags(all);
            }
            m
        };
        let (old, new) = (listing(&["\"a\"", "\"b\""]), listing(&["\"a\"", "\"B\""]));
        assert!(still_same(&old, 0, &new, 0, 10));
        assert!(!still_same(&old, 1, &new, 1, 20), "another ETag");
        assert!(
            !still_same(&old, 0, &new, 0, 9),
            "a cached copy of another length"
        );
        assert!(!still_same(&listing(&[]), 0, &new, 0, 10), "no ETag kept");
    }

    #[test]
    fn a_refused_bucket_is_named_with_the_fix_for_the_answer() {
        use error::StoreError as E;
        let url = S3Url::parse("s3://b/p").unwrap().unwrap();
        let cases = [
            (
                E::of_answer(404, "<Code>NoSuchBucket</Code>", None),
                "does not exist",
            ),
            (E::of_answer(403, "", None), "bucket policy"),
            (
                E::of_answer(301, "", None),
                "AWS_REGION to the bucket's region",
            ),
            (E::NoCredentials("none".into()), "no credentials were found"),
            (
                E::Unreachable {
                    attempts: 9,
                    reason: "refused".into(),
                },
                "AWS_ALLOW_HTTP",
            ),
            (E::Malformed("html".into()), "did not answer as S3 does"),
        ];
        for (e, fix) in cases {
            let text = super::refusal(&url, e);
            assert!(text.contains(fix) && text.contains("\"b\""), "{text}");
        }
    }

    #[test]
    fn urls_split_into_bucket_and_prefix() {
        let url = |s: &str| S3Url::parse(s).unwrap().unwrap();
        assert_eq!(url("s3://b").prefix, "");
        assert_eq!(url("s3://b/a/b/").prefix, "a/b");
        assert_eq!(url("s3://b/a/b/").key("c/1.jpg"), "a/b/c/1.jpg");
        assert_eq!(url("s3://b").key("c/1.jpg"), "c/1.jpg");
        assert!(S3Url::parse("/s3://b").is_none());
    }
}
