//! Which kind of run built a cache folder: coded (and with which cache fraction) or
//! partial-local. The plan's history depends on it like on the seed, so a remount of another
//! kind is refused. Recorded in a file of its own beside the state file, which predates
//! `--exchange coded`.

use serde::{Deserialize, Serialize};

use crate::config::MountConfig;

/// The file that says the cache was built by a coded run. Absent: partial-local.
const MODE_FILE: &str = "coded.json";

#[derive(Serialize, Deserialize, PartialEq, Debug)]
struct Mode {
    cache_fraction: f64,
}

fn mode_of(config: &MountConfig) -> Option<Mode> {
    config
        .coded_alpha()
        .map(|cache_fraction| Mode { cache_fraction })
}

/// Whether the cache folder `root`, which has a saved state, was built by a run of the same
/// kind as `config` (coded with the same `--cache-fraction`, or partial-local). The state file
/// predates `--exchange coded`, so this rides beside it. A refusal is a message: start-up
/// gathers it from every rank (`startup::agree`).
pub(crate) fn check_mode(root: &std::path::Path, config: &MountConfig) -> Result<(), String> {
    let recorded: Option<Mode> = match std::fs::read(root.join(MODE_FILE)) {
        Ok(bytes) => Some(serde_json::from_slice(&bytes).map_err(|e| {
            format!(
                "{}: unreadable ({e}); pass --reset-cache to rebuild the cache",
                root.join(MODE_FILE).display()
            )
        })?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("{}: {e}", root.join(MODE_FILE).display())),
    };
    let now = mode_of(config);
    if recorded == now {
        return Ok(());
    }
    let describe = |m: &Option<Mode>| match m {
        Some(m) => format!("--exchange coded --cache-fraction {}", m.cache_fraction),
        None => "--exchange partial".to_string(),
    };
    Err(format!(
        "cache folder {} was built with {}, now {}; pass --reset-cache to rebuild it, or use the old settings",
        root.display(),
        describe(&recorded),
        describe(&now)
    ))
}

/// Records the kind of run `config` starts in the cache folder `root` (see [`check_mode`]).
pub(crate) fn record_mode(root: &std::path::Path, config: &MountConfig) -> std::io::Result<()> {
    match mode_of(config) {
        Some(m) => crate::cache::write_atomic(
            root,
            MODE_FILE,
            &serde_json::to_vec(&m).expect("a mode serializes"),
        ),
        None => match std::fs::remove_file(root.join(MODE_FILE)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        },
    }
}
