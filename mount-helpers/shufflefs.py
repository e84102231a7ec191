"""Helpers for training scripts reading a shufflefs mount. Import from a path, no packaging:

    import sys; sys.path.insert(0, "/path/to/shufflefs/mount-helpers")
    import shufflefs
    shufflefs.wait_ready(mount)
    for epoch in range(epochs):
        dataset = torchvision.datasets.ImageFolder(shufflefs.epoch_dir(mount, epoch), allow_empty=True)

`epoch_dir(mount, N)` is `MOUNT/epoch-N`; the first look at it advances the mount from N-1 to
N, waiting until this rank holds its whole share. Loaders that keep one path can use
`MOUNT/current` and call `advance(mount, N)` between epochs.
"""
import json
import os
import time


def status(mount):
    """The daemon's status for this mount, as a dict (see README, "Status")."""
    with open(os.path.join(mount, ".shufflefs", "status")) as f:
        return json.load(f)


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
