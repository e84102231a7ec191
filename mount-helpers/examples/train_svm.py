"""A linear SVM trained on a LIBSVM record source through shufflefs parts, one process per rank.

    mpirun -np 4 python train_svm.py --mount /mnt/sfs-{rank} --epochs 3

The mount serves `--format records --framing lines` over LIBSVM shards (e.g. made by
`make_dataset.py OUT --records svm`). Every epoch this rank reads its parts, `epoch-N/part-*`,
with `sklearn.datasets.load_svmlight_file` as they are, in the fresh order shufflefs gave them,
and feeds them to `SGDClassifier.partial_fit`. Each rank trains its own model here (no
parameter averaging); the point is the data path. Prints one line per epoch and, at the end,
`first_acc=` and `last_acc=` (accuracy on the rank's own data of the last epoch).
"""
import argparse
import json
import os

import numpy
from sklearn.datasets import load_svmlight_file
from sklearn.linear_model import SGDClassifier

import shufflefs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount", required=True, help="mount path; {rank} is replaced by the rank")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--features", type=int, default=64, help="feature columns (n_features)")
    ap.add_argument("--record", metavar="DIR",
                    help="after each epoch, write DIR/epoch-E.rank-R.json: the record ids this "
                    "rank read (column 0) and its mount's status, to check a run")
    a = ap.parse_args()
    # mpirun sets OMPI_COMM_WORLD_RANK, srun SLURM_PROCID (and PMIX_RANK).
    rank = next((int(os.environ[n]) for n in ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
                 if n in os.environ), 0)
    mount = a.mount.replace("{rank}", str(rank))
    shufflefs.wait_ready(mount)
    model = SGDClassifier(loss="hinge", random_state=rank)
    first = last = None
    start = shufflefs.current_epoch(mount)
    for epoch in range(start, start + a.epochs):
        d = shufflefs.epoch_dir(mount, epoch)
        xs, ys = [], []
        ids = []
        for part in sorted(os.listdir(d)):
            x, y = load_svmlight_file(os.path.join(d, part), n_features=a.features)
            ids.extend(int(i) for i in x[:, 0].toarray().ravel())
            # Column 0 is make_dataset.py's record id (bookkeeping, not a feature).
            x = x[:, 1:].tocsr()
            x.indices = x.indices.astype(numpy.int32)  # SGDClassifier takes 32-bit indices
            x.indptr = x.indptr.astype(numpy.int32)
            model.partial_fit(x, y, classes=numpy.array([0.0, 1.0]))
            xs.append(x)
            ys.append(y)
        if a.record:
            out = os.path.join(a.record, f"epoch-{epoch}.rank-{rank}.json")
            os.makedirs(a.record, exist_ok=True)
            with open(out + ".tmp", "w") as f:
                json.dump({"ids": ids, "status": shufflefs.status(mount)}, f)
            os.replace(out + ".tmp", out)
        if not xs:
            print(f"rank {rank} epoch {epoch}: no records this epoch")
            continue
        acc = float(numpy.mean([model.score(x, y) for x, y in zip(xs, ys)]))
        first = acc if first is None else first
        last = acc
        print(f"rank {rank} epoch {epoch}: {sum(len(y) for y in ys)} records in {len(xs)} parts, acc {acc:.3f}")
    print(f"rank {rank}: first_acc={first} last_acc={last}")


if __name__ == "__main__":
    main()
