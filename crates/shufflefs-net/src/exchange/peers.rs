//! Which ranks can take samples straight from each other's cache folders: ranks of one
//! host whose caches each of them can see. A sample moving between two such ranks never
//! crosses MPI; the receiver links (or copies) it from the sender's cache on the shared disk.
//!
//! Sharing a host name is not enough: ranks of one host may run in containers with
//! different filesystems. So every rank publishes its cache folder's path with the device
//! and inode numbers it sees there, and checks, for every other rank of its host, that the
//! same path names the same folder. A host's ranks form one disk group only if every pair
//! of them sees each other's cache; otherwise each of them is on its own (everything goes
//! over MPI, as before).

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::comm::{Comm, CommError};
use crate::sys::sync::Locked;

/// The cache folders of all ranks, and which ranks share a disk.
#[derive(Clone, Debug, Default)]
pub struct Peers {
    /// Cache folder of each rank, as that rank named it.
    pub caches: Vec<PathBuf>,
    /// Disk group of each rank: ranks with the same value can read each other's caches.
    pub disks: Vec<u32>,
    /// The ranks that left the job (see [`Left`]).
    pub(crate) left: Left,
}

/// The ranks that left the job while this one goes on, each with the last exchange it
/// takes part in. A rank that stops serves one more exchange than it ran (see
/// `Partial::leave`) and says so in that exchange's confirmations; later exchanges leave
/// it out, and what it would have sent comes from the source. A rank far slower than the
/// others leaves the exchanges the same way (`slow`, see the executor's `stop`) while it
/// goes on reading its views.
#[derive(Clone, Debug, Default)]
pub(crate) struct Left(Arc<Mutex<BTreeMap<u32, (u64, bool)>>>);

impl Left {
    /// `rank` takes part in no exchange after the one into `last`.
    pub(crate) fn mark(&self, rank: u32, last: u64) {
        let mut left = self.0.locked();
        left.entry(rank).or_insert((last, false));
    }

    /// As [`Left::mark`], because `rank` (or this rank) is far slower than the others.
    pub(crate) fn mark_slow(&self, rank: u32, last: u64) {
        let mut left = self.0.locked();
        left.entry(rank).or_insert((last, true));
    }

    /// Whether `rank` takes part in the exchange into `target`.
    pub(crate) fn takes_part(&self, rank: u32, target: u64) -> bool {
        let left = self.0.locked();
        left.get(&rank).is_none_or(|&(last, _)| target <= last)
    }

    /// Whether `rank` left the exchanges for being far slower (see [`Left::mark_slow`]).
    pub(crate) fn slow(&self, rank: u32) -> bool {
        let left = self.0.locked();
        left.get(&rank).is_some_and(|&(_, slow)| slow)
    }
}

impl Peers {
    /// No disk sharing: every rank on its own disk (all samples move over the transport).
    pub fn separate(world: u32) -> Peers {
        Peers {
            caches: vec![PathBuf::new(); world as usize],
            disks: (0..world).collect(),
            left: Left::default(),
        }
    }

