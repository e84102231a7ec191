//! The connection to a bucket: `s3://BUCKET/PREFIX` parsed, a signed-request client built
//! from the AWS environment ([`Signed`]), one small tokio runtime to drive it from the
//! daemon's plain threads, a bound on requests in flight, and GETs whose failures are a
//! typed [`StoreError`].
//!
//! Retries happen inside each request ([`signed`](super::signed): connection errors,
//! timeouts, 5xx including 503 SlowDown, 429, 408). What is still failing after them reaches
//! the caller as an `io::Error` whose kind says whether the store was unreachable (staging
//! then retries the round later, as it does for a network filesystem that went away) or the
//! object itself is the problem (any other answer: 404, 403, 412 after a change, 416, 400, a
//! 200 with the whole object to a ranged GET, a body of the wrong length): that sample
//! fails and is reported, as a changed file is.

use std::future::Future;
use std::io;
use std::ops::Range;
use std::time::{Duration, SystemTime};

use object_store::ClientOptions;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::client::HttpResponse;
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;

use super::error::StoreError;
use super::signed::{Attempts, Signed, next_chunk};

/// Requests one rank keeps in flight at most (staging and on-demand fetches together).
/// A GET of a 100 KB object is latency-bound (tens of ms to first byte on S3, a few ms on a
/// nearby MinIO), so throughput grows with requests in flight until the link or the store
/// saturates; 32 at ~40 ms per 100 KB GET is ~80 MB/s per rank (~2.5 Gb/s for 4 ranks a
/// host) and, times a few ranks, stays far under S3's 5,500 GETs/s per prefix, so SlowDown
/// stays rare. Reasoned, not measured against S3 (docs/s3.md).
pub(crate) const CONCURRENCY: usize = 32;

/// `s3://BUCKET/PREFIX` split; the prefix has no leading or trailing '/'.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct S3Url {
    pub bucket: String,
    pub prefix: String,
}

impl S3Url {
    /// Parses `s3://BUCKET[/PREFIX]`; `None` for anything that is not an `s3://` URL.
    pub(crate) fn parse(text: &str) -> Option<Result<S3Url, String>> {
        let rest = text.strip_prefix("s3://")?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Some(Err(format!(
                "--source {text}: no bucket name; write s3://BUCKET/PREFIX"
            )));
        }
        let prefix = prefix.trim_matches('/');
        if let Some(why) = super::keys::unusable(prefix).filter(|_| !prefix.is_empty()) {
            let parts: Vec<&str> = (prefix.split('/'))
                .filter(|p| !["", ".", ".."].contains(p))
                .collect();
            return Some(Err(format!(
                "--source {text}: the prefix {prefix:?} has {why}, which no path in the view \
                 can have (and a URL would resolve '.' and '..'); a bucket's keys are plain \
                 names: write the prefix as its keys start, e.g. s3://{bucket}/{}",
                parts.join("/")
            )));
        }
        Some(Ok(S3Url {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        }))
    }

    /// The key of `relative` (a path under the prefix).
    pub(crate) fn key(&self, relative: &str) -> String {
        match self.prefix.is_empty() {
            true => relative.to_string(),
            false => format!("{}/{relative}", self.prefix),
        }
    }
}

impl std::fmt::Display for S3Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.prefix)
    }
}

/// A bucket's client, the runtime that drives it and the in-flight bound.
pub(crate) struct Client {
    pub url: S3Url,
    pub signed: Signed,
    runtime: Runtime,
    slots: Semaphore,
}

