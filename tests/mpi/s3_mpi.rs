//! `--source s3://BUCKET/PREFIX` against a real S3-compatible server on 127.0.0.1 (moto's,
//! see `common::s3`): a 4-rank `mpirun` mount of an ImageFolder dataset in a bucket, every
//! epoch a partition with exact bytes and rank 0 the only rank that lists; a missing bucket
//! refused with the fix and no mount left; and 503 SlowDown answers injected by a proxy,
//! retried, so the mount still gets every byte.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::mpi_job::{MpiJob, exchange, mpirun, wait_all};
use crate::common::s3::{S3Server, free_port, moto_python};
use crate::common::trees::{assert_epochs_partition, write_tree};
use crate::common::{
    is_mounted, mount_args, require_fuse, require_mpi, run_with_timeout, shufflefs,
};

const RANKS: u32 = 4;
const SEED: u64 = 5;
const BUCKET: &str = "shufflefs-test";
const PREFIX: &str = "datasets/tiny";

/// `DIR/src`: 3 classes of 13 to 15 samples, 1 to 9 KB each, uploaded under `PREFIX/`.
fn dataset(dir: &Path, server: &S3Server) {
    let mut files = Vec::new();
    for c in 0..3 {
        for i in 0..(13 + c) {
            files.push((
                format!("class{c}/img_{i:03}.jpg"),
                1000 + (i * 571 + c * 97) % 8000,
            ));
        }
    }
    write_tree(dir, &files, &[]);
    server.upload(BUCKET, PREFIX, &dir.join("src"));
}

fn job(dir: &Path, endpoint: &str) -> MpiJob {
    let mut launcher = mpirun(RANKS);
    launcher.envs(S3Server::env(endpoint));
    let source = format!("s3://{BUCKET}/{PREFIX}");
    MpiJob::start_from(launcher, source.as_ref(), dir, RANKS, SEED, 0.5, &[])
}

#[test]
fn imagefolder_in_a_bucket_is_partitioned_every_epoch_and_listed_once() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let Some(python) = moto_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let server = S3Server::start(&python, &tmp.path().join("moto.log"));
    dataset(tmp.path(), &server);
    let before = server.list_requests();
    let job = job(tmp.path(), &server.endpoint());
    // Rank 0's bucket check and its one listing (one page: under 1,000 keys); no other rank lists.
    assert_eq!(server.list_requests() - before, 2, "listing requests");
    let sizes = assert_epochs_partition(&job, &tmp.path().join("src"), 3, &[]);
    for s in sizes {
        assert_eq!(s.iter().sum::<usize>(), 42, "{s:?}");
    }
    let status = job.status(0);
    assert_eq!(status["source"], format!("s3://{BUCKET}/{PREFIX}"));
    assert_eq!(
        server.list_requests() - before,
        2,
        "listing requests after 3 epochs"
    );
    job.unmount();
    // A remount takes the index from rank 0's cache: the bucket check is its one request.
    let job = self::job(tmp.path(), &server.endpoint());
    assert_eq!(
        server.list_requests() - before,
        3,
        "listing requests after a remount"
    );
    assert_eq!(job.status(0)["source"], format!("s3://{BUCKET}/{PREFIX}"));
    job.unmount();
}

/// Keys no file can be named (`a//x`, `../y`, a tab) are skipped and named in the status,
/// never failing the mount; folder markers (`class0/`, a zero-byte `class1` beside
/// `class1/...`) are not samples; every view is exactly the usable objects.
#[test]
fn keys_that_cannot_be_paths_and_folder_markers_leave_exact_views() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let Some(python) = moto_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let server = S3Server::start(&python, &tmp.path().join("moto.log"));
    dataset(tmp.path(), &server);
    let odd = [
        format!("{PREFIX}/class0/a//x.jpg"),
        format!("{PREFIX}/../y.jpg"),
        format!("{PREFIX}/class2/t\tab.jpg"),
        format!("{PREFIX}/class0/"),
        format!("{PREFIX}/class1"),
    ];
    let bodies: [&[u8]; 5] = [b"bad-1", b"bad-2", b"bad-3", b"", b""];
    let objects: Vec<(&str, &[u8])> = odd.iter().map(String::as_str).zip(bodies).collect();
    server.put(BUCKET, &objects);
    let job = job(tmp.path(), &server.endpoint());
    assert_epochs_partition(&job, &tmp.path().join("src"), 2, &[]);
    let status = job.status(0);
    let skipped: Vec<&str> = (status["skipped"].as_array().unwrap().iter())
        .map(|s| s["path"].as_str().unwrap())
        .collect();
    for bad in [
        format!("{PREFIX}/class0/a//x.jpg"),
        format!("{PREFIX}/../y.jpg"),
        format!("{PREFIX}/class2/t\\u{{9}}ab.jpg"),
    ] {
        assert!(
            skipped.contains(&bad.as_str()),
            "{bad:?} not in {skipped:?}"
        );
    }
    assert_eq!(
        skipped.len(),
        3,
        "markers are not skipped samples: {skipped:?}"
    );
    assert_eq!(status["samples"], 42);
    job.unmount();
}

