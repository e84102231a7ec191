//! A partial cache's gate: when a rank's share does not fit its cache, only the
//! samples the plan keeps (`plan::keep`, stepped here at each publication) are written, and
//! only while the cache's bytes stay within its size, so a fetch never fills the disk: a
//! fetch is promised its room before it writes ([`Room`]), and cannot write past it. A
//! sample refused here is not an error of the source: the reader gets it from the source
//! through memory (`SampleStore::read_uncached`), and staging and the epoch's fill skip it.
//! The gate also filters the exchange to what the receiver keeps ([`Admission::exchanged`]),
//! runs the early refill (`super::early`), and measures the hit rate and source bytes per
//! epoch for the status.

use std::io;
use std::sync::{Mutex, RwLock};

use super::early::Early;
use super::planned::Planned;
use crate::plan::coded_keep::CodedPlacement;
use crate::plan::ids::SampleSet;
use crate::plan::keep_local::{Handshake, LocalKeep};
use crate::plan::{Rank, SampleId};
use crate::sys::sync::Locked;
use crate::sys::sync::RwLocked;

/// The byte budget and the kept set of the current epoch.
pub struct Admission {
    capacity: u64,
    /// Size counted for a sample whose size is not known yet (the mount's estimate).
    mean_size: u64,
    /// Sorted.
    /// A compact set (`plan::ids`): 10^7 kept ids were 80 MB as a sorted vector.
    kept: RwLock<SampleSet>,
    /// Steps the kept sets with the epochs (`epoch`); `None` in tests of the gate alone.
    planner: Option<(Mutex<Planned>, Rank)>,
    /// What reads found, this epoch and the one before.
    measured: Mutex<Measured>,
    /// The last samples read through memory, each handed out once more: a first lookup
    /// reads a sample of unknown size to learn it, and the open right after must not read
    /// it from the source again.
    memo: Mutex<std::collections::VecDeque<(SampleId, Vec<u8>)>>,
    /// The current epoch's early refill (`super::early`); idle without a planner.
    early: Mutex<Early>,
    /// Bytes promised to fetches under way ([`Room`]), not yet in the cache's bytes.
    reserved: Mutex<u64>,
    /// Samples not kept, read ahead of the loader (`super::prefetch`).
    pub(crate) prefetch: super::prefetch::Prefetch,
    /// A coded run's kept set of the next epoch, from the exchange's client, which steps
    /// every rank's anyway ([`Admission::prepare`]): the publication then takes it instead
    /// of stepping the planner while readers wait (the planner catches up only when an
    /// epoch comes without one, as after the coded exchange stopped).
    prepared: Mutex<Option<(u64, Vec<SampleId>)>>,
    /// The unit the cache takes disk space in (`super::footprint`): every size is counted
    /// rounded up to it, as the cache's held bytes are.
    block: u64,
}

/// Samples [`Admission::remember`] holds.
const MEMO: usize = 16;

/// Reads of the current epoch: the samples seen (each counted once), those found cached,
/// the bytes read from the source; and the previous epoch's totals.
#[derive(Default)]
struct Measured {
    seen: std::collections::HashSet<SampleId>,
    hits: u64,
    source_bytes: u64,
    last: Option<EpochReads>,
}

/// One epoch's reads under a partial cache, for the status.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EpochReads {
    pub reads: u64,
    pub hits: u64,
    pub source_bytes: u64,
}

impl EpochReads {
    pub fn hit_rate(&self) -> Option<f64> {
        (self.reads > 0).then(|| self.hits as f64 / self.reads as f64)
    }
}

impl Admission {
    pub(crate) fn new(capacity: u64, mean_size: u64, kept: Vec<SampleId>) -> Admission {
        Admission {
            capacity,
            mean_size,
            kept: RwLock::new(SampleSet::from_ids(&kept)),
            planner: None,
            measured: Mutex::default(),
            memo: Mutex::default(),
            early: Mutex::default(),
            reserved: Mutex::default(),
            prefetch: Default::default(),
            prepared: Mutex::default(),
            block: 1,
        }
    }

    /// This gate counting every size in whole `block`s (the store's, `super::footprint`).
    pub(crate) fn in_blocks(mut self, block: u64) -> Admission {
        self.block = block.max(1);
        self
    }

