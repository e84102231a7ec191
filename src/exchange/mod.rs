//! The background exchange of partial-local shuffling: move the samples the plan assigns
//! to other ranks for the next epoch, as raw bytes, while training reads the current one.
//!
//! # Protocol
//! Every rank derives the same transfer list from the plan, so nothing is negotiated: no
//! any-source receive, no per-sample message. For each ordered pair the bytes of the
//! samples it moves, in id order, form one stream whose length both sides know before it
//! starts (the sender sends the sizes first). The stream is cut into frames of `FRAME` bytes (the last one shorter): many
//! small samples share a frame, and a sample larger than 2 GiB simply spans many frames.
//!
//! Rounds `d = 1..M` pair every rank `r` with `r+d` (send) and `r-d` (receive), each frame
//! moved by one `sendrecv`, so all links are busy and no cycle of blocking sends can form.
//! A reader thread fills outgoing frames from the cache (or the source, for samples not
//! staged yet) and a writer thread turns incoming frames into cache files (temp name, then
//! rename), so disk and network overlap.
//!
//! Each sample in the stream is followed by the CRC-32C its sender recorded when the sample
//! entered its cache (so `stream_len` is the sizes plus 4 bytes per sample). The sender
//! checks its own copy as it reads it (a corrupt copy is dropped and refetched from the
//! source later); the receiver checks the bytes before renaming them into its cache, so a
//! sample damaged on either side never enters a view.
//!
//! Before any data, each sender tells each receiver the sizes of what it sends (see
//! `sizes`). Every wait is a `sendrecv`, never a collective, so a shutdown can interrupt
//! an exchange whose peer went away.
//!
//! Durability: after the last round every rank `syncfs`es its cache once (not once per round:
//! on a node shared by several ranks each `syncfs` writes back everybody's dirty pages), then
//! tells each rank it received from that it holds the samples durably (`confirm`). `run`
//! returns only after hearing that from each of its receivers, and a rank drops the samples
//! it sent only after `run` returned, so a sample leaves its sender only once its receiver
//! holds it durably. A rank whose disk failed still takes part in every round (draining what
//! arrives) and in the confirmation, so a local failure never leaves a peer waiting.
//!
//! After the data, each side sends the ids it could not read (a bad sample is reported, not
//! fatal); the receiver drops those, and they are fetched from the source if read later.
//! Received bytes land only under `samples/<id>`: peers never send names, so nothing a peer
//! says can make us write outside the cache folder.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::sync_channel;
use std::thread;
use std::time::{Duration, Instant};

use crate::cache::SampleStore;
use crate::comm::Comm;
use crate::dataset::manifest::UNKNOWN_SIZE;
use crate::plan::{Rank, SampleId, Step};

mod frames;
mod tracker;

use frames::{Pool, read_stream, write_stream};
pub use tracker::{ExchangeReport, ExchangeTracker};

/// Bytes per message: large enough to amortise per-message cost, small enough to pipeline.
pub const FRAME: usize = 8 << 20;
/// Frames buffered between the disk threads and the MPI thread, each way.
const DEPTH: usize = 4;

/// Settings of the exchange.
#[derive(Clone, Copy, Debug)]
pub struct ExchangeConfig {
    /// Cap on bytes sent per second by this rank; `None` is uncapped.
    pub rate: Option<u64>,
    pub frame: usize,
}

impl Default for ExchangeConfig {
    fn default() -> Self {
        ExchangeConfig {
            rate: None,
            frame: FRAME,
        }
    }
}

