"""Per-epoch figures of the epoch-time benchmark, computed the same way for every system, and
its report (results.json, table.md, epoch_time.png).

Definitions (docs/performance.md, "Epoch time against global shuffling, mosaic and litdata"):
  wall         seconds from the barrier before the epoch to the barrier after it (slowest rank)
  samples/s    samples read by all ranks in the epoch / wall
  store bytes  bytes the storage host's link sent during the epoch (tc counters); shared mode: n/a
  link bytes   bytes all compute hosts' links received during the epoch (store + peers + control)
  peak disk    largest bytes allocated under a rank's local folder during the epoch, max over ranks
  novelty      for e >= 1: mean over ranks of |S_r(e) minus S_r(e-1)| / |S_r(e)|, S_r(e) = the set
               of samples rank r read in epoch e (global shuffling: about 1 - 1/ranks; local: 0)
  batch TV     mean over ranks and batches of 64 consecutive samples (in the order the rank
               consumed them) of the total variation distance between the batch's class mix
               and the dataset's (0 = every batch has the global mix; `iid` = what uniformly
               random batches give)
"""
import json
import os
import threading
import time

import numpy as np

BATCH = 64


class CounterSampler:
    """Samples Hosts.counters() every `every` seconds in a thread; `at(t)` interpolates."""

    def __init__(self, hosts, every=0.1):
        self.hosts, self.every, self.samples = hosts, every, []
        self.stop_ev = threading.Event()
        self.samples.append((time.time(), hosts.counters()))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop_ev.wait(self.every):
            self.samples.append((time.time(), self.hosts.counters()))

    def stop(self):
        self.stop_ev.set()
        self.thread.join()
        self.samples.append((time.time(), self.hosts.counters()))

    def at(self, t, key):
        ts = [s[0] for s in self.samples]
        vals = [s[1][key] for s in self.samples]
        if vals[0] is None:
            return None
        return float(np.interp(t, ts, vals))

    def between(self, t0, t1, key):
        a, b = self.at(t0, key), self.at(t1, key)
        return None if a is None else b - a


def tv_distance(labels, mix, batch=BATCH):
    """Mean total variation distance of consecutive batches' class mix from `mix`."""
    k = len(mix)
    out = []
    for s in range(0, len(labels) - batch + 1, batch):
        h = np.bincount(labels[s:s + batch], minlength=k) / batch
        out.append(0.5 * np.abs(h - mix).sum())
    return float(np.mean(out)) if out else None


def iid_tv(mix, batch=BATCH, trials=2000, seed=0):
    rng = np.random.default_rng(seed)
    h = rng.multinomial(batch, mix, size=trials) / batch
    return float((0.5 * np.abs(h - mix).sum(axis=1)).mean())


def summarize(records, sampler, mix):
    """records: the clients' JSON lines of one (system, loop). Returns the staging figures and
    one dict per epoch."""
    stag = [r for r in records if r["what"] == "staging"]
    ep = [r for r in records if r["what"] == "epoch"]
    out = {"staging": None, "epochs": []}
    if stag:
        t0, t1 = min(r["t0"] for r in stag), max(r["t1"] for r in stag)
        out["staging"] = {"wall": t1 - t0, "store_bytes": sampler.between(t0, t1, "store_tx"),
                          "link_bytes": sampler.between(t0, t1, "hosts_rx"),
                          "peak_disk": max(r["peak_disk"] for r in stag)}
    if stag and ep:  # the whole run, staging to the last barrier: nothing falls between windows
        t0, t1 = min(r["t0"] for r in stag), max(r["t1"] for r in ep)
        out["total"] = {"store_bytes": sampler.between(t0, t1, "store_tx"),
                        "link_bytes": sampler.between(t0, t1, "hosts_rx")}
    prev = {}
    for e in sorted({r["epoch"] for r in ep}):
        rs = [r for r in ep if r["epoch"] == e]
        t0, t1 = min(r["t0"] for r in rs), max(r["t1"] for r in rs)
        wall = t1 - t0
        nov = [len(set(r["names"]) - prev[r["rank"]]) / max(1, len(r["names"]))
               for r in rs if r["rank"] in prev]
        tvs = [x for x in (tv_distance(np.array(r["labels"], dtype=int), mix) for r in rs) if x is not None]
        out["epochs"].append({
            "epoch": e, "wall": wall, "samples": sum(r["samples"] for r in rs),
            "samples_per_s": sum(r["samples"] for r in rs) / wall if wall > 0 else None,
            "read_bytes": sum(r["bytes"] for r in rs),
            "store_bytes": sampler.between(t0, t1, "store_tx"),
            "link_bytes": sampler.between(t0, t1, "hosts_rx"),
            "peak_disk": max(r["peak_disk"] for r in rs),
            "novelty": float(np.mean(nov)) if nov else None,
            "batch_tv": float(np.mean(tvs)) if tvs else None,
        })
        prev = {r["rank"]: set(r["names"]) for r in rs}
    return out


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def _fmt(x, scale=1.0, digits=2):
    return "n/a" if x is None else f"{x / scale:.{digits}f}"


def disk_cell(peak, budget):
    return f"{peak / 1e6:.0f}" + (" (over budget)" if peak > budget * 1.02 else "")