#[test]
fn missing_bucket_is_refused_with_the_fix_and_no_mount() {
    if !require_fuse() {
        return;
    }
    let Some(python) = moto_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let server = S3Server::start(&python, &tmp.path().join("moto.log"));
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let source = Path::new("s3://no-such-bucket/x");
    let args = mount_args(source, &tmp.path().join("cache"), &mnt, &[]);
    let out = run_with_timeout(
        shufflefs()
            .arg("mount")
            .args(&args)
            .envs(S3Server::env(&server.endpoint())),
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mounted a missing bucket: {stderr}");
    for needle in ["no-such-bucket", "does not exist", "AWS_ENDPOINT_URL"] {
        assert!(
            stderr.contains(needle),
            "stderr lacks {needle:?}:\n{stderr}"
        );
    }
    assert!(!is_mounted(&mnt), "a refused mount left a mount behind");

    // A bucket that exists but holds nothing under the prefix is refused too.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    server.upload("empty-bucket", "", &empty);
    let source = Path::new("s3://empty-bucket/train");
    let args = mount_args(source, &tmp.path().join("cache"), &mnt, &[]);
    let out = run_with_timeout(
        shufflefs()
            .arg("mount")
            .args(&args)
            .envs(S3Server::env(&server.endpoint())),
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mounted an empty prefix: {stderr}");
    assert!(stderr.contains("holds no objects"), "{stderr}");
    assert!(stderr.contains("an ImageFolder source"), "{stderr}");
    assert!(!is_mounted(&mnt), "a refused mount left a mount behind");
}

#[test]
fn forbidden_bucket_is_refused_naming_the_credentials() {
    if !require_fuse() {
        return;
    }
    let Some(python) = moto_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let server = S3Server::start_checking(&python, &tmp.path().join("moto.log"), true);
    let mnt = tmp.path().join("mnt");
    let source = Path::new("s3://some-bucket/x");
    let args = mount_args(source, &tmp.path().join("cache"), &mnt, &[]);
    let out = run_with_timeout(
        shufflefs()
            .arg("mount")
            .args(&args)
            .envs(S3Server::env(&server.endpoint())),
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "mounted a forbidden bucket: {stderr}"
    );
    for needle in ["some-bucket", "403", "AWS_ACCESS_KEY_ID", "bucket policy"] {
        assert!(
            stderr.contains(needle),
            "stderr lacks {needle:?}:\n{stderr}"
        );
    }
    assert!(!mnt.exists(), "a refused mount left its mount point behind");
}

#[test]
fn slowdown_503s_are_retried_and_every_byte_arrives() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let Some(python) = moto_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let server = S3Server::start(&python, &tmp.path().join("moto.log"));
    dataset(tmp.path(), &server);
    let proxy = server.faulty_proxy(3, &tmp.path().join("proxy.log"));
    let job = job(tmp.path(), &proxy.endpoint());
    assert_epochs_partition(&job, &tmp.path().join("src"), 2, &[]);
    assert!(proxy.injected() > 0, "the proxy injected no 503");
    // Every 503 was retried inside the request: no sample failed on any rank, and the
    // ranks' retry counters add up to the 503s.
    let mut retries = 0;
    for rank in 0..RANKS as usize {
        let cache = &job.status(rank)["cache"];
        assert_eq!(cache["source_errors"], 0, "rank {rank}: {cache}");
        retries += cache["store_retries"].as_u64().unwrap();
    }
    assert_eq!(retries as usize, proxy.injected(), "retries counted");
    eprintln!("503s injected: {}", proxy.injected());
    job.unmount();
}

/// Also: the endpoint and credentials come from a profile of the AWS shared files.
#[test]
fn tree_in_a_bucket_is_partitioned_with_its_folders() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let Some(python) = moto_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let server = S3Server::start(&python, &tmp.path().join("moto.log"));
    let mut files: Vec<_> = (0..9)
        .map(|i| (format!("top_{i}.npz"), 300 + i * 41))
        .collect();
    for i in 0..11 {
        files.push((
            format!("spk{}/ch{}/{i:04}.flac", i % 3, i % 2),
            900 + i * 77,
        ));
    }
    write_tree(tmp.path(), &files, &[]);
    server.upload(BUCKET, "tree", &tmp.path().join("src"));
    // Endpoint, keys and region from a profile of the AWS shared files, not the variables.
    let (creds, config) = (tmp.path().join("credentials"), tmp.path().join("config"));
    let keys = "aws_access_key_id = testing\naws_secret_access_key = testing\n";
    std::fs::write(
        &creds,
        format!("[default]\naws_access_key_id = wrong\n[moto]\n{keys}"),
    )
    .unwrap();
    let endpoint = server.endpoint();
    let profile = format!("[profile moto]\nregion = us-east-1\nendpoint_url = {endpoint}\n");
    std::fs::write(&config, profile).unwrap();
    let mut launcher = mpirun(RANKS);
    launcher
        .env("AWS_PROFILE", "moto")
        .env("AWS_SHARED_CREDENTIALS_FILE", &creds)
        .env("AWS_CONFIG_FILE", &config)
        .env("AWS_ALLOW_HTTP", "true");
    let source = format!("s3://{BUCKET}/tree");
    let extra = ["--format", "tree"];
    let job = MpiJob::start_from(
        launcher,
        source.as_ref(),
        tmp.path(),
        RANKS,
        SEED,
        0.5,
        &extra,
    );
    assert_epochs_partition(&job, &tmp.path().join("src"), 2, &[]);
    assert_eq!(job.status(0)["dataset"]["format"], "tree");
    job.unmount();
}

