//! The Python package (`python/`, `import shufflefs`): its version is the binary's, `pip
//! install ./python` gives an importable package, and its unit tests (`python/tests`, on
//! fake mounts: the helpers, progress lines and ETA, the torch and tf.data datasets) pass.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use crate::common::*;

/// The `version = "..."` of a TOML file's first table that has one.
fn toml_version(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let line = (text.lines())
        .find(|l| l.starts_with("version = "))
        .unwrap_or_else(|| panic!("no version in {}", path.display()));
    line.trim_start_matches("version = ")
        .trim_matches('"')
        .into()
}

/// The version lives in two places: Cargo.toml and `shufflefs.__version__`, which
/// pyproject.toml reads (a dynamic version).
#[test]
fn the_python_package_has_the_binarys_version() {
    let cargo = toml_version(&repo().join("Cargo.toml"));
    assert_eq!(cargo, env!("CARGO_PKG_VERSION"));
    let pyproject = std::fs::read_to_string(repo().join("python/pyproject.toml")).unwrap();
    assert!(
        pyproject.contains("dynamic = [\"version\"]")
            && pyproject.contains("version = {attr = \"shufflefs.__version__\"}"),
        "python/pyproject.toml does not take its version from shufflefs.__version__"
    );
    let init = std::fs::read_to_string(repo().join("python/shufflefs/__init__.py")).unwrap();
    assert!(
        init.contains(&format!("__version__ = \"{cargo}\"")),
        "python/shufflefs/__init__.py: __version__ is not {cargo}"
    );
}

/// The system's python3 if it makes venvs with pip, else `None` (skip).
fn venv_maker() -> Option<()> {
    let ok = Command::new("python3")
        .args(["-c", "import venv, ensurepip"])
        .output()
        .is_ok_and(|o| o.status.success());
    let missing = (!ok).then(|| "python3 cannot make a venv with pip (python3-venv)".to_string());
    require("python3 -m venv", "SHUFFLEFS_REQUIRE_LOADERS", missing).then_some(())
}

/// `install-python.sh` puts the package into a fresh venv (a throwaway one, seeing the
/// system's site-packages, never the shared loaders' venv), offline: a venv whose
/// setuptools is older than 70.1 needs `wheel` for it, which the script adds where it can.
/// The installed package reports the binary's version (the dynamic version works).
#[test]
fn pip_installs_the_package() {
    if venv_maker().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let venv = tmp.path().join("venv");
    check(
        "python3 -m venv",
        &run_with_timeout(
            Command::new("python3")
                .args(["-m", "venv", "--system-site-packages"])
                .arg(&venv),
            Duration::from_secs(180),
        ),
    );
    let python = venv.join("bin/python");
    check(
        "install-python.sh (SHUFFLEFS_PACKAGE_ONLY=1)",
        &run_with_timeout(
            Command::new("bash")
                .arg("-c")
                .arg("source mount-helpers/install-python.sh")
                .current_dir(repo())
                .env("SHUFFLEFS_VENV", &venv)
                .env("SHUFFLEFS_PACKAGE_ONLY", "1")
                .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
            Duration::from_secs(300),
        ),
    );
    check(
        "setuptools>=70.1 or wheel in the venv (docs/python.md)",
        &Command::new(&python)
            .args(["-c", BUILDS_OFFLINE])
            .output()
            .unwrap(),
    );
    let out = check(
        "import shufflefs",
        &Command::new(&python)
            .args(["-c", "import importlib.metadata as m, shufflefs, shufflefs.progress; print(shufflefs.__file__, m.version('shufflefs'), shufflefs.check_version())"])
            .current_dir("/")
            .env_remove("PYTHONPATH")
            .env("SHUFFLEFS", BIN)
            .output()
            .unwrap(),
    );
    let words: Vec<&str> = out.split_whitespace().collect();
    assert!(Path::new(words[0]).starts_with(&venv), "{out}");
    assert_eq!(&words[1..], [env!("CARGO_PKG_VERSION"); 2], "{out}");
}

/// What an offline build (`--no-build-isolation`) needs of the venv's setuptools.
const BUILDS_OFFLINE: &str = "\
import importlib.util, sys, setuptools
v = tuple(int(x) for x in setuptools.__version__.split('.')[:2] if x.isdigit())
sys.exit(0 if v >= (70, 1) or importlib.util.find_spec('wheel') else
         f'setuptools {setuptools.__version__} without wheel: bdist_wheel is missing')
";

/// `python -m unittest MODULES` in python/tests with this checkout's package.
fn unittest(python: &Path, modules: &[&str]) -> Output {
    run_with_timeout(
        Command::new(python)
            .args(["-m", "unittest"])
            .args(modules)
            .current_dir(repo().join("python/tests"))
            .env("PYTHONPATH", package_pythonpath(""))
            .env("SHUFFLEFS", BIN)
            .env("TF_CPP_MIN_LOG_LEVEL", "3"),
        Duration::from_secs(300),
    )
}

/// The tests that need only the standard library (the helpers, the in-script mount, progress
/// lines and ETA, walk_epochs' accounting) run with the system's python3, loaders or not.
#[test]
fn the_stdlib_python_unit_tests_pass() {
    let modules = [
        "test_helpers",
        "test_launch",
        "test_progress",
        "test_walk_epochs",
    ];
    let out = unittest(Path::new("python3"), &modules);
    check(&format!("python3 -m unittest {modules:?}"), &out);
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(!report.contains("skipped"), "{report}");
}

/// One process per group: torch and tensorflow in one process abort (their LLVMs clash).
#[test]
fn the_loader_python_unit_tests_pass() {
    let Some(python) = venv_python("import torch, torchvision, tensorflow, PIL", "the loaders")
    else {
        return;
    };
    for modules in [&["test_torch"][..], &["test_tf"]] {
        let out = unittest(&python, modules);
        check(&format!("python -m unittest {modules:?}"), &out);
        let report = String::from_utf8_lossy(&out.stderr);
        assert!(!report.contains("skipped"), "{report}");
    }
}
