//! Phase 3: the seed and the index, decided by rank 0. The index is reused from rank 0's
//! cache when its settings match (rank 0 ships it), else built from the source: a folder
//! source (ImageFolder, `--format tree`) is listed by every rank, each its part, and
//! combined into the same manifest on every rank (`dataset::scan::split`); records and S3
//! sources are still scanned by rank 0 alone, which ships the manifest.

use std::io::Read;
use std::path::Path;

use super::StartError;
use super::agree::{self, PhaseError, agreed, decided};
use super::shared::{self, Encoded};
use crate::cache::{CacheDir, CacheState, FORMAT_VERSION};
use crate::comm::{Comm, Reduce, decide};
use crate::config::MountConfig;
use crate::dataset::scan::{self as split, Gather, SplitError};
use crate::dataset::side::{self, Globs};
use crate::dataset::{Format, Manifest};

/// The seed: `--seed`, else the one rank 0's reusable cache was built with, else random.
pub(crate) fn seed(
    comm: &mut dyn Comm,
    config: &MountConfig,
    reusable: Option<&CacheState>,
) -> Result<u64, StartError> {
    let outcome = decide(comm, || {
        let seed = config
            .seed
            .or(reusable.map(|s| s.seed))
            .unwrap_or_else(random_seed);
        Ok::<_, String>(seed.to_le_bytes())
    });
    let bytes = decided(comm, outcome)?;
    let bytes = bytes
        .try_into()
        .map_err(|_| StartError::Malformed("seed"))?;
    Ok(u64::from_le_bytes(bytes))
}

/// A state rank 0 may take the seed and index from: same source and cache format, and no
/// `--reset-cache`.
pub(crate) fn reusable<'a>(
    config: &MountConfig,
    state: Option<&'a CacheState>,
) -> Option<&'a CacheState> {
    state.filter(|s| {
        !config.reset_cache && same_source(&s.source, &config.source) && s.format == FORMAT_VERSION
    })
}

