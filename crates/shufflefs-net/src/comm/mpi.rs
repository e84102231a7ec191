//! `Comm` over MPI (rsmpi). Only built into a process started by `mpirun`/`srun`.
//!
//! MPI counts are 32-bit, so collectives split their data into chunks of at most `CHUNK`
//! bytes; both sides know the total length in advance (from the plan and the manifest), so
//! the receiver can post matching chunked receives without any size handshake.
//!
//! Point-to-point messages run on buffers MPI owns: an [`Op`] hands its buffer over by value, it
//! is turned into a `'static` slice for rsmpi's `StaticScope`, and it becomes a `Vec` again
//! only once MPI reports its transfer complete. That is what lets a transfer be given up
//! soundly: MPI cannot withdraw a posted transfer, so a batch abandoned on the abort flag
//! leaks its pending buffers (and requests) rather than free memory MPI may still write, and
//! the communicator then refuses further point-to-point calls and never finalizes MPI (see
//! the parent module's docs on `CommError::Abandoned`). The abort flag is looked at only
//! while waiting, that is with transfers in flight, so this transport never answers
//! `CommError::Aborted`: a rank that stops mid-exchange leaves peers that wait on it, and
//! ending the job (which `Abandoned` leads to) is what frees them.

use std::cell::Cell;
use std::collections::HashSet;
use std::ffi::c_int;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mpi::Threading;
use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::ffi;
use mpi::request::StaticScope;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;

use super::{Comm, CommError, Dir, Done, Op, Reduce, Ticket, host_indices};
use crate::plan::Rank;

const CHUNK: usize = 1 << 30;

pub struct MpiComm {
    comm: SimpleCommunicator,
    hosts: Vec<u32>,
    /// Set once a transfer was abandoned, in this communicator or any split from it.
    abandoned: Rc<Cell<bool>>,
    /// Dropped with the last communicator: finalizes MPI (never, once abandoned).
    universe: Rc<Universe>,
    /// Posted messages not completed yet, in posting order.
    pending: Vec<(Ticket, InFlight)>,
    /// Pending messages nobody will ask for: freed when they complete.
    detached: HashSet<Ticket>,
    next_ticket: Ticket,
    /// Polls in a row that found nothing complete: how long to back off.
    idle: u32,
}

impl MpiComm {
    /// Initialises MPI on the calling thread, which must be the only one that ever uses it.
    /// Collective: the ranks learn which of them share a host (by processor name).
    pub fn init() -> Result<MpiComm, CommError> {
        let (universe, granted) = mpi::initialize_with_threading(Threading::Funneled)
            .ok_or_else(|| CommError::Mpi("MPI was already initialised".into()))?;
        if granted < Threading::Funneled {
            return Err(CommError::Mpi(format!(
                "MPI granted threading level {granted:?}, shufflefs needs Funneled"
            )));
        }
        let mut comm = MpiComm {
            comm: universe.world(),
            hosts: Vec::new(),
            abandoned: Rc::default(),
            universe: Rc::new(universe),
            pending: Vec::new(),
            detached: HashSet::new(),
            next_ticket: 0,
            idle: 0,
        };
        let name = mpi::environment::processor_name()
            .map_err(|e| CommError::Mpi(format!("processor name: {e}")))?;
        let names = comm.all_gather(name.as_bytes())?;
        comm.hosts = host_indices(&names);
        Ok(comm)
    }

    /// `MPI_Allgatherv` of `data`, every rank's length in `lens` (their sum under
    /// [`CHUNK`], so every count and displacement fits MPI's `int`).
    fn all_gather_v(&self, data: &[u8], lens: &[u64]) -> Vec<Vec<u8>> {
        let counts: Vec<mpi::Count> = lens.iter().map(|&l| l as mpi::Count).collect();
        let displs: Vec<mpi::Count> = (counts.iter())
            .scan(0, |at, &c| {
                let here = *at;
                *at += c;
                Some(here)
            })
            .collect();
        let total: u64 = lens.iter().sum();
        let mut buf = vec![0u8; total as usize];
        {
            let mut parts = PartitionMut::new(&mut buf[..], counts, &displs[..]);
            self.comm.all_gather_varcount_into(data, &mut parts);
        }
        let mut out = Vec::with_capacity(lens.len());
        let mut at = 0usize;
        for &len in lens {
            out.push(buf[at..at + len as usize].to_vec());
            at += len as usize;
        }
        out
    }

