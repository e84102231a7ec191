"""Epoch time against global shuffling from the store, local shuffling, mosaicml-streaming and
litdata, on the emulated cluster. One command (benches/epoch_time.sh runs it with
the venv's Python, as root):

    python3 benches/epoch_time.py OUT_DIR [--hosts 4] [--samples 16000] [--mode private] ...

For each loop (raw, decode) and system, every compute host runs one rank of
benches/epoch_time/client.py for --epochs epochs; for shufflefs rows the daemons (release
binary) are started with the cluster's mpirun once every client is up, and the clients read
their mounts. Writes
OUT_DIR/{results.json, table.md, epoch_time.png} and logs per run under OUT_DIR/logs/.
The metric definitions are in benches/epoch_time/metrics.py and docs/performance.md.

Reading from a bucket (`--store-kind s3`, benches/epoch_time/bucket.py): an S3-compatible
server (s3s-fs, else moto) on the storage host serves the store's three forms as the bucket
`store` (the store folder's name); the rows of --systems then read it, named `SYSTEM (bucket)`:
shufflefs mounts `--source s3://store/imagefolder`, global/local GET objects with a thread
pool, mosaic gets `remote=s3://store/mds`, litdata `input_dir=s3://store/litdata`, all with the
same disk budget; --folder-systems adds rows reading the folder as without the option, in the
same run. Store bytes are still what the storage host's link sent.

    python3 benches/epoch_time.py OUT --hosts 4 --samples 4000 --epochs 3 --loops raw \
        --store-kind s3 --folder-systems local,shufflefs-q0.3
"""
import argparse
import json
import os
import platform
import random
import shlex
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "epoch_time"))
import bucket as bucketmod  # noqa: E402
import data  # noqa: E402
import hosts as hostmod  # noqa: E402
import metrics  # noqa: E402

SYSTEMS = ["global", "local", "shufflefs-q0.3", "shufflefs-q1", "shufflefs-coded", "mosaic", "litdata"]
# the rows of --store-kind s3 by default: the "mosaic and litdata read the same bucket",
# shufflefs staging from it and today's way (every epoch GETs its share)
BUCKET_SYSTEMS = ["global", "shufflefs-q0.3", "mosaic", "litdata"]
BUCKET_SUFFIX = " (bucket)"


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="folder for table.md, epoch_time.png, results.json, logs/")
    ap.add_argument("--hosts", type=int, default=4, help="compute hosts, one rank each")
    ap.add_argument("--samples", type=int, default=16000, help="JPEGs in the dataset")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--sample-kb", type=int, default=100)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--q", type=float, default=0.3, help="the disk budget's Q and shufflefs's default row")
    ap.add_argument("--rate", default="1gbit", help="each host's link")
    ap.add_argument("--store-rate", default="1gbit", help="the storage host's link (shared by all)")
    ap.add_argument("--mode", choices=["shared", "private"], default="private")
    ap.add_argument("--disk", help="private mode: each host's local disk size (up --disk)")
    ap.add_argument("--name", default="bnet", help="the emulated cluster's name")
    ap.add_argument("--subnet", default="10.214.61.0/24", help="the cluster's /24 (must be free)")
    ap.add_argument("--scratch", default="/tmp/bn-epoch", help="dataset (store) and shared-mode host folders")
    ap.add_argument("--systems", help=f"comma-separated rows (default: {','.join(SYSTEMS)}; "
                    f"with --store-kind s3: {','.join(BUCKET_SYSTEMS)}, reading the bucket)")
    ap.add_argument("--store-kind", choices=["folder", "s3"], default="folder",
                    help="folder: read the store folder (over sshfs in private mode); s3: an "
                    "S3-compatible server on the storage host serves it as a bucket and the "
                    "--systems rows read that, named `SYSTEM (bucket)`")
    ap.add_argument("--folder-systems", default="",
                    help="with --store-kind s3: rows that read the folder too, in the same run "
                    "(e.g. local,shufflefs-q0.3)")
    ap.add_argument("--s3s-fs", help="the s3s-fs binary (default: s3s-fs on PATH or in "
                    "~/.cargo/bin; without one, moto's server from the venv, uploading the store)")
    ap.add_argument("--loops", default="raw,decode", help="raw, decode or both")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers of the decode loop")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per (system, loop) run")
    ap.add_argument("--prepare-only", action="store_true", help="make the dataset and its MDS and litdata forms, then stop")
    ap.add_argument("--shufflefs", default=os.path.join(ROOT, "target", "release", "shufflefs"))
    a = ap.parse_args()
    if a.systems is None:
        a.systems = ",".join(BUCKET_SYSTEMS if a.store_kind == "s3" else SYSTEMS)
    if a.folder_systems and a.store_kind != "s3":
        ap.error("--folder-systems goes with --store-kind s3")
    if a.store_kind == "s3" and "shufflefs-coded" in a.systems.split(","):
        ap.error("shufflefs-coded has no bucket row (its server reads the folder)")
    return a


