//! Runs any [`Schedule`]: the wire protocol of the exchange.
//!
//! # Protocol
//! Every rank derives its part of the same schedule from the plan, so nothing is negotiated:
//! no any-source receive, no per-sample message. Each stream of the schedule (one peer, its
//! samples in stream order) carries the bytes of its samples back to back, and its length is
//! known to both sides before it starts (the sender sends the sizes first). The stream is cut
//! into frames of `frame` bytes (the last one shorter): many small samples share a frame, and
//! a sample larger than 2 GiB simply spans many frames.
//!
//! A round's streams move together: frame `i` of every stream of the round is in one
//! [`Comm::transfer`], so several peers are in flight at once and, as every rank posts its
//! receives before its sends, no cycle of blocking sends can form. For each outgoing stream a
//! reader thread fills frames from the cache (or the source, for samples not staged yet); for
//! each incoming stream a writer thread turns frames into cache files (temp name, then
//! rename), so disk and network overlap.
//!
//! Each sample in the stream is followed by the CRC-32C its sender recorded when the sample
//! entered its cache (so `stream_len` is the sizes plus 4 bytes per sample). The sender
//! checks its own copy as it reads it (a corrupt copy is dropped and refetched from the
//! source later); the receiver checks the bytes before renaming them into its cache, so a
//! sample damaged on either side never enters a view.
//!
//! Before any data, each sender tells each receiver the sizes of what it sends (see
//! `sizes`). Every wait is a point-to-point transfer, never a collective, so a shutdown can
//! interrupt an exchange whose peer went away.
//!
//! After the data of a round, each side sends, per stream, the ids it could not read (a
//! count, then the ids; a bad sample is reported, not fatal); the receiver drops those, and
//! they are fetched from the source if read later. Received bytes land only under
//! `samples/<id>`: peers never send names, so nothing a peer says can make us write outside
//! the cache folder.
//!
//! Durability: after the last round every rank `syncfs`es its cache once (not once per round:
//! on a node shared by several ranks each `syncfs` writes back everybody's dirty pages), then
//! tells each rank it received from that it holds the samples durably (`confirm`, one byte
//! per stream, in the schedule's rounds). `run` returns only after hearing that from each of
//! its receivers, and a rank drops the samples it sent only after `run` returned, so a sample
//! leaves its sender only once its receiver holds it durably. A rank whose disk failed still
//! takes part in every round (sending zeros, draining what arrives) and in the confirmation,
//! so a local failure never leaves a peer waiting.

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::{self, ScopedJoinHandle};
use std::time::{Duration, Instant};

use super::frames::{Pool, idle_io_priority, read_stream, write_stream};
use super::schedule::Schedule;
use super::sizes::{SizedRound, settle};
use super::{
    DEPTH, ExchangeConfig, ExchangeError, ExchangeState, ExchangeTracker, Phase, decode_ids,
    encode_ids, stream_len,
};
use crate::cache::SampleStore;
use crate::comm::{Batch, Comm, CommError};
use crate::plan::{Rank, SampleId};

/// What every phase needs besides the transport.
pub(super) struct Ctx<'a> {
    pub store: &'a SampleStore,
    pub tracker: &'a ExchangeTracker,
    pub target: u64,
    pub tag: u16,
    pub frame: usize,
    pub abort: &'a AtomicBool,
}

impl Ctx<'_> {
    pub fn comm_error(&self, phase: Phase, peers: Vec<Rank>, source: CommError) -> ExchangeError {
        ExchangeError::Comm {
            phase,
            target_epoch: self.target,
            peers,
            source,
        }
    }
}

