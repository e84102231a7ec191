"""One rank of the epoch-time benchmark (benches/epoch_time.py), run inside one emulated host.

Reads 5 (--epochs) epochs of one system with one loop and prints one JSON line per epoch on
stdout (plus one `staging` line first): the epoch's wall time between two barriers over all
ranks (so every rank's line carries the slowest rank's time), the samples and bytes this rank
read, the names and labels it read in order (the driver computes shuffle quality from them) and
the peak of its local disk during the epoch. The barriers go through torch.distributed (gloo)
to rank 0's host, so nothing here needs a shared filesystem.

Systems (the rank's epoch is always "every sample this rank reads this epoch"):
  global     ImageFolder on the store, DistributedSampler(shuffle=True) + set_epoch(e)
  local      the epoch-0 share of `global` copied once to local disk (staging), then a
             local reshuffle every epoch (no exchange)
  shufflefs  the mount's MOUNT/epoch-e/ (opening it advances the mount: mount-helpers/shufflefs.py)
  mosaic     mosaicml-streaming StreamingDataset over MDS shards on the store
  litdata    litdata StreamingDataset over optimized chunks on the store
Loops: raw (every sample's bytes, 4 threads, or a 4-worker DataLoader for the streaming
libraries) and decode (torchvision decode + RandomResizedCrop(224) in a DataLoader).

With --bucket s3://BUCKET (`--store-kind s3`, benches/epoch_time/bucket.py) the same systems
read the bucket instead of the store folder: global and local GET objects (boto3, the raw loop
with a pool of GET_THREADS threads, the decode loop one GET per item in each worker), mosaic
gets remote=s3://BUCKET/mds, litdata input_dir=s3://BUCKET/litdata, shufflefs's mount was made
with --source s3://BUCKET/imagefolder; endpoint and keys come from the AWS variables.
"""
import argparse
import json
import os
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist
from torchvision.io import ImageReadMode, decode_jpeg  # imported once here, not in every worker
from torchvision.transforms import v2

BATCH = 64
RAW_THREADS = 4
# GETs in flight per rank when `global`/`local` read a bucket (raw loop): one GET per object
# waits a round trip where a local read does not, so a user's loader keeps more in flight
GET_THREADS = 16
CROP = v2.RandomResizedCrop(224, antialias=True)


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--system", required=True)
    ap.add_argument("--loop", choices=["raw", "decode"], required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True, help="ADDR:PORT of rank 0 (gloo barriers)")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--store", required=True, help="the store's root as this host sees it")
    ap.add_argument("--local", required=True, help="this system's folder on the host's disk")
    ap.add_argument("--mount", help="shufflefs mount point (system shufflefs)")
    ap.add_argument("--budget", type=int, required=True, help="local disk budget in bytes")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers of the decode loop")
    ap.add_argument("--helpers", required=True, help="mount-helpers folder (shufflefs.py)")
    ap.add_argument("--bucket", help="s3://BUCKET holding the store's forms: read it, not --store")
    return ap.parse_args()


class DiskPeak:
    """Samples the bytes allocated under this system's local folder every second (a walk
    summing st_blocks, skipping FUSE mounts inside: shufflefs's view is not local disk);
    `take()` returns the peak since the last take."""

    def __init__(self, root):
        self.root, self.peak, self.lock = root, 0, threading.Lock()
        threading.Thread(target=self._run, daemon=True).start()

    def used(self):
        total = 0
        for top, dirs, files in os.walk(self.root):
            dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(top, d))]
            for f in files:
                try:
                    total += os.lstat(os.path.join(top, f)).st_blocks * 512
                except OSError:
                    pass
        return total

    def _run(self):
        while True:
            u = self.used()
            with self.lock:
                self.peak = max(self.peak, u)
            time.sleep(1.0)

    def take(self):
        u = self.used()
        with self.lock:
            p, self.peak = max(self.peak, u), u
        return p


