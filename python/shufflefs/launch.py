"""Starting this rank's daemon from inside a training script (`shufflefs.mount`,
`shufflefs.torch.mount`): no mpirun, no launcher script. Under torchrun or a Kubernetes job the
environment names the job (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), and the daemons meet
over TCP at rank 0's host (docs/transports.md).

    mount = shufflefs.mount("/pfs/train", "/ssd/sfs-{rank}", "/mnt/sfs-{rank}", fraction=0.3)

starts `shufflefs mount` for this rank, returns once its mount answers (every rank has met and
agreed on the job by then), and unmounts at exit (atexit, SIGTERM, SIGINT).
"""
import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys

from . import rank_from_env, rank_mount, wait_ready

_MOUNTED = []
_HANDLED = {}


def binary(explicit=None):
    """The shufflefs binary to run: `explicit`, else `SHUFFLEFS`, else the one the wheel
    installed beside this package (its environment's `bin/shufflefs`, activated or not), else
    `shufflefs` on PATH."""
    if explicit:
        return explicit
    if os.environ.get("SHUFFLEFS"):
        return os.environ["SHUFFLEFS"]
    shipped = _installed_beside()
    if shipped and os.access(shipped, os.X_OK):
        return shipped
    found = shutil.which("shufflefs")
    if found is None:
        raise FileNotFoundError(
            "no shufflefs binary: install the wheel (pip install shufflefs), put `shufflefs` on "
            "PATH, or set SHUFFLEFS to it")
    return found


def _installed_beside():
    """`PREFIX/bin/shufflefs` when this package is installed in `PREFIX/lib/pythonX.Y/
    site-packages` (where the wheel puts its binary), else None."""
    site = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.basename(site) not in ("site-packages", "dist-packages"):
        return None
    prefix = os.path.dirname(os.path.dirname(os.path.dirname(site)))
    return os.path.join(prefix, "bin", "shufflefs")


def free_port():
    """A TCP port free on this host now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def require_fusermount():
    """Raises with the fix when the host has no fusermount3 (the one thing a mount needs
    from the host besides /dev/fuse)."""
    if shutil.which("fusermount3") is None:
        raise FileNotFoundError(
            "fusermount3 is not on PATH: install the host's fuse3 package "
            "(apt-get install fuse3, dnf install fuse3) to mount shufflefs views")


def mount_command(source, cache, mountpoint, fraction=None, seed=None, options=(), exe=None):
    """The `shufflefs mount` command line for these settings (`{rank}` in `cache` and
    `mountpoint` is replaced by the daemon)."""
    cmd = [binary(exe), "mount", "--source", str(source), "--cache", str(cache)]
    if fraction is not None:
        cmd += ["--fraction", str(fraction)]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    return cmd + [str(o) for o in options] + [str(mountpoint)]


def mount(source, cache, mountpoint, fraction=None, seed=None, options=(), rank=None,
          world_size=None, binary_path=None, timeout=600.0):
    """Starts this rank's daemon and returns its mount point once it answers.

    `rank` and `world_size` default to the environment's (torchrun, a Kubernetes job:
    RANK, WORLD_SIZE); the rendezvous is MASTER_ADDR (port MASTER_PORT + 1, or
    SHUFFLEFS_PORT), or `--rendezvous HOST:PORT` in `options`. `options` are more
    `shufflefs mount` flags. Raises RuntimeError with the daemon's message when it refuses.
    The mount is unmounted when this process exits (atexit, SIGTERM, SIGINT), or by
    `unmount(path)`."""
    require_fusermount()
    rank = rank_from_env() if rank is None else rank
    env = dict(os.environ)
    env["RANK"] = str(rank)
    if world_size is not None:
        env["WORLD_SIZE"] = str(world_size)
    path = rank_mount(str(mountpoint), rank)
    os.makedirs(path, exist_ok=True)
    cmd = mount_command(source, cache, mountpoint, fraction, seed, options, binary_path)
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"shufflefs mount of {path} did not answer within {timeout} s") from None
    if out.returncode != 0:
        why = out.stderr.strip() or out.stdout.strip() or f"exit code {out.returncode}"
        raise RuntimeError(f"shufflefs mount of {path} (rank {rank}) failed: {why}")
    wait_ready(path, timeout=timeout)
    _remember(path, cmd[0])
    return path


def unmount(path, binary_path=None):
    """Unmounts `path` (a mount `mount` made); its daemon exits once every rank has."""
    entry = next((m for m in _MOUNTED if m[0] == path), None)
    if entry is not None:
        _MOUNTED.remove(entry)
    exe = binary_path or (entry[1] if entry else binary())
    subprocess.run([exe, "unmount", path], capture_output=True, timeout=120)


def _unmount_all():
    for path, exe in list(_MOUNTED):
        try:
            unmount(path, exe)
        except (OSError, subprocess.SubprocessError):
            pass


def _on_signal(signum, frame):
    _unmount_all()
    previous = _HANDLED.get(signum)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:
        sys.exit(128 + signum)


def _remember(path, exe):
    if not _MOUNTED and not _HANDLED:
        atexit.register(_unmount_all)
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                _HANDLED[sig] = signal.signal(sig, _on_signal)
            except ValueError:  # not the main thread: atexit still unmounts
                pass
    _MOUNTED.append((path, exe))
