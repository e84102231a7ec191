//! The connection to a bucket: `s3://BUCKET/PREFIX` parsed, an `object_store` client built
//! from the AWS environment, one small tokio runtime to drive it from the daemon's plain
//! threads, a bound on requests in flight, and errors that name bucket, key and status.
//!
//! Retries are `object_store`'s own (`RetryConfig`): 5xx answers (503 SlowDown, 500
//! InternalError), 429, 408, timeouts and connection errors are retried with exponential
//! backoff and decorrelated jitter, [`RETRIES`] times within [`RETRY_WINDOW`]; 4xx answers
//! other than those are not retried. What is still failing after that reaches the caller as
//! an `io::Error` whose kind says whether the store was unreachable (staging then retries the
//! round later, as it does for a network filesystem that went away) or the object itself is
//! the problem.

use std::future::Future;
use std::io;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as KeyPath;
use object_store::{BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, RetryConfig};
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;

/// Requests one rank keeps in flight at most (staging and on-demand fetches together).
/// A GET of a 100 KB object is latency-bound (tens of ms to first byte on S3, a few ms on a
/// nearby MinIO), so throughput grows with requests in flight until the link or the store
/// saturates; 32 at ~40 ms per 100 KB GET is ~80 MB/s per rank (~2.5 Gb/s for 4 ranks a
/// host) and, times a few ranks, stays far under S3's 5,500 GETs/s per prefix, so SlowDown
/// stays rare. Reasoned, not measured against S3 (docs/s3.md).
pub(crate) const CONCURRENCY: usize = 32;
/// Attempts after the first, for one request.
const RETRIES: usize = 8;
/// No retry starts later than this after the first attempt.
const RETRY_WINDOW: Duration = Duration::from_secs(120);

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
        Some(Ok(S3Url {
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
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
    pub store: AmazonS3,
    runtime: Runtime,
    slots: Semaphore,
}

impl Client {
    /// A client of `url`'s bucket configured from the `AWS_*` environment variables
    /// (credentials, `AWS_REGION`/`AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL`,
    /// `AWS_ALLOW_HTTP`, ...). Makes no request.
    pub(crate) fn new(url: S3Url) -> Result<Client, String> {
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(10),
                base: 2.0,
            },
            max_retries: RETRIES,
            retry_timeout: RETRY_WINDOW,
        };
        // Our client options first: `with_client_options` replaces all of them, so the
        // environment's (`AWS_ALLOW_HTTP`, ...) must come after, as `from_env` reads them.
        let mut builder = AmazonS3Builder::new()
            .with_retry(retry)
            .with_client_options(
                ClientOptions::new()
                    .with_connect_timeout(Duration::from_secs(10))
                    .with_timeout(Duration::from_secs(60))
                    .with_pool_max_idle_per_host(CONCURRENCY),
            );
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
        let store = builder.build().map_err(|e| {
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
            store,
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
    pub(crate) fn get(
        &self,
        relative: &str,
        range: Option<std::ops::Range<u64>>,
        etag: Option<&str>,
    ) -> io::Result<(bytes::Bytes, std::time::SystemTime)> {
        let path = self.path(relative);
        let request = async {
            let _slot = self
                .slots
                .acquire()
                .await
                .expect("the semaphore is never closed");
            let options = GetOptions {
                range: range.map(GetRange::from),
                if_match: etag.map(str::to_string),
                ..GetOptions::default()
            };
            let got = self.store.get_opts(&path, options).await?;
            let modified = std::time::SystemTime::from(got.meta.last_modified);
            Ok((got.bytes().await?, modified))
        };
        self.run(request).map_err(|e| changed_or(e, etag))
    }

    /// GETs the whole of `relative` into `out` chunk by chunk as the body arrives (a large
    /// object is never held whole in memory), as one of at most [`CONCURRENCY`] requests
    /// in flight; its length and modification time.
    pub(crate) fn get_to(
        &self,
        relative: &str,
        etag: Option<&str>,
        out: &mut dyn std::io::Write,
    ) -> io::Result<(u64, std::time::SystemTime)> {
        use futures::StreamExt;
        let path = self.path(relative);
        let _slot = self
            .run(self.slots.acquire())
            .expect("the semaphore is never closed");
        let options = GetOptions {
            if_match: etag.map(str::to_string),
            ..GetOptions::default()
        };
        let got = self
            .run(self.store.get_opts(&path, options))
            .map_err(|e| changed_or(e, etag))?;
        let modified = std::time::SystemTime::from(got.meta.last_modified);
        let mut body = got.into_stream();
        let mut len = 0u64;
        while let Some(chunk) = self.run(body.next()) {
            let chunk = chunk.map_err(io_error)?;
            out.write_all(&chunk)?;
            len += chunk.len() as u64;
        }
        Ok((len, modified))
    }

    /// The key path of `relative`.
    pub(crate) fn path(&self, relative: &str) -> KeyPath {
        key_path(&self.url.key(relative))
    }
}

/// `key` as `object_store` names an object: kept as written (`Path::parse`), so a key the
/// listing returned (`a~b[1].jpg`) is fetched under the same name; `Path::from` would
/// percent-encode such characters and ask for another key. A key `parse` refuses (empty
/// parts, `.`/`..`) falls back to `from`.
pub(crate) fn key_path(key: &str) -> KeyPath {
    KeyPath::parse(key).unwrap_or_else(|_| KeyPath::from(key))
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

/// `e` from a request as an `io::Error` saying what the store answered (the status and its
/// error code, or the transport's reason); the caller names the object, as it names a
/// file (`Dataset::describe`). Its kind says what it means to the caller: the object is missing
/// (`NotFound`), not ours to read (`PermissionDenied`), or the store cannot be reached or
/// keeps failing (`ConnectionRefused`, which staging treats as a source that went away).
pub(crate) fn io_error(e: object_store::Error) -> io::Error {
    use object_store::Error as E;
    let kind = match &e {
        E::NotFound { .. } => io::ErrorKind::NotFound,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => io::ErrorKind::PermissionDenied,
        E::Precondition { .. } | E::NotModified { .. } => io::ErrorKind::InvalidData,
        _ => io::ErrorKind::ConnectionRefused,
    };
    io::Error::new(kind, chain(&e))
}

/// `e` as [`io_error`] does, but a failed `If-Match` (the object's ETag is no longer the
/// listed `etag`) as a changed file is reported.
fn changed_or(e: object_store::Error, etag: Option<&str>) -> io::Error {
    match (&e, etag) {
        (object_store::Error::Precondition { .. }, Some(etag)) => io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the object changed since the listing (its ETag is no longer {etag}); remount with --rescan or --reset-cache"
            ),
        ),
        _ => io_error(e),
    }
}

/// `e` and its sources, `: `-separated: `object_store` keeps the HTTP status and the
/// transport's reason (a reset, a timeout) in the sources.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        next = cause.source();
    }
    redact(&text.replace('\n', " "))
}

