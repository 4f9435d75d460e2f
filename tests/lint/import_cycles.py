"""Refuses import circles between the files (modules) of one crate: `make lint` runs it over every crate.

A module's imports are the `crate::...` paths its code names (comments and its `#[cfg(test)]` part aside); each
is taken as the longest module path it starts with. A strongly connected group of more than one module is a
circle, printed with its members."""

import os
import re
import sys


def modules(src):
    """Each module of the crate at `src`, by path (`a::b`), and its file."""
    found = {}
    for folder, _, files in os.walk(src):
        for name in files:
            if not name.endswith(".rs") or name.endswith("_tests.rs") or name in ("lib.rs", "main.rs", "tests.rs"):
                continue
            path = os.path.join(folder, name)
            module = os.path.relpath(path, src)[:-3].removesuffix("/mod").replace("/", "::")
            found[module] = path
    return found


def imports(path, known):
    """The modules of `known` the file at `path` names."""
    with open(path, encoding="utf-8") as f:
        text = f.read().split("#[cfg(test)]")[0]
    code = "\n".join(line.split("//")[0] for line in text.splitlines())
    names = set()
    for ref in re.findall(r"crate::((?:\w+::)*\w+)", code):
        parts = ref.split("::")
        for end in range(len(parts), 0, -1):
            if "::".join(parts[:end]) in known:
                names.add("::".join(parts[:end]))
                break
    for group in re.findall(r"crate::\{([^}]*)\}", code):
        names.update(word for word in re.findall(r"\w+", group) if word in known)
    return names


def circles(graph):
    """The strongly connected groups of more than one module (Tarjan's algorithm, without recursion limits)."""
    sys.setrecursionlimit(100_000)
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                group.append(other)
                if other == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def main():
    status = 0
    for src in sys.argv[1:]:
        known = modules(src)
        graph = {module: sorted(imports(path, known) - {module}) for module, path in known.items()}
        for group in circles(graph):
            print(f"{src}: these modules import each other in a circle: {', '.join(group)}")
            status = 1
    if status == 0:
        print(f"import circles: none among the modules of {len(sys.argv) - 1} crates")
    return status


if __name__ == "__main__":
    sys.exit(main())
