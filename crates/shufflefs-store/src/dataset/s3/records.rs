//! Records (`--format records`) in a bucket: the objects directly under the prefix are the
//! shard files.
//!
//! Index: rank 0 lists the prefix once; fixed-size records need no byte read (arithmetic
//! on the listed sizes), other framings are walked as a folder's files are, each object
//! fetched once (streamed into an unlinked temporary file, mapped, walked, dropped).
//!
//! Reads: a group is one byte range of one object. Staging announces the groups it is
//! about to copy ([`Dataset::will_read`]); they are cut into runs as a folder's batch reads
//! are ([`coalesce`]: neighbours of one object, small gaps, at most 8 MiB a run) and each
//! run is one ranged GET, made by the first staging thread (or reader) that needs one of
//! its groups, its bytes held until every group of the run is copied out. So within an
//! epoch no byte is fetched twice by a rank. A group asked for outside the plan (a reader's
//! on-demand fetch of a sample staging has not announced) is one ranged GET of its own.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};

use super::client::Client;
use crate::dataset::manifest::{Manifest, ManifestError};
use crate::dataset::names::Skipped;
use crate::dataset::records::source::{coalesce, index_of, span_of};
use crate::dataset::records::{RecordIndex, RecordParams, Span, scan};
use crate::dataset::{Copied, Dataset};
use crate::plan::SampleId;
use crate::sys::sync::Locked;

/// Rank 0's listing of the shards and one pass over them into the record index.
pub(crate) fn build_index(
    client: &Client,
    source: &Path,
    params: &RecordParams,
) -> Result<Manifest, ManifestError> {
    let (files, skipped, etags) = list(client)?;
    let open = |name: &str| -> io::Result<memmap2::Mmap> {
        let mut file = scratch_file()?;
        let etag = etags.get(name).map(String::as_str);
        client.get_to(name, etag, &mut file)?;
        // SAFETY: the file is ours alone (unlinked, never written again) and read only.
        unsafe { memmap2::Mmap::map(&file) }
    };
    let (index, skipped) = scan::build_index_of(source, params, &files, skipped, &open)?;
    let mut kept = Some(crate::dataset::manifest::Etags::default());
    for f in &index.files {
        match (kept.as_mut(), etags.get(&f.name)) {
            (Some(all), Some(etag)) => all.push(etag),
            _ => kept = None,
        }
    }
    let mut manifest = Manifest::from_records(index, skipped);
    if let Some(etags) = kept {
        manifest.set_etags(etags);
    }
    Ok(manifest)
}

/// A new file in the temporary folder, unlinked at once: it lives while it is open.
fn scratch_file() -> io::Result<std::fs::File> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("shufflefs-s3-scan-{}-{n}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(file)
}

/// Shard names (relative to the prefix) and sizes.
type Shards = Vec<(String, u64)>;
/// Each listed shard's ETag, by name.
type Etags = HashMap<String, String>;

/// The objects directly under the prefix, by name, with their sizes; deeper keys skipped.
fn list(client: &Client) -> Result<(Shards, Vec<Skipped>, Etags), ManifestError> {
    let url = &client.url;
    let mut listed = Vec::new();
    super::listing::list(client, None, &mut |o| listed.push((o.key, o.size, o.etag)))
        .map_err(|e| ManifestError::Store(format!("--source {url}: listing failed: {e}")))?;
    let (mut files, mut skipped, mut etags) = (Vec::new(), Vec::new(), HashMap::new());
    let mut unusable = super::keys::Unusable::default();
    for (key, size, etag) in listed {
        let relative = match url.prefix.is_empty() {
            true => Some(key.as_str()),
            false => key
                .strip_prefix(url.prefix.as_str())
                .and_then(|r| r.strip_prefix('/')),
        };
        let Some(name) = relative.filter(|r| !r.is_empty() && !r.ends_with('/')) else {
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        if let Some(why) = super::keys::unusable(name) {
            unusable.add(&key, why);
            continue;
        }
        if name.contains('/') {
            skipped.push(Skipped {
                path: key.clone(),
                reason:
                    "not directly under the prefix; a record source is a flat folder of shard files"
                        .into(),
            });
            continue;
        }
        if let Some(etag) = etag {
            etags.insert(name.to_string(), etag);
        }
        files.push((name.to_string(), size));
    }
    files.sort();
    skipped.extend(unusable.into_skipped(&url.to_string()));
    Ok((files, skipped, etags))
}

/// The reader of a bucket's record groups.
pub(crate) struct S3Records {
    client: Result<Client, String>,
    name: String,
    manifest: Arc<Manifest>,
    /// The run of each group staging announced and has not copied yet.
    plan: Mutex<Plan>,
}

/// Staging's announced groups cut into runs, in file and offset order.
#[derive(Default)]
struct Plan {
    runs: Arc<Vec<Arc<Run>>>,
    /// Each group's run, until the group is copied.
    of: HashMap<SampleId, usize>,
}

/// One ranged GET covering the groups of a run, fetched once.
struct Run {
    span: Span,
    state: Mutex<RunState>,
    loaded: Condvar,
}

struct RunState {
    bytes: Option<Result<bytes::Bytes, ()>>,
    loading: bool,
    /// Groups still to copy out; the bytes are dropped at 0.
    left: usize,
}

impl S3Records {
    pub(crate) fn new(
        client: Result<Client, String>,
        name: String,
        manifest: Arc<Manifest>,
    ) -> Self {
        S3Records {
            client,
            name,
            manifest,
            plan: Mutex::new(Plan::default()),
        }
    }

    fn client(&self) -> io::Result<&Client> {
        self.client
            .as_ref()
            .map_err(|e| io::Error::new(io::ErrorKind::ConnectionRefused, e.clone()))
    }

    fn index(&self) -> io::Result<&RecordIndex> {
        index_of(&self.manifest)
    }

    fn span(&self, id: SampleId) -> io::Result<Span> {
        span_of(&self.manifest, id)
    }

    /// One ranged GET of `span`, failing if the object is shorter than the listing said.
    fn get(&self, span: Span) -> io::Result<bytes::Bytes> {
        let name = &self.index()?.files[span.file as usize].name;
        let etag = self.manifest.etag(span.file as usize);
        let (bytes, _) = self
            .client()?
            .get(name, Some(span.start..span.end), etag.as_deref())?;
        if bytes.len() as u64 != span.end - span.start {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "bytes {}..{} of the object came back as {} bytes; it changed since the listing (remount with --reset-cache)",
                    span.start,
                    span.end,
                    bytes.len()
                ),
            ));
        }
        Ok(bytes)
    }

    /// Group `span`'s bytes out of run `i` of `runs`, fetching the run if no one has yet;
    /// `None` if the run's GET failed (the group is then fetched alone, so its error is its
    /// own). A thread whose run another thread is fetching fetches one of the next
    /// [`AHEAD`] runs meanwhile, so that several runs are in flight while staging's
    /// threads all wait on neighbouring groups.
    fn take_from_run(&self, runs: &[Arc<Run>], i: usize, span: Span) -> Option<bytes::Bytes> {
        let run = &runs[i];
        loop {
            let mut state = run.state.locked();
            if state.bytes.is_some() {
                return cut(&mut state, run.span, span);
            }
            if !state.loading {
                state.loading = true;
                drop(state);
                self.load(run);
                continue;
            }
            drop(state);
            let ahead = &runs[(i + 1).min(runs.len())..(i + 1 + AHEAD).min(runs.len())];
            if !ahead.iter().any(|r| self.claim_and_load(r)) {
                let state = run.state.locked();
                if state.bytes.is_none() {
                    drop(run.loaded.wait(state));
                }
            }
        }
    }

    /// Fetches `run` if no one is fetching or has fetched it; whether it did.
    fn claim_and_load(&self, run: &Run) -> bool {
        {
            let mut state = run.state.locked();
            if state.loading || state.bytes.is_some() {
                return false;
            }
            state.loading = true;
        }
        self.load(run);
        true
    }

    /// One ranged GET of `run`, its bytes (or the failure) handed to those waiting.
    fn load(&self, run: &Run) {
        let got = self.get(run.span).map_err(|e| {
            tracing::warn!(error = %e, "a coalesced read failed; its groups are read one by one");
        });
        run.state.locked().bytes = Some(got);
        run.loaded.notify_all();
    }
}

