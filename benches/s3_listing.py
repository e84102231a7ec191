"""Rank 0's listing of a bucket of many objects: time and memory (the target: 1M objects in
reasonable time and memory).

No S3 server at hand lists a million objects quickly (moto takes tens of minutes to be
filled; s3s-fs walks its whole folder for every page: 119 s a page at 1M), so this starts a
synthetic one: a standard-library HTTP server on 127.0.0.1 answering ListObjectsV2 pages of
1,000 keys (`PREFIX/cNNNN/NNNNNNN.jpg`, CLASSES folders) from arithmetic, and GETs of any
key with a body of one byte (every object is listed with size 1: a zero-byte key takes
the listing's slower path for folder markers, which real datasets rarely have). Its own time per page is printed, so the client's share is known.
Then one `shufflefs mount --source s3://big/train` (one rank, no MPI) is timed until the
command returns (the bucket check, the listing, the index and the mount), and the daemon's
peak resident memory (VmHWM) is read right after; the mount is then taken down.

The listing past the first page is cut into ranges of class folders listed at once
(`crates/shufflefs-store/src/dataset/s3/ranges.rs`), so the server also answers `delimiter=/` (the class folders)
and `start-after`; LATENCY_MS makes each page wait as S3's do (tens of ms), which is what
the ranges win back. Binaries given as arguments are run in turn, ROUNDS times (an old and
a new build alternated in one run).

    python3 benches/s3_listing.py            # 1,000,000 objects
    OBJECTS=100000 python3 benches/s3_listing.py
    LATENCY_MS=30 ROUNDS=2 python3 benches/s3_listing.py OLD_BIN NEW_BIN

Environment: SHUFFLEFS (binary when none is given; default the release build, else the
debug one), OBJECTS (1000000), CLASSES (1000), FORMAT (imagefolder or tree), LATENCY_MS
(0), ROUNDS (1).
"""
import bisect
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

SHUFFLEFS = os.environ.get("SHUFFLEFS") or next(
    (b for b in ("target/release/shufflefs", "target/debug/shufflefs") if os.path.exists(b)),
    "shufflefs")
OBJECTS = int(os.environ.get("OBJECTS", 1_000_000))
CLASSES = int(os.environ.get("CLASSES", 1000))
FORMAT = os.environ.get("FORMAT", "imagefolder")
# Seconds each listing page waits before its answer: S3 answers a page in tens of ms.
LATENCY = float(os.environ.get("LATENCY_MS", 0)) / 1000
BUCKET, PREFIX, PAGE = "big", "train", 1000
ETAG = "&quot;d41d8cd98f00b204e9800998ecf8427e&quot;"
served = {"pages": 0, "seconds": 0.0, "gets": 0}


def key(i):
    return f"{PREFIX}/c{i % CLASSES:04}/{i:07}.jpg"


# Keys in byte order, as S3 lists them: by class folder, then by name. Class c holds the
# objects c, c + CLASSES, ...; position p of the listing is found by arithmetic (no list
# of every key: 10^7 keys would be gigabytes of Python objects).
PER_CLASS = [len(range(c, OBJECTS, CLASSES)) for c in range(CLASSES)]
CLASS_START = []
_at = 0
for _n in PER_CLASS:
    CLASS_START.append(_at)
    _at += _n


def at(p):
    """The object index at listing position p."""
    c = bisect.bisect_right(CLASS_START, p) - 1
    return c + (p - CLASS_START[c]) * CLASSES


def after(start_after):
    """The listing position of the first key after `start_after` (bisect over positions)."""
    lo, hi = 0, OBJECTS
    while lo < hi:
        mid = (lo + hi) // 2
        if key(at(mid)) <= start_after:
            lo = mid + 1
        else:
            hi = mid
    return lo


def head(max_keys, truncated):
    return ['<?xml version="1.0" encoding="UTF-8"?>',
            '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">',
            f"<Name>{BUCKET}</Name><Prefix>{PREFIX}/</Prefix>",
            f"<MaxKeys>{max_keys}</MaxKeys><IsTruncated>{str(truncated).lower()}</IsTruncated>"]