    /// The bytes the cache may hold.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// What `bytes` take on the cache's disk.
    fn on_disk(&self, bytes: u64) -> u64 {
        super::footprint::on_disk(bytes, self.block)
    }

    /// The gate of `planner`'s rank following its kept sets (from its current epoch).
    pub fn planned(planner: LocalKeep, mean_size: u64) -> Admission {
        let (capacity, rank) = (planner.capacity(), planner.rank());
        Admission::following(Planned::Partial(planner), rank, capacity, mean_size)
    }

    /// The gate of compute rank `rank` of a coded run whose cache does not fit, following
    /// `placement`'s kept sets (`plan::coded_keep`) within `capacity` bytes.
    pub fn coded(
        placement: CodedPlacement,
        rank: Rank,
        capacity: u64,
        mean_size: u64,
    ) -> Admission {
        Admission::following(Planned::Coded(placement), rank, capacity, mean_size)
    }

    fn following(planner: Planned, rank: Rank, capacity: u64, mean_size: u64) -> Admission {
        let (kept, early, epoch) = (planner.kept(rank), planner.early(), planner.epoch());
        let kept = kept.to_vec();
        let gate = Admission {
            planner: Some((Mutex::new(planner), rank)),
            early: Mutex::new(early),
            ..Admission::new(capacity, mean_size, kept)
        };
        // A mount at a later epoch (a remount, a resumed or restarted job) reads ahead in
        // that epoch's listings too, not only after the next publication.
        gate.prefetch.epoch(epoch);
        gate
    }

    /// A sample of the current epoch is being read (`cached`: found in the cache); only
    /// its first read this epoch counts.
    pub fn saw(&self, id: SampleId, cached: bool) {
        let mut m = self.measured.locked();
        if m.seen.insert(id) && cached {
            m.hits += 1;
        }
    }

    /// Whether a reader opened `id` this epoch already.
    pub(crate) fn seen(&self, id: SampleId) -> bool {
        let m = self.measured.locked();
        m.seen.contains(&id)
    }

    /// Bytes read from the source (into the cache or through memory).
    pub(crate) fn read_from_source(&self, bytes: u64) {
        let mut m = self.measured.locked();
        m.source_bytes += bytes;
    }

    /// Keeps `bytes`, just read through memory, for one [`Admission::recall`].
    pub(crate) fn remember(&self, id: SampleId, bytes: &[u8]) {
        let mut m = self.memo.locked();
        if m.len() == MEMO {
            m.pop_front();
        }
        m.push_back((id, bytes.to_vec()));
    }

    /// The bytes of `id` if [`Admission::remember`] kept them (handed out once).
    pub(crate) fn recall(&self, id: SampleId) -> Option<Vec<u8>> {
        let mut m = self.memo.locked();
        let i = m.iter().position(|(s, _)| *s == id)?;
        m.remove(i).map(|(_, b)| b)
    }

    /// The last whole epoch's reads (None before one ended), and the current one's so far.
    pub fn measured(&self) -> (Option<EpochReads>, EpochReads) {
        let m = self.measured.locked();
        let now = EpochReads {
            reads: m.seen.len() as u64,
            hits: m.hits,
            source_bytes: m.source_bytes,
        };
        (m.last, now)
    }

    /// The current epoch is now `epoch`: its kept set from the planner, and the reads of
    /// the one before become `measured`'s last epoch.
    pub fn epoch(&self, epoch: u64) {
        {
            let mut m = self.measured.locked();
            let last = EpochReads {
                reads: m.seen.len() as u64,
                hits: m.hits,
                source_bytes: m.source_bytes,
            };
            *m = Measured {
                last: Some(last),
                ..Measured::default()
            };
        }
        self.prefetch.epoch(epoch);
        let Some((planner, rank)) = &self.planner else {
            return;
        };
        if let Some(kept) = self.take_prepared(epoch) {
            // A coded gate (the only kind prepared): no early refill to set.
            self.set_kept(kept);
            return;
        }
        let mut p = planner.locked();
        p.advance_to(epoch);
        *self.kept.write_locked() = p.kept(*rank);
        *self.early.locked() = p.early();
    }