    /// Gives up the transfers still pending: their requests and buffers are leaked (MPI may
    /// still use them), and MPI is never finalized.
    fn abandon(&mut self) {
        // The raw requests stay with MPI; dropping an `Owned` leaks its buffer.
        self.pending.clear();
        if !self.abandoned.replace(true) {
            // An extra reference that is never dropped: `MPI_Finalize` would wait forever on
            // the abandoned transfers, so the process must end without it.
            std::mem::forget(self.universe.clone());
        }
        tracing::error!("a transfer was abandoned while a peer still expected data");
    }

    /// Removes and returns the pending transfers that completed, in posting order. One
    /// `MPI_Testsome` drives MPI's progress engine once for all of them: testing each request
    /// on its own polled every socket once per request, the larger part of an exchange's CPU
    /// on a few cores.
    fn test_some(&mut self) -> Vec<(Ticket, Owned)> {
        if self.pending.is_empty() {
            return Vec::new();
        }
        let mut raw: Vec<ffi::MPI_Request> = self.pending.iter().map(|(_, f)| f.0).collect();
        let mut indices: Vec<c_int> = vec![0; raw.len()];
        let mut count: c_int = 0;
        let n = c_int::try_from(raw.len()).expect("fewer than 2^31 transfers in flight");
        // SAFETY: `raw` holds `n` active requests and `indices` room for `n` entries; MPI sets
        // each completed request to MPI_REQUEST_NULL, and it is dropped from `pending` below.
        unsafe {
            ffi::MPI_Testsome(
                n,
                raw.as_mut_ptr(),
                &mut count,
                indices.as_mut_ptr(),
                ffi::RSMPI_STATUSES_IGNORE,
            );
        }
        if count <= 0 {
            return Vec::new(); // none completed (or MPI_UNDEFINED: none active)
        }
        let mut finished = vec![false; raw.len()];
        for &i in &indices[..count as usize] {
            finished[i as usize] = true;
        }
        let mut done = Vec::with_capacity(count as usize);
        for (i, (ticket, (request, owned))) in
            std::mem::take(&mut self.pending).into_iter().enumerate()
        {
            if finished[i] {
                done.push((ticket, owned));
            } else {
                self.pending.push((ticket, (request, owned)));
            }
        }
        done
    }
}

/// A posted transfer (its raw MPI request, tested with all others in one `MPI_Testsome`)
/// and the buffer it uses.
type InFlight = (ffi::MPI_Request, Owned);

/// A buffer handed to MPI: the parts of a `Vec` whose allocation nobody else can reach. It has
/// no `Drop`: dropping an `Owned` (what [`MpiComm::abandon`] does) leaks the allocation.
struct Owned {
    ptr: *mut u8,
    len: usize,
    cap: usize,
}

impl Owned {
    /// Takes `buf` over; its memory stays allocated until [`Owned::into_vec`], so a leaked
    /// `Owned` keeps it allocated forever.
    fn new(buf: Vec<u8>) -> (Owned, &'static mut [u8]) {
        let cap = buf.capacity();
        let slice: &'static mut [u8] = buf.leak();
        let owned = Owned {
            ptr: slice.as_mut_ptr(),
            len: slice.len(),
            cap,
        };
        (owned, slice)
    }

    /// # Safety
    /// The `'static` slice [`Owned::new`] returned must no longer be in use (its transfer
    /// completed).
    unsafe fn into_vec(self) -> Vec<u8> {
        // SAFETY: `ptr`, `len` and `cap` come from a `Vec<u8>` leaked in `new` and not
        // reclaimed since (`into_vec` consumes `self`); the caller promises that the slice
        // derived from it is dead, so this `Vec` is the only way to the allocation.
        unsafe { Vec::from_raw_parts(self.ptr, self.len, self.cap) }
    }
}

