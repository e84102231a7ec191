import io
import os
import tempfile
import threading
import time
import unittest

from fake import make_mount, write_status
from shufflefs import progress


class Formatting(unittest.TestCase):
    def test_units(self):
        self.assertEqual(progress.human_bytes(999), "999 B")
        self.assertEqual(progress.human_bytes(1500), "1.5 kB")
        self.assertEqual(progress.human_bytes(12_300_000), "12.3 MB")
        self.assertEqual(progress.human_seconds(7), "0:07")
        self.assertEqual(progress.human_seconds(3725), "1:02:05")

    def test_eta(self):
        self.assertEqual(progress.eta_seconds(30, 100, 7), 10.0)
        self.assertIsNone(progress.eta_seconds(30, 100, 0))
        self.assertIsNone(progress.eta_seconds(30, 100, None))
        self.assertEqual(progress.eta_seconds(100, 100, None), 0.0)

    def test_line(self):
        line = progress.format_line("staging", 12_000_000, 40_000_000, 4_000_000, ranks=4)
        self.assertEqual(line, "staging  12.0 MB / 40.0 MB   30%  4.0 MB/s  ETA 0:07  (4 ranks)")
        self.assertIn("--/s  ETA --:--", progress.format_line("x", 1, 10, None))
        self.assertIn("100%", progress.format_line("x", 0, 0, None))

    def test_rate_over_a_window(self):
        r = progress.Rate(window=10)
        self.assertIsNone(r.add(0, 0))
        self.assertEqual(r.add(1, 100), 100)
        self.assertEqual(r.add(2, 300), 150)
        for t in range(3, 30):
            rate = r.add(t, 300 + (t - 2) * 10)
        self.assertAlmostEqual(rate, 10)

    def test_line_in_a_log_is_written_every_so_often_and_at_the_end(self):
        out = io.StringIO()
        line = progress.Line(out, "staging", tty=False, every=10)
        for t in range(0, 25):
            line.update(t, 100, now=float(t))
        line.update(100, 100, finished=True, now=25.0)
        lines = out.getvalue().splitlines()
        self.assertEqual(len(lines), 4)  # at 0, 10, 20 and the end
        self.assertIn("100 B / 100 B  100%  4 B/s  ETA 0:00", lines[-1])

    def test_line_on_a_terminal_is_rewritten(self):
        out = io.StringIO()
        line = progress.Line(out, "staging", tty=True, every=0)
        line.update(50, 100, now=0.0)
        line.update(100, 100, finished=True, now=1.0)
        text = out.getvalue()
        self.assertEqual(text.count("\r"), 2)
        self.assertTrue(text.endswith("\n"))
        self.assertEqual(text.count("\n"), 1)


class Measures(unittest.TestCase):
    def test_job_view_wins_over_local_sums(self):
        local = {"staging": {"bytes_done": 1, "bytes_total": 2, "state": "staging"}}
        job = {"updated_unix_ms": 5, "ranks": [
            {"rank": r, "staging": {"done": 1, "total": 2, "done_bytes": 10, "total_bytes": 20},
             "exchange": {"into_epoch": 1, "done_bytes": 3, "total_bytes": 6}} for r in range(3)]}
        self.assertEqual(progress.staging_measure([local]), (1, 2, 1, False))
        self.assertEqual(progress.staging_measure([dict(local, job=job)]), (30, 60, 3, False))
        self.assertEqual(progress.exchange_measure([dict(local, job=job)], 1), (9, 18, 3, True))

    def test_disk_hand_offs_are_expected_at_the_mean_size(self):
        st = {"share_samples": 10, "share_bytes": 1000, "exchange": [{
            "target_epoch": 1, "state": "running", "bytes_received": 200, "bytes_to_receive": 0,
            "peers": [{"via": "disk", "samples_to_receive": 5, "bytes_received": 200}]}]}
        self.assertEqual(progress.exchange_bytes(st, 1), (200, 500))
        st["exchange"][0]["state"] = "done"
        self.assertEqual(progress.exchange_bytes(st, 1), (200, 200))
        self.assertEqual(progress.exchange_bytes(st, 2), (0, 0))


class Watch(unittest.TestCase):
    def test_staging_lines_end_at_100_percent(self):
        with tempfile.TemporaryDirectory() as d:
            mounts = [make_mount(f"{d}/m{r}") for r in range(2)]

            def stage():
                for i in range(6):
                    for m in mounts:
                        write_status(m, staging={"state": "staging" if i < 5 else "done",
                                                 "bytes_done": 200 * i, "bytes_total": 1000})
                    time.sleep(0.1)

            for m in mounts:
                write_status(m, staging={"state": "starting", "bytes_done": 0, "bytes_total": 1000})
            writer = threading.Thread(target=stage)
            writer.start()
            out = io.StringIO()
            self.assertTrue(progress.watch_staging(mounts, out, poll=0.02, every=0.05))
            writer.join()
        lines = out.getvalue().splitlines()
        self.assertGreater(len(lines), 2, lines)
        self.assertTrue(all(line.startswith("staging  ") for line in lines), lines)
        self.assertIn("2.0 kB / 2.0 kB  100%", lines[-1])
        self.assertIn("(2 ranks)", lines[-1])


    def test_follow_shows_a_waiting_advance_until_it_is_done(self):
        staged = {"state": "done", "bytes_done": 10, "bytes_total": 10}

        def exchange(received, state):
            return [{"target_epoch": 1, "state": state, "bytes_received": received,
                     "bytes_to_receive": 400, "peers": []}]

        with tempfile.TemporaryDirectory() as d:
            mount = make_mount(f"{d}/m0", staging=staged, share_samples=4, share_bytes=40,
                               exchange=exchange(0, "running"))

            def advance():
                for received in (100, 200, 300):
                    write_status(mount, staging=staged, share_samples=4, share_bytes=40,
                                 exchange=exchange(received, "running"),
                                 advance_waiting={"target_epoch": 1, "seconds": 2.0})
                    time.sleep(0.15)
                write_status(mount, staging=staged, exchange=exchange(400, "done"), epoch=1)
                time.sleep(0.3)
                os.remove(f"{mount}/.shufflefs/status")  # the mount went

            writer = threading.Thread(target=advance)
            writer.start()
            out = io.StringIO()
            progress.follow([mount], out, poll=0.02, every=0.05)
            writer.join()
        lines = out.getvalue().splitlines()
        self.assertTrue(lines[0].startswith("staging  10 B / 10 B  100%"), lines)
        exchange_lines = [x for x in lines if x.startswith("exchange into epoch 1  ")]
        self.assertGreater(len(exchange_lines), 1, lines)
        self.assertIn("400 B / 400 B  100%", exchange_lines[-1])
        self.assertEqual(lines[-1], exchange_lines[-1])


if __name__ == "__main__":
    unittest.main()
