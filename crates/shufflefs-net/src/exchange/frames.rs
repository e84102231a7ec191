//! The disk side of a round: a reader thread turning cached samples into outgoing frames,
//! a writer thread turning incoming frames back into cache files, and the frame buffers they
//! pass to and from the MPI thread. The stream format is in the executor's docs.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use super::{DEPTH, ExchangeError, ExchangeTracker, Sized};
use crate::cache::SampleStore;
use crate::plan::SampleId;
use crate::sys::sync::Locked;

/// Fills frames with the bytes of `ids` in order, each followed by its checksum. A sample
/// that cannot be read is sent as zeros (the length is fixed) with the complement of their
/// checksum, which the receiving store reads as "the sender could not read it" (not as a
/// corruption): it drops the bytes and fetches the sample from the source. Such samples are
/// named in the returned list.
pub(super) fn read_stream(
    store: &SampleStore,
    ids: &[Sized],
    pool: &Pool,
    tx: SyncSender<Vec<u8>>,
    tracker: &ExchangeTracker,
    target: u64,
) -> Result<Vec<SampleId>, String> {
    let stopped = |_| "exchange stopped".to_string();
    let mut out = FrameWriter {
        buf: pool.get(pool.frame),
        used: 0,
        pool,
        tx,
    };
    let mut unreadable = Vec::new();
    let mut progress = Progress::new(tracker, target, None);
    let mut i = 0;
    while i < ids.len() {
        // A run of small samples is read as one (`SampleStore::read_each`).
        let end = (i..ids.len().min(i + BATCH))
            .find(|&k| ids[k].1 > BATCH_SAMPLE)
            .unwrap_or(ids.len().min(i + BATCH));
        let shipped = if end > i {
            let run = &ids[i..end];
            ship_run(store, run, &mut out, &mut unreadable, &mut progress).map(|()| end)
        } else {
            ship_one(store, ids[i], &mut out, &mut unreadable, &mut progress).map(|()| i + 1)
        };
        i = shipped.map_err(stopped)?;
    }
    progress.publish();
    out.finish().map_err(stopped)?;
    Ok(unreadable)
}

/// Sends a run of small samples, read as one (`SampleStore::read_each`); `Err` only if the
/// MPI side stopped.
fn ship_run(
    store: &SampleStore,
    run: &[Sized],
    out: &mut FrameWriter,
    unreadable: &mut Vec<SampleId>,
    progress: &mut Progress,
) -> io::Result<()> {
    let run_ids: Vec<SampleId> = run.iter().map(|s| s.0).collect();
    let mut shipped = Ok(());
    store.read_each(&run_ids, &mut |k, read| {
        if shipped.is_err() {
            return;
        }
        let (id, size) = run[k];
        let mut crc = 0;
        let (sent, recorded, error) = match read {
            Ok(stored) => {
                let n = stored.bytes.len().min(size as usize);
                if let Err(e) = out.put(&stored.bytes[..n], &mut crc) {
                    shipped = Err(e);
                    return;
                }
                (n as u64, stored.recorded_crc, None)
            }
            Err(e) => (0, None, Some(e)),
        };
        let sample = Sample {
            id,
            size,
            sent,
            crc,
            recorded,
            error,
        };
        shipped = sample.end(store, out, unreadable, progress);
    });
    shipped
}

/// Sends one sample too large to batch, copied from its file straight into frames; `Err`
/// only if the MPI side stopped.
fn ship_one(
    store: &SampleStore,
    (id, size): Sized,
    out: &mut FrameWriter,
    unreadable: &mut Vec<SampleId>,
    progress: &mut Progress,
) -> io::Result<()> {
    let mut crc = 0;
    let (sent, recorded, error) = match store.open_checked(id) {
        Ok(mut stored) => {
            let (n, error) = out.fill_from(&mut *stored.reader, size, &mut crc)?;
            (n, stored.recorded_crc, error)
        }
        Err(e) => (0, None, Some(e)),
    };
    let sample = Sample {
        id,
        size,
        sent,
        crc,
        recorded,
        error,
    };
    sample.end(store, out, unreadable, progress)
}

/// A sample being sent, once what could be read of it is in the frame.
struct Sample {
    id: SampleId,
    size: u64,
    /// Bytes of it in the frame so far, and their checksum.
    sent: u64,
    crc: u32,
    /// The checksum recorded when it was cached, and why it could not be read whole.
    recorded: Option<u32>,
    error: Option<io::Error>,
}

