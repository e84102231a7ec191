//! An S3-compatible server on 127.0.0.1 for the `s3://` source tests: `moto`'s server
//! (PyPI `moto[server]`, installed into the loaders' venv by
//! `mount-helpers/install-python.sh`), its request log, an uploader (boto3, which moto
//! brings), and a proxy in front of it that answers some GETs with 503 SlowDown.
//!
//! moto was picked over `s3s-fs` because it installs as wheels in about a minute here,
//! where `cargo install s3s-fs` compiles a few hundred crates on a 2-core machine.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::venv::{check, venv_python_for};

/// The venv's python if it has moto's server and boto3, else `None` (skip; a failure
/// under `SHUFFLEFS_REQUIRE_S3=1`).
pub fn moto_python() -> Option<PathBuf> {
    let missing = "no venv with moto[server]; run `source mount-helpers/install-python.sh`";
    let what = ("an S3 test server (moto)", "SHUFFLEFS_REQUIRE_S3");
    venv_python_for("import moto.server, boto3", what, missing.to_string())
}

/// A port free on 127.0.0.1 now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_listening(port: u16, child: &mut Child, what: &str) {
    wait_listening_on("127.0.0.1", port, child, what)
}

fn wait_listening_on(host: &str, port: u16, child: &mut Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect((host, port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited before listening: {status}");
        }
        assert!(Instant::now() < deadline, "{what} did not listen in time");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A moto server (killed on drop), logging its requests to `log`.
pub struct S3Server {
    child: Child,
    python: PathBuf,
    /// The address it listens on.
    host: String,
    pub port: u16,
    pub log: PathBuf,
}

impl S3Server {
    pub fn start(python: &Path, log: &Path) -> S3Server {
        S3Server::start_checking(python, log, false)
    }

    /// As [`start`](Self::start); with `auth`, moto checks credentials (unknown keys get
    /// 403 InvalidAccessKeyId).
    pub fn start_checking(python: &Path, log: &Path, auth: bool) -> S3Server {
        S3Server::launch(python, log, auth, "127.0.0.1")
    }

    /// As [`start`](Self::start), listening on `host` (an emulated cluster's bridge
    /// address, which its hosts reach) instead of 127.0.0.1.
    pub fn start_on(python: &Path, log: &Path, host: &str) -> S3Server {
        S3Server::launch(python, log, false, host)
    }

    fn launch(python: &Path, log: &Path, auth: bool, host: &str) -> S3Server {
        let port = free_port();
        let mut server = Command::new(python);
        if auth {
            server.env("INITIAL_NO_AUTH_ACTION_COUNT", "0");
        }
        let mut child = server
            .args(["-m", "moto.server", "-H", host, "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        wait_listening_on(host, port, &mut child, "moto's server");
        S3Server {
            child,
            python: python.to_path_buf(),
            host: host.to_string(),
            port,
            log: log.to_path_buf(),
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }

    /// The AWS variables that point a client at `endpoint`.
    pub fn env(endpoint: &str) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", endpoint.to_string()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    /// Makes `bucket` and uploads every file under `dir` to `prefix/` + its relative path.
    pub fn upload(&self, bucket: &str, prefix: &str, dir: &Path) {
        let out = Command::new(&self.python)
            .args(["-c", UPLOAD, &self.endpoint(), bucket, prefix])
            .arg(dir)
            .envs(S3Server::env(&self.endpoint()))
            .output()
            .unwrap();
        check("uploading the dataset", &out);
    }

    /// Puts objects under their exact keys (any bytes a key may hold: `a//b`, `..`, a tab)
    /// into `bucket`, which exists.
    pub fn put(&self, bucket: &str, objects: &[(&str, &[u8])]) {
        let mut put = Command::new(&self.python);
        put.args(["-c", PUT, &self.endpoint(), bucket]);
        for (key, body) in objects {
            let hex: String = body.iter().map(|b| format!("{b:02x}")).collect();
            put.args([*key, hex.as_str()]);
        }
        let out = put.envs(S3Server::env(&self.endpoint())).output().unwrap();
        check("putting objects", &out);
    }

    /// How many ListObjectsV2 requests the server answered so far.
    pub fn list_requests(&self) -> usize {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        log.lines().filter(|l| l.contains("list-type=2")).count()
    }

    /// How many GETs of objects under `bucket/prefix/` the server answered so far: whole
    /// objects (200) and ranges (206); listings not counted.
    pub fn object_gets(&self, bucket: &str, prefix: &str) -> (usize, usize) {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let wanted = format!("GET /{bucket}/{prefix}/");
        let gets: Vec<&str> = (log.lines())
            .filter(|l| l.contains(&wanted) && !l.contains('?'))
            .collect();
        let count = |status: &str| gets.iter().filter(|l| l.ends_with(status)).count();
        (count(" 200 -"), count(" 206 -"))
    }

    /// A proxy in front of the server answering every `every`-th object GET with 503
    /// SlowDown (never for 0) (killed on drop); its log counts the 503s as lines with
    /// `INJECTED`.
    pub fn faulty_proxy(&self, every: u32, log: &Path) -> Proxy {
        self.proxy_on(free_port(), every, 0, log)
    }

    /// A proxy on `port` that delays every object GET by `delay_ms` and answers every
    /// `every`-th one (never for 0) with 503 SlowDown.
    pub fn proxy_on(&self, port: u16, every: u32, delay_ms: u32, log: &Path) -> Proxy {
        self.launch_proxy(port, every, delay_ms, &[], log)
    }

    /// A proxy that answers the GETs of keys ending in each `suffix` as `fault` says: an
    /// HTTP status (`"416"`, `"400"`, `"403"` SignatureDoesNotMatch: an S3 error body; with
    /// `/SECS` only for SECS seconds after its first answer) or `"norange"` (the request goes on
    /// without its `Range` header, so the server answers 200 with the whole object, as a
    /// proxy that drops Range does), `"cut"` (the first GET whose path and query hold the
    /// text gets half its body, then the connection closes) or `"cutrange"` (the same for
    /// the first such GET with a `Range`). Its log counts the faults as `INJECTED` lines.
    pub fn faults_proxy(&self, faults: &[(&str, &str)], log: &Path) -> Proxy {
        self.launch_proxy(free_port(), 0, 0, faults, log)
    }

    fn launch_proxy(
        &self,
        port: u16,
        every: u32,
        delay_ms: u32,
        faults: &[(&str, &str)],
        log: &Path,
    ) -> Proxy {
        let faults: serde_json::Map<String, serde_json::Value> = (faults.iter())
            .map(|(suffix, fault)| (suffix.to_string(), (*fault).into()))
            .collect();
        let mut child = Command::new(&self.python)
            .args(["-c", PROXY, &port.to_string(), &self.port.to_string()])
            .args([every.to_string(), delay_ms.to_string()])
            .arg(serde_json::Value::Object(faults).to_string())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        wait_listening(port, &mut child, "the 503 proxy");
        Proxy {
            child,
            port,
            log: log.to_path_buf(),
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The 503-injecting proxy of [`S3Server::faulty_proxy`].
pub struct Proxy {
    child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Proxy {
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn injected(&self) -> usize {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        log.lines().filter(|l| l.contains("INJECTED")).count()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const UPLOAD: &str = r#"
import os, sys, boto3
endpoint, bucket, prefix, root = sys.argv[1:5]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
s3.create_bucket(Bucket=bucket)
for dirpath, _, files in os.walk(root):
    for f in files:
        path = os.path.join(dirpath, f)
        rel = os.path.relpath(path, root)
        s3.upload_file(path, bucket, prefix + "/" + rel if prefix else rel)
"#;

const PUT: &str = r#"
import sys, boto3
endpoint, bucket, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
for key, hex in zip(rest[::2], rest[1::2]):
    s3.put_object(Bucket=bucket, Key=key, Body=bytes.fromhex(hex))
"#;

/// Forwards every request to the server, but answers every N-th GET of an object (a path
/// with a key, no query) with 503 SlowDown, as S3 does under load, and delays each such GET;
/// GETs of keys ending in a fault's suffix get that fault (a status, or Range dropped); a
/// `cut` fault (any GET whose path and query hold the text) or `cutrange` (such a GET with
/// `Range`) sends the first such answer's head and half its body, then closes the connection.
const PROXY: &str = r#"
import http.client, json, socket, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import time
port, upstream, every, delay = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]) / 1000
faults = json.loads(sys.argv[5])
codes = {"416": b"InvalidRange", "400": b"InvalidArgument", "403": b"SignatureDoesNotMatch"}
first_hit = {}
count = [0]
done = set()
lock = threading.Lock()
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def handle_any(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        fault = None
        if self.command == "GET" and "?" not in self.path:
            fault = next((f for s, f in faults.items() if self.path.endswith(s) and not f.startswith("cut")), None)
        if fault is not None and "/" in fault:
            fault, secs = fault.split("/")
            with lock:
                since = time.time() - first_hit.setdefault(secs, time.time())
            if since > float(secs):
                fault = None
        cut = None
        if self.command == "GET":
            with lock:
                for s, f in faults.items():
                    wanted = f == "cut" or (f == "cutrange" and "Range" in self.headers)
                    if wanted and s in self.path and s not in done:
                        done.add(s)
                        cut = s
                        break
        if fault is not None and fault != "norange":
            sys.stderr.write("INJECTED %s %s\n" % (fault, self.path))
            sys.stderr.flush()
            msg = b"<Error><Code>" + codes.get(fault, b"Fault") + b"</Code><Message>injected</Message></Error>"
            self.send_response(int(fault))
            self.send_header("Content-Length", str(len(msg)))
            self.send_header("Content-Type", "application/xml")
            self.end_headers()
            self.wfile.write(msg)
            return
        if fault == "norange" and "Range" in self.headers:
            sys.stderr.write("INJECTED norange %s\n" % self.path)
            sys.stderr.flush()
            del self.headers["Range"]
        if self.command == "GET" and "?" not in self.path and self.path.count("/") >= 2:
            time.sleep(delay)
            with lock:
                count[0] += 1
                fail = every > 0 and count[0] % every == 0
            if fail:
                sys.stderr.write("INJECTED 503 %s\n" % self.path)
                sys.stderr.flush()
                msg = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
                self.send_response(503)
                self.send_header("Content-Length", str(len(msg)))
                self.send_header("Content-Type", "application/xml")
                self.end_headers()
                self.wfile.write(msg)
                return
        conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=30)
        headers = {k: v for k, v in self.headers.items()}
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        if cut is not None:
            self.cut_off(resp, data)
            conn.close()
            return
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        conn.close()
    def cut_off(self, resp, data):
        sys.stderr.write("INJECTED cut %s %d of %d bytes\n" % (self.path, len(data) // 2, len(data)))
        sys.stderr.flush()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2])
        self.wfile.flush()
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)
    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = handle_any
    def log_message(self, *args):
        pass
ThreadingHTTPServer.allow_reuse_address = True
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"#;
