//! Owners and modes of a source's folders and samples, for a view other users may see
//! (`--allow-other`).
//!
//! A view must never let a user read or list what the source would not let them. Under
//! `--allow-other` the scan `stat`s every class folder (every folder of a tree) and
//! every sample, and keeps, per entry, who may read it ([`Owner`]: the owner, the group
//! and the classes of users that may read). Without `--allow-other` the scan stays
//! stat-free and nothing here is made: only the mounting user sees the view.
//!
//! The manifest reaches every rank whole (listed by all ranks together and combined, or
//! scanned by rank 0 and shipped), and a rank never opens the source file of a sample a
//! peer sent it, so the owners travel in the manifest ([`Owners`]):
//! the distinct owners once, in a small table, and an index into it per folder and per
//! sample (two bytes each: a few owners and modes cover a dataset). Its encoding is a
//! footer the manifest's fingerprint leaves out (see `manifest`), so a cache keeps
//! belonging to the same data whatever the modes are, and a manifest without it decodes
//! as before.
//!
//! The rules, conservative where the source's would need more than a mode to express:
//! - a folder may be listed by a class of users only if the source grants it read **and**
//!   search (`r-x`); a file may be read by a class if the source grants it read;
//! - a link inside the source shows its target's owner and mode, less what the folders
//!   between the source and the target deny ([`search_classes`]): it must not reach a file
//!   in a folder the reader could not enter on the source. A link out of the source is
//!   not served at all (the scan skips it).

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::dataset::footer;

/// Who may read one entry: its owner and group, and the read bits (`0o444` at most) of the
/// classes of users that may read it (a file) or list and enter it (a folder).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
    pub read: u16,
}

impl Owner {
    /// The owner of an entry with owner `uid`, group `gid` and mode `mode`: a folder's
    /// class may read if `mode` grants it read and search, a file's if it grants read.
    pub fn of(uid: u32, gid: u32, mode: u32, is_dir: bool) -> Owner {
        Owner {
            uid,
            gid,
            read: readers(mode, is_dir),
        }
    }

    /// The owner of `meta`'s entry.
    pub(crate) fn of_meta(meta: &std::fs::Metadata) -> Owner {
        Owner::of(meta.uid(), meta.gid(), meta.mode(), meta.is_dir())
    }

    /// Mode bits for a view file: read only.
    pub fn file_perm(self) -> u16 {
        self.read
    }

    /// Mode bits for a view folder: read implies search (a folder one may list, one may
    /// enter).
    pub fn dir_perm(self) -> u16 {
        self.read | (self.read >> 2)
    }

    /// Whether a file read as `self` lets read everyone a view showing `shown` lets read:
    /// same owner and group, and read granted to at least `shown`'s classes.
    pub fn covers(self, shown: Owner) -> bool {
        self.uid == shown.uid && self.gid == shown.gid && self.read & shown.read == shown.read
    }

    /// `self`, readable only by the classes in `classes` (bits 0o100 owner, 0o010 group,
    /// 0o001 others, as [`search_classes`] gives them).
    pub fn reachable_by(self, classes: u32) -> Owner {
        Owner {
            read: self.read & (classes * 0o4) as u16,
            ..self
        }
    }
}

/// The read bits (`0o444` at most) of the classes `mode` lets read a file, or list and
/// enter a folder (`is_dir`).
pub fn readers(mode: u32, is_dir: bool) -> u16 {
    // Per class of users (shift 6: owner, 3: group, 0: others), whether it may read.
    let needed = if is_dir { 0o5 } else { 0o4 };
    let mut read = 0;
    for shift in [6, 3, 0] {
        if (mode >> shift) & needed == needed {
            read |= 0o4 << shift;
        }
    }
    read
}

/// A folder's owner, group and mode.
pub type Folder = (u32, u32, u32);

/// Which classes of users of an entry owned by `uid`/`gid` (bits 0o100 owner, 0o010
/// group, 0o001 others) may search every folder of `above` (each as owner, group, mode).
///
/// Who a class's member is to a folder of another owner or group is not known (the
/// entry's group member may own the folder, or not be in its group), so a class keeps
/// search only if every set of bits that may apply to its members grants it.
pub fn search_classes(uid: u32, gid: u32, above: &[Folder]) -> u32 {
    let mut classes = 0o111;
    for &(dir_uid, dir_gid, mode) in above {
        let x = |shift: u32| (mode >> shift) & 1 == 1;
        let (owner_x, group_x, other_x) = (x(6), x(3), x(0));
        // Anyone but the entry's owner may be this folder's owner, if the entry's is not.
        let as_owner_ok = dir_uid == uid || owner_x;
        let entry_owner = if dir_uid == uid {
            owner_x
        } else {
            group_x && other_x
        };
        let (group, others) = if dir_gid == gid {
            (group_x, other_x)
        } else {
            (group_x && other_x, group_x && other_x)
        };
        let allowed = u32::from(entry_owner) << 6
            | u32::from(as_owner_ok && group) << 3
            | u32::from(as_owner_ok && others);
        classes &= allowed;
    }
    classes
}

