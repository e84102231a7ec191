import errno
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
        # A total not known yet is not 100%: only the end of the phase says so.
        self.assertIn("0 B / 0 B   --%", progress.format_line("x", 0, 0, None))
        self.assertIn("100%", progress.format_line("x", 0, 0, None, finished=True))
        self.assertTrue(progress.format_line("x", 1, 2, None, "this host's ranks (2 of 8)")
                        .endswith("(this host's ranks (2 of 8))"))

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

    def test_the_last_line_says_the_mean_rate_of_the_bytes_it_saw_move(self):
        # The bytes are all there at 10 s, the phase is said done 5 s later: the mean is
        # over the 10 s they moved, not 0 B/s nor diluted by the wait.
        out = io.StringIO()
        line = progress.Line(out, "staging", tty=False, every=100)
        line.update(200, 1200, now=0.0)
        line.update(1200, 1200, now=10.0)
        line.update(1200, 1200, finished=True, now=15.0)
        self.assertIn("1.2 kB / 1.2 kB  100%  100 B/s  ETA 0:00", out.getvalue().splitlines()[-1])
        # Done at the first look: the phase's own rate where its status tells one, else none.
        out = io.StringIO()
        line = progress.Line(out, "exchange", tty=False)
        line.update(500, 500, finished=True, now=3.0, phase_rate=250.0)
        self.assertIn("500 B / 500 B  100%  250 B/s", out.getvalue())
        out = io.StringIO()
        line = progress.Line(out, "exchange", tty=False)
        line.update(500, 500, now=1.0)
        line.update(500, 500, finished=True, now=3.0)
        self.assertIn("100%  --/s", out.getvalue().splitlines()[-1])
        self.assertNotIn("0 B/s", out.getvalue())

    def test_an_exchange_measure_carries_its_own_rate(self):
        st = {"exchange": [{"target_epoch": 2, "state": "done", "bytes_received": 800,
                            "bytes_to_receive": 800, "seconds": 2.0}]}
        self.assertEqual(progress.exchange_measure([st], 2).rate, 400.0)
        rows = [{"rank": 0, "exchange": {"into_epoch": 2, "done_bytes": 1000, "total_bytes": 1000,
                                         "received_bytes": 600, "to_receive_bytes": 600,
                                         "rate_bytes_per_s": 500.0}}]
        view = {"updated_unix_ms": 1, "ranks": rows}
        self.assertEqual(progress.exchange_measure([{"job": view}], 2).rate, 300.0)

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
        # Sent plus received: every byte is in two rows, counted once.
        self.assertEqual(progress.exchange_measure([dict(local, job=job)], 1), (4, 9, 3, True))

    def test_disk_hand_offs_are_expected_at_the_mean_size(self):
        st = {"share_samples": 10, "share_bytes": 1000, "exchange": [{
            "target_epoch": 1, "state": "running", "bytes_received": 200, "bytes_to_receive": 0,
            "peers": [{"via": "disk", "samples_to_receive": 5, "bytes_received": 200}]}]}
        self.assertEqual(progress.exchange_bytes(st, 1), (200, 500))
        st["exchange"][0]["state"] = "done"
        self.assertEqual(progress.exchange_bytes(st, 1), (200, 200))
        self.assertEqual(progress.exchange_bytes(st, 2), (0, 0))


def row(rank, done, total, stale_s=None, into=1, moved=(0, 0)):
    """A row of the job-wide view as the job-view draft makes it (crates/shufflefs-fs/src/node/jobview/row.rs,
    board.rs: `RankRow` serialized, `stale_s` added when old)."""
    r = {"rank": rank, "host": f"node{rank // 2}", "epoch": 0,
         "staging": {"done": done, "total": total, "done_bytes": done * 10,
                     "total_bytes": total * 10},
         "exchange": {"into_epoch": into, "done_bytes": moved[0], "total_bytes": moved[1],
                      "rate_bytes_per_s": 0.0},
         "given_up_peers": [], "source_fallbacks": 0, "problems": 0, "first_problem": None,
         "cache_bytes": 0}
    if stale_s is not None:
        r["stale_s"] = stale_s
    return r


def with_view(rows, **local):
    st = {"world_size": len(rows), "staging": {"state": "done", "bytes_done": 0,
                                               "bytes_total": 0, "errors": 0}}
    st.update(local)
    return dict(st, job={"updated_unix_ms": 1_700_000_000_000, "ranks": rows})