impl Sample {
    /// Pads what could not be read with zeros and writes the checksum (see `read_stream`).
    fn end(
        self,
        store: &SampleStore,
        out: &mut FrameWriter,
        unreadable: &mut Vec<SampleId>,
        progress: &mut Progress,
    ) -> io::Result<()> {
        let Sample {
            id,
            size,
            sent,
            mut crc,
            recorded,
            error,
        } = self;
        if sent < size {
            let error = error.map_or_else(|| "file is short".to_string(), |e| e.to_string());
            tracing::warn!(
                sample = id,
                error,
                "cannot read a sample to send; receiver will refetch"
            );
            out.fill_zeros(size - sent, &mut crc)?;
            crc = !crc;
            unreadable.push(id);
        } else if let Some(recorded) = recorded.filter(|&r| r != crc) {
            // Sending the recorded value makes the receiver reject these bytes too.
            store.discard_corrupt(id, crc, recorded);
            crc = recorded;
        } else {
            progress.sent += 1;
            progress.tick(size);
        }
        out.write_all(&crc.to_le_bytes())
    }
}

/// Turns incoming frames back into one cache file per sample, checking each against the
/// checksum that follows it (the executor makes them durable after the last round).
pub(super) fn write_stream(
    store: &SampleStore,
    ids: &[Sized],
    rx: Receiver<Vec<u8>>,
    pool: &Pool,
    tracker: &ExchangeTracker,
    (target, peer): (u64, u32),
) -> Result<(), ExchangeError> {
    let mut input = FrameReader {
        rx,
        pool,
        buf: Vec::new(),
        pos: 0,
        holds: false,
    };
    let mut progress = Progress::new(tracker, target, Some(peer));
    let mut i = 0;
    while i < ids.len() {
        // A run of small samples lying whole (with their checksums) in the current frame
        // goes in as one batch, straight from the frame.
        let have = input.chunk().len();
        let (mut end, mut at) = (i, 0usize);
        while end < ids.len() && end - i < BATCH {
            let size = ids[end].1;
            if size > BATCH_SAMPLE || at + size as usize + 4 > have {
                break;
            }
            at += size as usize + 4;
            end += 1;
        }
        // A partial cache takes a run only if it all fits (else one by one, below).
        let room = match end > i {
            true => store.room_for_received(
                ids[i].0,
                ids[i..end].iter().map(|s| store.on_disk(s.1)).sum(),
            ),
            false => Ok(None),
        };
        if end > i && room.is_ok() {
            let run = &ids[i..end];
            let bytes = &input.buf[input.pos..input.pos + at];
            let mut batch = Vec::with_capacity(run.len());
            let mut off = 0;
            for &(id, size) in run {
                let (data, rest) = bytes[off..].split_at(size as usize);
                let crc = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes"));
                batch.push((id, data, crc));
                off += size as usize + 4;
            }
            let results = store.insert_batch(&batch);
            input.pos += at;
            for (result, &(id, size)) in results.into_iter().zip(run) {
                received(result, id, size, &mut progress)?;
            }
            i = end;
            continue;
        }
        drop(room);
        let (id, size) = ids[i];
        let Ok(_room) = store.room_for_received(id, size) else {
            // No room in the partial cache: read from the source when needed.
            (input.copy_to(size + 4, &mut io::sink()))
                .map_err(|source| ExchangeError::Store { sample: id, source })?;
            progress.tick(size);
            tracker.update(target, |r| r.not_kept_samples += 1);
            i += 1;
            continue;
        };
        let stored = store.insert_with(id, |file| {
            input.copy_to(size, file)?;
            let mut crc = [0u8; 4];
            input.read_exact(&mut crc)?;
            Ok(Some(u32::from_le_bytes(crc)))
        });
        received(stored, id, size, &mut progress)?;
        i += 1;
    }
    Ok(())
}

/// Samples at most this large are written in batches when they lie whole in a frame.
const BATCH_SAMPLE: u64 = 64 << 10;
/// Samples in one batch at most.
const BATCH: usize = 256;

/// Counts what became of a received sample; `Err` if the cache cannot take it.
fn received(
    stored: io::Result<u32>,
    id: SampleId,
    size: u64,
    progress: &mut Progress,
) -> Result<(), ExchangeError> {
    match stored {
        Ok(_) => {
            progress.received += 1;
            progress.tick(size);
        }
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            tracing::warn!(sample = id, error = %e, "received sample failed its checksum; it will be fetched from the source");
            progress.failed += 1;
            progress.tick(size);
        }
        Err(source) => return Err(ExchangeError::Store { sample: id, source }),
    }
    Ok(())
}

