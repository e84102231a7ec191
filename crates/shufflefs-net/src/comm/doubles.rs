//! Transports that misbehave on purpose, for tests: each wraps another `Comm` and changes
//! only its point-to-point messages (collectives pass through; they run at setup, not in
//! the exchange under test).
//!
//! - [`Delaying`]: a pseudo-random sleep before each send, so arrivals from different
//!   peers reorder.
//! - [`Failing`]: a broken link: an error from the Nth message posted on, or from the send
//!   that takes the bytes sent past a budget.
//! - [`Slow`]: a thin uplink: sends leave at most at a number of bytes per second, without
//!   blocking the caller (they are held back and posted when due), so a peer of a slow rank
//!   sees its messages arrive late while the slow rank itself keeps working.
//! - [`Rewriting`]: hands each send to a function that may change its bytes first (a
//!   peer that says something else than the plan would have it say).
//! - [`Lagging`]: reports a large send's completion a while after it happened (as MPI does
//!   for a message past its eager limit, which waits for the receiver) while small ones
//!   complete at once, and counts what was posted and never reported, so a test sees a
//!   caller that returns with messages still pending.
//! - [`Metered`]: counts the bytes collectives hand this rank, as MPI moves them (an
//!   all-gather's M lengths and M payloads, a broadcast's length and payload, an
//!   all-reduce's words), so a test sees what start-up costs each rank as M grows.
//!
//! A split of a wrapped transport is not wrapped: the doubles act on the communicator they
//! were given.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::{Comm, CommError, Dir, Done, Op, Ticket};
use crate::plan::Rank;

/// Forwards everything but point-to-point messages (`messages`: all but `post`) to the
/// wrapped transport.
macro_rules! delegate {
    () => {
        fn rank(&self) -> Rank {
            self.inner.rank()
        }
        fn size(&self) -> u32 {
            self.inner.size()
        }
        fn hosts(&self) -> &[u32] {
            self.inner.hosts()
        }
        fn all_gather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
            self.inner.all_gather(data)
        }
        fn broadcast(&mut self, root: Rank, data: Vec<u8>) -> Result<Vec<u8>, CommError> {
            self.inner.broadcast(root, data)
        }
        fn all_reduce(&mut self, values: &[u64], op: super::Reduce) -> Result<Vec<u64>, CommError> {
            self.inner.all_reduce(values, op)
        }
        fn split(&mut self, color: u32) -> Result<Box<dyn Comm>, CommError> {
            self.inner.split(color)
        }
    };
    (messages) => {
        delegate!();
        fn progress(&mut self, wait: Duration, abort: &AtomicBool) -> Result<Vec<Done>, CommError> {
            self.inner.progress(wait, abort)
        }
        fn detach(&mut self, tickets: &[Ticket]) {
            self.inner.detach(tickets)
        }
        fn cancel(&mut self, tickets: &[Ticket]) {
            self.inner.cancel(tickets)
        }
    };
}

/// Sleeps a pseudo-random while (under 1.5 ms) before each send.
pub struct Delaying<C> {
    inner: C,
    state: u64,
}

impl<C: Comm> Delaying<C> {
    /// Different seeds give different delays: seed each rank differently.
    pub fn new(inner: C, seed: u64) -> Delaying<C> {
        Delaying { inner, state: seed }
    }
}

impl<C: Comm> Comm for Delaying<C> {
    delegate!(messages);

    fn post(&mut self, op: Op) -> Result<Ticket, CommError> {
        if op.dir == Dir::Send {
            self.state = self
                .state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            thread::sleep(Duration::from_micros((self.state >> 33) % 1500));
        }
        self.inner.post(op)
    }
}

/// Fails every message from a given one on, like a link that broke: the failing post
/// moves nothing, and every later post or progress fails too.
pub struct Failing<C> {
    inner: C,
    fail_at: Option<u64>,
    byte_budget: Option<u64>,
    posts: u64,
    bytes: u64,
    broken: bool,
    /// Fail the next post once this is set (then clear it): a one-off fault a test injects
    /// at a moment of its choosing. Only that post fails: the transport goes on after it.
    armed: Option<Arc<AtomicBool>>,
    /// Posts whose tag this accepts never take the armed fault (see [`Failing::sparing`]).
    spare: fn(u16) -> bool,
}

