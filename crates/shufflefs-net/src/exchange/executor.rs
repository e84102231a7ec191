//! Runs any [`Schedule`]: the wire protocol of the exchange.
//!
//! # Protocol
//! Every rank derives its part of the same schedule from the plan, so nothing is negotiated:
//! no any-source receive, no per-sample message. Each stream of the schedule (one peer, its
//! samples in stream order) is a sequence of messages on the exchange's data tag:
//! 1. the size list (see `sizes`), whose length both sides know from the schedule;
//! 2. the bytes of its samples back to back, each followed by the CRC-32C its sender recorded
//!    when the sample entered its cache, cut into frames of `frame` bytes (the last one
//!    shorter): many small samples share a frame, and a sample larger than 2 GiB simply
//!    spans many frames. Both sides know the frames' lengths from the size list.
//!
//! 3. on the end tag, once the sender posted the last frame it will send, their count (see
//!    "Stopping a stream" below);
//!
//! and, once the receiver holds the stream durably, two bytes back on the confirmation tag
//! (1: stored; 0: this rank failed locally and fetches from the source; then 1 if the
//! receiver gave the stream up). A stream between ranks that share a disk
//! ([`RoundOp::Hand`]/[`RoundOp::Take`]) has only the size list and the confirmation: the
//! receiver takes the samples from the sender's cache folder.
//!
//! All streams of a round (of a wave, see below) move at once, each at its own pace: the loop below posts a few
//! frames per stream ([`IN_FLIGHT`]) and refills a stream as its own messages complete, so a
//! slow peer holds only its streams. Receives are posted as soon as the size list says what
//! comes, and a send only ever waits for a receive its peer posts without waiting for
//! anything of ours, so no cycle of waits can form. For each outgoing stream a reader thread
//! fills frames from the cache (or the source, for samples not staged yet); for each incoming
//! stream a writer thread turns frames into cache files, so disk and network overlap.
//!
//! The sender checks its copy as it reads it (a corrupt copy is dropped and refetched from
//! the source later; an unreadable one is sent as zeros with a checksum that cannot match);
//! the receiver checks the bytes before committing them, so a sample damaged on either side
//! never enters a view. Received bytes land only under the cache's own names: peers never
//! send names, so nothing a peer says can make us write outside the cache folder.
//!
//! # A frame budget for any number of ranks
//! Each stream holds a few frames at once ([`PER_STREAM`]: posted, queued for its disk
//! thread, in the thread's hands), so all streams at once would hold frames in proportion to
//! the number of ranks M: at 1 MiB frames, 9 MiB per stream, 72 GiB per rank at M = 4,096.
//! Frames shrink to fit `ExchangeConfig::frame_budget` (256 MiB) down to [`MIN_FRAME`];
//! past that a round runs in *waves* (`waves`): the stream from rank a to rank b has the
//! shift (b - a) mod M, and a wave is the streams of [`Ctx::wave_width`] consecutive shifts,
//! so a rank has at most that many streams out and as many in per wave, all of whose frames
//! fit the budget (measured: `ExchangeReport::frame_bytes_peak`, counted by the round's
//! frame pools). The waves of a round run one after the other, each as a round of its own
//! (its own settle and confirmations), a rank skipping those it has no stream in.
//!
//! Why this cannot deadlock. The invariant every round keeps: *a send only ever waits for a
//! receive its peer posts without waiting for anything of ours* (receives are posted as soon
//! as the size list says what comes; size lists, confirmations and ends are posted
//! unconditionally), so within a round every stream completes once both ends run that round.
//! A cap that made a receive wait for budget held by our other streams would break it: A
//! holding its budget for streams to B that wait on B, B the same towards A. Waves keep it
//! because they are rounds: the wave of a stream is a function of (a, b, M, width), settings
//! every rank shares, so both ends run it in the same wave, and the waves are run in one
//! global order (round, then wave). Take the first (round, wave) not complete everywhere:
//! every rank with a stream in it has finished everything before it, so both ends of each of
//! its streams run it, and the round invariant completes it. Frames held stay in a wave's
//! streams and are handed back when it ends. The price: a wave ends with its slowest stream
//! (given up past the slow-peer rule, as in any round), and each wave makes the cache
//! durable once; with the defaults (1 MiB frames, 256 MiB) a wave is 14 shifts, so up to 15
//! ranks run in one wave as before, 64 ranks in 5 and 4,096 in 293.
//!
//! # Settling early, draining late
//! A rank has what it needs once every incoming stream is stored or given up (see
//! `deadline`): it then makes its cache durable (one `syncfs`: on a node shared by several
//! ranks each one writes back everybody's dirty pages), confirms to its senders, and reports
//! the exchange settled, so its next epoch can be published; what a given-up peer did not
//! deliver is fetched from the source by the caller. The round still runs until every
//! message of it completed: a given-up peer's frames already posted are received and
//! dropped (its sends must not block), and this rank's own streams finish at its receivers'
//! pace. A rank drops the samples it sent only after `run` returned, that is after hearing
//! from each receiver that it holds them durably.
//!
//! # Stopping a stream
//! The next exchange starts only once this one's messages all completed, so a slow peer's
//! late bytes, or this rank's bytes to a slow receiver, would hold it. Hence the end message
//! (see `stop`): a sender whose receiver gave it up (the confirmation says so), or that
//! finds a receiver far behind its other ones once it settled, posts no more frames and
//! says how many it posted; the receiver withdraws its receives past them, and fetches from
//! the source what did not come. A rank that every receiver gave up leaves the exchanges
//! after this one and fetches its shares from the source. A rank whose disk failed still takes part in every
//! stream (sending zeros, draining what arrives), so a local failure never leaves a peer
//! waiting.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{Receiver, SyncSender};
use std::thread::{self, Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use super::frames::{Held, Pool};
use super::schedule::{Round, RoundOp, Schedule};
use super::sizes::ENTRY;
use super::{
    ExchangeConfig, ExchangeError, ExchangeReport, ExchangeState, ExchangeTracker, Peers, Phase,
    Sized,
};
use crate::cache::SampleStore;
use crate::comm::{Comm, CommError, Done, Op, Ticket};
use crate::plan::{Rank, SampleId};

mod incoming;
mod outgoing;
mod stop;
mod waves;
use stop::stop_sending;

/// Frames per stream posted to the transport at once.
const IN_FLIGHT: usize = 2;
/// Frames per stream queued between the transport and its disk thread.
const QUEUED: usize = 2;
/// The most frames one stream holds at once: an incoming one has `IN_FLIGHT` receives
/// posted, up to `QUEUED + IN_FLIGHT - 1` frames arrived and waiting for its writer,
/// `QUEUED` in the writer's channel and two in the writer's hands (the one it is done with
/// and the next); an outgoing one holds fewer (posted, queued, and two in the reader's).
const PER_STREAM: usize = 2 * IN_FLIGHT + 2 * QUEUED + 1;
/// The smallest frame the budget may shrink frames to; below it, streams run in waves.
const MIN_FRAME: usize = 1 << 20;
/// How long one look at the transport may wait.
const POLL: Duration = Duration::from_millis(2);

/// What every stream needs besides the transport.
pub(super) struct Ctx<'a> {
    pub store: &'a SampleStore,
    pub tracker: &'a ExchangeTracker,
    pub peers: &'a Peers,
    pub hosts: &'a [u32],
    pub me: Rank,
    pub target: u64,
    pub cfg: ExchangeConfig,
    pub abort: &'a AtomicBool,
    /// This rank stopped and only serves its peers (`Partial::leave`): it sends every
    /// sample as unsendable, drops what arrives and confirms [`LEFT`].
    pub leaving: bool,
}

