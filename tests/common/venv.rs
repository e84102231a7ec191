//! The repository's own files and the Python venv of `mount-helpers/install-python.sh`, for
//! tests that run scripts or real loaders. The examples import this checkout's Python package
//! (`python/`, `import shufflefs`) through `PYTHONPATH` ([`with_package`]): nothing is
//! installed into the venv, which test processes of other checkouts share at the same time (a
//! reinstall there would swap the package under their feet). `pip install ./python` itself is
//! checked in a throwaway venv (`loaders_real python_package`).

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
    let missing =
        format!("no Python venv with {what}; run `source mount-helpers/install-python.sh`");
    venv_python_for(
        imports,
        ("the loaders' venv", "SHUFFLEFS_REQUIRE_LOADERS"),
        missing,
    )
}

/// The venv's python if it runs `imports`, else `None`: a skip, or a failure when the
/// variable of `(what, require_var)` is set (see `skip::require`), saying `missing`.
pub fn venv_python_for(
    imports: &str,
    (what, require_var): (&str, &str),
    missing: String,
) -> Option<PathBuf> {
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
    require(what, require_var, (!usable).then_some(missing))
        .then_some(python)
        .flatten()
}

/// A `PYTHONPATH` under which python imports this checkout's package (`python/`) before any
/// installed copy, then the folders of `more` (`:`-separated, may be empty).
pub fn package_pythonpath(more: &str) -> String {
    let package = repo().join("python");
    let package = package.to_str().expect("a UTF-8 checkout path");
    if more.is_empty() {
        package.to_string()
    } else {
        format!("{package}:{more}")
    }
}

/// `cmd` imports this checkout's package: `PYTHONPATH` set (for an `mpirun`, pass
/// `-x PYTHONPATH` too).
pub fn with_package(cmd: &mut Command) -> &mut Command {
    cmd.env("PYTHONPATH", package_pythonpath(""))
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

/// The number a script printed as `NAME=VALUE` in `stdout` (the first one); panics naming
/// it when there is none.
pub fn printed_value(stdout: &str, name: &str) -> f64 {
    let at =
        (stdout.find(&format!("{name}="))).unwrap_or_else(|| panic!("no {name} in:\n{stdout}"));
    let value = stdout[at + name.len() + 1..].split_whitespace().next();
    value.unwrap().parse().unwrap()
}