    /// `kept` is this rank's kept set at `epoch` (sorted), as a coded exchange's client
    /// planned it: taken by [`Admission::epoch`] at that epoch's publication.
    pub fn prepare(&self, epoch: u64, kept: Vec<SampleId>) {
        *self.prepared.locked() = Some((epoch, kept));
    }

    /// The kept set prepared for `epoch`, if any; one prepared for a later epoch stays.
    fn take_prepared(&self, epoch: u64) -> Option<Vec<SampleId>> {
        let mut prepared = self.prepared.locked();
        match prepared.take() {
            Some((e, kept)) if e == epoch => Some(kept),
            Some(later) if later.0 > epoch => {
                *prepared = Some(later);
                None
            }
            _ => None,
        }
    }

    /// Sample `id` was opened: the leaver to evict now, if any (see `super::early`).
    pub fn after_read(&self, id: SampleId) -> Option<SampleId> {
        self.early.locked().read(id)
    }

    /// The exchange into `target` is done: the leavers to evict now.
    pub fn exchange_done(&self, target: u64) -> Vec<SampleId> {
        let mut early = self.early.locked();
        early.exchange_done(target)
    }

    /// The kept set of a new epoch (sorted).
    pub(crate) fn set_kept(&self, kept: Vec<SampleId>) {
        *self.kept.write_locked() = SampleSet::from_ids(&kept);
    }

    /// What the exchange out of `epoch` needs of this rank's kept sets to move only what
    /// receivers keep and get through it (`exchange::kept`): `None` for a coded gate (its
    /// steps have no transfers to filter). The planner is stepped on to `epoch` first if it
    /// is behind; kept sets it no longer holds (an exchange that stalled for several
    /// advances) leave an empty handshake, which moves nothing: receivers read those
    /// samples from the source.
    pub fn handshake(&self, epoch: u64) -> Option<Handshake> {
        let (planner, _) = self.planner.as_ref()?;
        let mut planner = planner.locked();
        let Planned::Partial(p) = &mut *planner else {
            return None;
        };
        p.advance_to(epoch);
        Some(p.handshake(epoch).unwrap_or_else(|| Handshake::empty(p)))
    }

    /// Whether sample `id` (of `size` bytes, if known) may be written into a cache that
    /// holds `held` bytes (and the bytes promised to fetches under way).
    pub(crate) fn admits(&self, id: SampleId, size: Option<u64>, held: u64) -> bool {
        let reserved = *self.reserved.locked();
        let size = self.on_disk(size.unwrap_or(self.mean_size));
        self.wanted(id) && held + reserved + size <= self.capacity
    }

    /// [`Admission::admits`], and the room promised to the fetch of `id` until the [`Room`]
    /// is dropped: two fetches at once cannot both take the last room.
    pub(crate) fn reserve(&self, id: SampleId, size: Option<u64>, held: u64) -> Option<Room<'_>> {
        if !self.wanted(id) {
            return None;
        }
        let bytes = self.on_disk(size.unwrap_or(self.mean_size));
        // Built only when promised: a dropped room gives its bytes back.
        self.grow(bytes, held).then(|| Room {
            admission: self,
            id,
            bytes: std::sync::atomic::AtomicU64::new(bytes),
        })
    }

    /// Room for `bytes` the exchange brings in (`id`: the first of them), whether or not
    /// the plan keeps them now (the plan chose what is sent, with sizes that may be
    /// estimates: this makes the real ones fit).
    /// `bytes`: each sample's size on disk summed ([`SampleStore::on_disk`]), or one
    /// sample's size (rounded here).
    ///
    /// [`SampleStore::on_disk`]: super::SampleStore::on_disk
    pub(crate) fn reserve_received(&self, id: SampleId, bytes: u64, held: u64) -> Option<Room<'_>> {
        let bytes = self.on_disk(bytes);
        self.grow(bytes, held).then(|| Room {
            admission: self,
            id,
            bytes: std::sync::atomic::AtomicU64::new(bytes),
        })
    }

    /// Promises `more` bytes if they fit beside `held` and what is promised already.
    fn grow(&self, more: u64, held: u64) -> bool {
        let mut reserved = self.reserved.locked();
        let fits = held + *reserved + more <= self.capacity;
        if fits {
            *reserved += more;
        }
        fits
    }

    /// Whether the plan keeps `id` now (or the early refill takes it).
    pub fn wanted(&self, id: SampleId) -> bool {
        let early = self.early.locked();
        let kept = self.kept.read_locked();
        (kept.contains(id) && !early.gone(id)) || early.admits(id)
    }
}

