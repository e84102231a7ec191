//! ImageFolder test datasets in a temp folder, whose bytes are a pure function of (file,
//! offset) so any read can be checked without keeping the data.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

/// The expected bytes `offset..offset+len` of the file with key `key`.
pub fn expected_bytes(key: u32, offset: u64, len: u64) -> Vec<u8> {
    (offset..offset + len)
        .map(|o| shufflefs::dataset::synthetic_byte(u64::from(key), o))
        .collect()
}

/// One sample file of a test dataset.
#[derive(Clone, Debug)]
pub struct Sample {
    pub class: String,
    pub name: String,
    /// Determines the content: byte `o` is `synthetic_byte(key, o)`.
    pub key: u32,
    pub size: u64,
}

impl Sample {
    /// `<class>/<name>`, relative to the dataset root or to an `epoch-N/` folder.
    pub fn rel(&self) -> PathBuf {
        Path::new(&self.class).join(&self.name)
    }

    pub fn bytes(&self) -> Vec<u8> {
        expected_bytes(self.key, 0, self.size)
    }

    /// The expected result of reading up to `len` bytes at `offset`.
    pub fn range(&self, offset: u64, len: u64) -> Vec<u8> {
        let start = offset.min(self.size);
        let end = offset.saturating_add(len).min(self.size);
        expected_bytes(self.key, start, end - start)
    }
}

#[derive(Default)]
pub struct DatasetBuilder {
    classes: Vec<(String, Vec<(String, u64)>)>,
    dangling: Vec<(String, String)>,
    nested: Vec<(String, String)>,
}

impl DatasetBuilder {
    pub fn new() -> DatasetBuilder {
        DatasetBuilder::default()
    }

    /// A class folder holding `files` as `(name, size)`; an empty slice makes an empty class.
    pub fn class(mut self, name: &str, files: &[(&str, u64)]) -> DatasetBuilder {
        self.classes.push((
            name.to_string(),
            files.iter().map(|&(n, s)| (n.to_string(), s)).collect(),
        ));
        self
    }

    pub fn empty_class(self, name: &str) -> DatasetBuilder {
        self.class(name, &[])
    }

    /// A class of `count` files with long-ish names, so listings span several kernel buffers.
    pub fn numbered_class(
        mut self,
        name: &str,
        count: usize,
        size: impl Fn(usize) -> u64,
    ) -> DatasetBuilder {
        self.classes.push((
            name.to_string(),
            (0..count)
                .map(|i| {
                    (
                        format!("sample-with-a-rather-long-name-{i:05}.jpg"),
                        size(i),
                    )
                })
                .collect(),
        ));
        self
    }

    /// A symlink `class/name` pointing at nothing.
    pub fn dangling_link(mut self, class: &str, name: &str) -> DatasetBuilder {
        self.dangling.push((class.to_string(), name.to_string()));
        self
    }

    /// A sub-folder inside a class folder (not a sample; the scan skips it).
    pub fn nested_folder(mut self, class: &str, name: &str) -> DatasetBuilder {
        self.nested.push((class.to_string(), name.to_string()));
        self
    }