def page(start, max_keys):
    end = min(start + max_keys, OBJECTS)
    truncated = end < OBJECTS
    parts = head(max_keys, truncated)
    if truncated:
        parts.append(f"<NextContinuationToken>{end}</NextContinuationToken>")
    for p in range(start, end):
        parts.append(f"<Contents><Key>{key(at(p))}</Key><LastModified>2026-11-25T00:00:00.000Z"
                     f"</LastModified><ETag>{ETAG}</ETag><Size>1</Size>"
                     "<StorageClass>STANDARD</StorageClass></Contents>")
    parts.append("</ListBucketResult>")
    return "".join(parts).encode()


def folders(start, max_keys):
    """A `delimiter=/` page: the class folders from class `start` on (no direct objects)."""
    end = min(start + max_keys, CLASSES)
    truncated = end < CLASSES
    parts = head(max_keys, truncated)
    if truncated:
        parts.append(f"<NextContinuationToken>f{end}</NextContinuationToken>")
    for c in range(start, end):
        parts.append(f"<CommonPrefixes><Prefix>{PREFIX}/c{c:04}/</Prefix></CommonPrefixes>")
    parts.append("</ListBucketResult>")
    return "".join(parts).encode()


def answer(query):
    """A ListObjectsV2 page for `query` (continuation token, start-after, delimiter)."""
    max_keys = min(int(query.get("max-keys", [PAGE])[0]), PAGE)
    token = query.get("continuation-token", [None])[0]
    start_after = query.get("start-after", [None])[0]
    if "delimiter" in query:
        if token is not None:
            return folders(int(token[1:]), max_keys)
        first = 0 if start_after is None else next(
            (c for c in range(CLASSES) if f"{PREFIX}/c{c:04}/" > start_after), CLASSES)
        return folders(first, max_keys)
    if token is not None:
        return page(int(token), max_keys)
    return page(0 if start_after is None else after(start_after), max_keys)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, body, code=200, head=False):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", '"d41d8cd98f00b204e9800998ecf8427e"')
        self.send_header("Last-Modified", "Wed, 25 Nov 2026 00:00:00 GMT")
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def do_HEAD(self):
        self.reply(b"", head=True)

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        if "list-type" in query:
            started = time.monotonic()
            body = answer(query)
            served["pages"] += 1
            served["seconds"] += time.monotonic() - started
            time.sleep(LATENCY)
            return self.reply(body)
        served["gets"] += 1
        self.reply(b"x")


def peak_rss_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def mount_once(binary, endpoint):
    """One mount of the bucket by `binary`: seconds until it returned, list pages, peak RSS."""
    env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, AWS_ALLOW_HTTP="true",
               AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1")
    work = tempfile.mkdtemp(prefix="sfs-s3-list-")
    mnt, cache = os.path.join(work, "mnt"), os.path.join(work, "cache")
    served.update(pages=0, seconds=0.0)
    started = time.monotonic()
    subprocess.run([binary, "mount", "--source", f"s3://{BUCKET}/{PREFIX}", "--cache", cache,
                    "--format", FORMAT, "--fraction", "0", "--staging-threads", "1", mnt],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    elapsed = time.monotonic() - started
    try:
        status = json.load(open(os.path.join(mnt, ".shufflefs", "status")))
        peak = peak_rss_kb(status["pid"])
        samples = status["samples"]
    finally:
        subprocess.run([binary, "unmount", mnt], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", work])
    print(f"{OBJECTS} objects ({FORMAT}, {binary}): mount returned after {elapsed:.2f} s, "
          f"{served['pages']} list pages (the synthetic server's own time: "
          f"{served['seconds']:.2f} s, {LATENCY * 1000:.0f} ms wait a page), daemon peak RSS "
          f"{peak / 1024:.0f} MiB, {samples} samples", flush=True)
    assert samples == OBJECTS, samples
    return elapsed


def main():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    binaries = sys.argv[1:] or [SHUFFLEFS]
    times = {b: [] for b in binaries}
    for _ in range(int(os.environ.get("ROUNDS", 1))):
        for b in binaries:
            times[b].append(mount_once(b, endpoint))
    for b, t in times.items():
        print(f"{b}: mount returned after {', '.join(f'{x:.2f}' for x in t)} s")


if __name__ == "__main__":
    sys.exit(main())
