"""A standard PyTorch DDP training loop reading a shufflefs mount (one process per rank).

    mpirun -np 4 python train_ddp.py --mount /mnt/sfs-{rank} --epochs 3
    torchrun --nproc_per_node 4 train_ddp.py --source /pfs/train --cache /ssd/sfs-{rank} \
        --mount /mnt/sfs-{rank} --epochs 3     # mounts from the script (shufflefs.torch.mount)

The change from the usual DDP script is the dataset path: each epoch reads
`shufflefs.epoch_dir(mount, epoch)` (that is, MOUNT/epoch-N). There is also no
DistributedSampler: this rank's mount already holds its own share, and shufflefs reshuffles a
fraction of it across ranks before every epoch. Everything else is the stock loop.

Shares differ by one sample when the ranks do not divide the dataset, so the loop runs under
`model.join()`. Mounted with `--equal-shares drop`, every rank's epoch holds the same number of
samples: pass `--no-join` to train with the plain loop (the script checks the counts agree first
and stops with a message instead of hanging if they do not).

Rank and world size come from mpirun/srun (or RANK/WORLD_SIZE); MASTER_ADDR/MASTER_PORT
default to 127.0.0.1:29500. Uses the gloo backend, so it runs on CPU.
"""
import argparse
import contextlib
import hashlib
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torchvision import transforms

import shufflefs
import shufflefs.torch


def env_int(*names, default=None):
    for n in names:
        if n in os.environ:
            return int(os.environ[n])
    if default is None:
        raise SystemExit(f"train_ddp.py: none of {names} is set; run me under mpirun or srun")
    return default


def record(folder, mount, epoch, rank, ds):
    """What this rank read in `epoch` (relative path, size, sha256 of each sample file) and
    its mount's status, as DIR/epoch-E.rank-R.json (written whole, then renamed)."""
    root = shufflefs.epoch_dir(mount, epoch)
    samples = []
    for path, _ in ds.samples:
        with open(path, "rb") as f:
            data = f.read()
        samples.append([os.path.relpath(path, root), len(data), hashlib.sha256(data).hexdigest()])
    out = os.path.join(folder, f"epoch-{epoch}.rank-{rank}.json")
    os.makedirs(folder, exist_ok=True)
    with open(out + ".tmp", "w") as f:
        json.dump({"samples": samples, "status": shufflefs.status(mount)}, f)
    os.replace(out + ".tmp", out)


def same_length(n, epoch):
    """Stops every rank with a message (instead of a DDP hang) unless all hold `n` samples."""
    lengths = torch.tensor([n, -n])
    dist.all_reduce(lengths, op=dist.ReduceOp.MAX)
    if lengths[0] != -lengths[1]:
        raise SystemExit(f"train_ddp.py --no-join: epoch {epoch} holds {-int(lengths[1])} to "
                         f"{int(lengths[0])} samples per rank; mount with --equal-shares drop "
                         "or drop --no-join")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount", required=True, help="this rank's mount point; {rank} is replaced")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--record", metavar="DIR",
                    help="after each epoch, write DIR/epoch-E.rank-R.json: the samples this rank "
                    "read (path, bytes, sha256) and its mount's status, to check a run")
    ap.add_argument("--source", help="mount from inside this script (shufflefs.torch.mount: "
                    "torchrun alone launches the job; the daemons meet over TCP); else --mount "
                    "must be mounted already")
    ap.add_argument("--cache", help="with --source: this rank's cache folder ({rank} is replaced)")
    ap.add_argument("--fraction", type=float, default=0.3, help="with --source: the exchanged fraction")
    ap.add_argument("--no-join", action="store_true",
                    help="train without model.join(): every rank's epoch must hold as many samples "
                    "(mount with --equal-shares drop)")
    a = ap.parse_args()
    rank = env_int("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
    world = env_int("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    torch.set_num_threads(1)

    if a.source:
        # Started by torchrun alone: this rank's daemon, unmounted when the script exits.
        mount = shufflefs.torch.mount(a.source, a.cache, a.mount, fraction=a.fraction)
    else:
        mount = a.mount.replace("{rank}", str(rank))
    shufflefs.wait_ready(mount)
    start = shufflefs.current_epoch(mount)  # 0 on a new mount; where it left off on a remount
    classes = shufflefs.torch.epoch_dataset(mount, start).classes
    model = DDP(
        nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
            nn.Flatten(), nn.Linear(32, len(classes)),
        )
    )
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    first = last = None
    for epoch in range(start, start + a.epochs):
        # The one-line change: this epoch's view of this rank's share.
        ds = shufflefs.torch.epoch_dataset(mount, epoch, transforms.ToTensor())
        loader = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=2)
        total = torch.zeros(2)
        if a.no_join:
            same_length(len(ds), epoch)
        # Shares differ by at most one sample, so ranks may run one batch more or less, unless
        # the mount makes them equal (--equal-shares drop).
        with contextlib.nullcontext() if a.no_join else model.join():
            for images, labels in loader:
                opt.zero_grad()
                loss = loss_fn(model(images), labels)
                loss.backward()
                opt.step()
                total += torch.tensor([loss.item() * len(labels), len(labels)])
        if a.record:
            record(a.record, mount, epoch, rank, ds)
        dist.all_reduce(total)
        mean = (total[0] / total[1]).item()
        first = mean if first is None else first
        last = mean
        if rank == 0:
            print(f"epoch {epoch}: {int(total[1])} samples on {world} ranks, mean loss {mean:.4f}", flush=True)
    if rank == 0:
        print(f"first_loss={first:.4f} last_loss={last:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