/// Runs `schedule` into epoch `target`, recording progress in `tracker`.
pub(super) fn execute(
    comm: &mut dyn Comm,
    store: &SampleStore,
    schedule: &Schedule,
    target: u64,
    cfg: ExchangeConfig,
    tracker: &ExchangeTracker,
    abort: &AtomicBool,
) -> Result<(), ExchangeError> {
    let ctx = Ctx {
        store,
        tracker,
        target,
        tag: (target & 0x7FFF) as u16,
        frame: cfg.frame,
        abort,
    };
    let started = Instant::now();
    let result = settle(comm, &ctx, schedule).and_then(|rounds| {
        let (sends, recvs) = (
            rounds.iter().flat_map(|r| &r.sends),
            rounds.iter().flat_map(|r| &r.recvs),
        );
        tracker.update(target, |r| {
            r.state = ExchangeState::Running;
            r.samples_to_send = sends.clone().map(|s| s.samples.len() as u64).sum();
            r.samples_to_receive = recvs.clone().map(|s| s.samples.len() as u64).sum();
            // Bytes on the wire: samples plus their checksums.
            r.bytes_to_send = sends.map(|s| stream_len(&s.samples)).sum();
            r.bytes_to_receive = recvs.map(|s| stream_len(&s.samples)).sum();
        });
        exchange_data(comm, &ctx, &rounds, cfg.rate)
    });
    let seconds = started.elapsed().as_secs_f64();
    tracker.update(target, |r| {
        r.seconds = seconds;
        r.state = match result {
            Ok(()) => ExchangeState::Done,
            Err(_) => ExchangeState::Failed,
        };
        r.error = result.as_ref().err().map(ToString::to_string);
    });
    if let Some(r) = tracker
        .snapshot()
        .into_iter()
        .find(|r| r.target_epoch == target)
    {
        tracing::info!(
            target_epoch = target,
            state = r.state.as_str(),
            samples_sent = r.samples_sent,
            samples_received = r.samples_received,
            bytes_sent = r.bytes_sent,
            bytes_received = r.bytes_received,
            failed = r.failed_samples,
            seconds = format!("{seconds:.3}"),
            "exchange finished"
        );
    }
    result
}

/// The rounds, then durability and confirmation. A local failure (this rank's disk) is
/// reported at the end: the rounds and the confirmation still run so peers are served.
fn exchange_data(
    comm: &mut dyn Comm,
    ctx: &Ctx,
    rounds: &[SizedRound],
    rate: Option<u64>,
) -> Result<(), ExchangeError> {
    let mut pacer = Pacer::new(rate);
    let mut result = Ok(());
    for round in rounds {
        // A transport failure ends it all: no later message can be trusted to arrive.
        if let Some(local) = run_round(comm, ctx, round, &mut pacer)?
            && result.is_ok()
        {
            result = Err(local);
        }
    }
    // Even after a local failure: what was stored must be durable before senders drop it.
    if let Err(e) = ctx.store.sync()
        && result.is_ok()
    {
        result = Err(ExchangeError::Sync(e));
    }
    let failed = confirm(comm, ctx, rounds, result.is_ok())?;
    for rank in failed {
        tracing::warn!(
            rank,
            target_epoch = ctx.target,
            "a peer could not store what it received; it fetches those samples from the source"
        );
    }
    result
}

