//! What a request to the bucket ends in, typed so that callers decide by variant, not by
//! the text: the store is away ([`StoreError::Unreachable`]) or answers every request alike
//! ([`StoreError::StoreWide`]: credentials expired, a clock off, the bucket gone), and
//! staging retries the round later, or this one object is the problem (every other variant: the sample fails and is
//! reported as a changed or unreadable file is, the mount goes on).
//!
//! Which answers are retried inside a request (connection errors, timeouts, 5xx, 429, 408)
//! is decided in [`signed`](super::signed); an error of this type comes after that.
//!
//! Every text that reaches a log, the status or a refusal passes through here ([`chain`],
//! [`detail`]) and loses what an S3 error body can echo of the credentials ([`redact`]).

use std::io;

/// A failed request to the bucket, after the retries the answer allowed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    /// No answer, or only answers that say "later" (a reset, a timeout, 5xx, 429 SlowDown),
    /// until the retries ran out.
    #[error("the store did not answer after {attempts} attempts: {reason}")]
    Unreachable { attempts: usize, reason: String },
    /// An answer that is about the whole store, not this object: credentials expired or
    /// refused, this host's clock off, the bucket gone. Every request would get it, so it is
    /// treated as the store being away (staging waits and retries the round) with `fix`.
    #[error("HTTP {status} {detail}: {fix}")]
    StoreWide {
        status: u16,
        code: String,
        detail: String,
        fix: &'static str,
    },
    /// No credentials could be had (none configured, or the instance metadata service or
    /// STS not answering): retried later as an outage, refused at mount with the fix.
    #[error("no credentials: {0}")]
    NoCredentials(String),
    /// 404: the bucket or the object is not there.
    #[error("HTTP {status} {detail}")]
    NotFound { status: u16, detail: String },
    /// 401 or 403: these credentials may not read it.
    #[error("HTTP {status} {detail}")]
    Forbidden { status: u16, detail: String },
    /// 412 to `If-Match`: the object's ETag is no longer the listed one.
    #[error(
        "the object changed since the listing (its ETag is no longer {etag}); remount with --rescan or --reset-cache"
    )]
    Changed { etag: String },
    /// Any other answer about this object: a 4xx other than the above (400, 416 after the
    /// object shrank under an unchanged ETag), a 200 with the whole object to a ranged GET
    /// (a proxy that drops `Range`), a body of the wrong length.
    #[error("HTTP {status} {detail}")]
    Refused { status: u16, detail: String },
    /// An answer that is not what S3 sends (a listing that does not parse).
    #[error("{0}")]
    Malformed(String),
}

impl StoreError {
    /// The error a final (non-retried) answer with `status` and `body` stands for.
    pub(crate) fn of_answer(status: u16, body: &str, etag: Option<&str>) -> StoreError {
        let detail = detail(body);
        let code = element(body, "Code").unwrap_or_default();
        if let Some(fix) = store_wide(status, code) {
            let code = code.to_string();
            return StoreError::StoreWide {
                status,
                code,
                detail,
                fix,
            };
        }
        match status {
            404 => StoreError::NotFound { status, detail },
            401 | 403 => StoreError::Forbidden { status, detail },
            412 => match etag {
                Some(etag) => StoreError::Changed {
                    etag: etag.to_string(),
                },
                None => StoreError::Refused { status, detail },
            },
            _ => StoreError::Refused { status, detail },
        }
    }
}

/// What to do about an answer with `status` and S3 error `code` that every request of this
/// job would get, if it is one.
fn store_wide(status: u16, code: &str) -> Option<&'static str> {
    Some(match (status, code) {
        (400 | 403, "ExpiredToken" | "InvalidToken" | "TokenRefreshRequired") => {
            "credentials expired: refresh them (a session token given in AWS_SESSION_TOKEN or a profile is not refreshed; see docs/s3.md)"
        }
        (403, "RequestTimeTooSkewed") => {
            "this host's clock is too far off the store's: sync it (NTP)"
        }
        (403, "InvalidAccessKeyId") => {
            "the store does not know this access key: check AWS_ACCESS_KEY_ID (or AWS_PROFILE's)"
        }
        (403, "SignatureDoesNotMatch") => {
            "the secret key does not match the access key: check AWS_SECRET_ACCESS_KEY (or AWS_PROFILE's)"
        }
        (404, "NoSuchBucket") => {
            "the bucket is gone: check that it was not deleted or renamed, and AWS_ENDPOINT_URL"
        }
        _ => return None,
    })
}