/// Waits up to `secs` for `what` of rank 0's status to hold.
fn wait_status(job: &MpiJob, secs: u64, what: &str, holds: impl Fn(&serde_json::Value) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !holds(&job.status(0)) {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {}",
            job.status(0)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_store_going_away_mid_staging_keeps_the_mount_and_staging_resumes() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let Some(python) = moto_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let server = S3Server::start(&python, &tmp.path().join("moto.log"));
    dataset(tmp.path(), &server);
    // One rank staging one sample at a time, 100 ms a GET: about 4 s for the 42 samples.
    let port = server.faulty_proxy(0, &tmp.path().join("probe.log")).port;
    let proxy = server.proxy_on(port, 0, 100, &tmp.path().join("proxy.log"));
    let mut launcher = mpirun(1);
    launcher.envs(S3Server::env(&proxy.endpoint()));
    let source = format!("s3://{BUCKET}/{PREFIX}");
    let extra = ["--staging-threads", "1"];
    let job = MpiJob::start_from(launcher, source.as_ref(), tmp.path(), 1, SEED, 0.5, &extra);
    wait_status(&job, 30, "some samples staged", |s| {
        s["cache"]["files"].as_u64() >= Some(3)
    });
    drop(proxy);
    // The GET in flight fails after its 8 retries (11 to 23 s of backoff), and the
    // problem shows in the status; the mount still answers.
    wait_status(&job, 90, "the outage in the status", |s| {
        s["cache"]["problems"]
            .as_array()
            .is_some_and(|p| !p.is_empty())
    });
    let problems = job.status(0)["cache"]["problems"].to_string();
    assert!(
        problems.contains(&format!("s3://{BUCKET}/{PREFIX}/")),
        "{problems}"
    );
    let staged = job.status(0)["cache"]["files"].as_u64().unwrap();
    assert!(staged < 42, "staging finished before the outage");
    assert_eq!(
        std::fs::read_dir(job.mounts[0].join("epoch-0"))
            .unwrap()
            .count(),
        3
    );
    // The store comes back on the same address: staging's own retry finishes the share.
    let _back = server.proxy_on(port, 0, 0, &tmp.path().join("proxy2.log"));
    wait_status(&job, 90, "staging resumed", |s| s["cache"]["files"] == 42);
    assert_epochs_partition(&job, &tmp.path().join("src"), 1, &[]);
    eprintln!("staged before the outage: {staged}; problems: {problems}");
    job.unmount();
}

/// TFRecord shards `DIR/src/shard-*.tfrecord` (`make_dataset.py --records tfrecord`): each
/// record's data is `record-I|` and padding. The data of every record of `bytes`, in order.
fn tfrecords(bytes: &[u8]) -> Vec<Vec<u8>> {
    let (mut at, mut out) = (0, Vec::new());
    while at < bytes.len() {
        let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
        out.push(bytes[at + 12..at + 12 + len].to_vec());
        at += 12 + len + 4;
    }
    out
}

#[test]
fn records_in_a_bucket_are_read_as_coalesced_ranges_every_record_once() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let Some(python) = moto_python() else { return };
    const COUNT: u32 = 3000;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    crate::common::records::make_records(&src, "tfrecord", COUNT, 3);
    let mut want: Vec<Vec<u8>> = Vec::new();
    for e in std::fs::read_dir(&src).unwrap() {
        want.extend(tfrecords(&std::fs::read(e.unwrap().path()).unwrap()));
    }
    want.sort();
    let server = S3Server::start(&python, &tmp.path().join("moto.log"));
    server.upload(BUCKET, "recs", &src);
    let mut launcher = mpirun(RANKS);
    launcher.envs(S3Server::env(&server.endpoint()));
    let extra = ["--format", "records", "--framing", "tfrecord"];
    let source = format!("s3://{BUCKET}/recs");
    let job = MpiJob::start_from(
        launcher,
        source.as_ref(),
        tmp.path(),
        RANKS,
        SEED,
        0.5,
        &extra,
    );
    // Rank 0's index pass fetched each shard once.
    assert_eq!(
        server.object_gets(BUCKET, "recs").0,
        3,
        "whole GETs (the index)"
    );
    let groups = job.status(0)["dataset"]["groups"].as_u64().unwrap();
    assert_eq!(job.status(0)["dataset"]["records"], COUNT);
    for epoch in 0..3 {
        let mut got: Vec<Vec<u8>> = crate::common::trees::views(&job, epoch)
            .iter()
            .flat_map(|v| {
                v.files
                    .values()
                    .flat_map(|b| tfrecords(b))
                    .collect::<Vec<_>>()
            })
            .collect();
        got.sort();
        assert_eq!(got.len(), want.len(), "epoch {epoch}: records");
        assert!(
            got == want,
            "epoch {epoch}: the records differ from the source"
        );
    }
    // Each rank's share is staged as a few ranged GETs (a shard is under 8 MiB, so a
    // run of neighbouring groups each), not one GET per group.
    let (whole, gets) = server.object_gets(BUCKET, "recs");
    assert_eq!(whole, 3, "whole GETs (the index)");
    eprintln!("{groups} groups, {gets} ranged GETs after the index");
    assert!(
        gets <= (RANKS * 3 * 3) as usize,
        "{gets} GETs for {groups} groups"
    );
    assert!(
        (gets as u64) < groups / 4,
        "{gets} GETs for {groups} groups"
    );
    job.unmount();
}