/// A stream's sample counts, kept here and added to the tracker's report every
/// [`Progress::SAMPLES`] samples or [`Progress::BYTES`] bytes, and when dropped: a tracker
/// update per sample (a lock shared with every other stream and the MPI thread) was a large
/// share of the exchange's CPU at 362 B records. The status's counts lag
/// by at most that much; they are complete once the stream's thread returned.
struct Progress<'a> {
    tracker: &'a ExchangeTracker,
    target: u64,
    /// The peer whose stream this receives (`None`: a sending stream).
    peer: Option<u32>,
    sent: u64,
    received: u64,
    failed: u64,
    /// Samples and bytes since the last publish.
    samples: u32,
    bytes: u64,
}

impl<'a> Progress<'a> {
    const SAMPLES: u32 = 512;
    const BYTES: u64 = 4 << 20;

    fn new(tracker: &'a ExchangeTracker, target: u64, peer: Option<u32>) -> Progress<'a> {
        Progress {
            tracker,
            target,
            peer,
            sent: 0,
            received: 0,
            failed: 0,
            samples: 0,
            bytes: 0,
        }
    }

    /// Counts one more sample of `size` bytes (after its count was added), publishing if due.
    fn tick(&mut self, size: u64) {
        self.samples += 1;
        self.bytes += size;
        if self.samples >= Self::SAMPLES || self.bytes >= Self::BYTES {
            self.publish();
        }
    }

    fn publish(&mut self) {
        self.samples = 0;
        self.bytes = 0;
        if self.sent + self.received + self.failed == 0 {
            return;
        }
        let (sent, received, failed) = (
            std::mem::take(&mut self.sent),
            std::mem::take(&mut self.received),
            std::mem::take(&mut self.failed),
        );
        let peer = self.peer;
        self.tracker.update(self.target, |r| {
            r.samples_sent += sent;
            r.samples_received += received;
            r.failed_samples += failed;
            if let Some(peer) = peer.filter(|_| received > 0) {
                r.peer(peer).samples_received += received;
            }
        });
    }
}

impl Drop for Progress<'_> {
    fn drop(&mut self) {
        self.publish();
    }
}

/// Frame buffers handed back and forth between the MPI thread and a disk thread, so a long
/// exchange does not fault in a fresh 8 MiB buffer for every frame.
pub(super) struct Pool {
    frame: usize,
    /// Buffers kept for reuse at most: enough for every stream's frames in flight.
    keep: usize,
    free: Mutex<Vec<Vec<u8>>>,
    held: Arc<Held>,
}

/// Frames a round's pools handed out and did not get back yet: every frame is taken with
/// [`Pool::get`] and handed back once with [`Pool::put`] (a transport may hand back another
/// buffer, or an empty one, for it), so this counts frames in this rank's hands whatever the
/// transport does with buffers. Frames a failing stream drops count until the round ends.
#[derive(Debug, Default)]
pub(super) struct Held {
    live: AtomicUsize,
    peak: AtomicUsize,
}

impl Held {
    /// The most frames held at once so far.
    pub(super) fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    fn take(&self) {
        let now = self.live.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn give(&self, n: usize) {
        let _ = (self.live).fetch_update(Ordering::Relaxed, Ordering::Relaxed, |live| {
            Some(live.saturating_sub(n))
        });
    }
}

impl Pool {
    /// A pool for `streams` streams in flight together, counting its frames in `held`.
    pub(super) fn new(frame: usize, streams: usize, held: Arc<Held>) -> Pool {
        Pool {
            frame,
            keep: (2 * DEPTH + 2) * streams.max(1),
            free: Mutex::default(),
            held,
        }
    }

    /// A buffer of `len` bytes (contents unspecified) with room for a whole frame.
    pub(super) fn get(&self, len: usize) -> Vec<u8> {
        self.held.take();
        let mut buf = self
            .free
            .locked()
            .pop()
            // Zeroed by the allocator (fresh pages), not by a pass over the frame.
            .unwrap_or_else(|| vec![0; self.frame]);
        // A reused buffer is zero-filled only where it grows.
        buf.resize(len, 0);
        buf
    }

    /// Hands back a frame taken with [`Pool::get`] (or the buffer the transport returned
    /// for it), keeping the buffer for reuse if it can hold a frame.
    pub(super) fn put(&self, buf: Vec<u8>) {
        self.held.give(1);
        let mut free = self.free.locked();
        if buf.capacity() >= self.frame && free.len() < self.keep {
            free.push(buf);
        }
    }

