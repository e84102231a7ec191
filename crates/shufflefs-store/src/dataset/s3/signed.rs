//! Signed S3 requests made by hand: `object_store`'s HTTP client and SigV4 signer
//! (`AwsAuthorizer`, its credential provider, the endpoint its builder worked out), but our
//! own URLs, retries and reading of the answer.
//!
//! Why not `object_store`'s `list` and `get`: its listing parses every key into its `Path`
//! and fails the whole listing on one key it refuses (`a//b`, `..`, a tab), and its errors
//! keep the HTTP status in a private type, so "the store is away" and "this object answered
//! 416" could only be told apart by their text. Here the status is in hand: a listing takes
//! every key as the bytes the store sent (`encoding-type=url`), and each answer becomes a
//! [`StoreError`] by its status.
//!
//! Retries: connection errors, timeouts, 5xx (500, 503 SlowDown), 429 and 408 are retried
//! with exponential backoff (100 ms doubling to 10 s) and jitter, [`RETRIES`] times
//! within [`RETRY_WINDOW`]; then [`StoreError::Unreachable`]. Every other answer is final.
//! A body is read inside that loop: one that breaks off or stalls for [`IDLE`] is a failed
//! attempt like a reset (a whole-object download resumes where it broke: `Client::get_to`).
//! No timeout bounds a whole request, only each wait for the next bytes.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use http::Method;
use object_store::ClientOptions;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey, AwsAuthorizer};
use object_store::client::{
    ClientConfigKey, HttpClient, HttpConnector, HttpError, HttpRequest, HttpRequestBody,
    HttpResponse, HttpResponseBody, ReqwestConnector,
};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::error::StoreError;

/// Attempts after the first, for one request.
pub(crate) const RETRIES: usize = 8;
/// No retry starts later than this after the first attempt.
pub(crate) const RETRY_WINDOW: Duration = Duration::from_secs(120);
/// How long a request waits for its answer's head, and then for each next piece of its
/// body, before that attempt counts as broken off. Not a bound on a whole download: an
/// object that takes minutes to arrive on a slow link is fine as long as bytes keep coming.
pub(crate) const IDLE: Duration = Duration::from_secs(30);
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// What S3's SigV4 leaves unencoded in a query value: letters, digits and `-_.~`.
const QUERY: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');
/// As [`QUERY`], and `/` kept: a key in a URL path.
const PATH: &AsciiSet = &QUERY.remove(b'/');

/// The client options of ours that the environment may change (`AWS_ALLOW_HTTP`, a proxy).
const FROM_ENV: [ClientConfigKey; 5] = [
    ClientConfigKey::AllowHttp,
    ClientConfigKey::AllowInvalidCertificates,
    ClientConfigKey::ProxyUrl,
    ClientConfigKey::ProxyCaCertificate,
    ClientConfigKey::ProxyExcludes,
];

/// An answer's body as it arrives.
pub(crate) type Body = BoxStream<'static, Result<Bytes, HttpError>>;

/// One bucket's endpoint, credentials and HTTP client.
pub(crate) struct Signed {
    http: HttpClient,
    store: AmazonS3,
    region: String,
    /// `https://s3.REGION.amazonaws.com/BUCKET`, `http://host:port/BUCKET`, or the
    /// virtual-hosted form: the URL of the bucket, no trailing '/'.
    bucket_endpoint: String,
    skip_signature: bool,
    request_payer: bool,
}

impl Signed {
    /// Signed requests to `bucket` as `builder` (configured from the environment) would
    /// make them; `options` are ours (timeouts, pool), the environment's added.
    pub(crate) fn new(
        builder: AmazonS3Builder,
        mut options: ClientOptions,
        bucket: &str,
    ) -> Result<Signed, String> {
        let value = |key: AmazonS3ConfigKey| builder.get_config_value(&key);
        let flag = |key| value(key).is_some_and(|v| truthy(&v));
        if flag(AmazonS3ConfigKey::S3Express) {
            return Err("AWS_S3_EXPRESS: S3 Express One Zone directory buckets are not supported (their session-based signing is not implemented); use a general-purpose bucket, or unset AWS_S3_EXPRESS".into());
        }
        for key in FROM_ENV {
            if let Some(v) = value(AmazonS3ConfigKey::Client(key)) {
                options = options.with_config(key, v);
            }
        }
        let region = value(AmazonS3ConfigKey::Region).unwrap_or_else(|| "us-east-1".into());
        let virtual_hosted = flag(AmazonS3ConfigKey::VirtualHostedStyleRequest);
        let bucket_endpoint = match (value(AmazonS3ConfigKey::Endpoint), virtual_hosted) {
            (Some(e), true) => e.trim_end_matches('/').to_string(),
            (Some(e), false) => format!("{}/{bucket}", e.trim_end_matches('/')),
            (None, true) => format!("https://{bucket}.s3.{region}.amazonaws.com"),
            (None, false) => format!("https://s3.{region}.amazonaws.com/{bucket}"),
        };
        let skip_signature = flag(AmazonS3ConfigKey::SkipSignature);
        let request_payer = flag(AmazonS3ConfigKey::RequestPayer);
        let store = builder.build().map_err(|e| e.to_string())?;
        let http = ReqwestConnector::default()
            .connect(&options)
            .map_err(|e| e.to_string())?;
        Ok(Signed {
            http,
            store,
            region,
            bucket_endpoint,
            skip_signature,
            request_payer,
        })
    }

