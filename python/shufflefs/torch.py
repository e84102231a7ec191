"""PyTorch datasets on a shufflefs mount, one per epoch, without a DistributedSampler.

Each rank's mount already holds only its own share, and shufflefs reshuffles a fraction of
it across ranks before every epoch, so the recipe is the single-process one: a map-style
dataset over this rank's `epoch-N` view with `shuffle=True`, rebuilt every epoch (building it
advances the mount):

    for epoch in shufflefs.epochs(mount, 10):
        loader = shufflefs.torch.epoch_loader(mount, epoch, batch_size=32, transform=ToTensor(),
                                              num_workers=4)
        for images, labels in loader: ...

Shares differ by one sample when the ranks do not divide the dataset: train under DDP's
`model.join()`, or mount with `--equal-shares drop` for equal lengths everywhere.
"""
import os
import random
import secrets

import torch.distributed
import torch.utils.data
from torchvision import datasets

from . import epoch_dir
from . import launch


def mount(source, cache, mountpoint, fraction=None, seed=None, options=(), timeout=600.0, **kwargs):
    """`shufflefs.mount` for a torch.distributed job: this rank's daemon started with the rank
    and world size of the initialised process group (else torchrun's environment), the ranks'
    daemons meeting over TCP at MASTER_ADDR; returns once every rank's mount answers (a
    barrier when the group is initialised). Unmounted at exit.

        dist.init_process_group("gloo")
        mount = shufflefs.torch.mount("/pfs/train", "/ssd/sfs-{rank}", "/mnt/sfs-{rank}", fraction=0.3)
    """
    dist = torch.distributed
    ready = dist.is_available() and dist.is_initialized()
    if ready:
        kwargs.setdefault("rank", dist.get_rank())
        kwargs.setdefault("world_size", dist.get_world_size())
        meet, env = _rendezvous(dist, options)
        options = list(options) + meet
        kwargs["env"] = {**env, **(kwargs.get("env") or {})}
    path = launch.mount(source, cache, mountpoint, fraction=fraction, seed=seed, options=options,
                        timeout=timeout, **kwargs)
    if ready:
        dist.barrier()
    return path


def epoch_dataset(mount, epoch, transform=None, target_transform=None, **kwargs):
    """torchvision's `ImageFolder` over this rank's view of `epoch` (advancing the mount to
    it). Every class folder is there, some may be empty on some rank (`allow_empty`), so the
    class indices are the same on every rank and every epoch."""
    kwargs.setdefault("allow_empty", True)
    return datasets.ImageFolder(
        epoch_dir(mount, epoch), transform=transform, target_transform=target_transform, **kwargs
    )


def epoch_loader(mount, epoch, batch_size=32, transform=None, shuffle=True, **loader_kwargs):
    """A `DataLoader` over `epoch_dataset(mount, epoch, transform)`, shuffled: the whole
    distributed recipe (no `DistributedSampler`: the view is this rank's share already)."""
    ds = epoch_dataset(mount, epoch, transform)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=shuffle, **loader_kwargs)


class EpochIterable(torch.utils.data.IterableDataset):
    """This rank's view of `epoch` as an `IterableDataset` of `(sample, class_index)`, in a
    seeded random order, each DataLoader worker taking every n-th file. `load(path)` reads
    a sample (default: its bytes); `transform` is applied to what it returns. The mount is
    advanced when the dataset is made, not when a worker first iterates."""

    def __init__(self, mount, epoch, transform=None, load=None, seed=0):
        super().__init__()
        root = epoch_dir(mount, epoch)
        self.classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.files = [
            (os.path.join(root, c, f), i)
            for i, c in enumerate(self.classes)
            for f in sorted(os.listdir(os.path.join(root, c)))
        ]
        self.transform, self.load, self.seed, self.epoch = transform, load or _read, seed, epoch

    def __len__(self):
        return len(self.files)

    def __iter__(self):
        order = list(self.files)
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        info = torch.utils.data.get_worker_info()
        if info is not None:
            order = order[info.id::info.num_workers]
        for path, label in order:
            sample = self.load(path)
            yield (self.transform(sample) if self.transform else sample), label


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _rendezvous(dist, options):
    """Where and as which job the daemons meet, drawn by rank 0 and told every rank through
    the process group: `--rendezvous MASTER_ADDR:PORT` with a port free on rank 0's host
    (the default MASTER_PORT + 1 can be taken by an ephemeral port of another connection,
    which nothing but rank 0 could notice), unless one was given (`--rendezvous`,
    SHUFFLEFS_PORT); and a job secret (rank 0's SHUFFLEFS_JOB, else a random one), so that a
    rank of another job reaching the same rendezvous is turned away instead of joining this one.
    Returns (options, environment)."""
    drawn = [None, None]
    if dist.get_rank() == 0:
        # Rank 0's SHUFFLEFS_JOB when set, so that every rank uses the same one.
        drawn = [launch.free_port(), os.environ.get("SHUFFLEFS_JOB") or secrets.token_hex(16)]
    dist.broadcast_object_list(drawn, src=0)
    port, secret = drawn
    env = {"SHUFFLEFS_JOB": secret}
    given = "--rendezvous" in options or os.environ.get("SHUFFLEFS_PORT")
    if given or "MASTER_ADDR" not in os.environ:
        return [], env
    return ["--rendezvous", f"{os.environ['MASTER_ADDR']}:{port}"], env