impl Comm for MpiComm {
    fn rank(&self) -> Rank {
        self.comm.rank() as Rank
    }

    fn size(&self) -> u32 {
        self.comm.size() as u32
    }

    fn hosts(&self) -> &[u32] {
        &self.hosts
    }

    /// One `MPI_Allgatherv` when the gathered bytes fit MPI's 32-bit counts (a real
    /// collective: O(log M) steps, where M broadcasts took M), else one broadcast per rank
    /// in chunks.
    fn all_gather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
        let mut lens = vec![0u64; self.size() as usize];
        self.comm
            .all_gather_into(&(data.len() as u64), &mut lens[..]);
        let total: u64 = lens.iter().sum();
        if total == 0 {
            return Ok(vec![Vec::new(); lens.len()]);
        }
        if total <= CHUNK as u64 {
            return Ok(self.all_gather_v(data, &lens));
        }
        let mut out = Vec::with_capacity(lens.len());
        for (root, len) in lens.into_iter().enumerate() {
            let mut buf = if root as Rank == self.rank() {
                data.to_vec()
            } else {
                vec![0u8; len as usize]
            };
            for chunk in buf.chunks_mut(CHUNK) {
                self.comm.process_at_rank(root as i32).broadcast_into(chunk);
            }
            out.push(buf);
        }
        Ok(out)
    }

    fn broadcast(&mut self, root: Rank, data: Vec<u8>) -> Result<Vec<u8>, CommError> {
        let root_proc = self.comm.process_at_rank(root as i32);
        let mut len = data.len() as u64;
        root_proc.broadcast_into(&mut len);
        let mut buf = if self.rank() == root {
            data
        } else {
            vec![0u8; len as usize]
        };
        for chunk in buf.chunks_mut(CHUNK) {
            root_proc.broadcast_into(chunk);
        }
        Ok(buf)
    }

    /// One `MPI_Allreduce` over the values as `u64`s.
    fn all_reduce(&mut self, values: &[u64], op: Reduce) -> Result<Vec<u64>, CommError> {
        use mpi::collective::SystemOperation;
        let mut out = vec![0u64; values.len()];
        let op = match op {
            Reduce::Max => SystemOperation::max(),
            Reduce::Min => SystemOperation::min(),
            Reduce::Sum => SystemOperation::sum(),
        };
        self.comm.all_reduce_into(values, &mut out[..], op);
        Ok(out)
    }

    fn split(&mut self, color: u32) -> Result<Box<dyn Comm>, CommError> {
        let color = i32::try_from(color)
            .map_err(|_| CommError::Mpi(format!("color {color} is out of MPI's range")))?;
        let comm = self
            .comm
            .split_by_color(Color::with_value(color))
            .ok_or_else(|| CommError::Mpi("split gave no communicator".into()))?;
        let mut sub = MpiComm {
            comm,
            hosts: Vec::new(),
            abandoned: self.abandoned.clone(),
            universe: self.universe.clone(),
            pending: Vec::new(),
            detached: HashSet::new(),
            next_ticket: 0,
            idle: 0,
        };
        let mine = self.hosts[self.rank() as usize];
        let parent_hosts = sub.all_gather(&mine.to_le_bytes())?;
        sub.hosts = host_indices(&parent_hosts);
        Ok(Box::new(sub))
    }

    fn post(&mut self, op: Op) -> Result<Ticket, CommError> {
        if self.abandoned.get() {
            return Err(CommError::Abandoned);
        }
        let tag = i32::from(op.tag);
        let process = self.comm.process_at_rank(op.peer as i32);
        let (owned, slice) = Owned::new(op.buf);
        let request = match op.dir {
            Dir::Recv => process.immediate_receive_into_with_tag(StaticScope, slice, tag),
            Dir::Send => {
                let slice: &'static [u8] = slice;
                process.immediate_send_with_tag(StaticScope, slice, tag)
            }
        };
        // SAFETY: the request is kept raw until MPI completes it (or it is leaked on abandon),
        // and the slice it uses lives as long as `owned`, which is never freed before that.
        let (raw, _, _) = unsafe { request.into_raw() };
        self.next_ticket += 1;
        self.pending.push((self.next_ticket, (raw, owned)));
        Ok(self.next_ticket)
    }

    fn progress(&mut self, wait: Duration, abort: &AtomicBool) -> Result<Vec<Done>, CommError> {
        if self.abandoned.get() {
            return Err(CommError::Abandoned);
        }
        let until = Instant::now() + wait;
        loop {
            let mut done = Vec::new();
            for (ticket, owned) in self.test_some() {
                // SAFETY: MPI reported this transfer complete, so it no longer uses the
                // buffer.
                let buf = unsafe { owned.into_vec() };
                if !self.detached.remove(&ticket) {
                    done.push(Done { ticket, buf });
                }
            }
            if !done.is_empty() {
                self.idle = 0;
                return Ok(done);
            }
            // Only detached messages left (or none): nobody waits for them here.
            if self.pending.len() == self.detached.len() {
                return Ok(done);
            }
            if abort.load(Ordering::Relaxed) {
                self.abandon();
                return Err(CommError::Abandoned);
            }
            if Instant::now() >= until {
                return Ok(done);
            }
            // Back off quickly: waiting ranks must not take the CPU from training's
            // readers (or from the peer they wait for) on a busy node.
            self.idle = self.idle.saturating_add(1);
            // Every sleep costs two context switches, so the sleeps lengthen fast (50 us to
            // 0.8 ms) while nothing completes; a completion starts over at yields, so a fast
            // link whose frames complete often is polled often.
            if self.idle > 16 {
                let micros = 50u64 << ((self.idle - 16) / 8).min(4);
                std::thread::sleep(Duration::from_micros(micros));
            } else {
                std::thread::yield_now();
            }
        }
    }

    fn detach(&mut self, tickets: &[Ticket]) {
        let pending: HashSet<Ticket> = self.pending.iter().map(|(t, _)| *t).collect();
        self.detached
            .extend(tickets.iter().filter(|t| pending.contains(t)));
    }

    /// `MPI_Cancel` on each, then detached: the cancelled request completes at a later
    /// test and its buffer is freed then.
    fn cancel(&mut self, tickets: &[Ticket]) {
        for (ticket, (request, _)) in self.pending.iter_mut() {
            if tickets.contains(ticket) {
                // SAFETY: `request` is an active request of this transport (pending), and
                // stays in `pending` until a test reports it complete.
                unsafe {
                    ffi::MPI_Cancel(request);
                }
                self.detached.insert(*ticket);
            }
        }
    }
}

