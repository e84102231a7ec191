//! A `--cache` folder that holds anyone else's files is never emptied or overwritten (issue
//! 26, item 1): a scratch folder is refused naming what is in it, with or without
//! `--reset-cache`, and leaves no mount and no change behind; inside a shufflefs cache,
//! a rebuild removes only shufflefs's own files.

use std::fs;
use std::path::Path;

use crate::common::*;

/// A scratch folder with a `tmp/` and a `samples/` of someone else's.
fn scratch(root: &Path) {
    fs::create_dir_all(root.join("tmp")).unwrap();
    fs::create_dir_all(root.join("samples")).unwrap();
    fs::write(root.join("tmp/job-output.txt"), "precious").unwrap();
    fs::write(root.join("samples/7"), "precious").unwrap();
}

fn assert_untouched(root: &Path) {
    assert_eq!(
        fs::read(root.join("tmp/job-output.txt")).unwrap(),
        b"precious"
    );
    assert_eq!(fs::read(root.join("samples/7")).unwrap(), b"precious");
    let mut names: Vec<_> = fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["samples", "tmp"],
        "nothing added to {}",
        root.display()
    );
}

#[test]
fn a_folder_of_someone_elses_is_refused_and_left_as_it_was() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let cache = data.path("scratch");
    let mnt = data.dir("mnt");
    scratch(&cache);
    for (extra, foreground) in [
        (&[][..], false),
        (&["--reset-cache"][..], false),
        (&["--reset-cache"][..], true),
    ] {
        let r = mount_refused(
            &mnt,
            &mount_args(&data.root, &cache, &mnt, extra),
            foreground,
        );
        assert!(
            r.stderr.contains("not made by shufflefs") && r.stderr.contains("samples, tmp"),
            "{extra:?}: {}",
            r.stderr
        );
        assert_untouched(&cache);
    }
}

#[test]
fn a_rebuild_removes_only_shufflefs_files() {
    if !require_fuse() {
        return;
    }
    let data = standard_dataset();
    let cache = data.path("cache");
    let mnt = data.dir("mnt");
    let d = Daemon::mount(&data.root, &cache, &mnt, &["--seed", "1"]);
    wait_staging_done(&mnt);
    d.unmount().assert_clean();
    // Someone puts files into our folders.
    for name in ["samples/notes.txt", "tmp/notes.txt", "notes.txt"] {
        fs::write(cache.join(name), "precious").unwrap();
    }
    let args = ["--seed", "2", "--reset-cache", "--cache-layout", "packed"];
    let d = Daemon::mount(&data.root, &cache, &mnt, &args);
    wait_staging_done(&mnt);
    d.unmount().assert_clean();
    for name in ["samples/notes.txt", "tmp/notes.txt", "notes.txt"] {
        assert_eq!(fs::read(cache.join(name)).unwrap(), b"precious", "{name}");
    }
    // The files layout's samples are gone (the packed layout replaced them); the folder
    // stays for the file that is not ours.
    let left: Vec<_> = fs::read_dir(cache.join("samples"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["notes.txt"]);
}
