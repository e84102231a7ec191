//! Phase 3: the seed and the index, decided by rank 0. The index is reused from rank 0's
//! cache when its settings match, else built by the dataset format; rank 0 ships it.

use std::io::Read;
use std::path::Path;

use super::StartError;
use super::agree::decided;
use crate::cache::{CacheDir, CacheState, FORMAT_VERSION};
use crate::comm::{Comm, decide};
use crate::config::MountConfig;
use crate::dataset::Manifest;
use crate::dataset::side::{self, Globs};

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

/// Rank 0's index (loaded from its cache when reusable, else built from the source), its
/// encoding, and whether rank 0 scanned the source for it, on every rank. Rank 0 keeps the
/// manifest it built and ships its encoding (after one byte: scanned or not); only the
/// other ranks decode, so no rank holds more than one manifest and one encoding.
/// Rank 0's names need no check: a scan's come from the kernel (no '/', NUL, '.', '..' or
/// over 255 bytes), the cache's were checked on load.
pub(crate) fn index(
    config: &MountConfig,
    comm: &mut dyn Comm,
    dir: &CacheDir,
    reusable: Option<&CacheState>,
) -> Result<(Manifest, Vec<u8>, bool), StartError> {
    let mut built = None;
    let outcome = decide(comm, || -> Result<Vec<u8>, String> {
        let (mut m, scanned) = match cached(config, dir, reusable) {
            Some(m) => (m, false),
            None => (scan(config)?, true),
        };
        // Owners from an earlier --allow-other mount are for a view others see alone.
        if !config.owners_per_entry() {
            m.clear_owners();
        }
        let mut bytes = vec![u8::from(scanned)];
        bytes.extend(m.encode());
        built = Some(m);
        Ok(bytes)
    });
    let mut bytes = decided(comm, outcome)?;
    if bytes.is_empty() {
        return Err(StartError::Malformed("manifest"));
    }
    let scanned = bytes.remove(0) == 1;
    let manifest = match built {
        Some(m) => m,
        None => Manifest::decode(&bytes).map_err(|_| StartError::Malformed("manifest"))?,
    };
    Ok((manifest, bytes, scanned))
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

/// The index built from the source.
fn scan(config: &MountConfig) -> Result<Manifest, String> {
    let started = std::time::Instant::now();
    let params = config.source_config.params();
    let m = config
        .format()
        .build_index(&config.source, &params, config.owners_per_entry())
        .map_err(|e| e.to_string())?;
    let globs = Globs::parse(&config.replicate)?;
    let m = side::split(m, &config.source, &globs).map_err(|e| e.to_string())?;
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
    Ok(m)
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