/// Runs fetched ahead of the one a thread waits on: with runs of up to 8 MiB, at most
/// this many more are held in memory a rank (each is dropped once its groups are copied).
const AHEAD: usize = 16;

/// Group `span`'s bytes out of its run's fetched bytes; the run's bytes are dropped when
/// its last group is taken.
fn cut(state: &mut RunState, run: Span, span: Span) -> Option<bytes::Bytes> {
    state.left = state.left.saturating_sub(1);
    let at = (span.start - run.start) as usize;
    let part = match state.bytes.as_ref()? {
        Ok(b) => Some(b.slice(at..at + (span.end - span.start) as usize)),
        Err(()) => None,
    };
    if state.left == 0 {
        state.bytes = Some(Err(()));
    }
    part
}

impl Dataset for S3Records {
    fn copy_to(&self, id: SampleId, out: &mut dyn Write) -> io::Result<Copied> {
        let span = self.span(id)?;
        let planned = {
            let mut plan = self.plan.locked();
            plan.of.remove(&id).map(|i| (plan.runs.clone(), i))
        };
        let bytes = match planned.and_then(|(runs, i)| self.take_from_run(&runs, i, span)) {
            Some(b) => b,
            None => self.get(span)?,
        };
        out.write_all(&bytes)?;
        Ok(Copied {
            len: bytes.len() as u64,
            mtime: None,
        })
    }

    fn read_at(&self, id: SampleId, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let span = self.span(id)?;
        let start = (span.start + offset).min(span.end);
        let end = span.end.min(start + buf.len() as u64);
        if start == end {
            return Ok(0);
        }
        let bytes = self.get(Span { start, end, ..span })?;
        buf[..bytes.len()].copy_from_slice(&bytes);
        Ok(bytes.len())
    }

    fn will_read(&self, ids: &[SampleId]) {
        let mut spans: Vec<(Span, SampleId)> = ids
            .iter()
            .filter_map(|&id| self.span(id).ok().map(|s| (s, id)))
            .collect();
        let (mut runs, mut of) = (Vec::new(), HashMap::with_capacity(spans.len()));
        for (span, members) in coalesce(&mut spans) {
            let run = Arc::new(Run {
                span,
                state: Mutex::new(RunState {
                    bytes: None,
                    loading: false,
                    left: members.len(),
                }),
                loaded: Condvar::new(),
            });
            for &(_, id) in &spans[members] {
                of.insert(id, runs.len());
            }
            runs.push(run);
        }
        *self.plan.locked() = Plan {
            runs: Arc::new(runs),
            of,
        };
    }

    fn describe(&self, id: SampleId) -> String {
        match (&self.client, self.index(), self.span(id)) {
            (Ok(c), Ok(index), Ok(s)) => format!(
                "s3://{}/{} bytes {}..{}",
                c.url.bucket,
                c.url.key(&index.files[s.file as usize].name),
                s.start,
                s.end
            ),
            _ => format!("{} group {id}", self.name),
        }
    }
}