impl<C: Comm> Failing<C> {
    /// Fails message number `n` (counting posts from 0) and everything after it.
    pub fn at_message(inner: C, n: u64) -> Failing<C> {
        Failing {
            inner,
            fail_at: Some(n),
            byte_budget: None,
            posts: 0,
            bytes: 0,
            broken: false,
            armed: None,
            spare: |_| false,
        }
    }

    /// The armed fault skips posts whose tag `spare` accepts: a test that means to fail
    /// the exchange's streams spares the round that names their samples
    /// (`exchange::is_names_tag`), which falls back to the plan's walk instead of failing.
    pub fn sparing(self, spare: fn(u16) -> bool) -> Failing<C> {
        Failing { spare, ..self }
    }

    /// Fails the next post each time `armed` is set (clearing it); otherwise passes
    /// everything on.
    pub fn when_armed(inner: C, armed: Arc<AtomicBool>) -> Failing<C> {
        Failing {
            armed: Some(armed),
            ..Failing::after_bytes(inner, u64::MAX)
        }
    }

    /// Fails the send that would take the bytes sent past `budget`, and everything after.
    pub fn after_bytes(inner: C, budget: u64) -> Failing<C> {
        Failing {
            inner,
            fail_at: None,
            byte_budget: Some(budget),
            posts: 0,
            bytes: 0,
            broken: false,
            armed: None,
            spare: |_| false,
        }
    }
}

impl<C: Comm> Comm for Failing<C> {
    delegate!();

    fn post(&mut self, op: Op) -> Result<Ticket, CommError> {
        let n = self.posts;
        self.posts += 1;
        if !(self.spare)(op.tag)
            && (self.armed.as_ref()).is_some_and(|a| a.swap(false, Ordering::SeqCst))
        {
            return Err(CommError::Injected(format!(
                "message {n} of rank {} failed on request",
                self.rank()
            )));
        }
        let sent = if op.dir == Dir::Send { op.buf.len() } else { 0 };
        let bytes = self.bytes + sent as u64;
        self.broken |= self.fail_at.is_some_and(|at| n >= at)
            || self.byte_budget.is_some_and(|budget| bytes > budget);
        if self.broken {
            return Err(self.broken_error());
        }
        self.bytes = bytes;
        self.inner.post(op)
    }

    fn progress(&mut self, wait: Duration, abort: &AtomicBool) -> Result<Vec<Done>, CommError> {
        if self.broken {
            return Err(self.broken_error());
        }
        self.inner.progress(wait, abort)
    }

    fn detach(&mut self, tickets: &[Ticket]) {
        self.inner.detach(tickets)
    }

    fn cancel(&mut self, tickets: &[Ticket]) {
        self.inner.cancel(tickets)
    }
}

impl<C: Comm> Failing<C> {
    fn broken_error(&self) -> CommError {
        CommError::Injected(format!("the link of rank {} is broken", self.rank()))
    }
}

/// Caps the average rate of bytes sent: a send is held back until the bytes before it
/// (and its own) fit the rate since the first send, then posted to the wrapped transport.
pub struct Slow<C> {
    inner: C,
    bytes_per_second: u64,
    start: Option<Instant>,
    /// Bytes of the sends posted or held so far.
    queued: u64,
    /// Sends not posted yet, oldest first: our ticket, when it is due, the op.
    held: VecDeque<(Ticket, Instant, Op)>,
    /// Tickets of posted messages: the wrapped transport's, mapped to ours.
    ours: HashMap<Ticket, Ticket>,
    next_ticket: Ticket,
    detached: HashSet<Ticket>,
}