/// Why a link out of the source is skipped (under `--allow-other`).
pub(crate) const OUTSIDE: &str = "symlink out of the source (not served under --allow-other: \
     other users would read a file the source does not hold; copy it into the source)";

/// The owner of the entry at `path` (under the source's canonical `root`), following a
/// link: `Err(reason)` for a link out of the source, or one that cannot be followed. A
/// link's target is reachable only by the classes that may search every folder between
/// `root` and it.
pub(crate) fn of_path(root: &Path, path: &Path, is_link: bool) -> Result<Owner, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot stat: {e}"))?;
    let owner = Owner::of_meta(&meta);
    if !is_link {
        return Ok(owner);
    }
    let target = std::fs::canonicalize(path).map_err(|e| format!("cannot follow: {e}"))?;
    if !target.starts_with(root) {
        return Err(OUTSIDE.into());
    }
    let mut between = Vec::new();
    for dir in target.ancestors().skip(1) {
        if dir == root {
            break;
        }
        let m =
            std::fs::metadata(dir).map_err(|e| format!("cannot stat {}: {e}", dir.display()))?;
        between.push((m.uid(), m.gid(), m.mode()));
    }
    Ok(owner.reachable_by(search_classes(owner.uid, owner.gid, &between)))
}

/// The owners of a manifest's folders (its classes), samples and side files: indices into
/// `table`, the distinct owners.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owners {
    table: Vec<Owner>,
    class: Vec<u16>,
    sample: Vec<u16>,
    side: Vec<u16>,
}

impl Owners {
    fn at(&self, i: u16) -> Owner {
        self.table[i as usize]
    }

    /// The owner of folder (class) `c`.
    pub fn class(&self, c: u32) -> Owner {
        self.at(self.class[c as usize])
    }

    /// The owner of sample `id`.
    pub fn sample(&self, id: u64) -> Owner {
        self.at(self.sample[id as usize])
    }

    /// The owner of side file `i`.
    pub fn side(&self, i: u32) -> Owner {
        self.at(self.side[i as usize])
    }

    /// Whether it covers exactly `classes`, `samples` and `sides` entries, each with an
    /// owner in the table.
    pub(crate) fn fits(&self, classes: usize, samples: usize, sides: usize) -> bool {
        let n = self.table.len();
        self.class.len() == classes
            && self.sample.len() == samples
            && self.side.len() == sides
            && (self.class.iter().chain(&self.sample).chain(&self.side)).all(|&i| (i as usize) < n)
    }

    /// These owners with the side files' replaced by `sides` (interned anew).
    pub(crate) fn with_sides(self, sides: impl IntoIterator<Item = Owner>) -> Owners {
        let mut b = OwnersBuilder::from(self);
        b.owners.side.clear();
        for o in sides {
            let i = b.intern(o);
            b.owners.side.push(i);
        }
        b.finish()
    }

    pub(crate) fn shrink_to_fit(&mut self) {
        self.class.shrink_to_fit();
        self.sample.shrink_to_fit();
    }
}

/// Builds [`Owners`], folder by folder, interning each distinct owner once. Past 65535
/// distinct owners, further ones are shown as the first (the scanning user's alone, read
/// by nobody else): never more than the source grants.
pub(crate) struct OwnersBuilder {
    owners: Owners,
    index: HashMap<Owner, u16>,
}

impl OwnersBuilder {
    /// A builder whose fallback owner is the user running the scan, reading alone.
    pub(crate) fn new() -> OwnersBuilder {
        let me = Owner {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            read: 0o400,
        };
        let mut b = OwnersBuilder {
            owners: Owners::default(),
            index: HashMap::new(),
        };
        b.intern(me);
        b
    }

    fn intern(&mut self, o: Owner) -> u16 {
        if let Some(&i) = self.index.get(&o) {
            return i;
        }
        let Ok(i) = u16::try_from(self.owners.table.len()) else {
            return 0;
        };
        if i == u16::MAX {
            return 0;
        }
        self.owners.table.push(o);
        self.index.insert(o, i);
        i
    }

    pub(crate) fn push_class(&mut self, o: Owner) {
        let i = self.intern(o);
        self.owners.class.push(i);
    }

    pub(crate) fn push_samples(&mut self, owners: &[Owner]) {
        self.owners.sample.reserve(owners.len());
        for &o in owners {
            let i = self.intern(o);
            self.owners.sample.push(i);
        }
    }

    pub(crate) fn finish(mut self) -> Owners {
        self.owners.shrink_to_fit();
        self.owners
    }
}

impl From<Owners> for OwnersBuilder {
    fn from(owners: Owners) -> OwnersBuilder {
        let index = (owners.table.iter().enumerate())
            .map(|(i, &o)| (o, i as u16))
            .collect();
        OwnersBuilder { owners, index }
    }
}

/// Ends a manifest that carries owners: found from the end, outside everything the
/// fingerprint covers.
const MAGIC: &[u8; 8] = b"\xffSFOWNR1";

