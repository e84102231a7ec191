"""Reads every epoch of this rank's mount with the real loaders and checks what they see.

    mpirun -np 4 python check_loaders.py --mount DIR/mnt-{rank} --source SRC --epochs 3 --out OUT

Run by tests/real_loaders.rs, one process per rank (the rank comes from the MPI launcher's
environment). For each epoch, on this rank:
  * torchvision ImageFolder(allow_empty=True) + DataLoader(num_workers=2, shuffle=True) reads
    every sample; `classes` and `class_to_idx` equal the source's; every image decodes and is
    pixel-identical to the source file of the same path, under the same label;
  * tf.keras.utils.image_dataset_from_directory does the same (class_names, labels, pixels).
It writes OUT/rank{R}-epoch{E}.json with both loaders' lists of class/name, so the test can
check that the ranks' lists partition the dataset every epoch. Exits non-zero on any mismatch.
"""
import argparse
import json
import os

import shufflefs


def rank_from_env():
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        if var in os.environ:
            return int(os.environ[var])
    raise SystemExit("check_loaders.py: run me under mpirun or srun")


def source_classes(source):
    return sorted(e.name for e in os.scandir(source) if e.is_dir())


def check_torch(path, source, classes):
    import torch
    from PIL import Image
    from torchvision import datasets, transforms

    to_tensor = transforms.ToTensor()
    ds = datasets.ImageFolder(path, transform=to_tensor, allow_empty=True)
    assert ds.classes == classes, f"torch classes {ds.classes} != source {classes}"
    assert ds.class_to_idx == {c: i for i, c in enumerate(classes)}, ds.class_to_idx

    class Indexed(torch.utils.data.Dataset):
        def __len__(self):
            return len(ds)

        def __getitem__(self, i):
            image, label = ds[i]
            return image, label, i

    loader = torch.utils.data.DataLoader(Indexed(), batch_size=8, shuffle=True, num_workers=2)
    seen = []
    for images, labels, idx in loader:
        for image, label, i in zip(images, labels.tolist(), idx.tolist()):
            rel = os.path.relpath(ds.samples[i][0], path)
            cls = rel.split(os.sep)[0]
            assert label == classes.index(cls), f"{rel}: label {label}, class {cls}"
            with Image.open(os.path.join(source, rel)) as im:
                want = to_tensor(im.convert("RGB"))
            assert torch.equal(image, want), f"{rel}: pixels differ from the source"
            seen.append(rel)
    assert sorted(seen) == sorted(os.path.relpath(p, path) for p, _ in ds.samples), "not every sample read once"
    return sorted(seen)


def check_tf(path, source, classes, size):
    import numpy as np
    import tensorflow as tf

    def load(p):
        return tf.image.decode_png(tf.io.read_file(p), channels=3).numpy()

    def open_ds(shuffle):
        return tf.keras.utils.image_dataset_from_directory(
            path, labels="inferred", label_mode="int", batch_size=8, image_size=(size, size),
            shuffle=shuffle, seed=1, verbose=False,
        )

    # As training reads it: shuffled, every image decoded.
    shuffled = open_ds(True)
    assert shuffled.class_names == classes, f"tf class_names {shuffled.class_names} != source {classes}"
    count = sum(int(labels.shape[0]) for _, labels in shuffled)
    # In file order (a shuffled dataset reshuffles on every pass, so its file_paths cannot be
    # matched to what a pass yields): labels and pixels against the source.
    ordered = open_ds(False)
    paths = [os.path.relpath(p, path) for p in ordered.file_paths]
    assert count == len(paths), (count, len(paths))
    i = 0
    for images, labels in ordered:
        for image, label in zip(images.numpy(), labels.numpy().tolist()):
            rel = paths[i]
            i += 1
            assert label == classes.index(rel.split(os.sep)[0]), f"{rel}: label {label}"
            assert np.array_equal(image.astype(np.uint8), load(os.path.join(source, rel))), f"{rel}: pixels differ"
    assert i == len(paths), (i, len(paths))
    return sorted(paths)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount", required=True, help="mount point, {rank} replaced")
    ap.add_argument("--source", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--size", type=int, default=32, help="image side in pixels")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rank = rank_from_env()
    mount = a.mount.replace("{rank}", str(rank))
    shufflefs.wait_ready(mount)
    classes = source_classes(a.source)
    for epoch in range(a.epochs):
        path = shufflefs.epoch_dir(mount, epoch)
        listing = sorted(
            os.path.join(c, f) for c in os.listdir(path) for f in os.listdir(os.path.join(path, c))
        )
        torch_seen = check_torch(path, a.source, classes)
        tf_seen = check_tf(path, a.source, classes, a.size)
        assert torch_seen == listing, "torch read a different set than the listing"
        assert tf_seen == listing, "tf read a different set than the listing"
        with open(os.path.join(a.out, f"rank{rank}-epoch{epoch}.json"), "w") as f:
            json.dump({"listing": listing, "torch": torch_seen, "tf": tf_seen}, f)
        print(f"rank {rank} epoch {epoch}: torch and tf read {len(listing)} samples, all checked", flush=True)


if __name__ == "__main__":
    main()
