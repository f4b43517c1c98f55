#!/usr/bin/env bash
# Finds import cycles between the modules of one Rust crate, from its source text alone
# (nothing is compiled; only python3 is needed).
#
#   scripts/module-cycles.sh gateway/src      exits 0 if the modules import no cycle; else
#                                             prints each cycle, with the lines that make it,
#                                             and exits 1
#   scripts/module-cycles.sh hot/src bench/src   several crates, one after the other
#
# A module is a file: `a.rs` or `a/mod.rs` is `a`, `a/b.rs` is `a::b`; `lib.rs` and `main.rs`
# are the crate root. Module A imports module B when A's text names a path into B: a `use`
# item (groups and `self`/`super` included) or a path in code such as `crate::b::f()`. A
# path resolves to the longest module it names (`crate::a::b::T` is `a::b` if that file
# exists, else `a`). Paths to the crate root are not counted (the root only wires modules
# together and re-exports them), nor is a module's `mod` declaration of its children, nor
# code under `#[cfg(test)]` (tests may reach anywhere). Comments and string literals are
# skipped. Cycles are named by strongly connected component: every module in a component
# reaches every other, and for each module a shortest cycle through it is printed.
set -euo pipefail
if [ $# -eq 0 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
exec python3 - "$@" <<'PY'
import collections
import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def module_of(src, path):
    """The module path (a tuple) of a file below `src`; () for the crate root."""
    rel = os.path.relpath(path, src)[: -len(".rs")].split(os.sep)
    if rel[-1] == "mod":
        rel = rel[:-1]
    if rel in (["lib"], ["main"]):
        return ()
    return tuple(rel)


def strip(text):
    """The text with comments, string and char literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    blank = lambda s: re.sub(r"[^\n]", " ", s)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif (m := re.match(r'b?r(#*)"', text[i:])) and (i == 0 or not re.match(r"[A-Za-z0-9_]", text[i - 1])):
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(blank(text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(blank(text[i : j + 1]))
            i = j + 1
        elif c == "'" and (m := re.match(r"'(\\.[^']*|[^\\'])'", text[i:])):
            out.append(blank(m.group(0)))
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def without_tests(text):
    """Blanks every item (usually `mod tests { ... }`) under `#[cfg(test)]`."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]", text)
        if not m:
            return text
        i = m.end()
        # The item ends at its closing brace, or at `;` for a braceless one (`use`, `mod x;`).
        j = i
        while j < len(text) and text[j] not in "{;":
            j += 1
        if j < len(text) and text[j] == "{":
            depth = 0
            while j < len(text):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
                if depth == 0:
                    break
        else:
            j += 1
        text = text[: m.start()] + re.sub(r"[^\n]", " ", text[m.start() : j]) + text[j:]


def inline_modules(text):
    """(start, end, name) of every inline `mod name { ... }` block."""
    blocks = []
    for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{", text):
        depth, j = 0, m.end() - 1
        while j < len(text):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
            if depth == 0:
                break
        blocks.append((m.start(), j, m.group(1)))
    return blocks


def expand_use(tree):
    """The paths of a `use` tree: `a::{b, c::{d, e}}` -> a::b, a::c::d, a::c::e."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+" + IDENT, "", tree))
    i = tree.find("{")
    if i < 0:
        return [tree]
    prefix, inner = tree[:i], tree[i + 1 : tree.rindex("}")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        if p:
            out += [prefix + q for q in expand_use(p)]
    return out


def resolve(path, here, modules):
    """The module a path (`crate::a::b`, `super::x`, `self::y`) lands in, or None."""
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] == "crate":
        base, segs = (), segs[1:]
    elif segs[0] in ("super", "self"):
        base = here
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    else:
        return None
    best = base
    for k in range(1, len(segs) + 1):
        if base + tuple(segs[:k]) in modules:
            best = base + tuple(segs[:k])
    return best


def edges_of(src):
    files = []
    for root, _, names in os.walk(src):
        files += [os.path.join(root, n) for n in names if n.endswith(".rs")]
    modules = {module_of(src, f) for f in files}
    edges = collections.defaultdict(list)  # (a, b) -> [(file, line, text)]
    for f in sorted(files):
        file_mod = module_of(src, f)
        raw = open(f, encoding="utf-8", errors="replace").read()
        text = without_tests(strip(raw))
        blocks = inline_modules(text)
        lines = raw.split("\n")

        def here_at(pos):
            inner = [b for b in blocks if b[0] <= pos < b[1]]
            return file_mod + tuple(b[2] for b in sorted(inner))

        found = []  # (pos, path)
        uses = list(re.finditer(r"\buse\s+([^;]*);", text))
        for m in uses:
            for p in expand_use(m.group(1)):
                found.append((m.start(), p))
        covered = [(m.start(), m.end()) for m in uses]
        for m in re.finditer(r"(?<![A-Za-z0-9_:$])((?:crate|super|self)(?:::" + IDENT + ")+)", text):
            if not any(a <= m.start() < b for a, b in covered):
                found.append((m.start(), m.group(1)))
        for pos, path in found:
            target = resolve(path, here_at(pos), modules)
            # An inline module counts as the file it is in.
            src_mod = file_mod
            if target is None or target == () or src_mod == () or target == src_mod:
                continue
            line = text.count("\n", 0, pos)
            edges[(src_mod, target)].append((f, line + 1, lines[line].strip()))
    return modules, edges


def sccs(nodes, adj):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def shortest_cycle(start, adj, within):
    prev, queue = {start: None}, collections.deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(adj[v]):
            if w not in within:
                continue
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1] + [start]  # start, ..., v, start
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return None


def name(m):
    return "::".join(m)


status = 0
for src in sys.argv[1:]:
    if not os.path.isdir(src):
        print(f"module-cycles: {src} is not a directory", file=sys.stderr)
        sys.exit(2)
    modules, edges = edges_of(src)
    adj = collections.defaultdict(set)
    for a, b in edges:
        adj[a].add(b)
    nodes = {m for m in modules if m != ()}
    comps = [sorted(c) for c in sccs(nodes, adj) if len(c) > 1]
    if not comps:
        print(f"{src}: no import cycle between its {len(nodes)} modules")
        continue
    status = 1
    print(f"{src}: {len(comps)} group(s) of modules that import each other in a cycle")
    for comp in sorted(comps):
        within = set(comp)
        print(f"\n  {', '.join(name(m) for m in comp)}")
        seen = set()
        for m in comp:
            cyc = shortest_cycle(m, adj, within)
            if not cyc:
                continue
            # One rotation per cycle: start it at its smallest module.
            body = cyc[:-1]
            k = body.index(min(body))
            key = tuple(body[k:] + body[:k])
            if key in seen:
                continue
            seen.add(key)
            print("    cycle: " + " -> ".join(name(x) for x in list(key) + [key[0]]))
            for a, b in zip(key, list(key[1:]) + [key[0]]):
                f, line, code = edges[(a, b)][0]
                more = len(edges[(a, b)]) - 1
                extra = f" (+{more} more)" if more else ""
                print(f"      {name(a)} -> {name(b)}: {f}:{line}: {code[:100]}{extra}")
sys.exit(status)
PY