/// Runs this rank's part of the exchange into `step.next.epoch`. Must be called by every
/// rank for the same step, on the thread that owns `comm`.
pub fn run(
    comm: &mut dyn Comm,
    store: &SampleStore,
    step: &Step,
    cfg: ExchangeConfig,
    tracker: &ExchangeTracker,
    abort: &AtomicBool,
) -> Result<(), String> {
    let me = comm.rank();
    let world = comm.size();
    let target = step.next.epoch;
    let started = Instant::now();
    let tag = (target & 0x7FFF) as u16;
    let (sends, recvs, unsendable) = match sizes(comm, store, step, tag, abort) {
        Ok(lists) => lists,
        Err(e) => {
            let e = format!("exchanging sample sizes for epoch {target}: {e}");
            tracker.update(target, |r| {
                r.state = "failed";
                r.error = Some(e.clone());
            });
            return Err(e);
        }
    };
    // Bytes on the wire: samples plus their checksums.
    let bytes = |ids: &[Sized]| stream_len(ids);
    tracker.update(target, |r| {
        r.state = "running";
        r.samples_to_send = sends.values().map(|v| v.len() as u64).sum();
        r.samples_to_receive = recvs.values().map(|v| v.len() as u64).sum();
        r.bytes_to_send = sends.values().map(|v| bytes(v)).sum();
        r.bytes_to_receive = recvs.values().map(|v| bytes(v)).sum();
    });
    let mut pacer = Pacer::new(cfg.rate);
    // `Err`: a local failure (this rank's disk); the rounds still run so peers are served.
    let mut result = Ok(());
    let mut comm_failed = false;
    for d in 1..world {
        let to = (me + d) % world;
        let from = (me + world - d) % world;
        let out = sends.get(&to).map_or(&[][..], Vec::as_slice);
        let inc = recvs.get(&from).map_or(&[][..], Vec::as_slice);
        let unsent = unsendable.get(&to).map_or(&[][..], Vec::as_slice);
        let outcome = pair(
            comm,
            store,
            tag,
            (to, out, unsent),
            (from, inc),
            cfg.frame,
            tracker,
            target,
            &mut pacer,
            abort,
        );
        let context =
            |e: String| format!("exchange with ranks {to}/{from} for epoch {target}: {e}");
        match outcome {
            Ok(None) => {}
            Ok(Some(local)) => {
                if result.is_ok() {
                    result = Err(context(local));
                }
            }
            Err(e) => {
                // The transport itself failed: no later message can be trusted to arrive.
                result = Err(context(e));
                comm_failed = true;
                break;
            }
        }
    }
    if !comm_failed {
        // Even after a local failure: what was stored must be durable before senders drop it.
        if let Err(e) = store.sync()
            && result.is_ok()
        {
            result = Err(format!("making received samples durable: {e}"));
        }
        match confirm(comm, result.is_ok(), tag, abort) {
            Ok(failed) => {
                for rank in failed {
                    tracing::warn!(
                        rank,
                        target_epoch = target,
                        "a peer could not store what it received; it fetches those samples from the source"
                    );
                }
            }
            Err(e) => {
                if result.is_ok() {
                    result = Err(format!("confirming the exchange for epoch {target}: {e}"));
                }
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    tracker.update(target, |r| {
        r.seconds = seconds;
        r.state = if result.is_ok() { "done" } else { "failed" };
        r.error = result.as_ref().err().cloned();
    });
    if let Some(r) = tracker
        .snapshot()
        .into_iter()
        .find(|r| r.target_epoch == target)
    {
        tracing::info!(
            target_epoch = target,
            state = r.state,
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

/// One round: stream `out` to `to` while streaming `inc` in from `from`. `Err` if the
/// transport failed; `Ok(Some(_))` if this rank failed locally but completed the round.
#[allow(clippy::too_many_arguments)]
fn pair(
    comm: &mut dyn Comm,
    store: &SampleStore,
    tag: u16,
    (to, out, unsent): (Rank, &[Sized], &[SampleId]),
    (from, inc): (Rank, &[Sized]),
    frame: usize,
    tracker: &ExchangeTracker,
    target: u64,
    pacer: &mut Pacer,
    abort: &AtomicBool,
) -> Result<Option<String>, String> {
    let (out_len, in_len) = (stream_len(out), stream_len(inc));
    let frames = |len: u64| len.div_ceil(frame as u64) as usize;
    let (n_out, n_in) = (frames(out_len), frames(in_len));
    let (out_tx, out_rx) = sync_channel::<Vec<u8>>(DEPTH);
    let (in_tx, in_rx) = sync_channel::<Vec<u8>>(DEPTH);
    let (send_pool, recv_pool) = (Pool::new(frame), Pool::new(frame));
    let (send_pool, recv_pool) = (&send_pool, &recv_pool);
    thread::scope(|scope| {
        let reader = scope.spawn(move || {
            idle_io_priority();
            read_stream(store, out, send_pool, out_tx, tracker, target)
        });
        let writer = scope.spawn(move || {
            idle_io_priority();
            write_stream(store, inc, in_rx, recv_pool, tracker, target)
        });
        // Never leave a peer waiting mid-stream: a local failure still sends zeros and
        // drains what arrives, and is reported once the stream is complete.
        let mut local_error: Option<String> = None;
        let mut writer_alive = true;
        for i in 0..n_out.max(n_in) {
            let out_frame_len =
                |i: usize| (out_len - (i * frame) as u64).min(frame as u64) as usize;
            let send_buf = (i < n_out).then(|| {
                out_rx.recv().unwrap_or_else(|_| {
                    local_error.get_or_insert_with(|| "reading samples to send failed".into());
                    vec![0u8; out_frame_len(i)]
                })
            });
            let recv_len = if i < n_in {
                (in_len - (i * frame) as u64).min(frame as u64) as usize
            } else {
                0
            };
            let mut recv_buf = recv_pool.get(recv_len);
            let send = send_buf.as_deref().map(|b| (to, b));
            let recv = (i < n_in).then_some((from, &mut recv_buf[..]));
            comm.sendrecv(tag, send, recv, abort)
                .map_err(|e| e.to_string())?;
            if let Some(b) = &send_buf {
                tracker.update(target, |r| r.bytes_sent += b.len() as u64);
                pacer.pace(b.len());
            }
            if i < n_in {
                tracker.update(target, |r| r.bytes_received += recv_len as u64);
                if writer_alive && in_tx.send(recv_buf).is_err() {
                    writer_alive = false;
                }
            }
            if let Some(b) = send_buf {
                send_pool.put(b);
            }
        }
        drop(in_tx);
        drop(out_rx);
        let unreadable = reader
            .join()
            .unwrap_or_else(|_| Err("reader panicked".into()));
        let written = writer
            .join()
            .unwrap_or_else(|_| Err("writer panicked".into()));
        let mut unreadable = unreadable.unwrap_or_default();
        unreadable.extend_from_slice(unsent);
        let written = written.map_err(|e| {
            local_error
                .take()
                .map_or(e.clone(), |l| format!("{l}; {e}"))
        });
        // Trailer: which samples the sender could not read. Counts first, then the ids.
        let mut their_count = [0u8; 8];
        comm.sendrecv(
            tag,
            Some((to, &(unreadable.len() as u64).to_le_bytes())),
            Some((from, &mut their_count)),
            abort,
        )
        .map_err(|e| e.to_string())?;
        let mine = encode_ids(&unreadable);
        let mut theirs = vec![0u8; u64::from_le_bytes(their_count) as usize * 4];
        comm.sendrecv(tag, Some((to, &mine)), Some((from, &mut theirs)), abort)
            .map_err(|e| e.to_string())?;
        for id in decode_ids(&theirs) {
            tracing::warn!(
                sample = id,
                from,
                "peer could not read this sample; it will be fetched from the source"
            );
            let _ = store.remove(id);
            tracker.update(target, |r| r.failed_samples += 1);
        }
        Ok(written.err().or(local_error))
    })
}

/// Puts the calling thread's disk I/O in the idle class, so training's reads of the current
/// epoch go first on a scheduler that honours it (mq-deadline, bfq). Best effort.
fn idle_io_priority() {
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    const IOPRIO_CLASS_IDLE: libc::c_long = 3;
    // SAFETY: ioprio_set takes plain integers; `who = 0` is the calling thread.
    unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0,
            IOPRIO_CLASS_IDLE << 13,
        );
    }
}

/// Sample ids as little-endian bytes, for lists sent between ranks.
pub fn encode_ids(ids: &[SampleId]) -> Vec<u8> {
    ids.iter().flat_map(|id| id.to_le_bytes()).collect()
}

/// The inverse of [`encode_ids`] (a trailing partial id is ignored).
pub fn decode_ids(bytes: &[u8]) -> impl Iterator<Item = SampleId> + '_ {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
}

/// A sample in a stream, with its size.
pub(crate) type Sized = (SampleId, u64);

/// Bytes of the stream that carries `samples`: each followed by its 4-byte checksum.
pub(crate) fn stream_len(samples: &[Sized]) -> u64 {
    samples.iter().map(|&(_, size)| size + 4).sum()
}

/// The sizes of `ids` ([`UNKNOWN_SIZE`] for one that cannot be read), fetching the samples
/// whose size is not known yet on a few threads: at the first exchange, part of what a rank
/// sends may not be staged yet, and one copy at a time from a parallel filesystem is slow.
fn resolve_sizes(store: &SampleStore, ids: &[SampleId]) -> Vec<u64> {
    const THREADS: usize = 4;
    let resolve = |id: SampleId| {
        store.resolve_size(id).unwrap_or_else(|e| {
            tracing::warn!(sample = id, error = %e, "cannot read a sample to send; receiver will refetch");
            UNKNOWN_SIZE
        })
    };
    if ids.iter().all(|&id| store.size(id).is_some()) {
        return ids.iter().map(|&id| resolve(id)).collect();
    }
    let sizes: Vec<AtomicU64> = ids.iter().map(|_| AtomicU64::new(UNKNOWN_SIZE)).collect();
    let next = AtomicUsize::new(0);
    thread::scope(|scope| {
        for _ in 0..THREADS.min(ids.len()) {
            scope.spawn(|| {
                idle_io_priority();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&id) = ids.get(i) else { break };
                    sizes[i].store(resolve(id), Ordering::Relaxed);
                }
            });
        }
    });
    sizes.into_iter().map(AtomicU64::into_inner).collect()
}

/// Per peer: what this rank sends and receives, with sizes, and what it cannot send.
type Lists = (
    BTreeMap<Rank, Vec<Sized>>,
    BTreeMap<Rank, Vec<Sized>>,
    BTreeMap<Rank, Vec<SampleId>>,
);

/// Settles every stream's length before any byte moves. A receiver may not know the size
/// of a sample it never read (the scan does not stat; see `manifest`), so each sender looks
/// up (fetching if need be) the size of every sample it sends and tells each receiver the
/// sizes of its samples, in the plan's transfer order, one `sendrecv` per round: both sides
/// know the message's length from the plan, and a shutdown can interrupt the wait (a
/// collective could not be). A sample its sender cannot read is marked [`UNKNOWN_SIZE`]:
/// it is left out of both sides' streams and named in the trailer, so the receiver fetches
/// it from the source later.
fn sizes(
    comm: &mut dyn Comm,
    store: &SampleStore,
    step: &Step,
    tag: u16,
    abort: &AtomicBool,
) -> Result<Lists, String> {
    let (me, world) = (comm.rank(), comm.size());
    let mut out_ids: BTreeMap<Rank, Vec<SampleId>> = BTreeMap::new();
    let mut in_ids: BTreeMap<Rank, Vec<SampleId>> = BTreeMap::new();
    for t in &step.transfers {
        if t.from == me {
            out_ids.entry(t.to).or_default().push(t.sample);
        } else if t.to == me {
            in_ids.entry(t.from).or_default().push(t.sample);
        }
    }
    let outgoing: Vec<SampleId> = out_ids.values().flatten().copied().collect();
    let known = resolve_sizes(store, &outgoing);
    let size_of: BTreeMap<SampleId, u64> = outgoing.into_iter().zip(known).collect();
    let (mut sends, mut recvs, mut unsendable) = Lists::default();
    for d in 1..world {
        let (to, from) = ((me + d) % world, (me + world - d) % world);
        let out = out_ids.get(&to).map_or(&[][..], Vec::as_slice);
        let inc = in_ids.get(&from).map_or(&[][..], Vec::as_slice);
        let mine: Vec<u8> = out
            .iter()
            .flat_map(|id| size_of[id].to_le_bytes())
            .collect();
        let mut theirs = vec![0u8; inc.len() * 8];
        comm.sendrecv(tag, Some((to, &mine)), Some((from, &mut theirs)), abort)
            .map_err(|e| format!("with ranks {to}/{from}: {e}"))?;
        for &id in out {
            match size_of[&id] {
                UNKNOWN_SIZE => unsendable.entry(to).or_default().push(id),
                size => sends.entry(to).or_default().push((id, size)),
            }
        }
        for (&id, size) in inc.iter().zip(theirs.chunks_exact(8)) {
            match u64::from_le_bytes(size.try_into().expect("8 bytes")) {
                UNKNOWN_SIZE => {}
                size => recvs.entry(from).or_default().push((id, size)),
            }
        }
    }
    // Streams run in id order on both sides.
    sends.values_mut().for_each(|v| v.sort_unstable());
    recvs.values_mut().for_each(|v| v.sort_unstable());
    Ok((sends, recvs, unsendable))
}

/// Tells each rank this one received from whether what it sent is stored durably (`ok`),
/// and hears the same from each rank this one sent to; returns the receivers that failed.
/// One `sendrecv` per round, so a shutdown can interrupt it.
fn confirm(
    comm: &mut dyn Comm,
    ok: bool,
    tag: u16,
    abort: &AtomicBool,
) -> Result<Vec<Rank>, String> {
    let (me, world) = (comm.rank(), comm.size());
    let mut failed = Vec::new();
    for d in 1..world {
        let (to, from) = ((me + d) % world, (me + world - d) % world);
        let mut theirs = [0u8; 1];
        comm.sendrecv(
            tag,
            Some((from, &[u8::from(ok)])),
            Some((to, &mut theirs)),
            abort,
        )
        .map_err(|e| format!("with ranks {from}/{to}: {e}"))?;
        if theirs[0] != 1 {
            failed.push(to);
        }
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

/// Commands for the thread that owns MPI.
pub enum MpiCmd {
    /// Drop the samples that left, then run the exchange for `step`.
    Exchange {
        evict: Vec<SampleId>,
        step: Arc<Step>,
    },
    /// The FUSE session ended.
    Shutdown,
}