/// Whether the source a cache recorded is `now`'s: the same text, or the same folder by
/// another path (a symlink, a trailing slash, relative), compared canonically.
pub(crate) fn same_source(recorded: &str, now: &Path) -> bool {
    if recorded == now.display().to_string() {
        return true;
    }
    match (Path::new(recorded).canonicalize(), now.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// The source as the cache state names it: the recorded text when it is the same source by
/// another path (so a remount through a symlink is no difference), else the one given now.
pub(crate) fn source_name(config: &MountConfig, state: Option<&CacheState>) -> String {
    match state {
        Some(s) if same_source(&s.source, &config.source) => s.source.clone(),
        _ => config.source.display().to_string(),
    }
}

/// The index (loaded from rank 0's cache when reusable, else built from the source), its
/// encoding, and whether the source was scanned for it, on every rank. In a job of several
/// ranks rank 0 ships the encoding to each host once, where its ranks map it
/// (`shared::distribute`: one copy of the names per host); alone, it keeps the manifest it
/// loaded or built.
/// A folder source on several ranks is listed by all of them instead (`scan_split`): rank
/// 0 then ships one byte, [`SPLIT`], and every rank ends with the same manifest.
/// Rank 0's names need no check: a scan's come from the kernel (no '/', NUL, '.', '..' or
/// over 255 bytes), the cache's were checked on load.
pub(crate) fn index(
    config: &MountConfig,
    comm: &mut dyn Comm,
    dir: &CacheDir,
    reusable: Option<&CacheState>,
) -> Result<(Manifest, Encoded, bool), StartError> {
    let split = splits(config, comm);
    let per_host = comm.size() > 1;
    let (mut built, mut full) = (None, None);
    let outcome = decide(comm, || -> Result<Vec<u8>, String> {
        let (mut m, scanned) = match cached(config, dir, reusable) {
            Some(m) => (m, false),
            // Every rank lists its part: rank 0 only says so.
            None if split => return Ok(vec![SPLIT]),
            None => (scan(config)?, true),
        };
        // Owners from an earlier --allow-other mount are for a view others see alone.
        if !config.owners_per_entry() {
            m.clear_owners();
        }
        if per_host {
            // Sent to each host's first rank and mapped there (`shared`); the others
            // learn only that.
            full = Some(m.encode());
            return Ok(vec![PER_HOST, u8::from(scanned)]);
        }
        // Alone: the encoding stays here (a copy of it behind a flag byte would hold the
        // whole index twice more at once).
        full = Some(m.encode());
        built = Some(m);
        Ok(vec![ALONE, u8::from(scanned)])
    });
    let bytes = decided(comm, outcome)?;
    if bytes == [SPLIT] {
        let (m, bytes) = scan_split(config, comm)?;
        return Ok((m, Encoded::owned(bytes), true));
    }
    if let [ALONE, scanned] = bytes[..]
        && let (Some(m), Some(encoded)) = (built.take(), full.take())
    {
        return Ok((m, Encoded::owned(encoded), scanned == 1));
    }
    if let [PER_HOST, scanned] = bytes[..] {
        let (m, encoded) = shared::distribute(comm, full.unwrap_or_default())?;
        return Ok((m, encoded, scanned == 1));
    }
    // Rank 0 said something no rank sends.
    Err(StartError::Malformed("manifest"))
}

/// The index saved in rank 0's cache, if it was built with the same format and framing
/// (and neither `--rescan` nor `--allow-other` asks for a new one: see
/// `MountConfig::rescans`).
fn cached(config: &MountConfig, dir: &CacheDir, reusable: Option<&CacheState>) -> Option<Manifest> {
    if config.rescans() {
        return None;
    }
    let params = config.source_config.params();
    let m = reusable
        .and_then(|s| dir.load_manifest(s.manifest_fingerprint).ok().flatten())
        .filter(|m| config.format().fits(m, &params))
        .filter(|m| m.side_globs() == config.replicate.as_slice())?;
    tracing::info!(
        samples = m.len(),
        "manifest loaded from the cache; source not rescanned (--rescan to see its changes)"
    );
    Some(m)
}

/// The first byte of rank 0's answer that says the source is listed by every rank (after
/// 0: reused from the cache, 1: scanned by rank 0).
const SPLIT: u8 = 2;

/// The first byte of rank 0's answer that says the manifest goes to every host once and is
/// mapped there (`shared`); the second says whether it was scanned.
const PER_HOST: u8 = 3;

/// The first byte of a rank's answer to itself when it is the whole job: the manifest and
/// its encoding are here already; the second says whether it was scanned.
const ALONE: u8 = 4;

/// Whether the source is listed by every rank: a folder of files, in a job on more than one
/// host. On one host the ranks share its cores and its disk, so splitting the listing gains
/// nothing and costs memory (every rank gathers every part and builds the manifest at once:
/// 149-152 -> 158-160 MiB per rank at 10^6 files, 8 ranks, `benches/rank_memory.sh`);
/// rank 0 lists and broadcasts as before. Records and S3 sources are scanned by rank 0 alone.
fn splits(config: &MountConfig, comm: &dyn Comm) -> bool {
    let folders = matches!(config.format(), Format::Imagefolder | Format::Tree);
    let hosts = comm.hosts();
    let several_hosts = hosts.iter().any(|&h| h != hosts[0]);
    several_hosts && folders && !crate::dataset::s3::is_s3(&config.source)
}

/// The all-gather the split listing runs over.
struct Ranks<'a>(&'a mut dyn Comm);

impl Gather for Ranks<'_> {
    fn rank(&self) -> u32 {
        self.0.rank()
    }
    fn ranks(&self) -> u32 {
        self.0.size()
    }
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, String> {
        self.0.all_gather(mine).map_err(|e| e.to_string())
    }
    fn broadcast(&mut self, data: Vec<u8>) -> Result<Vec<u8>, String> {
        self.0.broadcast(0, data).map_err(|e| e.to_string())
    }
}

