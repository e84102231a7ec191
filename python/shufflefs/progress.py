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
import errno
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


def format_line(label, done, total, rate, ranks=None, finished=False):
    """`LABEL  DONE / TOTAL  PCT  RATE  ETA T  (RANKS)`, e.g.
    `staging  12.0 MB / 40.0 MB  30%  4.0 MB/s  ETA 0:07  (4 ranks)`. A total not known
    yet (0) shows `--%` until the phase ends. `ranks`: a count, or words said as given."""
    if total <= 0:
        pct = "100%" if finished else " --%"
    else:
        pct = f"{min(100.0, 100.0 * done / total):3.0f}%"
    eta = eta_seconds(done, total, rate) if total > 0 or finished else None
    parts = [
        label,
        f"{human_bytes(done)} / {human_bytes(total)}",
        pct,
        "--/s" if rate is None else f"{human_bytes(rate)}/s",
        "ETA " + ("--:--" if eta is None else human_seconds(eta)),
    ]
    if isinstance(ranks, int):
        parts.append(f"({ranks} rank{'' if ranks == 1 else 's'})")
    elif ranks is not None:
        parts.append(f"({ranks})")
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

# A rank of the job-wide view not heard from for longer than this is taken for dead: the wait
# stops, naming it, instead of waiting for it forever (rows come about once a second).
STALE_LIMIT = 30.0
# A mount that answered and then stops answering this long is taken for gone.
GONE_AFTER = 3.0


class Measure:
    """One look at a phase: `done`/`total` bytes, `ranks` (a count, or words such as
    `this host's ranks (2 of 8)`), `state` (`running`, `done`, or why it ended without being
    done: `incomplete`, `stale`) and `note` (what to say about that)."""

    def __init__(self, done, total, ranks, state="running", note="", rate=None):
        self.done, self.total, self.ranks, self.state, self.note = done, total, ranks, state, note
        # The phase's own mean rate where the statuses tell one (bytes/s), else None.
        self.rate = rate
        # What the statuses say fails ([`problem_note`]), shown while nothing moves.
        self.problem = ""

    def __iter__(self):  # (done, total, ranks, finished), as callers unpack it
        return iter((self.done, self.total, self.ranks, self.state == "done"))

    def __eq__(self, other):
        return tuple(self) == tuple(other)

    def __repr__(self):
        return f"Measure({self.done}, {self.total}, {self.ranks!r}, {self.state!r}, {self.note!r})"


class Mounts:
    """Reads the statuses of the mounts given. A mount that never answered is skipped (on
    another host); one that answered and then stops answering for `GONE_AFTER` seconds is
    `lost` (its daemon died), and so is a dead FUSE mount on this host at once (`ENOTCONN`:
    its daemon died before it was read)."""

    def __init__(self, mounts, gone_after=GONE_AFTER):
        self.mounts, self.gone_after = list(mounts), gone_after
        self.seen, self.failing = set(), {}
        self.lost = None

    def read(self, now=None):
        now = time.monotonic() if now is None else now
        out = []
        for m in self.mounts:
            try:
                with open(os.path.join(m, ".shufflefs", "status")) as f:
                    out.append(json.load(f))
                self.seen.add(m)
                self.failing.pop(m, None)
            except (OSError, ValueError) as e:
                if getattr(e, "errno", None) == errno.ENOTCONN:
                    self.lost = m
                elif m in self.seen and now - self.failing.setdefault(m, now) >= self.gone_after:
                    self.lost = m
        return out


def read_statuses(mounts):
    """The status of each mount that answers (others are skipped: on another host, gone)."""
    return Mounts(mounts).read()


def job_view(statuses):
    """The newest job-wide view (`job`) a status carries, else None."""
    views = [s["job"] for s in statuses if isinstance(s.get("job"), dict) and s["job"].get("ranks")]
    return max(views, key=lambda j: j.get("updated_unix_ms", 0)) if views else None


def job_ranks(statuses):
    """The job-wide view's ranks when a status carries one (the newest), else None."""
    view = job_view(statuses)
    return None if view is None else view["ranks"]


def stale_note(rows, limit=STALE_LIMIT):
    """Why the job-wide view says a rank is dead (not heard from for over `limit` s), or ''."""
    dead = [r for r in rows if (r.get("stale_s") or 0) > limit and not r.get("left")]
    if not dead:
        return ""
    names = ", ".join(f"rank {r.get('rank')}" + (f" on {r['host']}" if r.get("host") else "")
                      + f" ({r['stale_s']:.0f} s)" for r in dead[:8])
    return f"not heard from: {names}{' ...' if len(dead) > 8 else ''}"


