"""Staging from an S3-compatible bucket: one shufflefs rank vs a boto3 thread pool at the same
concurrency (32 requests in flight), on the same objects and the same server.

Starts moto's server (the venv's, as the tests do) on 127.0.0.1, uploads OBJECTS objects of
OBJECT_BYTES bytes in CLASSES classes, then, REPS times, alternating which goes first:
  boto3     a ThreadPoolExecutor of CONCURRENCY threads GETting every object (get_object().read())
  shufflefs `shufflefs mount --source s3://... --fraction 0` of one rank (no MPI) timed from the
            command until the status says the share is staged (start-up and listing included:
            the time the mount command took is printed too), then unmounted
Reports MB/s per run and the ratio of the medians. The server is moto (one Python process), so
this measures the two clients against the same slow server, not S3's throughput.

Environment: SHUFFLEFS (binary, default target/debug/shufflefs), PYTHON (with moto and boto3,
default the venv's), OBJECTS (400), OBJECT_BYTES (102400), CLASSES (8), CONCURRENCY (32),
REPS (1), BENCH_DIR (a temporary folder).
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

SHUFFLEFS = os.environ.get("SHUFFLEFS", "target/debug/shufflefs")
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


def start_server(log):
    port = free_port()
    server = subprocess.Popen([PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=log)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    raise SystemExit("moto did not start")


def keys():
    return [f"{PREFIX}/class{i % CLASSES}/{i:06}.jpg" for i in range(OBJECTS)]


def upload(s3):
    s3.create_bucket(Bucket=BUCKET)
    body = os.urandom(OBJECT_BYTES)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: s3.put_object(Bucket=BUCKET, Key=k, Body=body), keys()))


def run_boto3(s3):
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        got = sum(pool.map(lambda k: len(s3.get_object(Bucket=BUCKET, Key=k)["Body"].read()),
                           keys()))
    assert got == OBJECTS * OBJECT_BYTES, got
    return time.monotonic() - started


def run_shufflefs(env, work):
    cache, mnt = os.path.join(work, "cache"), os.path.join(work, "mnt")
    shutil.rmtree(cache, ignore_errors=True)
    os.makedirs(mnt, exist_ok=True)
    started = time.monotonic()
    subprocess.run([SHUFFLEFS, "mount", "--source", f"s3://{BUCKET}/{PREFIX}", "--cache", cache,
                    "--fraction", "0", mnt], env=env, check=True, stdout=subprocess.DEVNULL)
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
    server, endpoint = start_server(log)
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
                t = run_boto3(s3) if name == "boto3" else run_shufflefs(env, work)
                times[name].append(t)
                print(f"{name:9} {OBJECTS} x {OBJECT_BYTES} B: {t:6.2f} s, {mb / t:7.1f} MB/s",
                      flush=True)
        ratio = statistics.median(times["boto3"]) / statistics.median(times["shufflefs"])
        print(f"shufflefs / boto3 throughput: {ratio:.2f}x (concurrency {CONCURRENCY})")
    finally:
        server.kill()
        if not os.environ.get("BENCH_DIR"):
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
