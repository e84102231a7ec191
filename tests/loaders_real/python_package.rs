//! The Python package (`python/`, `import shufflefs`): its version is the binary's, `pip
//! install ./python` gives an importable package, and its unit tests (`python/tests`, on
//! fake mounts: the helpers, progress lines and ETA, the torch and tf.data datasets) pass.

use std::path::Path;
use std::process::Command;
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

#[test]
fn the_python_package_has_the_binarys_version() {
    let cargo = toml_version(&repo().join("Cargo.toml"));
    assert_eq!(cargo, env!("CARGO_PKG_VERSION"));
    assert_eq!(toml_version(&repo().join("python/pyproject.toml")), cargo);
    let init = std::fs::read_to_string(repo().join("python/shufflefs/__init__.py")).unwrap();
    assert!(
        init.contains(&format!("__version__ = \"{cargo}\"")),
        "python/shufflefs/__init__.py: __version__ is not {cargo}"
    );
}

#[test]
fn pip_installs_the_package() {
    let Some(python) = venv_python("import setuptools", "setuptools") else {
        return;
    };
    let target = tempfile::tempdir().unwrap();
    let pip = [
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "--target",
    ];
    check(
        "pip install ./python",
        &run_with_timeout(
            Command::new(&python)
                .args(pip)
                .arg(target.path())
                .arg(repo().join("python")),
            Duration::from_secs(180),
        ),
    );
    let out = check(
        "import shufflefs",
        &Command::new(&python)
            .args(["-c", "import shufflefs, shufflefs.progress as p; print(shufflefs.__file__, shufflefs.check_version())"])
            .current_dir(target.path())
            .env("PYTHONPATH", target.path())
            .env("SHUFFLEFS", BIN)
            .output()
            .unwrap(),
    );
    let file = out.split_whitespace().next().unwrap();
    assert!(Path::new(file).starts_with(target.path()), "{out}");
    assert!(out.trim_end().ends_with(env!("CARGO_PKG_VERSION")), "{out}");
}

/// One process per group: torch and tensorflow in one process abort (their LLVMs clash).
#[test]
fn the_python_unit_tests_pass() {
    let Some(python) = venv_python("import torch, torchvision, tensorflow, PIL", "the loaders")
    else {
        return;
    };
    for modules in [
        &["test_helpers", "test_progress"][..],
        &["test_torch"],
        &["test_tf"],
    ] {
        let out = run_with_timeout(
            Command::new(&python)
                .args(["-m", "unittest"])
                .args(modules)
                .current_dir(repo().join("python/tests"))
                .env("PYTHONPATH", repo().join("python"))
                .env("SHUFFLEFS", BIN)
                .env("TF_CPP_MIN_LOG_LEVEL", "3"),
            Duration::from_secs(300),
        );
        check(&format!("python -m unittest {modules:?}"), &out);
        let report = String::from_utf8_lossy(&out.stderr);
        assert!(!report.contains("skipped"), "{report}");
    }
}