def row(name, res, budget):
    """One table row: the run's figures, or its reason when it did not run."""
    if res.get("error"):
        return f"| {name} | failed: {res['error']} |" + " |" * 8
    s, eps = res["summary"]["staging"] or {}, res["summary"]["epochs"]
    later = eps[1:]
    total = res["summary"].get("total") or {}
    return "| " + " | ".join([
        name, _fmt(s.get("wall"), 1, 1), _fmt(eps[0]["wall"] if eps else None),
        _fmt(_mean(e["wall"] for e in later)), _fmt(_mean(e["samples_per_s"] for e in later), 1, 0),
        _fmt(total.get("store_bytes"), 1e9, 3), _fmt(total.get("link_bytes"), 1e9, 3),
        disk_cell(max([e["peak_disk"] for e in eps] + [s.get("peak_disk", 0)]), budget),
        _fmt(_mean(e["novelty"] for e in later)), _fmt(_mean(e["batch_tv"] for e in eps)),
    ]) + " |"


HEADER = ("| system | staging (s) | epoch 0 (s) | later epochs (s, mean) | samples/s (later) | "
          "store GB (staging + epochs) | host links GB (staging + epochs) | peak disk MB | novelty | batch TV |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def later_wall(res):
    eps = (res.get("summary") or {}).get("epochs", [])[1:]
    return _mean(e["wall"] for e in eps)


BUCKET_SUFFIX = " (bucket)"  # the rows of --store-kind s3 (benches/epoch_time.py)


def ratios(per, meta):
    """The issue's targets as ratios of this run: shufflefs Q=0.3 against local, global and
    the streaming libraries (later epochs), and its store bytes against the dataset; one line
    for the folder rows and one for the bucket rows (each against rows reading the same)."""
    lines = []
    for suffix in ("", BUCKET_SUFFIX):
        me_row = "shufflefs-q0.3" + suffix
        me = later_wall(per.get(me_row, {}))
        if me is None:
            continue
        parts = []
        for other, target in (("local", "<= 1.1x"), ("global", "<= 0.3x"), ("mosaic", "<= 0.5x"), ("litdata", "<= 0.5x")):
            # a bucket row without its bucket peer is set against the folder row (local)
            name = other + suffix if other + suffix in per else other
            w = later_wall(per.get(name, {}))
            if w:
                parts.append(f"/ {name} {me / w:.2f}x (target {target})")
        store = ((per[me_row].get("summary") or {}).get("total") or {}).get("store_bytes")
        if store is not None:
            parts.append(f"store bytes / dataset {store / meta['dataset_bytes']:.2f}x (target <= 1.1x)")
        lines.append(f"{me_row}, later epochs: " + ", ".join(parts))
    return "\n\n".join(lines) or "ratios: no shufflefs-q0.3 row"


def write_report(out_dir, meta, results):
    """results: {loop: {system: {"summary": ..., "error": ...}}}."""
    json.dump({"meta": meta, "results": results}, open(os.path.join(out_dir, "results.json"), "w"), indent=1)
    lines = [f"# Epoch time ({meta['machine']})", "", "```", meta["command"], "```", "",
             f"{meta['hosts']} hosts x 1 rank, {meta['samples']} samples, dataset {meta['dataset_bytes'] / 1e9:.2f} GB, "
             f"host links {meta['rate']}, store link {meta['store_rate']}, mode {meta['mode']}; "
             f"disk budget per host {meta['budget'] / 1e6:.0f} MB ((1+{meta['q']}) x share); "
             f"conversion (s): {meta['conversion']}; batch TV of iid batches: {meta['iid_tv']:.3f}; "
             f"commit {meta.get('commit', '?')}", ""]
    if meta.get("bucket"):
        lines += [f"Rows `(bucket)` read the bucket {meta['bucket']}; the others the store folder.", ""]
    for loop, per in results.items():
        lines += [f"## loop: {loop}", "", HEADER]
        lines += [row(name, res, meta["budget"]) for name, res in per.items()]
        lines += ["", ratios(per, meta)]
        lines += ["", "Epoch wall times (s):", "",
                  "| system | " + " | ".join(f"e{e}" for e in range(meta["epochs"])) + " |",
                  "|---|" + "---|" * meta["epochs"]]
        for name, res in per.items():
            eps = (res.get("summary") or {}).get("epochs", [])
            lines.append(f"| {name} | " + " | ".join(_fmt(e["wall"]) for e in eps) + " |")
        lines.append("")
    open(os.path.join(out_dir, "table.md"), "w").write("\n".join(lines) + "\n")
    plot(os.path.join(out_dir, "epoch_time.png"), meta, results)


def plot(path, meta, results):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loops = list(results)
    fig, axes = plt.subplots(1, len(loops) + 1, figsize=(5.5 * (len(loops) + 1), 4.2))
    for ax, loop in zip(axes, loops):
        for name, res in results[loop].items():
            eps = (res.get("summary") or {}).get("epochs", [])
            if eps:
                ax.plot([e["epoch"] for e in eps], [e["wall"] for e in eps], marker="o", label=name)
        ax.set_xticks(range(meta["epochs"]))
        ax.set_title(f"{loop} loop: epoch wall time")
        ax.set_xlabel("epoch")
        ax.set_ylabel("seconds")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    ax = axes[-1]
    first = results[loops[0]]
    names = list(first)
    key = "store_bytes" if meta["mode"] == "private" else "link_bytes"
    vals = [((first[n].get("summary") or {}).get("total") or {}).get(key) or 0 for n in names]
    vals = [v / 1e9 for v in vals]
    ax.bar(range(len(names)), vals)
    ax.axhline(meta["dataset_bytes"] / 1e9, color="k", ls="--", lw=1, label="dataset")
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=7)
    what = "store" if key == "store_bytes" else "host link"
    ax.set_title(f"{loops[0]} loop: {what} GB, staging + {meta['epochs']} epochs", fontsize=10)
    ax.legend(fontsize=7)
    fig.suptitle(f"{meta['hosts']} hosts, {meta['dataset_bytes'] / 1e9:.2f} GB, links {meta['rate']} ({meta['machine']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
