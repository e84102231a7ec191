//! This rank's saved slots: its share at an epoch, in chunk order, so a resume reads it in
//! O(share) instead of walking every position back to epoch 0 (O(share · epoch)).
//!
//! `CACHE/slots/<epoch>.bin`, written just before the state file each epoch (through a
//! temporary renamed into place, so a reader never sees a mix), the last two epochs kept: a
//! resume at epoch E steps again from E-1 (`node::resume`), and the job resumes at the
//! furthest epoch any rank saved, which may be one past this rank's. No fsync (as for
//! `manifest.bin`): a killed daemon's file is in the page cache, and one torn or lost by a
//! power cut fails its length or checksum (or names another epoch) and is walked back
//! instead; with the fsyncs, a 12.5 M share's file held each advance for ~0.7 s.
//!
//! The file is only a shortcut: the plan can always recompute it. So anything short of a
//! file that matches in every field and checksum ([`SlotsKey`], [`SlotsMiss`]) is ignored
//! and the caller walks back. Layout, little-endian:
//!
//! ```text
//! magic "SFSSLOTS" | format u32 | rank u32 | world u32 | reserved u32
//! epoch u64 | samples u64 | seed u64 | fraction bits u64 | plan u64 | length u64
//! length × slot (u64 sample id) | CRC-32C u32 of everything before it
//! ```
//! `plan` is a digest of what else shapes the plan's history (exchange scope, host layout,
//! world sizes over time: `Plan::fingerprint`). Ids are 64-bit so 5·10⁹ samples fit.

use std::fs;
use std::io;
use std::path::Path;

use super::private;

pub use super::own::SLOTS;
use super::own::{is_slots_name, slots_epoch as epoch_of};

const MAGIC: &[u8; 8] = b"SFSSLOTS";
/// Bump when the layout above changes (an older file is then ignored).
const FORMAT: u32 = 1;
const HEADER: usize = 8 + 4 * 4 + 8 * 6;

/// What a saved file must match to be used: the plan's inputs and the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotsKey {
    pub epoch: u64,
    pub rank: u32,
    pub world: u32,
    pub samples: u64,
    pub seed: u64,
    pub fraction_bits: u64,
    pub plan: u64,
}

/// Why a saved file was not used.
#[derive(Debug, thiserror::Error)]
pub enum SlotsMiss {
    #[error("no saved slots for epoch {0}")]
    Missing(u64),
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{0} is cut short or has trailing bytes")]
    Truncated(String),
    #[error("{0} fails its checksum")]
    Corrupt(String),
    #[error("the saved slots of epoch {0} do not fit this rank's chunk")]
    Unfit(u64),
    #[error("{path} was saved for another {field} ({saved}, now {wanted})")]
    Other {
        path: String,
        field: &'static str,
        saved: u64,
        wanted: u64,
    },
}

/// The file of `epoch` under `root`.
fn file_name(epoch: u64) -> String {
    format!("{epoch}.bin")
}