#[test]
fn an_object_overwritten_since_the_listing_is_reported_as_changed() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let Some(python) = moto_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let server = S3Server::start(&python, &tmp.path().join("moto.log"));
    dataset(tmp.path(), &server);
    // One rank staging one sample at a time, 100 ms a GET: the last sample (by id) is
    // fetched about 4 s after the listing.
    let proxy = server.proxy_on(free_port(), 0, 100, &tmp.path().join("proxy.log"));
    let mut launcher = mpirun(1);
    launcher.envs(S3Server::env(&proxy.endpoint()));
    let source = format!("s3://{BUCKET}/{PREFIX}");
    let extra = ["--staging-threads", "1"];
    let job = MpiJob::start_from(launcher, source.as_ref(), tmp.path(), 1, SEED, 0.5, &extra);
    // Same size, other bytes: only the ETag tells.
    let name = "class2/img_014.jpg";
    let original = std::fs::read(tmp.path().join("src").join(name)).unwrap();
    let changed = tmp.path().join("changed");
    std::fs::create_dir_all(changed.join("class2")).unwrap();
    let other: Vec<u8> = original.iter().map(|b| b ^ 0x5a).collect();
    std::fs::write(changed.join(name), &other).unwrap();
    server.upload(BUCKET, PREFIX, &changed);
    wait_status(&job, 60, "the change in the status", |s| {
        s["cache"]["problems"]
            .as_array()
            .is_some_and(|p| !p.is_empty())
    });
    let problems = job.status(0)["cache"]["problems"].to_string();
    for needle in [
        &format!("s3://{BUCKET}/{PREFIX}/{name}"),
        "changed since the listing",
    ] {
        assert!(problems.contains(needle), "{needle:?} not in {problems}");
    }
    let view = job.mounts[0].join("epoch-0");
    let read = std::fs::read(view.join(name));
    assert!(
        read.is_err(),
        "a changed object served: {:?}",
        read.map(|b| b == other)
    );
    let kept = "class2/img_013.jpg";
    let want = std::fs::read(tmp.path().join("src").join(kept)).unwrap();
    assert_eq!(std::fs::read(view.join(kept)).unwrap(), want, "{kept}");
    eprintln!("problems: {problems}");
    job.unmount();
}

/// Reads every file of `view` that `src` has: the bytes of those that read, and the names
/// of those whose read failed.
fn read_view(view: &Path, src: &Path) -> (usize, Vec<String>) {
    let want = crate::common::trees::walk(src);
    let (mut exact, mut failed) = (0, Vec::new());
    for (name, bytes) in &want.files {
        match std::fs::read(view.join(name)) {
            Ok(got) => {
                assert!(&got == bytes, "{name}: other bytes than the source's");
                exact += 1;
            }
            Err(_) => failed.push(name.clone()),
        }
    }
    (exact, failed)
}