    /// `n` frames taken from this pool went to the transport and will not come back (their
    /// receives were withdrawn).
    pub(super) fn forget(&self, n: usize) {
        self.held.give(n);
    }
}

/// Fills frames in place: `buf` always spans a whole frame (zeroed once, when the pool first
/// allocates it) and `used` says how much of it holds the stream, so a sample is read from
/// its file straight into the frame with no zero-filling per sample.
struct FrameWriter<'a> {
    buf: Vec<u8>,
    used: usize,
    pool: &'a Pool,
    tx: SyncSender<Vec<u8>>,
}

impl FrameWriter<'_> {
    /// Reads up to `len` bytes of `file` straight into frames. A read error ends the copy
    /// early and is returned beside the count; `Err` only if the MPI side stopped.
    fn fill_from(
        &mut self,
        file: &mut dyn Read,
        len: u64,
        crc: &mut u32,
    ) -> io::Result<(u64, Option<io::Error>)> {
        let mut done = 0u64;
        while done < len {
            let start = self.used;
            let want = (self.pool.frame - start).min((len - done) as usize);
            let got = match file.read(&mut self.buf[start..start + want]) {
                Ok(0) => return Ok((done, None)),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
                Err(e) => return Ok((done, Some(e))),
            };
            self.used += got;
            *crc = crc32c::crc32c_append(*crc, &self.buf[start..self.used]);
            done += got as u64;
            self.ship_if_full()?;
        }
        Ok((done, None))
    }

    /// Adds `data` to the frames and to the checksum `crc`.
    fn put(&mut self, data: &[u8], crc: &mut u32) -> io::Result<()> {
        *crc = crc32c::crc32c_append(*crc, data);
        self.write_all(data)
    }

    fn fill_zeros(&mut self, len: u64, crc: &mut u32) -> io::Result<()> {
        let zeros = [0u8; 64 << 10];
        let mut left = len;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            *crc = crc32c::crc32c_append(*crc, &zeros[..n]);
            self.write_all(&zeros[..n])?;
            left -= n as u64;
        }
        Ok(())
    }

    fn ship_if_full(&mut self) -> io::Result<()> {
        if self.used == self.pool.frame {
            let full = std::mem::replace(&mut self.buf, self.pool.get(self.pool.frame));
            self.used = 0;
            self.tx
                .send(full)
                .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))?;
        }
        Ok(())
    }

    fn finish(mut self) -> io::Result<()> {
        if self.used == 0 {
            self.pool.put(std::mem::take(&mut self.buf));
        } else {
            let mut last = std::mem::take(&mut self.buf);
            last.truncate(self.used);
            self.tx
                .send(last)
                .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))?;
        }
        Ok(())
    }
}

impl Write for FrameWriter<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let frame = self.pool.frame;
        let n = data.len().min(frame - self.used);
        self.buf[self.used..self.used + n].copy_from_slice(&data[..n]);
        self.used += n;
        self.ship_if_full()?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct FrameReader<'a> {
    rx: Receiver<Vec<u8>>,
    pool: &'a Pool,
    buf: Vec<u8>,
    pos: usize,
    /// `buf` is a frame (from the MPI thread), handed back to the pool when done with.
    holds: bool,
}

impl Drop for FrameReader<'_> {
    fn drop(&mut self) {
        if self.holds {
            self.pool.put(std::mem::take(&mut self.buf));
        }
    }
}

impl FrameReader<'_> {
    /// The unread part of the current frame, fetching the next one when it is used up;
    /// empty once the stream ended.
    fn chunk(&mut self) -> &[u8] {
        if self.pos == self.buf.len()
            && let Ok(next) = self.rx.recv()
        {
            let used = std::mem::replace(&mut self.buf, next);
            if std::mem::replace(&mut self.holds, true) {
                self.pool.put(used);
            }
            self.pos = 0;
        }
        &self.buf[self.pos..]
    }

    /// Writes the next `len` bytes of the stream to `out`, straight from the frames.
    fn copy_to(&mut self, len: u64, out: &mut dyn Write) -> io::Result<()> {
        let mut left = len;
        while left > 0 {
            let chunk = self.chunk();
            if chunk.is_empty() {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let n = chunk.len().min(left as usize);
            out.write_all(&chunk[..n])?;
            self.pos += n;
            left -= n as u64;
        }
        Ok(())
    }
}

impl Read for FrameReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let chunk = self.chunk();
        let n = out.len().min(chunk.len());
        out[..n].copy_from_slice(&chunk[..n]);
        self.pos += n;
        Ok(n)
    }
}

/// Puts the calling thread's disk I/O in the idle class, so training's reads of the current
/// epoch go first on a scheduler that honours it (mq-deadline, bfq). Best effort.
pub(super) fn idle_io_priority() {
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
