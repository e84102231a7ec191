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
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from . import rank_from_env, rank_mount, wait_ready

_MOUNTED = []
_HANDLED = {}
# The process that mounted (only it unmounts), and whether it is unmounting now.
_STATE = {"owner": None, "unmounting": False}


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
    `mountpoint` is replaced by the daemon): `options`, then the flags in SHUFFLEFS_OPTIONS
    (split as a shell would), so a job's operator can tune the daemons of a script that
    mounts for itself without editing it (`SHUFFLEFS_OPTIONS="--exchange-rate 200000000"`)."""
    cmd = [binary(exe), "mount", "--source", str(source), "--cache", str(cache)]
    if fraction is not None:
        cmd += ["--fraction", str(fraction)]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    cmd += [str(o) for o in options] + shlex.split(os.environ.get("SHUFFLEFS_OPTIONS", ""))
    return cmd + [str(mountpoint)]


def mount(source, cache, mountpoint, fraction=None, seed=None, options=(), rank=None,
          world_size=None, binary_path=None, timeout=600.0, env=None):
    """Starts this rank's daemon and returns its mount point once it answers.

    `rank` and `world_size` default to the environment's (torchrun, a Kubernetes job:
    RANK, WORLD_SIZE); the rendezvous is MASTER_ADDR (port MASTER_PORT + 1, or
    SHUFFLEFS_PORT), or `--rendezvous HOST:PORT` in `options`. `options` are more
    `shufflefs mount` flags; `env` more environment for the daemon (SHUFFLEFS_JOB: a secret
    every rank of the job shares). Raises RuntimeError with the daemon's message when it refuses.
    The mount is unmounted when this process exits (atexit, SIGTERM, SIGINT), or by
    `unmount(path)`."""
    require_fusermount()
    rank = rank_from_env() if rank is None else rank
    env = {**os.environ, **(env or {})}
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


def unmount(path, binary_path=None, lazy=False, timeout=60):
    """Unmounts `path` (a mount `mount` made); its daemon exits once every rank has. Raises
    RuntimeError with the daemon's message when it refuses (files still open there: close
    them, or pass `lazy=True` to detach the view at once and let the daemon exit when the last
    open file is closed): an `UnmountError`. `timeout`: seconds to wait for the daemon to
    end (with `lazy`, one still serving open files after that is not a failure)."""
    entry = next((m for m in _MOUNTED if m[0] == path), None)
    if entry is not None:
        _MOUNTED.remove(entry)
    exe = binary_path or (entry[1] if entry else binary())
    cmd = [exe, "unmount", "--timeout", str(timeout)] + (["--lazy"] if lazy else []) + [path]
    code, said = _run_to_the_end(cmd, timeout=timeout + 60)
    if code != 0:
        raise UnmountError(f"shufflefs unmount of {path} failed: {said or f'exit code {code}'}")


class UnmountError(RuntimeError):
    """`shufflefs unmount` refused or failed; the message is the daemon's."""


def _run_to_the_end(cmd, timeout):
    """Runs `cmd` to its end and returns (exit code, what it printed). An unmount stopped
    half-way leaves the mount, and a worker on its way out is interrupted often: torchrun
    signals a failed worker's siblings by process group (so the child runs in a session of
    its own), and a DataLoader's SIGCHLD handler raises RuntimeError in the main thread when
    its workers die (`subprocess.run` would kill the child on any exception while waiting:
    here the wait is taken up again). A child still running after `timeout` is killed."""
    # SIGTERM and SIGINT ignored (kept across exec): a worker's group is not the only thing
    # signalled when a job ends (seen: an unmount ended by SIGTERM in its own session).
    immune = ["/bin/sh", "-c", 'trap "" TERM INT; exec "$0" "$@"'] + list(cmd)
    with tempfile.TemporaryFile() as said:
        child = subprocess.Popen(immune, stdout=said, stderr=said, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        deadline = time.monotonic() + timeout
        interrupted = None
        while True:
            try:
                code = child.wait(timeout=max(0.0, deadline - time.monotonic()))
                break
            except subprocess.TimeoutExpired:
                child.kill()
                code = child.wait()
                break
            except Exception as e:  # raised by a signal handler: wait again
                interrupted = e
        said.seek(0)
        text = said.read().decode(errors="replace").strip()
    if interrupted is not None:
        raise interrupted
    return code, text


def _unmount_all():
    """Unmounts what this process mounted, and only in that process: a forked child (a
    DataLoader worker, a user's fork) inherits the list, the atexit hook and the signal
    handlers, and must not unmount the mounts its parent still reads. Lazily, and without
    waiting for the daemons to end: on the way out a DataLoader's workers (stopped after
    atexit hooks like this one) may still hold sample files open."""
    if os.getpid() != _STATE["owner"]:
        return
    _STATE["unmounting"] = True
    try:
        for path, exe in list(_MOUNTED):
            try:
                unmount(path, exe, lazy=True, timeout=1)
            except (OSError, UnmountError) as e:
                print(f"shufflefs: {e}", file=sys.stderr)
            except Exception:  # another handler's, raised while this one waited: exiting anyway
                pass
    finally:
        _STATE["unmounting"] = False


def _on_signal(signum, frame):
    previous = _HANDLED.get(signum)
    if os.getpid() != _STATE["owner"]:
        return _as_before(signum, frame, previous)  # a forked worker: as if we were not here
    if _STATE["unmounting"]:
        # Unmounting already (atexit, or a first signal): a second SIGTERM (torchrun's to a
        # worker that is ending) must not cut it short. A SIGKILL still ends the process.
        return None
    if callable(previous):
        # The script's own handler (SIGINT's raises KeyboardInterrupt) decides: if it
        # returns, training goes on, mounted; if it raises, the process ends through atexit,
        # which unmounts.
        return previous(signum, frame)
    # The default: the signal would end the process at once, with no atexit: unmount first.
    _unmount_all()
    return _as_before(signum, frame, previous)


def _as_before(signum, frame, previous):
    """What `signum` did before this package handled it: the old handler, else the default
    (the process ends by the signal, as it would have). Ignored signals are never handled
    here (`_remember` leaves them alone)."""
    if callable(previous):
        return previous(signum, frame)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return None


def _remember(path, exe):
    if _STATE["owner"] != os.getpid():
        # The first mount of this process (a forked child's copy names its parent's mounts).
        _MOUNTED.clear()
        _HANDLED.clear()
        _STATE.update(owner=os.getpid(), unmounting=False)
        atexit.register(_unmount_all)
        for sig in (signal.SIGTERM, signal.SIGINT):
            if signal.getsignal(sig) == signal.SIG_IGN:
                continue  # ignored (a job started in the background): it must stay so
            try:
                _HANDLED[sig] = signal.signal(sig, _on_signal)
            except ValueError:  # not the main thread: atexit still unmounts
                pass
    _MOUNTED.append((path, exe))