/// The confirmation of a rank that left (`Partial::leave`): nothing stored, and no
/// exchange after this one with it.
const LEFT: u8 = 2;
/// Bytes of a confirmation: the outcome, then 1 if the receiver gave the stream up (the
/// sender stops after the frames it already posted).
const CONFIRM: usize = 2;
/// Bytes of the end of a stream: how many frames its sender posted, u64 little-endian,
/// then 1 if the sender leaves the exchanges after this one (see `stop`).
const END: usize = 9;

impl Ctx<'_> {
    fn comm_error(&self, phase: Phase, peers: Vec<Rank>, source: CommError) -> ExchangeError {
        ExchangeError::Comm {
            phase,
            target_epoch: self.target,
            peers,
            source,
        }
    }

    /// Tags of this exchange: data, confirmations (which cross data in the other
    /// direction, so they need a tag of their own to keep each pair's order unambiguous),
    /// and the end of each stream (sent when its sender knows how many frames it posts).
    fn tags(&self) -> (u16, u16, u16) {
        let data = ((self.target & 0x1FFF) as u16) << 2;
        (data, data | 1, data | 2)
    }

    /// Frame size: the configured one, shrunk so all streams' frames fit the budget, but
    /// not below [`MIN_FRAME`] (past that, [`Ctx::wave_width`] runs fewer streams at once).
    /// A function of settings every rank shares, so both sides of a stream cut it alike.
    fn frame(&self) -> usize {
        let streams = 2 * self.hosts.len().saturating_sub(1).max(1);
        let fit = self.cfg.frame_budget / (streams * PER_STREAM);
        self.cfg.frame.min(fit.max(MIN_FRAME)).max(1)
    }

    /// Shifts per wave (see `waves`): as many streams as the budget holds at `frame`
    /// bytes, half of them out and half in, at least one each way. Every peer at once (one
    /// wave) whenever the budget holds them all.
    fn wave_width(&self, frame: usize) -> usize {
        (self.cfg.frame_budget / (frame * PER_STREAM) / 2).max(1)
    }

    fn same_host(&self, peer: Rank) -> bool {
        self.hosts[peer as usize] == self.hosts[self.me as usize]
    }
}

