import tempfile
import unittest

try:
    import torch
    from torchvision import transforms
except ImportError:  # the package needs neither; these helpers do
    torch = None

from images import image_mount


@unittest.skipIf(torch is None, "torch and torchvision are not installed")
class TorchHelpers(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        # Class b is empty in epoch 1 on this rank: its index must not shift.
        self.mount = image_mount(self.dir.name, {0: {"a": 3, "b": 2}, 1: {"a": 4, "b": 0}})

    def tearDown(self):
        self.dir.cleanup()

    def test_epoch_dataset_keeps_every_class(self):
        import shufflefs.torch

        ds = shufflefs.torch.epoch_dataset(self.mount, 1, transforms.ToTensor())
        self.assertEqual(ds.classes, ["a", "b"])
        self.assertEqual(len(ds), 4)
        image, label = ds[0]
        self.assertEqual(tuple(image.shape), (3, 8, 8))
        self.assertEqual(label, 0)

    def test_epoch_loader_reads_the_whole_view_once(self):
        import shufflefs.torch

        loader = shufflefs.torch.epoch_loader(self.mount, 0, batch_size=2, transform=transforms.ToTensor())
        labels = sorted(int(y) for _, ys in loader for y in ys)
        self.assertEqual(labels, [0, 0, 0, 1, 1])

    def test_iterable_splits_the_view_across_workers(self):
        import shufflefs.torch

        ds = shufflefs.torch.EpochIterable(self.mount, 0, seed=1)
        self.assertEqual(len(ds), 5)
        once = [(bytes(x[:8]), y) for x, y in ds]
        self.assertEqual(sorted(y for _, y in once), [0, 0, 0, 1, 1])
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
        self.assertEqual(sorted(int(y) for _, y in loader), [0, 0, 0, 1, 1])
        again = [(bytes(x[:8]), y) for x, y in shufflefs.torch.EpochIterable(self.mount, 0, seed=1)]
        self.assertEqual(once, again)


if __name__ == "__main__":
    unittest.main()