/// Room promised to one fetch into a partial cache ([`Admission::reserve`]), given back when
/// dropped (the fetch then counts in the cache's bytes, or failed). The cache's size is a
/// hard bound: a fetch writes through [`Room::writer`], which fails with [`not_kept`] before
/// it would pass what is promised and no more room is left (a sample larger than the size
/// it was planned with).
pub struct Room<'a> {
    admission: &'a Admission,
    id: SampleId,
    bytes: std::sync::atomic::AtomicU64,
}

impl Room<'_> {
    /// `out` limited to this room, grown while the cache (holding `held()`) has more.
    pub(crate) fn writer<'w>(
        &'w self,
        out: &'w mut dyn io::Write,
        held: &'w dyn Fn() -> u64,
    ) -> Within<'w> {
        Within {
            out,
            room: self,
            held,
            written: 0,
        }
    }
}

impl Drop for Room<'_> {
    fn drop(&mut self) {
        let bytes = *self.bytes.get_mut();
        let mut reserved = self.admission.reserved.locked();
        *reserved = reserved.saturating_sub(bytes);
    }
}

/// A writer that stays within a [`Room`] (see there).
pub(crate) struct Within<'w> {
    out: &'w mut dyn io::Write,
    room: &'w Room<'w>,
    held: &'w dyn Fn() -> u64,
    written: u64,
}

impl io::Write for Within<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        use std::sync::atomic::Ordering::Relaxed;
        let (end, have) = (
            self.written + buf.len() as u64,
            self.room.bytes.load(Relaxed),
        );
        if end > have {
            // Whole blocks, as the cache's held bytes count them.
            let end = self.room.admission.on_disk(end);
            if !self.room.admission.grow(end - have, (self.held)()) {
                return Err(not_kept(self.room.id));
            }
            self.room.bytes.store(end, Relaxed);
        }
        let n = self.out.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// The error of a refused write: `StorageFull`, and it says why.
pub(crate) fn not_kept(id: SampleId) -> io::Error {
    io::Error::new(
        io::ErrorKind::StorageFull,
        format!("sample {id} is not in this rank's partial cache (read from the source)"),
    )
}