/// The index listed by every rank, each its part (collective): the manifest rank 0's scan
/// would give, and its encoding, on every rank. Side files (`--replicate`) are split out on
/// every rank alike (a `stat` per side file); one all-reduce of a checksum of the encoding
/// then checks that every rank holds the same manifest (a side file that changed between
/// two ranks' stats would not).
fn scan_split(
    config: &MountConfig,
    comm: &mut dyn Comm,
) -> Result<(Manifest, Vec<u8>), StartError> {
    let started = std::time::Instant::now();
    let (source, owners) = (&config.source, config.owners_per_entry());
    let world = comm.size();
    let listed = match config.format() {
        Format::Tree => split::scan_tree_split(source, owners, &mut Ranks(comm)),
        _ => split::scan_split(source, owners, &mut Ranks(comm)),
    };
    let (m, mine) = listed.map_err(|e| match e {
        SplitError::Failed(failures) => agree::refusal(failures, world),
        e => agree::refusal(vec![(comm.rank(), e.to_string())], world),
    })?;
    let sided = Globs::parse(&config.replicate)
        .and_then(|globs| side::split(m, source, &globs).map_err(|e| e.to_string()));
    let m = agreed(comm, sided.map_err(PhaseError::Mine)).map_err(said_once)?;
    let bytes = m.encode();
    let fp = u64::from(crc32c::crc32c(&bytes));
    let both = comm.all_reduce(&[fp, !fp], Reduce::Max)?;
    if both != [fp, !fp] {
        let msg = format!(
            "the ranks listed different sources at {}: it changed during the listing, or is \
             not the same folder on every host; mount again once it is",
            source.display()
        );
        return Err(agree::refusal(vec![(0, msg)], world));
    }
    if comm.rank() == 0 {
        log_scanned(&m, started);
    }
    tracing::debug!(
        folders = mine.folders,
        samples = mine.samples,
        "this rank's part listed"
    );
    Ok((m, bytes))
}

/// A refusal whose ranks failed alike said once, by the first of them.
fn said_once(e: StartError) -> StartError {
    match e {
        StartError::Refused {
            mut failures,
            world,
        } => {
            failures.dedup_by(|later, earlier| later.1 == earlier.1);
            agree::refusal(failures, world)
        }
        e => e,
    }
}

/// The index built from the source by rank 0 alone.
fn scan(config: &MountConfig) -> Result<Manifest, String> {
    let started = std::time::Instant::now();
    let params = config.source_config.params();
    let m = config
        .format()
        .build_index(&config.source, &params, config.owners_per_entry())
        .map_err(|e| e.to_string())?;
    let globs = Globs::parse(&config.replicate)?;
    let m = side::split(m, &config.source, &globs).map_err(|e| e.to_string())?;
    log_scanned(&m, started);
    Ok(m)
}

fn log_scanned(m: &Manifest, started: std::time::Instant) {
    tracing::info!(
        classes = m.class_count(),
        records = m.records().map(|r| r.records()),
        samples = m.len(),
        skipped = m.skipped.len(),
        secs = started.elapsed().as_secs_f64(),
        "source scanned"
    );
    for s in &m.skipped {
        tracing::warn!(path = %s.path, reason = %s.reason, "sample skipped");
    }
}

fn random_seed() -> u64 {
    let mut buf = [0u8; 8];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf)) {
        Ok(()) => u64::from_le_bytes(buf),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::same_source;

    #[test]
    fn a_source_by_another_path_is_the_same_source() {
        let tmp = tempfile::tempdir().unwrap();
        let ds = tmp.path().join("ds");
        std::fs::create_dir(&ds).unwrap();
        std::os::unix::fs::symlink(&ds, tmp.path().join("link")).unwrap();
        let recorded = ds.display().to_string();
        assert!(same_source(&recorded, &tmp.path().join("link")));
        assert!(same_source(&recorded, Path::new(&format!("{recorded}/"))));
        assert!(same_source(&recorded, &tmp.path().join("link/../ds")));
        let cwd = std::env::current_dir().unwrap();
        assert!(same_source(&cwd.display().to_string(), Path::new(".")));
        assert!(!same_source(&recorded, tmp.path()));
        assert!(!same_source(
            "/no/such/source",
            Path::new("/no/such/source/x")
        ));
    }
}