def rows(a):
    """(row name, system, reads the bucket) in running order: the folder rows first."""
    out = [(s, s, False) for s in a.folder_systems.split(",") if s]
    bucket = a.store_kind == "s3"
    return out + [(s + (BUCKET_SUFFIX if bucket else ""), s, bucket) for s in a.systems.split(",")]


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Shufflefs:
    """The daemons of one shufflefs row, started with the cluster's mpirun, one compute rank
    per compute host (and for `coded` the server rank on the storage host)."""

    def __init__(self, a, hosts, system, sub, logf, bucket=None):
        self.hosts, self.bin = hosts, a.shufflefs
        t = hosts.local_template()
        self.mnt_t = os.path.join(t, sub, "mnt")
        src = bucket.url("imagefolder") if bucket else os.path.join(hosts.store, "imagefolder")
        for i in hosts.compute:  # the mount point must exist (the daemon can make it, this predates that)
            hosts.run(i, ["mkdir", "-p", self.mount(i)], check=True)
        n = len(hosts.compute)
        compute = ["-np", str(n), "-H", ",".join(hosts.addr(i) for i in hosts.compute)]
        mount = [self.bin, "mount", "--source", src, "--cache", os.path.join(t, sub, "cache"),
                 "--seed", str(a.seed)]
        if system == "shufflefs-coded":
            alpha = (1 + a.q) / n
            # the server on a host of its own (the storage host), reading the dataset there
            serve = [self.bin, "serve", "--source", os.path.join(hosts.server_source(), "imagefolder")]
            coded = [*mount, "--exchange", "coded", "--cache-fraction", f"{alpha:.4f}"]
            args = ["-np", "1", "-H", hosts.addr(hosts.server_host), *serve, ":", *compute, *coded]
        else:
            q = system.split("-q")[1]
            args = [*compute, *mount, "--fraction", q]
        env = bucket.env() if bucket else {}
        # mpirun hands a variable to the ranks only when asked (-x)
        export = [x for name in env for x in ("-x", name)]
        args = ["--mca", "mpi_yield_when_idle", "1", *export, *args, self.mnt_t]
        logf.write("mpirun " + shlex.join(args) + "\n")
        logf.flush()
        self.proc = hosts.mpirun(args, stdout=logf, stderr=subprocess.STDOUT, env={**os.environ, **env})

    @staticmethod
    def mount_path(hosts, sub, i):
        """Compute host i's mount point (as that host sees it)."""
        t = os.path.join(hosts.local_template(), sub, "mnt")
        return t.replace("{rank}", str(hosts.compute.index(i)))

    def mount(self, i):
        return self.mount_path(self.hosts, os.path.basename(os.path.dirname(self.mnt_t)), i)

    def stop(self):
        for i in self.hosts.compute:
            self.hosts.run(i, [self.bin, "unmount", "--timeout", "30", self.mount(i)], capture_output=True)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(10)