/// `bytes` with the footer of `owners` appended (see `footer`).
pub(crate) fn encode(bytes: Vec<u8>, owners: Option<&Owners>) -> Vec<u8> {
    match owners {
        Some(owners) => footer::append(bytes, owners, MAGIC),
        None => bytes,
    }
}

/// The bytes before the footer, and the owners in it (`None` without a footer); `Err`
/// for a corrupt footer.
pub(crate) fn decode(bytes: &[u8]) -> Result<(&[u8], Option<Owners>), String> {
    footer::split(bytes, MAGIC).map_err(|_| "the owners footer is corrupt".to_string())
}

/// The part of an encoded manifest its fingerprint covers: all but the owners' footer.
pub(crate) fn without_footer(bytes: &[u8]) -> &[u8] {
    decode(bytes).map_or(bytes, |(rest, _)| rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(mode: u32, is_dir: bool) -> (u16, u16) {
        let o = Owner::of(7, 8, mode, is_dir);
        (o.file_perm(), o.dir_perm())
    }

    #[test]
    fn a_folder_grants_who_may_list_and_enter_it() {
        assert_eq!(of(0o755, true), (0o444, 0o555));
        assert_eq!(of(0o700, true), (0o400, 0o500));
        assert_eq!(of(0o750, true), (0o440, 0o550));
        // Search without read, or read without search: not enough to reach a file by name.
        assert_eq!(of(0o711, true), (0o400, 0o500));
        assert_eq!(of(0o744, true), (0o400, 0o500));
        assert_eq!(of(0o40755, true), (0o444, 0o555));
    }

    #[test]
    fn a_file_grants_who_may_read_it() {
        assert_eq!(of(0o644, false), (0o444, 0o555));
        assert_eq!(of(0o600, false), (0o400, 0o500));
        assert_eq!(of(0o640, false), (0o440, 0o550));
    }

    #[test]
    fn a_folder_above_that_others_cannot_search_hides_the_entry() {
        let (alice, staff, root) = (1000, 100, 0);
        // /data (root 0755) above a dataset of alice's: nothing hidden.
        assert_eq!(
            search_classes(alice, staff, &[(root, root, 0o40755)]),
            0o111
        );
        // /home/alice (alice 0700): only alice passes.
        let home = (alice, staff, 0o40700);
        assert_eq!(
            search_classes(alice, staff, &[home, (root, root, 0o755)]),
            0o100
        );
        // 0710 of the entry's group: the group passes too, others not.
        assert_eq!(
            search_classes(alice, staff, &[(alice, staff, 0o710)]),
            0o110
        );
        // 0710 of another group: members of the entry's group may not be in it.
        assert_eq!(search_classes(alice, staff, &[(alice, 7, 0o710)]), 0o100);
        // Root's 0700 folder above alice's dataset: nobody but root.
        assert_eq!(search_classes(alice, staff, &[(root, root, 0o700)]), 0);
        // 1777 (/tmp): everyone.
        assert_eq!(
            search_classes(alice, staff, &[(root, root, 0o41777)]),
            0o111
        );
        let o = Owner::of(alice, staff, 0o755, true).reachable_by(0o100);
        assert_eq!((o.file_perm(), o.dir_perm()), (0o400, 0o500));
    }

    #[test]
    fn owners_are_interned_and_their_footer_round_trips() {
        let mut b = OwnersBuilder::new();
        let public = Owner::of(1, 2, 0o755, true);
        b.push_class(public);
        b.push_class(public);
        b.push_samples(&[Owner::of(1, 2, 0o600, false), Owner::of(1, 2, 0o644, false)]);
        let owners = b.finish();
        // The fallback, and two owners: a 0755 folder and a 0644 file read alike.
        assert_eq!(owners.table.len(), 3);
        assert_eq!(owners.class(1), public);
        assert_eq!(owners.sample(0).file_perm(), 0o400);
        assert!(owners.fits(2, 2, 0) && !owners.fits(2, 3, 0));
        let bytes = encode(b"abc".to_vec(), Some(&owners));
        assert_eq!(without_footer(&bytes), b"abc");
        assert_eq!(decode(&bytes).unwrap(), (&b"abc"[..], Some(owners)));
        assert_eq!(encode(b"abc".to_vec(), None), b"abc");
        assert_eq!(decode(b"abc").unwrap(), (&b"abc"[..], None));
        let mut cut = bytes.clone();
        cut.remove(4);
        assert!(decode(&cut).is_err());
    }

    #[test]
    fn past_the_table_owners_fall_back_to_the_scanning_users_alone() {
        let mut b = OwnersBuilder::new();
        let many: Vec<Owner> = (0..70_000).map(|u| Owner::of(u, 0, 0o644, false)).collect();
        b.push_samples(&many);
        let owners = b.finish();
        assert_eq!(owners.table.len(), u16::MAX as usize);
        assert_eq!(owners.sample(10), many[10]);
        assert_eq!(owners.sample(69_999).read, 0o400);
        assert_eq!(owners.sample(69_999).uid, nix::unistd::getuid().as_raw());
    }
}
