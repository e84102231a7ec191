//! Where sample bytes come from when no cache holds them.
//!
//! A trait so the packed-record sources of the LIRS work (offset tables into large record
//! files) can slot in later without touching the cache, the view or the exchange: all of them
//! only ask "give me the bytes of sample `id`".

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

use crate::dataset::manifest::Manifest;
use crate::plan::SampleId;

pub trait SampleSource: Send + Sync {
    /// Writes the whole of sample `id` to `out`; returns the number of bytes written.
    fn copy_to(&self, id: SampleId, out: &mut dyn Write) -> io::Result<u64>;
    /// A human-readable location for errors and the log.
    fn describe(&self, id: SampleId) -> String;
}

/// An ImageFolder tree on a (parallel) filesystem: `root/<class>/<name>`.
pub struct DirSource {
    root: PathBuf,
    manifest: Arc<Manifest>,
}

impl DirSource {
    pub fn new(root: PathBuf, manifest: Arc<Manifest>) -> DirSource {
        DirSource { root, manifest }
    }
}

impl SampleSource for DirSource {
    fn copy_to(&self, id: SampleId, out: &mut dyn Write) -> io::Result<u64> {
        let mut file = File::open(self.root.join(self.manifest.relative_path(id)))?;
        copy_large(&mut file, out)
    }

    fn describe(&self, id: SampleId) -> String {
        self.root
            .join(self.manifest.relative_path(id))
            .display()
            .to_string()
    }
}

/// `io::copy` with a 1 MiB buffer: parallel filesystems like large requests.
fn copy_large(from: &mut dyn Read, to: &mut dyn Write) -> io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
        total += n as u64;
    }
}

/// Test bytes that are a pure function of (sample, offset), so any read can be checked
/// without keeping the data around.
pub fn synthetic_byte(id: SampleId, offset: u64) -> u8 {
    let x = (u64::from(id) << 32 ^ offset).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 56) as u8
}

/// An in-memory source of synthetic samples, for tests of four ranks in one process.
pub struct SyntheticSource {
    pub manifest: Arc<Manifest>,
}

impl SampleSource for SyntheticSource {
    fn copy_to(&self, id: SampleId, out: &mut dyn Write) -> io::Result<u64> {
        let size = self.manifest.size(id).ok_or_else(|| {
            io::Error::other(format!("synthetic sample {id} has no size in its manifest"))
        })?;
        let bytes: Vec<u8> = (0..size).map(|o| synthetic_byte(id, o)).collect();
        out.write_all(&bytes)?;
        Ok(size)
    }

    fn describe(&self, id: SampleId) -> String {
        format!("synthetic:{id}")
    }
}