def who(statuses):
    """The ranks a local sum covers: a count when they are the whole job, else words."""
    world = max((s.get("world_size") or 0 for s in statuses), default=0)
    if not world or len(statuses) >= world:
        return len(statuses)
    return f"this host's ranks ({len(statuses)} of {world})"


def row_staged(row):
    """A job-view row's staging is done: heard from lately, its total known, all of it done
    (or, where the row carries the staging's `state`, that state is `done`). A rank that left
    (`left`) stages nothing more: finished, whatever its last row says."""
    st = row.get("staging") or {}
    if row.get("left"):
        return True
    if "stale_s" in row:
        return False
    if "state" in st:
        return st["state"] == "done"
    total = st.get("total") or 0
    return total > 0 and (st.get("done") or 0) >= total


PROBLEM_CHARS = 160


def printable(text, limit=PROBLEM_CHARS):
    """`text` on one line, control characters escaped (a problem names a file or key, which
    could hold any byte) and cut to `limit` characters."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def problem_note(statuses):
    """What the statuses say fails (source errors, the store away), or '': the newest
    problem of a rank on this host (`cache.problems`), else the job-wide view's first one of
    the first rank reporting any, and how many ranks report some."""
    rows = [r for r in (job_ranks(statuses) or []) if r.get("problems")]
    local = [s for s in statuses if (s.get("cache") or {}).get("problems")]
    if local:
        rank, text = local[0].get("rank"), local[0]["cache"]["problems"][-1]
    elif rows:
        rank = rows[0].get("rank")
        text = rows[0].get("first_problem") or f"{rows[0]['problems']} source errors"
    else:
        return ""
    n = max(len(rows), len(local))
    where = f"rank {rank}" if n <= 1 else f"{n} ranks; rank {rank}"
    return f"source errors ({where}): {printable(text)}"


def staging_measure(statuses, stale_limit=STALE_LIMIT):
    """The staging [`Measure`], job-wide when a status carries the view, else over `statuses`."""
    rows = job_ranks(statuses)
    local = [s.get("staging") or {} for s in statuses]
    errors = sum(s.get("errors") or 0 for s in local)
    if rows is not None:
        st = [r.get("staging") or {} for r in rows]
        m = Measure(sum(s.get("done_bytes") or 0 for s in st),
                    sum(s.get("total_bytes") or 0 for s in st), len(rows))
        errors += sum(s.get("errors") or 0 for s in st if "errors" in s)
        incomplete = any(s.get("state") == "incomplete" for s in local + st)
        note = stale_note(rows, stale_limit)
        if note:
            m.state, m.note = "stale", note
        elif incomplete:
            m.state, m.note = "incomplete", f"incomplete, {errors} errors"
        elif all(row_staged(r) for r in rows):
            m.state = "done"
        m.problem = problem_note(statuses)
        return m
    m = Measure(sum(s.get("bytes_done") or 0 for s in local),
                sum(s.get("bytes_total") or 0 for s in local), who(statuses))
    states = [s.get("state") for s in local]
    if local and all(x in ("done", "incomplete") for x in states):
        if all(x == "done" for x in states):
            m.state = "done"
        else:
            m.state, m.note = "incomplete", f"incomplete, {errors} errors"
    m.problem = problem_note(statuses)
    return m


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


def remember(memo, row, target):
    """Keeps `row`'s bytes of the exchange into `target` in `memo`: as they are while it runs,
    as complete once the row has moved past it."""
    x = row.get("exchange") or {}
    into, rank = x.get("into_epoch"), row.get("rank")
    if into == target:
        memo[rank] = (received(x, "received_bytes", "done_bytes"),
                      received(x, "to_receive_bytes", "total_bytes"))
    elif (into is not None and into > target) or (row.get("epoch") or 0) >= target:
        whole = max(memo.get(rank, (0, 0)))
        memo[rank] = (whole, whole)


def received(x, field, both):
    """A row's bytes received: `field` where it has one, else half its sent-plus-received."""
    return x[field] if field in x else (x.get(both) or 0) / 2


