#!/usr/bin/env python3
"""Checks two structural rules of the Rust sources, as CI runs it:

1. no .rs file under crates/, src/, tests/, examples/ or benches/ is longer than LIMIT lines;
2. within each crate, no top-level module uses a module that (directly or through others)
   uses it: the graph of `crate::module` references between the files of a crate's src/ is
   acyclic (a folder module and its files count as one module; tests and docs are ignored).

Exits 1 and names the offenders otherwise. Usage: python3 scripts/check_structure.py
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
LIMIT = 1000


def rust_files(folder):
    for dirpath, _, files in os.walk(folder):
        if "/target" in dirpath:
            continue
        for f in files:
            if f.endswith(".rs"):
                yield os.path.join(dirpath, f)


def code_lines(text):
    """The lines outside `#[cfg(test)]` modules and comments."""
    out = []
    for line in text.split("\n"):
        if line.startswith("#[cfg(test)]"):
            break
        stripped = line.strip()
        if stripped.startswith("//"):
            continue
        out.append(line)
    return "\n".join(out)


def reexports(src):
    """Item name -> the module whose item the crate root re-exports (`pub use m::{A, B}`)."""
    names = {}
    lib = os.path.join(src, "lib.rs")
    text = open(lib).read() if os.path.exists(lib) else ""
    for module, group in re.findall(r"pub use ([a-z_][a-z_0-9]*)::\{([^}]*)\}", text):
        for name, alias in re.findall(r"([A-Za-z_][A-Za-z_0-9]*)(?:\s+as\s+([A-Za-z_][A-Za-z_0-9]*))?", group):
            names[alias or name] = module
    for module, name in re.findall(r"pub use ([a-z_][a-z_0-9]*)::([A-Za-z_][A-Za-z_0-9]*);", text):
        names[name] = module
    return names


def crate_graph(src):
    """Top-level module -> the top-level modules of the same crate it references, directly
    (`crate::module`) or through an item the crate root re-exports (`crate::Device`)."""
    roots = reexports(src)
    graph = {}
    for path in rust_files(src):
        rel = os.path.relpath(path, src)
        top = rel.split(os.sep)[0].removesuffix(".rs")
        if top in ("lib", "main"):
            continue
        text = code_lines(open(path).read())
        refs = set(re.findall(r"\bcrate::([a-z_][a-z_0-9]*)", text))
        items = set(re.findall(r"\bcrate::([A-Z][A-Za-z_0-9]*)", text))
        for group in re.findall(r"\buse crate::\{([^}]*)\}", text):
            refs |= set(re.findall(r"(?:^|,)\s*([a-z_][a-z_0-9]*)", group))
            items |= set(re.findall(r"\b([A-Z][A-Za-z_0-9]*)", group))
        refs |= {roots[i] for i in items if i in roots}
        graph.setdefault(top, set()).update(r for r in refs if r != top)
    tops = set(graph)
    return {m: {r for r in refs if r in tops} for m, refs in graph.items()}


def cycles(graph):
    found, state, stack = [], {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for r in sorted(graph.get(m, ())):
            if state.get(r) == 1:
                found.append(stack[stack.index(r):] + [r])
            elif r not in state:
                visit(r)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return found


def main():
    bad = []
    for folder in ["crates", "src", "tests", "examples", "benches"]:
        for path in rust_files(os.path.join(ROOT, folder)):
            n = open(path).read().count("\n")
            if n > LIMIT:
                bad.append(f"{os.path.relpath(path, ROOT)}: {n} lines (limit {LIMIT})")
    srcs = [os.path.join(ROOT, "src")] + [
        os.path.join(ROOT, "crates", c, "src") for c in sorted(os.listdir(os.path.join(ROOT, "crates")))
    ]
    for src in srcs:
        for cycle in cycles(crate_graph(src)):
            bad.append(f"{os.path.relpath(src, ROOT)}: module cycle {' -> '.join(cycle)}")
    for b in bad:
        print(b)
    print(f"structure: {len(bad)} problem(s)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