/// Answers about one object that no retry will change (416 after an object shrank under
/// its ETag, 400) fail that sample alone: named with bucket, key and status in the
/// status's problems, its reads fail, staging finishes the rest and the mount stays up.
#[test]
fn an_object_answered_416_or_400_fails_alone_and_is_named() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let Some(python) = moto_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let server = S3Server::start(&python, &tmp.path().join("moto.log"));
    dataset(tmp.path(), &server);
    let faults = [("class1/img_005.jpg", "416"), ("class2/img_007.jpg", "400")];
    let proxy = server.faults_proxy(&faults, &tmp.path().join("proxy.log"));
    let mut launcher = mpirun(1);
    launcher.envs(S3Server::env(&proxy.endpoint()));
    let source = format!("s3://{BUCKET}/{PREFIX}");
    let job = MpiJob::start_from(launcher, source.as_ref(), tmp.path(), 1, SEED, 0.5, &[]);
    wait_status(&job, 60, "the rest staged, both named", |s| {
        s["cache"]["files"] == 40 && s["cache"]["problems"].as_array().map(Vec::len) >= Some(2)
    });
    let problems = job.status(0)["cache"]["problems"].to_string();
    for needle in [
        format!("s3://{BUCKET}/{PREFIX}/class1/img_005.jpg"),
        "HTTP 416 InvalidRange".into(),
        format!("s3://{BUCKET}/{PREFIX}/class2/img_007.jpg"),
        "HTTP 400 InvalidArgument".into(),
    ] {
        assert!(problems.contains(&needle), "{needle:?} not in {problems}");
    }
    let (exact, failed) = read_view(&job.mounts[0].join("epoch-0"), &tmp.path().join("src"));
    assert_eq!(exact, 40);
    assert_eq!(failed, ["class1/img_005.jpg", "class2/img_007.jpg"]);
    assert!(job.status(0)["staging"].is_object(), "the mount answers");
    eprintln!("problems: {problems}");
    job.unmount();
}

/// A proxy that drops `Range` (200 with the whole object to a ranged GET) fails the record
/// groups of that one shard, named; the other shards' groups are staged.
#[test]
fn a_store_ignoring_range_fails_that_shard_alone() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let Some(python) = moto_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (src, shards) = tfrecord_shards(tmp.path());
    // A torn record at the end of the bad shard (skipped by the index): so even a run of all
    // its groups is not the whole object, and an answer of the whole object is wrong for it.
    let mut bad = std::fs::OpenOptions::new()
        .append(true)
        .open(src.join(&shards[1]))
        .unwrap();
    std::io::Write::write_all(&mut bad, b"torn").unwrap();
    let server = S3Server::start(&python, &tmp.path().join("moto.log"));
    server.upload(BUCKET, "recs", &src);
    let faults = [(shards[1].as_str(), "norange")];
    let proxy = server.faults_proxy(&faults, &tmp.path().join("proxy.log"));
    let mut launcher = mpirun(1);
    launcher.envs(S3Server::env(&proxy.endpoint()));
    let extra = ["--format", "records", "--framing", "tfrecord"];
    let source = format!("s3://{BUCKET}/recs");
    let job = MpiJob::start_from(launcher, source.as_ref(), tmp.path(), 1, SEED, 0.5, &extra);
    let groups = job.status(0)["dataset"]["groups"].as_u64().unwrap();
    wait_status(&job, 60, "staging done with failures", |s| {
        let files = s["cache"]["files"].as_u64().unwrap_or(0);
        let failed = s["cache"]["source_errors"].as_u64().unwrap_or(0);
        failed > 0 && files + failed >= groups
    });
    let problems = job.status(0)["cache"]["problems"].to_string();
    let needle = format!("s3://{BUCKET}/recs/{}", shards[1]);
    assert!(problems.contains(&needle), "{needle:?} not in {problems}");
    assert!(problems.contains("ignores Range"), "{problems}");
    // The shards are alike (200 records each): a third of the groups are the bad shard's.
    // A part of the view mixes groups of every shard, so it is the cache that shows which
    // groups were staged; each came as the exact range asked for (206, start, length).
    let status = job.status(0);
    let files = status["cache"]["files"].as_u64().unwrap();
    assert_eq!(groups % 3, 0, "{groups} groups");
    assert_eq!(files, groups / 3 * 2, "groups staged: the two good shards'");
    let failed = status["cache"]["source_errors"].as_u64().unwrap();
    eprintln!("{groups} groups, {failed} failed; problems: {problems}");
    job.unmount();
}