/// One round: every outgoing stream out, every incoming stream in, then the trailers. `Err`
/// if the transport failed; `Ok(Some(_))` if this rank failed locally but completed the round.
fn run_round(
    comm: &mut dyn Comm,
    ctx: &Ctx,
    round: &SizedRound,
    pacer: &mut Pacer,
) -> Result<Option<ExchangeError>, ExchangeError> {
    let frame = ctx.frame;
    let frames = |len: u64| len.div_ceil(frame as u64) as usize;
    let frame_len = |len: u64, i: usize| (len - (i * frame) as u64).min(frame as u64) as usize;
    let out_lens: Vec<u64> = round.sends.iter().map(|s| stream_len(&s.samples)).collect();
    let in_lens: Vec<u64> = round.recvs.iter().map(|s| stream_len(&s.samples)).collect();
    let n = out_lens
        .iter()
        .chain(&in_lens)
        .map(|&l| frames(l))
        .max()
        .unwrap_or(0);
    let send_pool = Pool::new(frame, round.sends.len());
    let recv_pool = Pool::new(frame, round.recvs.len());
    let (send_pool, recv_pool) = (&send_pool, &recv_pool);
    let (store, tracker, target) = (ctx.store, ctx.tracker, ctx.target);
    thread::scope(|scope| {
        type Reader<'s> = ScopedJoinHandle<'s, Result<Vec<SampleId>, String>>;
        let mut readers: Vec<(Receiver<Vec<u8>>, Reader)> = Vec::new();
        for s in &round.sends {
            let (tx, rx) = sync_channel::<Vec<u8>>(DEPTH);
            let reader = scope.spawn(move || {
                idle_io_priority();
                read_stream(store, &s.samples, send_pool, tx, tracker, target)
            });
            readers.push((rx, reader));
        }
        type Writer<'s> = ScopedJoinHandle<'s, Result<(), ExchangeError>>;
        let mut writers: Vec<(Option<SyncSender<Vec<u8>>>, Writer)> = Vec::new();
        for s in &round.recvs {
            let (tx, rx) = sync_channel::<Vec<u8>>(DEPTH);
            let writer = scope.spawn(move || {
                idle_io_priority();
                write_stream(store, &s.samples, rx, recv_pool, tracker, target)
            });
            writers.push((Some(tx), writer));
        }
        // Never leave a peer waiting mid-stream: a local failure still sends zeros and
        // drains what arrives, and is reported once the stream is complete.
        let mut local_error: Option<ExchangeError> = None;
        for i in 0..n {
            let mut batch = Batch::default();
            for ((rx, _), (s, &len)) in readers.iter().zip(round.sends.iter().zip(&out_lens)) {
                if i < frames(len) {
                    let buf = rx.recv().unwrap_or_else(|_| {
                        local_error.get_or_insert_with(|| {
                            ExchangeError::Local("reading samples to send failed".into())
                        });
                        vec![0u8; frame_len(len, i)]
                    });
                    batch.sends.push((s.peer, buf));
                }
            }
            let mut incoming = Vec::new();
            for (k, (s, &len)) in round.recvs.iter().zip(&in_lens).enumerate() {
                if i < frames(len) {
                    batch.recvs.push((s.peer, recv_pool.get(frame_len(len, i))));
                    incoming.push(k);
                }
            }
            let done = comm
                .transfer(ctx.tag, batch, ctx.abort)
                .map_err(|e| ctx.comm_error(Phase::Samples, round.peers(), e))?;
            let sent: usize = done.sends.iter().map(|(_, b)| b.len()).sum();
            let received: usize = done.recvs.iter().map(|(_, b)| b.len()).sum();
            tracker.update(target, |r| {
                r.bytes_sent += sent as u64;
                r.bytes_received += received as u64;
            });
            pacer.pace(sent);
            for (k, (_, buf)) in incoming.into_iter().zip(done.recvs) {
                let tx = &mut writers[k].0;
                if tx.as_ref().is_some_and(|tx| tx.send(buf).is_err()) {
                    *tx = None;
                }
            }
            done.sends.into_iter().for_each(|(_, b)| send_pool.put(b));
        }
        let (rxs, readers): (Vec<_>, Vec<_>) = readers.into_iter().unzip();
        let (txs, writers): (Vec<_>, Vec<_>) = writers.into_iter().unzip();
        drop((rxs, txs));
        let unreadable: Vec<Vec<SampleId>> = readers
            .into_iter()
            .zip(&round.sends)
            .map(|(reader, s)| {
                let mut ids = reader.join().ok().and_then(Result::ok).unwrap_or_default();
                ids.extend_from_slice(&s.unsendable);
                ids
            })
            .collect();
        for writer in writers {
            let written = writer
                .join()
                .unwrap_or_else(|_| Err(ExchangeError::Local("writer panicked".into())));
            // The first writer's error names the sample: prefer it to a reader's.
            if let Err(e) = written
                && !matches!(local_error, Some(ExchangeError::Store { .. }))
            {
                local_error = Some(e);
            }
        }
        trailer(comm, ctx, round, &unreadable)?;
        Ok(local_error)
    })
}

