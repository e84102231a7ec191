//! Ending a stream before its last frame, and a rank leaving the exchanges it is far too
//! slow for (see the executor's docs, "Stopping a stream").
//!
//! Every stream that crosses the transport ends with one message from its sender: how many
//! frames it posted. Normally that is all of them, posted right after the last frame. A
//! sender posts it early, and no frame after those already posted, when
//! - its receiver gave it up (the confirmation says so): the late bytes would only be
//!   dropped, and would hold the receiver's next exchange while they drain;
//! - it settled itself and the stream is far behind its other outgoing streams (the
//!   slow-peer rule of `deadline` applied to what it sends): the receiver fetches the rest
//!   from the source instead of holding this rank's next exchange.
//!
//! The receiver takes the frames up to that count and withdraws the receives it posted for
//! later ones; a sample cut in two is dropped, never half-stored. A rank that gave a
//! stream up posts no more receives for it until its end arrives, so a given-up sender's
//! frames past those the receiver posted never go out at all.
//!
//! A rank whose every receiver across hosts gave it up in one exchange is the slow one: the
//! ends of those streams say it leaves, and from the next exchange on it and those peers
//! leave each other out (`peers::Left`), each fetching from the source what the other
//! would have sent. So a persistently slow host holds the others for one exchange, not
//! every epoch, and catches up from the source at its own pace. It stays out for the rest
//! of the job.
//!
//! Both sides of every pair must agree, or one of them waits for streams the other never
//! opens (a minute each, until `abandon_idle`). So the decision is taken once per exchange
//! and every end says the same: it is "leave" when every rated receiver's confirmation
//! asked to stop, "stay" as soon as one receiver confirmed without asking, or this rank
//! stopped a stream itself, or a peer was abandoned. Until then no end goes out, except
//! the end of a stream this rank stopped itself (its receiver needs the count to finish,
//! and that stop already decided "stay"). Waiting for the confirmations costs one message's
//! time per stream; ending a stream before its receiver's confirmation once let a receiver
//! that gave the stream up late hear "stay" while the others heard "leave".

use super::super::ExchangeError;
use super::super::deadline::Progress;
use super::{END, In, Out, RoundRun, Slot};
use crate::comm::{Comm, Op, Ticket};
use crate::plan::Rank;

/// Sends no frame of `o` after those already posted.
pub(super) fn stop_sending(o: &mut Out) {
    if o.disk || o.stopped || o.sent + o.posted == o.frames {
        return;
    }
    o.stopped = true;
    o.frames = o.sent + o.posted;
    o.reader = None; // its thread stops at the next frame it hands over
}

