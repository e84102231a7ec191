"""One live progress line for a job: while it stages its shares, and while an epoch advance
waits for its exchange. Bytes, rate and ETA, for the whole job where the status carries the
job-wide view (its `job` object), else summed over the rank mounts given (those on this host).

    python3 -m shufflefs.progress --staged MOUNT...   # until every share is staged
    python3 -m shufflefs.progress --follow MOUNT...   # staging, then every advance that waits

On a terminal the line is rewritten in place (`\\r`); in a log (not a terminal) a plain line is
written every `--every` seconds (10 by default), and a last one when the phase ends, at 100%.
Only the standard library: `shufflefs-launch` runs it with the system's python3.
"""
import argparse
import json
import os
import sys
import time
from collections import deque

LOG_EVERY = 10.0
TTY_EVERY = 0.5


def human_bytes(n):
    """`n` bytes in SI units, e.g. `1.5 MB`."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} TB"


def human_seconds(s):
    """`s` seconds as `M:SS` or `H:MM:SS`."""
    s = int(round(s))
    h, m = divmod(s, 3600)
    m, s = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def eta_seconds(done, total, rate):
    """Seconds left at `rate` bytes/s, or None when it cannot be told (no rate yet)."""
    if done >= total:
        return 0.0
    if not rate or rate <= 0:
        return None
    return (total - done) / rate


def format_line(label, done, total, rate, ranks=None):
    """`LABEL  DONE / TOTAL  PCT  RATE  ETA T`, e.g.
    `staging  12.0 MB / 40.0 MB  30%  4.0 MB/s  ETA 0:07  (4 ranks)`."""
    pct = 100.0 if total <= 0 else min(100.0, 100.0 * done / total)
    eta = eta_seconds(done, total, rate)
    parts = [
        label,
        f"{human_bytes(done)} / {human_bytes(total)}",
        f"{pct:3.0f}%",
        "--/s" if rate is None else f"{human_bytes(rate)}/s",
        "ETA " + ("--:--" if eta is None else human_seconds(eta)),
    ]
    if ranks is not None:
        parts.append(f"({ranks} rank{'' if ranks == 1 else 's'})")
    return "  ".join(parts)


class Rate:
    """Bytes per second over the last `window` seconds of (time, done) samples."""

    def __init__(self, window=10.0):
        self.window = window
        self.points = deque()

    def add(self, t, done):
        self.points.append((t, done))
        while len(self.points) > 2 and t - self.points[0][0] > self.window:
            self.points.popleft()
        (t0, d0), (t1, d1) = self.points[0], self.points[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else None


# --- what the statuses say -------------------------------------------------------------------


def read_statuses(mounts):
    """The status of each mount that answers (others are skipped: on another host, gone)."""
    out = []
    for m in mounts:
        try:
            with open(os.path.join(m, ".shufflefs", "status")) as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            pass
    return out


def job_ranks(statuses):
    """The job-wide view's ranks when a status carries one (the newest), else None."""
    views = [s["job"] for s in statuses if isinstance(s.get("job"), dict) and s["job"].get("ranks")]
    if not views:
        return None
    return max(views, key=lambda j: j.get("updated_unix_ms", 0))["ranks"]


def staging_measure(statuses):
    """(done_bytes, total_bytes, ranks, finished) of staging, job-wide when known."""
    ranks = job_ranks(statuses)
    if ranks is not None:
        st = [r.get("staging", {}) for r in ranks]
        done = sum(s.get("done_bytes", 0) for s in st)
        total = sum(s.get("total_bytes", 0) for s in st)
        finished = all(s.get("done", 0) >= s.get("total", 0) for s in st)
        return done, total, len(ranks), finished
    st = [s["staging"] for s in statuses]
    done = sum(s["bytes_done"] for s in st)
    total = sum(s["bytes_total"] for s in st)
    finished = bool(st) and all(s["state"] in ("done", "incomplete") for s in st)
    return done, total, len(st), finished


def exchange_bytes(status, target):
    """(received, expected) bytes of this rank's exchange into `target`. Samples handed over
    on this host's disk have no byte count before they are taken: they are expected at the
    share's mean sample size. (0, 0) when the exchange is not known yet."""
    x = [e for e in status.get("exchange", []) if e["target_epoch"] == target]
    if not x:
        return 0, 0
    x = x[0]
    if x["state"] == "done":
        return x["bytes_received"], x["bytes_received"]
    mean = status["share_bytes"] / status["share_samples"] if status.get("share_samples") else 0
    disk = [p for p in x.get("peers", []) if p.get("via") == "disk"]
    expected = x["bytes_to_receive"] + sum(
        max(p["bytes_received"], p["samples_to_receive"] * mean) for p in disk
    )
    return x["bytes_received"], max(int(expected), x["bytes_received"])


