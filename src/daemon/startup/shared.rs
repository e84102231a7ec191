//! One copy of the manifest per host, not one per rank.
//!
//! Rank 0 holds the manifest's encoding (loaded from its cache or scanned). It used to
//! broadcast it to every rank, and every rank decoded its own copy: the whole dataset's
//! names on each of a host's ranks (eight copies on an 8-GPU node). Now only the first rank
//! of each host receives it (a broadcast among those ranks), writes it into an anonymous
//! memory file (`memfd`), and tells the host's other ranks where it is
//! (`/proc/<pid>/fd/<fd>`); every rank of the host maps that file and decodes from the
//! mapping with the sample names left in it (`Manifest::decode_mapped`). The names, most of
//! a folder manifest, then count once per host; what each rank still decodes for itself is
//! ~4 bytes per sample (where each name ends) and what is per folder.
//!
//! The file lives as long as some rank maps it and is never a path anyone could find later,
//! so a killed job leaves nothing behind. A rank that cannot open its host's file (another
//! user's process, a process namespace of its own) says so with one flag, and its host's
//! first rank sends it the bytes instead: slower, never wrong.

use std::fs::File;
use std::io::Write;
use std::ops::Deref;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use memmap2::Mmap;
use nix::sys::memfd::{MFdFlags, memfd_create};

use super::StartError;
use crate::comm::{Comm, Reduce};
use crate::dataset::Manifest;
use crate::dataset::manifest::fingerprint_of;

/// The manifest's encoding as this rank holds it, and its fingerprint.
pub(crate) struct Encoded {
    data: Data,
    fingerprint: u32,
}

enum Data {
    Owned(Vec<u8>),
    /// The host's shared file, mapped.
    Mapped(Arc<Mmap>),
}

impl Encoded {
    /// A buffer of this rank's own.
    pub(crate) fn owned(bytes: Vec<u8>) -> Encoded {
        Encoded {
            fingerprint: fingerprint_of(&bytes),
            data: Data::Owned(bytes),
        }
    }

    /// The manifest's fingerprint (`manifest::fingerprint_of` of these bytes).
    pub(crate) fn fingerprint(&self) -> u32 {
        self.fingerprint
    }

    #[cfg(test)]
    fn is_mapped(&self) -> bool {
        matches!(self.data, Data::Mapped(_))
    }
}

impl Deref for Encoded {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.data {
            Data::Owned(v) => v,
            Data::Mapped(m) => m,
        }
    }
}

/// Collective: the manifest whose encoding rank 0 passes in `bytes` (empty elsewhere), on
/// every rank, decoded from one mapping per host where the host allows it.
pub(crate) fn distribute(
    comm: &mut dyn Comm,
    bytes: Vec<u8>,
) -> Result<(Manifest, Encoded), StartError> {
    distribute_with(comm, bytes, &map_path)
}

/// What the host's first rank tells its host: whether the manifest decoded there, its
/// fingerprint, and the path of its memory file (empty without one).
struct Note {
    decoded: bool,
    fingerprint: u32,
    path: Vec<u8>,
}

impl Note {
    fn encode(&self) -> Vec<u8> {
        let mut out = vec![u8::from(self.decoded)];
        out.extend_from_slice(&self.fingerprint.to_le_bytes());
        out.extend_from_slice(&self.path);
        out
    }

    fn decode(bytes: &[u8]) -> Option<Note> {
        let (&decoded, rest) = bytes.split_first()?;
        let (fingerprint, path) = rest.split_first_chunk::<4>()?;
        Some(Note {
            decoded: decoded == 1,
            fingerprint: u32::from_le_bytes(*fingerprint),
            path: path.to_vec(),
        })
    }
}

