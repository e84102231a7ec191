//! An ImageFolder tree on a (parallel) filesystem: `root/<class>/<name>`, one file a sample.
//! Its index is built by [`scan`](super::scan).

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::manifest::{Manifest, ManifestError};
use super::{Copied, Dataset};
use crate::plan::SampleId;
use crate::sys::io::read_full_at;

pub struct ImageFolder {
    root: PathBuf,
    manifest: Arc<Manifest>,
}

impl ImageFolder {
    pub fn new(root: PathBuf, manifest: Arc<Manifest>) -> ImageFolder {
        ImageFolder { root, manifest }
    }

    fn path(&self, id: SampleId) -> PathBuf {
        self.root.join(self.manifest.relative_path(id))
    }
}

impl Dataset for ImageFolder {
    fn copy_to(&self, id: SampleId, out: &mut dyn Write) -> io::Result<Copied> {
        let mut file = File::open(self.path(id))?;
        // The open file's size and times cost no extra lookup on the source.
        let meta = file.metadata().ok();
        let mtime = meta.as_ref().and_then(|m| m.modified().ok());
        let len = copy_large(&mut file, out)?;
        // A network filesystem whose server went away mid-read (sshfs) can end the file
        // early instead of failing: fewer bytes than the open file's size is an I/O error,
        // not a shorter sample.
        if meta.is_some_and(|m| len < m.len()) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(Copied { len, mtime })
    }

    fn read_at(&self, id: SampleId, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        read_full_at(&File::open(self.path(id))?, offset, buf)
    }

    fn stat_len(&self, id: SampleId) -> io::Result<Option<u64>> {
        Ok(Some(fs::metadata(self.path(id))?.len()))
    }

    fn describe(&self, id: SampleId) -> String {
        self.path(id).display().to_string()
    }
}

/// The source must be a readable folder.
pub(crate) fn check_source(path: &Path) -> Result<(), ManifestError> {
    match fs::read_dir(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Err(ManifestError::Missing(path.to_path_buf()))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
            Err(ManifestError::NotADir(path.to_path_buf()))
        }
        Err(source) => Err(ManifestError::Io {
            path: path.to_path_buf(),
            source,
        }),
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