impl<C: Comm> Slow<C> {
    pub fn new(inner: C, bytes_per_second: u64) -> Slow<C> {
        Slow {
            inner,
            bytes_per_second: bytes_per_second.max(1),
            start: None,
            queued: 0,
            held: VecDeque::new(),
            ours: HashMap::new(),
            next_ticket: 0,
            detached: HashSet::new(),
        }
    }

    fn post_inner(&mut self, ticket: Ticket, op: Op) -> Result<(), CommError> {
        let theirs = self.inner.post(op)?;
        self.ours.insert(theirs, ticket);
        Ok(())
    }

    /// Posts the held sends that are due.
    fn release(&mut self) -> Result<(), CommError> {
        let now = Instant::now();
        while self.held.front().is_some_and(|(_, due, _)| *due <= now) {
            let (ticket, _, op) = self.held.pop_front().expect("front");
            self.post_inner(ticket, op)?;
        }
        Ok(())
    }
}

impl<C: Comm> Comm for Slow<C> {
    delegate!();

    fn post(&mut self, op: Op) -> Result<Ticket, CommError> {
        self.next_ticket += 1;
        let ticket = self.next_ticket;
        if op.dir == Dir::Recv {
            self.post_inner(ticket, op)?;
            return Ok(ticket);
        }
        let start = *self.start.get_or_insert_with(Instant::now);
        self.queued += op.buf.len() as u64;
        let due =
            start + Duration::from_secs_f64(self.queued as f64 / self.bytes_per_second as f64);
        // Messages of a pair stay in order: a send never overtakes one held before it.
        self.held.push_back((ticket, due, op));
        self.release()?;
        Ok(ticket)
    }

    fn progress(&mut self, wait: Duration, abort: &AtomicBool) -> Result<Vec<Done>, CommError> {
        let until = Instant::now() + wait;
        loop {
            self.release()?;
            let next_due = self.held.front().map(|(_, due, _)| *due);
            let step = next_due.map_or(until, |due| due.min(until));
            let done = self
                .inner
                .progress(step.saturating_duration_since(Instant::now()), abort)?;
            let mut out = Vec::new();
            for d in done {
                if let Some(ticket) = self.ours.remove(&d.ticket)
                    && !self.detached.remove(&ticket)
                {
                    out.push(Done { ticket, buf: d.buf });
                }
            }
            let now = Instant::now();
            if !out.is_empty() || now >= until {
                return Ok(out);
            }
            if next_due.is_none() && self.ours.len() <= self.detached.len() {
                return Ok(out);
            }
            if next_due.is_none() || next_due.is_some_and(|d| d > now) {
                // The wrapped transport waited its share; it returned early only with
                // nothing of ours (a detached message), so look again.
                thread::sleep(Duration::from_micros(100));
            }
        }
    }

    fn detach(&mut self, tickets: &[Ticket]) {
        let theirs: Vec<Ticket> = (self.ours.iter())
            .filter(|(_, ours)| tickets.contains(ours))
            .map(|(theirs, _)| *theirs)
            .collect();
        self.inner.detach(&theirs);
        for t in theirs {
            self.ours.remove(&t);
        }
        // Held sends still go out (the peer expects them), unreported.
        for (ticket, _, _) in &self.held {
            if tickets.contains(ticket) {
                self.detached.insert(*ticket);
            }
        }
    }
}

/// Passes every send through `rewrite` (which may change its bytes) before posting it.
pub struct Rewriting<C> {
    inner: C,
    rewrite: Box<dyn FnMut(&mut Op) + Send>,
}

impl<C: Comm> Rewriting<C> {
    pub fn new(inner: C, rewrite: impl FnMut(&mut Op) + Send + 'static) -> Rewriting<C> {
        Rewriting {
            inner,
            rewrite: Box::new(rewrite),
        }
    }
}

impl<C: Comm> Comm for Rewriting<C> {
    delegate!(messages);

    fn post(&mut self, mut op: Op) -> Result<Ticket, CommError> {
        if op.dir == Dir::Send {
            (self.rewrite)(&mut op);
        }
        self.inner.post(op)
    }
}

