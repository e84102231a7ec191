"""Read-path benchmarks of one shufflefs rank against native reads, run by benches/read_path.sh.

Each benchmark mounts a fresh single-rank daemon (no MPI), waits until its share is staged,
then measures the same work through MOUNT/epoch-0 and natively, back to back, REPS times
(alternating which goes first), and reports medians and their ratio. "cold" runs drop the page,
dentry and inode caches first (sync; echo 3 > /proc/sys/vm/drop_caches), which also drops the
kernel's cache of the FUSE mount; "warm" runs follow an unmeasured warm-up pass.

  small   SMALL_FILES files of 100-120 KiB (random sizes) in SMALL_CLASSES classes, read whole in
          one random order by 4 threads (1 MiB readinto). Native: the very same bytes, the cache
          files CACHE/samples/<id> the mount passes through to.
  stream  one STREAM_BYTES file read sequentially in 1 MiB reads. Native: its cache file.
  scan    torchvision ImageFolder's listing (find_classes + make_dataset, replicated below since
          torchvision is not needed) of SCAN_FILES empty files in SCAN_CLASSES classes; and the
          same walk plus os.stat of every sample. Native: the source tree (same shape).
  ready   a READY_FILES empty-file source in READY_CLASSES classes: time from starting the
          daemon until MOUNT/.shufflefs/status answers with the manifest (it is built before
          the mount exists) and until epoch-0 lists, vs `find SRC -type f | wc -l`, cold and
          warm; the daemon's peak RSS (VmHWM) per sample; and, if READY_STAGE=1, the time to
          stage (create) every cache file, stopped after READY_STAGE_TIMEOUT seconds.

Environment: SHUFFLEFS (binary), BENCH_DIR, REPS, BENCHES ("small stream scan ready"),
READ_PATHS ("auto passthrough": the --read-path modes small and stream compare; auto is the
default, which the status's read_path resolves), MOUNT_ARGS (more mount options),
SMALL_FILES, SMALL_CLASSES, STREAM_BYTES, SCAN_FILES, SCAN_CLASSES, READY_FILES, READY_CLASSES,
READY_STAGE, READY_STAGE_TIMEOUT, KEEP_DATA (1: keep the datasets for the next run).
"""
import itertools
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "mount-helpers"))
import shufflefs  # noqa: E402

BIN = os.environ["SHUFFLEFS"]
WORK = os.environ.get("BENCH_DIR", "/tmp/shufflefs-read-bench")
REPS = int(os.environ.get("REPS", "3"))
# The read paths the small-file and stream benchmarks compare (`shufflefs mount --read-path`).
READ_PATHS = os.environ.get("READ_PATHS", "auto passthrough").split()
KIB = 1024
MIB = 1024 * KIB


def env_int(name, default):
    return int(os.environ.get(name, default))


# ---------------------------------------------------------------------------------------------
# Helpers

def log(msg):
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        log("cannot drop the page cache (not root): 'cold' runs are warm")


def class_name(c):
    return f"n{c:08d}"


def sample_name(c, j):
    return f"n{c:08d}_{j}.JPEG"  # ImageNet-like names (20 bytes)