def exchange_measure(statuses, target, stale_limit=STALE_LIMIT, memo=None):
    """The [`Measure`] of the exchange into `target`: done once no advance of these mounts
    waits for it. Job-wide, a row's `done_bytes`/`total_bytes` are sent plus received, so
    every byte sent over MPI is in two rows: the sums are halved to count it once (rows that
    carry `received_bytes`/`to_receive_bytes` are summed as they are instead).

    A rank whose advance is done moves on to the next exchange, and its row then shows that
    one: `memo` (rank to done/total, kept by the caller across calls) remembers its last
    numbers for `target` and counts them as complete, so the line neither shrinks nor goes
    back."""
    rows = job_ranks(statuses)
    waiting = any((s.get("advance_waiting") or {}).get("target_epoch") == target for s in statuses)
    if rows is not None:
        memo = {} if memo is None else memo
        for r in rows:
            remember(memo, r, target)
        done = int(sum(d for d, _ in memo.values()))
        total = int(sum(t for _, t in memo.values()))
        m = Measure(done, max(total, done), len(rows), "running" if waiting else "done",
                    rate=rows_rate(rows, target))
        # Rows are refreshed while an exchange runs too: one silent for long is a lost rank.
        note = stale_note(rows, stale_limit)
        if waiting and note:
            m.state, m.note = "stale", note
        return m
    pairs = [exchange_bytes(s, target) for s in statuses]
    return Measure(sum(p[0] for p in pairs), sum(p[1] for p in pairs), who(statuses),
                   "running" if waiting else "done", rate=statuses_rate(statuses, target))


def rows_rate(rows, target):
    """The job's rate of receiving in the exchange into `target`, from the rows still on it
    (each row's rate is of its sent plus received bytes: its received share of it), or None."""
    rate = 0.0
    for r in rows:
        x = r.get("exchange") or {}
        done = x.get("done_bytes") or 0
        if x.get("into_epoch") == target and done > 0:
            rate += (x.get("rate_bytes_per_s") or 0) * received(x, "received_bytes", "done_bytes") / done
    return rate or None


def statuses_rate(statuses, target):
    """These ranks' rate of receiving in the exchange into `target` (bytes over its
    seconds), or None before any of them tells its time."""
    rate = 0.0
    for s in statuses:
        for x in s.get("exchange", []):
            secs = x.get("seconds") or 0
            if x.get("target_epoch") == target and secs > 0:
                rate += (x.get("bytes_received") or 0) / secs
    return rate or None


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
        self.moved = None
        self.last_write = None
        self.width = 0

    def update(self, done, total, ranks=None, finished=False, now=None, phase_rate=None,
               stalled=""):
        """One look: `done` of `total` bytes. `finished`: the phase ended; its line says the
        mean rate ([`Line.mean_rate`]; `phase_rate`: the phase's own, where its status tells
        one, for when no byte moved while it was watched). `stalled`: said after the numbers
        while no byte moves (rate 0 or not known yet), e.g. the error that holds it up."""
        now = time.monotonic() if now is None else now
        rate = self.rate.add(now, done)
        self.first = self.first or (now, done)
        if done > (self.moved or self.first)[1]:
            self.moved = (now, done)
        if finished:
            rate = self.mean_rate(phase_rate)
            done = total = max(done, total)
        due = self.last_write is None or now - self.last_write >= self.every
        if not (due or finished):
            return
        text = format_line(self.label, done, total, rate, ranks, finished)
        if stalled and not finished and not rate:
            text = f"{text}  {stalled}"
        self.write(text, finished, now)

    def mean_rate(self, phase_rate=None):
        """The phase's mean rate: the bytes that moved from the first look until the last
        look that saw them move, over that time; not until the phase was said done, which
        may come seconds later (rows that flip to `done` after their bytes). Where no byte
        moved while watched (done before the first look), `phase_rate`, else None (`--/s`)."""
        if self.moved is not None:
            (t0, d0), (t1, d1) = self.first, self.moved
            if t1 > t0:
                return (d1 - d0) / (t1 - t0)
        return phase_rate if phase_rate else None

    def end(self, measure, now=None):
        """The last line of a phase that ended without being done: its numbers as they are,
        and why (`measure.note`)."""
        now = time.monotonic() if now is None else now
        text = format_line(self.label, measure.done, measure.total, None, measure.ranks)
        self.write(f"{text}  {measure.note}", True, now)

    def fail(self, note, now=None):
        """The last line of a phase that could not be measured to its end: why."""
        self.write(f"{self.label}  {note}", True, time.monotonic() if now is None else now)

    def write(self, text, last, now):
        self.last_write = now
        if self.tty:
            pad = " " * max(0, self.width - len(text))
            self.width = len(text)
            self.out.write("\r" + text + pad + ("\n" if last else ""))
        else:
            self.out.write(text + "\n")
        self.out.flush()


# --- watching ---------------------------------------------------------------------------------


def lost_note(mounts):
    return f"{mounts.lost} stopped answering (its daemon exited?)"