/// `--rescan` over a bucket compares the listed ETags and sizes with the cache's index:
/// after one object is overwritten (same size, other bytes), a remount keeps every other
/// cached sample and GETs only that object again.
#[test]
fn rescan_fetches_only_the_objects_whose_etag_changed() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let Some(python) = moto_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let server = S3Server::start(&python, &tmp.path().join("moto.log"));
    dataset(tmp.path(), &server);
    let mount = |extra: &[&str]| {
        let mut launcher = mpirun(1);
        launcher.envs(S3Server::env(&server.endpoint()));
        let source = format!("s3://{BUCKET}/{PREFIX}");
        let job = MpiJob::start_from(launcher, source.as_ref(), tmp.path(), 1, SEED, 0.5, extra);
        wait_status(&job, 60, "all staged", |s| s["cache"]["files"] == 42);
        job
    };
    mount(&[]).unmount();
    let (whole, _) = server.object_gets(BUCKET, PREFIX);
    assert_eq!(whole, 42, "the first mount's GETs");
    let name = "class1/img_003.jpg";
    let original = std::fs::read(tmp.path().join("src").join(name)).unwrap();
    let other: Vec<u8> = original.iter().map(|b| b ^ 0x5a).collect();
    let changed = tmp.path().join("changed");
    std::fs::create_dir_all(changed.join("class1")).unwrap();
    std::fs::write(changed.join(name), &other).unwrap();
    server.upload(BUCKET, PREFIX, &changed);
    let job = mount(&["--rescan"]);
    let (again, _) = server.object_gets(BUCKET, PREFIX);
    assert_eq!(
        again - whole,
        1,
        "GETs after the rescan: only the changed object"
    );
    let view = job.mounts[0].join("epoch-0");
    assert_eq!(std::fs::read(view.join(name)).unwrap(), other, "{name}");
    let kept = "class1/img_004.jpg";
    let want = std::fs::read(tmp.path().join("src").join(kept)).unwrap();
    assert_eq!(std::fs::read(view.join(kept)).unwrap(), want, "{kept}");
    job.unmount();
}

/// A prefix of more than one listing page (1,000 keys): after the first page the prefix's
/// folders are listed (`delimiter=/`) and each is a range of its own, listed at once,
/// following its continuation tokens: every key is a sample once.
#[test]
fn a_listing_of_several_pages_is_followed_to_its_end() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let Some(python) = moto_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let server = S3Server::start(&python, &tmp.path().join("moto.log"));
    std::fs::create_dir(tmp.path().join("none")).unwrap();
    server.upload(BUCKET, "", &tmp.path().join("none"));
    let keys: Vec<String> = (0..2300)
        .map(|i| format!("many/d{}/{i:05} x+y.bin", i % 2))
        .chain(["many/zz 1.bin".to_string(), "many/zz2.bin".to_string()])
        .collect();
    let objects: Vec<(&str, &[u8])> = keys.iter().map(|k| (k.as_str(), &b"s"[..])).collect();
    server.put(BUCKET, &objects);
    let before = server.list_requests();
    let mut launcher = mpirun(1);
    launcher.envs(S3Server::env(&server.endpoint()));
    let source = format!("s3://{BUCKET}/many");
    let extra = ["--format", "tree", "--staging-threads", "1"];
    let job = MpiJob::start_from(launcher, source.as_ref(), tmp.path(), 1, SEED, 0.5, &extra);
    let status = job.status(0);
    assert_eq!(status["samples"], 2302, "{}", status["skipped"]);
    // The bucket check; the first page (1,000 keys of d0); the level after it (d0/, d1/
    // and the two zz objects); d0's last 150 keys (one page, stopped at d1's first key);
    // d1's 1,150 keys in 2 pages.
    assert_eq!(server.list_requests() - before, 6, "listing requests");
    for name in ["zz 1.bin", "d1/02299 x+y.bin", "d0/01000 x+y.bin"] {
        let read = std::fs::read(job.mounts[0].join("epoch-0").join(name));
        assert_eq!(read.unwrap(), b"s", "{name}");
    }
    job.unmount();
}

/// Bodies that break off midway (the connection closed after half the bytes) are asked for
/// again within the request's retries: a whole object resumes where it broke (a ranged GET
/// checked against its ETag), a listing page is fetched again, and the view is exact.
#[test]
fn bodies_cut_midway_are_fetched_again_and_every_byte_arrives() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let Some(python) = moto_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let server = S3Server::start(&python, &tmp.path().join("moto.log"));
    dataset(tmp.path(), &server);
    // The listing's first page (the bucket check asks for max-keys=1).
    let faults = [
        ("list-type=2&max-keys=1000&prefix=", "cut"),
        ("class1/img_005.jpg", "cut"),
        ("class2/img_007.jpg", "cut"),
    ];
    let proxy = server.faults_proxy(&faults, &tmp.path().join("proxy.log"));
    let mut launcher = mpirun(1);
    launcher.envs(S3Server::env(&proxy.endpoint()));
    let source = format!("s3://{BUCKET}/{PREFIX}");
    let job = MpiJob::start_from(launcher, source.as_ref(), tmp.path(), 1, SEED, 0.5, &[]);
    assert_eq!(job.status(0)["samples"], 42);
    wait_status(&job, 60, "every object staged", |s| {
        s["cache"]["files"] == 42
    });
    assert_eq!(proxy.injected(), 3, "cuts injected");
    let status = job.status(0);
    assert_eq!(
        status["cache"]["problems"],
        serde_json::json!([]),
        "{status}"
    );
    let (exact, failed) = read_view(&job.mounts[0].join("epoch-0"), &tmp.path().join("src"));
    assert_eq!((exact, failed.len()), (42, 0), "{failed:?}");
    job.unmount();
}

