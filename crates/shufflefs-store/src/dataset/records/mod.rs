//! Packed-record datasets (LIRS, Section 4): many records per file (LIBSVM/CSV lines,
//! fixed-size binary rows, TFRecord, webdataset tar shards), named by an offset table.
//!
//! # Units: records and groups
//! The rest of shufflefs (plan, cache, exchange, views) names units by `SampleId` and asks a
//! [`Dataset`](super::Dataset) for their bytes. Here a unit is a *group*: a run of records of
//! one file that start in the same 4 KiB page of that file (the paper's page-aware shuffling,
//! Figure 6), or, with `--group records`, a single record. Grouping by the page a record
//! *starts* in never splits a record, puts every record in exactly one group, and keeps a
//! group's records contiguous, so a group's bytes are one byte range of one file and need one
//! read. Records of a page or more are their own group either way. A record that straddles a
//! page boundary belongs to the group of the page it starts in, so two neighbouring groups
//! may share one page: at most one page read per group is not saved. A gap (a bad record
//! left out) also ends a group, so a group never includes bytes that are not records.
//!
//! # The offset table (LIRS's location generator)
//! Fixed-size records need no table: a record's place is arithmetic on the file sizes, and
//! so are the groups (see [`Table::Fixed`]). Other framings are indexed by rank 0 in one
//! sequential pass ([`scan`]) into three flat vectors: each record's start (8 bytes), its
//! length (4 bytes: records are at most 2 GiB) and, where groups hold several records, each
//! group's first record (8 bytes per group, at most one per record: record numbers are
//! 64-bit). That is at most 20 bytes per record and no allocation per record (19M records:
//! at most 380 MB, about 240 MB for the kdd layout of 362-byte records, where groups hold
//! ~11 records each). The
//! `SampleStore` keeps about 16 more bytes per *group* (size and source time), not per record.
//!
//! The table is shipped to the other ranks and kept in the cache with the manifest
//! ([`super::Manifest`] carries it); the settings it was built with ([`RecordParams`]) travel
//! with it, so a cached table built with another framing is never reused.

use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::dataset::columns::Words;
use crate::plan::SampleId;

mod lines;
mod pass;
pub mod scan;
pub(crate) mod source;
mod tar;
mod tfrecord;

pub use scan::build_index;
pub use source::RecordSource;

/// Pages are counted in 4 KiB units whatever the host's page size, so every rank groups alike.
pub const PAGE: u64 = 4096;
/// The largest record accepted (2 GiB); longer ones are reported and left out.
pub const MAX_RECORD: u64 = 1 << 31;
/// The end-of-archive marker a tar part ends with: two zero blocks.
pub(crate) const TAR_TRAILER: u64 = 1024;

/// How records are laid out in the source files (`--framing`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Framing {
    /// Records of `--record-size` bytes back to back (epsilon, higgs as binary rows).
    Fixed,
    /// One record per line, `\n`-terminated (LIBSVM/svmlight, CSV, JSON lines).
    #[default]
    Lines,
    /// TFRecord: length, CRC of the length, data, CRC of the data (both CRCs checked).
    Tfrecord,
    /// Tar shards, webdataset style: consecutive members with the same key (the name up to
    /// its first dot) form one record.
    Tar,
}

impl Framing {
    pub fn name(self) -> &'static str {
        match self {
            Framing::Fixed => "fixed",
            Framing::Lines => "lines",
            Framing::Tfrecord => "tfrecord",
            Framing::Tar => "tar",
        }
    }

    /// The part extension when the source files have none.
    fn default_ext(self) -> &'static str {
        match self {
            Framing::Fixed => "bin",
            Framing::Lines => "txt",
            Framing::Tfrecord => "tfrecord",
            Framing::Tar => "tar",
        }
    }
}

/// What the unit of the plan, the exchange and the view order is (`--group`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Grouping {
    /// Records starting in the same 4 KiB page move and are read together (LIRS Figure 6).
    #[default]
    Pages,
    /// Every record is its own unit: the finest shuffle, more page reads for small records.
    Records,
}

/// The settings an index is built with: a cached index is reused only if they match.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordParams {
    pub framing: Framing,
    /// `--record-size` (fixed framing only, else 0).
    pub record_size: u64,
    pub grouping: Grouping,
    /// `--header-line` (lines only): each file's first line is a header, not a record.
    pub header_line: bool,
}

impl RecordParams {
    /// The settings as the command line gives them, for messages.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "--framing {} --group {}",
            self.framing.name(),
            match self.grouping {
                Grouping::Pages => "pages",
                Grouping::Records => "records",
            }
        );
        if self.record_size > 0 {
            s += &format!(" --record-size {}", self.record_size);
        }
        if self.header_line {
            s += " --header-line";
        }
        s
    }
}

