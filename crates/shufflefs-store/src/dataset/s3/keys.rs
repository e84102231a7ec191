//! Which keys under the prefix can be files in the view. A bucket holds any UTF-8 key up to
//! 1,024 bytes; a file path cannot have an empty component (`a//b`), a `.` or `..` one, a
//! NUL or a component over 255 bytes, and a control character (a tab, a newline) in a name
//! breaks every tool that prints it. Such keys are skipped, counted and the first
//! [`NAMED`] named in the status (`skipped`) and in one log line: one odd key never fails a
//! mount of a million good ones.
//!
//! Folder markers (a key ending in '/', the empty "folder" objects consoles and sync tools
//! write) are not samples and not skipped either: they are ignored, as a zero-byte key
//! whose name is also a folder of other keys is (`list` decides that one, once it has seen
//! every key).

use crate::dataset::names::Skipped;

/// Unusable keys named one by one; the rest are counted in one more entry.
pub(crate) const NAMED: usize = 20;

/// Why `relative` (a key with the prefix taken off) cannot be a path in the view, if so.
pub(crate) fn unusable(relative: &str) -> Option<&'static str> {
    for part in relative.split('/') {
        let why = match part {
            "" => "an empty path component ('//' or a leading '/')",
            "." | ".." => "a '.' or '..' path component",
            _ if part.len() > 255 => "a path component over 255 bytes",
            _ if part.chars().any(char::is_control) => {
                "a control character (tab, newline, NUL, ...)"
            }
            _ => continue,
        };
        return Some(why);
    }
    None
}

/// Whether `relative` is a folder marker by its name alone (ends in '/').
pub(crate) fn is_marker(relative: &str) -> bool {
    relative.ends_with('/')
}

/// `key` printable on one line: control characters as `\u{..}` escapes.
pub(crate) fn shown(key: &str) -> String {
    key.chars()
        .map(|c| match c.is_control() {
            true => c.escape_unicode().to_string(),
            false => c.to_string(),
        })
        .collect()
}

/// The unusable keys of one listing: the first [`NAMED`], and how many in all.
#[derive(Default)]
pub(crate) struct Unusable {
    /// The smallest keys seen, sorted, with their entries.
    named: Vec<(String, Skipped)>,
    count: usize,
}

impl Unusable {
    /// Counts `key`; the [`NAMED`] smallest keys are named (the first of a listing in
    /// key order, whatever order the keys come in).
    pub(crate) fn add(&mut self, key: &str, reason: &str) {
        self.count += 1;
        let at = self.named.partition_point(|(k, _)| k.as_str() < key);
        if at < NAMED {
            let why = format!("not usable as a file path: {reason}");
            let skipped = Skipped {
                path: shown(key),
                reason: why,
            };
            self.named.insert(at, (key.to_string(), skipped));
            self.named.truncate(NAMED);
        }
    }

    /// The entries for the status's `skipped` list (one more for those not named), after
    /// one log line for them all.
    pub(crate) fn into_skipped(self, source: &str) -> Vec<Skipped> {
        let Unusable { named, count } = self;
        let mut named: Vec<Skipped> = named.into_iter().map(|(_, s)| s).collect();
        if count == 0 {
            return named;
        }
        let names: Vec<&str> = named.iter().map(|s| s.path.as_str()).collect();
        tracing::warn!(
            source,
            count,
            first = ?names,
            "keys that cannot be file paths skipped (empty, '.' or '..' components, control characters)"
        );
        if count > named.len() {
            named.push(Skipped {
                path: format!("({} more keys)", count - named.len()),
                reason: "not usable as file paths either; the first are named above".into(),
            });
        }
        named
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_cannot_be_paths_are_told_apart() {
        for good in [
            "a/1.jpg",
            "a b/c+d~[1]%.jpg",
            "x",
            "é/ü",
            "a/.hidden",
            "a/..b",
        ] {
            assert_eq!(unusable(good), None, "{good:?}");
        }
        for bad in [
            "a//x", "../y", "a/./b", "a/..", "/a", "t\tab", "a/b\nc", "nul\0", "del\x7f",
            "a/", // a marker too, but unusable as a sample name
        ] {
            assert!(unusable(bad).is_some(), "{bad:?}");
        }
        assert!(unusable(&"n".repeat(256)).is_some());
        assert!(unusable(&"n".repeat(255)).is_none());
        assert!(is_marker("cls/") && !is_marker("cls"));
        assert_eq!(shown("t\tab\0"), "t\\u{9}ab\\u{0}");
    }

    #[test]
    fn only_the_first_unusable_keys_are_named_and_the_rest_counted() {
        let mut bad = Unusable::default();
        for i in 0..25 {
            bad.add(&format!("p/a//{i}"), "an empty path component");
        }
        let skipped = bad.into_skipped("s3://b/p");
        assert_eq!(skipped.len(), NAMED + 1);
        assert_eq!(skipped[0].path, "p/a//0");
        assert_eq!(skipped[NAMED].path, "(5 more keys)");
        assert!(Unusable::default().into_skipped("s3://b/p").is_empty());
        // Listed in ranges, keys come in any order: the smallest are named all the same.
        let mut shuffled = Unusable::default();
        for i in (0..25).rev() {
            shuffled.add(&format!("p/a//{i:02}"), "an empty path component");
        }
        let skipped = shuffled.into_skipped("s3://b/p");
        let paths: Vec<&str> = skipped.iter().map(|s| s.path.as_str()).collect();
        assert_eq!(paths[..3], ["p/a//00", "p/a//01", "p/a//02"]);
        assert_eq!(paths[NAMED - 1], "p/a//19");
    }
}
