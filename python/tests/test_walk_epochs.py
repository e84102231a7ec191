"""mount-helpers/walk_epochs.py's account of what moved into an epoch (standard library only)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "mount-helpers"))
import walk_epochs  # noqa: E402


def peer(via, same_host, n, fetched=0):
    return {"via": via, "same_host": same_host, "samples_received": n,
            "bytes_received": n * 100, "fetched_from_source": fetched}


class MovedInto(unittest.TestCase):
    def test_partial_exchange_names_the_ways_apart(self):
        st = {"exchange": [{"target_epoch": 1, "samples_received": 10, "bytes_received": 1000,
                            "bytes_across_hosts": 200, "peers": [
                                peer("disk", True, 5), peer("mpi", True, 3, 1),
                                peer("mpi", False, 2, 2)]}]}
        self.assertEqual(walk_epochs.moved_into(st, 1), {
            "disk": [5, 500], "mpi, same host": [3, 300], "network": [2, 200], "source": [3, 0]})
        self.assertEqual(walk_epochs.moved_into(st, 2)["disk"], [0, 0])

    def test_a_coded_exchange_is_told_from_its_totals(self):
        # --exchange coded: only the totals, no peers (src/exchange/coded/client.rs).
        st = {"exchange": [{"target_epoch": 1, "samples_received": 7, "bytes_received": 7000,
                            "bytes_across_hosts": 7000, "peers": []}]}
        moved = walk_epochs.moved_into(st, 1)
        self.assertEqual(moved["network"], [7, 7000])
        self.assertEqual(moved["mpi, same host"], [0, 0])


if __name__ == "__main__":
    unittest.main()