def make_tree(root, classes, per_class_sizes, content):
    """root/<class>/<name> files; per_class_sizes[c] is the list of sizes of class c."""
    marker = root + ".done"
    spec = json.dumps([len(s) for s in per_class_sizes] + [sum(map(sum, per_class_sizes))])
    if os.path.exists(marker) and open(marker).read() == spec:
        log(f"reusing {root}")
        return
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    for c in range(classes):
        d = os.path.join(root, class_name(c))
        os.makedirs(d)
        for j, size in enumerate(per_class_sizes[c]):
            fd = os.open(os.path.join(d, sample_name(c, j)), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            if size:
                os.write(fd, content(size))
            os.close(fd)
    os.sync()
    with open(marker, "w") as f:
        f.write(spec)
    log(f"made {root}: {sum(map(len, per_class_sizes))} files in {time.perf_counter() - t0:.1f} s")


def remove_tree(root):
    shutil.rmtree(root, ignore_errors=True)
    try:
        os.remove(root + ".done")
    except FileNotFoundError:
        pass


class Daemon:
    """One foreground shufflefs daemon; stderr (its log) kept in a file."""

    def __init__(self, src, cache, mnt, fresh_cache=True, read_path=None):
        if fresh_cache:
            shutil.rmtree(cache, ignore_errors=True)
        os.makedirs(mnt, exist_ok=True)
        self.src, self.cache, self.mnt = src, cache, mnt
        self.logfile = cache.rstrip("/") + ".log"
        self.t_start = time.perf_counter()
        self.proc = subprocess.Popen(
            [BIN, "mount", "--source", src, "--cache", cache, "--seed", "1", "--foreground", mnt]
            + (["--read-path", read_path] if read_path not in (None, "auto") else [])
            + os.environ.get("MOUNT_ARGS", "").split(),
            stdout=subprocess.DEVNULL, stderr=open(self.logfile, "w"))

    def wait_answering(self, poll=0.002, timeout=3600):
        """Seconds from the start until the status file answers; returns (seconds, status)."""
        path = os.path.join(self.mnt, ".shufflefs", "status")
        deadline = time.perf_counter() + timeout
        while True:
            try:
                with open(path) as f:
                    st = json.load(f)
                return time.perf_counter() - self.t_start, st
            except (OSError, ValueError):
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"shufflefs exited with {self.proc.returncode}; log: {open(self.logfile).read()[-2000:]}")
            if time.perf_counter() > deadline:
                raise TimeoutError("mount never answered")
            time.sleep(poll)

    def wait_settled(self):
        """Until the share is staged and the background exchange into epoch 1 is done."""
        self.wait_answering(poll=0.05)
        st = shufflefs.wait_ready(self.mnt, timeout=7200, staged=True)
        while not any(x["target_epoch"] == 1 and x["state"] == "done" for x in st["exchange"]):
            time.sleep(0.1)
            st = shufflefs.status(self.mnt)
        return st

    def requests(self):
        """The kernel requests this mount answered so far, by kind (the status's)."""
        return shufflefs.status(self.mnt)["fuse_requests"]

    def read_path(self):
        """The read path the mount uses, as the status says (what `auto` chose)."""
        return shufflefs.status(self.mnt)["read_path"]["path"]

    def passthrough(self):
        m = re.findall(r"passthrough=(\w+)", open(self.logfile).read())
        return m[-1] if m else "?"

    def scan_secs(self):
        m = re.findall(r"source scanned .*secs=([0-9.e+-]+)", open(self.logfile).read())
        return float(m[-1]) if m else float("nan")

    def vm_hwm(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return 0

    def stop(self):
        if self.proc.poll() is None:
            r = subprocess.run([BIN, "unmount", self.mnt], capture_output=True, text=True)
            if r.returncode != 0:
                subprocess.run(["fusermount3", "-u", "-z", self.mnt], capture_output=True)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def sample_paths(src, mnt, cache):
    """(mount path, native cache path) of every sample: ids are indices in (class, name) order."""
    out = []
    for c in sorted(os.listdir(src)):
        for n in sorted(os.listdir(os.path.join(src, c))):
            out.append(os.path.join(mnt, "epoch-0", c, n))
    native = [os.path.join(cache, "samples", str(i)) for i in range(len(out))]
    # Sanity: the mount's inode number of a sample carries its id in the low 32 bits.
    for i in random.Random(0).sample(range(len(out)), min(20, len(out))):
        st = os.stat(out[i])
        assert st.st_ino & 0xFFFFFFFF == i and st.st_size == os.stat(native[i]).st_size, out[i]
    return out, native


def read_all(paths, threads):
    """Reads every file whole, `threads` at a time, in the given order; returns seconds."""
    it = iter(paths)
    total = [0]
    lock = threading.Lock()

    def worker():
        buf = bytearray(MIB)
        view = memoryview(buf)
        n = 0
        for p in it:  # next() on a list iterator is atomic under the GIL
            with open(p, "rb", buffering=0) as f:
                while True:
                    k = f.readinto(view)
                    if not k:
                        break
                    n += k
        with lock:
            total[0] += n

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0, total[0]


def requests_per_file(before, after, files):
    """FUSE requests per file read between two status snapshots, e.g. `2.0 (open 1.0,
    release 1.0)`: the round trips a read of a file cost."""
    per = {op: (after[op] - before.get(op, 0)) / files for op in after}
    parts = ", ".join(f"{op} {v:.2f}" for op, v in sorted(per.items()) if v >= 0.005)
    return f"{sum(per.values()):.2f}" + (f" ({parts})" if parts else "")


def paired(native_fn, mount_fn, cold):
    """REPS runs of each, alternating which goes first; returns (native runs, mount runs)."""
    nat, mnt = [], []
    if not cold:
        native_fn()
        mount_fn()
    for r in range(REPS):
        order = [(native_fn, nat), (mount_fn, mnt)]
        if r % 2:
            order.reverse()
        for fn, acc in order:
            if cold:
                drop_caches()
            acc.append(fn())
    return nat, mnt


ROWS = []


def row(bench, case, unit, nat, mnt, ratio, target, higher_is_better):
    ok = ratio >= target if higher_is_better else ratio <= target
    ROWS.append((bench, case, f"{nat} {unit}", f"{mnt} {unit}", f"{ratio:.2f}x",
                 f"{'>=' if higher_is_better else '<='} {target}x", "yes" if ok else "**no**"))


def spread(xs, fmt="{:.0f}"):
    return "/".join(fmt.format(x) for x in xs)


# ---------------------------------------------------------------------------------------------
# Benchmarks

def bench_small():
    n, classes = env_int("SMALL_FILES", 20000), env_int("SMALL_CLASSES", 10)
    rng = random.Random(1)
    per = [[] for _ in range(classes)]
    for i in range(n):
        per[i % classes].append(rng.randint(100 * KIB, 120 * KIB))
    src = os.path.join(WORK, "small-src")
    make_tree(src, classes, per, lambda size: rng.randbytes(size))
    passthrough = "?"
    for i, mode in enumerate(READ_PATHS):
        # The second mode reuses the cache the first one staged.
        d = Daemon(src, os.path.join(WORK, "small-cache"), os.path.join(WORK, "small-mnt"),
                   fresh_cache=i == 0, read_path=mode)
        try:
            d.wait_settled()
            mount_paths, native_paths = sample_paths(src, d.mnt, d.cache)
            order = list(range(len(mount_paths)))
            random.Random(2).shuffle(order)
            mp = [mount_paths[i] for i in order]
            npaths = [native_paths[i] for i in order]
            name = mode if mode != "auto" else f"auto (chose {d.read_path()})"
            for cold in (True, False):
                before = d.requests()
                nat, mnt = paired(lambda: read_all(npaths, 4)[0], lambda: read_all(mp, 4)[0], cold)
                per_file = requests_per_file(before, d.requests(), n * (REPS + (0 if cold else 1)))
                fn, fm = [n / t for t in nat], [n / t for t in mnt]
                a, b = statistics.median(fn), statistics.median(fm)
                case = f"{'cold' if cold else 'warm'}; requests/file {per_file}"
                row(f"small files, {n} x 100-120 KiB, 4 threads, random order, --read-path {name}",
                    case, "files/s", f"{a:.0f}", f"{b:.0f}", b / a, 0.9 if cold else 0.95, True)
                log(f"small {name} {'cold' if cold else 'warm'} files/s native {spread(fn)} mount {spread(fm)}; requests/file {per_file}")
            if mode == "passthrough":
                passthrough = d.passthrough()
        finally:
            d.stop()
    return passthrough


def bench_stream():
    size = env_int("STREAM_BYTES", 1 << 30)
    src = os.path.join(WORK, "stream-src")

    def content(sz):
        block = os.urandom(MIB)
        return b"".join(block for _ in range(sz // MIB)) + block[: sz % MIB]

    make_tree(src, 1, [[size]], content)
    for i, mode in enumerate(READ_PATHS):
        d = Daemon(src, os.path.join(WORK, "stream-cache"), os.path.join(WORK, "stream-mnt"),
                   fresh_cache=i == 0, read_path=mode)
        try:
            d.wait_settled()
            name = mode if mode != "auto" else f"auto (chose {d.read_path()})"
            (mp,), (np_,) = sample_paths(src, d.mnt, d.cache)
            for cold in (True, False):
                nat, mnt = paired(lambda: read_all([np_], 1)[0], lambda: read_all([mp], 1)[0], cold)
                rn, rm = [size / MIB / t for t in nat], [size / MIB / t for t in mnt]
                a, b = statistics.median(rn), statistics.median(rm)
                row(f"one {size / MIB:.0f} MiB file streamed, 1 MiB reads, --read-path {name}",
                    "cold" if cold else "warm", "MiB/s", f"{a:.0f}", f"{b:.0f}", b / a, 1.0, True)
                log(f"stream {name} {'cold' if cold else 'warm'} MiB/s native {spread(rn)} mount {spread(rm)}")
        finally:
            d.stop()


IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def find_classes(directory):
    # torchvision.datasets.folder.find_classes
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    return classes, {cls_name: i for i, cls_name in enumerate(classes)}


def make_dataset(directory, class_to_idx, extensions=IMG_EXTENSIONS, stat_each=False):
    # torchvision.datasets.folder.make_dataset (extensions given, is_valid_file not, so
    # has_file_allowed_extension is filename.lower().endswith(extensions)); stat_each adds
    # an os.stat of every sample, the loaders that check sizes or mtimes do.
    instances = []
    for target_class in sorted(class_to_idx.keys()):
        class_index = class_to_idx[target_class]
        target_dir = os.path.join(directory, target_class)
        if not os.path.isdir(target_dir):
            continue
        for root, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(root, fname)
                if path.lower().endswith(extensions):
                    if stat_each:
                        os.stat(path)
                    instances.append((path, class_index))
    return instances


def image_folder_scan(root, stat_each):
    t0 = time.perf_counter()
    _, class_to_idx = find_classes(root)
    samples = make_dataset(root, class_to_idx, stat_each=stat_each)
    return time.perf_counter() - t0, len(samples)


def bench_scan():
    n, classes = env_int("SCAN_FILES", 100000), env_int("SCAN_CLASSES", 100)
    per = [[0] * (n // classes + (1 if c < n % classes else 0)) for c in range(classes)]
    src = os.path.join(WORK, "scan-src")
    make_tree(src, classes, per, None)
    d = Daemon(src, os.path.join(WORK, "scan-cache"), os.path.join(WORK, "scan-mnt"))
    try:
        d.wait_settled()
        view = os.path.join(d.mnt, "epoch-0")
        assert image_folder_scan(view, False)[1] == n == image_folder_scan(src, False)[1]
        for stat_each in (False, True):
            for cold in (True, False):
                nat, mnt = paired(lambda: image_folder_scan(src, stat_each)[0],
                                  lambda: image_folder_scan(view, stat_each)[0], cold)
                a, b = statistics.median(nat), statistics.median(mnt)
                what = "ImageFolder scan" + (" + os.stat of each sample" if stat_each else " (os.walk, as torchvision)")
                row(f"{what}, {n} files", "cold" if cold else "warm", "s", f"{a:.3f}", f"{b:.3f}", b / a, 1.2, False)
                log(f"scan stat={stat_each} {'cold' if cold else 'warm'} s native {spread(nat, '{:.3f}')} mount {spread(mnt, '{:.3f}')}")
    finally:
        d.stop()


def bench_ready():
    n, classes = env_int("READY_FILES", 1000000), env_int("READY_CLASSES", 1000)
    per = [[0] * (n // classes + (1 if c < n % classes else 0)) for c in range(classes)]
    src = os.path.join(WORK, "ready-src")
    make_tree(src, classes, per, None)
    cache, mnt = os.path.join(WORK, "ready-cache"), os.path.join(WORK, "ready-mnt")

    def find():
        t0 = time.perf_counter()
        out = subprocess.run(f"find {src} -type f | wc -l", shell=True, capture_output=True, text=True, check=True)
        assert int(out.stdout) == n, out.stdout
        return time.perf_counter() - t0

    def daemon_ready(stage):
        d = Daemon(src, cache, mnt)
        try:
            ready, st = d.wait_answering()
            assert st["samples"] == n, st["samples"]
            t0 = time.perf_counter()
            classes_listed = os.listdir(os.path.join(mnt, "epoch-0"))
            first = os.listdir(os.path.join(mnt, "epoch-0", classes_listed[0]))
            listed = ready + time.perf_counter() - t0
            assert len(classes_listed) == classes and first
            staged = None
            if stage:
                limit = env_int("READY_STAGE_TIMEOUT", 1800)
                while True:
                    s = shufflefs.status(mnt)["staging"]
                    if s["files_done"] == s["files_total"]:
                        staged = (time.perf_counter() - d.t_start - ready, s["files_done"], s["files_total"], True)
                        break
                    if time.perf_counter() - d.t_start - ready > limit:
                        staged = (time.perf_counter() - d.t_start - ready, s["files_done"], s["files_total"], False)
                        break
                    time.sleep(0.5)
            hwm = d.vm_hwm()
            return ready, listed, d.scan_secs(), hwm, staged
        finally:
            d.stop()
            shutil.rmtree(cache, ignore_errors=True)

    results = {"find cold": [], "find warm": [], "daemon cold": [], "daemon warm": []}
    staged = None
    for r in range(REPS):
        drop_caches()
        results["find cold"].append(find())
        results["find warm"].append(find())
        drop_caches()
        results["daemon cold"].append(daemon_ready(False))
        last = r == REPS - 1 and os.environ.get("READY_STAGE", "1") == "1"
        res = daemon_ready(last)
        results["daemon warm"].append(res)
        if last:
            staged = res[4]
        log(f"ready rep {r}: find {results['find cold'][-1]:.2f}/{results['find warm'][-1]:.2f} s, "
            f"daemon cold {results['daemon cold'][-1][:4]}, warm {res[:4]}")
    for temp in ("cold", "warm"):
        f = statistics.median(results[f"find {temp}"])
        runs = results[f"daemon {temp}"]
        ready = statistics.median(x[0] for x in runs)
        listed = statistics.median(x[1] for x in runs)
        scan = statistics.median(x[2] for x in runs)
        row(f"ready: start to status answering, {n} empty files in {classes} classes, vs find -type f",
            temp, "s", f"{f:.2f}", f"{ready:.2f}", ready / f, 1.2, False)
        row(f"ready: the daemon's source scan alone (its log), vs find -type f", temp, "s", f"{f:.2f}", f"{scan:.2f}", scan / f, 1.2, False)
        row(f"ready: start to epoch-0 and one class listed, vs find -type f", temp, "s", f"{f:.2f}", f"{listed:.2f}", listed / f, 1.2, False)
    hwm = max(x[3] for k in ("daemon cold", "daemon warm") for x in results[k])
    ROWS.append((f"daemon peak RSS (VmHWM{', staging included' if staged else ''}) per sample", "",
                 "", f"{hwm / 2**20:.0f} MiB", f"{hwm / n:.0f} B/sample", "<= 100 B", "yes" if hwm / n <= 100 else "**no**"))
    if staged:
        secs, done, total, finished = staged
        ROWS.append((f"staging (creating the cache files) after ready, {n} empty files", "warm", "",
                     f"{secs:.1f} s" + ("" if finished else f" (stopped at {done}/{total})"),
                     f"{done / secs:.0f} files/s", "", ""))


def main():
    os.makedirs(WORK, exist_ok=True)
    benches = os.environ.get("BENCHES", "small stream scan ready").split()
    passthrough = "?"
    for b in benches:
        log(f"bench {b}")
        r = {"small": bench_small, "stream": bench_stream, "scan": bench_scan, "ready": bench_ready}[b]()
        if b == "small":
            passthrough = r
    print(f"passthrough: {passthrough}; {REPS} runs each, median shown; cold = caches dropped before each run")
    print()
    print("| benchmark | page cache | native | shufflefs | ratio | target | met |")
    print("|---|---|---|---|---|---|---|")
    for r in ROWS:
        print("| " + " | ".join(r) + " |")
    if os.environ.get("KEEP_DATA") != "1":
        for name in ("small-src", "stream-src", "scan-src", "ready-src"):
            remove_tree(os.path.join(WORK, name))
        shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
