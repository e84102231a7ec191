"""Helpers for training scripts reading a shufflefs mount.

    import shufflefs
    shufflefs.wait_ready(mount)
    for epoch in range(shufflefs.current_epoch(mount), epochs):
        dataset = torchvision.datasets.ImageFolder(shufflefs.epoch_dir(mount, epoch), allow_empty=True)

`epoch_dir(mount, N)` is `MOUNT/epoch-N`; the first look at it advances the mount from N-1 to
N, waiting until this rank holds its whole share. Loaders that keep one path can use
`MOUNT/current` and call `advance(mount, N)` between epochs. `shufflefs.torch` and
`shufflefs.tf` build the usual datasets on these paths; nothing here imports either framework.
`shufflefs.mount(...)` starts this rank's daemon from the script itself (torchrun, Kubernetes).
"""
import errno
import json
import os
import re
import subprocess
import time
import warnings

# The binary's version (Cargo.toml); pyproject.toml says the same (a test checks both).
__version__ = "0.1.0"

RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "RANK")


class NotAMountError(FileNotFoundError):
    """A path given as a mount is no shufflefs mount: it has no `.shufflefs/status` (or does
    not exist). A FileNotFoundError, so code that waits for a mount to come keeps working."""


def status(mount):
    """The daemon's status for this mount, as a dict (see docs/status.md). Raises
    NotAMountError when `mount` is no shufflefs mount, and an OSError (ENOTCONN) saying how
    to unmount it when its daemon is gone."""
    path = os.path.join(mount, ".shufflefs", "status")
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, NotADirectoryError):
        what = "is not a shufflefs mount (no .shufflefs/status)"
        if not os.path.exists(mount):
            what = "does not exist"
        raise NotAMountError(errno.ENOENT, f"{mount} {what}; give the mount point of a shufflefs mount") from None
    except OSError as e:
        if e.errno != errno.ENOTCONN:
            raise
        raise OSError(e.errno, f"{mount} is a dead shufflefs mount (its daemon is gone); "
                      f"unmount it with fusermount3 -u {mount}") from None


def wait_ready(mount, timeout=600.0, staged=False):
    """Waits until the mount answers (and, with staged=True, until its share is staged)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            st = status(mount)
            if not staged or st["staging"]["files_done"] == st["staging"]["files_total"]:
                return st
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"shufflefs mount {mount} not ready after {timeout}s")
        time.sleep(0.2)


def current_epoch(mount):
    """The epoch the mount is in: where a (resumed) training loop starts."""
    return status(mount)["epoch"]


def epoch_dir(mount, epoch):
    """Path of this rank's view for `epoch`; looking it up advances the mount to it."""
    path = os.path.join(mount, f"epoch-{epoch}")
    try:
        os.stat(path)  # advance now, so the caller's first listing sees the new epoch
    except FileNotFoundError:
        now = current_epoch(mount)
        raise FileNotFoundError(
            f"{path}: the mount is at epoch {now}; only epoch {now} and {now + 1} (which advances) "
            f"can be opened. Start the loop at shufflefs.current_epoch(mount)."
        ) from None
    return path


def advance(mount, epoch):
    """Makes `epoch` current (no-op if it already is), for loaders that read MOUNT/current."""
    with open(os.path.join(mount, ".shufflefs", "epoch"), "w") as f:
        f.write(f"{epoch}\n")


def epochs(mount, count):
    """The next `count` epoch numbers from where the mount is: `range(start, start + count)`,
    so a remounted (resumed) job carries on where it left off."""
    start = current_epoch(mount)
    return range(start, start + count)


def rank_from_env(default=0):
    """This process's rank as mpirun, srun or torchrun set it (`default` when none did)."""
    for var in RANK_VARIABLES:
        if var in os.environ:
            return int(os.environ[var])
    return default


def rank_mount(template, rank=None):
    """`template` with `{rank}` replaced by this process's rank (see `rank_from_env`)."""
    return template.replace("{rank}", str(rank_from_env() if rank is None else rank))


def binary_looked_for(binary=None):
    """Which binary `binary_version` runs, in words: `binary`, else `SHUFFLEFS`, else
    `shufflefs` on PATH."""
    if binary:
        return f"the binary {binary}"
    if os.environ.get("SHUFFLEFS"):
        return f"SHUFFLEFS={os.environ['SHUFFLEFS']}"
    return "`shufflefs` on PATH"


def binary_version(binary=None):
    """The version `shufflefs --version` prints (`SHUFFLEFS` or `shufflefs` on PATH), or
    None when the binary cannot be run."""
    binary = binary or os.environ.get("SHUFFLEFS") or "shufflefs"
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"(\d+\.\d+\.\d+\S*)", out.stdout)
    return found.group(1) if out.returncode == 0 and found else None


def check_version(mount=None, binary=None):
    """Warns (UserWarning) when the daemon differs from this package's version: the
    mount's (its status says which version serves it), else the binary's. Returns the
    version found, or None when there was none to compare (then it warns too, naming the
    binary it looked for). A `mount` that is no shufflefs mount raises NotAMountError."""
    if mount is not None:
        found, what = status(mount).get("version"), f"the daemon serving {mount}"
    else:
        found, what = binary_version(binary), "the shufflefs binary"
        if found is None:
            warnings.warn(
                f"no shufflefs version to compare: {binary_looked_for(binary)} could not be run "
                f"(or printed no version); set SHUFFLEFS to the binary or put it on PATH",
                stacklevel=2,
            )
    if found is not None and found != __version__:
        warnings.warn(
            f"{what} is version {found}, this Python package {__version__}: "
            f"install the package from the same checkout (pip install ./python)",
            stacklevel=2,
        )
    return found


def mount(source, cache, mountpoint, **kwargs):
    """Starts this rank's daemon from inside the training script and returns its mount point
    (see `shufflefs.launch.mount`: the job's ranks from torchrun's environment, unmounted at
    exit)."""
    from .launch import mount as _mount

    return _mount(source, cache, mountpoint, **kwargs)


def unmount(path, lazy=False):
    """Unmounts a mount `shufflefs.mount` made (RuntimeError with the reason when refused:
    files still open there; `lazy=True` detaches the view at once)."""
    from .launch import unmount as _unmount

    _unmount(path, lazy=lazy)