class JobView(unittest.TestCase):
    def test_staged_only_when_every_row_is_fresh_known_and_done(self):
        done = [row(r, 5, 5) for r in range(4)]
        self.assertEqual(progress.staging_measure([with_view(done)]).state, "done")
        # Not heard from yet (only rank and stale_s), stale for a moment, total 0 (not known).
        for odd in ({"rank": 3, "stale_s": 1.5}, row(3, 5, 5, stale_s=4.0), row(3, 0, 0)):
            m = progress.staging_measure([with_view(done[:3] + [odd])])
            self.assertEqual(m.state, "running", odd)
        self.assertEqual(progress.staging_measure([with_view(done[:3] + [row(3, 2, 5)])]).done, 170)

    def test_a_rank_silent_for_long_stops_the_wait(self):
        rows = [row(0, 5, 5), row(1, 2, 5, stale_s=31.0), {"rank": 2, "stale_s": 45.0}]
        m = progress.staging_measure([with_view(rows)])
        self.assertEqual(m.state, "stale")
        self.assertIn("rank 1 on node0 (31 s)", m.note)
        self.assertIn("rank 2 (45 s)", m.note)
        # Rows are refreshed while an exchange runs: a rank silent for long is lost then too,
        # and a moment's silence is not.
        waiting = with_view(rows, advance_waiting={"target_epoch": 1, "seconds": 5})
        self.assertEqual(progress.exchange_measure([waiting], 1).state, "stale")
        short = [row(0, 5, 5), row(1, 2, 5, stale_s=4.0)]
        waiting = with_view(short, advance_waiting={"target_epoch": 1, "seconds": 5})
        self.assertEqual(progress.exchange_measure([waiting], 1).state, "running")

    def test_a_rank_that_left_counts_as_finished_not_dead(self):
        gone = dict(row(1, 2, 5), left=True)
        gone["staging"]["state"] = "staging"
        m = progress.staging_measure([with_view([row(0, 5, 5), gone])])
        self.assertEqual((m.state, m.note), ("done", ""))
        # Even with an age on it, a row that says it left is not "not heard from".
        self.assertEqual(progress.stale_note([dict(gone, stale_s=99.0)]), "")

    def test_exchange_counts_each_byte_once(self):
        rows = [row(0, 5, 5, moved=(300, 400)), row(1, 5, 5, moved=(300, 400)),
                row(2, 5, 5, into=0, moved=(999, 999))]
        waiting = with_view(rows, advance_waiting={"target_epoch": 1, "seconds": 5})
        self.assertEqual(progress.exchange_measure([waiting], 1), (300, 400, 3, False))
        # A row that says what it received is taken as it is.
        rows[0]["exchange"].update(received_bytes=250, to_receive_bytes=260)
        self.assertEqual(progress.exchange_measure([waiting], 1), (400, 460, 3, False))

    def test_a_rank_past_the_exchange_counts_as_complete(self):
        rows = [row(0, 5, 5, moved=(300, 400)), row(1, 5, 5, moved=(100, 400))]
        waiting = with_view(rows, advance_waiting={"target_epoch": 1, "seconds": 5})
        memo = {}
        self.assertEqual(progress.exchange_measure([waiting], 1, memo=memo), (200, 400, 2, False))
        # Rank 0 advanced: its row now shows the exchange into epoch 2, just begun.
        rows[0] = row(0, 5, 5, into=2, moved=(0, 999))
        rows[0]["epoch"] = 1
        waiting = with_view(rows, advance_waiting={"target_epoch": 1, "seconds": 6})
        self.assertEqual(progress.exchange_measure([waiting], 1, memo=memo), (250, 400, 2, False))

    def test_a_row_with_a_staging_state_is_done_by_it(self):
        rows = [row(0, 5, 5), row(1, 0, 0)]
        self.assertEqual(progress.staging_measure([with_view(rows)]).state, "running")
        rows[1]["staging"]["state"] = "done"  # an empty share
        self.assertEqual(progress.staging_measure([with_view(rows)]).state, "done")

    def test_an_incomplete_local_staging_is_not_done(self):
        st = with_view([row(0, 5, 5), row(1, 4, 5)],
                       staging={"state": "incomplete", "bytes_done": 40, "bytes_total": 50,
                                "errors": 1})
        m = progress.staging_measure([st])
        self.assertEqual((m.state, m.note), ("incomplete", "incomplete, 1 errors"))