/// The encoded file of `slots` under `key`.
fn encode(key: &SlotsKey, slots: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + slots.len() * 8 + 4);
    out.extend_from_slice(MAGIC);
    for word in [FORMAT, key.rank, key.world, 0] {
        out.extend_from_slice(&word.to_le_bytes());
    }
    let fields = [
        key.epoch,
        key.samples,
        key.seed,
        key.fraction_bits,
        key.plan,
    ];
    for word in fields.into_iter().chain([slots.len() as u64]) {
        out.extend_from_slice(&word.to_le_bytes());
    }
    for &id in slots {
        out.extend_from_slice(&id.to_le_bytes());
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// The slots in `bytes`, if it is a whole file saved under `key`.
fn decode(bytes: &[u8], key: &SlotsKey, path: &str) -> Result<Vec<u64>, SlotsMiss> {
    if bytes.len() < HEADER + 4 {
        return Err(SlotsMiss::Truncated(path.to_string()));
    }
    let len = u64_at(bytes, HEADER - 8);
    let body = usize::try_from(len).ok().and_then(|n| n.checked_mul(8));
    if body.and_then(|b| b.checked_add(HEADER + 4)) != Some(bytes.len()) {
        return Err(SlotsMiss::Truncated(path.to_string()));
    }
    let (data, crc) = bytes.split_at(bytes.len() - 4);
    if &bytes[..8] != MAGIC || crc32c::crc32c(data) != u32_at(crc, 0) {
        return Err(SlotsMiss::Corrupt(path.to_string()));
    }
    let saved = [
        ("format", u64::from(u32_at(bytes, 8)), u64::from(FORMAT)),
        ("rank", u64::from(u32_at(bytes, 12)), u64::from(key.rank)),
        ("world", u64::from(u32_at(bytes, 16)), u64::from(key.world)),
        ("epoch", u64_at(bytes, 24), key.epoch),
        ("samples", u64_at(bytes, 32), key.samples),
        ("seed", u64_at(bytes, 40), key.seed),
        ("fraction", u64_at(bytes, 48), key.fraction_bits),
        ("plan", u64_at(bytes, 56), key.plan),
    ];
    if let Some(&(field, saved, wanted)) = saved.iter().find(|(_, s, w)| s != w) {
        let path = path.to_string();
        return Err(SlotsMiss::Other {
            path,
            field,
            saved,
            wanted,
        });
    }
    let slots: Vec<u64> = (data[HEADER..].chunks_exact(8))
        .map(|w| u64_at(w, 0))
        .collect();
    if slots.iter().any(|&id| id >= key.samples) {
        return Err(SlotsMiss::Corrupt(path.to_string()));
    }
    Ok(slots)
}

/// Saves `slots` (this rank's at `key.epoch`, chunk order) under `root` (see the module docs
/// for why without fsync), then
/// removes the saved files of every other epoch but `key.epoch - 1`.
pub fn save(root: &Path, key: &SlotsKey, slots: &[u64]) -> io::Result<()> {
    let dir = root.join(SLOTS);
    private::create_dir(&dir)?;
    super::replace(&dir, &file_name(key.epoch), &encode(key, slots), false)?;
    prune(&dir, key.epoch)
}

/// Removes the saved files of epochs other than `epoch` and `epoch - 1` (only names this
/// module writes; its stale temporaries too).
fn prune(dir: &Path, epoch: u64) -> io::Result<()> {
    let keep =
        |name: &str| epoch_of(name).is_some_and(|e| e == epoch || Some(e) == epoch.checked_sub(1));
    let left = super::own::remove_files(dir, |name| is_slots_name(name) && !keep(name))?;
    let foreign: Vec<&String> = (left.iter())
        .filter(|n| !keep(n) && !is_slots_name(n))
        .collect();
    if !foreign.is_empty() {
        tracing::debug!(folder = %dir.display(), left = ?foreign, "left files shufflefs did not make");
    }
    Ok(())
}

/// The slots saved under `root` for `key` (chunk order), or why there are none to use.
pub fn load(root: &Path, key: &SlotsKey) -> Result<Vec<u64>, SlotsMiss> {
    let path = root.join(SLOTS).join(file_name(key.epoch));
    let shown = path.display().to_string();
    match fs::read(&path) {
        Ok(bytes) => decode(&bytes, key, &shown),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(SlotsMiss::Missing(key.epoch)),
        Err(source) => Err(SlotsMiss::Io {
            path: shown,
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(epoch: u64) -> SlotsKey {
        SlotsKey {
            epoch,
            rank: 2,
            world: 4,
            samples: 100,
            seed: 7,
            fraction_bits: 0.5f64.to_bits(),
            plan: 9,
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = (fs::read_dir(dir).unwrap())
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn saved_slots_load_back_and_only_the_last_two_epochs_stay() {
        let tmp = tempfile::tempdir().unwrap();
        let slots: Vec<u64> = vec![5, 99, 0, 42];
        for epoch in 0..4 {
            save(tmp.path(), &key(epoch), &slots).unwrap();
        }
        assert_eq!(load(tmp.path(), &key(3)).unwrap(), slots);
        assert_eq!(load(tmp.path(), &key(2)).unwrap(), slots);
        assert!(matches!(
            load(tmp.path(), &key(1)),
            Err(SlotsMiss::Missing(1))
        ));
        assert_eq!(names(&tmp.path().join(SLOTS)), ["2.bin", "3.bin"]);
    }

    #[test]
    fn files_shufflefs_did_not_make_stay() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(SLOTS);
        fs::create_dir_all(&dir).unwrap();
        for name in [
            "notes.txt",
            "1.bin.bak",
            "x.bin",
            ".1.bin.aZ3x9Q.tmp",
            "0.bin",
        ] {
            fs::write(dir.join(name), "x").unwrap();
        }
        save(tmp.path(), &key(5), &[1, 2]).unwrap();
        assert_eq!(names(&dir), ["1.bin.bak", "5.bin", "notes.txt", "x.bin"]);
    }

    #[test]
    fn a_damaged_or_other_file_is_not_used() {
        let tmp = tempfile::tempdir().unwrap();
        save(tmp.path(), &key(3), &[1, 2, 3]).unwrap();
        let path = tmp.path().join(SLOTS).join("3.bin");
        let good = fs::read(&path).unwrap();
        let other = SlotsKey { seed: 8, ..key(3) };
        assert!(matches!(
            load(tmp.path(), &other),
            Err(SlotsMiss::Other { field: "seed", .. })
        ));
        fs::write(&path, &good[..good.len() - 1]).unwrap();
        assert!(matches!(
            load(tmp.path(), &key(3)),
            Err(SlotsMiss::Truncated(_))
        ));
        let mut flipped = good.clone();
        flipped[HEADER + 3] ^= 1;
        fs::write(&path, &flipped).unwrap();
        assert!(matches!(
            load(tmp.path(), &key(3)),
            Err(SlotsMiss::Corrupt(_))
        ));
        // Renamed to another epoch's name: the header says which it is.
        fs::write(tmp.path().join(SLOTS).join("4.bin"), &good).unwrap();
        assert!(matches!(
            load(tmp.path(), &key(4)),
            Err(SlotsMiss::Other { field: "epoch", .. })
        ));
    }

    #[test]
    fn only_our_names_are_slots_files() {
        assert!(is_slots_name("0.bin") && is_slots_name("18446744073709551615.bin"));
        assert!(is_slots_name(".12.bin.aZ3x9Q.tmp") && is_slots_name(".12.bin.tmp"));
        for name in [
            "",
            ".bin",
            "x.bin",
            "1.bin.bak",
            "-1.bin",
            ".x.bin.aZ3x9Q.tmp",
            "1",
        ] {
            assert!(!is_slots_name(name), "{name}");
        }
    }
}