def image_files(root):
    """(relative name, class index) of an ImageFolder (a folder or s3://BUCKET/PREFIX),
    sorted as torchvision sorts it."""
    if root.startswith("s3://"):
        names = sorted(bucket_keys(root))
        classes = sorted({n.split("/", 1)[0] for n in names})
        return [(n, classes.index(n.split("/", 1)[0])) for n in names]
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    out = []
    for c, cls in enumerate(classes):
        for f in sorted(os.listdir(os.path.join(root, cls))):
            out.append((f"{cls}/{f}", c))
    return out


def class_names(root):
    """The class folders of an ImageFolder (a folder or s3://BUCKET/PREFIX), sorted."""
    if root.startswith("s3://"):
        bucket, prefix = split_url(root)
        pages = s3_client().get_paginator("list_objects_v2")
        found = []
        for page in pages.paginate(Bucket=bucket, Prefix=prefix + "/", Delimiter="/"):
            found += [p["Prefix"][len(prefix) + 1:].rstrip("/") for p in page.get("CommonPrefixes", [])]
        return sorted(found)
    return sorted(e.name for e in os.scandir(root) if e.is_dir())


# ---- the bucket: one boto3 client per process (DataLoader workers are forked) ---------------

_S3 = {}


def s3_client():
    pid = os.getpid()
    if pid not in _S3:
        import boto3
        from botocore.config import Config

        _S3[pid] = boto3.client("s3", config=Config(max_pool_connections=GET_THREADS,
                                                    retries={"max_attempts": 10, "mode": "standard"}))
    return _S3[pid]


def split_url(url):
    """s3://BUCKET/PREFIX -> (BUCKET, PREFIX)."""
    bucket, _, prefix = url[len("s3://"):].partition("/")
    return bucket, prefix.rstrip("/")


def bucket_keys(url):
    """Keys under s3://BUCKET/PREFIX/, relative to PREFIX (a paginated listing)."""
    bucket, prefix = split_url(url)
    out = []
    for page in s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        out += [o["Key"][len(prefix) + 1:] for o in page.get("Contents", [])]
    return out


def read_bytes(path):
    """A file's bytes, or an object's (one GET) for s3://BUCKET/KEY."""
    if path.startswith("s3://"):
        bucket, key = split_url(path)
        return s3_client().get_object(Bucket=bucket, Key=key)["Body"].read()
    with open(path, "rb") as f:
        return f.read()


def pool_size(items):
    """Threads of the raw loop and of local's copy: GET_THREADS for objects."""
    return GET_THREADS if items and items[0][0].startswith("s3://") else RAW_THREADS


def decode_crop(data):
    """torchvision decode + RandomResizedCrop(224): the decode loop's per-sample work."""
    img = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
    return CROP(img)


