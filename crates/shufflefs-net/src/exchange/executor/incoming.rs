//! The receiving half of a round: handing frames to writers in order, posting receives,
//! starting each stream's disk thread when its size list arrives, and giving slow peers up
//! (see `deadline`), then abandoning peers that went silent after settling.

use std::io;
use std::sync::mpsc::{TrySendError, sync_channel};
use std::time::{Duration, Instant};

use super::super::deadline::{Progress, estimate};
use super::super::frames::{idle_io_priority, write_stream};
use super::super::sizes::{self, ENTRY};
use super::super::{ExchangeError, ExchangeTracker, Sized, stream_len};
use super::{IN_FLIGHT, In, Out, QUEUED, RoundRun, Slot};
use crate::cache::{Adopted, SampleStore};
use crate::comm::{Comm, Op, Ticket};
use crate::plan::{Rank, SampleId};

impl<'a, 's: 'env, 'scope, 'env> RoundRun<'a, 's, 'scope, 'env> {
    /// Hands arrived frames to writers in order and posts the next receives.
    pub(super) fn feed_in(
        &mut self,
        comm: &mut dyn Comm,
        ins: &mut [In],
    ) -> Result<(), ExchangeError> {
        let (data, ..) = self.ctx.tags();
        for (i, s) in ins.iter_mut().enumerate() {
            while let Some(tx) = &s.writer {
                let Some(buf) = s.pending.remove(&s.next_write) else {
                    break;
                };
                match tx.try_send(buf) {
                    Ok(()) => s.next_write += 1,
                    Err(TrySendError::Full(buf)) => {
                        s.pending.insert(s.next_write, buf);
                        break;
                    }
                    // The writer stopped (a disk failure, reported when it is joined).
                    Err(TrySendError::Disconnected(buf)) => {
                        self.recv_pool.put(buf);
                        s.writer = None;
                    }
                }
            }
            if s.writer.is_some() && s.next_write == s.frames {
                s.writer = None; // the writer ends once it has written what it got
            }
            if s.writer.is_none() {
                while let Some((_, buf)) = s.pending.pop_first() {
                    self.recv_pool.put(buf);
                }
            }
            // A given-up stream takes no more frames until its sender says how many come.
            if s.samples.is_none() || (s.given_up && s.end.is_none()) {
                continue;
            }
            while s.posted < IN_FLIGHT
                && s.pending.len() < QUEUED
                && s.arrived + s.posted < s.frames
            {
                let k = s.arrived + s.posted;
                let buf = self.recv_pool.get(self.frame_len(s.len, k));
                self.post(comm, Op::recv(s.peer, data, buf), Slot::FrameIn(i, k))?;
                s.posted += 1;
            }
        }
        Ok(())
    }

    /// A peer's size list arrived: the stream's length is known; start storing it.
    pub(super) fn sizes_arrived(&mut self, s: &mut In<'s, 'scope>, list: &[u8]) {
        self.sizes_known(s, list);
        if let Some(n) = s.end.filter(|&n| n < s.frames) {
            (s.frames, s.cut) = (n, true); // nothing is posted for it yet
        }
    }

    fn sizes_known(&mut self, s: &mut In<'s, 'scope>, list: &[u8]) {
        let ctx = self.ctx;
        s.began = Some(Instant::now());
        let sizes::Decoded {
            sendable: samples,
            mut unsendable,
            mismatch,
        } = sizes::decode(ctx.store, s.ids, list);
        if let Some(at) = mismatch {
            self.disagrees(s, at);
            unsendable = s.ids.to_vec();
        }
        // Given up before it knew its sizes, the peer may send none: nothing failed.
        let quiet = s.given_up && !ctx.leaving && mismatch.is_none();
        if mismatch.is_none() && !quiet {
            self.warn_unsendable(s, &unsendable);
        }
        let failed = if quiet { 0 } else { unsendable.len() as u64 };
        ctx.tracker
            .update(ctx.target, |r| r.failed_samples += failed);
        if s.disk {
            s.frames = 0;
            s.took.get_or_insert(Duration::ZERO);
            if !s.given_up {
                let (store, tracker, target, peer) = (ctx.store, ctx.tracker, ctx.target, s.peer);
                let root = ctx.peers.caches[peer as usize].clone();
                let todo = samples.clone();
                s.worker = Some(self.scope.spawn(move || {
                    idle_io_priority();
                    take_stream(store, &todo, &root, tracker, (target, peer))
                }));
            }
            s.samples = Some(samples);
            return;
        }
        s.len = stream_len(&samples);
        s.frames = self.frames(s.len);
        let len = s.len;
        ctx.tracker
            .update(ctx.target, |r| r.bytes_to_receive += len);
        if samples.is_empty() || s.given_up {
            if !s.given_up {
                s.took = Some(Duration::ZERO);
            }
            s.settled = s.worker.is_none();
            s.samples = Some(samples);
            return;
        }
        let (tx, rx) = sync_channel::<Vec<u8>>(QUEUED);
        let (store, tracker, target, peer, pool) =
            (ctx.store, ctx.tracker, ctx.target, s.peer, self.recv_pool);
        let todo = samples.clone();
        s.worker = Some(self.scope.spawn(move || {
            idle_io_priority();
            write_stream(store, &todo, rx, pool, tracker, (target, peer))
        }));
        s.writer = Some(tx);
        s.samples = Some(samples);
    }

    /// `s`'s size list names other samples than this rank's plan (first at `(position,
    /// expected, sent)`): drained and dropped like a given-up peer's stream, every sample
    /// counted failed and fetched from the source.
    fn disagrees(&self, s: &mut In, (at, expected, sent): (usize, SampleId, u64)) {
        tracing::error!(
            from = s.peer,
            target_epoch = self.ctx.target,
            position = at,
            expected,
            sent,
            "a peer's plan disagrees with this rank's (another build, seed or dataset?): nothing of its stream is stored, its samples come from the source"
        );
        (s.given_up, s.writer) = (true, None);
    }

    /// Says which of `s`'s samples its peer cannot send (all at once when it sends none).
    fn warn_unsendable(&self, s: &In, unsendable: &[SampleId]) {
        if unsendable.len() == s.ids.len() && unsendable.len() > 1 {
            if !self.ctx.leaving {
                tracing::warn!(
                    samples = unsendable.len(),
                    from = s.peer,
                    "peer sends none of its samples (it is leaving, or its cache failed); they will be fetched from the source"
                );
            }
            return;
        }
        for &id in unsendable {
            tracing::warn!(
                sample = id,
                from = s.peer,
                "peer could not read this sample; it will be fetched from the source"
            );
        }
    }

    pub(super) fn frame_arrived(&mut self, s: &mut In, k: usize, buf: Vec<u8>) {
        let ctx = self.ctx;
        (s.arrived, s.posted) = (s.arrived + 1, s.posted - 1);
        let (n, peer, within) = (buf.len() as u64, s.peer, ctx.same_host(s.peer));
        ctx.tracker.update(ctx.target, |r| {
            r.bytes_received += n;
            r.peer(peer).bytes_received += n;
            if within {
                r.bytes_within_hosts += n;
            } else {
                r.bytes_across_hosts += n;
            }
        });
        if s.writer.is_some() {
            s.pending.insert(k, buf);
        } else {
            // Given up, or the writer failed: late bytes are dropped.
            self.recv_pool.put(buf);
        }
        if s.arrived == s.frames && !s.given_up && !s.cut {
            s.took = s.began.map(|b| b.elapsed());
            let secs = self.started.elapsed().as_secs_f64();
            ctx.tracker
                .update(ctx.target, |r| r.peer(peer).seconds = secs);
        }
    }

    /// Joins the disk threads that are done.
    pub(super) fn reap(&mut self, ins: &mut [In]) {
        for s in ins.iter_mut() {
            if s.worker.as_ref().is_some_and(|w| w.is_finished()) {
                let w = s.worker.take().expect("worker");
                let result = w
                    .join()
                    .unwrap_or_else(|_| Err(ExchangeError::Local("a disk thread panicked".into())));
                match result {
                    // A stream cut short ends its writer inside a sample (dropped).
                    Err(e) if !s.given_up && !s.cut => self.fail_locally(e),
                    _ => {}
                }
                s.writer = None;
                s.settled = true;
            }
        }
    }

    /// Gives up the incoming streams the slow-peer rule finds overdue.
    pub(super) fn give_up_overdue(&mut self, ins: &mut [In]) {
        let ctx = self.ctx;
        let known: Vec<(u64, usize)> = (ins.iter().filter(|s| !s.disk))
            .filter_map(|s| s.samples.as_ref().map(|v| (s.len, v.len())))
            .collect();
        let progress: Vec<Progress> = (ins.iter())
            .map(|s| Progress {
                bytes: match (&s.samples, s.disk) {
                    (_, true) => (s.ids.len() * ENTRY) as u64,
                    (Some(_), false) => s.len,
                    (None, false) => estimate(s.ids.len(), &known),
                },
                done: (s.arrived as u64 * self.frame as u64).min(s.len),
                elapsed: s.began.unwrap_or(self.started).elapsed(),
                took: s.took.or(s.given_up.then_some(Duration::ZERO)),
                rated: !s.disk,
            })
            .collect();
        let overdue = ctx.cfg.slow_peers.overdue(&progress);
        for (s, late) in ins.iter_mut().zip(overdue) {
            if late && !s.settled && !s.given_up {
                self.give_up(s);
            }
        }
    }

    pub(super) fn give_up(&mut self, s: &mut In) {
        let ctx = self.ctx;
        s.given_up = true;
        s.writer = None; // its writer stops at the sample it is in; that one is dropped
        while let Some((_, buf)) = s.pending.pop_first() {
            self.recv_pool.put(buf);
        }
        if s.worker.is_none() {
            s.settled = true;
        }
        let peer = s.peer;
        tracing::warn!(
            rank = peer,
            target_epoch = ctx.target,
            seconds = format!("{:.1}", self.started.elapsed().as_secs_f64()),
            "peer is far slower than the others: what it has not delivered comes from the source, its late bytes are dropped"
        );
        ctx.tracker
            .update(ctx.target, |r| r.peer(peer).given_up = true);
    }

    /// After settling: ends the streams of peers that completed no message for the idle
    /// limit (see `SlowPeers::idle`), detaching what is posted for them.
    pub(super) fn abandon_idle(&mut self, comm: &mut dyn Comm, outs: &mut [Out], ins: &mut [In]) {
        let limit = self.ctx.cfg.slow_peers.idle;
        let now = Instant::now();
        let busy = |peer: Rank, outs: &[Out], ins: &[In]| {
            (outs.iter()).any(|o| o.peer == peer && !(o.sent == o.frames && o.confirmed.is_some()))
                || ins.iter().any(|s| s.peer == peer && !s.drained())
        };
        let stalled: Vec<Rank> = (self.last_heard.iter())
            .filter(|&(&peer, &at)| now.duration_since(at) > limit && busy(peer, outs, ins))
            .map(|(&peer, _)| peer)
            .collect();
        for peer in stalled {
            tracing::warn!(
                rank = peer,
                target_epoch = self.ctx.target,
                "peer sent nothing for {limit:?}; its streams are abandoned"
            );
            let tickets: Vec<Ticket> = (self.tickets.iter())
                .filter(|(_, slot)| match **slot {
                    Slot::SizesIn(i) | Slot::FrameIn(i, _) | Slot::EndIn(i) => ins[i].peer == peer,
                    Slot::FrameOut(i) | Slot::ConfirmIn(i) => outs[i].peer == peer,
                    Slot::SizesOut(p) | Slot::ConfirmOut(p) | Slot::EndOut(p) => p == peer,
                })
                .map(|(&t, _)| t)
                .collect();
            comm.detach(&tickets);
            for t in tickets {
                self.tickets.remove(&t);
            }
            for o in outs.iter_mut().filter(|o| o.peer == peer) {
                (o.sent, o.posted, o.reader, o.ended) = (o.frames, 0, None, true);
                o.listed = true;
                o.confirmed.get_or_insert(false);
            }
            for s in ins.iter_mut().filter(|s| s.peer == peer) {
                s.samples.get_or_insert_with(Vec::new);
                (s.arrived, s.posted) = (s.frames, 0);
                s.end.get_or_insert(s.frames);
            }
            self.last_heard.remove(&peer);
        }
    }
}