/// Runs `schedule`; calls `settled` once, when this rank holds what it needs (or with the
/// error that ended the exchange first), then returns once every stream completed.
pub(super) fn execute(
    comm: &mut dyn Comm,
    ctx: &Ctx,
    schedule: &Schedule,
    settled: &mut dyn FnMut(Result<(), &ExchangeError>),
) -> Result<(), ExchangeError> {
    let started = Instant::now();
    let (target, tracker) = (ctx.target, ctx.tracker);
    tracker.update(target, |r| {
        r.state = ExchangeState::Running;
        count_streams(ctx, schedule, r);
    });
    let width = ctx.wave_width(ctx.frame());
    let waves = waves::split(schedule, ctx.me, ctx.hosts.len() as u32, width);
    let result = run_rounds(comm, ctx, &waves, started, settled);
    let seconds = started.elapsed().as_secs_f64();
    tracker.update(target, |r| {
        r.seconds = seconds;
        if result.is_err() {
            r.state = ExchangeState::Failed;
        }
        r.error = result.as_ref().err().map(ToString::to_string);
    });
    log_finished(tracker, target, seconds);
    result
}

/// Enters in `report` what the schedule moves with each peer, and how.
fn count_streams(ctx: &Ctx, schedule: &Schedule, report: &mut ExchangeReport) {
    for op in schedule.rounds.iter().flat_map(|r| &r.ops) {
        let s = op.stream();
        let n = s.samples.len() as u64;
        let peer = report.peer(s.peer);
        peer.via = if matches!(op, RoundOp::Hand(_) | RoundOp::Take(_)) {
            "disk"
        } else {
            "mpi"
        };
        peer.same_host = ctx.same_host(s.peer);
        if op.is_outgoing() {
            peer.samples_to_send = n;
            report.samples_to_send += n;
        } else {
            peer.samples_to_receive = n;
            report.samples_to_receive += n;
        }
    }
}