/// Which samples each sender could not read: per stream a count, then the ids.
fn trailer(
    comm: &mut dyn Comm,
    ctx: &Ctx,
    round: &SizedRound,
    unreadable: &[Vec<SampleId>],
) -> Result<(), ExchangeError> {
    let fail = |e| ctx.comm_error(Phase::Trailer, round.peers(), e);
    let peers = round.sends.iter().map(|s| s.peer);
    let counts = Batch {
        sends: (peers.clone().zip(unreadable))
            .map(|(p, ids)| (p, (ids.len() as u64).to_le_bytes().to_vec()))
            .collect(),
        recvs: round.recvs.iter().map(|s| (s.peer, vec![0u8; 8])).collect(),
    };
    let counts = comm.transfer(ctx.tag, counts, ctx.abort).map_err(fail)?;
    let ids = Batch {
        sends: peers
            .zip(unreadable)
            .map(|(p, ids)| (p, encode_ids(ids)))
            .collect(),
        recvs: (counts.recvs.into_iter())
            .map(|(p, n)| {
                let n = u64::from_le_bytes(n[..].try_into().expect("8 bytes"));
                (p, vec![0u8; n as usize * 4])
            })
            .collect(),
    };
    let theirs = comm.transfer(ctx.tag, ids, ctx.abort).map_err(fail)?;
    for (from, bytes) in theirs.recvs {
        for id in decode_ids(&bytes) {
            tracing::warn!(
                sample = id,
                from,
                "peer could not read this sample; it will be fetched from the source"
            );
            let _ = ctx.store.remove(id);
            ctx.tracker.update(ctx.target, |r| r.failed_samples += 1);
        }
    }
    Ok(())
}

/// Tells each rank this one received from whether what it sent is stored durably (`ok`),
/// and hears the same from each rank this one sent to, one transfer per round; returns the
/// receivers that failed.
fn confirm(
    comm: &mut dyn Comm,
    ctx: &Ctx,
    rounds: &[SizedRound],
    ok: bool,
) -> Result<Vec<Rank>, ExchangeError> {
    let mut failed = Vec::new();
    for round in rounds {
        let batch = Batch {
            sends: round
                .recvs
                .iter()
                .map(|s| (s.peer, vec![u8::from(ok)]))
                .collect(),
            recvs: round.sends.iter().map(|s| (s.peer, vec![0u8])).collect(),
        };
        let peers = batch
            .sends
            .iter()
            .chain(&batch.recvs)
            .map(|(p, _)| *p)
            .collect();
        let theirs = comm
            .transfer(ctx.tag, batch, ctx.abort)
            .map_err(|e| ctx.comm_error(Phase::Confirm, peers, e))?;
        failed.extend(
            theirs
                .recvs
                .iter()
                .filter(|(_, b)| b[0] != 1)
                .map(|(p, _)| *p),
        );
    }
    Ok(failed)
}

/// Keeps the average send rate under a cap by sleeping between frames.
struct Pacer {
    rate: Option<u64>,
    start: Instant,
    sent: u64,
}

impl Pacer {
    fn new(rate: Option<u64>) -> Pacer {
        Pacer {
            rate,
            start: Instant::now(),
            sent: 0,
        }
    }

    fn pace(&mut self, bytes: usize) {
        let Some(rate) = self.rate.filter(|&r| r > 0) else {
            return;
        };
        self.sent += bytes as u64;
        let due = Duration::from_secs_f64(self.sent as f64 / rate as f64);
        if let Some(wait) = due.checked_sub(self.start.elapsed()) {
            thread::sleep(wait);
        }
    }
}