/// A record shard whose whole-object GET (rank 0's index) and another's ranged GET (a page
/// group) break off midway: both are fetched again and every record group is staged.
#[test]
fn record_bodies_cut_midway_are_fetched_again() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let Some(python) = moto_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (src, shards) = tfrecord_shards(tmp.path());
    let server = S3Server::start(&python, &tmp.path().join("moto.log"));
    server.upload(BUCKET, "recs", &src);
    let faults = [
        (shards[0].as_str(), "cut"),
        (shards[1].as_str(), "cutrange"),
    ];
    let proxy = server.faults_proxy(&faults, &tmp.path().join("proxy.log"));
    let mut launcher = mpirun(1);
    launcher.envs(S3Server::env(&proxy.endpoint()));
    let extra = ["--format", "records", "--framing", "tfrecord"];
    let source = format!("s3://{BUCKET}/recs");
    let job = MpiJob::start_from(launcher, source.as_ref(), tmp.path(), 1, SEED, 0.5, &extra);
    let groups = job.status(0)["dataset"]["groups"].as_u64().unwrap();
    wait_status(&job, 60, "every group staged", |s| {
        s["cache"]["files"].as_u64() == Some(groups)
    });
    assert_eq!(proxy.injected(), 2, "cuts injected");
    let status = job.status(0);
    assert_eq!(status["cache"]["source_errors"], 0, "{status}");
    job.unmount();
}

/// A store that refuses every request alike for a while (403 SignatureDoesNotMatch, as
/// after a key rotation) is an outage, not a bad sample each: staging names the code and
/// the fix in the status, waits, and stages every sample once the store takes the key again.
/// It asks for no more samples once the refusal came, probing with one request per round,
/// and logs it once (before the fix each round asked for all 42 samples and logged each).
#[test]
fn a_store_refusing_every_request_is_waited_out_not_failed_per_sample() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let Some(python) = moto_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let server = S3Server::start(&python, &tmp.path().join("moto.log"));
    dataset(tmp.path(), &server);
    let faults = [(".jpg", "403/6")];
    let proxy = server.faults_proxy(&faults, &tmp.path().join("proxy.log"));
    let mut launcher = mpirun(1);
    launcher.envs(S3Server::env(&proxy.endpoint()));
    let source = format!("s3://{BUCKET}/{PREFIX}");
    let extra = ["--staging-threads", "4"];
    let job = MpiJob::start_from(launcher, source.as_ref(), tmp.path(), 1, SEED, 0.5, &extra);
    wait_status(&job, 30, "the refusal in the status", |s| {
        s["cache"]["problems"]
            .as_array()
            .is_some_and(|p| !p.is_empty())
    });
    let problems = job.status(0)["cache"]["problems"].to_string();
    for needle in ["SignatureDoesNotMatch", "AWS_SECRET_ACCESS_KEY"] {
        assert!(problems.contains(needle), "{needle:?} not in {problems}");
    }
    wait_status(&job, 60, "every sample staged after", |s| {
        s["cache"]["files"] == 42
    });
    // At most one request per staging thread in the first round, then one per round.
    let refused = proxy.injected();
    assert!((1..42).contains(&refused), "{refused} requests refused");
    let log = std::fs::read_to_string(tmp.path().join("job.log")).unwrap();
    let lines = |needle: &str| log.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(lines("staging failed for a sample"), 0, "{log}");
    assert_eq!(lines("retrying with one request per round"), 1, "{log}");
    assert_eq!(lines("the source answers again"), 1, "{log}");
    let (exact, failed) = read_view(&job.mounts[0].join("epoch-0"), &tmp.path().join("src"));
    assert_eq!((exact, failed.len()), (42, 0), "{failed:?}");
    eprintln!("403s injected: {refused}; problems: {problems}");
    job.unmount();
}

