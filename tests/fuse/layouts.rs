//! `--format tree` and `--replicate` with one real mount: what a bad source or a bad glob
//! is refused with (naming it and the fix, leaving no mount behind).

use std::fs;
use std::path::Path;

use crate::common::*;

/// A mount of `source` that must be refused (foreground and detached alike), with every
/// `needle` in its message.
#[track_caller]
fn refused_naming(data: &Dataset, source: &Path, extra: &[&str], needles: &[&str]) {
    let mnt = data.dir("mnt");
    let args = mount_args(source, &data.path("cache"), &mnt, extra);
    for foreground in [true, false] {
        let r = mount_refused(&mnt, &args, foreground);
        for n in needles {
            r.assert_mentions(n);
        }
    }
}

#[test]
fn a_flat_source_is_pointed_to_the_tree_format() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let flat = data.dir("flat");
    fs::write(flat.join("a.npz"), b"x").unwrap();
    refused_naming(&data, &flat, &[], &["no class folders", "--format tree"]);
}

#[test]
fn a_tree_without_files_or_with_an_unreadable_folder_is_refused() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let tree = data.dir("tree");
    fs::create_dir_all(tree.join("a/b")).unwrap();
    let path = tree.to_str().unwrap();
    refused_naming(
        &data,
        &tree,
        &["--format", "tree"],
        &[path, "no sample files at any depth"],
    );
    if nix::unistd::geteuid().is_root() {
        return; // root lists any folder
    }
    fs::write(tree.join("a/x.flac"), b"x").unwrap();
    let locked = tree.join("a/b/locked");
    fs::create_dir(&locked).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o000)).unwrap();
    refused_naming(
        &data,
        &tree,
        &["--format", "tree"],
        &[locked.to_str().unwrap()],
    );
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn a_replicate_glob_that_names_nothing_or_cannot_is_refused_naming_it() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let src = data.root.clone();
    let needles = [
        "\"annotations/*.jsn\"",
        "matches no file",
        "relative to --source",
    ];
    refused_naming(&data, &src, &["--replicate", "annotations/*.jsn"], &needles);
    refused_naming(
        &data,
        &src,
        &["--replicate", "/etc/*"],
        &["\"/etc/*\"", "relative to --source"],
    );
    refused_naming(&data, &src, &["--replicate", "../x"], &["\"../x\"", "'..'"]);
    let records = ["--format", "records", "--replicate", "x"];
    refused_naming(
        &data,
        &src,
        &records,
        &["--replicate applies to --format imagefolder and tree"],
    );
}

/// A tree with side files on one rank, in each cache layout and read path: every file reads
/// back as the source has it, in two epochs, and a remount keeps the side files' copy.
#[test]
fn a_tree_with_side_files_reads_back_in_every_layout_and_read_path() {
    if !require_fuse() {
        return;
    }
    use crate::common::trees::{walk, write_tree};
    let tmp = tempfile::tempdir().unwrap();
    let files: Vec<_> = (0..12)
        .map(|i| (format!("spk{}/ch{}/{i:02}.flac", i % 3, i % 2), 100 + i * 7))
        .chain([
            ("stats/mean.npy".to_string(), 64),
            ("classes.txt".to_string(), 9),
        ])
        .collect();
    write_tree(tmp.path(), &files, &["spk9/empty"]);
    let src = tmp.path().join("src");
    let expected = walk(&src);
    for (layout, path) in [
        ("files", "passthrough"),
        ("packed", "daemon"),
        ("files", "page-cache"),
    ] {
        let cache = tmp.path().join(format!("cache-{layout}-{path}"));
        let mnt = tmp.path().join(format!("mnt-{layout}-{path}"));
        fs::create_dir(&mnt).unwrap();
        let extra = [
            "--format",
            "tree",
            "--replicate",
            "stats/*.npy",
            "--replicate",
            "classes.txt",
            "--cache-layout",
            layout,
            "--read-path",
            path,
        ];
        for mount in 0..2 {
            let d = Daemon::mount(&src, &cache, &mnt, &extra);
            // A remount resumes at the epoch the cache reached.
            let first = read_epoch(&mnt);
            for epoch in first..first + 2 {
                let view = walk(&mnt.join(format!("epoch-{epoch}")));
                assert_eq!(view.dirs, expected.dirs, "{layout}/{path}: folders");
                assert_eq!(view.files, expected.files, "{layout}/{path}: bytes");
            }
            let st = read_status(&mnt);
            assert_eq!(st["replicated"]["files"], 2, "{st:#}");
            let fetched = if mount == 0 { 73 } else { 0 };
            assert_eq!(
                st["replicated"]["fetched_bytes"], fetched,
                "{layout}/{path} mount {mount}"
            );
            d.unmount();
        }
    }
}