impl Client {
    /// A client of `url`'s bucket configured from the `AWS_*` environment variables
    /// (credentials, `AWS_REGION`/`AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL`,
    /// `AWS_ALLOW_HTTP`, ...) and the shared files' profile. Makes no request.
    pub(crate) fn new(url: S3Url) -> Result<Client, String> {
        let options = ClientOptions::new()
            .with_connect_timeout(Duration::from_secs(10))
            // No bound on a whole request (a large object on a slow link takes minutes):
            // `signed` bounds each wait for an answer or the next bytes instead.
            .with_timeout_disabled()
            .with_pool_max_idle_per_host(CONCURRENCY);
        // Our client options first: `with_client_options` replaces all of them, so the
        // environment's (`AWS_ALLOW_HTTP`, ...) must come after, as `from_env` reads them.
        let mut builder = AmazonS3Builder::new().with_client_options(options.clone());
        let settings = settings();
        let given = |var: &str| settings.iter().any(|(k, _)| k == var);
        // A custom endpoint (MinIO, Ceph, a test server) takes any region name.
        if (given("AWS_ENDPOINT_URL") || given("AWS_ENDPOINT"))
            && !given("AWS_REGION")
            && !given("AWS_DEFAULT_REGION")
        {
            builder = builder.with_region("us-east-1");
        }
        for (key, value) in settings {
            if let Ok(key) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
                builder = builder.with_config(key, value);
            }
        }
        builder = builder.with_bucket_name(&url.bucket);
        let signed = Signed::new(builder, options, &url.bucket).map_err(|e| {
            format!("--source {url}: {e}. Set the AWS_* variables (see docs/s3.md)")
        })?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("s3-io")
            .enable_all()
            .build()
            .map_err(|e| format!("--source {url}: cannot start the I/O runtime: {e}"))?;
        Ok(Client {
            url,
            signed,
            runtime,
            slots: Semaphore::new(CONCURRENCY),
        })
    }

    /// Runs `request` on the runtime from a plain thread (or from inside another runtime,
    /// through a scoped thread).
    pub(crate) fn run<T: Send>(&self, request: impl Future<Output = T> + Send) -> T {
        if tokio::runtime::Handle::try_current().is_ok() {
            return std::thread::scope(|s| {
                s.spawn(|| self.runtime.block_on(request))
                    .join()
                    .expect("request thread panicked")
            });
        }
        self.runtime.block_on(request)
    }

    /// GETs `relative` (the bytes in `range`, or all) into memory, as one of at most
    /// [`CONCURRENCY`] requests in flight; the bytes and the object's modification time.
    /// A ranged GET must come back as exactly that range (206, the start asked for, the
    /// length asked for): anything else is this object's failure, not the store's.
    pub(crate) fn get(
        &self,
        relative: &str,
        range: Option<Range<u64>>,
        etag: Option<&str>,
    ) -> io::Result<(bytes::Bytes, Option<SystemTime>)> {
        if range.as_ref().is_some_and(|r| r.is_empty()) {
            return Ok((bytes::Bytes::new(), None));
        }
        let url = self.signed.object_url(&self.url.key(relative));
        let headers = headers(range.as_ref(), etag);
        let request = async {
            let _slot = self
                .slots
                .acquire()
                .await
                .expect("the semaphore is never closed");
            let check = |answer: &HttpResponse| match &range {
                Some(range) => check_range(answer, range),
                None => Ok(()),
            };
            let (head, bytes) = self.signed.get_bytes(&url, &headers, etag, check).await?;
            let modified = last_modified(&head.headers);
            match &range {
                Some(r) if bytes.len() as u64 != r.end - r.start => Err(StoreError::Refused {
                    status: head.status.as_u16(),
                    detail: format!(
                        "{} bytes for the range {}..{} of {} bytes",
                        bytes.len(),
                        r.start,
                        r.end,
                        r.end - r.start
                    ),
                }),
                _ => Ok((bytes, modified)),
            }
        };
        self.run(request).map_err(io::Error::from)
    }

    /// GETs the whole of `relative` into `out` chunk by chunk as the body arrives (a large
    /// object is never held whole in memory), as one of at most [`CONCURRENCY`] requests
    /// in flight; its length and modification time. A body that breaks off is resumed
    /// where it broke (`Range: bytes=N-`, `If-Match` the listed ETag or the first answer's)
    /// within the request's retry budget.
    pub(crate) fn get_to(
        &self,
        relative: &str,
        etag: Option<&str>,
        out: &mut dyn std::io::Write,
    ) -> io::Result<(u64, Option<SystemTime>)> {
        let url = self.signed.object_url(&self.url.key(relative));
        let _slot = self
            .run(self.slots.acquire())
            .expect("the semaphore is never closed");
        let mut attempts = Attempts::new();
        let first = headers(None, etag);
        let mut answer = self.run(self.signed.get(&mut attempts, &url, &first, etag))?;
        let modified = last_modified(answer.headers());
        let tag = (etag.map(str::to_string))
            .or_else(|| Some(answer.headers().get("etag")?.to_str().ok()?.to_string()));
        let mut len = 0u64;
        loop {
            let Some(reason) = self.copy(answer, out, &mut len)? else {
                return Ok((len, modified));
            };
            let Some(tag) = tag.as_deref() else {
                let made = attempts.made();
                return Err(StoreError::Unreachable {
                    attempts: made,
                    reason,
                }
                .into());
            };
            answer = self.run(self.resume(&mut attempts, &url, tag, len, reason))?;
        }
    }

    /// Writes `answer`'s body to `out` as it arrives, counting it in `len`; why it broke
    /// off, if it did.
    fn copy(
        &self,
        answer: HttpResponse,
        out: &mut dyn std::io::Write,
        len: &mut u64,
    ) -> io::Result<Option<String>> {
        let mut body = answer.into_body().bytes_stream();
        loop {
            match self.run(next_chunk(&mut body)) {
                Ok(None) => return Ok(None),
                Ok(Some(chunk)) => {
                    out.write_all(&chunk)?;
                    *len += chunk.len() as u64;
                }
                Err(reason) => return Ok(Some(reason)),
            }
        }
    }

    /// After a body broke off (`reason`) with `from` bytes in hand: the rest of the object
    /// listed with `tag`, once the backoff is waited out (a 412 if it changed meanwhile).
    async fn resume(
        &self,
        attempts: &mut Attempts,
        url: &str,
        tag: &str,
        from: u64,
        reason: String,
    ) -> Result<HttpResponse, StoreError> {
        attempts.again(url, reason).await?;
        let mut headers = vec![("if-match", tag.to_string())];
        if from > 0 {
            headers.push(("range", format!("bytes={from}-")));
        }
        let answer = self.signed.get(attempts, url, &headers, Some(tag)).await?;
        if from > 0 {
            check_range(&answer, &(from..u64::MAX))?;
        }
        Ok(answer)
    }
}