/// The text of the first `<name>` element of `body`.
fn element<'a>(body: &'a str, name: &str) -> Option<&'a str> {
    let (open, close) = (format!("<{name}>"), format!("</{name}>"));
    let start = body.find(&open)? + open.len();
    let end = body[start..].find(&close)? + start;
    Some(&body[start..end])
}

/// The `Code` and `Message` of an S3 error body (`<Error><Code>..</Code>..`), or the start
/// of a body that is not one, without what could echo credentials.
pub(crate) fn detail(body: &str) -> String {
    let text = match (element(body, "Code"), element(body, "Message")) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code.to_string(),
        _ => body.chars().take(200).collect(),
    };
    redact(&text.replace('\n', " "))
}

/// `e` and its sources, `: `-separated: an HTTP client error keeps the transport's reason
/// (a reset, a timeout, a refused connection) in its sources.
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

/// As an `io::Error` whose kind tells staging what it means: `ConnectionRefused` for a
/// store that is away or refuses every request alike (retried later), `NotFound` / `PermissionDenied` as for a file, and
/// `InvalidData` for an object that is the problem (the sample fails, as a changed file
/// does). The caller names the object (`Dataset::describe`); the text names the status.
impl From<StoreError> for io::Error {
    fn from(e: StoreError) -> io::Error {
        let kind = match &e {
            StoreError::Unreachable { .. }
            | StoreError::StoreWide { .. }
            | StoreError::NoCredentials(_) => io::ErrorKind::ConnectionRefused,
            StoreError::NotFound { .. } => io::ErrorKind::NotFound,
            StoreError::Forbidden { .. } => io::ErrorKind::PermissionDenied,
            StoreError::Changed { .. } | StoreError::Refused { .. } | StoreError::Malformed(_) => {
                io::ErrorKind::InvalidData
            }
        };
        io::Error::new(kind, e)
    }
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
    fn answers_about_the_whole_store_are_an_outage_with_the_fix() {
        let body = |code: &str| format!("<Error><Code>{code}</Code><Message>m</Message></Error>");
        for (status, code, fix) in [
            (400, "ExpiredToken", "refresh them"),
            (400, "InvalidToken", "refresh them"),
            (403, "TokenRefreshRequired", "refresh them"),
            (403, "RequestTimeTooSkewed", "clock"),
            (403, "InvalidAccessKeyId", "AWS_ACCESS_KEY_ID"),
            (403, "SignatureDoesNotMatch", "AWS_SECRET_ACCESS_KEY"),
            (404, "NoSuchBucket", "bucket is gone"),
        ] {
            let e = StoreError::of_answer(status, &body(code), None);
            assert!(
                matches!(&e, StoreError::StoreWide { code: c, .. } if c == code),
                "{e:?}"
            );
            let text = e.to_string();
            assert!(text.contains(code) && text.contains(fix), "{text}");
            assert_eq!(io::Error::from(e).kind(), io::ErrorKind::ConnectionRefused);
        }
        // The same statuses with codes about one object stay that object's.
        let one =
            |status, code: &str| io::Error::from(StoreError::of_answer(status, &body(code), None));
        assert_eq!(one(404, "NoSuchKey").kind(), io::ErrorKind::NotFound);
        assert_eq!(
            one(403, "AccessDenied").kind(),
            io::ErrorKind::PermissionDenied
        );
        assert_eq!(
            one(400, "InvalidArgument").kind(),
            io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn answers_about_one_object_are_not_an_outage() {
        let body = "<Error><Code>InvalidRange</Code><Message>The requested range is not satisfiable</Message></Error>";
        let e = StoreError::of_answer(416, body, Some("\"e1\""));
        assert_eq!(
            e.to_string(),
            "HTTP 416 InvalidRange: The requested range is not satisfiable"
        );
        assert_eq!(io::Error::from(e).kind(), io::ErrorKind::InvalidData);
        let changed = StoreError::of_answer(412, "", Some("\"e1\""));
        assert!(changed.to_string().contains("changed since the listing"));
        assert_eq!(
            io::Error::from(StoreError::of_answer(404, "", None)).kind(),
            io::ErrorKind::NotFound
        );
        assert!(matches!(
            StoreError::of_answer(400, "bad", None),
            StoreError::Refused { status: 400, .. }
        ));
        let away = StoreError::Unreachable {
            attempts: 9,
            reason: "connection refused".into(),
        };
        assert_eq!(
            io::Error::from(away).kind(),
            io::ErrorKind::ConnectionRefused
        );
    }
}