/// [`distribute`], with the host's file opened by `open`.
fn distribute_with(
    comm: &mut dyn Comm,
    bytes: Vec<u8>,
    open: &(dyn Fn(&[u8]) -> std::io::Result<Arc<Mmap>> + Sync),
) -> Result<(Manifest, Encoded), StartError> {
    let (me, hosts) = (comm.rank() as usize, comm.hosts().to_vec());
    let leader = hosts.iter().position(|&h| h == hosts[me]) == Some(me);
    // Both splits are collective on every rank; the first rank of a host is rank 0 of its
    // host's communicator (splits keep the ranks' order).
    let mut leaders = comm.split(u32::from(!leader))?;
    let mut host = comm.split(hosts[me])?;
    // The first rank: the bytes into its memory file, decoded and checked there.
    let (mut file, mut first) = (None, None);
    if leader {
        let bytes = leaders.broadcast(0, bytes)?;
        let fingerprint = fingerprint_of(&bytes);
        let data = match in_memory_file(&bytes) {
            Ok((f, map)) => {
                file = Some(f);
                Data::Mapped(map)
            }
            Err(e) => {
                tracing::warn!("the manifest is kept per rank on this host: no memory file: {e}");
                Data::Owned(bytes)
            }
        };
        let encoded = Encoded { data, fingerprint };
        first = Some((decode(&encoded, false), encoded));
    }
    drop(leaders);
    let note = first.as_ref().map(|(m, encoded)| Note {
        decoded: m.is_ok(),
        fingerprint: encoded.fingerprint,
        path: (file.as_ref())
            .map(|f| format!("/proc/{}/fd/{}", std::process::id(), f.as_raw_fd()))
            .unwrap_or_default()
            .into_bytes(),
    });
    let note = host.broadcast(0, note.map(|n| n.encode()).unwrap_or_default())?;
    let note = Note::decode(&note).ok_or(StartError::Malformed("manifest"))?;
    if !note.decoded {
        return Err(StartError::Malformed("manifest"));
    }
    if let Some((manifest, encoded)) = first {
        // Sends the bytes to a rank that could not map the file (see below).
        if host.all_reduce(&[0], Reduce::Max)? == [1] {
            host.broadcast(0, encoded.to_vec())?;
        }
        drop(file);
        return Ok((manifest?, encoded));
    }
    let mapped = open(&note.path).inspect_err(|e| {
        tracing::debug!("the host's manifest file could not be mapped: {e}");
    });
    let needs = u64::from(mapped.is_err());
    // Also the barrier after which the first rank may close its file: every rank mapped it.
    let data = match (host.all_reduce(&[needs], Reduce::Max)? == [1], mapped) {
        (false, Ok(map)) => Data::Mapped(map),
        (true, mapped) => {
            let got = host.broadcast(0, Vec::new())?;
            mapped.map_or(Data::Owned(got), Data::Mapped)
        }
        (false, Err(_)) => unreachable!("a rank that needs the bytes says so"),
    };
    let encoded = Encoded {
        data,
        fingerprint: note.fingerprint,
    };
    Ok((decode(&encoded, true)?, encoded))
}

/// The manifest in `encoded`; `checked`: the host's first rank decoded these very bytes
/// from its file and checked every value, so a mapped one skips those checks.
fn decode(encoded: &Encoded, checked: bool) -> Result<Manifest, StartError> {
    let manifest = match &encoded.data {
        Data::Mapped(map) => Manifest::decode_mapped(map, checked),
        Data::Owned(v) => Manifest::decode(v),
    };
    manifest.map_err(|_| StartError::Malformed("manifest"))
}

/// `bytes` in an anonymous memory file, and its mapping.
fn in_memory_file(bytes: &[u8]) -> std::io::Result<(File, Arc<Mmap>)> {
    let fd = memfd_create(c"shufflefs-manifest", MFdFlags::MFD_CLOEXEC)?;
    let mut file = File::from(fd);
    file.write_all(bytes)?;
    // SAFETY: the file is this process's own memory file, written above and never written
    // or truncated after; the ranks that open it map it read-only.
    let map = unsafe { Mmap::map(&file) }?;
    Ok((file, Arc::new(map)))
}

