//! Each sample's size as the manifest keeps it: plus one, 0 for unknown.
//!
//! A scan stats no sample (see the manifest's docs), so a scanned manifest's sizes are all
//! unknown: kept as a `Vec<u64>` they cost 8 bytes per sample of the dataset on every rank
//! (8 MB at 10^6 files, a third of the decoded manifest) to say nothing. [`SizeColumn`]
//! keeps such a column as its length alone and becomes an array at the first known size.
//! Its encoding is the array's, so manifests and their fingerprints are what they were.

use std::fmt;

use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Sizes plus one (0: unknown), one per sample; all-unknown columns hold no array.
#[derive(Clone, Debug, Default)]
pub(crate) struct SizeColumn {
    len: usize,
    /// `None` while every size is unknown.
    known: Option<Vec<u64>>,
}

impl SizeColumn {
    /// No samples (a `const`, for the empty tables of a record source).
    pub(crate) const EMPTY: SizeColumn = SizeColumn {
        len: 0,
        known: None,
    };

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sample `i`'s size plus one (0: unknown).
    pub(crate) fn get(&self, i: usize) -> u64 {
        assert!(i < self.len, "size {i} of a column of {}", self.len);
        self.known.as_ref().map_or(0, |k| k[i])
    }

    pub(crate) fn push(&mut self, plus_one: u64) {
        match (&mut self.known, plus_one) {
            (Some(k), v) => k.push(v),
            (None, 0) => {}
            (None, v) => {
                let mut k = vec![0; self.len];
                k.push(v);
                self.known = Some(k);
            }
        }
        self.len += 1;
    }

    pub(crate) fn shrink_to_fit(&mut self) {
        if let Some(k) = &mut self.known {
            k.shrink_to_fit();
        }
    }

    fn iter(&self) -> impl ExactSizeIterator<Item = u64> + '_ {
        (0..self.len).map(|i| self.get(i))
    }
}

impl Extend<u64> for SizeColumn {
    fn extend<I: IntoIterator<Item = u64>>(&mut self, iter: I) {
        for v in iter {
            self.push(v);
        }
    }
}

/// Equal when every sample's size is: an array of zeros equals no array.
impl PartialEq for SizeColumn {
    fn eq(&self, other: &SizeColumn) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl Serialize for SizeColumn {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for SizeColumn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<SizeColumn, D::Error> {
        struct Column;
        impl<'de> Visitor<'de> for Column {
            type Value = SizeColumn;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a sequence of sizes")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<SizeColumn, A::Error> {
                let mut column = SizeColumn::default();
                while let Some(v) = seq.next_element::<u64>()? {
                    column.push(v);
                }
                Ok(column)
            }
        }
        d.deserialize_seq(Column)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_column_encodes_as_the_array_it_stands_for() {
        for values in [vec![], vec![0, 0, 0], vec![0, 5, 0, 1 << 40], vec![3]] {
            let mut column = SizeColumn::default();
            column.extend(values.iter().copied());
            let bytes = postcard::to_allocvec(&column).unwrap();
            assert_eq!(bytes, postcard::to_allocvec(&values).unwrap());
            let back: SizeColumn = postcard::from_bytes(&bytes).unwrap();
            assert_eq!(back, column);
            assert_eq!(back.known.is_none(), values.iter().all(|&v| v == 0));
            let got: Vec<u64> = (0..back.len()).map(|i| back.get(i)).collect();
            assert_eq!(got, values);
        }
    }

    #[test]
    fn zeros_are_equal_to_no_array() {
        let mut dense = SizeColumn::default();
        dense.extend([7, 0]);
        let mut zeros = dense.clone();
        zeros.known = Some(vec![0, 0]);
        let mut none = SizeColumn::default();
        none.extend([0, 0]);
        assert_eq!(zeros, none);
        assert_ne!(dense, none);
    }
}
