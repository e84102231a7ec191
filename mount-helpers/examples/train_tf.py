"""A TensorFlow/Keras training script reading a shufflefs mount (one process per rank).

    mpirun -np 4 python train_tf.py --mount /mnt/sfs-{rank} --epochs 3            # epoch-N paths
    mpirun -np 4 python train_tf.py --mount /mnt/sfs-{rank} --epochs 3 --current  # one fixed path

Default: the change from a stock Keras script is the folder given to
`image_dataset_from_directory`: `shufflefs.epoch_dir(mount, epoch)`, rebuilt every epoch
(`shufflefs.tf.epoch_dataset` does that).

--current shows loaders that keep one path: a tf.data pipeline built once over
MOUNT/current/*/* (the pattern is matched inside the pipeline, so again on every pass), with
`shufflefs.advance(mount, epoch)` before each epoch to move `current` on
(`shufflefs.tf.current_dataset`).

Each process trains on its own rank's share; for multi-worker training wrap the model in
tf.distribute.MultiWorkerMirroredStrategy as usual, the data side stays the same.
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

import shufflefs  # noqa: E402
import shufflefs.tf  # noqa: E402


def rank_from_env():
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "RANK"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount", required=True, help="this rank's mount point; {rank} is replaced")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--current", action="store_true", help="read MOUNT/current with one pipeline")
    a = ap.parse_args()
    rank = rank_from_env()
    mount = a.mount.replace("{rank}", str(rank))
    shufflefs.wait_ready(mount)
    tf.keras.utils.set_random_seed(0)
    start = shufflefs.current_epoch(mount)  # 0 on a new mount; where it left off on a remount
    classes = sorted(os.listdir(shufflefs.epoch_dir(mount, start)))
    model = tf.keras.Sequential([
        tf.keras.layers.Input((a.size, a.size, 3)),
        tf.keras.layers.Rescaling(1 / 255),
        tf.keras.layers.Conv2D(16, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(len(classes)),
    ])
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    size = (a.size, a.size)
    fixed = shufflefs.tf.current_dataset(mount, classes, size, a.batch_size) if a.current else None
    losses = []
    for epoch in range(start, start + a.epochs):
        if fixed is not None:
            shufflefs.advance(mount, epoch)
            ds = fixed
        else:
            # The one-line change: this epoch's view of this rank's share.
            ds = shufflefs.tf.epoch_dataset(mount, epoch, image_size=size, batch_size=a.batch_size)
        losses.append(model.fit(ds, epochs=1, verbose=0).history["loss"][0])
        print(f"rank {rank} epoch {epoch}: loss {losses[-1]:.4f}", flush=True)
    print(f"rank {rank} first_loss={losses[0]:.4f} last_loss={losses[-1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