/// The host's memory file, named by its first rank, mapped read-only.
fn map_path(path: &[u8]) -> std::io::Result<Arc<Mmap>> {
    let path = std::str::from_utf8(path).map_err(std::io::Error::other)?;
    if path.is_empty() {
        return Err(std::io::Error::other(
            "the host's first rank has no memory file",
        ));
    }
    let file = File::open(path)?;
    // SAFETY: the host's first rank wrote the file before naming it and never changes it
    // (see `in_memory_file`); a memory file cannot be truncated by anyone else.
    let map = unsafe { Mmap::map(&file) }?;
    Ok(Arc::new(map))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::LocalComm;
    use crate::dataset::manifest::UNKNOWN_SIZE;

    fn manifest() -> Manifest {
        let class = |c: &str, n: usize| {
            let names = (0..n).map(|i| (format!("s{i:04}.bin").into_bytes(), UNKNOWN_SIZE));
            (c.as_bytes().to_vec(), names.collect())
        };
        Manifest::from_parts(vec![class("a", 30), class("b", 7)]).unwrap()
    }

    /// Runs `run` on every rank of a world on `hosts` (one thread each), rank 0 holding
    /// `bytes`, and returns what each gave, in rank order.
    fn on_hosts<T: Send + 'static>(
        hosts: &[u32],
        bytes: &[u8],
        run: impl Fn(&mut LocalComm, Vec<u8>) -> T + Send + Sync + Copy + 'static,
    ) -> Vec<T> {
        let handles: Vec<_> = LocalComm::world_on_hosts(hosts)
            .into_iter()
            .map(|mut c| {
                let mine = if c.rank() == 0 {
                    bytes.to_vec()
                } else {
                    Vec::new()
                };
                std::thread::spawn(move || run(&mut c, mine))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    /// Two hosts of three and one rank: every rank gets the manifest rank 0 had, with the
    /// names in a mapping (in one process every "host" can open every file).
    #[test]
    fn every_rank_decodes_the_same_manifest_from_its_hosts_file() {
        let want = manifest();
        let got = on_hosts(&[5, 5, 5, 9, 9, 9, 2], &want.encode(), |c, bytes| {
            let (m, encoded) = distribute(c, bytes).unwrap();
            (m, encoded.is_mapped(), encoded.to_vec())
        });
        for (m, mapped, bytes) in got {
            assert_eq!(m, want);
            assert!(mapped && m.names_mapped());
            assert_eq!(bytes, want.encode());
        }
    }

    /// A record index's offset table is mapped as the names are, and reads back the same.
    #[test]
    fn a_record_index_is_mapped_on_every_rank() {
        use crate::dataset::records::{Framing, Grouping, RecordParams, build_index};
        let dir = tempfile::tempdir().unwrap();
        let lines: String = (0..500).map(|i| format!("line {i}\n")).collect();
        std::fs::write(dir.path().join("a.txt"), &lines).unwrap();
        std::fs::write(dir.path().join("b.txt"), "x\ny\n").unwrap();
        let params = RecordParams {
            framing: Framing::Lines,
            record_size: 0,
            grouping: Grouping::Pages,
            header_line: false,
        };
        let (index, skipped) = build_index(dir.path(), &params).unwrap();
        let want = Manifest::from_records(index, skipped);
        let bytes = want.encode();
        let got = on_hosts(&[1, 1, 2], &bytes, |c, bytes| {
            distribute(c, bytes).unwrap().0
        });
        for m in got {
            assert!(m.names_mapped());
            let (got, expected) = (m.records().unwrap(), want.records().unwrap());
            assert_eq!(got, expected);
            assert_eq!(
                got.table_bytes(),
                0,
                "nothing of the table is this rank's own"
            );
            for g in 0..got.groups() {
                assert_eq!(got.span(g), expected.span(g));
            }
        }
    }

    /// Bytes that do not decode fail on every rank alike (no rank waits for another), and
    /// the checks a first rank made are what the others rely on: an unsafe name is refused
    /// where it is checked, and only skipped where it was.
    #[test]
    fn a_manifest_that_does_not_decode_fails_everywhere() {
        let mut bytes = manifest().encode();
        let at = (bytes.windows(9)).position(|w| w == b"s0001.bin").unwrap();
        bytes[at] = b'/';
        let failed = on_hosts(&[1, 1, 2, 2], &bytes, |c, b| distribute(c, b).is_err());
        assert!(failed.into_iter().all(|f| f));
        let (_file, map) = in_memory_file(&bytes).unwrap();
        assert!(Manifest::decode_mapped(&map, false).is_err());
        assert!(Manifest::decode_mapped(&map, true).is_ok());
    }

    /// A rank that cannot open its host's file is sent the bytes by its host's first rank;
    /// the others still map.
    #[test]
    fn a_rank_that_cannot_map_its_hosts_file_is_sent_the_bytes() {
        let want = manifest();
        let got = on_hosts(&[5, 5, 5], &want.encode(), |c, bytes| {
            let refuse = c.rank() == 2;
            let open = move |p: &[u8]| match refuse {
                true => Err(std::io::Error::other("refused")),
                false => map_path(p),
            };
            let (m, encoded) = distribute_with(c, bytes, &open).unwrap();
            (m, encoded.is_mapped())
        });
        assert!(got.iter().all(|(m, _)| *m == want));
        let mapped: Vec<bool> = got.iter().map(|g| g.1).collect();
        assert_eq!(mapped, [true, true, false]);
        assert!(!got[2].0.names_mapped());
    }

    #[test]
    fn a_memory_file_is_found_by_its_proc_path_and_outlives_its_descriptor() {
        assert!(map_path(b"").is_err());
        assert!(map_path(b"/proc/1/fd/999999").is_err());
        let want = manifest();
        let (file, map) = in_memory_file(&want.encode()).unwrap();
        let path = format!("/proc/{}/fd/{}", std::process::id(), file.as_raw_fd());
        let again = map_path(path.as_bytes()).unwrap();
        assert_eq!(&again[..], &map[..]);
        drop(file);
        assert_eq!(Manifest::decode_mapped(&again, false).unwrap(), want);
    }
}