/// How long a communicator being dropped keeps testing its detached requests (cancelled
/// receives complete locally, late frames of a given-up peer drain) before abandoning them.
const REAP: Duration = Duration::from_millis(500);

impl Drop for MpiComm {
    fn drop(&mut self) {
        // Receives cancelled after a given-up stream's end (`cancel`) stay pending until a test
        // completes them; a rank whose last exchanges were empty never polls again, so reap
        // them here rather than abandon them and skip MPI_Finalize (which mpirun reports as an
        // improper exit). Only detached requests: nobody waits for them.
        let until = Instant::now() + REAP;
        while !self.pending.is_empty()
            && self.pending.len() == self.detached.len()
            && !self.abandoned.get()
            && Instant::now() < until
        {
            for (ticket, owned) in self.test_some() {
                // SAFETY: MPI reported this transfer complete (or cancelled).
                drop(unsafe { owned.into_vec() });
                self.detached.remove(&ticket);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // rsmpi panics on dropping a pending request, and MPI_Finalize would wait for it.
        if !self.pending.is_empty() {
            self.abandon();
        }
        // Unwinding a panic: MPI_Finalize fences with the other ranks (Open MPI does), which
        // may be waiting on this one in a collective, so the rank would hang instead of
        // exiting and letting the launcher end the job. End without it.
        if std::thread::panicking() && !self.abandoned.replace(true) {
            std::mem::forget(self.universe.clone());
        }
    }
}
