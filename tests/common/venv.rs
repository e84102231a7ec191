//! The repository's own files and the Python venv of `mount-helpers/install-python.sh`, for
//! tests that run scripts or real loaders. The venv gets this checkout's Python package
//! (`python/`, `import shufflefs`) installed whenever its installed copy differs: the examples
//! and the Slurm recipe import it like a user's script does.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::skip::require;

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The venv's python (`SHUFFLEFS_PYTHON`, else `mount-helpers/install-python.sh`'s) if it
/// runs `imports`, else `None` (skip; a failure under SHUFFLEFS_REQUIRE_LOADERS=1). `what`
/// names the packages in the message.
pub fn venv_python(imports: &str, what: &str) -> Option<PathBuf> {
    let python = std::env::var_os("SHUFFLEFS_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".cache/shufflefs/venv/bin/python"))
        })
        .filter(|p| p.exists());
    let usable = python.as_ref().is_some_and(|p| {
        Command::new(p)
            .args(["-c", imports])
            .env("TF_CPP_MIN_LOG_LEVEL", "3")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let missing = (!usable).then(|| {
        format!("no Python venv with {what}; run `source mount-helpers/install-python.sh`")
    });
    let python = require("the loaders' venv", "SHUFFLEFS_REQUIRE_LOADERS", missing)
        .then_some(python)
        .flatten()?;
    install_package(&python);
    Some(python)
}

/// Whether the `shufflefs` package `python` imports (outside the checkout) has the same
/// files as this checkout's `python/shufflefs`.
const SAME_PACKAGE: &str = "\
import importlib.util, pathlib, sys
spec = importlib.util.find_spec('shufflefs')
mine = pathlib.Path(sys.argv[1])
if spec is None or spec.origin is None:
    sys.exit(1)
there = pathlib.Path(spec.origin).parent
sys.exit(any((there / f.name).read_bytes() != f.read_bytes() if (there / f.name).exists() else True
             for f in mine.glob('*.py')))
";

/// Installs this checkout's `python/` into the venv of `python` unless it is there already
/// (one install at a time: a lock file in the venv). A python outside a venv is not touched:
/// the test stops, asking for the package to be installed.
pub fn install_package(python: &Path) {
    let package = repo().join("python");
    let same = || {
        Command::new(python)
            .args(["-c", SAME_PACKAGE])
            .arg(package.join("shufflefs"))
            .current_dir("/")
            .env_remove("PYTHONPATH")
            .status()
            .is_ok_and(|s| s.success())
    };
    if same() {
        return;
    }
    let in_venv = Command::new(python)
        .args(["-c", "import sys; sys.exit(sys.prefix == sys.base_prefix)"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        in_venv,
        "{} is no venv's python: install this checkout's package into it yourself \
         (pip install ./python)",
        python.display()
    );
    let lock = python.parent().unwrap().join("../.shufflefs-package.lock");
    let out = Command::new("flock")
        .arg(lock)
        .arg(python)
        .args([
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
        ])
        .args(["--force-reinstall"])
        .arg(&package)
        .output()
        .expect("flock runs");
    check("pip install ./python", &out);
    assert!(
        same(),
        "the installed shufflefs package is not this checkout's"
    );
}

/// Panics with both streams unless `out` succeeded.
pub fn check(what: &str, out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({})\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
