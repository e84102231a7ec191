//! Positioned reads that fill the buffer: `pread` may return less than asked before the end
//! of a file (signals, some filesystems), and every reader of samples wants all it asked for.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Reads into `buf` from `offset` until it is full or the file ends; returns the bytes read
/// (short only at the end of the file).
pub fn read_full_at(file: &File, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}
