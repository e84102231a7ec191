//! Compaction: copying the live records of mostly dead sealed segments into the active one,
//! then deleting them (see the module docs for why readers are safe). A thread of its own
//! does it when nudged, so commits and removes never wait for it; it owns only a handle to
//! the backend and is fed by [`Cmd`]s.

use std::io::{self, BufReader, Read};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};
use std::thread::JoinHandle;

use super::format::{HEADER, Header, Kind};
use super::recover::At;
use super::{Entry, Inner, seg_name};
use crate::sys::sync::Locked;

pub(super) enum Cmd {
    /// Some segment may be worth compacting.
    Nudge,
    /// Stop (the backend is dropped).
    Stop,
}

pub(super) struct Compactor {
    tx: Sender<Cmd>,
    handle: Option<JoinHandle<()>>,
}

impl Compactor {
    pub(super) fn start(
        inner: Arc<Inner>,
        tx: Sender<Cmd>,
        rx: Receiver<Cmd>,
    ) -> io::Result<Compactor> {
        let handle = std::thread::Builder::new()
            .name("cache-compact".into())
            .spawn(move || {
                for cmd in rx {
                    match cmd {
                        Cmd::Nudge => {
                            inner.nudged.store(false, Ordering::Release);
                            if let Err(e) = inner.compact_candidates() {
                                tracing::warn!(error = %e, "compacting the packed cache failed; it is tried again later");
                            }
                        }
                        Cmd::Stop => break,
                    }
                }
            })?;
        Ok(Compactor {
            tx,
            handle: Some(handle),
        })
    }

    pub(super) fn stop(&mut self) {
        let _ = self.tx.send(Cmd::Stop);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Inner {
    /// Compacts every sealed segment over the threshold; returns how many.
    pub(super) fn compact_candidates(&self) -> io::Result<usize> {
        let _compacting = self.compacting.locked();
        let active = self.active.locked().seg.num;
        let candidates: Vec<u32> = self
            .read()
            .segments
            .iter()
            .filter(|(num, info)| **num != active && info.worth_compacting(&self.cfg))
            .map(|(num, _)| *num)
            .collect();
        let mut done = 0;
        for num in candidates {
            if self.compact_segment(num)? {
                done += 1;
            }
        }
        Ok(done)
    }

    /// Moves segment `num`'s live records (and the tombstones still needed) into the active
    /// segment, makes them durable, and deletes `num`. `false`: it is the active segment.
    fn compact_segment(&self, num: u32) -> io::Result<bool> {
        let Some(file) = self.read().segments.get(&num).map(|s| s.file.clone()) else {
            return Ok(false);
        };
        if self.active.locked().seg.num == num {
            return Ok(false);
        }
        // Sealed: every byte was written before the next segment was started.
        let end = file.written.load(Ordering::Acquire);
        let mut reader = BufReader::with_capacity(1 << 20, At::new(&file.file));
        let mut off = 0u64;
        let mut data = Vec::new();
        while off < end {
            let mut raw = [0u8; HEADER];
            reader.read_exact(&mut raw)?;
            let h = Header::decode(&raw).map_err(|e| {
                io::Error::new(e.kind(), format!("segment {} at {off}: {e}", seg_name(num)))
            })?;
            let here = Entry {
                seg: num,
                off: off as u32,
                len: h.len,
            };
            match h.kind {
                // Dead ones (most, or the segment would not be compacted) are not even read.
                // (An id past the dataset is never indexed: dead too.)
                Kind::Data if !self.indexed_at(h.id, here) => {
                    reader.seek_relative(h.len as i64)?;
                }
                Kind::Data => {
                    data.resize(h.len as usize, 0);
                    reader.read_exact(&mut data)?;
                    self.carry(Some(here), &h, &data)?;
                }
                Kind::Tombstone if self.tombstone_needed(num, h.seq) => {
                    self.carry(None, &h, &[])?
                }
                Kind::Tombstone => {}
            }
            off += h.record_len();
        }
        // The copies must be durable before the originals go.
        self.sync()?;
        let mut a = self.active.locked();
        self.write().segments.remove(&num);
        std::fs::remove_file(self.dir.join(seg_name(num)))?;
        a.dir_dirty = true;
        Ok(true)
    }

    /// Copies record `h` into the active segment, sequence number and all: a data record
    /// only if the index still points at `here` (it was not replaced or removed meanwhile).
    fn carry(&self, here: Option<Entry>, h: &Header, data: &[u8]) -> io::Result<()> {
        let mut a = self.active.locked();
        if let Some(here) = here
            && !self.indexed_at(h.id, here)
        {
            return Ok(());
        }
        // The index changes only under `active`, held from the check to the append.
        self.append(&mut a, h, data, here.is_some())
    }

    /// Whether the index points sample `id` at `here`.
    fn indexed_at(&self, id: u64, here: Entry) -> bool {
        self.read().index.get(id) == here
    }

    /// Whether a tombstone with `seq` may still cancel a record in a segment other than
    /// `num` (one holding a data record older than it).
    fn tombstone_needed(&self, num: u32, seq: u64) -> bool {
        self.read()
            .segments
            .iter()
            .any(|(&n, info)| n != num && info.min_seq < seq)
    }
}