impl<'a, 's: 'env, 'scope, 'env> RoundRun<'a, 's, 'scope, 'env> {
    /// Posts the end of `o` once every frame it will send is posted and, unless this rank
    /// stopped it, once `withdraw` (this rank's decision to leave) is taken.
    pub(super) fn end_if_posted(
        &mut self,
        comm: &mut dyn Comm,
        o: &mut Out,
        withdraw: Option<bool>,
    ) -> Result<(), ExchangeError> {
        if o.disk || o.ended || !o.listed || o.sent + o.posted < o.frames {
            return Ok(());
        }
        let leaves = match (o.stopped && !o.stop_asked, withdraw) {
            // Stopped by this rank (`stop_overdue`, which decided "stay").
            (true, _) => false,
            (false, None) => return Ok(()),
            (false, Some(leaves)) => leaves && o.stop_asked,
        };
        if leaves {
            self.withdraw_from(o.peer);
        }
        let (.., end) = self.ctx.tags();
        let mut msg = (o.frames as u64).to_le_bytes().to_vec();
        msg.push(u8::from(leaves));
        self.post(comm, Op::send(o.peer, end, msg), Slot::EndOut(o.peer))?;
        o.ended = true;
        Ok(())
    }

    /// The end of incoming stream `i` arrived: its sender posts that many frames.
    pub(super) fn end_arrived(&mut self, comm: &mut dyn Comm, s: &mut In, i: usize, buf: &[u8]) {
        let count = buf.get(..8).and_then(|b| b.try_into().ok());
        let n = count.map_or(0, u64::from_le_bytes) as usize;
        s.end = Some(n);
        if buf.get(END - 1) == Some(&1) {
            let ctx = self.ctx;
            ctx.peers.left.mark_slow(s.peer, ctx.target);
            tracing::warn!(
                rank = s.peer,
                target_epoch = ctx.target,
                "peer is far slower than the others: later exchanges leave it out and fetch its samples from the source"
            );
        }
        if s.samples.is_some() {
            self.cut(comm, s, i, n);
        }
    }

    /// Takes only the first `n` frames of incoming stream `i` (known to be its length
    /// once its size list and its end arrived), withdrawing the receives posted for later
    /// ones.
    pub(super) fn cut(&mut self, comm: &mut dyn Comm, s: &mut In, i: usize, n: usize) {
        if n >= s.frames {
            return;
        }
        s.frames = n;
        s.cut = true;
        let later: Vec<Ticket> = (self.tickets.iter())
            .filter(|&(_, slot)| matches!(*slot, Slot::FrameIn(j, k) if j == i && k >= n))
            .map(|(&t, _)| t)
            .collect();
        comm.cancel(&later);
        self.recv_pool.forget(later.len());
        for t in &later {
            self.tickets.remove(t);
        }
        s.posted -= later.len();
        tracing::info!(
            rank = s.peer,
            target_epoch = self.ctx.target,
            frames = n,
            "peer stopped its stream early: what it did not send comes from the source"
        );
    }

    /// After settling: stops the outgoing streams the slow-peer rule finds far behind the
    /// others.
    pub(super) fn stop_overdue(&mut self, outs: &mut [Out]) {
        let frame = self.frame as u64;
        let elapsed = self.started.elapsed();
        let progress: Vec<Progress> = (outs.iter())
            .map(|o| Progress {
                bytes: if o.disk || o.stopped { 0 } else { o.len },
                done: (o.sent as u64 * frame).min(o.len),
                elapsed,
                took: o.took,
                rated: !o.disk,
            })
            .collect();
        let overdue = self.ctx.cfg.slow_peers.overdue(&progress);
        for (o, late) in outs.iter_mut().zip(overdue) {
            if late && !o.stopped && o.sent + o.posted < o.frames {
                tracing::warn!(
                    rank = o.peer,
                    target_epoch = self.ctx.target,
                    seconds = format!("{:.1}", elapsed.as_secs_f64()),
                    "peer receives far slower than the others: this rank stops sending to it, it fetches the rest from the source"
                );
                // A rank some receiver keeps up with is not the slow one: it stays.
                self.leaves.get_or_insert(false);
                stop_sending(o);
            }
        }
    }

    /// Whether this rank leaves the exchanges after this one (see the module docs): taken
    /// once, when every rated receiver's confirmation asked to stop ("leave") or one did not
    /// ("stay"); `None` while confirmations that could still decide it are awaited.
    pub(super) fn withdrawal(&mut self, outs: &[Out]) -> Option<bool> {
        if self.leaves.is_none() {
            self.leaves = self.decide(outs);
        }
        self.leaves
    }

    fn decide(&self, outs: &[Out]) -> Option<bool> {
        if self.ctx.leaving || self.ctx.cfg.slow_peers.factor <= 0.0 {
            return Some(false);
        }
        let rated = || (outs.iter()).filter(|o| !o.disk && (o.len > 0 || o.skipped || !o.listed));
        if rated().next().is_none() || rated().any(|o| o.confirmed.is_some() && !o.stop_asked) {
            return Some(false);
        }
        rated().all(|o| o.stop_asked).then_some(true)
    }

    /// This rank leaves the exchanges with `peer` after this one; the end of its stream to
    /// it says so.
    fn withdraw_from(&self, peer: Rank) {
        let ctx = self.ctx;
        ctx.peers.left.mark_slow(peer, ctx.target);
        tracing::warn!(
            rank = peer,
            target_epoch = ctx.target,
            "every peer found this rank far slower than the others: later exchanges leave it out, it fetches its share from the source"
        );
    }
}
