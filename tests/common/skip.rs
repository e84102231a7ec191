//! Skips: one `require_*` per outside need. Each returns false (after a `SKIPPED:` note) when
//! the machine lacks the need, or panics when its `SHUFFLEFS_REQUIRE_*` variable is `1`, so a
//! skip in CI is a failure. The Python loaders' skip is `venv::venv_python`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Whether an executable called `name` is on `PATH`.
pub fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| {
            fs::metadata(dir.join(name))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

pub(crate) fn require(what: &str, var: &str, missing: Option<String>) -> bool {
    let Some(why) = missing else {
        return true;
    };
    if std::env::var(var).is_ok_and(|v| v == "1") {
        panic!("{var}=1 but {what} is not usable here: {why}");
    }
    eprintln!("SKIPPED: {what} is not usable here ({why}); set {var}=1 to fail instead");
    false
}

/// True when real FUSE mounts can be made: `/dev/fuse` exists and `fusermount3` is on
/// `PATH` (or we are root). Otherwise prints a skip note and returns false, or panics when
/// `SHUFFLEFS_REQUIRE_FUSE=1` (CI).
pub fn require_fuse() -> bool {
    let missing = if !Path::new("/dev/fuse").exists() {
        Some("/dev/fuse does not exist".to_string())
    } else if !is_root() && !on_path("fusermount3") {
        Some("fusermount3 is not on PATH and we are not root".to_string())
    } else {
        None
    };
    require("FUSE", "SHUFFLEFS_REQUIRE_FUSE", missing)
}

/// True when `mpirun` is on `PATH`. Otherwise prints a skip note and returns false, or panics
/// when `SHUFFLEFS_REQUIRE_MPI=1` (CI).
pub fn require_mpi() -> bool {
    let missing = (!on_path("mpirun")).then(|| "mpirun is not on PATH".to_string());
    require("MPI", "SHUFFLEFS_REQUIRE_MPI", missing)
}

/// True when emulated hosts (`mount-helpers/shufflefs-cluster`) can run here: root, `ip`,
/// `tc`, `nsenter`, `unshare`, `mpirun`, `python3` and `/dev/fuse`. Otherwise prints a skip
/// note and returns false, or panics when `SHUFFLEFS_REQUIRE_CLUSTER=1` (CI).
pub fn require_cluster() -> bool {
    let tools = ["ip", "tc", "nsenter", "unshare", "mpirun", "python3"];
    let missing = if !is_root() {
        Some("network namespaces need root".to_string())
    } else if !Path::new("/dev/fuse").exists() {
        Some("/dev/fuse does not exist".to_string())
    } else {
        tools
            .iter()
            .find(|t| !on_path(t))
            .map(|tool| format!("{tool} is not on PATH"))
    };
    require("emulated hosts", "SHUFFLEFS_REQUIRE_CLUSTER", missing)
}

/// True when we are root, which a test needs for its own mounts (a small tmpfs as the
/// cache, say; `why` says what for). Otherwise prints a skip note and returns false, or
/// panics when `SHUFFLEFS_REQUIRE_FUSE=1` (CI), as these are mount tests.
pub fn require_root(why: &str) -> bool {
    let missing = (!is_root()).then(|| format!("not root, and this test {why}"));
    require("root", "SHUFFLEFS_REQUIRE_FUSE", missing)
}
