"""Reads a record source's epoch views with the loaders users run, unmodified, and writes the
record ids each epoch held (every record of `make_dataset.py --records` carries its id).

    python check_records.py --mount MNT --kind svm|csv|fixed|tfrecord|tar --epochs 3 --out DIR
        [--record-size 64]

MNT may hold `{rank}` (replaced by OMPI_COMM_WORLD_RANK, 0 without mpirun). Writes
DIR/rank{R}-epoch{E}.json: {"ids": [...], "parts": N, "bytes": total}. Reading epoch E+1's
folder is what advances the mount, as a training loop does.

Readers: sklearn.datasets.load_svmlight_file (svm), pandas.read_csv (csv), numpy.fromfile
with a record dtype (fixed), tf.data.TFRecordDataset (tfrecord), webdataset.WebDataset and
tarfile (tar).
"""
import argparse
import json
import os
import tarfile


def read_svm(paths, _):
    from sklearn.datasets import load_svmlight_file

    ids = []
    for p in paths:
        x, _y = load_svmlight_file(p, zero_based=False)
        ids += [int(round(v)) for v in x[:, 0].toarray().ravel()]
    return ids


def read_csv(paths, _):
    import pandas

    ids = []
    for p in paths:
        df = pandas.read_csv(p)
        assert list(df.columns) == ["id", "label", "x0", "x1"], (p, list(df.columns))
        ids += [int(i) for i in df["id"]]
    return ids


def read_fixed(paths, size):
    import numpy

    dtype = numpy.dtype([("id", "<u8"), ("rest", f"V{size - 8}")])
    ids = []
    for p in paths:
        ids += [int(i) for i in numpy.fromfile(p, dtype=dtype)["id"]]
    return ids


def payload_id(data):
    head, _ = data.split(b"|", 1)
    assert head.startswith(b"record-"), data[:40]
    return int(head[len(b"record-"):])


def read_tfrecord(paths, _):
    if not paths:
        return []
    import tensorflow as tf

    return [payload_id(r.numpy()) for r in tf.data.TFRecordDataset(paths)]


def read_tar(paths, _):
    import webdataset as wds

    ids = []
    if paths:
        for sample in wds.WebDataset(paths, shardshuffle=False, empty_check=False):
            i = int(sample["__key__"])
            assert payload_id(sample["txt"]) == i, sample["__key__"]
            assert int(sample["cls"]) == i % 7, sample["__key__"]
            ids.append(i)
    # The standard library agrees: whole members, a proper end of archive.
    members = 0
    for p in paths:
        with tarfile.open(p) as t:
            for m in t:
                t.extractfile(m).read()
                members += 1
    assert members == 2 * len(ids), (members, len(ids))
    return ids


READERS = {"svm": read_svm, "csv": read_csv, "fixed": read_fixed, "tfrecord": read_tfrecord, "tar": read_tar}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount", required=True)
    ap.add_argument("--kind", required=True, choices=sorted(READERS))
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--record-size", type=int, default=64)
    a = ap.parse_args()
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    mount = a.mount.replace("{rank}", str(rank))
    for epoch in range(a.epochs):
        d = os.path.join(mount, f"epoch-{epoch}")
        parts = sorted(os.listdir(d))
        paths = [os.path.join(d, p) for p in parts]
        total = 0
        for p in paths:
            with open(p, "rb") as f:
                data = f.read()
            assert len(data) == os.path.getsize(p), (p, len(data), os.path.getsize(p))
            total += len(data)
        ids = READERS[a.kind](paths, a.record_size)
        with open(os.path.join(a.out, f"rank{rank}-epoch{epoch}.json"), "w") as f:
            json.dump({"ids": ids, "parts": len(parts), "names": parts, "bytes": total}, f)
    print(f"rank {rank}: read {a.epochs} epochs of {a.kind} parts")


if __name__ == "__main__":
    main()