def waiting_target(statuses):
    """The epoch some advance waits for, or None."""
    targets = [s["advance_waiting"]["target_epoch"] for s in statuses if s.get("advance_waiting")]
    return min(targets) if targets else None


def exchange_measure(statuses, target):
    """(done_bytes, total_bytes, ranks, finished) of the exchange into `target`."""
    ranks = job_ranks(statuses)
    finished = not any(
        s.get("advance_waiting", {}).get("target_epoch") == target for s in statuses
    )
    if ranks is not None:
        xs = [r.get("exchange") or {} for r in ranks]
        xs = [x for x in xs if x.get("into_epoch") == target]
        done = sum(x.get("done_bytes", 0) for x in xs)
        total = sum(x.get("total_bytes", 0) for x in xs)
        return done, max(total, done), len(ranks), finished
    pairs = [exchange_bytes(s, target) for s in statuses]
    return sum(p[0] for p in pairs), sum(p[1] for p in pairs), len(statuses), finished


# --- the line --------------------------------------------------------------------------------


class Line:
    """Writes one phase's progress: rewritten in place on a terminal, a plain line every
    `every` seconds otherwise, and always a last line when the phase ends."""

    def __init__(self, out, label, tty=None, every=None):
        self.out, self.label = out, label
        self.tty = out.isatty() if tty is None else tty
        self.every = every if every is not None else (TTY_EVERY if self.tty else LOG_EVERY)
        self.rate = Rate()
        self.first = None
        self.last_write = None
        self.width = 0

    def update(self, done, total, ranks=None, finished=False, now=None):
        now = time.monotonic() if now is None else now
        rate = self.rate.add(now, done)
        self.first = self.first or (now, done)
        if finished:
            # The last line says the whole phase's mean rate.
            done = total = max(done, total)
            t0, d0 = self.first
            rate = (done - d0) / (now - t0) if now > t0 else rate
        due = self.last_write is None or now - self.last_write >= self.every
        if not (due or finished):
            return
        self.last_write = now
        text = format_line(self.label, done, total, rate, ranks)
        if self.tty:
            pad = " " * max(0, self.width - len(text))
            self.width = len(text)
            self.out.write("\r" + text + pad + ("\n" if finished else ""))
        else:
            self.out.write(text + "\n")
        self.out.flush()


def watch_staging(mounts, out, poll=0.2, every=None, timeout=None):
    """Shows staging until every share is staged. Returns False if no mount answered."""
    line = Line(out, "staging", every=every)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        statuses = read_statuses(mounts)
        if not statuses:
            return False
        done, total, ranks, finished = staging_measure(statuses)
        line.update(done, total, ranks, finished)
        if finished or (deadline is not None and time.monotonic() > deadline):
            return True
        time.sleep(poll)


def follow(mounts, out, poll=0.2, every=None, after=1.0):
    """Staging, then a line for every advance that waits longer than `after` seconds, until
    no mount answers any more."""
    if not watch_staging(mounts, out, poll, every):
        return
    while True:
        statuses = read_statuses(mounts)
        if not statuses:
            return
        target = waiting_target(statuses)
        waited = max((s.get("advance_waiting") or {}).get("seconds", 0) for s in statuses)
        if target is None or waited < after:
            time.sleep(poll)
            continue
        line = Line(out, f"exchange into epoch {target}", every=every)
        while True:
            statuses = read_statuses(mounts)
            if not statuses:
                return
            done, total, ranks, finished = exchange_measure(statuses, target)
            line.update(done, total, ranks, finished)
            if finished:
                break
            time.sleep(poll)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m shufflefs.progress", description=__doc__.split("\n\n")[0])
    ap.add_argument("--staged", action="store_true", help="only staging (the default)")
    ap.add_argument("--follow", action="store_true", help="then every advance that waits, until the mounts go")
    ap.add_argument("--every", type=float, default=None,
                    help=f"seconds between lines (default {TTY_EVERY} on a terminal, {LOG_EVERY} in a log)")
    ap.add_argument("mounts", nargs="+")
    a = ap.parse_args(argv)
    every = a.every if a.every is not None else _env_every()
    if a.follow:
        follow(a.mounts, sys.stderr, every=every)
    elif not watch_staging(a.mounts, sys.stderr, every=every):
        print("shufflefs.progress: no mount answered", file=sys.stderr)
        return 1
    return 0


def _env_every():
    v = os.environ.get("SHUFFLEFS_PROGRESS_EVERY")
    return float(v) if v else None


if __name__ == "__main__":
    sys.exit(main())
