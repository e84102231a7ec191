"""Where the benchmark's hosts are and how to run things on them: the ONE place that knows the
emulated cluster (mount-helpers/shufflefs-cluster). Everything else asks this module for a
host's LOCAL folder, the STORE path as hosts see it, a command run on a host, an mpirun over
the compute hosts, and the byte counters of the links.

Two modes:
  shared   today's cluster: hosts are network + UTS namespaces sharing one filesystem. Host h0
           plays the storage host (its link shaped to --store-rate; the coded server runs
           there), hosts h1..hN compute. STORE is the dataset folder itself (read without a
           network: store bytes are not measured in this mode) and LOCAL is a folder per host
           under the scratch folder.
  private  hosts with their own mount namespace and disk, the dataset served by a storage host
           over sshfs (`shufflefs-cluster up NAME --hosts N --store DIR ...`); LOCAL and STORE
           are the canonical paths `shufflefs-cluster info NAME` prints, the same on every
           host, and store bytes are what the storage host's link sent.
"""
import os
import shutil
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
# SHUFFLEFS_CLUSTER: another checkout's script (to try a cluster not merged here yet)
CLUSTER = os.environ.get("SHUFFLEFS_CLUSTER") or os.path.join(HERE, "..", "..", "mount-helpers", "shufflefs-cluster")


def link_bytes(dev, what):
    """Bytes counted by the root namespace's end of a host's veth (`tx` = sent to the host,
    `rx` = sent by it): a sysfs read, cheap enough to sample ten times a second."""
    with open(f"/sys/class/net/{dev}/statistics/{what}_bytes") as f:
        return int(f.read())


class Hosts:
    def __init__(self, name, n, mode, scratch, rate, store_rate, store_dir, subnet, disk=None):
        self.name, self.n, self.mode, self.scratch = name, n, mode, scratch
        self.rate, self.store_rate, self.store_dir, self.subnet = rate, store_rate, store_dir, subnet
        self.disk = disk
        self.info = {}

    # ---- life cycle ----
    def up(self):
        if self.mode == "shared":
            # private hosts are the default and `--shared` asks for these
            shared = ["--shared"] if "--shared" in open(CLUSTER).read() else []
            self._cluster("up", self.name, "--hosts", str(self.n + 1), "--rate", self.rate,
                          "--subnet", self.subnet, *shared)
            self._cluster("shape", self.name, "h0", self.store_rate)
            for i in self.compute:
                os.makedirs(self._local_shared(i), exist_ok=True)
        else:
            args = ["up", self.name, "--hosts", str(self.n), "--rate", self.rate, "--subnet",
                    self.subnet, "--store", self.store_dir, "--store-rate", self.store_rate]
            if self.disk:
                args += ["--disk", self.disk]
            self._cluster(*args)
        self.info = self._read_info()

    def down(self):
        subprocess.run([CLUSTER, "down", self.name], capture_output=True)

    def _cluster(self, *args):
        subprocess.run([CLUSTER, *args], check=True, stdout=subprocess.DEVNULL)

    def _read_info(self):
        """Addresses and netns per host index, and in private mode LOCAL, STORE and the storage
        host's address and netns, from `shufflefs-cluster info`: lines `I ADDR HOSTNAME NETNS
        RATE`, `private hosts: local LOCAL disk ...` and `store ADDR HOSTNAME NETNS RATE serves
        DIR at STORE ...`."""
        out = subprocess.run([CLUSTER, "info", self.name], capture_output=True, text=True, check=True).stdout
        info = {"addr": {}, "netns": {}}
        for line in out.splitlines():
            f = line.split()
            if len(f) >= 4 and f[0].isdigit():
                info["addr"][int(f[0])], info["netns"][int(f[0])] = f[1], f[3]
            elif line.startswith("private hosts:") and "local" in f:
                info["local"] = f[f.index("local") + 1]
            elif f and f[0] == "store" and "at" in f:
                info["storage"] = {"addr": f[1], "netns": f[3], "path": f[f.index("at") + 1]}
        if self.mode == "private" and ("local" not in info or "storage" not in info):
            raise SystemExit(f"epoch_time: `shufflefs-cluster info {self.name}` shows no private "
                             f"hosts or no store (this checkout's cluster has no private hosts? "
                             f"use --mode shared):\n{out}")
        return info

    # ---- which hosts ----
    @property
    def compute(self):
        """Host indices of the compute ranks, rank r on compute[r]."""
        return list(range(1, self.n + 1)) if self.mode == "shared" else list(range(self.n))

    @property
    def server_host(self):
        """Where the coded server rank runs: on the storage host, reading the dataset folder
        without the network (`store`, private mode, `mpirun --with-store`); h0, the storage
        host's stand-in, in shared mode."""
        return 0 if self.mode == "shared" else "store"

    def server_source(self):
        """The dataset folder as the server's host sees it."""
        return self.store_dir if self.mode == "private" else self.store

    def addr(self, i):
        return self.info["storage"]["addr"] if i == "store" else self.info["addr"][i]

    # ---- paths as a host sees them ----
    def _local_shared(self, i):
        return os.path.join(self.scratch, f"local-r{self.compute.index(i)}")

    def local(self, i):
        if self.mode == "shared":
            return self._local_shared(i)
        return self.info["local"]

    def local_template(self):
        """LOCAL with `{rank}` for the compute ranks' shufflefs command line."""
        if self.mode == "shared":
            return os.path.join(self.scratch, "local-r{rank}")
        return self.info["local"]

    @property
    def store(self):
        return self.store_dir if self.mode == "shared" else self.info["storage"]["path"]

    # ---- running things ----
    @staticmethod
    def _host_id(i):
        """`exec`'s HOST: hI for a host index, `store` as is."""
        return i if i == "store" else f"h{i}"

    def popen(self, i, argv, **kw):
        return subprocess.Popen([CLUSTER, "exec", self.name, self._host_id(i), *argv], **kw)

    def run(self, i, argv, **kw):
        return subprocess.run([CLUSTER, "exec", self.name, self._host_id(i), *argv], **kw)

    def mpirun(self, mpirun_args, **kw):
        """`shufflefs-cluster mpirun NAME -- MPIRUN-ARGS` (placement is the caller's, -H; the
        storage host is in the hostfile in private mode)."""
        store = ["--with-store"] if self.mode == "private" else []
        return subprocess.Popen([CLUSTER, "mpirun", self.name, *store, "--", *mpirun_args], **kw)

    def clean_local(self, sub):
        """Removes LOCAL/sub on every compute host."""
        for i in self.compute:
            if self.mode == "shared":
                shutil.rmtree(os.path.join(self.local(i), sub), ignore_errors=True)
            else:
                self.run(i, ["rm", "-rf", os.path.join(self.local(i), sub)])

    # ---- counters ----
    def counters(self):
        """{'store_tx': bytes the storage host's link sent (None in shared mode), 'hosts_rx':
        bytes the compute hosts' links received, 'hosts_tx': bytes they sent}, from the
        bridge-side ends of the veths (the store's is named after its netns)."""
        c = {"hosts_rx": 0, "hosts_tx": 0, "store_tx": None}
        for i in self.compute:
            c["hosts_rx"] += link_bytes(f"sfs-{self.name}-h{i}", "tx")
            c["hosts_tx"] += link_bytes(f"sfs-{self.name}-h{i}", "rx")
        if self.mode == "private":
            c["store_tx"] = link_bytes(self.info["storage"]["netns"], "rx")
        return c