    pub fn build(self) -> Dataset {
        let tmp = tempfile::Builder::new()
            .prefix("shufflefs-test-")
            .tempdir()
            .expect("create a temp folder");
        let base = fs::canonicalize(tmp.path()).expect("canonicalize the temp folder");
        // Views show who may reach the source (`vfs::access`): a 0700 temp folder above it
        // would make every view 0400/0500.
        fs::set_permissions(&base, fs::Permissions::from_mode(0o755)).expect("chmod 0755");
        let root = base.join("src");
        fs::create_dir(&root).expect("create the source folder");
        let mut samples = Vec::new();
        let mut classes = Vec::new();
        for (class, files) in &self.classes {
            fs::create_dir_all(root.join(class)).expect("create a class folder");
            classes.push(class.clone());
            for (name, size) in files {
                let sample = Sample {
                    class: class.clone(),
                    name: name.clone(),
                    key: samples.len() as u32 + 1,
                    size: *size,
                };
                fs::write(root.join(sample.rel()), sample.bytes()).expect("write a sample");
                samples.push(sample);
            }
        }
        let mut dangling = Vec::new();
        for (class, name) in &self.dangling {
            let link = root.join(class).join(name);
            fs::create_dir_all(link.parent().unwrap()).expect("create a class folder");
            std::os::unix::fs::symlink(base.join("no-such-target"), &link)
                .expect("create a dangling link");
            dangling.push(link);
        }
        let mut nested = Vec::new();
        for (class, name) in &self.nested {
            let dir = root.join(class).join(name);
            fs::create_dir_all(&dir).expect("create a nested folder");
            fs::write(dir.join("inside.jpg"), b"not a sample").expect("write a nested file");
            nested.push(dir);
        }
        classes.sort();
        classes.dedup();
        Dataset {
            _tmp: tmp,
            base,
            root,
            classes,
            samples,
            dangling,
            nested,
        }
    }
}

/// A test dataset and a scratch area for its cache and mount folders; all deleted on drop.
pub struct Dataset {
    _tmp: TempDir,
    /// Canonical path of the temp folder; `src/` is the dataset.
    pub base: PathBuf,
    /// The `--source` folder.
    pub root: PathBuf,
    /// Class folder names, sorted.
    pub classes: Vec<String>,
    pub samples: Vec<Sample>,
    pub dangling: Vec<PathBuf>,
    pub nested: Vec<PathBuf>,
}

impl Dataset {
    /// A path in the scratch area (not created).
    pub fn path(&self, name: &str) -> PathBuf {
        self.base.join(name)
    }

    /// An empty folder in the scratch area, e.g. a mount point.
    pub fn dir(&self, name: &str) -> PathBuf {
        let p = self.path(name);
        fs::create_dir_all(&p).expect("create a scratch folder");
        p
    }

    pub fn sample(&self, class: &str, name: &str) -> &Sample {
        self.samples
            .iter()
            .find(|s| s.class == class && s.name == name)
            .unwrap_or_else(|| panic!("no sample {class}/{name} in the test dataset"))
    }

    pub fn total_bytes(&self) -> u64 {
        self.samples.iter().map(|s| s.size).sum()
    }

    /// What an `epoch-N/` of a world of one must list: every class, every sample.
    pub fn expected_listing(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut out: BTreeMap<String, BTreeSet<String>> = self
            .classes
            .iter()
            .map(|c| (c.clone(), BTreeSet::new()))
            .collect();
        for s in &self.samples {
            out.get_mut(&s.class).unwrap().insert(s.name.clone());
        }
        out
    }
}

/// The dataset most mount tests use: odd names, an empty class, an empty file, a file larger
/// than one FUSE read, a class that needs several readdir replies, and a dangling link.
/// A file name of 255 bytes, the longest Linux allows.
pub const LONG_NAME: &str = concat!(
    "llllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllll",
    "llllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllll",
    "lllllllllllllllllllllllllllllllllllllllllllllllllll.bin"
);

pub fn standard_dataset() -> Dataset {
    DatasetBuilder::new()
        .class(
            "cat",
            &[
                ("a.jpg", 1000),
                ("b.jpg", 4096),
                ("c.jpg", 1),
                ("empty.bin", 0),
                ("large.bin", 300_000),
            ],
        )
        .class(
            "dog house",
            &[
                ("spaced name.png", 777),
                ("ünïcødé.jpg", 2048),
                ("日本語.bin", 333),
                ("line\nbreak.jpg", 12),
                (LONG_NAME, 55),
            ],
        )
        .class("ñandú", &[("x", 10)])
        .empty_class("empty")
        .numbered_class("many", 150, |i| (i * 37 % 500) as u64 + 1)
        .dangling_link("dog house", "gone.jpg")
        .build()
}
