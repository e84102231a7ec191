#!/usr/bin/env python3
"""Reports import circles between the crate's modules; exits 1 when there is one.

    python3 .ci/import-cycles.py [--depth N] [--strict] [SRC_DIR]   # default: src/ beside .ci/

Why: a circle between two modules means neither can be read, tested or moved without the
other; the layers in README "Architecture" only stay layers if nothing points back up. No
dependencies (no `cargo modules`, no nightly), so CI and a newcomer's machine can run it.

Two graphs, each checked for circles:
- folders: the crate's top-level modules (`cache`, `plan`, `node`, ...: the layers of README
  "Architecture"); an edge is any reference from a file of one to an item of the other.
- modules: a node is a file's module, named by its path (`src/cache/files.rs` is
  `cache::files`, `src/plan/mod.rs` is `plan`, `src/dataset/records/tar.rs` is
  `dataset::records::tar`); only edges inside one top-level folder (the folder graph has the
  others). `--depth 2` cuts modules to their first two levels instead (`dataset::records`
  then stands for the whole `records/` folder, so its files count as one module).
An inline `mod tests { .. }` belongs to its file's module, but its `super::` is resolved as
Rust does. `src/lib.rs` (only declares) and `src/main.rs` (another crate) are not nodes. Test
code counts: a test that imports its own caller is a circle in the test build too.

The references:
- A reference is one path from code in A to an item defined in B: `use` paths
  (groups, `self`, `as`, globs), and paths in code that start with `crate::`, `super::`,
  `self::` or a name bound to a module (a child module, or a `use` of a module). Comments and
  string literals are skipped, so doc links do not count.
- Paths are followed to where the item is *defined*: `crate::cache::Bitset`, when
  `cache/mod.rs` only has `pub use bitset::Bitset`, is an edge to `cache::bitset`, not `cache`.
  So a circle cannot hide behind a parent's re-export.

The parent rule: references from a module to its own descendants (`cache` -> `cache::files`,
`dataset::records` -> `dataset::records::tar`) are no edges. A parent declares its children
(`mod files;`), re-exports their items (`pub use files::FileBackend;`) and wires them (an
`open` that picks a backend): it is the folder's front door, and its children may use the
shared items it defines (their `super::`), which is how Rust modules are meant to nest. With
the parent's own references counted, every such front door would be a "circle" with each
child it wires. `--strict` counts them, except the declarations and `pub use` re-exports,
for a look at which parents do more than declare and re-export.

Output: each circle (strongly connected component with more than one node): its nodes, the
shortest circle through each of them, then every edge inside it with the file:line of each
reference.
"""

import bisect
import os
import re
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rust_text import blank_code as strip  # noqa: E402

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def module_of(src, path):
    rel = os.path.relpath(path, src)[: -len(".rs")].split(os.sep)
    if rel[-1] == "mod":
        rel = rel[:-1]
    return tuple(rel)


def parse_use_tree(text, i):
    """Parses a use tree from offset i up to ';'. Returns (leaves, end), each leaf being
    (segments, alias, offset); a glob leaf ends with '*'."""
    tok = re.compile(r"\s*(\$?" + IDENT + r"|::|\{|\}|,|\*|;)")
    tokens = []
    while True:
        m = tok.match(text, i)
        if not m:
            return [], i
        tokens.append((m.group(1), m.start(1)))
        i = m.end()
        if m.group(1) == ";":
            break
    leaves, pos = [], 0

    def tree(prefix):
        nonlocal pos
        segs, at = list(prefix), None
        while True:
            t, off = tokens[pos]
            if t == "{":
                pos += 1
                while tokens[pos][0] != "}":
                    tree(segs)
                    if tokens[pos][0] == ",":
                        pos += 1
                pos += 1
                return
            if t == "::":
                pos += 1
                continue
            if t in (",", "}", ";"):
                break
            if t == "as":
                pos += 1
                leaves.append((segs, tokens[pos][0], at))
                pos += 1
                return
            segs.append(t)
            at = off
            pos += 1
        if len(segs) > len(prefix):
            leaves.append((segs, None, at))

    try:
        tree([])
    except IndexError:  # not a use tree after all (`use<'a>` bounds, a macro's fragments)
        return [], i
    return leaves, i