/// Holds the completion of each send over [`Lagging::EAGER`] bytes back for `lag` after the
/// wrapped transport reported it (smaller sends complete as they do), and counts the messages posted whose completion was not reported (nor detached or
/// cancelled) yet: a caller that returns while [`Lagging::open`] is not zero left them to
/// be abandoned, which under MPI skips `MPI_Finalize` and fails the job.
pub struct Lagging<C> {
    inner: C,
    lag: Duration,
    /// Send completions the wrapped transport reported, with when they are due.
    held: VecDeque<(Instant, Done)>,
    /// Posted and not reported, detached or cancelled yet.
    live: HashSet<Ticket>,
    /// Which of them are sends.
    sends: HashSet<Ticket>,
    open: Arc<AtomicUsize>,
}

impl<C: Comm> Lagging<C> {
    /// Sends up to this many bytes complete at once, as MPI's eager sends do: so a short
    /// message posted after a long one may complete first.
    pub const EAGER: usize = 64;

    pub fn new(inner: C, lag: Duration) -> Lagging<C> {
        Lagging {
            inner,
            lag,
            held: VecDeque::new(),
            live: HashSet::new(),
            sends: HashSet::new(),
            open: Arc::default(),
        }
    }

    /// How many posted messages are still unaccounted for; shared, so it can be read after
    /// the transport moved into the code under test.
    pub fn open(&self) -> Arc<AtomicUsize> {
        self.open.clone()
    }

    fn forget(&mut self, tickets: &[Ticket]) {
        for t in tickets {
            self.live.remove(t);
            self.sends.remove(t);
        }
        self.held.retain(|(_, d)| !tickets.contains(&d.ticket));
        self.open.store(self.live.len(), Ordering::Relaxed);
    }
}

impl<C: Comm> Comm for Lagging<C> {
    delegate!();

    fn post(&mut self, op: Op) -> Result<Ticket, CommError> {
        let send = op.dir == Dir::Send && op.buf.len() > Self::EAGER;
        let ticket = self.inner.post(op)?;
        self.live.insert(ticket);
        if send {
            self.sends.insert(ticket);
        }
        self.open.store(self.live.len(), Ordering::Relaxed);
        Ok(ticket)
    }

    fn progress(&mut self, wait: Duration, abort: &AtomicBool) -> Result<Vec<Done>, CommError> {
        let until = Instant::now() + wait;
        loop {
            let now = Instant::now();
            let next = self
                .held
                .front()
                .map_or(until, |(due, _)| (*due).min(until));
            let step = next.saturating_duration_since(now);
            let mut out = Vec::new();
            for d in self.inner.progress(step, abort)? {
                if self.sends.remove(&d.ticket) {
                    self.held.push_back((Instant::now() + self.lag, d));
                } else {
                    out.push(d);
                }
            }
            let now = Instant::now();
            while self.held.front().is_some_and(|(due, _)| *due <= now) {
                out.push(self.held.pop_front().expect("front").1);
            }
            out.retain(|d| self.live.remove(&d.ticket));
            self.open.store(self.live.len(), Ordering::Relaxed);
            if !out.is_empty() || now >= until || self.live.is_empty() {
                return Ok(out);
            }
            thread::sleep(Duration::from_micros(200));
        }
    }

    fn detach(&mut self, tickets: &[Ticket]) {
        self.inner.detach(tickets);
        self.forget(tickets);
    }

    fn cancel(&mut self, tickets: &[Ticket]) {
        self.inner.cancel(tickets);
        self.forget(tickets);
    }
}

/// Counts what collectives hand this rank (see the module docs), and the bytes this rank
/// contributes to them (`sent`: its all-gather data, its broadcasts as the root);
/// point-to-point messages pass through uncounted.
pub struct Metered<C> {
    inner: C,
    received: Arc<std::sync::atomic::AtomicU64>,
    sent: Arc<std::sync::atomic::AtomicU64>,
}

