import os
import tempfile
import unittest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
try:
    import tensorflow as tf
except ImportError:  # the package does not need it; these helpers do
    tf = None

from images import image_mount


@unittest.skipIf(tf is None, "tensorflow is not installed")
class TfHelpers(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.mount = image_mount(self.dir.name, {0: {"a": 3, "b": 2}, 1: {"a": 0, "b": 4}})

    def tearDown(self):
        self.dir.cleanup()

    def test_epoch_dataset_labels_by_every_class(self):
        import shufflefs.tf

        ds = shufflefs.tf.epoch_dataset(self.mount, 1, image_size=(8, 8), batch_size=8, shuffle=False)
        images, labels = next(iter(ds))
        self.assertEqual(tuple(images.shape), (4, 8, 8, 3))
        self.assertEqual(sorted(labels.numpy().tolist()), [1, 1, 1, 1])

    def test_current_dataset_lists_the_view_on_every_pass(self):
        import shufflefs.tf

        os.symlink("epoch-0", os.path.join(self.mount, "current"))
        ds = shufflefs.tf.current_dataset(self.mount, ["a", "b"], image_size=(8, 8), batch_size=16)
        self.assertEqual(sorted(next(iter(ds))[1].numpy().tolist()), [0, 0, 0, 1, 1])
        os.remove(os.path.join(self.mount, "current"))
        os.symlink("epoch-1", os.path.join(self.mount, "current"))
        self.assertEqual(sorted(next(iter(ds))[1].numpy().tolist()), [1, 1, 1, 1])

    def test_advance_each_epoch_advances_as_keras_epochs_begin(self):
        import shufflefs.tf
        from fake import write_status

        write_status(self.mount, epoch=3)  # a resumed job: the mount is at epoch 3
        asked = []
        callback = shufflefs.tf.AdvanceEachEpoch(self.mount)

        class Record(tf.keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                with open(os.path.join(callback.mount, ".shufflefs", "epoch")) as f:
                    asked.append(int(f.read()))

        model = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        data = tf.data.Dataset.from_tensor_slices(([[1.0], [2.0]], [[1.0], [2.0]])).batch(2)
        model.fit(data, epochs=3, verbose=0, callbacks=[callback, Record()])
        self.assertEqual(asked, [3, 4, 5])


if __name__ == "__main__":
    unittest.main()