    /// The URL of object `key`.
    pub(crate) fn object_url(&self, key: &str) -> String {
        format!(
            "{}/{}",
            self.bucket_endpoint,
            utf8_percent_encode(key, PATH)
        )
    }

    /// The URL of the bucket with `query`.
    pub(crate) fn bucket_url(&self, query: &[(&str, &str)]) -> String {
        let query: Vec<String> = (query.iter())
            .map(|(k, v)| format!("{k}={}", utf8_percent_encode(v, QUERY)))
            .collect();
        format!("{}?{}", self.bucket_endpoint, query.join("&"))
    }

    /// GETs `url` with `headers`, retrying what says "later" within `attempts`' budget; a
    /// 2xx answer (its body still to read), or the error the last answer stands for (`etag`:
    /// the `If-Match` sent, to name a 412).
    pub(crate) async fn get(
        &self,
        attempts: &mut Attempts,
        url: &str,
        headers: &[(&'static str, String)],
        etag: Option<&str>,
    ) -> Result<HttpResponse, StoreError> {
        loop {
            attempts.made += 1;
            let reason = match self.send(url, headers).await? {
                Ok(answer) if answer.status().is_success() => return Ok(answer),
                Ok(answer) => {
                    let status = answer.status().as_u16();
                    attempts.hint = retry_after(&answer);
                    let read = tokio::time::timeout(IDLE, answer.into_body().bytes()).await;
                    let body = read.ok().and_then(Result::ok).unwrap_or_default();
                    let body = String::from_utf8_lossy(&body);
                    if !matches!(status, 408 | 429 | 500..=599) {
                        return Err(StoreError::of_answer(status, &body, etag));
                    }
                    format!("HTTP {status} {}", super::error::detail(&body))
                }
                Err(transport) => transport,
            };
            attempts.again(url, reason).await?;
        }
    }

    /// GETs `url` and reads its whole body, retrying as [`get`](Self::get) does: a body that
    /// breaks off or stalls ([`IDLE`]) is asked for again within the same budget. `check`
    /// sees each answer's head before its body is read; the head and the body.
    pub(crate) async fn get_bytes(
        &self,
        url: &str,
        headers: &[(&'static str, String)],
        etag: Option<&str>,
        check: impl Fn(&HttpResponse) -> Result<(), StoreError>,
    ) -> Result<(http::response::Parts, Bytes), StoreError> {
        let mut attempts = Attempts::new();
        loop {
            let answer = self.get(&mut attempts, url, headers, etag).await?;
            check(&answer)?;
            let (head, body) = answer.into_parts();
            match read_all(body).await {
                Ok(bytes) => return Ok((head, bytes)),
                Err(reason) => attempts.again(url, reason).await?,
            }
        }
    }

    /// The unsigned GET of `url` with `headers` (and `x-amz-request-payer: requester` for
    /// `AWS_REQUEST_PAYER`, signed or not).
    fn request(
        &self,
        url: &str,
        headers: &[(&'static str, String)],
    ) -> Result<HttpRequest, StoreError> {
        let mut request = HttpRequest::new(HttpRequestBody::empty());
        *request.method_mut() = Method::GET;
        *request.uri_mut() = url
            .parse()
            .map_err(|e| StoreError::Malformed(format!("bad request URL {url}: {e}")))?;
        let payer = [("x-amz-request-payer", "requester".to_string())];
        let payer = payer.iter().filter(|_| self.request_payer);
        for (name, value) in headers.iter().chain(payer) {
            let value = value
                .parse()
                .map_err(|_| StoreError::Malformed(format!("bad header {name}: {value}")))?;
            request.headers_mut().insert(*name, value);
        }
        Ok(request)
    }

    /// One attempt: the answer, or why none came (`Ok(Err(reason))`); `Err` for
    /// credentials that cannot be had.
    async fn send(
        &self,
        url: &str,
        headers: &[(&'static str, String)],
    ) -> Result<Result<HttpResponse, String>, StoreError> {
        let mut request = self.request(url, headers)?;
        if !self.skip_signature {
            let credential = (self.store.credentials().get_credential().await)
                .map_err(|e| StoreError::NoCredentials(super::error::chain(&e)))?;
            AwsAuthorizer::new(&credential, "s3", &self.region)
                .with_request_payer(self.request_payer)
                .authorize(&mut request, None);
        }
        Ok(
            match tokio::time::timeout(IDLE, self.http.execute(request)).await {
                Ok(answer) => answer.map_err(|e| super::error::chain(&e)),
                Err(_) => Err(format!("no answer within {} s", IDLE.as_secs())),
            },
        )
    }
}

/// Whether a flag's value is "on", as `object_store` reads its flags: `1`, `true`, `on`,
/// `yes` or `y`, any case.
fn truthy(value: &str) -> bool {
    ["1", "true", "on", "yes", "y"]
        .iter()
        .any(|t| value.trim().eq_ignore_ascii_case(t))
}

/// The retry budget of one request: the attempts made, and when the first started.
pub(crate) struct Attempts {
    started: Instant,
    made: usize,
    /// What the last answer's `Retry-After` asked for, if anything.
    hint: Option<Duration>,
}

impl Attempts {
    pub(crate) fn new() -> Attempts {
        Attempts {
            started: Instant::now(),
            made: 0,
            hint: None,
        }
    }

    /// The attempts made so far.
    pub(crate) fn made(&self) -> usize {
        self.made
    }

    /// After an attempt that failed for `reason`: waits out its backoff, or
    /// [`StoreError::Unreachable`] once the budget ([`RETRIES`], [`RETRY_WINDOW`]) is spent.
    pub(crate) async fn again(&mut self, url: &str, reason: String) -> Result<(), StoreError> {
        if self.made > RETRIES || self.started.elapsed() > RETRY_WINDOW {
            return Err(StoreError::Unreachable {
                attempts: self.made,
                reason,
            });
        }
        let wait = backoff(self.made).max(self.hint.take().unwrap_or_default());
        STORE_RETRIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let wait_ms = wait.as_millis() as u64;
        match self.made {
            1 => {
                tracing::info!(url, wait_ms, %reason, "S3 request retried (first retry; later ones are logged at debug)")
            }
            attempt => tracing::debug!(url, attempt, wait_ms, %reason, "S3 request retried"),
        }
        tokio::time::sleep(wait).await;
        Ok(())
    }
}

/// Retries made by this process's requests (the status's `cache.store_retries`).
pub(crate) static STORE_RETRIES: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// The wait a 503 or 429 answer's `Retry-After` asks for (whole seconds, or an HTTP date:
/// the time until it, none if it passed), at most [`BACKOFF_MAX`]: honoured when longer
/// than the backoff drawn.
fn retry_after(answer: &HttpResponse) -> Option<Duration> {
    if !matches!(answer.status().as_u16(), 429 | 503) {
        return None;
    }
    let text = answer.headers().get("retry-after")?.to_str().ok()?.trim();
    let wait = match text.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        // RFC 9110's HTTP date is RFC 2822's form in GMT.
        Err(_) => {
            let at = chrono::DateTime::parse_from_rfc2822(text).ok()?;
            (at.with_timezone(&chrono::Utc) - chrono::Utc::now())
                .to_std()
                .ok()?
        }
    };
    Some(wait.min(BACKOFF_MAX))
}

/// The next piece of a body: `None` at its end, `Err(reason)` if it broke off or no byte
/// came for [`IDLE`].
pub(crate) async fn next_chunk(body: &mut Body) -> Result<Option<Bytes>, String> {
    match tokio::time::timeout(IDLE, body.next()).await {
        Err(_) => Err(format!(
            "the answer stalled: no byte for {} s",
            IDLE.as_secs()
        )),
        Ok(None) => Ok(None),
        Ok(Some(Err(e))) => Err(format!("the answer broke off: {}", super::error::chain(&e))),
        Ok(Some(Ok(chunk))) => Ok(Some(chunk)),
    }
}

/// A whole body, or why it broke off.
async fn read_all(body: HttpResponseBody) -> Result<Bytes, String> {
    let mut body = body.bytes_stream();
    let Some(first) = next_chunk(&mut body).await? else {
        return Ok(Bytes::new());
    };
    let mut all: Option<Vec<u8>> = None;
    while let Some(chunk) = next_chunk(&mut body).await? {
        all.get_or_insert_with(|| first.to_vec())
            .extend_from_slice(&chunk);
    }
    Ok(all.map_or(first, Bytes::from))
}

/// The wait before retry `attempt` (1, 2, ...): a random 50 to 100 % of 100 ms doubling per
/// attempt up to 10 s ("equal jitter": the retries of many requests spread out, and none
/// comes back at once).
fn backoff(attempt: usize) -> Duration {
    let ceiling = BACKOFF_FIRST
        .saturating_mul(1 << (attempt - 1).min(16))
        .min(BACKOFF_MAX);
    ceiling.mul_f64(0.5 + 0.5 * jitter())
}

/// A number in [0, 1) that differs between calls, threads and processes.
fn jitter() -> f64 {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    thread_local!(static STATE: RandomState = RandomState::new());
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let bits = STATE.with(|s| s.hash_one(call));
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_with_jitter() {
        for attempt in 1..20 {
            let wait = backoff(attempt);
            let ceiling = BACKOFF_FIRST
                .saturating_mul(1 << (attempt - 1).min(16))
                .min(BACKOFF_MAX);
            assert!(
                wait <= ceiling && wait >= ceiling / 2,
                "{attempt}: {wait:?}"
            );
        }
    }

    fn signed(settings: &[(AmazonS3ConfigKey, &str)]) -> Result<Signed, String> {
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name("b")
            .with_region("eu-west-1")
            .with_access_key_id("k")
            .with_secret_access_key("s");
        for (key, value) in settings {
            builder = builder.with_config(*key, *value);
        }
        Signed::new(builder, ClientOptions::new(), "b")
    }

    #[test]
    fn flags_take_every_value_object_store_takes_and_are_honoured() {
        for on in ["1", "true", "TRUE", "on", "Yes", "y"] {
            assert!(truthy(on), "{on}");
        }
        for off in ["0", "false", "off", "no", "n", ""] {
            assert!(!truthy(off), "{off}");
        }
        use AmazonS3ConfigKey as K;
        let plain = signed(&[]).unwrap();
        assert_eq!(
            plain.bucket_endpoint,
            "https://s3.eu-west-1.amazonaws.com/b"
        );
        assert!(!plain.skip_signature && !plain.request_payer);
        let request = plain.request("https://x/b/k", &[]).unwrap();
        assert!(request.headers().get("x-amz-request-payer").is_none());
        let on = signed(&[
            (K::VirtualHostedStyleRequest, "yes"),
            (K::SkipSignature, "1"),
            (K::RequestPayer, "On"),
        ])
        .unwrap();
        assert_eq!(on.bucket_endpoint, "https://b.s3.eu-west-1.amazonaws.com");
        assert!(on.skip_signature && on.request_payer);
        // Unsigned (skip signature) and still asking to pay.
        let request = on.request("https://x/b/k", &[]).unwrap();
        assert_eq!(request.headers()["x-amz-request-payer"], "requester");
        let express = signed(&[(K::S3Express, "true")]).err().unwrap();
        assert!(express.contains("S3 Express"), "{express}");
    }

    #[test]
    fn retry_after_is_read_on_503_and_429_and_capped() {
        let answer = |status: u16, after: &str| {
            let answer = http::Response::builder()
                .status(status)
                .header("retry-after", after);
            answer.body(Vec::<u8>::new().into()).unwrap()
        };
        assert_eq!(retry_after(&answer(503, "3")), Some(Duration::from_secs(3)));
        assert_eq!(retry_after(&answer(429, " 60 ")), Some(BACKOFF_MAX));
        assert_eq!(retry_after(&answer(500, "3")), None);
        // An HTTP date: the time until it (capped), none once it passed, none if garbled.
        assert_eq!(
            retry_after(&answer(503, "Wed, 21 Oct 2015 07:28:00 GMT")),
            None
        );
        let soon = chrono::Utc::now() + chrono::Duration::seconds(5);
        let soon = soon.format("%a, %d %b %Y %H:%M:%S GMT").to_string();
        let wait = retry_after(&answer(503, &soon)).unwrap();
        assert!(
            wait > Duration::from_secs(3) && wait <= Duration::from_secs(5),
            "{wait:?}"
        );
        let later = chrono::Utc::now() + chrono::Duration::seconds(600);
        let later = later.format("%a, %d %b %Y %H:%M:%S GMT").to_string();
        assert_eq!(retry_after(&answer(429, &later)), Some(BACKOFF_MAX));
        assert_eq!(retry_after(&answer(503, "soon")), None);
    }

    #[test]
    fn keys_and_queries_are_encoded_as_sigv4_signs_them() {
        let key = "cls/a b+c~d[1]%.jpg";
        assert_eq!(
            utf8_percent_encode(key, PATH).to_string(),
            "cls/a%20b%2Bc~d%5B1%5D%25.jpg"
        );
        assert_eq!(utf8_percent_encode("p/x y", QUERY).to_string(), "p%2Fx%20y");
    }
}
