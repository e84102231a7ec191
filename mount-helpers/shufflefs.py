"""Kept for scripts that import the helpers from this folder (`sys.path.insert(0,
".../mount-helpers"); import shufflefs`): this file loads the package in ../python/shufflefs
(the one source of truth) under the same name, submodules included (`shufflefs.torch`,
`shufflefs.tf`, `shufflefs.progress`). New scripts: `pip install ./python` and import it.
"""
import os as _os

_package = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "..", "python", "shufflefs")
_init = _os.path.join(_package, "__init__.py")
if not _os.path.exists(_init):
    raise ImportError(f"{_init} is missing: install the package instead (pip install ./python)")
# A module with __path__ is a package: `import shufflefs.torch` finds ../python/shufflefs/torch.py.
__path__ = [_package]
with open(_init) as _f:
    exec(compile(_f.read(), _init, "exec"))
