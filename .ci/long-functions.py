#!/usr/bin/env python3
"""Lists every `fn` in src/ with its length in lines, longest first.

    python3 .ci/long-functions.py [--top N] [--over LINES] [SRC_DIR]   # default: src/ beside .ci/

Why: the working rule is that a function reads in one sitting (aim: none over ~80 lines outside
tests); this shows where that does not hold yet. No dependencies, so CI and a newcomer can run it.

What counts: a function's length runs from its `fn` line to its closing brace, both included
(attributes and doc comments above it do not count). Test code does not count: items under
`#[cfg(test)]` (inline `mod tests { .. }` and single items), `#[test]` functions, files named
`tests.rs`, and files a `#[cfg(test)] mod name;` declares. Nested functions and closures count
inside their enclosing function; a nested `fn` is also listed on its own.

Output: `lines  file:line  path::name`, longest first (`--top N` cuts the list, `--over LINES`
keeps only the longer ones and exits 1 when any is left, for a CI gate).
"""

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rust_text import blank_code  # noqa: E402

FN_RE = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")
MOD_DECL_RE = re.compile(r"\bmod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;")
IMPL_RE = re.compile(r"\b(impl|trait)\b")


def match_brace(code, open_at):
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


def item_end(code, start):
    """Where the item starting at `start` ends: its matching `}` or its `;`, whichever first."""
    for j in range(start, len(code)):
        if code[j] == ";":
            return j
        if code[j] == "{":
            return match_brace(code, j)
    return len(code) - 1


def test_ranges(code):
    """Spans of the code that are test-only: items after `#[cfg(test)]` or `#[test]`."""
    spans, test_mods = [], []
    for m in re.finditer(r"#\[\s*(cfg\s*\(\s*test\s*\)|test)\s*\]", code):
        j = m.end()
        # Skip further attributes between the cfg and the item.
        while True:
            rest = code[j:]
            stripped = rest.lstrip()
            j += len(rest) - len(stripped)
            if stripped.startswith("#["):
                depth, k = 0, j
                while k < len(code):
                    if code[k] == "[":
                        depth += 1
                    elif code[k] == "]":
                        depth -= 1
                        if depth == 0:
                            break
                    k += 1
                j = k + 1
            else:
                break
        end = item_end(code, j)
        spans.append((m.start(), end))
        decl = MOD_DECL_RE.match(code[j : end + 1].replace("pub(crate) ", "").replace("pub ", ""))
        if decl and code[end] == ";":
            test_mods.append(decl.group(1))
    return spans, test_mods


def module_path(rel):
    parts = rel[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return "::".join(parts)


def scan(src):
    files, test_files = [], set()
    for root, _, names in os.walk(src):
        for name in sorted(names):
            if name.endswith(".rs"):
                files.append(os.path.join(root, name))
    found = []
    for path in sorted(files):
        with open(path, encoding="utf-8") as f:
            code = blank_code(f.read())
        spans, test_mods = test_ranges(code)
        folder = os.path.dirname(path)
        if os.path.basename(path) not in ("mod.rs", "lib.rs", "main.rs"):
            folder = os.path.join(folder, os.path.basename(path)[:-3])
        for name in test_mods:
            test_files.add(os.path.join(folder, name + ".rs"))
            test_files.add(os.path.join(folder, name, "mod.rs"))
        found.append((path, code, spans))
    rows = []
    for path, code, spans in found:
        if os.path.basename(path) == "tests.rs" or path in test_files:
            continue
        if any(path.startswith(t[: -len("mod.rs")]) for t in test_files if t.endswith("mod.rs")):
            continue
        owners = impl_owners(code)
        for m in FN_RE.finditer(code):
            at = m.start()
            if any(a <= at <= b for a, b in spans):
                continue
            end = item_end(code, m.end())
            if code[end] != "}":
                continue  # a declaration in a trait or extern block
            first = code.count("\n", 0, at) + 1
            last = code.count("\n", 0, end) + 1
            owner = next((o for a, b, o in owners if a < at < b), None)
            name = f"{owner}::{m.group(1)}" if owner else m.group(1)
            rows.append((last - first + 1, os.path.relpath(path, os.path.dirname(src)), first, name))
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    return rows


def impl_owners(code):
    """(start, end, type name) of each `impl .. Type {` / `trait Name {` block."""
    owners = []
    for m in re.finditer(r"\b(impl|trait)\b", code):
        brace = code.find("{", m.end())
        semi = code.find(";", m.end())
        if brace < 0 or (0 <= semi < brace):
            continue
        head = re.sub(r"<[^{}]*?>", "", code[m.end() : brace])
        head = head.split(" where ")[0]
        if " for " in head:
            head = head.split(" for ")[1]
        words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", head)
        if words:
            owners.append((m.start(), match_brace(code, brace), words[-1] if m.group(1) == "trait" else words[-1]))
    return owners


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", nargs="?", default=os.path.join(here, "..", "src"))
    ap.add_argument("--top", type=int, default=0)
    ap.add_argument("--over", type=int, default=0)
    args = ap.parse_args()
    rows = scan(os.path.normpath(args.src))
    if args.over:
        rows = [r for r in rows if r[0] > args.over]
    if args.top:
        rows = rows[: args.top]
    for lines, path, line, name in rows:
        print(f"{lines:5}  {path}:{line}  {name}")
    return 1 if args.over and rows else 0


if __name__ == "__main__":
    sys.exit(main())
