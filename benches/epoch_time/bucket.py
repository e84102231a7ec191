"""The benchmark's bucket (`--store-kind s3`): an S3-compatible server on the cluster's storage
host serving the store folder's three forms as objects, so that shufflefs (`--source s3://`),
the global baseline (a thread pool of GETs), mosaic (`remote=s3://`) and litdata
(`input_dir=s3://`) all read the same bytes through the same link the sshfs store uses.

Two servers, the first one found:
  s3s-fs   (crates.io `s3s-fs`, a Rust binary; `--s3s-fs PATH`, else `s3s-fs` on PATH or in
           ~/.cargo/bin) serves ROOT/BUCKET/KEY straight from a folder: ROOT is the store
           folder's parent and BUCKET its name (`store`), so the objects are the files already
           there (`imagefolder/...`, `mds/...`, `litdata/...`) and nothing is uploaded.
  moto     (`python -m moto.server` from the venv, as the tests use) keeps objects in memory:
           the three forms are uploaded once from the root namespace before the first row
           (not counted: the counters only look at what the storage host sends).
Either runs inside the storage host's namespaces (`shufflefs-cluster exec NAME store`), so
what it sends leaves through the storage host's link and counts as store bytes exactly as
sshfs's reads do. Clients reach it at the storage host's address; the AWS variables of
`env()` point boto3, mosaic (`S3_ENDPOINT_URL`), litdata and shufflefs at it.
"""
import os
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

KEY, SECRET = "epochtime", "epochtime-secret"
FORMS = ("imagefolder", "mds", "litdata")


def find_s3s_fs(explicit):
    """The s3s-fs binary to use, or None (then moto)."""
    for cand in (explicit, shutil.which("s3s-fs"), os.path.expanduser("~/.cargo/bin/s3s-fs")):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def env_for(endpoint):
    """The variables that point every client at `endpoint`: the AWS SDKs and object_store
    (shufflefs) read AWS_ENDPOINT_URL, mosaic reads S3_ENDPOINT_URL, obstore (litdata's
    chunk GETs) needs AWS_ALLOW_HTTP for an http:// endpoint."""
    return {"AWS_ENDPOINT_URL": endpoint, "S3_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}


class Bucket:
    """The server on the storage host (started by `start`, stopped by `stop`)."""

    def __init__(self, hosts, store_dir, s3s_fs, logdir, port=9000):
        self.hosts, self.store_dir, self.logdir, self.port = hosts, store_dir, logdir, port
        self.name = os.path.basename(os.path.normpath(store_dir))
        self.s3s_fs = find_s3s_fs(s3s_fs)
        self.server = "s3s-fs" if self.s3s_fs else "moto"
        self.addr = hosts.addr(hosts.server_host)
        self.proc = None

    @property
    def endpoint(self):
        return f"http://{self.addr}:{self.port}"

    @property
    def root(self):
        """s3://BUCKET, what the clients get as --bucket."""
        return f"s3://{self.name}"

    def url(self, form):
        """s3://BUCKET/FORM: where `form` (imagefolder, mds, litdata) is in the bucket."""
        return f"s3://{self.name}/{form}"

    def env(self):
        return env_for(self.endpoint)

    def start(self, log):
        if self.s3s_fs:
            argv = [self.s3s_fs, "--host", self.addr, "--port", str(self.port), "--access-key", KEY,
                    "--secret-key", SECRET, os.path.dirname(os.path.normpath(self.store_dir))]
        else:
            argv = [sys.executable, "-m", "moto.server", "-H", self.addr, "-p", str(self.port)]
        logf = open(os.path.join(self.logdir, f"{self.server}.log"), "w")
        self.proc = self.hosts.popen(self.hosts.server_host, argv, stdout=logf, stderr=subprocess.STDOUT)
        self._wait_listening()
        if not self.s3s_fs:
            t = time.time()
            self._upload()
            log(f"uploaded the store to moto in {time.time() - t:.1f} s")
        self.check()
        log(f"bucket {self.root} served by {self.server} at {self.endpoint}")

    def _wait_listening(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"epoch_time: {self.server} exited ({self.proc.returncode}), see logs/{self.server}.log")
            try:
                socket.create_connection((self.addr, self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        raise SystemExit(f"epoch_time: {self.server} did not listen on {self.endpoint} in {timeout} s")

    def client(self):
        import boto3

        e = self.env()
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=e["AWS_REGION"],
                            aws_access_key_id=KEY, aws_secret_access_key=SECRET)

    def _files(self):
        for form in FORMS:
            base = os.path.join(self.store_dir, form)
            for top, _dirs, files in os.walk(base):
                for f in files:
                    path = os.path.join(top, f)
                    yield path, os.path.relpath(path, self.store_dir)

    def _upload(self):
        c = self.client()
        c.create_bucket(Bucket=self.name)
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda pk: c.upload_file(pk[0], self.name, pk[1]), self._files()))

    def check(self):
        """Every file of the three forms is listed under its key with its size: the bucket
        holds the same dataset as the folder rows read."""
        want = {key: os.path.getsize(path) for path, key in self._files()}
        got = {}
        pages = self.client().get_paginator("list_objects_v2")
        for form in FORMS:
            for page in pages.paginate(Bucket=self.name, Prefix=form + "/"):
                got.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
        if got != want:
            missing = sorted(set(want) - set(got))[:3]
            odd = sorted(k for k in set(got) & set(want) if got[k] != want[k])[:3]
            raise SystemExit(f"epoch_time: the bucket does not list the store ({len(got)} objects, "
                             f"{len(want)} files; missing {missing}, other sizes {odd})")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