/// Runs the rounds in order, calling `settled` exactly once: when the last round settles,
/// at once if there is none, or with the error that ended the exchange first.
fn run_rounds(
    comm: &mut dyn Comm,
    ctx: &Ctx,
    schedule: &Schedule,
    started: Instant,
    settled: &mut dyn FnMut(Result<(), &ExchangeError>),
) -> Result<(), ExchangeError> {
    let (target, tracker) = (ctx.target, ctx.tracker);
    let mut result = Ok(());
    let mut told = false;
    let last = schedule.rounds.len().saturating_sub(1);
    for (k, round) in schedule.rounds.iter().enumerate() {
        let mut on_settled = |local: &Option<ExchangeError>| {
            if k == last {
                tracker.update(target, |r| {
                    r.state = ExchangeState::Done;
                    r.settled_seconds = started.elapsed().as_secs_f64();
                });
                told = true;
                settled(local.as_ref().map_or(Ok(()), Err));
            }
        };
        match run_round(comm, ctx, round, &mut on_settled) {
            Ok(Some(local)) if result.is_ok() => result = Err(local),
            Ok(_) => {}
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    if schedule.rounds.is_empty() {
        tracker.update(target, |r| r.state = ExchangeState::Done);
        settled(Ok(()));
        told = true;
    }
    if !told && let Err(e) = &result {
        settled(Err(e));
    }
    result
}

/// Logs the exchange's totals from its report.
fn log_finished(tracker: &ExchangeTracker, target: u64, seconds: f64) {
    if let Some(r) = (tracker.snapshot().into_iter()).find(|r| r.target_epoch == target) {
        let given_up: Vec<u32> = (r.peers.iter())
            .filter(|p| p.given_up)
            .map(|p| p.rank)
            .collect();
        tracing::info!(
            target_epoch = target,
            state = r.state.as_str(),
            samples_sent = r.samples_sent,
            samples_received = r.samples_received,
            bytes_within_hosts = r.bytes_within_hosts,
            bytes_across_hosts = r.bytes_across_hosts,
            failed = r.failed_samples,
            given_up = ?given_up,
            settled = format!("{:.3}", r.settled_seconds),
            seconds = format!("{seconds:.3}"),
            "exchange finished"
        );
    }
}

/// Where a completed message belongs.
#[derive(Clone, Copy, Debug)]
enum Slot {
    SizesIn(usize),
    /// Stream, frame index.
    FrameIn(usize, usize),
    /// Sends that carry nothing back, by the peer they go to (so a given-up peer's are
    /// detached with the rest of its messages).
    SizesOut(Rank),
    FrameOut(usize),
    ConfirmIn(usize),
    ConfirmOut(Rank),
    EndIn(usize),
    EndOut(Rank),
}

fn phase_of(slot: Slot) -> Phase {
    match slot {
        Slot::SizesIn(_) | Slot::SizesOut(_) => Phase::Sizes,
        Slot::FrameIn(..) | Slot::FrameOut(_) | Slot::EndIn(_) | Slot::EndOut(_) => Phase::Samples,
        Slot::ConfirmIn(_) | Slot::ConfirmOut(_) => Phase::Confirm,
    }
}

/// A stream leaving this rank.
struct Out<'s> {
    peer: Rank,
    disk: bool,
    ids: &'s [SampleId],
    /// Bytes on the wire and frames of them.
    len: u64,
    frames: usize,
    posted: usize,
    sent: usize,
    /// Frames from the reader; `None` once it is done or failed (then zeros go out).
    reader: Option<Receiver<Vec<u8>>>,
    confirmed: Option<bool>,
    /// The receiver gave the stream up (its confirmation said so).
    stop_asked: bool,
    /// No frame after those posted goes out (`frames` was cut to them).
    stopped: bool,
    /// Its end (the number of frames) is posted.
    ended: bool,
    /// From the round's start to its last frame sent.
    took: Option<Duration>,
    /// Its size list is posted; it was posted as sending nothing because the receiver gave
    /// the stream up before its sizes were known.
    listed: bool,
    skipped: bool,
}

/// A stream arriving at this rank.
struct In<'s, 'scope> {
    peer: Rank,
    disk: bool,
    ids: &'s [SampleId],
    /// Known once the size list arrived.
    samples: Option<Vec<Sized>>,
    len: u64,
    frames: usize,
    posted: usize,
    arrived: usize,
    /// Frames received and not handed to the writer yet, by index (they may complete out
    /// of order); the next one the writer needs.
    pending: std::collections::BTreeMap<usize, Vec<u8>>,
    next_write: usize,
    writer: Option<SyncSender<Vec<u8>>>,
    worker: Option<ScopedJoinHandle<'scope, Result<(), ExchangeError>>>,
    /// Stored (its disk thread is done) or given up: nothing more of it enters the cache.
    settled: bool,
    given_up: bool,
    /// When its size list arrived: its bytes can flow from then on.
    began: Option<Instant>,
    took: Option<Duration>,
    /// The frames its sender posts in all (its end message); `frames` is cut to it.
    end: Option<usize>,
    /// Its sender stopped it before its last frame.
    cut: bool,
}

impl In<'_, '_> {
    fn drained(&self) -> bool {
        self.samples.is_some() && (self.disk || self.end.is_some()) && self.arrived == self.frames
    }
}

/// Runs one round to its end; `Ok(Some(_))`: this rank failed locally but served its peers
/// to the end.
fn run_round(
    comm: &mut dyn Comm,
    ctx: &Ctx,
    round: &Round,
    settled: &mut dyn FnMut(&Option<ExchangeError>),
) -> Result<Option<ExchangeError>, ExchangeError> {
    let frame = ctx.frame();
    let streams = round.ops.len().max(1);
    let held = std::sync::Arc::new(Held::default());
    let pools = (
        Pool::new(frame, streams, held.clone()),
        Pool::new(frame, streams, held.clone()),
    );
    let mut tickets = HashMap::new();
    let result = thread::scope(|scope| {
        let mut run = RoundRun {
            ctx,
            frame,
            send_pool: &pools.0,
            recv_pool: &pools.1,
            tickets: &mut tickets,
            started: Instant::now(),
            pacer: Pacer::new(ctx.cfg.rate),
            local: None,
            leaves: None,
            sizing: None,
            scope,
            last_heard: (round.ops.iter())
                .map(|op| (op.stream().peer, Instant::now()))
                .collect(),
        };
        run.run(comm, round, settled).map(|()| run.local)
    });
    if result.is_err() {
        // Nobody will ask for what is still posted; the transport frees it.
        let pending: Vec<Ticket> = tickets.keys().copied().collect();
        comm.detach(&pending);
    }
    let peak = (held.peak() * frame) as u64;
    (ctx.tracker).update(ctx.target, |r| {
        r.frame_bytes_peak = r.frame_bytes_peak.max(peak);
    });
    result
}

/// The state of one round in flight.
struct RoundRun<'a, 's, 'scope, 'env> {
    ctx: &'a Ctx<'s>,
    frame: usize,
    send_pool: &'env Pool,
    recv_pool: &'env Pool,
    tickets: &'a mut HashMap<Ticket, Slot>,
    started: Instant,
    pacer: Pacer,
    local: Option<ExchangeError>,
    /// Whether this rank leaves the exchanges after this one, once decided (see `stop`):
    /// every end of a stream says the same.
    leaves: Option<bool>,
    /// Resolving the sizes of what this rank sends, when some had to be fetched.
    sizing: Option<ScopedJoinHandle<'scope, Vec<u64>>>,
    scope: &'scope Scope<'scope, 'env>,
    /// When each peer last completed a message with this rank.
    last_heard: HashMap<Rank, Instant>,
}

impl<'a, 's: 'env, 'scope, 'env> RoundRun<'a, 's, 'scope, 'env> {
    fn frame_len(&self, len: u64, i: usize) -> usize {
        (len - (i * self.frame) as u64).min(self.frame as u64) as usize
    }

    fn frames(&self, len: u64) -> usize {
        len.div_ceil(self.frame as u64) as usize
    }

    fn post(&mut self, comm: &mut dyn Comm, op: Op, slot: Slot) -> Result<(), ExchangeError> {
        let peer = op.peer;
        let ticket = comm
            .post(op)
            .map_err(|e| self.ctx.comm_error(phase_of(slot), vec![peer], e))?;
        self.tickets.insert(ticket, slot);
        Ok(())
    }

    fn fail_locally(&mut self, e: ExchangeError) {
        // The first writer's error names the sample: prefer it to later ones.
        if !matches!(self.local, Some(ExchangeError::Store { .. })) {
            self.local = Some(e);
        }
    }

    fn run(
        &mut self,
        comm: &mut dyn Comm,
        round: &'s Round,
        settled: &mut dyn FnMut(&Option<ExchangeError>),
    ) -> Result<(), ExchangeError> {
        let ctx = self.ctx;
        // Every receive the round starts with, before any send.
        let (mut outs, mut ins) = self.open_streams(comm, round)?;
        self.start_sending(comm, &mut outs)?;
        let mut settled_at: Option<Instant> = None;
        loop {
            self.list_resolved(comm, &mut outs)?;
            self.feed_out(comm, &mut outs)?;
            self.feed_in(comm, &mut ins)?;
            if settled_at.is_none() && ins.iter().all(|s| s.settled) {
                self.settle(comm, &ins)?;
                settled_at = Some(Instant::now());
                settled(&self.local);
            }
            let sent = (outs.iter())
                .all(|o| o.sent == o.frames && o.confirmed.is_some() && (o.disk || o.ended));
            // Every message this round posted is accounted for (completed, or cancelled or
            // detached with its peer given up): a send still pending when the round ends
            // would be abandoned with the communicator, and MPI then cannot finalize.
            let accounted = self.tickets.is_empty();
            if settled_at.is_some() && accounted && sent && ins.iter().all(In::drained) {
                return Ok(());
            }
            let completed = comm.progress(POLL, ctx.abort).map_err(|e| {
                let peers = outs
                    .iter()
                    .map(|o| o.peer)
                    .chain(ins.iter().map(|i| i.peer));
                ctx.comm_error(Phase::Samples, peers.collect(), e)
            })?;
            for done in completed {
                self.completed(comm, done, &mut outs, &mut ins);
            }
            self.reap(&mut ins);
            if settled_at.is_none() {
                self.give_up_overdue(&mut ins);
            } else if !ctx.leaving {
                self.stop_overdue(&mut outs);
                // A leaving rank waits for its peers to reach this exchange, however long.
                self.abandon_idle(comm, &mut outs, &mut ins);
            }
        }
    }

    /// Sets up the round's streams and posts every receive the round starts with, before
    /// any send.
    fn open_streams(
        &mut self,
        comm: &mut dyn Comm,
        round: &'s Round,
    ) -> Result<(Vec<Out<'s>>, Vec<In<'s, 'scope>>), ExchangeError> {
        let ctx = self.ctx;
        let (data, confirm, end) = ctx.tags();
        let mut outs: Vec<Out> = Vec::new();
        let mut ins: Vec<In> = Vec::new();
        for op in &round.ops {
            let s = op.stream();
            let disk = matches!(op, RoundOp::Hand(_) | RoundOp::Take(_));
            if op.is_outgoing() {
                let slot = Slot::ConfirmIn(outs.len());
                outs.push(Out {
                    peer: s.peer,
                    disk,
                    ids: &s.samples,
                    len: 0,
                    frames: 0,
                    posted: 0,
                    sent: 0,
                    reader: None,
                    confirmed: None,
                    stop_asked: false,
                    stopped: false,
                    ended: false,
                    took: None,
                    listed: false,
                    skipped: false,
                });
                self.post(comm, Op::recv(s.peer, confirm, vec![0; CONFIRM]), slot)?;
            } else {
                let slot = Slot::SizesIn(ins.len());
                ins.push(In {
                    peer: s.peer,
                    disk,
                    ids: &s.samples,
                    samples: None,
                    len: 0,
                    frames: 0,
                    posted: 0,
                    arrived: 0,
                    pending: Default::default(),
                    next_write: 0,
                    writer: None,
                    worker: None,
                    settled: ctx.leaving,
                    given_up: ctx.leaving,
                    began: None,
                    took: None,
                    end: None,
                    cut: false,
                });
                let list = vec![0u8; s.samples.len() * ENTRY];
                self.post(comm, Op::recv(s.peer, data, list), slot)?;
                if !disk {
                    let slot = Slot::EndIn(ins.len() - 1);
                    self.post(comm, Op::recv(s.peer, end, vec![0; END]), slot)?;
                }
            }
        }
        Ok((outs, ins))
    }

    /// Takes in one completed message of this round.
    fn completed(
        &mut self,
        comm: &mut dyn Comm,
        done: Done,
        outs: &mut [Out],
        ins: &mut [In<'s, 'scope>],
    ) {
        let Some(slot) = self.tickets.remove(&done.ticket) else {
            return;
        };
        let peer = match slot {
            Slot::SizesIn(i) | Slot::FrameIn(i, _) | Slot::EndIn(i) => Some(ins[i].peer),
            Slot::FrameOut(i) | Slot::ConfirmIn(i) => Some(outs[i].peer),
            // A send completing says little of its peer (small ones complete locally).
            Slot::SizesOut(_) | Slot::ConfirmOut(_) | Slot::EndOut(_) => None,
        };
        if let Some(peer) = peer {
            self.last_heard.insert(peer, Instant::now());
        }
        match slot {
            Slot::SizesIn(i) => self.sizes_arrived(&mut ins[i], &done.buf),
            Slot::FrameIn(i, k) => self.frame_arrived(&mut ins[i], k, done.buf),
            // Sends of this rank that carry nothing back: their completion only counts (the
            // ticket table empties).
            Slot::SizesOut(_) | Slot::ConfirmOut(_) | Slot::EndOut(_) => {}
            Slot::FrameOut(i) => self.frame_sent(&mut outs[i], done.buf),
            Slot::ConfirmIn(i) => self.confirmed(&mut outs[i], &done.buf),
            Slot::EndIn(i) => self.end_arrived(comm, &mut ins[i], i, &done.buf),
        }
    }

    /// Makes what arrived durable and tells every sender whether it is stored.
    fn settle(&mut self, comm: &mut dyn Comm, ins: &[In]) -> Result<(), ExchangeError> {
        let t0 = Instant::now();
        if !self.ctx.leaving
            && let Err(e) = self.ctx.store.sync()
        {
            self.fail_locally(ExchangeError::Sync(e));
        }
        let secs = t0.elapsed().as_secs_f64();
        self.ctx
            .tracker
            .update(self.ctx.target, |r| r.sync_seconds += secs);
        let (_, confirm, _) = self.ctx.tags();
        let ok = match self.ctx.leaving {
            true => LEFT,
            false => u8::from(self.local.is_none()),
        };
        for s in ins {
            let msg = vec![ok, u8::from(s.given_up && !s.disk)];
            self.post(
                comm,
                Op::send(s.peer, confirm, msg),
                Slot::ConfirmOut(s.peer),
            )?;
        }
        Ok(())
    }
}

/// Keeps the average send rate under a cap by holding frames back.
struct Pacer {
    rate: Option<u64>,
    start: Instant,
    sent: u64,
}

impl Pacer {
    fn new(rate: Option<u64>) -> Pacer {
        Pacer {
            rate: rate.filter(|&r| r > 0),
            start: Instant::now(),
            sent: 0,
        }
    }

    /// Whether `bytes` more may go now.
    fn allow(&self, bytes: usize) -> bool {
        self.rate.is_none_or(|rate| {
            let due = Duration::from_secs_f64((self.sent + bytes as u64) as f64 / rate as f64);
            due <= self.start.elapsed()
        })
    }

    fn spent(&mut self, bytes: usize) {
        self.sent += bytes as u64;
    }
}
