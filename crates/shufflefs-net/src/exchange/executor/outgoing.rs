//! The sending half of a round: resolving and sending each stream's size list (fetching
//! sizes not known yet beside the round), posting frames as readers fill them, counting what
//! went out, and hearing each receiver's confirmation (which may ask to stop, see `stop`).

use std::sync::mpsc::{Receiver, TryRecvError, sync_channel};

use super::super::frames::{idle_io_priority, read_stream};
use super::super::sizes;
use super::super::{ExchangeError, Sized, stream_len};
use super::{IN_FLIGHT, LEFT, Out, QUEUED, RoundRun, Slot, stop_sending};
use crate::comm::{Comm, Op};
use crate::dataset::manifest::UNKNOWN_SIZE;
use crate::plan::SampleId;

impl<'a, 's: 'env, 'scope, 'env> RoundRun<'a, 's, 'scope, 'env> {
    /// Counts a frame the transport finished sending and returns its buffer to the pool.
    pub(super) fn frame_sent(&mut self, o: &mut Out, buf: Vec<u8>) {
        let ctx = self.ctx;
        (o.sent, o.posted) = (o.sent + 1, o.posted - 1);
        if o.sent == o.frames && !o.stopped {
            o.took = Some(self.started.elapsed());
        }
        let (n, peer) = (buf.len() as u64, o.peer);
        ctx.tracker.update(ctx.target, |r| {
            r.bytes_sent += n;
            r.peer(peer).bytes_sent += n;
        });
        self.send_pool.put(buf);
    }

    /// Records a receiver's confirmation of an outgoing stream.
    pub(super) fn confirmed(&self, o: &mut Out, buf: &[u8]) {
        let ctx = self.ctx;
        let ok = buf.first() == Some(&1);
        o.confirmed = Some(ok);
        if buf.get(1) == Some(&1) {
            o.stop_asked = true;
            stop_sending(o);
        }
        if buf.first() == Some(&LEFT) {
            ctx.peers.left.mark(o.peer, ctx.target);
            tracing::info!(
                rank = o.peer,
                target_epoch = ctx.target,
                "peer left the job: later exchanges leave it out and fetch its samples from the source"
            );
        } else if !ok {
            tracing::warn!(
                rank = o.peer,
                target_epoch = ctx.target,
                "a peer could not store what it received; it fetches those samples from the source"
            );
        }
    }

    /// Resolves the sizes of everything this rank sends and sends each peer its size list.
    /// Sizes not known yet (samples not staged), and the samples of disk hand-offs not
    /// staged yet (the receiver takes their files), are fetched on threads of their own
    /// (`sizing`), so the round goes on meanwhile: on a slow link that takes long, and its
    /// peers may give it up and stop its streams before it is done (see `stop`).
    pub(super) fn start_sending(
        &mut self,
        comm: &mut dyn Comm,
        outs: &mut [Out<'s>],
    ) -> Result<(), ExchangeError> {
        let ctx = self.ctx;
        let all: Vec<SampleId> = outs.iter().flat_map(|o| o.ids.iter().copied()).collect();
        // A leaving rank sends nothing (`Ctx::leaving`).
        if ctx.leaving {
            return self.list(comm, outs, vec![UNKNOWN_SIZE; all.len()]);
        }
        // A disk hand-off's samples must be in this rank's cache (see `sizes`).
        let hold: Vec<bool> = (outs.iter())
            .flat_map(|o| std::iter::repeat_n(o.disk, o.ids.len()))
            .collect();
        if sizes::all_at_hand(ctx.store, &all, &hold) {
            return self.list(comm, outs, sizes::resolve_held(ctx.store, &all, &hold));
        }
        let store = ctx.store;
        self.sizing = Some((self.scope).spawn(move || sizes::resolve_held(store, &all, &hold)));
        Ok(())
    }

    /// Lists the streams whose sizes are now known: all of them once `sizing` is done, and
    /// at once, as sending nothing, those their receiver gave up before.
    pub(super) fn list_resolved(
        &mut self,
        comm: &mut dyn Comm,
        outs: &mut [Out<'s>],
    ) -> Result<(), ExchangeError> {
        for o in outs.iter_mut().filter(|o| o.stop_asked && !o.listed) {
            o.skipped = true;
            self.list_one(comm, o, vec![UNKNOWN_SIZE; o.ids.len()])?;
        }
        if !self.sizing.as_ref().is_some_and(|h| h.is_finished()) {
            return Ok(());
        }
        let n = outs.iter().map(|o| o.ids.len()).sum();
        let sizing = self.sizing.take().expect("sizing");
        let known = sizing.join().unwrap_or_else(|_| vec![UNKNOWN_SIZE; n]);
        self.list(comm, outs, known)
    }

    /// Lists every stream not listed yet, with `known` the sizes of all streams' samples.
    fn list(
        &mut self,
        comm: &mut dyn Comm,
        outs: &mut [Out<'s>],
        known: Vec<u64>,
    ) -> Result<(), ExchangeError> {
        let mut known = known.into_iter();
        for o in outs.iter_mut() {
            let sizes: Vec<u64> = known.by_ref().take(o.ids.len()).collect();
            if !o.listed {
                self.list_one(comm, o, sizes)?;
            }
        }
        Ok(())
    }

    /// Sends `o`'s size list and starts a reader if it moves bytes.
    fn list_one(
        &mut self,
        comm: &mut dyn Comm,
        o: &mut Out<'s>,
        sizes: Vec<u64>,
    ) -> Result<(), ExchangeError> {
        let ctx = self.ctx;
        let (data, ..) = ctx.tags();
        o.listed = true;
        let list = sizes::encode(ctx.store, o.ids, &sizes);
        self.post(comm, Op::send(o.peer, data, list), Slot::SizesOut(o.peer))?;
        if o.disk {
            return Ok(());
        }
        let samples: Vec<Sized> = (o.ids.iter().copied().zip(sizes))
            .filter(|&(_, size)| size != UNKNOWN_SIZE)
            .collect();
        o.len = stream_len(&samples);
        o.frames = self.frames(o.len);
        let len = o.len;
        ctx.tracker.update(ctx.target, |r| r.bytes_to_send += len);
        if samples.is_empty() {
            return Ok(());
        }
        let (tx, rx) = sync_channel::<Vec<u8>>(QUEUED);
        let (store, tracker, target, pool) = (ctx.store, ctx.tracker, ctx.target, self.send_pool);
        self.scope.spawn(move || {
            idle_io_priority();
            read_stream(store, &samples, pool, tx, tracker, target)
        });
        o.reader = Some(rx);
        Ok(())
    }

    /// Posts the frames of outgoing streams that their readers have ready.
    pub(super) fn feed_out(
        &mut self,
        comm: &mut dyn Comm,
        outs: &mut [Out],
    ) -> Result<(), ExchangeError> {
        let (data, ..) = self.ctx.tags();
        let withdraw = self.withdrawal(outs);
        for (i, o) in outs.iter_mut().enumerate() {
            while o.posted < IN_FLIGHT && o.sent + o.posted < o.frames {
                let k = o.sent + o.posted;
                let want = self.frame_len(o.len, k);
                if !self.pacer.allow(want) {
                    break;
                }
                let buf = match o.reader.as_ref().map(Receiver::try_recv) {
                    Some(Ok(buf)) => buf,
                    Some(Err(TryRecvError::Empty)) => break,
                    // The reader stopped early: zeros keep the stream's length, and their
                    // checksums cannot match, so the receiver drops them.
                    Some(Err(TryRecvError::Disconnected)) | None => {
                        if o.reader.take().is_some() {
                            self.fail_locally(ExchangeError::Local(
                                "reading samples to send failed".into(),
                            ));
                        }
                        let mut zeros = self.send_pool.get(want);
                        zeros.fill(0);
                        zeros
                    }
                };
                self.pacer.spent(buf.len());
                self.post(comm, Op::send(o.peer, data, buf), Slot::FrameOut(i))?;
                o.posted += 1;
            }
            self.end_if_posted(comm, o, withdraw)?;
        }
        Ok(())
    }
}
