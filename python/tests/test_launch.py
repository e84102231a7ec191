import os
import signal
import stat
import tempfile
import unittest
from unittest import mock

from shufflefs import launch


def fake(folder, name, script):
    """An executable `folder/name` running the shell `script`."""
    exe = os.path.join(folder, name)
    with open(exe, "w") as f:
        f.write("#!/bin/sh\n" + script)
    os.chmod(exe, stat.S_IRWXU)
    return exe


class Launch(unittest.TestCase):
    def test_the_command_line_carries_the_settings_and_rank_templates(self):
        cmd = launch.mount_command("/src", "/c/{rank}", "/m/{rank}", fraction=0.3, seed=4,
                                   options=["--equal-shares", "drop"], exe="/bin/sfs")
        self.assertEqual(cmd, ["/bin/sfs", "mount", "--source", "/src", "--cache", "/c/{rank}",
                               "--fraction", "0.3", "--seed", "4", "--equal-shares", "drop",
                               "/m/{rank}"])

    def test_shufflefs_options_add_flags_after_the_scripts_own(self):
        extra = {"SHUFFLEFS_OPTIONS": "--exchange-rate 2000 --log 'a b'"}
        with mock.patch.dict(os.environ, extra):
            cmd = launch.mount_command("/src", "/c", "/m", options=["--seed", "1"], exe="/b")
        self.assertEqual(cmd, ["/b", "mount", "--source", "/src", "--cache", "/c", "--seed", "1",
                               "--exchange-rate", "2000", "--log", "a b", "/m"])

    def test_the_binary_is_the_explicit_then_shufflefs_then_path_one(self):
        with mock.patch.dict(os.environ, {"SHUFFLEFS": "/opt/sfs"}):
            self.assertEqual(launch.binary("/x"), "/x")
            self.assertEqual(launch.binary(), "/opt/sfs")
        with tempfile.TemporaryDirectory() as d:
            exe = os.path.join(d, "shufflefs")
            with open(exe, "w") as f:
                f.write("#!/bin/sh\n")
            os.chmod(exe, stat.S_IRWXU)
            env = {k: v for k, v in os.environ.items() if k != "SHUFFLEFS"}
            env["PATH"] = d
            with mock.patch.dict(os.environ, env, clear=True):
                self.assertEqual(launch.binary(), exe)
            env["PATH"] = os.path.join(d, "none")
            with mock.patch.dict(os.environ, env, clear=True):
                with self.assertRaisesRegex(FileNotFoundError, "pip install shufflefs"):
                    launch.binary()

    def test_a_host_without_fusermount3_is_named_with_the_fix(self):
        with mock.patch.dict(os.environ, {"PATH": "/nonexistent"}):
            with self.assertRaisesRegex(FileNotFoundError, "install the host's fuse3"):
                launch.require_fusermount()

    def test_a_refused_mount_raises_the_daemons_message(self):
        with tempfile.TemporaryDirectory() as d:
            exe = os.path.join(d, "shufflefs")
            with open(exe, "w") as f:
                f.write("#!/bin/sh\necho 'shufflefs: the source /src does not exist' >&2\nexit 1\n")
            os.chmod(exe, stat.S_IRWXU)
            with mock.patch.object(launch, "require_fusermount"):
                with self.assertRaisesRegex(RuntimeError, "rank 3.*the source /src does not exist"):
                    launch.mount("/src", os.path.join(d, "c"), os.path.join(d, "m{rank}"), rank=3,
                                 binary_path=exe)


    def test_only_the_process_that_mounted_unmounts_and_only_once(self):
        with mock.patch.object(launch, "unmount") as unmount, \
                mock.patch.object(launch, "_MOUNTED", [("/m", "/b")]), \
                mock.patch.dict(launch._STATE, {"owner": os.getpid() + 1, "unmounting": False}):
            launch._unmount_all()  # a forked child (a DataLoader worker): its parent's mount
            unmount.assert_not_called()
            launch._STATE["owner"] = os.getpid()
            launch._unmount_all()
            unmount.assert_called_once_with("/m", "/b", lazy=True, timeout=1)

    def test_a_signal_while_unmounting_on_the_way_out_does_not_interrupt_it(self):
        with mock.patch.object(launch, "_unmount_all") as again, \
                mock.patch.dict(launch._STATE, {"owner": os.getpid(), "unmounting": True}):
            launch._on_signal(15, None)  # returns: no SystemExit raised into the unmount
            again.assert_not_called()

    def test_signals_keep_their_meaning(self):
        term = signal.SIGTERM
        own = mock.Mock()
        with mock.patch.object(launch, "_unmount_all") as unmount_all, \
                mock.patch.object(launch.os, "kill") as kill, \
                mock.patch.object(launch.signal, "signal"), \
                mock.patch.dict(launch._HANDLED, {term: own}), \
                mock.patch.dict(launch._STATE, {"owner": os.getpid(), "unmounting": False}):
            launch._on_signal(term, None)  # the script's handler decides; it returned
            own.assert_called_once_with(term, None)
            unmount_all.assert_not_called()
            launch._HANDLED[term] = signal.SIG_DFL
            launch._on_signal(term, None)  # the default ends the process: unmount first
            unmount_all.assert_called_once()
            kill.assert_called_once_with(os.getpid(), term)
            launch._STATE["owner"] = os.getpid() + 1  # a forked worker: only the default
            launch._on_signal(term, None)
            self.assertEqual((unmount_all.call_count, kill.call_count), (1, 2))

    def test_an_unmount_interrupted_by_a_signal_handler_still_runs_to_its_end(self):
        with tempfile.TemporaryDirectory() as d:
            done = os.path.join(d, "done")
            exe = fake(d, "fake", f"sleep 1\ntouch {done}\n")

            def raise_once(signum, frame):  # as a DataLoader's SIGCHLD handler does
                signal.signal(signal.SIGALRM, signal.SIG_DFL)
                raise RuntimeError("DataLoader worker (pid 1) is killed by signal")

            previous = signal.signal(signal.SIGALRM, raise_once)
            try:
                signal.setitimer(signal.ITIMER_REAL, 0.2)
                with self.assertRaisesRegex(RuntimeError, "DataLoader worker"):
                    launch.unmount("/m", exe)
            finally:
                signal.signal(signal.SIGALRM, previous)
            self.assertTrue(os.path.exists(done), "the unmount was stopped half-way")

    def test_a_refused_unmount_raises_with_the_daemons_reason(self):
        with tempfile.TemporaryDirectory() as d:
            exe = fake(d, "fake", "echo 'files are open' >&2\nexit 1\n")
            with self.assertRaisesRegex(launch.UnmountError, "/m failed: files are open"):
                launch.unmount("/m", exe)

if __name__ == "__main__":
    unittest.main()
