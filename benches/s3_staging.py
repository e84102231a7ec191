"""Staging from an S3-compatible bucket: one shufflefs rank vs a boto3 thread pool at the same
concurrency (32 requests in flight), on the same objects and the same server.

Starts an S3 server on 127.0.0.1 (SERVER=moto: moto's, from the venv, as the tests do, one
Python process; SERVER=s3s: the `s3s-fs` binary, a Rust server on a folder, much faster:
`cargo install s3s-fs --version 0.14.1 --features binary --locked`, or S3S_FS=PATH), uploads
OBJECTS objects of OBJECT_BYTES bytes in CLASSES classes, then, REPS times, alternating which
goes first:
  boto3     a ThreadPoolExecutor of CONCURRENCY threads downloading every object into a file
            (get_object() streamed to disk, as a downloader does and as staging fills its cache)
  shufflefs `shufflefs mount --source s3://... --fraction 0` of one rank (no MPI) timed from the
            command until the status says the share is staged (start-up and listing included:
            the time the mount command took is printed too), then unmounted
Reports MB/s per run and the ratio of the medians. Both clients read the same server on the
same host, so this compares the clients, not S3's throughput.

MODE=records uploads OBJECTS record shards of OBJECT_BYTES bytes (fixed-size records of
RECORD_BYTES, 4096 by default) and mounts them with `--format records --framing fixed`, so
shufflefs stages them as coalesced ranged GETs of page groups; boto3 GETs the whole shards.

Environment: SHUFFLEFS (binary, default target/release/shufflefs when built, else
target/debug/shufflefs), SERVER (moto), PYTHON (with moto and boto3, default the venv's),
MODE (objects), OBJECTS (400), OBJECT_BYTES (102400), RECORD_BYTES (4096), CLASSES (8),
CONCURRENCY (32), REPS (1), BENCH_DIR (a temporary folder).
"""
import concurrent.futures
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import boto3

SHUFFLEFS = os.environ.get("SHUFFLEFS") or next(
    (b for b in ("target/release/shufflefs", "target/debug/shufflefs") if os.path.exists(b)),
    "shufflefs")
SERVER = os.environ.get("SERVER", "moto")
MODE = os.environ.get("MODE", "objects")
RECORD_BYTES = int(os.environ.get("RECORD_BYTES", 4096))
PYTHON = os.environ.get("PYTHON", os.path.expanduser("~/.cache/shufflefs/venv/bin/python"))
OBJECTS = int(os.environ.get("OBJECTS", 400))
OBJECT_BYTES = int(os.environ.get("OBJECT_BYTES", 102400))
CLASSES = int(os.environ.get("CLASSES", 8))
CONCURRENCY = int(os.environ.get("CONCURRENCY", 32))
REPS = int(os.environ.get("REPS", 1))
BUCKET, PREFIX = "bench", "train"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(port, work):
    if SERVER == "moto":
        return [PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    if SERVER == "s3s":
        binary = os.environ.get("S3S_FS") or shutil.which("s3s-fs")
        if not binary:
            raise SystemExit("SERVER=s3s needs s3s-fs: cargo install s3s-fs --version 0.14.1 "
                             "--features binary --locked (or S3S_FS=PATH)")
        root = os.path.join(work, "s3s-root")
        os.makedirs(root, exist_ok=True)
        return [binary, "--host", "127.0.0.1", "--port", str(port), "--access-key", "bench",
                "--secret-key", "bench", root]
    raise SystemExit(f"SERVER={SERVER}: moto or s3s")


def start_server(log, work):
    port = free_port()
    server = subprocess.Popen(server_command(port, work), stdout=subprocess.DEVNULL, stderr=log)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{SERVER} did not start")


def keys():
    if MODE == "records":
        return [f"{PREFIX}/shard-{i:05}.bin" for i in range(OBJECTS)]
    return [f"{PREFIX}/class{i % CLASSES}/{i:06}.jpg" for i in range(OBJECTS)]


def mount_args():
    if MODE == "records":
        return ["--format", "records", "--framing", "fixed", "--record-size", str(RECORD_BYTES)]
    return []


def upload(s3):
    s3.create_bucket(Bucket=BUCKET)
    body = os.urandom(OBJECT_BYTES)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: s3.put_object(Bucket=BUCKET, Key=k, Body=body), keys()))


def run_boto3(s3, work):
    """Downloads every object into a file under work/boto3 (as a downloader would, and as
    shufflefs stages into its cache on the same disk); the time until the last file is
    written."""
    out = os.path.join(work, "boto3")
    shutil.rmtree(out, ignore_errors=True)

    def download(key):
        path = os.path.join(out, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        body = s3.get_object(Bucket=BUCKET, Key=key)["Body"]
        with open(path, "wb") as f:
            shutil.copyfileobj(body, f, 1 << 20)
            return f.tell()

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        got = sum(pool.map(download, keys()))
    assert got == OBJECTS * OBJECT_BYTES, got
    elapsed = time.monotonic() - started
    shutil.rmtree(out, ignore_errors=True)
    return elapsed


def run_shufflefs(env, work):
    cache, mnt = os.path.join(work, "cache"), os.path.join(work, "mnt")
    shutil.rmtree(cache, ignore_errors=True)
    os.makedirs(mnt, exist_ok=True)
    started = time.monotonic()
    subprocess.run([SHUFFLEFS, "mount", "--source", f"s3://{BUCKET}/{PREFIX}", "--cache", cache,
                    "--fraction", "0", *mount_args(), mnt], env=env, check=True, stdout=subprocess.DEVNULL)
    mounted = time.monotonic() - started
    try:
        while True:
            status = json.load(open(os.path.join(mnt, ".shufflefs/status")))
            staging = status["staging"]
            if staging["files_total"] and staging["files_done"] == staging["files_total"]:
                break
            time.sleep(0.02)
        elapsed = time.monotonic() - started
        assert staging["bytes_done"] == OBJECTS * OBJECT_BYTES, staging
        print(f"          (the mount command returned after {mounted:.2f} s: start-up, bucket "
              "check, listing, cache; staging had begun)", flush=True)
        return elapsed
    finally:
        subprocess.run([SHUFFLEFS, "unmount", mnt], check=True)


def main():
    work = os.environ.get("BENCH_DIR") or tempfile.mkdtemp(prefix="sfs-s3-bench-")
    log = open(os.path.join(work, "moto.log"), "w")
    server, endpoint = start_server(log, work)
    env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, AWS_ALLOW_HTTP="true",
               AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1")
    os.environ.update(env)
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          config=boto3.session.Config(max_pool_connections=CONCURRENCY))
        upload(s3)
        mb = OBJECTS * OBJECT_BYTES / 1e6
        times = {"boto3": [], "shufflefs": []}
        for rep in range(REPS):
            order = ["boto3", "shufflefs"] if rep % 2 == 0 else ["shufflefs", "boto3"]
            for name in order:
                t = run_boto3(s3, work) if name == "boto3" else run_shufflefs(env, work)
                times[name].append(t)
                print(f"{name:9} {OBJECTS} x {OBJECT_BYTES} B ({MODE}, {SERVER}): {t:6.2f} s, "
                      f"{mb / t:7.1f} MB/s",
                      flush=True)
        ratio = statistics.median(times["boto3"]) / statistics.median(times["shufflefs"])
        print(f"shufflefs / boto3 throughput: {ratio:.2f}x (concurrency {CONCURRENCY}, "
              f"{SHUFFLEFS})")
    finally:
        server.kill()
        if not os.environ.get("BENCH_DIR"):
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