/// Whether `e` is a refusal of the partial cache (not a failure).
pub fn is_not_kept(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::StorageFull
        && e.get_ref()
            .is_some_and(|i| i.to_string().contains("partial cache"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kept_samples_within_the_budget() {
        let a = Admission::new(100, 30, vec![1, 2, 3]);
        assert!(a.admits(1, Some(50), 50));
        assert!(!a.admits(1, Some(51), 50));
        assert!(!a.admits(4, Some(1), 0));
        assert!(a.admits(2, None, 70));
        assert!(!a.admits(2, None, 71));
        a.set_kept(vec![4]);
        assert!(a.admits(4, Some(1), 0) && !a.admits(1, Some(1), 0));
        assert!(is_not_kept(&not_kept(3)));
        a.saw(4, true);
        a.saw(4, false);
        a.saw(5, false);
        a.read_from_source(7);
        assert_eq!(
            a.measured().1,
            EpochReads {
                reads: 2,
                hits: 1,
                source_bytes: 7
            }
        );
        a.epoch(1);
        let (last, now) = a.measured();
        assert_eq!(last.unwrap().hit_rate(), Some(0.5));
        assert_eq!(now, EpochReads::default());
        assert!(!is_not_kept(&io::Error::from(io::ErrorKind::StorageFull)));
    }

    /// Room is promised before a fetch writes: a second fetch at once cannot take the room
    /// the first holds, a sample larger than planned grows its room while the cache has
    /// more and fails as not kept when it has none, and dropped rooms give it all back.
    #[test]
    fn rooms_make_the_size_a_hard_bound() {
        use std::io::Write;
        let a = Admission::new(25, 10, vec![1, 2, 3]);
        let held = || 0;
        let first = a.reserve(1, Some(10), 0).unwrap();
        let second = a.reserve(2, None, 0).unwrap();
        assert!(
            a.reserve(3, Some(10), 0).is_none(),
            "the last room is promised"
        );
        assert!(!a.admits(3, Some(5), 1));
        assert!(a.reserve(9, Some(1), 0).is_none(), "not kept");
        let mut out = Vec::new();
        let mut w = first.writer(&mut out, &held);
        w.write_all(&[7; 14]).unwrap();
        let e = w.write_all(&[7; 2]).unwrap_err();
        assert!(is_not_kept(&e), "{e}");
        assert_eq!(out.len(), 14);
        drop(second);
        assert!(a.reserve(3, Some(12), 0).is_none(), "14 still promised");
        assert!(a.admits(3, Some(11), 0));
        drop(first);
        assert!(a.admits(3, Some(25), 0));
        let third = a.reserve(3, Some(10), 0).unwrap();
        let held_more = || 20;
        let mut out = Vec::new();
        let e = (third.writer(&mut out, &held_more).write_all(&[1; 11])).unwrap_err();
        assert!(is_not_kept(&e), "{e}");
        drop(third);
        assert_eq!(*a.reserved.lock().unwrap(), 0);
    }

    /// A coded gate admits the kept set of each epoch it is stepped to, and leaves a coded
    /// step (no transfers) as it is.
    #[test]
    fn a_coded_gate_follows_the_kept_sets() {
        let shares = crate::plan::CodedShares::new(60, 3, 0.5, 2)
            .unwrap()
            .with_slots(Some(8));
        let gate = Admission::coded(shares.placement_of(0, 1), 1, 8_000, 1_000);
        for epoch in [0, 1, 3] {
            gate.epoch(epoch);
            let p = shares.placement_at(epoch);
            let kept = &p.caches()[1];
            assert!(
                (0..60).all(|s| gate.wanted(s) == kept.contains(&s)),
                "{epoch}"
            );
        }
        // A kept set the client prepared is taken as it is (a later one waits for its
        // epoch); an epoch without one steps the planner again.
        gate.prepare(5, vec![7]);
        gate.prepare(4, vec![2, 9]);
        gate.epoch(4);
        assert!((0..60).all(|s| gate.wanted(s) == [2, 9].contains(&s)));
        gate.prepare(6, vec![8]);
        gate.epoch(5);
        let p5 = shares.placement_at(5);
        let kept = &p5.caches()[1];
        assert!((0..60).all(|s| gate.wanted(s) == kept.contains(&s)));
        gate.epoch(6);
        assert!((0..60).all(|s| gate.wanted(s) == (s == 8)));
        assert!(
            gate.handshake(3).is_none(),
            "a coded step has nothing to filter"
        );
    }
}

/// Timings of a coded gate at scale (`cargo test --lib measure_coded_gate -- --ignored
/// --nocapture`): building it, stepping it at a publication.
#[cfg(test)]
mod measure {
    use super::*;
    use std::time::Instant;

    /// This process's resident kB.
    fn rss() -> i64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        (status.lines())
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    #[test]
    #[ignore = "a measurement, not a check"]
    fn measure_coded_gate() {
        for ranks in [8u32, 32] {
            let shares = crate::plan::CodedShares::new(200_000, ranks, 0.5, 1)
                .unwrap()
                .with_slots(Some(2_000_000 / ranks as usize));
            // One rank's first: memory freed by a drop is reused without showing.
            let before = rss();
            let one = shares.placement_of(0, 1);
            let own = rss() - before;
            let before = rss();
            let all = shares.placement_at(0);
            let full = rss() - before;
            drop((one, all));
            eprintln!("{ranks} ranks: placement ~{full} kB, one rank's ~{own} kB (RSS growth)");
            let t = Instant::now();
            let gate = Admission::coded(shares.placement_of(0, 1), 1, u64::MAX, 1);
            let built = t.elapsed();
            let t = Instant::now();
            gate.epoch(1);
            let stepped = t.elapsed();
            let next = shares.placement_at(2).caches()[1].iter().copied().collect();
            gate.prepare(2, next);
            let t = Instant::now();
            gate.epoch(2);
            let prepared = t.elapsed();
            eprintln!(
                "{ranks} ranks: gate built {built:.2?}, stepped at publication {stepped:.2?} (prepared: {prepared:.2?})"
            );
        }
    }
}