class FileList(torch.utils.data.Dataset):
    """(path, label, name) in a fixed order; decode + crop per item (decode loop)."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, label, name = self.items[i]
        data = read_bytes(path)
        return decode_crop(data), label, name, len(data)


def collate(batch):
    """Keeps names and sizes as lists; stacks decoded images (decode loop) or drops raw bytes."""
    first = batch[0][0]
    imgs = torch.stack([b[0] for b in batch]) if isinstance(first, torch.Tensor) else None
    return imgs, [b[1] for b in batch], [b[2] for b in batch], sum(b[3] for b in batch)


def run_file_epoch(items, loop, workers):
    """items: [(path, label, name)] in reading order. Returns (names, labels, bytes)."""
    if loop == "raw":
        with ThreadPoolExecutor(pool_size(items)) as pool:
            sizes = list(pool.map(lambda it: len(read_bytes(it[0])), items))
        return [it[2] for it in items], [it[1] for it in items], sum(sizes)
    return drain(torch.utils.data.DataLoader(FileList(items), batch_size=BATCH,
                                             num_workers=workers, collate_fn=collate))


def drain(loader):
    names, labels, nbytes = [], [], 0
    for _imgs, lab, nm, nb in loader:
        names += nm
        labels += [int(x) for x in lab]
        nbytes += nb
    return names, labels, nbytes


# ---- systems reading files: global, local, shufflefs -------------------------------------

def store_path(a, form):
    """Where a form of the dataset is: the store folder as this host sees it, or the bucket."""
    return f"{a.bucket}/{form}" if a.bucket else os.path.join(a.store, form)


def sampler_share(n, rank, world, seed, epoch):
    from torch.utils.data import DistributedSampler

    s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)
    s.set_epoch(epoch)
    return list(s)


class GlobalSystem:
    def __init__(self, a):
        self.a, self.root = a, store_path(a, "imagefolder")
        self.files = image_files(self.root)

    def stage(self):
        return 0

    def epoch(self, e):
        a = self.a
        idx = sampler_share(len(self.files), a.rank, a.world, a.seed, e)
        items = [(os.path.join(self.root, self.files[i][0]), self.files[i][1], self.files[i][0]) for i in idx]
        return run_file_epoch(items, a.loop, a.workers)


class LocalSystem(GlobalSystem):
    """The paper's local shuffling: epoch 0's share copied once, reshuffled locally after."""

    def stage(self):
        a = self.a
        idx = sampler_share(len(self.files), a.rank, a.world, a.seed, 0)
        self.share = [self.files[i] for i in idx]
        dst = os.path.join(a.local, "share")
        nbytes = 0

        def copy(item):
            os.makedirs(os.path.join(dst, item[0].split("/")[0]), exist_ok=True)
            data = read_bytes(os.path.join(self.root, item[0]))
            with open(os.path.join(dst, item[0]), "wb") as f:
                f.write(data)
            return len(data)

        with ThreadPoolExecutor(GET_THREADS if self.root.startswith("s3://") else RAW_THREADS) as pool:
            nbytes = sum(pool.map(copy, self.share))
        self.dst = dst
        return nbytes

    def epoch(self, e):
        order = list(self.share)
        random.Random(self.a.seed * 1000 + e * 10 + self.a.rank).shuffle(order)
        items = [(os.path.join(self.dst, n), c, n) for n, c in order]
        return run_file_epoch(items, self.a.loop, self.a.workers)


class ShufflefsSystem:
    """Reads MOUNT/epoch-e/ (its first look advances the mount to epoch e)."""

    def __init__(self, a):
        sys.path.insert(0, a.helpers)
        import shufflefs

        self.a, self.sfs = a, shufflefs
        self.classes = class_names(store_path(a, "imagefolder"))

    def stage(self):
        st = self.sfs.wait_ready(self.a.mount, timeout=1800, staged=True)
        return st["staging"].get("bytes_done", 0)

    def epoch(self, e):
        d = self.sfs.epoch_dir(self.a.mount, e)
        items = []
        for cls in sorted(os.listdir(d)):
            for f in os.listdir(os.path.join(d, cls)):
                items.append((os.path.join(d, cls, f), self.classes.index(cls), f"{cls}/{f}"))
        random.Random(self.a.seed * 1000 + e * 10 + self.a.rank).shuffle(items)
        return run_file_epoch(items, self.a.loop, self.a.workers)


# ---- streaming libraries ------------------------------------------------------------------

def sample_tuple(s, loop):
    data = bytes(s["x"])
    img = decode_crop(data) if loop == "decode" else 0
    return img, int(s["y"]), str(s["name"]), len(data)


class MosaicSystem:
    def __init__(self, a):
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        loop = a.loop

        class DS(StreamingDataset):
            def __getitem__(self, i):
                return sample_tuple(super().__getitem__(i), loop)

        self.a = a
        self.ds = DS(remote=store_path(a, "mds"), local=os.path.join(a.local, "mds"),
                     shuffle=True, shuffle_seed=a.seed, cache_limit=a.budget, batch_size=BATCH)

    def stage(self):
        return 0

    def epoch(self, e):
        workers = RAW_THREADS if self.a.loop == "raw" else self.a.workers
        # mosaic 0.13 fetched index.json here with a boto3 client whose kept-alive connection
        # the forked workers would inherit and share: their GETs' bytes interleave on that one
        # socket and shards come out corrupt (seen: a 16 KiB hole, then UnicodeDecodeError).
        # Dropping the client makes each worker open its own (mosaic's own retry path does
        # the same with clean_up); a folder's downloader holds no connection.
        for stream in self.ds.streams:
            stream._downloader.clean_up()
        return drain(torch.utils.data.DataLoader(self.ds, batch_size=BATCH, num_workers=workers,
                                                 collate_fn=collate))


def allow_litdata_http():
    """litdata 0.2.76 GETs chunks with obstore, built from its boto3 client's endpoint but with
    client options of its own that drop AWS_ALLOW_HTTP: an http:// endpoint then fails with
    `builder error: BadScheme`. Adding allow_http to those options (read when each process
    builds its store; DataLoader workers are forked after this) keeps its fast path."""
    from litdata.streaming import downloader

    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}


class LitdataSystem:
    def __init__(self, a):
        from litdata import StreamingDataLoader, StreamingDataset

        loop = a.loop

        class DS(StreamingDataset):
            def __getitem__(self, i):
                return sample_tuple(super().__getitem__(i), loop)

        self.a = a
        # a bucket: litdata's documented way to a custom endpoint is storage_options (boto3's
        # client arguments); `local:` makes it copy chunks into its cache as from a remote
        remote = {"input_dir": store_path(a, "litdata"),
                  "storage_options": {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}} if a.bucket else \
            {"input_dir": "local:" + store_path(a, "litdata")}
        if a.bucket and os.environ["AWS_ENDPOINT_URL"].startswith("http://"):
            allow_litdata_http()
        self.ds = DS(**remote, cache_dir=os.path.join(a.local, "litdata"), max_cache_size=a.budget,
                     shuffle=True, seed=a.seed)
        workers = RAW_THREADS if a.loop == "raw" else a.workers
        self.loader = StreamingDataLoader(self.ds, batch_size=BATCH, num_workers=workers, collate_fn=collate)

    def stage(self):
        return 0

    def epoch(self, e):
        return drain(self.loader)


SYSTEMS = {"global": GlobalSystem, "local": LocalSystem, "shufflefs": ShufflefsSystem,
           "mosaic": MosaicSystem, "litdata": LitdataSystem}


def emit(rec):
    sys.stdout.write("EPOCHTIME " + json.dumps(rec) + "\n")
    sys.stdout.flush()


def main():
    a = parse()
    # the streaming libraries read these (litdata: WORLD_SIZE, GLOBAL_RANK, NNODES; mosaic:
    # RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE): one rank per host
    os.environ.update(RANK=str(a.rank), GLOBAL_RANK=str(a.rank), WORLD_SIZE=str(a.world),
                      LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", NNODES=str(a.world))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")  # the host's link, not loopback
    os.makedirs(a.local, exist_ok=True)
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}", rank=a.rank, world_size=a.world)
    disk = DiskPeak(a.local)
    kind = a.system.split("-")[0]
    dist.barrier()
    # every rank is up (python, torch, gloo): the driver starts shufflefs's daemons on seeing
    # this, so staging and the first exchange never run while clients are still starting
    emit({"what": "ready", "rank": a.rank, "t": time.time()})
    t0 = time.time()
    system = SYSTEMS[kind](a)
    staged = system.stage()
    dist.barrier()
    emit({"what": "staging", "rank": a.rank, "t0": t0, "t1": time.time(), "bytes": staged,
          "peak_disk": disk.take()})
    for e in range(a.epochs):
        dist.barrier()
        t0 = time.time()
        names, labels, nbytes = system.epoch(e)
        dist.barrier()
        emit({"what": "epoch", "epoch": e, "rank": a.rank, "t0": t0, "t1": time.time(),
              "samples": len(names), "bytes": nbytes, "names": names, "labels": labels,
              "peak_disk": disk.take()})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
