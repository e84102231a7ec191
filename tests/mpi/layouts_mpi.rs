//! Sources that are not ImageFolder-shaped (`--format tree`) under a real `mpirun -np 4`:
//! a flat folder of `.npz`-like files and a nested `speaker/chapter/*.flac`-like tree. Every
//! epoch's views partition the files with exact bytes, and every folder of the source (the
//! empty ones too) is in every rank's view.

use crate::common::mpi_job::MpiJob;
use crate::common::trees::{assert_epochs_partition, views, walk, write_tree};
use crate::common::{require_fuse, require_mpi, run_with_timeout};
use shufflefs::plan::equal::Replay;
use shufflefs::plan::{Plan, PlanParams};

const RANKS: u32 = 4;
const SEED: u64 = 11;

#[test]
fn flat_folder_of_npz_files_is_partitioned_every_epoch() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let files: Vec<_> = (0..37)
        .map(|i| (format!("img_{i:03}.npz"), 3000 + i * 211))
        .collect();
    write_tree(tmp.path(), &files, &[]);
    let job = MpiJob::start(tmp.path(), RANKS, SEED, 0.5, &["--format", "tree"]);
    let sizes = assert_epochs_partition(&job, &tmp.path().join("src"), 3, &[]);
    for s in sizes {
        assert!(s.iter().all(|&n| n == 9 || n == 10), "{s:?}");
    }
    assert_eq!(job.status(0)["dataset"]["format"], "tree");
    job.unmount();
}

#[test]
fn nested_speaker_chapter_tree_keeps_every_folder_on_every_rank() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for spk in 0..5 {
        for ch in 0..(spk % 3 + 1) {
            for u in 0..(spk + ch + 1) {
                let path = format!("{spk}/{}/{spk}-{ch}-{u:04}.flac", 100 + ch);
                files.push((path, 500 + u * 37));
            }
        }
    }
    files.push(("README.TXT".to_string(), 100));
    files.push(("2/SPEAKER.TXT".to_string(), 40));
    write_tree(tmp.path(), &files, &["9/empty-chapter", "a/b/c/d/e/f"]);
    let replicate = ["--replicate", "README.TXT", "--replicate", "*/SPEAKER.TXT"];
    let job = MpiJob::start(
        tmp.path(),
        RANKS,
        SEED,
        0.3,
        &[&["--format", "tree"][..], &replicate].concat(),
    );
    let side = ["README.TXT", "2/SPEAKER.TXT"];
    assert_epochs_partition(&job, &tmp.path().join("src"), 3, &side);
    job.unmount();
}

/// A plain Python loop over one rank's epoch of a COCO-shaped view, as a detection dataset
/// reads it: the annotation file (a side file, whole on every rank), the images listed in
/// the rank's folder, each image's annotations looked up by file name. Prints the names.
const COCO_LOOP: &str = r#"
import json, os, sys
view = sys.argv[1]
coco = json.load(open(os.path.join(view, "annotations", "instances_train2017.json")))
by_name = {im["file_name"]: im["id"] for im in coco["images"]}
anns = {}
for a in coco["annotations"]:
    anns.setdefault(a["image_id"], []).append(a)
classes = open(os.path.join(view, "classes.txt")).read().split()
for name in sorted(os.listdir(os.path.join(view, "train2017"))):
    data = open(os.path.join(view, "train2017", name), "rb").read()
    target = anns[by_name[name]]
    assert len(data) == target[0]["bytes"], name
    assert classes[target[0]["category_id"]]
    print(name)
"#;

