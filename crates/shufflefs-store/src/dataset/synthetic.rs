//! An in-memory dataset of synthetic samples, for tests of several ranks in one process:
//! bytes are a pure function of (sample, offset), so any read can be checked without
//! keeping the data around.

use std::io::{self, Write};
use std::sync::Arc;

use super::manifest::Manifest;
use super::{Copied, Dataset};
use crate::plan::SampleId;

/// Test bytes that are a pure function of (sample, offset).
pub fn synthetic_byte(id: SampleId, offset: u64) -> u8 {
    let x = (id << 32 ^ offset).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 56) as u8
}

/// Samples of the sizes `manifest` gives, with [`synthetic_byte`] contents.
pub struct SyntheticSource {
    pub manifest: Arc<Manifest>,
}

impl SyntheticSource {
    fn size(&self, id: SampleId) -> io::Result<u64> {
        self.manifest.size(id).ok_or_else(|| {
            io::Error::other(format!("synthetic sample {id} has no size in its manifest"))
        })
    }
}

impl Dataset for SyntheticSource {
    fn copy_to(&self, id: SampleId, out: &mut dyn Write) -> io::Result<Copied> {
        let len = self.size(id)?;
        let bytes: Vec<u8> = (0..len).map(|o| synthetic_byte(id, o)).collect();
        out.write_all(&bytes)?;
        Ok(Copied { len, mtime: None })
    }

    fn read_at(&self, id: SampleId, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let len = self.size(id)?;
        let n = len.saturating_sub(offset).min(buf.len() as u64) as usize;
        for (i, b) in buf[..n].iter_mut().enumerate() {
            *b = synthetic_byte(id, offset + i as u64);
        }
        Ok(n)
    }

    fn describe(&self, id: SampleId) -> String {
        format!("synthetic:{id}")
    }
}