class Watch(unittest.TestCase):
    def test_failed_staging_is_not_shown_done(self):
        with tempfile.TemporaryDirectory() as d:
            mounts = [make_mount(f"{d}/m{r}", world_size=2, staging={
                "state": state, "bytes_done": 800, "bytes_total": 1000, "errors": 3 * r})
                for r, state in enumerate(("done", "incomplete"))]
            out = io.StringIO()
            self.assertEqual(progress.watch_staging(mounts, out, poll=0.01), "incomplete")
            self.assertEqual(progress.main(["--every", "0", *mounts]), 1)
        last = out.getvalue().splitlines()[-1]
        self.assertIn("1.6 kB / 2.0 kB   80%", last)
        self.assertTrue(last.endswith("incomplete, 3 errors"), last)

    def test_local_sums_name_this_hosts_ranks(self):
        with tempfile.TemporaryDirectory() as d:
            mounts = [make_mount(f"{d}/m{r}", world_size=8, staging={
                "state": "done", "bytes_done": 10, "bytes_total": 10}) for r in range(2)]
            out = io.StringIO()
            progress.watch_staging(mounts + [f"{d}/elsewhere"], out)
        self.assertTrue(out.getvalue().rstrip().endswith("(this host's ranks (2 of 8))"), out.getvalue())

    def test_a_mount_that_stops_answering_ends_the_wait(self):
        with tempfile.TemporaryDirectory() as d:
            mounts = [make_mount(f"{d}/m{r}", staging={
                "state": "staging", "bytes_done": 1, "bytes_total": 10}) for r in range(2)]

            def die():
                time.sleep(0.1)
                os.remove(f"{mounts[1]}/.shufflefs/status")

            threading.Thread(target=die).start()
            out = io.StringIO()
            reader = progress.Mounts(mounts, gone_after=0.1)
            self.assertEqual(progress.watch_staging(reader, out, poll=0.02, every=10), "lost")
        self.assertIn("m1 stopped answering", out.getvalue().splitlines()[-1])

    def test_a_dead_fuse_mount_is_lost_at_once(self):
        reader = progress.Mounts(["/nonexistent/m0"])
        self.assertEqual(reader.read(), [])
        self.assertIsNone(reader.lost, "a mount elsewhere is skipped, not lost")
        with tempfile.TemporaryDirectory() as d:
            real_open = open

            def dead(path, *a, **k):
                if path.startswith(d):
                    raise OSError(errno.ENOTCONN, "Transport endpoint is not connected")
                return real_open(path, *a, **k)

            import builtins
            builtins.open, saved = dead, builtins.open
            try:
                reader = progress.Mounts([f"{d}/m0"])
                reader.read()
            finally:
                builtins.open = saved
        self.assertEqual(reader.lost, f"{d}/m0")

    def test_timeout_is_not_success(self):
        with tempfile.TemporaryDirectory() as d:
            m = make_mount(f"{d}/m0", staging={"state": "staging", "bytes_done": 1, "bytes_total": 10})
            out = io.StringIO()
            self.assertEqual(progress.watch_staging([m], out, poll=0.01, timeout=0.05), "timeout")
        self.assertIn("not staged after 0.05 s", out.getvalue())

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
            self.assertEqual(progress.watch_staging(mounts, out, poll=0.02, every=0.05), "done")
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
            self.assertEqual(progress.follow([mount], out, poll=0.02, every=0.05), "none")
            writer.join()
        lines = out.getvalue().splitlines()
        # Staging was done at the first look: the launcher said so already, no line again.
        self.assertFalse(any(x.startswith("staging") for x in lines), lines)
        exchange_lines = [x for x in lines if x.startswith("exchange into epoch 1  ")]
        self.assertGreater(len(exchange_lines), 1, lines)
        self.assertIn("400 B / 400 B  100%", exchange_lines[-1])
        self.assertEqual(lines[-1], exchange_lines[-1])


AWAY = ("s3://bucket/train/a.jpg: the store did not answer after 8 retries "
        "(Unreachable: connection refused); staging retries the round")


class Stalled(unittest.TestCase):
    """The store away: staging waits and retries while the statuses name the error. The line
    says it and the way out; before, it showed `0 B/s  ETA --:--` and nothing else."""

    def test_the_line_names_the_error_and_the_way_out_while_nothing_moves(self):
        with tempfile.TemporaryDirectory() as d:
            mounts = [make_mount(f"{d}/m{r}", rank=r, world_size=2, staging={
                "state": "staging", "bytes_done": 0, "bytes_total": 1000},
                cache={"problems": [AWAY]}) for r in range(2)]
            out = io.StringIO()
            ended = progress.watch_staging(mounts, out, poll=0.01, every=0, timeout=0.1,
                                           way_out="stop waiting with --staging-timeout S")
        self.assertEqual(ended, "timeout")
        stalled = out.getvalue().splitlines()[0]
        self.assertIn("ETA --:--  (2 ranks)  source errors (2 ranks; rank 0): s3://bucket/", stalled)
        self.assertIn("Unreachable", stalled)
        self.assertTrue(stalled.endswith("; stop waiting with --staging-timeout S"), stalled)

    def test_the_error_is_not_said_while_bytes_move(self):
        line = progress.Line(io.StringIO(), "staging", tty=False, every=0)
        line.update(0, 100, 1, now=0.0, stalled="source errors (rank 0): x")
        line.update(50, 100, 1, now=1.0, stalled="source errors (rank 0): x")
        first, moving = line.out.getvalue().splitlines()
        self.assertTrue(first.endswith("source errors (rank 0): x"), first)
        self.assertTrue(moving.endswith("(1 rank)"), moving)

    def test_the_job_view_names_the_first_rank_with_problems(self):
        rows = [row(r, 0, 5) for r in range(4)]
        for r in (1, 3):
            rows[r].update(problems=7, first_problem=f"rank{r}: {AWAY}\x1b[2J")
        m = progress.staging_measure([with_view(rows)])
        self.assertTrue(m.problem.startswith("source errors (2 ranks; rank 1): rank1: s3://"), m.problem)
        self.assertNotIn("\x1b", m.problem, "control characters are escaped")
        self.assertLessEqual(len(m.problem), len("source errors (2 ranks; rank 1): ") + progress.PROBLEM_CHARS)
        self.assertEqual(progress.staging_measure([with_view([row(0, 0, 5)])]).problem, "")


if __name__ == "__main__":
    unittest.main()