def wait_ready(procs, outs, timeout):
    """Waits until every client printed its `ready` line (after its first barrier)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(p.poll() is not None for p in procs):
            return [f"rank {r} exit {p.returncode} before ready" for r, p in enumerate(procs) if p.poll() is not None]
        if all('"what": "ready"' in open(o).read() for o in outs):
            return []
        time.sleep(0.2)
    return [f"clients not ready after {timeout}s"]


def wait_clients(procs, daemons, timeout):
    """Waits for every client; stops early when one fails or the shufflefs job ended (the
    others would wait at a barrier or for the mount until the timeout). Returns what failed."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        codes = [p.poll() for p in procs]
        bad = [f"rank {r} exit {c}" for r, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            return bad
        if all(c == 0 for c in codes):
            return []
        if daemons and daemons.proc.poll() is not None:
            return [f"the shufflefs job exited ({daemons.proc.returncode}) before the clients finished"]
        time.sleep(0.5)
    return [f"timed out after {timeout}s"]


def sub_folder(system, bucket):
    """The row's folder under LOCAL (and its logs' names)."""
    return system.replace(".", "") + ("-s3" if bucket else "")


def run_one(a, hosts, system, loop, budget, mix, logdir, bucket=None):
    """Runs one (system, loop) on every compute host, reading the store folder or `bucket`;
    returns {"summary"} or {"error"}."""
    sub = sub_folder(system, bucket)
    hosts.clean_local(sub)
    env = {**os.environ, **bucket.env()} if bucket else None
    logf = open(os.path.join(logdir, f"{loop}-{sub}.log"), "w")
    sampler = metrics.CounterSampler(hosts)
    daemons = None
    port = random.randrange(20000, 40000)
    procs, outs = [], []
    try:
        for r, i in enumerate(hosts.compute):
            local = os.path.join(hosts.local(i), sub)
            argv = [sys.executable, os.path.join(HERE, "epoch_time", "client.py"),
                    "--system", system.split("-")[0], "--loop", loop, "--rank", str(r),
                    "--world", str(len(hosts.compute)), "--master", f"{hosts.addr(hosts.compute[0])}:{port}",
                    "--epochs", str(a.epochs), "--store", hosts.store, "--local", local,
                    "--budget", str(budget), "--seed", str(a.seed), "--workers", str(a.workers),
                    "--helpers", os.path.join(ROOT, "mount-helpers")]
            if system.startswith("shufflefs"):
                argv += ["--mount", Shufflefs.mount_path(hosts, sub, i)]
            if bucket:
                argv += ["--bucket", bucket.root]
            if system == "mosaic":
                # mosaic keeps its state in /dev/shm under fixed names: give each host its own,
                # as separate machines have (shared mode shares one /dev/shm between hosts)
                argv = ["unshare", "--mount", "--propagation", "slave", "sh", "-c",
                        'mount -t tmpfs -o size=1g tmpfs /dev/shm && exec "$@"', "sh", *argv]
            base = os.path.join(logdir, f"{loop}-{sub}-rank{r}")
            # stdout to a file, not a pipe: a full pipe would stop a rank between two barriers
            outs.append(base + ".out")
            with open(base + ".out", "w") as out, open(base + ".err", "w") as err:
                procs.append(hosts.popen(i, argv, stdout=out, stderr=err, env=env))
        failed = []
        if system.startswith("shufflefs"):
            failed = wait_ready(procs, outs, 300)
            if not failed:
                daemons = Shufflefs(a, hosts, system, sub, logf, bucket)
        failed = failed or wait_clients(procs, daemons, a.timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if daemons:
            daemons.stop()
        sampler.stop()
        logf.close()
    records = [json.loads(line[10:]) for o in outs for line in open(o) if line.startswith("EPOCHTIME ")]
    if failed:
        return {"error": "; ".join(failed) + f" (see logs/{loop}-{sub}-rank*.err)"}
    return {"summary": metrics.summarize(records, sampler, mix)}


def main():
    a = parse()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run `finally`: the cluster goes down
    os.makedirs(os.path.join(a.out, "logs"), exist_ok=True)
    store_dir = os.path.join(a.scratch, "store")
    os.makedirs(a.scratch, exist_ok=True)
    share = a.sample_kb * 1000 * a.samples / a.hosts
    # shards/chunks of the streaming libraries: 64 MB (their default), or 1/8 of the budget
    # so that a small run still holds several
    shard = int(min(64e6, (1 + a.q) * share / 8))
    conversion, total = data.prepare(store_dir, a.samples, a.classes, a.sample_kb, shard, log)
    budget = int((1 + a.q) * total / a.hosts)
    if a.prepare_only:
        log(f"dataset ready in {store_dir}: {total / 1e9:.2f} GB, conversion (s): {conversion}")
        return
    mix = [1.0 / a.classes] * a.classes
    hosts = hostmod.Hosts(a.name, a.hosts, a.mode, a.scratch, a.rate, a.store_rate, store_dir, a.subnet, a.disk)
    commit = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip()
    meta = {"machine": f"{platform.node()}, {os.cpu_count()} cores, {platform.release()}", "commit": commit,
            "command": " ".join(shlex.quote(x) for x in sys.argv), "hosts": a.hosts,
            "samples": a.samples, "dataset_bytes": total, "rate": a.rate, "store_rate": a.store_rate,
            "mode": a.mode, "budget": budget, "q": a.q, "epochs": a.epochs, "shard_bytes": shard,
            "conversion": conversion, "iid_tv": metrics.iid_tv(mix), "store_kind": a.store_kind}
    results = {}
    bucket = None
    hosts.down()
    try:
        log(f"cluster {a.name} up ({a.mode}, {a.hosts} hosts)")
        hosts.up()
        if a.store_kind == "s3":
            bucket = bucketmod.Bucket(hosts, store_dir, a.s3s_fs, os.path.join(a.out, "logs"))
            bucket.start(log)
            meta["bucket"] = f"{bucket.root} on the storage host, served by {bucket.server}"
        for loop in a.loops.split(","):
            results[loop] = {}
            for name, system, from_bucket in rows(a):
                log(f"{loop} / {name} ...")
                b = bucket if from_bucket else None
                res = run_one(a, hosts, system, loop, budget, mix, os.path.join(a.out, "logs"), b)
                results[loop][name] = res
                eps = (res.get("summary") or {}).get("epochs", [])
                log(f"{loop} / {name}: " + (res.get("error") or " ".join(f"{e['wall']:.2f}" for e in eps)))
                metrics.write_report(a.out, meta, results)
                hosts.clean_local(sub_folder(system, b))
    finally:
        if bucket:
            bucket.stop()
        hosts.down()
    metrics.write_report(a.out, meta, results)
    log(f"wrote {a.out}/table.md and {a.out}/epoch_time.png")


if __name__ == "__main__":
    main()