/// A source file of records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordFile {
    /// Relative to the source folder; empty when the source is this one file.
    pub name: String,
    pub len: u64,
    /// Index of its first record and first group (files are in name order).
    pub first_record: u64,
    pub first_group: u64,
    /// Lines framing: the last line has no `\n` (a view adds one, so records stay apart).
    pub no_final_newline: bool,
}

/// Where each record lies (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Table {
    /// Records of `RecordParams::record_size` bytes from offset 0 of every file.
    Fixed,
    /// The offset table of one sequential pass.
    Offsets {
        starts: Words<u64>,
        lens: Words<u32>,
        /// Each group's first record; `None` when every group is one record.
        group_first: Option<Words<u64>>,
    },
}

/// The index of a record source: files, records, groups.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordIndex {
    pub params: RecordParams,
    pub files: Vec<RecordFile>,
    pub table: Table,
    records: u64,
    groups: u64,
    /// `--header-line`: the header (with its `\n`) repeated at the top of every part.
    pub header: Vec<u8>,
    /// Extension of the parts (`part-00000.<ext>`).
    pub ext: String,
}

/// Where a group's bytes lie: one contiguous range of one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub file: u32,
    pub start: u64,
    pub end: u64,
}

impl RecordIndex {
    pub fn records(&self) -> u64 {
        self.records
    }

    pub fn groups(&self) -> u64 {
        self.groups
    }

    /// The file holding record/group `i`, given each file's first index.
    fn file_of(&self, i: u64, first: impl Fn(&RecordFile) -> u64) -> u32 {
        (self.files.partition_point(|f| first(f) <= i) - 1) as u32
    }

    /// Records in fixed-size file `f`.
    fn fixed_count(&self, f: usize) -> u64 {
        let end = self
            .files
            .get(f + 1)
            .map_or(self.records, |n| n.first_record);
        end - self.files[f].first_record
    }

    /// Record `r`'s file, start and length.
    pub(crate) fn record(&self, r: u64) -> (u32, u64, u64) {
        match &self.table {
            Table::Fixed => {
                let f = self.file_of(r, |f| f.first_record);
                let size = self.params.record_size;
                let local = r - self.files[f as usize].first_record;
                (f, local * size, size)
            }
            Table::Offsets { starts, lens, .. } => {
                let f = self.file_of(r, |f| f.first_record);
                (f, starts.at(r as usize), u64::from(lens.at(r as usize)))
            }
        }
    }

    /// The records of group `g`.
    pub fn group_records(&self, g: SampleId) -> Range<u64> {
        match &self.table {
            Table::Fixed => {
                let f = self.file_of(g, |f| f.first_group) as usize;
                let (size, file) = (self.params.record_size, &self.files[f]);
                let p = g - file.first_group;
                let n = self.fixed_count(f);
                let local = if fixed_one_per_group(&self.params) {
                    p..p + 1
                } else {
                    // Records starting in page p: ceil(p*PAGE/size) .. ceil((p+1)*PAGE/size).
                    (p * PAGE).div_ceil(size)..((p + 1) * PAGE).div_ceil(size).min(n)
                };
                file.first_record + local.start..file.first_record + local.end
            }
            Table::Offsets {
                group_first: Some(first),
                ..
            } => {
                let end = first.get(g as usize + 1).unwrap_or(self.records);
                first.at(g as usize)..end
            }
            Table::Offsets { .. } => g..g + 1,
        }
    }

    /// Where group `g`'s bytes lie (a group's records are contiguous in one file).
    pub fn span(&self, g: SampleId) -> Span {
        let rs = self.group_records(g);
        match &self.table {
            Table::Offsets { starts, lens, .. } => {
                let last = rs.end as usize - 1;
                Span {
                    file: self.file_of(rs.start, |f| f.first_record),
                    start: starts.at(rs.start as usize),
                    end: starts.at(last) + u64::from(lens.at(last)),
                }
            }
            Table::Fixed => {
                let (file, start, _) = self.record(rs.start);
                Span {
                    file,
                    start,
                    end: start + (rs.end - rs.start) * self.params.record_size,
                }
            }
        }
    }

    /// Group `g`'s size in bytes.
    pub fn group_len(&self, g: SampleId) -> u64 {
        let s = self.span(g);
        s.end - s.start
    }

    /// Whether a view must add `\n` after group `g` (the last line of its file had none).
    pub fn needs_newline(&self, g: SampleId) -> bool {
        if self.params.framing != Framing::Lines {
            return false;
        }
        let f = self.file_of(g, |f| f.first_group) as usize;
        let last = self.files.get(f + 1).map_or(self.groups, |n| n.first_group) - 1;
        g == last && self.files[f].no_final_newline
    }

    /// Bytes every part ends with (tar: the end-of-archive blocks).
    pub fn trailer_len(&self) -> u64 {
        match self.params.framing {
            Framing::Tar => TAR_TRAILER,
            _ => 0,
        }
    }