/// Ranks of one host hand samples over through the disk: a hand-off of a bucket's sample
/// waits for the sender's staging of it, so the exchange into epoch 1 fails none and no
/// object is fetched twice ("staging once, then nothing"), and with the store gone after
/// staging, epoch 1 reads whole on every rank. Failed before the fix: the first exchange
/// ran before staging (a bucket's sizes are listed, so nothing waited for a fetch), found
/// no file in the peer's cache (`failed_samples` 20 to 23 a rank with 400 objects), and
/// fetched those samples from the bucket again at the advance (EIO with the store away).
#[test]
fn same_host_hand_offs_of_a_bucket_wait_for_staging_and_fetch_nothing_twice() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let Some(python) = moto_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let server = S3Server::start(&python, &tmp.path().join("moto.log"));
    let files: Vec<(String, usize)> = (0..4)
        .flat_map(|c| (0..50).map(move |i| (format!("class{c}/s_{i:03}.bin"), 20_000)))
        .collect();
    write_tree(tmp.path(), &files, &[]);
    server.upload(BUCKET, "handoff", &tmp.path().join("src"));
    let mut launcher = mpirun(RANKS);
    launcher.envs(S3Server::env(&server.endpoint()));
    let source = format!("s3://{BUCKET}/handoff");
    let job = MpiJob::start_from(launcher, source.as_ref(), tmp.path(), RANKS, SEED, 0.5, &[]);
    wait_all(&job, "staged, and the exchange into epoch 1 done", |s| {
        let st = &s["staging"];
        st["state"] == "done"
            && st["files_done"] == st["files_total"]
            && exchange(s, 1).is_some_and(|x| x["state"] == "done")
    });
    for r in 0..RANKS as usize {
        let st = job.status(r);
        let x = exchange(&st, 1).unwrap();
        assert_eq!(x["failed_samples"], 0, "rank {r}: {x:#}");
        assert!(
            x["samples_received"].as_u64().unwrap() > 0,
            "rank {r}: {x:#}"
        );
    }
    let (whole, _) = server.object_gets(BUCKET, "handoff");
    assert_eq!(whole, files.len(), "GETs of staging: each object once");
    // The store gone, epoch 1 is all on this host's disks.
    drop(server);
    assert_epochs_partition(&job, &tmp.path().join("src"), 2, &[]);
    job.unmount();
}

/// A partial cache over a bucket: an object over 16 MiB it does not keep is read in ranged
/// GETs (206), every byte right; an object overwritten since the listing (412 to
/// `If-Match`) fails its read named as the full cache's fetch names it, counted in
/// `source_errors`. Failed before the fix: EIO for the large one, and the overwritten one
/// blamed on the partial cache with nothing counted.
#[test]
fn a_partial_cache_streams_large_objects_and_names_changed_ones() {
    if !require_fuse() || !require_mpi() {
        return;
    }
    let Some(python) = moto_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let server = S3Server::start(&python, &tmp.path().join("moto.log"));
    let huge = (17 << 20) + 5;
    let files = [
        ("a/huge.npz".to_string(), huge),
        ("a/small.bin".to_string(), 3000),
        ("b/changed.bin".to_string(), 4000),
    ];
    write_tree(tmp.path(), &files, &[]);
    server.upload(BUCKET, "big", &tmp.path().join("src"));
    let mut launcher = mpirun(1);
    launcher.envs(S3Server::env(&server.endpoint()));
    let source = format!("s3://{BUCKET}/big");
    let extra = ["--cache-size", "1K"];
    let job = MpiJob::start_from(launcher, source.as_ref(), tmp.path(), 1, SEED, 0.5, &extra);
    let view = job.mounts[0].join("epoch-0");
    let (_, ranged) = server.object_gets(BUCKET, "big");
    let src = tmp.path().join("src");
    let got = std::fs::read(view.join("a/huge.npz")).unwrap();
    assert!(
        got == std::fs::read(src.join("a/huge.npz")).unwrap(),
        "huge.npz"
    );
    let (_, ranged_after) = server.object_gets(BUCKET, "big");
    assert!(
        ranged_after - ranged >= 5,
        "{} ranged GETs",
        ranged_after - ranged
    );
    server.put(BUCKET, &[("big/b/changed.bin", &b"other bytes"[..])]);
    let read = std::fs::read(view.join("b/changed.bin"));
    assert_eq!(read.unwrap_err().raw_os_error(), Some(libc::EIO));
    let status = job.status(0);
    let problems = status["cache"]["problems"].to_string();
    let needle = format!("s3://{BUCKET}/big/b/changed.bin: the object changed since the listing");
    assert!(problems.contains(&needle), "{needle:?} not in {problems}");
    assert!(
        status["cache"]["source_errors"].as_u64() >= Some(1),
        "{status}"
    );
    let small = std::fs::read(view.join("a/small.bin")).unwrap();
    assert_eq!(small, std::fs::read(src.join("a/small.bin")).unwrap());
    job.unmount();
}

/// 600 TFRecord records in 3 shards under `dir/src`: the folder and the shard names, sorted.
fn tfrecord_shards(dir: &Path) -> (PathBuf, Vec<String>) {
    let src = dir.join("src");
    crate::common::records::make_records(&src, "tfrecord", 600, 3);
    let mut shards: Vec<String> = (std::fs::read_dir(&src).unwrap())
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    shards.sort();
    (src, shards)
}
