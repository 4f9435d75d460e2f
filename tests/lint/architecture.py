#!/usr/bin/env python3
"""The architecture's rules, checked on the workspace as cargo and the compiler see it (`make layers`).

It reads the crate graph from `cargo metadata` and each crate's sources through a small Rust lexer (comments,
strings and test modules removed, so a rule named in a comment or a test neither trips nor hides anything), and
refuses:

1. crates: the domain depends on no framework crate, directly or through another; an adapter depends on the
   domain and on no other crate of the workspace but those listed in ADAPTER_EDGES; nothing depends on `server`;
2. the domain's parts: a part imports only the parts before it (DOMAIN_PARTS), through one part's path
   (`crate::query::Query`, not the crate root or a group of parts), the base files no part, and `endpoints` reads
   `materialization`'s model and ports, never its service;
3. time: nothing outside the domain's `SystemClock` reads the wall clock (`SystemTime::now`, `Utc::now`,
   `OffsetDateTime::now_utc`, ...): every part tells the time by the clock it is given, so tests set it;
4. the run log: nothing outside the domain builds a `LogRecord`, but the adapter that implements the `RunLog`
   port (it reads back the records it stored).

Exits non-zero and prints each finding with its file and line.
"""

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Crates of other projects the domain may not reach, by name prefix.
FRAMEWORKS = ("actix", "diesel", "r2d2", "datafusion", "arrow", "parquet", "tokio", "hyper", "sqlx",
              "tracing-actix", "deltalake", "object_store", "moka")
ADAPTERS = {"http-actix", "store-diesel", "query-engine", "cache-moka", "tables-delta"}
# Adapter-to-adapter dependencies there are reasons for (docs/architecture.md).
ADAPTER_EDGES = {("query-engine", "tables-delta")}

# The domain's base files, and its parts in dependency order.
DOMAIN_BASE = ["error.rs", "clock.rs", "fields.rs", "page.rs", "version.rs", "recent.rs", "propagation.rs"]
DOMAIN_PARTS = ["access", "query", "logs", "endpoints", "materialization", "tables", "runs", "changes"]
MATERIALIZATION_SERVICE = {"RefreshService", "RefreshDeps", "RefreshOutcome", "RETRY_AFTER_FAILURE"}
# Where the domain reads the wall clock: the clock port's own implementation.
WALL_CLOCK_HOME = os.path.join("crates", "domain", "src", "clock.rs")
WALL_CLOCK = re.compile(r"\b(SystemTime\s*::\s*now|Utc\s*::\s*now|Local\s*::\s*now|now_utc|now_local)\s*\(")
LOG_RECORD = re.compile(r"(?<![\w:])(?:domain\s*::\s*)?LogRecord\s*\{")
TEST_FILE = re.compile(r"(^|/)(tests?|testing|properties|[a-z_]+_tests)\.rs$|/tests/|/benches/|/examples/")