class File:
    def __init__(self, src, path):
        self.path = os.path.relpath(path, os.path.dirname(src.rstrip(os.sep)) or ".")
        self.module = module_of(src, path)
        with open(path, encoding="utf-8") as f:
            self.text = strip(f.read())
        self.newlines = [k for k, c in enumerate(self.text) if c == "\n"]
        self.inline = []  # (start, end, name) of inline `mod name { .. }`
        for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{", self.text):
            depth, j = 1, m.end()
            while j < len(self.text) and depth:
                depth += {"{": 1, "}": -1}.get(self.text[j], 0)
                j += 1
            self.inline.append((m.start(), j, m.group(1)))
        self.uses = []  # (scope, is_pub, segments, alias, offset)
        self.use_spans = []
        pat = r"(?<![\w:$])(pub(?:\s*\([^)]*\))?\s+)?use\s+"
        for m in re.finditer(pat, self.text):
            leaves, end = parse_use_tree(self.text, m.end())
            self.use_spans.append((m.start(), end))
            for segs, alias, off in leaves:
                self.uses.append((self.scope(m.start()), bool(m.group(1)), segs, alias, off))

    def scope(self, offset):
        inner = [name for (a, b, name) in self.inline if a <= offset < b]
        return self.module + tuple(inner)

    def line(self, offset):
        return bisect.bisect_right(self.newlines, offset - 1) + 1

    def in_use(self, offset):
        return any(a <= offset < b for a, b in self.use_spans)


class Crate:
    def __init__(self, src):
        self.files = []
        for root, _, names in os.walk(src):
            for name in sorted(names):
                path = os.path.join(root, name)
                top = os.path.relpath(path, src) in ("lib.rs", "main.rs")
                if name.endswith(".rs") and not top:
                    self.files.append(File(src, path))
        self.modules = {f.module for f in self.files}
        for f in self.files:
            for a, _, _ in f.inline:
                self.modules.add(f.scope(a + 1))
        for m in list(self.modules):  # parents of nested files (`a/b/c.rs` without `a/b.rs`)
            self.modules.update(m[:k] for k in range(1, len(m)))
        self.bindings = defaultdict(dict)  # scope -> name -> module bound there
        self.reexports = defaultdict(dict)  # module -> name -> absolute path
        self.globs = defaultdict(list)  # scope -> modules glob-imported there
        for m in self.modules:
            if len(m) > 1:
                self.bindings[m[:-1]][m[-1]] = m
        self.collect_uses()

    def absolute(self, scope, segs):
        """The use path from the crate root, or None for another crate (std, clap, ...)."""
        head, rest = segs[0], list(segs[1:])
        if head in ("crate", "$crate"):
            return rest
        if head == "self":
            return list(scope) + rest
        if head == "super":
            base = list(scope[:-1])
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
            return base + rest
        bound = self.bound(scope, head)
        return None if bound is None else list(bound) + rest

    def bound(self, scope, name):
        if name in self.bindings[scope]:
            return self.bindings[scope][name]
        for g in self.globs[scope]:
            if name in self.bindings[g]:
                return self.bindings[g][name]
        return None

    def collect_uses(self):
        # Two rounds, so a `use` may start with a module another `use` bound.
        for _ in range(2):
            for f in self.files:
                for scope, is_pub, segs, alias, _ in f.uses:
                    path = self.absolute(scope, segs)
                    if path is None:
                        continue
                    if path and path[-1] == "*":
                        glob = tuple(path[:-1])
                        if glob in self.modules and glob not in self.globs[scope]:
                            self.globs[scope].append(glob)
                        continue
                    name = alias or (segs[-1] if segs[-1] != "self" else segs[-2])
                    if path and path[-1] == "self":
                        path = path[:-1]
                    if tuple(path) in self.modules:
                        self.bindings[scope][name] = tuple(path)
                    if is_pub and path:
                        self.reexports[scope][name] = path

    def defining(self, path, depth=0):
        """The module where the item `path` (absolute) is defined."""
        cur = ()
        for k, seg in enumerate(path):
            if seg in ("*", "self"):
                break
            if cur + (seg,) in self.modules:
                cur += (seg,)
                continue
            target = self.reexports[cur].get(seg)
            if target is not None and depth < 16:
                return self.defining(target + list(path[k + 1 :]), depth + 1)
            break
        return cur

    def references(self):
        """Every reference to an item of this crate: (from module, defining module, file:line,
        in a `pub use`), modules as full paths."""
        found, files = [], {f.module for f in self.files}

        def add(f, path, offset, is_pub):
            target = self.defining(path)
            while target and target not in files:  # an inline module: its file's
                target = target[:-1]
            if target and target != f.module:
                found.append((f.module, target, f"{f.path}:{f.line(offset)}", is_pub))

        for f in self.files:
            for scope, is_pub, segs, _, offset in f.uses:
                path = self.absolute(scope, segs)
                if path and path[-1] == "self":
                    path = path[:-1]
                # A `use` that only names a module binds it; the paths through it count.
                if path is not None and tuple(path) not in self.modules:
                    add(f, path, offset, is_pub)
            pat = r"(?<![\w:$.])(\$?" + IDENT + r")((?:\s*::\s*" + IDENT + r")+)"
            for m in re.finditer(pat, f.text):
                if f.in_use(m.start()):
                    continue
                scope = f.scope(m.start())
                head = m.group(1)
                keyword = head in ("crate", "$crate", "self", "super")
                if not keyword and self.bound(scope, head) is None:
                    continue
                segs = [head] + [s.strip() for s in m.group(2).split("::")[1:]]
                path = self.absolute(scope, segs)
                if path is not None:
                    add(f, path, m.start(), False)
        return found


def layer_edges(refs):
    """Between top-level modules (folders)."""
    edges = defaultdict(list)
    for src, dst, at, _ in refs:
        if src[0] != dst[0]:
            edges[(src[0], dst[0])].append(at)
    return edges


def sibling_edges(refs, depth, strict):
    """Between the modules of one folder (cut to `depth` levels); a parent's edges to its
    descendants only in strict mode, and even then not its `pub use` re-exports."""
    edges = defaultdict(list)
    for src, dst, at, is_pub in refs:
        a, b = src[:depth], dst[:depth]
        if a[0] != b[0] or a == b:
            continue
        if b[: len(a)] == a and (not strict or is_pub):
            continue  # the parent rule
        edges[("::".join(a), "::".join(b))].append(at)
    return edges


def components(graph):
    """Strongly connected components (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def circles(edges):
    graph = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
        graph[b]
    return sorted(c for c in components(graph) if len(c) > 1)


def shortest_circle(edges, members, start):
    """The shortest path start -> .. -> start inside one component (breadth first)."""
    prev, queue = {start: None}, [start]
    for v in queue:
        for a, b in sorted(edges):
            if a != v or b not in members:
                continue
            if b == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1] + [start]
            if b not in prev:
                prev[b] = v
                queue.append(b)
    return []


def by_line(at):
    path, _, line = at.rpartition(":")
    return path, int(line)


def report(kind, edges):
    found = circles(edges)
    for c in found:
        print(f"import circle between {kind}: {' <-> '.join(c)}")
        shown = set()
        for start in c:
            path = shortest_circle(edges, set(c), start)
            if path and frozenset(path) not in shown:
                shown.add(frozenset(path))
                print(f"  circle: {' -> '.join(path)}")
        for a, b in sorted(edges):
            if a in c and b in c:
                print(f"  {a} -> {b}")
                for at in sorted(set(edges[(a, b)]), key=by_line):
                    print(f"      {at}")
    return len(found)


def main():
    args = sys.argv[1:]
    strict = "--strict" in args
    args = [a for a in args if a != "--strict"]
    depth = 64
    if "--depth" in args:
        k = args.index("--depth")
        depth = int(args[k + 1])
        del args[k : k + 2]
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.normpath(args[0] if args else os.path.join(here, "..", "src"))
    refs = Crate(src).references()
    layers, siblings = layer_edges(refs), sibling_edges(refs, depth, strict)
    found = report("folders", layers) + report("modules", siblings)
    if found:
        print(f"{found} import circle(s); move what both sides share into a leaf module")
        return 1
    print(f"no import circles ({len(refs)} references, {len(layers)} folder edges, "
          f"{len(siblings)} module edges)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