/// Takes the samples of a stream from a peer's cache folder on this host. A sample the peer
/// does not hold intact (missing, unrecorded, failing its checksum) is left missing: the
/// caller fetches it from the source. Any other error is this rank's storage failing (a full
/// disk, say): it ends the stream as a local failure, like a writer's.
fn take_stream(
    store: &SampleStore,
    samples: &[Sized],
    root: &std::path::Path,
    tracker: &ExchangeTracker,
    (target, peer): (u64, Rank),
) -> Result<(), ExchangeError> {
    for &(id, _) in samples {
        match store.adopt_from_peer(id, root) {
            Ok(Adopted::AlreadyHeld(_)) => {}
            Ok(adopted) => {
                let n = adopted.bytes();
                tracker.update(target, |r| {
                    r.samples_received += 1;
                    r.bytes_received += n;
                    r.bytes_within_hosts += n;
                    let p = r.peer(peer);
                    p.samples_received += 1;
                    p.bytes_received += n;
                });
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::InvalidData
                ) =>
            {
                tracing::warn!(sample = id, from = peer, error = %e, "cannot take a sample from a peer's cache on this host; it will be fetched from the source");
                tracker.update(target, |r| r.failed_samples += 1);
            }
            // A partial cache without room for it: read from the source when needed.
            Err(e) if crate::cache::admission::is_not_kept(&e) => {
                tracker.update(target, |r| r.not_kept_samples += 1);
            }
            Err(source) => return Err(ExchangeError::Store { sample: id, source }),
        }
    }
    Ok(())
}
