import os
import tempfile
import unittest
import warnings

import shufflefs
from fake import make_mount, write_status


class Helpers(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.mount = make_mount(self.dir.name, epoch=2, views={2: {"a": ["x"]}, 3: {"a": []}})

    def tearDown(self):
        self.dir.cleanup()

    def test_epoch_dir_and_current_epoch(self):
        self.assertEqual(shufflefs.current_epoch(self.mount), 2)
        self.assertEqual(shufflefs.epoch_dir(self.mount, 3), os.path.join(self.mount, "epoch-3"))
        with self.assertRaisesRegex(FileNotFoundError, "at epoch 2"):
            shufflefs.epoch_dir(self.mount, 7)
        self.assertEqual(list(shufflefs.epochs(self.mount, 3)), [2, 3, 4])

    def test_advance_writes_the_epoch(self):
        shufflefs.advance(self.mount, 3)
        with open(os.path.join(self.mount, ".shufflefs", "epoch")) as f:
            self.assertEqual(f.read(), "3\n")

    def test_wait_ready_staged(self):
        write_status(self.mount, staging={"files_done": 1, "files_total": 2})
        with self.assertRaises(TimeoutError):
            shufflefs.wait_ready(self.mount, timeout=0.3, staged=True)
        write_status(self.mount, staging={"files_done": 2, "files_total": 2})
        self.assertEqual(shufflefs.wait_ready(self.mount, staged=True)["staging"]["files_done"], 2)

    def test_rank_mount(self):
        os.environ["OMPI_COMM_WORLD_RANK"] = "3"
        try:
            self.assertEqual(shufflefs.rank_mount("/mnt/sfs-{rank}"), "/mnt/sfs-3")
        finally:
            del os.environ["OMPI_COMM_WORLD_RANK"]
        self.assertEqual(shufflefs.rank_mount("/m{rank}", rank=1), "/m1")

    def test_check_version_warns_on_a_mismatch(self):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            self.assertEqual(shufflefs.check_version(self.mount), shufflefs.__version__)
            self.assertEqual(seen, [])
            write_status(self.mount, version="9.9.9")
            self.assertEqual(shufflefs.check_version(self.mount), "9.9.9")
        self.assertEqual(len(seen), 1)
        self.assertIn("9.9.9", str(seen[0].message))

    def test_a_path_that_is_no_mount_is_named(self):
        plain = os.path.join(self.dir.name, "plain")
        os.mkdir(plain)
        for call in (shufflefs.status, shufflefs.check_version, shufflefs.current_epoch):
            with self.assertRaisesRegex(shufflefs.NotAMountError, "plain is not a shufflefs mount"):
                call(plain)
        gone = os.path.join(self.dir.name, "nowhere")
        with self.assertRaisesRegex(FileNotFoundError, "nowhere does not exist"):
            shufflefs.status(gone)

    def test_check_version_warns_when_no_binary_is_found(self):
        saved = os.environ.pop("SHUFFLEFS", None)
        try:
            os.environ["SHUFFLEFS"] = "/nonexistent/shufflefs"
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                self.assertIsNone(shufflefs.check_version())
                self.assertIsNone(shufflefs.check_version(binary="/nonexistent/sfs"))
            self.assertEqual(len(seen), 2, [str(w.message) for w in seen])
            self.assertIn("SHUFFLEFS=/nonexistent/shufflefs", str(seen[0].message))
            self.assertIn("/nonexistent/sfs", str(seen[1].message))
        finally:
            os.environ.pop("SHUFFLEFS", None)
            if saved is not None:
                os.environ["SHUFFLEFS"] = saved

    def test_binary_version(self):
        binary = os.environ.get("SHUFFLEFS")
        if not binary:
            self.skipTest("SHUFFLEFS (the binary) not set")
        self.assertEqual(shufflefs.binary_version(binary), shufflefs.__version__)
        self.assertIsNone(shufflefs.binary_version("/nonexistent/shufflefs"))


if __name__ == "__main__":
    unittest.main()