def strip(source):
    """The code of a Rust source with comments and the contents of string and character literals blanked (line
    breaks kept, so line numbers hold)."""
    out, i, n = [], 0, len(source)
    while i < n:
        c = source[i]
        if source.startswith("//", i):
            j = source.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif source.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if source.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif source.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * source.count("\n", i, j))
            i = j
        elif (m := re.compile(r'b?r(#*)"').match(source, i)) and (i == 0 or not (source[i - 1].isalnum() or source[i - 1] == "_")):
            end = '"' + m.group(1)
            j = source.find(end, m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * source.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and source[j] != '"':
                j += 2 if source[j] == "\\" else 1
            out.append('""' + "\n" * source.count("\n", i, j))
            i = j + 1
        elif c == "'" and (m := re.compile(r"'(\\.[^']*|[^\\'])'").match(source, i)):
            out.append("' '")
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def without_tests(code):
    """The code without its `#[cfg(test)]` items (a test module, a test-only function), line breaks kept."""
    while (m := re.search(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]", code)):
        brace, semi = code.find("{", m.end()), code.find(";", m.end())
        if brace < 0 or (0 <= semi < brace):
            end = semi + 1 if semi >= 0 else len(code)
        else:
            depth, end = 0, brace
            while end < len(code):
                depth += {"{": 1, "}": -1}.get(code[end], 0)
                end += 1
                if depth == 0:
                    break
        code = code[:m.start()] + "\n" * code.count("\n", m.start(), end) + code[end:]
    return code


def sources(crate_dir):
    """Each non-test Rust file under the crate's `src`, with its code (comments, strings and tests removed)."""
    for base, _, files in os.walk(os.path.join(crate_dir, "src")):
        for name in sorted(files):
            path = os.path.join(base, name)
            rel = os.path.relpath(path, ROOT)
            if name.endswith(".rs") and not TEST_FILE.search(rel.replace(os.sep, "/")):
                with open(path, encoding="utf-8") as f:
                    yield rel, without_tests(strip(f.read()))


def line_of(code, index):
    return code.count("\n", 0, index) + 1


def check_crates(metadata, findings):
    members = {p["id"]: p for p in metadata["packages"] if p["id"] in metadata["workspace_members"]}
    names = {p["name"] for p in members.values()}
    nodes = {node["id"]: node for node in metadata["resolve"]["nodes"]}
    name_of = {p["id"]: p["name"] for p in metadata["packages"]}

    def normal(node_id):
        for dep in nodes[node_id]["deps"]:
            if any(kind["kind"] is None for kind in dep["dep_kinds"]):
                yield dep["pkg"]

    for pid, package in members.items():
        crate = package["name"]
        direct = {name_of[d] for d in normal(pid)}
        if crate == "domain":
            seen, todo = set(), [pid]
            while todo:
                for dep in normal(todo.pop()):
                    if dep not in seen:
                        seen.add(dep)
                        todo.append(dep)
            leaks = sorted({name_of[d] for d in seen if name_of[d].startswith(FRAMEWORKS)})
            if leaks:
                findings.append(f"crates/domain depends on framework crates: {', '.join(leaks)}")
            if direct & names:
                findings.append(f"crates/domain depends on workspace crates: {', '.join(sorted(direct & names))}")
        elif crate in ADAPTERS:
            for dep in sorted(direct & names - {"domain"}):
                if (crate, dep) not in ADAPTER_EDGES:
                    findings.append(f"crates/{crate} depends on the adapter {dep}: adapters meet only in server")
        if "server" in direct and crate != "server":
            findings.append(f"crates/{crate} depends on server, the crate that wires the others")


def part_of(rel):
    """The domain part a file belongs to, `base` for a base file, `None` for the crate root and others."""
    parts = rel.replace(os.sep, "/").split("/")[3:]  # after crates/domain/src
    if len(parts) == 1:
        if parts[0] in DOMAIN_BASE:
            return "base"
        stem = parts[0][:-3]
        return stem if stem in DOMAIN_PARTS else None
    return parts[0] if parts[0] in DOMAIN_PARTS else None


def check_domain_layers(findings):
    order = {part: i for i, part in enumerate(DOMAIN_PARTS)}
    for rel, code in sources(os.path.join(ROOT, "crates", "domain")):
        part = part_of(rel)
        if part is None:
            continue
        for m in re.finditer(r"\bcrate\s*::\s*(\{|[A-Za-z_]\w*)", code):
            target, at = m.group(1), f"{rel}:{line_of(code, m.start())}"
            if target == "{" or target[0].isupper():
                findings.append(f"{at}: import through one part's path (crate::query::Query), not the crate root or a group of parts")
                continue
            if target == "testing" or target not in order:
                if part == "base" and target == "testing":
                    findings.append(f"{at}: a base file imports the test helpers")
                continue
            if part == "base":
                findings.append(f"{at}: the domain's base files import no part (here {target})")
            elif order[target] > order[part]:
                if part == "endpoints" and target == "materialization":
                    rest = code[m.end():m.end() + 400]
                    named = re.match(r"\s*::\s*(\{[^}]*\}|[\w:]+)", rest)
                    used = set(re.findall(r"\w+", named.group(1))) if named else set()
                    if used & MATERIALIZATION_SERVICE:
                        findings.append(f"{at}: endpoints may read materialization's model and ports, not its service")
                    continue
                findings.append(f"{at}: {part} imports {target}, which comes after it")
        if re.search(r"super\s*::\s*super\s*::\s*super", code):
            findings.append(f"{rel}: reaches past its part with super::super::super")


def check_time_and_records(metadata, findings):
    members = [p for p in metadata["packages"] if p["id"] in metadata["workspace_members"]]
    for package in members:
        crate_dir = os.path.dirname(package["manifest_path"])
        files = list(sources(crate_dir))
        implements_log = any(re.search(r"\bimpl\b[^{;]*\bRunLog\s+for\b", code) for _, code in files)
        for rel, code in files:
            if rel != WALL_CLOCK_HOME:
                for m in WALL_CLOCK.finditer(code):
                    findings.append(f"{rel}:{line_of(code, m.start())}: reads the wall clock ({m.group(1)}); "
                                    "take the service's clock (domain::Clock) instead")
            if package["name"] != "domain" and not implements_log:
                for m in LOG_RECORD.finditer(code):
                    before = code[max(0, m.start() - 40):m.start()]
                    if re.search(r"\b(struct|impl|for|enum)\s*$", before):
                        continue
                    findings.append(f"{rel}:{line_of(code, m.start())}: builds a log record; the domain's "
                                    "LogService makes every record (LogService::answered)")


def main():
    host = re.search(r"^host: (\S+)", subprocess.run(["rustc", "-vV"], check=True, capture_output=True,
                                                     text=True).stdout, re.M).group(1)
    metadata = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", "--filter-platform", host],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout)
    findings = []
    check_crates(metadata, findings)
    check_domain_layers(findings)
    check_time_and_records(metadata, findings)
    for finding in findings:
        print(finding)
    if findings:
        print(f"architecture: {len(findings)} finding(s); the rules are in tests/lint/architecture.py and docs/architecture.md")
        return 1
    print("architecture: the domain reaches no framework, adapters meet only in server, the domain's parts "
          f"({' '.join(DOMAIN_PARTS)}) import only what comes before them, only the clock reads the time, "
          "only the domain makes log records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