impl<C: Comm> Metered<C> {
    /// With the counter of received bytes it adds to.
    pub fn new(inner: C) -> (Metered<C>, Arc<std::sync::atomic::AtomicU64>) {
        let (metered, received, _) = Metered::with_sent(inner);
        (metered, received)
    }

    /// With the counters of received and of sent bytes it adds to.
    #[allow(clippy::type_complexity)]
    pub fn with_sent(
        inner: C,
    ) -> (
        Metered<C>,
        Arc<std::sync::atomic::AtomicU64>,
        Arc<std::sync::atomic::AtomicU64>,
    ) {
        let received = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let metered = Metered {
            inner,
            received: received.clone(),
            sent: sent.clone(),
        };
        (metered, received, sent)
    }

    fn count(&self, bytes: usize) {
        self.received.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

impl<C: Comm> Comm for Metered<C> {
    fn rank(&self) -> Rank {
        self.inner.rank()
    }
    fn size(&self) -> u32 {
        self.inner.size()
    }
    fn hosts(&self) -> &[u32] {
        self.inner.hosts()
    }
    fn all_gather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
        self.sent.fetch_add(data.len() as u64, Ordering::Relaxed);
        let all = self.inner.all_gather(data)?;
        self.count(all.iter().map(|d| 8 + d.len()).sum());
        Ok(all)
    }
    fn broadcast(&mut self, root: Rank, data: Vec<u8>) -> Result<Vec<u8>, CommError> {
        if root == self.rank() {
            self.sent.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        let got = self.inner.broadcast(root, data)?;
        self.count(8 + got.len());
        Ok(got)
    }
    fn all_reduce(&mut self, values: &[u64], op: super::Reduce) -> Result<Vec<u64>, CommError> {
        self.count(8 * values.len());
        self.inner.all_reduce(values, op)
    }
    fn split(&mut self, color: u32) -> Result<Box<dyn Comm>, CommError> {
        self.inner.split(color)
    }
    fn post(&mut self, op: Op) -> Result<Ticket, CommError> {
        self.inner.post(op)
    }
    fn progress(&mut self, wait: Duration, abort: &AtomicBool) -> Result<Vec<Done>, CommError> {
        self.inner.progress(wait, abort)
    }
    fn detach(&mut self, tickets: &[Ticket]) {
        self.inner.detach(tickets)
    }
    fn cancel(&mut self, tickets: &[Ticket]) {
        self.inner.cancel(tickets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::LocalComm;

    #[test]
    fn failing_breaks_at_its_transfer_and_slow_takes_its_time() {
        let mut world = LocalComm::world(2);
        let (b, a) = (world.pop().unwrap(), world.pop().unwrap());
        let abort = AtomicBool::new(false);
        let mut a = Failing::at_message(a, 1);
        let mut b = Slow::new(b, 10_000);
        a.sendrecv(1, Some((1, &[1; 10])), None, &abort).unwrap();
        let mut got = [0u8; 10];
        b.sendrecv(1, None, Some((0, &mut got)), &abort).unwrap();
        assert_eq!(got, [1; 10]);
        let e = a.sendrecv(1, Some((1, &[2])), None, &abort).unwrap_err();
        assert!(matches!(e, CommError::Injected(_)), "{e}");
        assert!(
            a.sendrecv(1, Some((1, &[3])), None, &abort).is_err(),
            "stays broken"
        );
        let t0 = Instant::now();
        b.sendrecv(1, Some((0, &[0; 1000])), None, &abort).unwrap();
        assert!(
            t0.elapsed() >= Duration::from_millis(90),
            "1000 bytes at 10 kB/s"
        );

        let mut world = LocalComm::world(1);
        let mut c = Failing::after_bytes(world.pop().unwrap(), 4);
        c.sendrecv(1, Some((0, &[0; 4])), Some((0, &mut [0; 4])), &abort)
            .unwrap();
        let e = c.sendrecv(1, Some((0, &[0])), None, &abort).unwrap_err();
        assert!(matches!(e, CommError::Injected(_)), "{e}");
    }
}