/// Elements of an S3 error body that can echo credentials (a signature mismatch returns the
/// canonical request, whose signed headers include the session token; an expired token is
/// returned whole), emptied before an error reaches a log, the status or a refusal; the text
/// is also capped, as a body can be long.
const SECRET_ELEMENTS: [&str; 6] = [
    "CanonicalRequest",
    "CanonicalRequestBytes",
    "StringToSign",
    "StringToSignBytes",
    "Token-0",
    "AWSAccessKeyId",
];
const ERROR_TEXT_MAX: usize = 1000;

fn redact(text: &str) -> String {
    let mut out = text.to_string();
    for name in SECRET_ELEMENTS {
        let (open, close) = (format!("<{name}>"), format!("</{name}>"));
        let mut from = 0;
        while let Some(start) = out[from..].find(&open).map(|i| from + i + open.len()) {
            let end = out[start..].find(&close).map_or(out.len(), |i| start + i);
            out.replace_range(start..end, "(redacted)");
            from = start + "(redacted)".len();
        }
    }
    let marker = "x-amz-security-token:";
    while let Some(at) = out.find(marker) {
        let start = at + marker.len();
        let end = (out[start..].find(|c: char| c.is_whitespace() || c == '<' || c == '&'))
            .map_or(out.len(), |i| start + i);
        out.replace_range(at..end, "x-amz-security-token (redacted)");
    }
    if out.len() > ERROR_TEXT_MAX {
        let mut cut = ERROR_TEXT_MAX;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str(" ...");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_body_loses_what_could_echo_credentials() {
        let body = "403 Forbidden: <Error><Code>SignatureDoesNotMatch</Code><AWSAccessKeyId>AKIA1</AWSAccessKeyId>\
            <CanonicalRequest>GET /b/k host:x x-amz-security-token:SECRETTOKEN</CanonicalRequest>\
            <Token-0>SECRET2</Token-0></Error> and x-amz-security-token:SECRET3 more";
        let out = redact(body);
        for secret in ["AKIA1", "SECRETTOKEN", "SECRET2", "SECRET3"] {
            assert!(!out.contains(secret), "{out}");
        }
        assert!(out.contains("SignatureDoesNotMatch"), "{out}");
        assert!(redact(&"x".repeat(5000)).len() < 1100);
    }

    #[test]
    fn a_listed_key_is_fetched_under_its_own_name() {
        assert_eq!(key_path("cls/a~b[1]%.jpg").as_ref(), "cls/a~b[1]%.jpg");
        assert_eq!(key_path("data~v2").as_ref(), "data~v2");
    }
}