/// The headers of a GET of `range` (or all) of the object listed with `etag`.
fn headers(range: Option<&Range<u64>>, etag: Option<&str>) -> Vec<(&'static str, String)> {
    let mut headers = Vec::new();
    if let Some(r) = range {
        headers.push(("range", format!("bytes={}-{}", r.start, r.end - 1)));
    }
    if let Some(etag) = etag {
        headers.push(("if-match", etag.to_string()));
    }
    headers
}

/// Whether `answer` is the `range` asked for: 206 and a `Content-Range` from its start, or
/// a 200 whose whole object is exactly the range (a range of all of it, answered whole).
fn check_range(answer: &HttpResponse, range: &Range<u64>) -> Result<(), StoreError> {
    let status = answer.status().as_u16();
    let length =
        (answer.headers().get("content-length")).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if status == 200 && range.start == 0 && length == Some(range.end) {
        return Ok(());
    }
    if status != 206 {
        return Err(StoreError::Refused {
            status,
            detail: format!(
                "answered the range {}..{} with the whole object (a proxy or store that ignores Range)",
                range.start, range.end
            ),
        });
    }
    let given = (answer.headers().get("content-range")).and_then(|v| v.to_str().ok());
    let start = given
        .and_then(|v| v.strip_prefix("bytes "))
        .and_then(|v| v.split_once('-'))
        .and_then(|(start, _)| start.parse::<u64>().ok());
    match start {
        Some(s) if s == range.start => Ok(()),
        _ => Err(StoreError::Refused {
            status,
            detail: format!(
                "Content-Range {given:?} for the range {}..{}",
                range.start, range.end
            ),
        }),
    }
}

/// The object's `Last-Modified`, if the answer has a readable one.
fn last_modified(headers: &http::HeaderMap) -> Option<SystemTime> {
    let text = headers.get("last-modified")?.to_str().ok()?;
    let when = chrono::DateTime::parse_from_rfc2822(text).ok()?;
    Some(SystemTime::from(when.with_timezone(&chrono::Utc)))
}

/// The `AWS_*` settings: the shared files' profile, then the variables, which win.
fn settings() -> Vec<(String, String)> {
    let env = |var: &str| std::env::var(var).ok();
    let vars: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("AWS_"))
        .collect();
    // Keys are a set, as the AWS CLI takes them: with a key id in the environment, no key,
    // secret or session token comes from the profile (a profile's token sent with other keys
    // fails every request, and the store may echo it in its error).
    let env_keys = vars.iter().any(|(k, _)| k == "AWS_ACCESS_KEY_ID");
    let credential = |k: &str| {
        [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
        ]
        .contains(&k)
    };
    let mut all: Vec<(String, String)> = super::profile::settings(&env)
        .into_iter()
        .filter(|(k, _)| !vars.iter().any(|(v, _)| v == k))
        .filter(|(k, _)| !(env_keys && credential(k)))
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    all.extend(vars);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, headers: &[(&str, &str)]) -> HttpResponse {
        let mut answer = http::Response::builder().status(status);
        for (name, value) in headers {
            answer = answer.header(*name, *value);
        }
        answer.body(Vec::<u8>::new().into()).unwrap()
    }

    #[test]
    fn a_prefix_no_path_can_have_is_refused_with_the_fix() {
        let parsed = |s: &str| S3Url::parse(s).unwrap();
        assert_eq!(parsed("s3://b/a/b/").unwrap().prefix, "a/b");
        assert_eq!(parsed("s3://b").unwrap().prefix, "");
        for (url, fix) in [
            ("s3://b/a//b", "s3://b/a/b"),
            ("s3://b/a/./b", "s3://b/a/b"),
            ("s3://b/a/../b", "s3://b/a/b"),
            ("s3://b/./x", "s3://b/x"),
        ] {
            let e = parsed(url).unwrap_err();
            assert!(e.contains("the prefix") && e.ends_with(fix), "{e}");
        }
    }

    #[test]
    fn a_ranged_get_must_answer_the_range_asked_for() {
        let partial = |from: &str| answer(206, &[("content-range", from)]);
        assert!(check_range(&partial("bytes 100-199/1000"), &(100..200)).is_ok());
        let shifted = check_range(&partial("bytes 0-99/1000"), &(100..200));
        assert!(matches!(
            shifted,
            Err(StoreError::Refused { status: 206, .. })
        ));
        let whole = |len: &str| answer(200, &[("content-length", len)]);
        assert!(
            check_range(&whole("200"), &(0..200)).is_ok(),
            "all of it, whole"
        );
        let ignored = check_range(&whole("1000"), &(0..200)).unwrap_err();
        assert!(ignored.to_string().contains("ignores Range"), "{ignored}");
        assert!(check_range(&whole("200"), &(100..200)).is_err());
    }
}