def look(reader, line):
    """The mounts' statuses, or how the watch ends: `lost` (said on `line`) or `none`."""
    statuses = reader.read()
    if reader.lost:
        line.fail(lost_note(reader))
        return None, "lost"
    if not statuses:
        return None, "none"
    return statuses, None


def watch_staging(mounts, out, poll=0.2, every=None, timeout=None, quiet_if_done=False,
                  way_out=""):
    """Shows staging until every share is staged. Returns how it ended: `done`, `none` (no
    mount answered), `lost` (a mount stopped answering), `incomplete` (staging ended with
    errors), `stale` (the job-wide view has not heard from a rank for long) or `timeout`.
    `quiet_if_done`: write nothing when staging was done at the first look. While no byte
    moves and the statuses report errors (the store away: staging waits and retries), the
    line names the error and `way_out` (how to stop waiting)."""
    reader = mounts if isinstance(mounts, Mounts) else Mounts(mounts)
    line = Line(out, "staging", every=every)
    deadline = None if timeout is None else time.monotonic() + timeout
    first = True
    while True:
        statuses, ended = look(reader, line)
        if ended:
            return ended
        m = staging_measure(statuses)
        if m.state in ("incomplete", "stale"):
            line.end(m)
            return m.state
        stalled = "; ".join(x for x in (m.problem, way_out if m.problem else "") if x)
        if not (first and quiet_if_done and m.state == "done"):
            line.update(m.done, m.total, m.ranks, m.state == "done", stalled=stalled)
        first = False
        if m.state == "done":
            return "done"
        if deadline is not None and time.monotonic() > deadline:
            line.end(Measure(m.done, m.total, m.ranks, "timeout", f"not staged after {timeout:g} s"))
            return "timeout"
        time.sleep(poll)


def watch_exchange(reader, out, target, poll=0.2, every=None):
    """Shows the exchange into `target` until no advance waits for it. Returns `done`,
    `none`, `lost` or `stale` (as [`watch_staging`])."""
    line = Line(out, f"exchange into epoch {target}", every=every)
    memo = {}
    while True:
        statuses, ended = look(reader, line)
        if ended:
            return ended
        m = exchange_measure(statuses, target, memo=memo)
        if m.state == "stale":
            line.end(m)
            return "stale"
        line.update(m.done, m.total, m.ranks, m.state == "done", phase_rate=m.rate)
        if m.state == "done":
            return "done"
        time.sleep(poll)


def follow(mounts, out, poll=0.2, every=None, after=1.0):
    """Staging (nothing when it is done already: the launcher showed it), then a line for
    every advance that waits longer than `after` seconds, until no mount answers any more.
    Returns how it ended, as [`watch_staging`] (`none` once the mounts went)."""
    reader = Mounts(mounts)
    ended = watch_staging(reader, out, poll, every, quiet_if_done=True)
    if ended != "done":
        return ended
    while True:
        statuses = reader.read()
        if reader.lost or not statuses:
            # The job ended: every mount went (a lone lost mount is the job ending too).
            return "none"
        target = waiting_target(statuses)
        waited = max((s.get("advance_waiting") or {}).get("seconds", 0) for s in statuses)
        if target is None or waited < after:
            time.sleep(poll)
            continue
        ended = watch_exchange(reader, out, target, poll, every)
        if ended == "stale":
            return ended
        if ended != "done":
            return "none"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m shufflefs.progress", description=__doc__.split("\n\n")[0])
    ap.add_argument("--staged", action="store_true", help="only staging (the default)")
    ap.add_argument("--follow", action="store_true", help="then every advance that waits, until the mounts go")
    ap.add_argument("--every", type=float, default=None,
                    help=f"seconds between lines (default {TTY_EVERY} on a terminal, {LOG_EVERY} in a log)")
    ap.add_argument("--timeout", type=float, default=None, help="give up staging after S seconds")
    ap.add_argument("--way-out", default="",
                    help="said after an error that holds staging up (how to stop waiting)")
    ap.add_argument("mounts", nargs="+")
    a = ap.parse_args(argv)
    every = a.every if a.every is not None else _env_every()
    if a.follow:
        ended = follow(a.mounts, sys.stderr, every=every)
        return 0 if ended == "none" else 1
    ended = watch_staging(a.mounts, sys.stderr, every=every, timeout=a.timeout, way_out=a.way_out)
    if ended == "none":
        print("shufflefs.progress: no mount answered", file=sys.stderr)
    return 0 if ended == "done" else 1


def _env_every():
    v = os.environ.get("SHUFFLEFS_PROGRESS_EVERY")
    return float(v) if v else None


if __name__ == "__main__":
    sys.exit(main())
