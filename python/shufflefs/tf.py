"""tf.data / Keras datasets on a shufflefs mount.

`epoch_dataset(mount, epoch, ...)` is Keras's `image_dataset_from_directory` over this
rank's view of `epoch` (rebuilt each epoch; building it advances the mount).
`current_dataset(mount, classes, ...)` is one pipeline built once over `MOUNT/current`: its
file pattern is matched inside the pipeline, so every pass lists the view of the epoch that
is current then: the mount must advance before each pass, which `AdvanceEachEpoch(mount)`
does as a Keras callback (`model.fit(ds, epochs=E, callbacks=[AdvanceEachEpoch(mount)])`),
or `shufflefs.advance(mount, epoch)` in a loop of one's own.
"""
import os

import tensorflow as tf

from . import advance, current_epoch, epoch_dir


def epoch_dataset(mount, epoch, image_size=(256, 256), batch_size=32, **kwargs):
    """`tf.keras.utils.image_dataset_from_directory` over this rank's view of `epoch`, with
    the class names of the whole dataset (every class folder is in every view), so labels
    agree across ranks and epochs."""
    path = epoch_dir(mount, epoch)
    kwargs.setdefault("verbose", False)
    kwargs.setdefault("class_names", sorted(e.name for e in os.scandir(path) if e.is_dir()))
    return tf.keras.utils.image_dataset_from_directory(
        path, image_size=image_size, batch_size=batch_size, **kwargs
    )


def current_dataset(mount, classes, image_size=(256, 256), batch_size=32, channels=3,
                    shuffle_buffer=100_000):
    """One pipeline over `MOUNT/current/*/*` (PNG or JPEG), valid for every epoch:
    `(image, label)` batches, labels indexing `classes`."""
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(classes), tf.range(len(classes), dtype=tf.int64)
        ),
        -1,
    )

    def load(path):
        label = table.lookup(tf.strings.split(path, "/")[-2])
        image = tf.io.decode_image(tf.io.read_file(path), channels=channels, expand_animations=False)
        return tf.image.resize(image, image_size), label

    # Not Dataset.list_files: in eager mode it matches the pattern once, when built.
    pattern = os.path.join(mount, "current", "*", "*")
    files = tf.data.Dataset.from_tensors(pattern).flat_map(
        lambda p: tf.data.Dataset.from_tensor_slices(tf.io.matching_files(p))
    )
    files = files.shuffle(shuffle_buffer, reshuffle_each_iteration=True)
    return files.map(load, num_parallel_calls=tf.data.AUTOTUNE).batch(batch_size).prefetch(2)


class AdvanceEachEpoch(tf.keras.callbacks.Callback):
    """Advances the mount as each Keras epoch begins, for `current_dataset`: Keras epoch `e`
    reads the mount's epoch `start + e`. `start` defaults to the mount's epoch when the
    callback is made, so a resumed job (remounted at epoch N, `initial_epoch=0`) carries on
    from N, and the first epoch's advance changes nothing."""

    def __init__(self, mount, start=None):
        super().__init__()
        self.mount = mount
        self.start = current_epoch(mount) if start is None else start

    def on_epoch_begin(self, epoch, logs=None):
        advance(self.mount, self.start + epoch)