    /// The path of file `f` under `source` (the source itself when it is one file).
    pub(crate) fn path(&self, source: &Path, f: u32) -> PathBuf {
        let name = &self.files[f as usize].name;
        if name.is_empty() {
            source.to_path_buf()
        } else {
            source.join(name)
        }
    }

    /// Bytes of memory the table takes of its own (what the 16-bytes-per-record budget
    /// counts; none when it lies in a mapping shared by the host's ranks).
    pub fn table_bytes(&self) -> usize {
        match &self.table {
            Table::Fixed => 0,
            Table::Offsets {
                starts,
                lens,
                group_first,
            } => {
                starts.owned_bytes()
                    + lens.owned_bytes()
                    + group_first.as_ref().map_or(0, Words::owned_bytes)
            }
        }
    }

    /// Whether the offset table lies in a mapping (see `dataset::columns`).
    #[cfg(any(test, feature = "testing"))]
    pub fn table_mapped(&self) -> bool {
        matches!(&self.table, Table::Offsets { starts, .. } if starts.is_mapped())
    }

    /// Checks an index decoded from the cache or a peer: every lookup stays in bounds.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if !self.files_consistent() {
            return Err("record files are inconsistent".into());
        }
        match &self.table {
            Table::Fixed => self.validate_fixed(),
            Table::Offsets {
                starts,
                lens,
                group_first,
            } => self.validate_offsets(starts, lens, group_first.as_ref()),
        }
    }

    /// Files start at record and group 0, in order, each below the totals, with safe names.
    fn files_consistent(&self) -> bool {
        let files = &self.files;
        files
            .first()
            .is_some_and(|f| f.first_record == 0 && f.first_group == 0)
            && files.windows(2).all(|w| {
                w[0].first_record <= w[1].first_record && w[0].first_group < w[1].first_group
            })
            && files
                .last()
                .is_some_and(|f| f.first_record < self.records && f.first_group < self.groups)
            && files
                .iter()
                .all(|f| f.name.is_empty() || is_relative_name(&f.name))
    }

    fn validate_fixed(&self) -> Result<(), String> {
        let size = self.params.record_size;
        if size == 0 || size > MAX_RECORD {
            return Err("fixed record size out of range".into());
        }
        for (f, file) in self.files.iter().enumerate() {
            let n = self.fixed_count(f);
            let groups =
                self.files.get(f + 1).map_or(self.groups, |n| n.first_group) - file.first_group;
            if n == 0 || n * size > file.len || groups != fixed_groups(&self.params, n) {
                return Err("fixed record counts are inconsistent".into());
            }
        }
        Ok(())
    }

    fn validate_offsets(
        &self,
        starts: &Words<u64>,
        lens: &Words<u32>,
        group_first: Option<&Words<u64>>,
    ) -> Result<(), String> {
        if starts.len() != self.records as usize || lens.len() != starts.len() {
            return Err("offset table is inconsistent".into());
        }
        // Values the host's first rank checked in the mapping it shares are not read again
        // (`columns::checked_elsewhere`): only the counts and the files are.
        let each = !starts.checked_elsewhere();
        let groups_ok = match group_first {
            Some(g) => {
                g.len() == self.groups as usize
                    && g.first() == Some(0)
                    && (!each || g.iter().zip(g.iter().skip(1)).all(|(a, b)| a < b))
                    && g.last().is_some_and(|l| l < self.records)
            }
            None => self.groups == self.records,
        };
        if !groups_ok {
            return Err("group table is inconsistent".into());
        }
        for (f, file) in self.files.iter().enumerate() {
            let next = self.files.get(f + 1);
            let records = file.first_record..next.map_or(self.records, |n| n.first_record);
            if records.is_empty() {
                return Err("a record file without records".into());
            }
            // A file's first group starts at its first record: no group spans files.
            let group_start = match group_first {
                Some(g) => g.at(file.first_group as usize),
                None => file.first_group,
            };
            if group_start != file.first_record {
                return Err("a group spans two files".into());
            }
            for r in records.filter(|_| each) {
                let (start, len) = (starts.at(r as usize), u64::from(lens.at(r as usize)));
                if start.checked_add(len).is_none_or(|end| end > file.len) {
                    return Err("a record lies outside its file".into());
                }
            }
        }
        Ok(())
    }
}

/// A file name inside the source folder: one safe component.
fn is_relative_name(name: &str) -> bool {
    super::names::is_safe_name(name.as_bytes())
}

/// Whether fixed-size records are one per group (`--group records`, or a page or more each).
fn fixed_one_per_group(p: &RecordParams) -> bool {
    p.grouping == Grouping::Records || p.record_size >= PAGE
}

/// Groups of a fixed-size file of `n` records: one per page a record starts in.
fn fixed_groups(p: &RecordParams, n: u64) -> u64 {
    if fixed_one_per_group(p) {
        n
    } else {
        // With records under a page every page up to the last record's start holds a start.
        (n - 1) * p.record_size / PAGE + 1
    }
}

#[cfg(test)]
mod tests;
