//! The disk side of a round: a reader thread turning cached samples into outgoing frames,
//! a writer thread turning incoming frames back into cache files, and the frame buffers they
//! pass to and from the MPI thread. The stream format is in the executor's docs.

use std::io::{self, Read, Write};
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, SyncSender};

use super::{DEPTH, ExchangeError, ExchangeTracker, Sized};
use crate::cache::SampleStore;
use crate::plan::SampleId;

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
        buf: pool.get(0),
        pool,
        tx,
    };
    let mut unreadable = Vec::new();
    for &(id, size) in ids {
        let mut crc = 0;
        let (sent, recorded, error) = match store.open_checked(id) {
            Ok(mut stored) => {
                let (n, error) = out
                    .fill_from(&mut *stored.reader, size, &mut crc)
                    .map_err(stopped)?;
                (n, stored.recorded_crc, error)
            }
            Err(e) => (0, None, Some(e)),
        };
        if sent < size {
            let error = error.map_or_else(|| "file is short".to_string(), |e| e.to_string());
            tracing::warn!(
                sample = id,
                error,
                "cannot read a sample to send; receiver will refetch"
            );
            out.fill_zeros(size - sent, &mut crc).map_err(stopped)?;
            crc = !crc;
            unreadable.push(id);
        } else if let Some(recorded) = recorded.filter(|&r| r != crc) {
            // Sending the recorded value makes the receiver reject these bytes too.
            store.discard_corrupt(id, crc, recorded);
            crc = recorded;
        } else {
            tracker.update(target, |r| r.samples_sent += 1);
        }
        out.write_all(&crc.to_le_bytes()).map_err(stopped)?;
    }
    out.finish().map_err(stopped)?;
    Ok(unreadable)
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
    };
    for &(id, size) in ids {
        let stored = store.insert_with(id, |file| {
            input.copy_to(size, file)?;
            let mut crc = [0u8; 4];
            input.read_exact(&mut crc)?;
            Ok(Some(u32::from_le_bytes(crc)))
        });
        match stored {
            Ok(_) => tracker.update(target, |r| {
                r.samples_received += 1;
                r.peer(peer).samples_received += 1;
            }),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                tracing::warn!(sample = id, error = %e, "received sample failed its checksum; it will be fetched from the source");
                tracker.update(target, |r| r.failed_samples += 1);
            }
            Err(source) => return Err(ExchangeError::Store { sample: id, source }),
        }
    }
    Ok(())
}

/// Frame buffers handed back and forth between the MPI thread and a disk thread, so a long
/// exchange does not fault in a fresh 8 MiB buffer for every frame.
pub(super) struct Pool {
    frame: usize,
    /// Buffers kept for reuse at most: enough for every stream's frames in flight.
    keep: usize,
    free: Mutex<Vec<Vec<u8>>>,
}

impl Pool {
    /// A pool for `streams` streams in flight together.
    pub(super) fn new(frame: usize, streams: usize) -> Pool {
        Pool {
            frame,
            keep: (2 * DEPTH + 2) * streams.max(1),
            free: Mutex::default(),
        }
    }

    /// A buffer of `len` bytes (contents unspecified) with room for a whole frame.
    pub(super) fn get(&self, len: usize) -> Vec<u8> {
        let mut buf = self
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(self.frame));
        buf.resize(len, 0);
        buf
    }

    pub(super) fn put(&self, buf: Vec<u8>) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if buf.capacity() >= self.frame && free.len() < self.keep {
            free.push(buf);
        }
    }
}

struct FrameWriter<'a> {
    buf: Vec<u8>,
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
            let start = self.buf.len();
            let want = (self.pool.frame - start).min((len - done) as usize);
            self.buf.resize(start + want, 0);
            let got = match file.read(&mut self.buf[start..]) {
                Ok(0) => {
                    self.buf.truncate(start);
                    return Ok((done, None));
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
                Err(e) => {
                    self.buf.truncate(start);
                    return Ok((done, Some(e)));
                }
            };
            self.buf.truncate(start + got);
            *crc = crc32c::crc32c_append(*crc, &self.buf[start..]);
            done += got as u64;
            self.ship_if_full()?;
        }
        Ok((done, None))
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
        if self.buf.len() == self.pool.frame {
            let full = std::mem::replace(&mut self.buf, self.pool.get(0));
            self.tx
                .send(full)
                .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))?;
        }
        Ok(())
    }

    fn finish(mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            let last = std::mem::take(&mut self.buf);
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
        let n = data.len().min(frame - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
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
}

impl FrameReader<'_> {
    /// The unread part of the current frame, fetching the next one when it is used up;
    /// empty once the stream ended.
    fn chunk(&mut self) -> &[u8] {
        if self.pos == self.buf.len()
            && let Ok(next) = self.rx.recv()
        {
            let used = std::mem::replace(&mut self.buf, next);
            self.pool.put(used);
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