#[test]
fn coco_shaped_data_with_replicated_annotations_reads_in_a_plain_loop() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut files: Vec<_> = (0..41)
        .map(|i| (format!("train2017/{i:012}.jpg"), 700 + i * 13))
        .collect();
    files.push(("classes.txt".into(), 0));
    write_tree(tmp.path(), &files, &[]);
    let src = tmp.path().join("src");
    std::fs::write(src.join("classes.txt"), "person\nbicycle\ncar\n").unwrap();
    let images: Vec<String> = (0..41)
        .map(|i| format!(r#"{{"id": {i}, "file_name": "{i:012}.jpg"}}"#))
        .collect();
    let anns: Vec<String> = (0..41)
        .map(|i| {
            format!(
                r#"{{"image_id": {i}, "category_id": {}, "bytes": {}}}"#,
                i % 3,
                700 + i * 13
            )
        })
        .collect();
    std::fs::create_dir(src.join("annotations")).unwrap();
    let json = format!(
        r#"{{"images": [{}], "annotations": [{}]}}"#,
        images.join(","),
        anns.join(",")
    );
    std::fs::write(src.join("annotations/instances_train2017.json"), &json).unwrap();
    std::fs::write(src.join("annotations/captions_train2017.json"), "{}").unwrap();

    // ImageFolder, the default: train2017 and annotations are its two class folders.
    let replicate = [
        "--replicate",
        "annotations/*.json",
        "--replicate",
        "classes.txt",
    ];
    let job = MpiJob::start(tmp.path(), RANKS, SEED, 0.3, &replicate);
    let side = [
        "annotations/captions_train2017.json",
        "annotations/instances_train2017.json",
        "classes.txt",
    ];
    let side_bytes: u64 = (side.iter())
        .map(|f| std::fs::metadata(src.join(f)).unwrap().len())
        .sum();
    assert_epochs_partition(&job, &src, 2, &side);
    for epoch in 1..4u64 {
        let mut seen = std::collections::BTreeSet::new();
        for m in &job.mounts {
            let view = m.join(format!("epoch-{epoch}"));
            let out = run_with_timeout(
                std::process::Command::new("python3")
                    .args(["-c", COCO_LOOP])
                    .arg(&view),
                std::time::Duration::from_secs(60),
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{}: {}",
                view.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            for name in stdout.lines() {
                assert!(
                    seen.insert(name.to_string()),
                    "{name} on two ranks in epoch {epoch}"
                );
            }
        }
        assert_eq!(seen.len(), 41, "epoch {epoch}: every image once");
    }
    for rank in 0..RANKS as usize {
        let st = job.status(rank);
        let r = &st["replicated"];
        assert_eq!(r["files"], 3, "{st:#}");
        assert_eq!(r["bytes"], side_bytes, "{st:#}");
        assert_eq!(r["copy_rank"], 0, "one copy on this host: rank 0's\n{st:#}");
        let fetched = if rank == 0 { side_bytes } else { 0 };
        assert_eq!(r["fetched_bytes"], fetched, "{st:#}");
        assert_eq!(st["samples"], 41);
    }
    job.unmount();
}

#[test]
fn equal_shares_drop_gives_every_rank_floor_n_over_m_by_the_stated_rule() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let files: Vec<_> = (0..39)
        .map(|i| (format!("x/{i:03}.npz"), 100 + i))
        .collect();
    write_tree(tmp.path(), &files, &[]);
    let src = tmp.path().join("src");
    let args = ["--format", "tree", "--equal-shares", "drop"];
    let job = MpiJob::start(tmp.path(), RANKS, SEED, 0.3, &args);
    // The rule, from the library: the same plan replayed.
    let manifest = shufflefs::dataset::scan::scan_tree(&src).unwrap();
    let plan = Plan::new(PlanParams {
        samples: 39,
        world: RANKS,
        fraction: 0.3,
        seed: SEED,
    })
    .unwrap();
    let mut replay = Replay::new(&plan);
    let all = walk(&src);
    let mut ever_left = std::collections::BTreeSet::new();
    for epoch in 0..5 {
        let views = views(&job, epoch);
        let mut shown = std::collections::BTreeSet::new();
        for (rank, view) in views.iter().enumerate() {
            assert_eq!(
                view.files.len(),
                9,
                "rank {rank}, epoch {epoch}: floor(39/4)"
            );
            for (path, bytes) in &view.files {
                assert_eq!(Some(bytes), all.files.get(path), "{path}");
                assert!(shown.insert(path.clone()), "{path} on two ranks");
            }
            let st = job.status(rank);
            assert_eq!(st["equal_shares"]["view_samples"], 9, "{st:#}");
            assert_eq!(st["share_samples"], if rank < 3 { 10 } else { 9 });
        }
        replay.advance_to(&plan, epoch);
        let expected: std::collections::BTreeSet<String> = (replay.left_out_all(&plan))
            .into_iter()
            .flatten()
            .map(|id| manifest.relative_path(id).to_string_lossy().into_owned())
            .collect();
        let left: std::collections::BTreeSet<String> = all
            .files
            .keys()
            .filter(|p| !shown.contains(*p))
            .cloned()
            .collect();
        assert_eq!(left, expected, "epoch {epoch}: left out by the rule");
        for l in left {
            assert!(
                ever_left.insert(l.clone()),
                "{l} left out twice in 5 epochs"
            );
        }
    }
    job.unmount();
}