    /// Collective: learns every rank's cache folder and which ranks share a disk. A rank
    /// that passes `share = false` sees nobody, which puts its whole host on the transport.
    pub fn discover(comm: &mut dyn Comm, cache: &Path, share: bool) -> Result<Peers, CommError> {
        let me = comm.rank() as usize;
        let id = |p: &Path| std::fs::metadata(p).map(|m| (m.dev(), m.ino())).ok();
        let (dev, ino) = id(cache).unwrap_or((u64::MAX, u64::MAX));
        let mut mine = dev.to_le_bytes().to_vec();
        mine.extend_from_slice(&ino.to_le_bytes());
        mine.extend_from_slice(cache.as_os_str().as_encoded_bytes());
        let all = comm.all_gather(&mine)?;
        let caches: Vec<PathBuf> = (all.iter())
            .map(|m| PathBuf::from(String::from_utf8_lossy(&m[16..]).into_owned()))
            .collect();
        let hosts = comm.hosts().to_vec();
        // Whether I see every rank of my host (by the identity it reported): one byte each,
        // not the M bytes of whom I see (an all-gather of those handed every rank M x M).
        let sees_host = (0..all.len()).filter(|&r| hosts[r] == hosts[me]).all(|r| {
            let reported = (
                u64::from_le_bytes(all[r][..8].try_into().expect("8 bytes")),
                u64::from_le_bytes(all[r][8..16].try_into().expect("8 bytes")),
            );
            r == me || (share && reported.0 != u64::MAX && id(&caches[r]) == Some(reported))
        });
        let seen = comm.all_gather(&[u8::from(sees_host)])?;
        let seen: Vec<bool> = seen.iter().map(|s| s.first() == Some(&1)).collect();
        Ok(Peers {
            disks: disk_groups(&hosts, &seen),
            caches,
            left: Left::default(),
        })
    }
}

/// Disk groups from whether each rank sees the caches of every rank of its host
/// (`sees_host[r]`): a host whose ranks all do is one group (numbered by the host), any
/// other rank is a group of its own (numbered past the hosts). O(M).
fn disk_groups(hosts: &[u32], sees_host: &[bool]) -> Vec<u32> {
    let n = hosts.len();
    let mut whole = std::collections::HashMap::<u32, bool>::new();
    for (h, &sees) in hosts.iter().zip(sees_host) {
        *whole.entry(*h).or_insert(true) &= sees;
    }
    (0..n)
        .map(|r| match whole.get(&hosts[r]) {
            Some(true) => hosts[r],
            _ => n as u32 + r as u32,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::LocalComm;

    #[test]
    fn a_host_is_one_disk_only_if_all_its_ranks_see_each_other() {
        let hosts = [0, 0, 1, 1, 1];
        let mut seen = vec![true; 5];
        assert_eq!(disk_groups(&hosts, &seen), vec![0, 0, 1, 1, 1]);
        seen[3] = false; // rank 3 cannot see rank 4's cache
        assert_eq!(disk_groups(&hosts, &seen), vec![0, 0, 7, 8, 9]);
    }

    /// What discovery hands each rank grows linearly with M (each rank's cache path and one
    /// byte): before, every rank sent whom it sees (M bytes) to every rank, M x M at each.
    #[test]
    fn discovery_traffic_is_linear_in_the_ranks() {
        use crate::comm::doubles::Metered;
        let received = |world: u32| -> u64 {
            let dir = tempfile::tempdir().unwrap();
            let handles: Vec<_> = LocalComm::world(world)
                .into_iter()
                .map(|c| {
                    let p = dir.path().join(format!("cache{:03}", c.rank()));
                    std::fs::create_dir(&p).unwrap();
                    std::thread::spawn(move || {
                        let (mut c, count) = Metered::new(c);
                        Peers::discover(&mut c, &p, true).unwrap();
                        count.load(std::sync::atomic::Ordering::Relaxed)
                    })
                })
                .collect();
            let all: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            all[0]
        };
        let (a, b, c) = (received(2), received(10), received(18));
        assert_eq!(
            c - b,
            b - a,
            "received {a}, {b} and {c} bytes at 2, 10 and 18 ranks"
        );
    }

    #[test]
    fn discovery_in_one_process() {
        let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let paths: Vec<PathBuf> = dirs.iter().map(|d| d.path().to_path_buf()).collect();
        let handles: Vec<_> = LocalComm::world_on_hosts(&[0, 0, 1])
            .into_iter()
            .zip(paths.clone())
            .map(|(mut c, p)| {
                std::thread::spawn(move || Peers::discover(&mut c, &p, true).unwrap())
            })
            .collect();
        for h in handles {
            let peers = h.join().unwrap();
            assert_eq!(peers.caches, paths);
            assert_eq!(peers.disks, vec![0, 0, 1]);
        }
    }
}
