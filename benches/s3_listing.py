"""Rank 0's listing of a bucket of many objects: time and memory (issue 31: "1M objects in
reasonable time and memory: measure").

No S3 server at hand lists a million objects quickly (moto takes tens of minutes to be
filled; s3s-fs walks its whole folder for every page: 119 s a page at 1M), so this starts a
synthetic one: a standard-library HTTP server on 127.0.0.1 answering ListObjectsV2 pages of
1,000 keys (`PREFIX/cNNNN/NNNNNNN.jpg`, CLASSES folders) from arithmetic, and GETs of any
key with an empty body. Its own time per page is printed, so the client's share is known.
Then one `shufflefs mount --source s3://big/train` (one rank, no MPI) is timed until the
command returns (the bucket check, the listing, the index and the mount), and the daemon's
peak resident memory (VmHWM) is read right after; the mount is then taken down.

    python3 benches/s3_listing.py            # 1,000,000 objects
    OBJECTS=100000 python3 benches/s3_listing.py

Environment: SHUFFLEFS (binary; default the release build, else the debug one), OBJECTS
(1000000), CLASSES (1000), FORMAT (imagefolder or tree).
"""
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
BUCKET, PREFIX, PAGE = "big", "train", 1000
ETAG = "&quot;d41d8cd98f00b204e9800998ecf8427e&quot;"
served = {"pages": 0, "seconds": 0.0, "gets": 0}


def key(i):
    return f"{PREFIX}/c{i % CLASSES:04}/{i:07}.jpg"


def keys_in_order():
    """Keys in byte order, as S3 lists them: by class folder, then by name."""
    per = [list(range(c, OBJECTS, CLASSES)) for c in range(CLASSES)]
    return [i for ids in per for i in ids]


ORDER = keys_in_order()


def page(start, max_keys):
    end = min(start + max_keys, OBJECTS)
    truncated = end < OBJECTS
    parts = ['<?xml version="1.0" encoding="UTF-8"?>',
             '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">',
             f"<Name>{BUCKET}</Name><Prefix>{PREFIX}/</Prefix><KeyCount>{end - start}</KeyCount>",
             f"<MaxKeys>{max_keys}</MaxKeys><IsTruncated>{str(truncated).lower()}</IsTruncated>"]
    if truncated:
        parts.append(f"<NextContinuationToken>{end}</NextContinuationToken>")
    for i in ORDER[start:end]:
        parts.append(f"<Contents><Key>{key(i)}</Key><LastModified>2026-11-25T00:00:00.000Z"
                     f"</LastModified><ETag>{ETAG}</ETag><Size>0</Size>"
                     "<StorageClass>STANDARD</StorageClass></Contents>")
    parts.append("</ListBucketResult>")
    return "".join(parts).encode()


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
            start = int(query.get("continuation-token", ["0"])[0])
            body = page(start, min(int(query.get("max-keys", [PAGE])[0]), PAGE))
            served["pages"] += 1
            served["seconds"] += time.monotonic() - started
            return self.reply(body)
        served["gets"] += 1
        self.reply(b"")


def peak_rss_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def main():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, AWS_ALLOW_HTTP="true",
               AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1")
    work = tempfile.mkdtemp(prefix="sfs-s3-list-")
    mnt, cache = os.path.join(work, "mnt"), os.path.join(work, "cache")
    started = time.monotonic()
    subprocess.run([SHUFFLEFS, "mount", "--source", f"s3://{BUCKET}/{PREFIX}", "--cache", cache,
                    "--format", FORMAT, "--fraction", "0", "--staging-threads", "1", mnt],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    elapsed = time.monotonic() - started
    try:
        status = json.load(open(os.path.join(mnt, ".shufflefs", "status")))
        pid = status["pid"]
        peak = peak_rss_kb(pid)
        samples = sum(len(files) for _, _, files in os.walk(os.path.join(mnt, "epoch-0")))
    finally:
        subprocess.run([SHUFFLEFS, "unmount", mnt], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", work])
    print(f"{OBJECTS} objects ({FORMAT}, {SHUFFLEFS}): mount returned after {elapsed:.2f} s, "
          f"{served['pages']} list pages (the synthetic server's own time: "
          f"{served['seconds']:.2f} s), daemon peak RSS {peak / 1024:.0f} MiB, epoch-0 shows "
          f"{samples} samples")
    assert samples == OBJECTS, samples


if __name__ == "__main__":
    sys.exit(main())
