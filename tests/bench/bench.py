"""`make bench`: the service's figures against baselines measured in the same run on the same machine.

Scenarios (each a ratio against its baseline; the machine is shared and noisy, so only ratios are compared):
  1. cached run (wrk, 64 connections) against a minimal actix-web server returning the same bytes;
  2. live run (`refresh: direct`, a GROUP BY over the events table) against the same SQL on bare DataFusion with
     the engine's session settings, and DuckDB over the same Parquet files as the field's reference point;
  3. the materialized endpoints against their live runs: `country-daily` (its rows stored) and
     `events-by-country` (a rollup by country and day);
  4. scaling: live run time by table size, cached-run throughput by number of endpoints in the store,
     create/get/list throughput on SQLite and PostgreSQL;
  5. memory: the server's peak RSS in each scenario and idle, against bare DataFusion's for the live run;
  6. several nodes: cached-run throughput of 1, 2 and 3 `serve` processes on one PostgreSQL database;
  7. the distributed engine: the live run of scenario 2 on a Ballista cluster of two executors (`endpoints
     cluster`, when the binary has the `ballista` feature) against the embedded engine;
  8. data in and out: an upload of the events table as CSV (`PUT .../tables/...`, streamed) against DuckDB's
     `COPY` of the same file to Parquet, and an export of 1,000,000 rows in each result format against DuckDB
     writing the same rows in that format, with the server's peak RSS while exporting.

  9. isolation: another project's small live query while one project runs four heavy queries of each kind of
     `HEAVY_PLANS` at once, against the same query idle (p95); the server's peak RSS under a corpus of memory
     bombs; and a valid key's cached runs during a flood
     of made-up keys from another address, against the same runs without it (p99).

  10. streaming appends: 5-row NDJSON appends to one table from 1 and 16 connections (wrk), against each other;
     500-row appends from 16 connections against DuckDB's `COPY` of the same NDJSON rows to Parquet in process;
     after 10,000 small appends and compaction, the table's files and a live GROUP BY over it against the same
     rows written at once.

  11. fresh materializations: a rollup of the events table (10,000,000 rows) refreshed in full against the
     rows of one 1,000-row append folded into it (the refresh worker's own timings, from /metrics); and its
     materialized runs against live runs while rows stream in at 100 appends a second.

  12. run logs: cached runs with the run log on against off, then `usage`, `logs` and SQL over `_logs` once the
     log holds a million records of the endpoint.

`--only isolation`, `--only appends`, `--only fresh` and `--only logs` run scenario 9, 10, 11 or 12 alone (the first two on a small
data directory of their own, the third on `--rows` events) and replace only its section. `--only compare` (what
`make bench-compare BASE=<commit>` runs) measures scenario 13's shapes, three more `LIKE` patterns and a cached run
on this build and on `--before-bin-dir` beside it, alternating, each on its own copy of `--rows` events that the
earlier build wrote (a build of a later table format converts its copy at its first start). `--only beside` runs
scenarios 1-5 and 8 (without their baselines), 9 (on request), 10, 11 and 12 on `--before-bin-dir` and then on this
build, each on data it wrote itself, and writes their headline figures side by side.
Only the standard library is used, plus the `duckdb` package from the bench virtualenv for the reference point.
The results replace the run section at the end of docs/benchmarks.md; scenarios with sections of their own (6 alone,
9-14) replace theirs in docs/benchmark-scenarios.md, and `--only compare` and `--only beside` theirs in
docs/benchmark-beside.md (older runs are in git).
"""

import argparse
import concurrent.futures
import datetime
import json
import math
import os
import platform
import re
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

LIVE_SQL = ("SELECT country, count(*) AS events, round(sum(revenue), 2) AS revenue FROM events "
            "WHERE timestamp >= CAST('2026-03-01' AS DATE) GROUP BY country ORDER BY events DESC")
DUCKDB_SQL = ("SELECT country, count(*) AS events, round(sum(revenue), 2) AS revenue FROM read_parquet('{path}') "
              "WHERE timestamp >= DATE '2026-03-01' GROUP BY country ORDER BY events DESC")
LIVE_PATH = "/api/projects/1/endpoints/events-by-country/run?variables.since=2026-03-01"
MATERIALIZED_PATH = "/api/projects/1/endpoints/country-daily/run?variables.country=DE&variables.since=2026-01-01"


def log(message):
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid, field="VmRSS"):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class PeakRss:
    """Samples a process's resident memory every 50 ms while in use; `peak` is the largest sample, in MB."""

    def __init__(self, pid):
        self.pid, self.samples, self.running = pid, [], True

    def __enter__(self):
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.samples.append(rss_kb(self.pid))
            time.sleep(0.05)

    def __exit__(self, *_):
        self.running = False
        self.thread.join()

    @property
    def peak(self):
        return max(self.samples, default=0) / 1024


class Endpoints:
    """The `endpoints` binary on one data directory (and optionally a PostgreSQL database)."""

    def __init__(self, bin_dir, data_dir, database_url=None):
        self.bin = os.path.join(bin_dir, "endpoints")
        self.data_dir, self.database_url = data_dir, database_url
        self.process, self.base, self.key = None, None, None

    def cli(self, *args):
        command = [self.bin, "--data-dir", self.data_dir, "--json"]
        if self.database_url:
            command += ["--database-url", self.database_url]
        out = subprocess.run(command + list(args), check=True, capture_output=True, text=True)
        return json.loads(out.stdout) if out.stdout.strip() else None

    def start(self, *extra):
        port = free_port()
        command = [self.bin, "--data-dir", self.data_dir]
        if self.database_url:
            command += ["--database-url", self.database_url]
        # Throughput is what is measured here, so the per-key and per-project request limits are off.
        command += ["serve", "--bind", f"127.0.0.1:{port}", "--query-timeout-secs", "600",
                    "--rate-limit-key-per-sec", "0", "--rate-limit-project-per-sec", "0",
                    "--materialize-poll-ms", "200", *extra]
        self.log = open(os.path.join(self.data_dir, f"serve-{port}.log"), "w")
        # Logging stays at its default (info), as `make run` serves.
        self.process = subprocess.Popen(command, stdout=self.log, stderr=self.log)
        self.base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                urllib.request.urlopen(self.base + "/api/schema", timeout=1).read()
                return self
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.1)
        raise RuntimeError("the server did not start; see " + self.log.name)

    def stop(self):
        if self.process:
            self.process.terminate()
            self.process.wait(timeout=60)
            self.process = None

    def request(self, method, path, body=None, key=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {key or self.key}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=600) as response:
            return response.read()

    def timed(self, path, rounds):
        """Median wall time in ms of `rounds` sequential GETs, with the answers."""
        times, answers = [], []
        for _ in range(rounds):
            started = time.perf_counter()
            answers.append(json.loads(self.request("GET", path)))
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times), answers


# Scenario 2 alternates this many batches of live runs with as many of bare DataFusion.
LIVE_BATCHES = 3


def parse_latency(text):
    value, unit = re.match(r"([\d.]+)(us|ms|s|m)$", text).groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}[unit]


def wrk(url, key, seconds, connections=64, script=None, script_args=(), close=False):
    command = ["wrk", f"-t{min(2, connections)}", f"-c{connections}", f"-d{seconds}s", "--latency", "-H", f"Authorization: Bearer {key}",
               "-H", "Content-Type: application/json"]
    if close:
        # Keep-alive off: every request on a new connection.
        command += ["-H", "Connection: close"]
    if script:
        command += ["-s", script]
    command.append(url)
    if script_args:
        command += ["--", *script_args]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    if "Requests/sec" not in out or "50%" not in out:
        raise RuntimeError(f"wrk printed no figures for {url}:\n{out}")
    result = {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        # Anchored: a "+/- Stdev" column such as "83.50%" must not pass for the 50th percentile.
        "p50": parse_latency(re.search(r"^\s+50%\s+(\S+)", out, re.MULTILINE).group(1)),
        "p99": parse_latency(re.search(r"^\s+99%\s+(\S+)", out, re.MULTILINE).group(1)),
        "requests": int(re.search(r"(\d+) requests in", out).group(1)),
    }
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    result["failed"] = int(bad.group(1)) if bad else 0
    if errors:
        log(f"wrk socket errors: {errors.group(1)}")
    return result


def wrk_together(urls, key, seconds, connections=64):
    """One wrk per URL at the same time, the connections split between them: the summed throughput and the
    worst p99."""
    share = max(connections // len(urls), 1)
    command = lambda url: ["wrk", "-t1", f"-c{share}", f"-d{seconds}s", "--latency", "-H",
                           f"Authorization: Bearer {key}", url]
    running = [subprocess.Popen(command(url), stdout=subprocess.PIPE, text=True) for url in urls]
    results = []
    for process in running:
        out, _ = process.communicate()
        bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        results.append({
            "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "p99": parse_latency(re.search(r"^\s+99%\s+(\S+)", out, re.MULTILINE).group(1)),
            "failed": int(bad.group(1)) if bad else 0,
        })
    return {"rps": sum(r["rps"] for r in results), "p99": max(r["p99"] for r in results),
            "failed": sum(r["failed"] for r in results)}


WRITES = 100


def write_latency(node):
    """p50 and p99 in ms of WRITES sequential PATCHes (a description: settings only) through `node`: each is
    answered once every other live node applied it (read your writes on every node)."""
    times = []
    for i in range(WRITES):
        started = time.perf_counter()
        node.request("PATCH", "/api/projects/1/endpoints/crud-probe", {"description": f"write {i}"})
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return {"p50": statistics.median(times), "p99": times[int(len(times) * 0.99) - 1]}


TABLE_ROWS = b"id,region,amount\n" + b"".join(f"{i},r{i},{i}\n".encode() for i in range(5))


def send_rows(node, method, path, body):
    request = urllib.request.Request(node.base + path, data=body, method=method)
    request.add_header("Authorization", f"Bearer {node.key}")
    request.add_header("Content-Type", "text/csv")
    with urllib.request.urlopen(request, timeout=600) as response:
        return response.read()


def table_latency(first, last):
    """p50 and p99 in ms of WRITES sequential 5-row appends through `first` (each answered once every other node
    heard of it), then of WRITES live runs over the table on `last` (which reads the version it keeps without
    asking the storage while it hears every write)."""
    send_rows(first, "PUT", "/api/projects/1/tables/probe", TABLE_ROWS)
    body = {"name": "table-probe", "cache_age_seconds": 0,
            "query": {"kind": "SQLQuery", "query": "SELECT region, count(*) AS n FROM probe GROUP BY region"}}
    try:
        first.request("POST", "/api/projects/1/endpoints/", body)
    except urllib.error.HTTPError as e:
        if e.code != 409:
            raise
    figures = {}
    for name, call in (("append", lambda: send_rows(first, "POST", "/api/projects/1/tables/probe/rows", TABLE_ROWS)),
                       ("run", lambda: last.request("GET", "/api/projects/1/endpoints/table-probe/run"))):
        call()
        times = []
        for _ in range(WRITES):
            started = time.perf_counter()
            call()
            times.append((time.perf_counter() - started) * 1000)
        times.sort()
        figures[name] = {"p50": statistics.median(times), "p99": times[int(len(times) * 0.99) - 1]}
    figures["flood"] = append_flood(first)
    return figures


FLOOD_WRITERS, FLOOD_SECONDS = 16, 5


def append_flood(node):
    """5-row appends from FLOOD_WRITERS connections at once through `node` for FLOOD_SECONDS: appends a second."""
    stop = time.perf_counter() + FLOOD_SECONDS

    def writer(_):
        done = 0
        while time.perf_counter() < stop:
            send_rows(node, "POST", "/api/projects/1/tables/probe/rows", TABLE_ROWS)
            done += 1
        return done

    with concurrent.futures.ThreadPoolExecutor(FLOOD_WRITERS) as pool:
        return sum(pool.map(writer, range(FLOOD_WRITERS))) / FLOOD_SECONDS


def cached_by_nodes(bin_dir, data_dir, database_url, key, seconds, rounds):
    """Cached-run throughput of 1, 2 and 3 `serve` nodes on one PostgreSQL database, each loaded by its own wrk;
    and the latency of a write through the first while the others listen."""
    path = "/api/projects/1/endpoints/crud-probe/run"
    figures = {}
    for count in (1, 2, 3):
        nodes = []
        for _ in range(count):
            node = Endpoints(bin_dir, data_dir, database_url)
            node.key = key
            nodes.append(node.start("--materialize-workers", "0", "--workers", str(max(os.cpu_count() // count, 1))))
        try:
            for node in nodes:
                node.request("GET", path)
            figures[count] = median_of([wrk_together([n.base + path for n in nodes], key, seconds)
                                        for _ in range(rounds)])
            time.sleep(2)  # every node's heartbeat is in
            figures[count]["write"] = write_latency(nodes[0])
            figures[count]["table"] = table_latency(nodes[0], nodes[-1])
        finally:
            for node in nodes:
                node.stop()
        log(f"cached on {count} node(s): {figures[count]['rps']:.0f} req/s; a write "
            f"p50 {figures[count]['write']['p50']:.1f} ms, p99 {figures[count]['write']['p99']:.1f} ms; an append "
            f"p50 {figures[count]['table']['append']['p50']:.1f} ms, a live run on the last node "
            f"p50 {figures[count]['table']['run']['p50']:.1f} ms")
    return figures


NODES_MARKER = "<!-- scenario 6 alone, written by make bench-nodes -->"
NODES_READING = ("With a second or third node up, a write (an endpoint's PATCH or a table append) is answered once every other node has applied it: an idle listener looks for notifications every 5 ms, every 0.5 ms for a second once some arrived, and every 0.2 ms while a writer of its own node waits for acknowledgements; those pauses and two statements are the added time. A waiting writer holds no database connection: its node's listener hears the acknowledgements and wakes it. A node that hears every table write reads the versions it keeps without asking the storage; on a local disk that check was a `stat`, so the live run changes within noise here (on S3 it is a `HEAD` per table per run). One statement sends a write's news with a "
                 "barrier, and the writes one node commits while a statement is being sent share the next one and "
                 "its wait: appends from many connections pay one announcement per batch, which is what the column "
                 "of 16 connections shows (before this, each append was announced and waited for on its own).")


def nodes_setup(bin_dir, database_url, data_dir):
    """A fresh PostgreSQL database's project 1 with a key and the probe endpoint, as the CRUD scenario leaves it."""
    os.makedirs(data_dir)
    app = Endpoints(bin_dir, data_dir, database_url)
    app.cli("migrate")
    app.cli("project", "create", "--name", "bench")
    app.key = app.cli("key", "create", "--project", "1", "--scope", "endpoint:write", "--scope", "table:write")["key"]
    app.start("--materialize-workers", "0")
    try:
        app.request("POST", "/api/projects/1/endpoints/",
                    {"name": "crud-probe", "query": {"kind": "SQLQuery", "query": "SELECT 1 AS n"}})
    finally:
        app.stop()
    return app


def nodes_alone(args, root):
    """Scenario 6 for this build, and for a previous one beside it (alternating, `--node-rounds` rounds each)."""
    builds = {"this build": (args.bin_dir, args.postgres_url)}
    if args.before_bin_dir:
        builds["previous build"] = (args.before_bin_dir, args.before_postgres_url)
    apps = {name: nodes_setup(bin_dir, url, os.path.join(root, f"nodes-{i}"))
            for i, (name, (bin_dir, url)) in enumerate(builds.items())}
    runs = {name: [] for name in builds}
    for _ in range(args.node_rounds):
        for name, (bin_dir, url) in builds.items():
            runs[name].append(cached_by_nodes(bin_dir, apps[name].data_dir, url, apps[name].key, args.seconds, 1))
    return {name: {count: {"rps": statistics.median(r[count]["rps"] for r in rs),
                           "p99": statistics.median(r[count]["p99"] for r in rs),
                           "write": {k: statistics.median(r[count]["write"][k] for r in rs) for k in ("p50", "p99")},
                           "table": {w: {k: statistics.median(r[count]["table"][w][k] for r in rs)
                                         for k in ("p50", "p99")} for w in ("append", "run")},
                           "flood": statistics.median(r[count]["table"]["flood"] for r in rs)}
                   for count in rs[0]}
            for name, rs in runs.items()}


def write_nodes(args, figures):
    lines = [f"### Scenario 6 alone: several nodes, this build beside the previous one ({datetime.date.today()})", "",
             f"Medians of {args.node_rounds} alternating rounds per build, each on its own PostgreSQL database (`make bench-nodes`; "
             "`BEFORE=dir` names the previous build). Columns as in scenario 6 of the full run.", "",
             "| Build | Nodes | Cached run | A write through the first node | A table append | "
             f"Appends from {FLOOD_WRITERS} connections | A live run over it on the last node |",
             "|---|---|---|---|---|---|---|"]
    for name, by_count in figures.items():
        for count, r in by_count.items():
            w, t = r["write"], r["table"]
            lines.append(f"| {name} | {count} | {r['rps']:,.0f} req/s | p50 {w['p50']:.1f} ms, p99 {w['p99']:.1f} ms | "
                         f"p50 {t['append']['p50']:.1f} ms, p99 {t['append']['p99']:.1f} ms | "
                         f"{r['flood']:,.0f}/s | p50 {t['run']['p50']:.1f} ms, p99 {t['run']['p99']:.1f} ms |")
    lines += ["", NODES_READING]
    write_section(args, NODES_MARKER, "\n".join(lines) + "\n")


def has_ballista(bin_dir):
    """Whether the binary was built with the distributed engine."""
    probe = subprocess.run([os.path.join(bin_dir, "endpoints"), "cluster", "--help"], capture_output=True)
    return probe.returncode == 0


def ballista_live(bin_dir, app, rounds):
    """The live run on a Ballista scheduler with two executors over the app's data, with its answers."""
    cluster = subprocess.Popen([os.path.join(bin_dir, "endpoints"), "--data-dir", app.data_dir, "--json", "cluster",
                                "--executors", "2"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        engine = json.loads(cluster.stdout.readline())["engine"]
        app.start("--materialize-workers", "0", "--engine", engine)
        app.timed(LIVE_PATH + "&refresh=direct", 1)
        return app.timed(LIVE_PATH + "&refresh=direct", rounds)
    finally:
        app.stop()
        cluster.terminate()
        cluster.wait()


def median_of(rounds):
    pick = sorted(rounds, key=lambda r: r["rps"])[len(rounds) // 2]
    return dict(pick, failed=sum(r["failed"] for r in rounds))


def events_dir(data_dir, table="events"):
    """The directory of a table of the demo project (`events` unless named): a Delta table, whose Parquet files
    are directly in it. For a table written once (and never replaced) they are exactly its newest version's."""
    return os.path.join(data_dir, "projects", "1", "tables", table)


def wrk_rounds(url, key, seconds, rounds, **kwargs):
    return median_of([wrk(url, key, seconds, **kwargs) for _ in range(rounds)])


def run_token(app):
    """A run token for `events-by-country`, valid for an hour."""
    return json.loads(app.request("POST", "/api/projects/1/run_tokens",
                                  {"endpoints": ["events-by-country"], "expires_in_seconds": 3600}))["token"]


def make_dataset(bin_dir, root, rows):
    data_dir = os.path.join(root, f"rows-{rows}")
    os.makedirs(data_dir, exist_ok=True)
    app = Endpoints(bin_dir, data_dir)
    started = time.perf_counter()
    app.cli("demo", "--rows", str(rows))
    log(f"generated {rows:,} events in {time.perf_counter() - started:.1f} s")
    app.key = app.cli("key", "create", "--project", "1", "--scope", "endpoint:write")["key"]
    return app


def materialized_runs(args, app):
    """Scenario 3 on `app`, served with its refresh worker on: `country-daily` (its rows stored, filtered by a run)
    and `events-by-country` (a rollup by country and day, aggregated again by a run) against their live runs, once
    both are stored."""
    figures = {}
    # Both stored first: a refresh of one would otherwise take the cores while the other is measured.
    statuses = {}
    for name in ("country-daily", "events-by-country"):
        for _ in range(1200):
            status = json.loads(app.request("GET", f"/api/projects/1/endpoints/{name}/materialization_status"))
            if status["status"] == "Completed":
                break
            time.sleep(0.5)
        assert status["status"] == "Completed", status
        statuses[name] = status
    for name, path, key in (("country-daily", MATERIALIZED_PATH, "materialized"), ("events-by-country", LIVE_PATH, "rollup")):
        status = statuses[name]
        app.request("PATCH", f"/api/projects/1/endpoints/{name}", {"cache_age_seconds": 0})
        with PeakRss(app.process.pid) as peak:
            mat_ms, mat = app.timed(path, args.live_rounds * 4)
        assert all(a["endpoint_materialized"] for a in mat), f"{name} ran live"
        direct_ms, direct = app.timed(path + "&refresh=direct", args.live_rounds)
        assert same_rows(mat[0]["results"], direct[0]["results"]), f"{name}: materialized and live answers differ"
        figures[f"{key}_ms"], figures[f"{key}_live_ms"], figures[f"{key}_mb"] = mat_ms, direct_ms, peak.peak
        figures[f"{key}_rows"] = status["row_count"]
        # Back to the default cache age: the scenarios after this one read events-by-country from the cache.
        app.request("PATCH", f"/api/projects/1/endpoints/{name}", {"cache_age_seconds": None})
        log(f"{name} materialized: {mat_ms:.2f} ms against live {direct_ms:.1f} ms ({status['row_count']} rows stored)")
    return figures


def fill_endpoints(data_dir, total):
    """Adds plain endpoints straight into the SQLite store until project 1 has `total` (a fixture, not a test
    of the write path: create throughput is measured through the API)."""
    db = sqlite3.connect(os.path.join(data_dir, "endpoints.db"))
    have = db.execute("SELECT count(*) FROM endpoints WHERE project_id = 1").fetchone()[0]
    query = json.dumps({"kind": "SQLQuery", "query": "SELECT 1 AS n", "variables": {}}, separators=(",", ":"))
    columns = json.dumps([{"name": "n", "type": "integer"}])
    eligibility = json.dumps({"eligible": {"filters": []}})
    now = int(time.time() * 1_000_000)
    rows, versions = [], []
    for i in range(have, total):
        id_ = str(uuid.uuid4())
        rows.append((id_, 1, f"filler-{i:06d}", "", None, True, False, None, None, 1, now, now, None))
        versions.append((id_, 1, query, "", columns, None, None, now, eligibility))
    # Columns named, so that columns added later (with their defaults) do not shift the values.
    db.executemany(
        "INSERT INTO endpoints (id, project_id, name, description, derived_from_insight, is_active, is_materialized,"
        " cache_age_seconds, sync_frequency, current_version, created_at, updated_at, last_executed_at)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        rows,
    )
    db.executemany(
        "INSERT INTO endpoint_versions (endpoint_id, version, query, description, output_columns, cache_age_seconds,"
        " sync_frequency, created_at, eligibility) VALUES (?,?,?,?,?,?,?,?,?)",
        versions,
    )
    db.commit()
    db.close()


def by_endpoint_count(args, data):
    """Scenario 4's cached runs with 1,000 and then 100,000 endpoints in the store of `data` (stopped, and left
    so)."""
    by_count = {}
    for total in (1000, 100_000):
        fill_endpoints(data.data_dir, total)
        app = data.start("--materialize-workers", "0")
        try:
            app.request("GET", LIVE_PATH)
            by_count[total] = wrk_rounds(app.base + LIVE_PATH, app.key, args.seconds, args.rounds)
        finally:
            app.stop()
        log(f"cached with {total:,} endpoints: {by_count[total]['rps']:.0f} req/s")
    return by_count


# Names must be unique across wrk's threads and runs: `tid` is set in each thread's interpreter by `setup`.
CREATE_LUA = """
local counter, run = 0, "r"
local threads = {}
function setup(thread) thread:set("tid", #threads) table.insert(threads, thread) end
function init(args) run = args[1] end
function request()
  counter = counter + 1
  local body = '{"name":"c' .. run .. '-' .. tid .. '-' .. counter .. '","query":{"kind":"SQLQuery","query":"SELECT 1 AS n"}}'
  return wrk.format("POST", nil, nil, body)
end
"""


# A create plans its query in one of its project's query slots (`--max-queries-per-project`, given to the CRUD
# servers as this, the default), answering 429 beyond them: creates are measured from as many connections.
CREATE_CONNECTIONS = 4


def crud(app, seconds, rounds, script):
    base = app.base + "/api/projects/1/endpoints"
    app.request("POST", "/api/projects/1/endpoints/", {"name": "crud-probe", "query": {"kind": "SQLQuery", "query": "SELECT 1 AS n"}})
    return {
        "create": median_of([wrk(base + "/", app.key, seconds, connections=CREATE_CONNECTIONS, script=script,
                                 script_args=(f"{uuid.uuid4().hex[:8]}",))
                             for _ in range(rounds)]),
        "get": wrk_rounds(base + "/crud-probe", app.key, seconds, rounds),
        "list": wrk_rounds(base + "/?limit=100", app.key, seconds, rounds),
    }


def crud_on(args, root, name, database_url=None):
    """Create, get and list throughput on a fresh store named `name` (SQLite, or PostgreSQL at `database_url`):
    the figures, and the stopped server on that store."""
    data_dir = os.path.join(root, f"crud-{name.lower()}")
    os.makedirs(data_dir)
    script = os.path.join(root, "create.lua")
    with open(script, "w") as f:
        f.write(CREATE_LUA)
    app = Endpoints(args.bin_dir, data_dir, database_url)
    app.cli("migrate")
    app.cli("project", "create", "--name", "bench")
    assert app.cli("project", "list")[-1]["id"] == 1, "the CRUD database must be fresh"
    app.key = app.cli("key", "create", "--project", "1", "--scope", "endpoint:write", "--scope", "table:write")["key"]
    app.start("--materialize-workers", "0", "--max-queries-per-project", str(CREATE_CONNECTIONS))
    try:
        figures = crud(app, args.seconds, args.rounds, script)
    finally:
        app.stop()
    log(f"CRUD on {name}: " + ", ".join(f"{k} {v['rps']:.0f}/s" for k, v in figures.items()))
    return figures, app


def duckdb_median(venv_python, parquet_glob, rounds):
    # One connection for every round, its first round left out: DuckDB at its friendliest (its caches warm), the
    # service's side being a new session per run.
    code = (
        "import duckdb, json, statistics, time, sys\n"
        "sql = sys.argv[1]; runs = []; con = duckdb.connect(); con.sql(sql).fetchall()\n"
        "for _ in range(int(sys.argv[2])):\n"
        "    t = time.perf_counter(); rows = con.sql(sql).fetchall()\n"
        "    runs.append((time.perf_counter() - t) * 1000)\n"
        "print(json.dumps({'median_ms': statistics.median(runs), 'rows': len(rows)}))\n"
    )
    out = subprocess.run([venv_python, "-c", code, DUCKDB_SQL.format(path=parquet_glob), str(rounds)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


EXPORT_ROWS = 1_000_000
EXPORT_FORMATS = ("csv", "ndjson", "parquet", "arrow")

# DuckDB's side of scenario 8, in its own process: argv = mode, source (a CSV file's path, or a DuckDB list of
# Parquet files), target, rows; prints the median ms.
DUCKDB_IO = """
import duckdb, json, statistics, sys, time
mode, source, target, rows, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
runs = []
for _ in range(rounds):
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    t = time.perf_counter()
    if mode == "import":
        con.sql(f"COPY (SELECT * FROM read_csv('{source}')) TO '{target}' (FORMAT parquet)")
    elif mode == "arrow":
        import pyarrow as pa
        reader = con.sql(f"SELECT * FROM read_parquet({source}) LIMIT {rows}").fetch_record_batch()
        with pa.OSFile(target, "wb") as sink, pa.ipc.new_stream(sink, reader.schema) as writer:
            for batch in reader:
                writer.write_batch(batch)
    else:
        fmt = {"csv": "csv, header true", "ndjson": "json", "parquet": "parquet"}[mode]
        con.sql(f"COPY (SELECT * FROM read_parquet({source}) LIMIT {rows}) TO '{target}' (FORMAT {fmt})")
    runs.append((time.perf_counter() - t) * 1000)
    con.close()
print(json.dumps({"median_ms": statistics.median(runs)}))
"""


def duckdb_io(venv_python, mode, source, target, rows, rounds):
    out = subprocess.run([venv_python, "-c", DUCKDB_IO, mode, source, target, str(rows), str(rounds)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["median_ms"]  # the figures are the last line


def upload(app, table, path, key):
    """Streams a CSV file into a table with PUT; returns the wall time in ms and the answer."""
    import http.client
    host, port = app.base.rsplit("/", 1)[1].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=3600)
    started = time.perf_counter()
    with open(path, "rb") as body:
        connection.request("PUT", f"/api/projects/1/tables/{table}", body=body, headers={
            "Authorization": f"Bearer {key}", "Content-Type": "text/csv",
            "Content-Length": str(os.path.getsize(path))})
        response = connection.getresponse()
        answer = response.read()
    elapsed = (time.perf_counter() - started) * 1000
    assert response.status in (200, 201), answer
    return elapsed, json.loads(answer)


def download(app, path, target):
    """GETs `path` into a file; returns the wall time in ms and the bytes."""
    req = urllib.request.Request(app.base + path)
    req.add_header("Authorization", f"Bearer {app.key}")
    started = time.perf_counter()
    size = 0
    with urllib.request.urlopen(req, timeout=3600) as response, open(target, "wb") as out:
        while chunk := response.read(1 << 20):
            out.write(chunk)
            size += len(chunk)
    return (time.perf_counter() - started) * 1000, size


def data_in_and_out(args, main_app, root, table_dir):
    """Scenario 8: upload throughput and exports, each against DuckDB doing the same work on the same files."""
    if not args.duckdb_python:
        return None
    # Links to the files, which outlive the server's compaction and vacuum of them while DuckDB reads them.
    os.makedirs(os.path.join(root, "events-files"))
    linked = []
    for at, path in enumerate(table_files(main_app.data_dir, "events")):
        linked.append(os.path.join(root, "events-files", f"{at}.parquet"))
        os.link(path, linked[-1])
    parquet = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in linked) + "]"
    csv_path = os.path.join(root, "events.csv")
    subprocess.run([args.duckdb_python, "-c",
                    f"import duckdb; duckdb.sql(\"COPY (SELECT * FROM read_parquet({parquet})) TO '{csv_path}' "
                    f"(FORMAT csv, HEADER true)\")"], check=True)
    csv_bytes = os.path.getsize(csv_path)
    figures = {"csv_bytes": csv_bytes}
    app = main_app.start("--materialize-workers", "0", "--max-upload-mb", str(csv_bytes // (1 << 20) + 64))
    writer = main_app.cli("key", "create", "--project", "1", "--scope", "endpoint:write", "--scope", "table:write")["key"]
    uploads = []
    with PeakRss(app.process.pid) as peak:
        for _ in range(2):
            ms, table = upload(app, "uploaded", csv_path, writer)
            uploads.append(ms)
    assert table["row_count"] == args.rows, table
    figures["upload_ms"], figures["upload_mb"] = statistics.median(uploads), peak.peak
    figures["duckdb_import_ms"] = duckdb_io(args.duckdb_python, "import", csv_path,
                                           os.path.join(root, "duckdb-import.parquet"), 0, 2)
    log(f"upload of {csv_bytes / 1e6:.0f} MB of CSV: {figures['upload_ms']:.0f} ms against DuckDB's COPY "
        f"{figures['duckdb_import_ms']:.0f} ms")
    app.request("POST", "/api/projects/1/endpoints/",
                {"name": "export-probe", "query": {"kind": "SQLQuery", "query": "SELECT * FROM events"}})
    app.stop()
    # The exports' memory is measured on a process that has done nothing else: what the upload's allocations
    # left behind is not the export's.
    app = main_app.start("--materialize-workers", "0")
    time.sleep(2)
    figures["idle_mb"], figures["exports"] = rss_kb(app.process.pid) / 1024, {}
    for fmt in EXPORT_FORMATS:
        path = f"/api/projects/1/endpoints/export-probe/run?refresh=direct&limit={EXPORT_ROWS}&format={fmt}"
        target = os.path.join(root, f"export.{fmt}")
        download(app, path, target)
        with PeakRss(app.process.pid) as peak:
            runs = [download(app, path, target) for _ in range(3)]
        theirs = duckdb_io(args.duckdb_python, fmt, parquet, os.path.join(root, f"duckdb.{fmt}"), EXPORT_ROWS, 3)
        figures["exports"][fmt] = {"ms": statistics.median(r[0] for r in runs), "bytes": runs[0][1],
                                   "peak_mb": peak.peak, "duckdb_ms": theirs}
        log(f"export of {EXPORT_ROWS:,} rows as {fmt}: {figures['exports'][fmt]['ms']:.0f} ms against DuckDB "
            f"{theirs:.0f} ms, peak RSS {peak.peak:.0f} MB")
    app.stop()
    return figures


PAIRS = "generate_series(1, 1000000) AS a(x) CROSS JOIN generate_series(1, 1000000) AS b(y)"
# Heavy plans of the kinds that keep cores busy: one that emits batches all along, and three that work long
# between two batches (a filter that passes no pair, an anti join over pairs, an aggregation into one group).
HEAVY_PLANS = {
    "a cross join": f"SELECT count(*) AS n FROM {PAIRS} WHERE (x + y) % 7 = 3",
    "a cross join whose filter passes nothing": f"SELECT count(*) AS n FROM {PAIRS} WHERE x + y < 0",
    "an anti join over pairs": "SELECT count(*) AS n FROM generate_series(1, 1000000) AS a(x) WHERE NOT EXISTS "
                               "(SELECT 1 FROM generate_series(1, 1000000) AS b(y) WHERE x + y < 0)",
    "an aggregation into one group": "SELECT max(x * 2) AS n FROM generate_series(1, 100000000000) AS t(x)",
}
SMALL_SQL = "SELECT v % 10 AS k, count(*) AS n FROM generate_series(1, 20000) AS t(v) GROUP BY k ORDER BY k"


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def flood(base, seconds, threads=4, source="127.0.0.2"):
    """Requests with made-up keys from another address for `seconds`, on keep-alive connections; counts by
    status."""
    import http.client
    host, port = base.removeprefix("http://").split(":")
    counts, lock, stop = {}, threading.Lock(), time.perf_counter() + seconds

    def run():
        connection = http.client.HTTPConnection(host, int(port), timeout=10, source_address=(source, 0))
        while time.perf_counter() < stop:
            connection.request("GET", "/api/projects/2/endpoints/small-cached/run",
                               headers={"Authorization": f"Bearer phx_{uuid.uuid4().hex}{uuid.uuid4().hex}"})
            response = connection.getresponse()
            response.read()
            with lock:
                counts[response.status] = counts.get(response.status, 0) + 1
            if response.getheader("Connection", "").lower() == "close":
                connection.close()
                connection = http.client.HTTPConnection(host, int(port), timeout=10, source_address=(source, 0))

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return counts


def isolation(args, root):
    """Scenario 9: fairness between projects, and a flood of unknown keys."""
    data_dir = os.path.join(root, "isolation")
    os.makedirs(data_dir)
    app = Endpoints(args.bin_dir, data_dir)
    app.cli("migrate")
    keys = {}
    for project in (1, 2):
        app.cli("project", "create", "--name", f"tenant-{project}")
        keys[project] = app.cli(
            "key", "create", "--project", str(project), "--scope", "endpoint:write", "--scope", "table:write"
        )["key"]
    app.start("--materialize-workers", "0")

    def create(project, name, sql, cache=None):
        app.key = keys[project]
        body = {"name": name, "query": {"kind": "SQLQuery", "query": sql}}
        if cache:
            body["cache_age_seconds"] = cache
        app.request("POST", f"/api/projects/{project}/endpoints/", body)

    for i, sql in enumerate(HEAVY_PLANS.values()):
        create(1, f"heavy-{i}", sql)
    create(2, "small", SMALL_SQL)
    create(2, "small-cached", SMALL_SQL, cache=3600)
    small = "/api/projects/2/endpoints/small/run?refresh=direct"

    def latencies(rounds):
        app.key = keys[2]
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            app.request("GET", small)
            times.append((time.perf_counter() - started) * 1000)
        return times

    latencies(5)
    idle = latencies(60)
    figures = {"idle_p50": statistics.median(idle), "idle_p95": percentile(idle, 0.95), "heavy": {}}
    for i, kind in enumerate(HEAVY_PLANS):
        heavy_done = []

        def heavy():
            request = urllib.request.Request(app.base + f"/api/projects/1/endpoints/heavy-{i}/run?refresh=direct")
            request.add_header("Authorization", f"Bearer {keys[1]}")
            try:
                urllib.request.urlopen(request, timeout=600).read()
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            heavy_done.append(time.perf_counter())

        load = [threading.Thread(target=heavy, daemon=True) for _ in range(4)]
        for thread in load:
            thread.start()
        time.sleep(2)
        loaded = latencies(60)
        figures["heavy"][kind] = {"p50": statistics.median(loaded), "p95": percentile(loaded, 0.95),
                                  "running": len(heavy_done) == 0}
        # The heavy queries end with the server.
        app.stop()
        app.start("--materialize-workers", "0")
        log(f"isolation: small query p95 {figures['idle_p95']:.1f} ms idle, "
            f"{figures['heavy'][kind]['p95']:.1f} ms beside four of {kind} of another project")
    app.stop()

    # The memory-bomb corpus, each bomb four times at once, and three uploads with a 400 MB field at once.
    app.start("--materialize-workers", "0")
    app.key = keys[2]
    idle_mb = rss_kb(app.process.pid) / 1024
    bombs = [
        "SELECT length(repeat('x', 1500000000)) AS n",
        "SELECT sum(length(repeat('x', 1000000 + v % 2))) AS n FROM generate_series(1, 2100) AS t(v)",
        "SELECT length(lpad('x', 2000000000)) AS n",
        "WITH a AS (SELECT repeat('x', 300000000) AS s) SELECT length(s || s || s || s) AS n FROM a",
        "SELECT cardinality(range(1, 10000000000)) AS n",
        "SELECT length(replace(repeat('a', 100000), 'a', repeat('b', 100000))) AS n",
        "SELECT length(encode(encode(encode(repeat('x', 200000000), 'hex'), 'hex'), 'hex')) AS n",
        "SELECT length(array_to_string(range(1, 1000000), repeat('x', 1000))) AS n",
    ]
    for i, sql in enumerate(bombs):
        create(2, f"bomb-{i}", sql)
    outcomes = {}

    def bomb(i):
        request = urllib.request.Request(app.base + f"/api/projects/2/endpoints/bomb-{i}/run?refresh=direct")
        request.add_header("Authorization", f"Bearer {keys[2]}")
        try:
            urllib.request.urlopen(request, timeout=600).read()
            status = 200
        except urllib.error.HTTPError as err:
            status = err.code
        outcomes[status] = outcomes.get(status, 0) + 1

    field = b"id,blob\n1,\"" + b"x" * (400 * 1024 * 1024) + b"\"\n"

    def huge_upload(n):
        request = urllib.request.Request(app.base + f"/api/projects/2/tables/huge{n}", data=field, method="PUT")
        request.add_header("Authorization", f"Bearer {keys[2]}")
        request.add_header("Content-Type", "text/csv")
        try:
            urllib.request.urlopen(request, timeout=600).read()
            status = 200
        except urllib.error.HTTPError as err:
            status = err.code
        except (urllib.error.URLError, OSError):
            # Refused before the body was all sent: the server answered 400 and closed the connection.
            status = "cut off"
        outcomes[f"upload {status}"] = outcomes.get(f"upload {status}", 0) + 1

    with PeakRss(app.process.pid) as peak:
        for i in range(len(bombs)):
            threads = [threading.Thread(target=bomb, args=(i,)) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        uploads = [threading.Thread(target=huge_upload, args=(n,)) for n in range(3)]
        for thread in uploads:
            thread.start()
        for thread in uploads:
            thread.join()
    app.stop()
    figures.update({"bomb_idle_mb": idle_mb, "bomb_peak_mb": peak.peak, "bomb_outcomes": outcomes,
                    "bombs": len(bombs)})
    log(f"isolation: peak RSS {peak.peak:.0f} MB under the memory-bomb corpus (idle {idle_mb:.0f} MB): {outcomes}")

    # A valid key's cached runs, alone and during a flood of made-up keys from another address.
    app.start("--materialize-workers", "0")
    app.key = keys[2]
    cached = app.base + "/api/projects/2/endpoints/small-cached/run"
    app.request("GET", "/api/projects/2/endpoints/small-cached/run")
    quiet = wrk_rounds(cached, keys[2], args.seconds, args.rounds, connections=16)
    flooded, statuses = [], {}
    for _ in range(args.rounds):
        counts = {}
        flooder = threading.Thread(target=lambda: counts.update(flood(app.base, args.seconds + 1)))
        flooder.start()
        time.sleep(0.5)
        flooded.append(wrk(cached, keys[2], args.seconds, connections=16))
        flooder.join()
        for status, n in counts.items():
            statuses[status] = statuses.get(status, 0) + n
    app.stop()
    figures.update({"quiet": quiet, "flooded": median_of(flooded), "flood_statuses": statuses,
                    "flood_rps": sum(statuses.values()) / (args.rounds * (args.seconds + 1))})
    log(f"isolation: cached p99 {quiet['p99']:.2f} ms alone, {figures['flooded']['p99']:.2f} ms during a flood of "
        f"{figures['flood_rps']:.0f} unknown keys/s ({statuses})")
    return figures


def isolation_section(f):
    flood_ratio = f["flooded"]["p99"] / f["quiet"]["p99"]
    statuses = ", ".join(f"{n:,} x {status}" for status, n in sorted(f["flood_statuses"].items()))
    outcomes = ", ".join(f"{n} x {status}" for status, n in sorted(f["bomb_outcomes"].items(), key=str))
    lines = [
        f"**Isolation** (scenario 9, {datetime.date.today().isoformat()}; release build, two projects on one "
        f"server with its default limits).",
        "",
        "| Measure | Alone | Under attack | Ratio | Target |",
        "|---|---|---|---|---|",
        *[f"| another project's small live query (p95 of 60; p50 {f['idle_p50']:.1f} / {h['p50']:.1f} ms), "
          f"beside one project's four runs of {kind} | {f['idle_p95']:.1f} ms | {h['p95']:.1f} ms | "
          f"{h['p95'] / f['idle_p95']:.1f}x | <= 10x: {check(h['p95'] <= 10 * f['idle_p95'] and h['running'])} |"
          for kind, h in f["heavy"].items()],
        f"| a valid key's cached run (p99, wrk, 16 connections; {f['quiet']['rps']:,.0f} and "
        f"{f['flooded']['rps']:,.0f} req/s), during a flood of {f['flood_rps']:,.0f} made-up keys/s from another "
        f"address ({statuses}) | {f['quiet']['p99']:.2f} ms | {f['flooded']['p99']:.2f} ms | {flood_ratio:.2f}x | "
        "none |",
        f"| the server's peak RSS under the memory-bomb corpus ({f['bombs']} queries four at once each, then three "
        f"uploads with a 400 MB field at once; answers: {outcomes}) | {f['bomb_idle_mb']:.0f} MB | "
        f"{f['bomb_peak_mb']:.0f} MB | | < 2048 MB (`--max-memory`): {check(f['bomb_peak_mb'] < 2048)} |",
        "",
    ]
    return "\n".join(lines)


ISOLATION_MARKER = "<!-- scenario 9, written by make bench -->"


def write_section(args, marker, section, out=None):
    """Replaces a scenario's section (between its marker and the next) in the page of scenarios measured alone (or
    `out`); a new one goes at its end."""
    out = out or args.scenarios_out
    text = open(out).read() if os.path.exists(out) else "# Benchmarks\n\n"
    if marker in text:
        before, after = text.split(marker, 1)
        rest = after.split(marker, 1)[1] if marker in after else ""
        text = before + marker + "\n" + section + marker + rest
    else:
        text = text.rstrip() + "\n\n" + marker + "\n" + section + marker + "\n"
    with open(out, "w") as f_out:
        f_out.write(text)
    print(section)


def write_isolation(args, figures):
    write_section(args, ISOLATION_MARKER, isolation_section(figures))


APPENDS_MARKER = "<!-- scenario 10, written by make bench -->"
APPEND_SQL = "SELECT country, count(*) AS events, round(sum(revenue), 2) AS revenue FROM {table} GROUP BY country ORDER BY country"
COUNTRIES = ("DE", "FR", "US", "GB", "IT", "ES", "NL", "PL")


def append_rows(first, count):
    """`count` NDJSON events from id `first`."""
    return "".join(
        json.dumps({"id": i, "country": COUNTRIES[i % len(COUNTRIES)], "browser": "Edge" if i % 3 else "Firefox",
                    "revenue": round((i % 1000) * 0.37, 2), "at": f"2026-03-{1 + i % 28:02d}T{i % 24:02d}:00:00"})
        + "\n" for i in range(first, first + count))


def post_script(path, body):
    """A wrk script that POSTs `body` as NDJSON."""
    with open(path, "w") as f:
        f.write('wrk.method = "POST"\n')
        f.write(f"wrk.body = {json.dumps(body)}\n")
        f.write('wrk.headers["Content-Type"] = "application/x-ndjson"\n')
    return path


def put_rows(app, key, table, body, content_type="application/x-ndjson", project=1):
    req = urllib.request.Request(f"{app.base}/api/projects/{project}/tables/{table}", data=body.encode(), method="PUT")
    req.add_header("Authorization", f"Bearer {key}")
    req.add_header("Content-Type", content_type)
    with urllib.request.urlopen(req, timeout=600) as response:
        return json.loads(response.read())


def table_record(app, key, table):
    req = urllib.request.Request(f"{app.base}/api/projects/1/tables/{table}")
    req.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(req, timeout=60) as response:
        return json.loads(response.read())


# DuckDB's side of scenario 10: the same NDJSON rows to Parquet in process; argv = source, target, rounds.
DUCKDB_COPY_NDJSON = """
import duckdb, json, statistics, sys, time
source, target, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = []
for _ in range(rounds):
    con = duckdb.connect()
    t = time.perf_counter()
    con.sql(f"COPY (SELECT * FROM read_json('{source}', format = 'newline_delimited')) TO '{target}' (FORMAT parquet)")
    runs.append((time.perf_counter() - t) * 1000)
    con.close()
print(json.dumps({"median_ms": statistics.median(runs)}))
"""


def add_readers(app, count, table, prefix, workers=4, project=1, key=None):
    """`count` endpoints of `project` named `prefix-N`, each reading `table`, created through the API."""
    def create(n):
        body = {"name": f"{prefix}-{n:05d}", "query": {"kind": "SQLQuery", "query": f"SELECT count(*) AS n FROM {table}"}}
        for attempt in range(100):
            try:
                return app.request("POST", f"/api/projects/{project}/endpoints/", body, key=key)
            except urllib.error.HTTPError as refused:
                # Planning a new endpoint takes one of the project's query slots: a full project says when to retry.
                if refused.code != 429 or attempt == 99:
                    raise
                time.sleep(float(refused.headers.get("Retry-After", "1")) / 10)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(create, range(count)))


def table_writer(args, root, name):
    """A server on a new data directory `root/name` (its refresh worker off), and a key of its project 1 that
    writes endpoints and tables."""
    data_dir = os.path.join(root, name)
    os.makedirs(data_dir)
    app = Endpoints(args.bin_dir, data_dir)
    app.cli("migrate")
    app.cli("project", "create", "--name", name)
    app.key = app.cli("key", "create", "--project", "1", "--scope", "endpoint:write", "--scope", "table:write")["key"]
    app.start("--materialize-workers", "0")
    return app, app.key


def appends(args, root):
    """Scenario 10: streaming appends, their throughput by connections, and a table after many of them."""
    app, key = table_writer(args, root, "appends")
    figures = {"rounds": args.rounds}
    put_rows(app, key, "stream", append_rows(0, 5))
    put_rows(app, key, "batches", append_rows(0, 5))
    put_rows(app, key, "other", append_rows(0, 5))
    add_readers(app, 5, "stream", "reads-stream")
    small = post_script(os.path.join(root, "append-5.lua"), append_rows(5, 5))
    big = post_script(os.path.join(root, "append-500.lua"), append_rows(5, 500))
    stream_url = f"{app.base}/api/projects/1/tables/stream/rows"
    seconds = max(args.seconds, 5)
    figures["one"] = wrk_rounds(stream_url, key, seconds, args.rounds, connections=1, script=small)
    figures["sixteen"] = wrk_rounds(stream_url, key, seconds, args.rounds, connections=16, script=small)
    log(f"appends of 5 rows: {figures['one']['rps']:.0f}/s from 1 connection (p99 {figures['one']['p99']:.1f} ms), "
        f"{figures['sixteen']['rps']:.0f}/s from 16 (p99 {figures['sixteen']['p99']:.1f} ms)")
    # What an append costs does not follow the project's size: appends to a new table of a project with 5
    # endpoints reading it, and to the same table of a project with 5,000 more endpoints (reading another table),
    # round by round in turn, so that both tables have the same history when measured and drift falls on both.
    app.cli("project", "create", "--name", "many")
    many_key = app.cli("key", "create", "--project", "2", "--scope", "endpoint:write", "--scope", "table:write")["key"]
    for project, project_key in ((1, key), (2, many_key)):
        put_rows(app, project_key, "side", append_rows(0, 5), project=project)
        put_rows(app, project_key, "other", append_rows(0, 5), project=project)
        add_readers(app, 5, "side", "reads-side", project=project, key=project_key)
    add_readers(app, 5000, "other", "elsewhere", project=2, key=many_key)
    few_rounds, many_rounds = [], []
    for _ in range(max(args.rounds, 3)):
        few_rounds.append(wrk(f"{app.base}/api/projects/1/tables/side/rows", key, seconds, connections=1,
                              script=small))
        many_rounds.append(wrk(f"{app.base}/api/projects/2/tables/side/rows", many_key, seconds, connections=1,
                               script=small))
    figures["one_few"], figures["one_many"] = median_of(few_rounds), median_of(many_rounds)
    log(f"appends of 5 rows from 1 connection with 5,005 endpoints in the project: p50 "
        f"{figures['one_many']['p50']:.2f} ms against {figures['one_few']['p50']:.2f} ms with 5, rounds in turn")
    batches = wrk_rounds(f"{app.base}/api/projects/1/tables/batches/rows", key, seconds, args.rounds,
                         connections=16, script=big)
    figures["batch_rows_per_s"] = batches["rps"] * 500
    figures["batch_p99"] = batches["p99"]
    if args.duckdb_python:
        source = os.path.join(root, "batch.ndjson")
        with open(source, "w") as f:
            for n in range(200):
                f.write(append_rows(n * 500, 500))
        out = subprocess.run([args.duckdb_python, "-c", DUCKDB_COPY_NDJSON, source, os.path.join(root, "batch.parquet"),
                              str(max(args.rounds, 3))], check=True, capture_output=True, text=True).stdout
        figures["duckdb_rows_per_s"] = 100_000 / (json.loads(out.strip().splitlines()[-1])["median_ms"] / 1000)
    log(f"appends of 500 rows from 16 connections: {figures['batch_rows_per_s']:,.0f} rows/s"
        + (f" against DuckDB's COPY {figures['duckdb_rows_per_s']:,.0f} rows/s" if "duckdb_rows_per_s" in figures else ""))

    # At least 10,000 small appends in all, then compaction, then the table against the same rows written at once.
    for _ in range(20):
        appended = table_record(app, key, "stream")["row_count"] // 5 - 1
        if appended >= 10_000:
            break
        wrk(stream_url, key, seconds, connections=16, script=small)
    figures["appends"] = appended
    deadline = time.time() + 60
    record = table_record(app, key, "stream")
    while time.time() < deadline:
        time.sleep(1)
        record = table_record(app, key, "stream")
        if record["files"] <= 16:
            break
    figures["files"], figures["rows"] = record["files"], record["row_count"]
    app.request("POST", "/api/projects/1/endpoints/", {"name": "all-stream", "query": {"kind": "SQLQuery", "query": "SELECT * FROM stream"}})
    csv_rows = urllib.request.Request(f"{app.base}/api/projects/1/endpoints/all-stream/run?refresh=direct&format=csv&limit={record['row_count']}")
    csv_rows.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(csv_rows, timeout=600) as response:
        put_rows(app, key, "stream_once", response.read().decode(), "text/csv")
    for table in ("stream", "stream_once"):
        app.request("POST", "/api/projects/1/endpoints/", {"name": f"by-country-{table.replace('_', '-')}",
                    "cache_age_seconds": 0, "query": {"kind": "SQLQuery", "query": APPEND_SQL.format(table=table)}})
    streamed_path = "/api/projects/1/endpoints/by-country-stream/run?refresh=direct"
    once_path = "/api/projects/1/endpoints/by-country-stream-once/run?refresh=direct"
    app.timed(streamed_path, 3)
    app.timed(once_path, 3)
    streamed, answers = [], []
    once = []
    for _ in range(3):
        ms, got = app.timed(streamed_path, 10)
        streamed.append(ms)
        answers.append(got[0]["results"])
        once.append(app.timed(once_path, 10)[0])
    _, expected = app.timed(once_path, 1)
    assert same_rows(answers[0], expected[0]["results"]), "the streamed table answers as the one written at once"
    figures["streamed_ms"], figures["once_ms"] = statistics.median(streamed), statistics.median(once)
    log(f"after {appended:,} appends: {figures['files']} files, a live GROUP BY {figures['streamed_ms']:.1f} ms "
        f"against {figures['once_ms']:.1f} ms over the same rows written at once")
    app.stop()
    return figures


def appends_section(f):
    one, sixteen, few, many = f["one"], f["sixteen"], f["one_few"], f["one_many"]
    scale = sixteen["rps"] / one["rps"]
    grown = many["p50"] / few["p50"]
    live = f["streamed_ms"] / f["once_ms"]
    duckdb = f.get("duckdb_rows_per_s")
    batch_ratio = f["batch_rows_per_s"] / duckdb if duckdb else None
    lines = [
        f"**Streaming appends** (scenario 10, {datetime.date.today().isoformat()}; release build, local storage, "
        f"SQLite, wrk posting NDJSON bodies to one table; each figure the median of {f['rounds']} rounds).",
        "",
        "| Measure | Figure | Baseline | Ratio | Target |",
        "|---|---|---|---|---|",
        f"| 5-row appends, 16 connections | {sixteen['rps']:,.0f}/s (p50 {sixteen['p50']:.1f} ms, p99 "
        f"{sixteen['p99']:.1f} ms) | 1 connection: {one['rps']:,.0f}/s (p99 {one['p99']:.1f} ms) | {scale:.1f}x | "
        f">= 1,000/s: {check(sixteen['rps'] >= 1000)}; p99 < 50 ms: {check(sixteen['p99'] < 50)}; >= 8x: "
        f"{check(scale >= 8)} |",
        f"| 5-row appends, 1 connection, a project with 5,000 more endpoints (reading another table) | p50 "
        f"{many['p50']:.2f} ms | a project with 5 (reading this table), rounds in turn: p50 {few['p50']:.2f} ms | "
        f"{grown:.2f}x | <= 1.1x: {check(grown <= 1.1)} |",
        f"| 500-row appends, 16 connections | {f['batch_rows_per_s']:,.0f} rows/s (p99 {f['batch_p99']:.1f} ms) | "
        + (f"DuckDB `COPY` of the same NDJSON rows to Parquet in process: {duckdb:,.0f} rows/s | {batch_ratio:.2f}x | "
           f">= 0.5x: {check(batch_ratio >= 0.5)} |" if duckdb else "(no DuckDB) | | |"),
        f"| after {f['appends']:,} small appends and compaction | {f['files']} file{'s' if f['files'] != 1 else ''} "
        f"({f['rows']:,} rows); a live "
        f"GROUP BY {f['streamed_ms']:.1f} ms | the same rows written at once: {f['once_ms']:.1f} ms | {live:.2f}x | "
        f"<= 64 files: {check(f['files'] <= 64)}; <= 1.2x: {check(live <= 1.2)} |",
        "",
        "How to read it: the first row compares the same server under 16 connections and under one (group commit "
        "should make many clients share writes); wrk runs on the server's own cores, so a second client takes CPU "
        "from the server. The second appends from one connection to the same new table in two projects, one holding "
        "5,000 more endpoints, a round of each in turn: who reads the table is an index, so it should cost the "
        "same. The third compares rows per "
        "second of 500-row bodies over HTTP, each answered once durable, with DuckDB converting the same rows in "
        "one process call. The fourth is the table after the "
        "stream: its files once compaction has run, and a live run over it against the same rows written by one "
        "upload.",
        "",
    ]
    return "\n".join(lines)


def write_appends(args, figures):
    write_section(args, APPENDS_MARKER, appends_section(figures))


COMMITS_MARKER = "<!-- scenario 14, written by make bench -->"


def newest_version(app, key, table):
    req = urllib.request.Request(f"{app.base}/api/projects/1/tables/{table}/versions?limit=1")
    req.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(req, timeout=60) as response:
        return json.loads(response.read())["results"][0]["version"]


def commits(args, root):
    """Scenario 14: a table after `--commits` commits to its Delta log, opened by a new process: the first run over
    it (its log read from the newest checkpoint) against the first run over a table of one commit."""
    app, key = table_writer(args, root, "commits")
    put_rows(app, key, "stream", append_rows(0, 5))
    put_rows(app, key, "once", append_rows(0, 5))
    for table in ("stream", "once"):
        app.request("POST", "/api/projects/1/endpoints/", {"name": f"by-country-{table}", "cache_age_seconds": 0,
                    "query": {"kind": "SQLQuery", "query": APPEND_SQL.format(table=table)}})
    # One connection: each append is a commit of its own (compactions add theirs).
    script = post_script(os.path.join(root, "append-1.lua"), append_rows(5, 1))
    started = time.perf_counter()
    while (version := newest_version(app, key, "stream")) < args.commits:
        log(f"{version:,} commits of {args.commits:,}")
        wrk(f"{app.base}/api/projects/1/tables/stream/rows", key, 30, connections=1, script=script)
    figures = {"commits": version, "writing_s": time.perf_counter() - started, "rounds": args.rounds}
    rows = table_record(app, key, "stream")["row_count"]
    app.stop()
    streamed, once = [], []
    for _ in range(args.rounds):
        for table, times in (("stream", streamed), ("once", once)):
            app.start("--materialize-workers", "0", "--compaction-interval-ms", "3600000")
            ms, answers = app.timed(f"/api/projects/1/endpoints/by-country-{table}/run?refresh=direct", 1)
            if table == "stream":
                assert sum(row["events"] for row in answers[0]["results"]) == rows, "every row read"
            times.append(ms)
            app.stop()
    figures["first_ms"], figures["once_ms"] = statistics.median(streamed), statistics.median(once)
    log(f"first run after {version:,} commits: {figures['first_ms']:.0f} ms, over one commit "
        f"{figures['once_ms']:.0f} ms")
    return figures


def commits_section(f):
    return "\n".join([
        f"**A table after {f['commits']:,} commits** (scenario 14, {datetime.date.today().isoformat()}; release build, "
        f"local storage; the commits written by 1-row appends from one connection in {f['writing_s']:.0f} s; each "
        f"figure the median of {f['rounds']} new processes).",
        "",
        "| Measure | Figure | Baseline | Ratio | Target |",
        "|---|---|---|---|---|",
        f"| a new process's first run over the table | {f['first_ms']:.0f} ms | its first run over a table of one "
        f"commit: {f['once_ms']:.0f} ms | {f['first_ms'] / f['once_ms']:.2f}x | <= 1 s: {check(f['first_ms'] <= 1000)} |",
        "",
        "The first run reads the table's log from its newest checkpoint (one every 100 commits) and the commits "
        "after it; both runs include starting the engine's session and planning.",
        "",
    ])


def write_commits(args, figures):
    write_section(args, COMMITS_MARKER, commits_section(figures))


FRESH_MARKER = "<!-- scenario 11, written by make bench -->"
FRESH_SQL = ("SELECT country, count(*) AS events, round(sum(revenue), 2) AS revenue FROM events "
             "WHERE timestamp >= {variables.since} GROUP BY country ORDER BY events DESC, country")
FRESH_RUN = "/api/projects/1/endpoints/{name}/run?variables.since=2026-03-01"


def event_rows(first, count):
    """`count` NDJSON rows of the demo's events table, from id `first`, in March 2026."""
    return "".join(
        json.dumps({"timestamp": f"2026-03-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:00", "event": "purchase",
                    "distinct_id": f"fresh-{i}", "country": COUNTRIES[i % len(COUNTRIES)],
                    "browser": "Firefox", "revenue": round((i % 1000) * 0.37, 2)}) + "\n"
        for i in range(first, first + count))


def post_rows(app, key, table, body):
    req = urllib.request.Request(f"{app.base}/api/projects/1/tables/{table}/rows", data=body.encode(), method="POST")
    req.add_header("Authorization", f"Bearer {key}")
    req.add_header("Content-Type", "application/x-ndjson")
    with urllib.request.urlopen(req, timeout=60) as response:
        return json.loads(response.read())


def refresh_timings(app):
    """The refresh worker's (count, total seconds) by outcome, from /metrics."""
    with urllib.request.urlopen(app.base + "/metrics", timeout=10) as response:
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        match = re.match(r'endpoints_materialization_refresh_seconds_(sum|count)\{outcome="(\w+)"\} (\S+)', line)
        if match:
            kind, outcome, value = match.groups()
            found.setdefault(outcome, [0, 0.0])[0 if kind == "count" else 1] = float(value)
    return found


def status_of(app, name):
    return json.loads(app.request("GET", f"/api/projects/1/endpoints/{name}/materialization_status"))


def wait_until(what, check, seconds=600, pause=0.05):
    deadline = time.time() + seconds
    while time.time() < deadline:
        got = check()
        if got:
            return got
        time.sleep(pause)
    raise RuntimeError(f"timed out waiting for {what}")


def timed_outcome(app, outcome, action):
    """Runs `action`, then waits for one more refresh that ended with `outcome`; its seconds."""
    before = refresh_timings(app).get(outcome, [0, 0.0])
    action()
    after = wait_until(f"a {outcome} refresh",
                       lambda: (lambda t: t if t.get(outcome, [0])[0] > before[0] else None)(refresh_timings(app)))
    count, total = after[outcome]
    return (total - before[1]) / (count - before[0])


def fresh(args, app, writer):
    """Scenario 11: a fold of appended rows into a rollup of the events table against its full refresh, and
    materialized runs while rows stream in. `app` serves the main dataset with its refresh worker on."""
    figures = {"rows": args.rows}
    # Measured once the table is laid out for its endpoints: its first compaction re-sorts every row (seconds of
    # a core at 10M events), and folds measured meanwhile share the cores with it.
    laid_out(app, "events")
    # Only this scenario's endpoint refreshes meanwhile.
    for name in ("events-by-country", "country-daily"):
        app.request("PATCH", f"/api/projects/1/endpoints/{name}", {"is_materialized": False})
    body = {"name": "fresh-by-country", "is_materialized": True, "freshness_seconds": 1, "cache_age_seconds": 0,
            "query": {"kind": "SQLQuery", "query": FRESH_SQL,
                      "variables": {"since": {"type": "Date", "default": "2026-01-01"}}}}
    full = []
    for round_ in range(max(args.rounds, 3)):
        def create():
            app.request("DELETE", "/api/projects/1/endpoints/fresh-by-country") if round_ else None
            app.request("POST", "/api/projects/1/endpoints/", body)
        full.append(timed_outcome(app, "completed", create))
    wait_until("the first result", lambda: status_of(app, "fresh-by-country")["status"] == "Completed")
    figures["full_ms"] = statistics.median(full) * 1000
    stored_rows = status_of(app, "fresh-by-country")["row_count"]
    log(f"full refresh of the rollup over {args.rows:,} events: {figures['full_ms']:.0f} ms ({stored_rows} rows stored)")

    # Folds of one 1,000-row append each; the answer after each equals the live one.
    folds, delays, first = [], [], 0
    for _ in range(max(args.rounds, 5)):
        appended = []
        def append():
            appended.append(time.time())
            post_rows(app, writer, "events", event_rows(first, 1000))
        folds.append(timed_outcome(app, "folded", append))
        delays.append(time.time() - appended[0])
        first += 1000
        stored = json.loads(app.request("GET", FRESH_RUN.format(name="fresh-by-country")))
        live = json.loads(app.request("GET", FRESH_RUN.format(name="fresh-by-country") + "&refresh=direct"))
        assert stored["endpoint_materialized"] and same_rows(stored["results"], live["results"]), "folded != live"
    figures["fold_ms"] = statistics.median(folds) * 1000
    figures["fold_delay_s"] = statistics.median(delays)
    log(f"fold of 1,000 appended rows: {figures['fold_ms']:.1f} ms against a full refresh of {figures['full_ms']:.0f} ms; "
        f"appended to folded in {figures['fold_delay_s']:.2f} s")

    # Materialized against live runs while 5-row appends stream in at 100 a second: the rollup and
    # `country-daily`, whose variables filter only its group keys (stored as a rollup of its keys), both folded
    # and due within 1 s.
    app.request("PATCH", "/api/projects/1/endpoints/country-daily",
                {"is_materialized": True, "freshness_seconds": 1, "cache_age_seconds": 0})
    wait_until("country-daily stored", lambda: status_of(app, "country-daily")["status"] == "Completed")
    streaming = {"on": True, "appends": 0, "first": first}
    folded_before = refresh_timings(app).get("folded", [0, 0.0])
    def stream():
        started = time.time()
        while streaming["on"]:
            post_rows(app, writer, "events", event_rows(streaming["first"], 5))
            streaming["first"] += 5
            streaming["appends"] += 1
            pause = started + streaming["appends"] / 100 - time.time()
            if pause > 0:
                time.sleep(pause)
    thread = threading.Thread(target=stream, daemon=True)
    began = time.time()
    thread.start()
    try:
        time.sleep(float(os.environ.get("BENCH_FRESH_WARMUP", "2")))
        for key, path in (("rollup", FRESH_RUN.format(name="fresh-by-country")), ("rows", MATERIALIZED_PATH)):
            mat_ms, mat = app.timed(path, args.live_rounds * 20)
            live_ms, _ = app.timed(path + "&refresh=direct", args.live_rounds)
            stored = sum(1 for a in mat if a["endpoint_materialized"])
            figures[f"{key}_mat_ms"], figures[f"{key}_live_ms"] = mat_ms, live_ms
            figures[f"{key}_stored"] = stored / len(mat)
    finally:
        streaming["on"] = False
        thread.join()
    figures["appends_per_s"] = streaming["appends"] / (time.time() - began)
    # What a fold of the streamed rows (many appends of 5 rows since the fold before) costs the worker.
    folded_after = refresh_timings(app).get("folded", [0, 0.0])
    figures["stream_folds"] = int(folded_after[0] - folded_before[0])
    figures["stream_fold_ms"] = (folded_after[1] - folded_before[1]) / max(figures["stream_folds"], 1) * 1000
    figures["mat_ms"], figures["live_ms"] = figures["rollup_mat_ms"], figures["rollup_live_ms"]
    assert figures["rollup_stored"] == 1, "a run of the rollup was not answered from its stored result"
    # Once the stream stops, the stored result catches up within its freshness and equals the live answer.
    stopped = time.time()
    live = json.loads(app.request("GET", FRESH_RUN.format(name="fresh-by-country") + "&refresh=direct"))
    try:
        wait_until("the stream folded in", lambda: same_rows(
            json.loads(app.request("GET", FRESH_RUN.format(name="fresh-by-country")))["results"], live["results"]), 30)
    except RuntimeError:
        stored = json.loads(app.request("GET", FRESH_RUN.format(name="fresh-by-country")))
        log(f"stored: {stored}\nlive: {live}\nstatus: {status_of(app, 'fresh-by-country')}")
        raise
    figures["caught_up_s"] = time.time() - stopped
    status = status_of(app, "fresh-by-country")
    figures["full_refreshes"], figures["rows_folded"] = status["full_refreshes"], status["rows_folded"]
    # `country-daily` too equals its live answer, and was folded: no full refresh after its first.
    live_daily = json.loads(app.request("GET", MATERIALIZED_PATH + "&refresh=direct"))
    wait_until("country-daily folded in", lambda: same_rows(
        json.loads(app.request("GET", MATERIALIZED_PATH))["results"], live_daily["results"]), 30)
    daily = status_of(app, "country-daily")
    figures["rows_full_refreshes"], figures["rows_rows_folded"] = daily["full_refreshes"], daily["rows_folded"]
    figures["rows_fold"] = daily.get("fold")  # not in the status of releases before it
    log(f"while streaming {figures['appends_per_s']:.0f} appends/s: the rollup materialized {figures['rollup_mat_ms']:.2f} ms "
        f"against live {figures['rollup_live_ms']:.1f} ms, country-daily {figures['rows_mat_ms']:.2f} ms against "
        f"{figures['rows_live_ms']:.1f} ms ({figures['rows_stored']:.0%} from its stored result); caught up "
        f"{figures['caught_up_s']:.1f} s after the stream stopped; {status['full_refreshes']} full refreshes, "
        f"{status['rows_folded']:,} rows folded; country-daily {daily['full_refreshes']} full refreshes, "
        f"{daily['rows_folded']:,} rows folded ({figures['rows_fold']})")
    return figures


def fresh_section(f):
    fold = f["full_ms"] / f["fold_ms"]
    speedup = f["rollup_live_ms"] / f["rollup_mat_ms"]
    rows_speedup = f["rows_live_ms"] / f["rows_mat_ms"]
    lines = [
        f"**Fresh materializations** (scenario 11, {datetime.date.today().isoformat()}; release build, local storage, "
        f"SQLite; the demo's events table of {f['rows']:,} rows; a rollup by country and day with "
        "`freshness_seconds: 1`; the refresh worker's own timings from `/metrics`; measured once the table's files "
        "are sorted by its endpoints' filters, as compaction lays them out).",
        "",
        "| Measure | Figure | Baseline | Ratio | Target |",
        "|---|---|---|---|---|",
        f"| fold of one 1,000-row append into the rollup | {f['fold_ms']:.1f} ms (appended to folded in "
        f"{f['fold_delay_s']:.2f} s) | its full refresh: {f['full_ms']:,.0f} ms | {fold:,.0f}x | >= 100x: {check(fold >= 100)} |",
        f"| the rollup's materialized run while 5-row appends stream in at {f['appends_per_s']:.0f}/s (folded) | "
        f"{f['rollup_mat_ms']:.2f} ms | the live run (`refresh=direct`): {f['rollup_live_ms']:.1f} ms | {speedup:.0f}x | "
        f">= 100x: {check(speedup >= 100)} |",
        f"| `country-daily`'s materialized run meanwhile (filtered on its group keys, `freshness_seconds: 1`; "
        f"{f['rows_stored']:.0%} of runs from its stored result) | {f['rows_mat_ms']:.2f} ms | the live run: "
        f"{f['rows_live_ms']:.1f} ms | {rows_speedup:.0f}x | >= 50x: {check(rows_speedup >= 50)} |",
        f"| `country-daily`'s full refreshes after its first, while the stream ran (fold: `{f['rows_fold']}`; "
        f"{f['rows_rows_folded']:,} rows folded) | {f['rows_full_refreshes'] - 1} | | | 0: "
        f"{check(f['rows_full_refreshes'] == 1)} |",
        "",
        f"While the stream ran, the worker's {f.get('stream_folds', 0)} folds (of both endpoints, each taking the "
        f"hundred or so appends since its previous one) took {f.get('stream_fold_ms', 0):.1f} ms on average. "
        f"After the stream stopped the stored result equalled the live answer within {f['caught_up_s']:.1f} s; the "
        f"endpoint had {f['full_refreshes']} full refresh{'es' if f['full_refreshes'] != 1 else ''} (its first) "
        f"and {f['rows_folded']:,} rows folded in; `country-daily` then equalled its live answer too. How to read it: the first row is what one refresh costs the "
        "worker when rows were appended, folded against computed again; the second is what callers see while "
        "the table changes every 10 ms, with the cache off (each run reads the stored result; a rollup's is "
        "aggregated again per run); with the cache on, runs between two folds are answered from it.",
        "",
    ]
    return "\n".join(lines)


def write_fresh(args, figures):
    write_section(args, FRESH_MARKER, fresh_section(figures))


LOGS_MARKER = "<!-- scenario 12, written by make bench -->"
# Scenario 12 loads the cached run until the run log holds at least this many records.
LOG_RECORDS = 1_000_000


def log_records(app):
    """Records the run log holds for events-by-country, by SQL over `_logs`."""
    path = "/api/projects/1/endpoints/log-count/run?refresh=direct"
    return json.loads(app.request("GET", path))["results"][0]["n"]


def run_logs(args, app):
    """Scenario 12: cached runs with the run log on against off (alternating, so a slow spell lands on both), then
    the usage of the endpoint over a million of its own records."""
    quiet = ("--materialize-workers", "0")
    app.stop()
    on, off = [], []
    for _ in range(args.rounds):
        for logging, figures in ((("--no-run-log",), off), ((), on)):
            app.start(*quiet, *logging)
            try:
                app.request("GET", LIVE_PATH)
                figures.append(wrk(app.base + LIVE_PATH, app.key, args.seconds))
            finally:
                app.stop()
    # The reads below measure a log of the load's runs alone: what the rounds above logged goes (a build that
    # dropped records under that load, as round 3's did, would otherwise read a smaller log).
    shutil.rmtree(os.path.join(app.data_dir, "projects", "1", "logs"), ignore_errors=True)
    app.start(*quiet)
    try:
        app.request("POST", "/api/projects/1/endpoints", {"name": "log-count", "query": {"kind": "SQLQuery",
                    "query": "SELECT count(*) AS n FROM _logs WHERE endpoint = 'events-by-country'"}})
        time.sleep(2)
        # A million new records (the earlier scenarios' are in the log too, in the full run): the target's usage
        # reads those, from when the load began; the whole log's is reported beside it.
        before = log_records(app)
        began = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        # A short first load learns the rate, so that each build stops close to a million records rather than
        # a 15-second load past it (a build whose log keeps more records would otherwise read more).
        records, seconds = before, 3
        while records - before < LOG_RECORDS:
            had = records
            wrk(app.base + LIVE_PATH, app.key, seconds)
            time.sleep(2)
            records = log_records(app)
            log(f"run log: {records:,} records")
            # The next load for about what is left at the rate records were kept while loading, so that the log
            # holds close to a million runs of the load whichever build is measured (usage reads them all).
            rate = (records - had) / seconds
            seconds = max(2, min(15, math.ceil((LOG_RECORDS - (records - before)) / max(rate, 1.0))))
        count_ms, _ = app.timed("/api/projects/1/endpoints/log-count/run?refresh=direct", args.live_rounds)
        usage, loaded = {}, 0
        for name, query in (("minute", f"interval=minute&since={began}"), ("hour", f"interval=hour&since={began}"),
                            ("all", "interval=hour&since=2000-01-01T00:00:00Z")):
            path = f"/api/projects/1/endpoints/events-by-country/usage?{query}"
            usage[name], answers = app.timed(path, args.live_rounds * 2)
            counted = sum(b["requests"] for b in answers[-1]["buckets"])
            assert counted >= LOG_RECORDS, f"usage by {name} counted {counted:,} runs"
            if name == "minute":
                loaded = counted
        logs_ms, _ = app.timed("/api/projects/1/endpoints/events-by-country/logs?limit=100", args.live_rounds * 2)
        hours = os.path.join(app.data_dir, "projects", "1", "logs")
        files = sum(len(os.listdir(os.path.join(hours, h))) for h in os.listdir(hours))
    finally:
        app.stop()
    return {"on": median_of(on), "off": median_of(off), "records": records, "loaded": loaded,
            "usage_minute_ms": usage["minute"], "usage_hour_ms": usage["hour"], "usage_all_ms": usage["all"],
            "count_ms": count_ms, "logs_ms": logs_ms, "files": files, "logged": records - before}


def logs_section(f):
    ratio = f["on"]["rps"] / f["off"]["rps"]
    lines = [
        f"**Run logs** (scenario 12, {datetime.date.today().isoformat()}; release build, local storage, SQLite; the "
        "cached run of scenario 1 at 64 connections, the server started alternately with and without its run log; "
        "then, on a log emptied of those rounds' records, loaded with a million runs of that endpoint).",
        "",
        "| Measure | Figure | Baseline | Ratio | Target |",
        "|---|---|---|---|---|",
        f"| cached runs with the run log on | {f['on']['rps']:,.0f} req/s (p99 {f['on']['p99']:.2f} ms) | "
        f"with `--no-run-log`: {f['off']['rps']:,.0f} req/s (p99 {f['off']['p99']:.2f} ms) | {ratio:.2f}x | "
        f">= 0.95x: {check(ratio >= 0.95)} |",
        f"| `usage?interval=minute` over the {f['loaded']:,} runs since the load began | "
        f"{f['usage_minute_ms']:.1f} ms | | | < 100 ms: {check(f['usage_minute_ms'] < 100)} |",
        f"| `usage?interval=hour` over the same | {f['usage_hour_ms']:.1f} ms | | | < 100 ms: "
        f"{check(f['usage_hour_ms'] < 100)} |",
        f"| `usage?interval=hour` since 2000 over the whole log ({f['records']:,} records) | "
        f"{f['usage_all_ms']:.1f} ms | | | none (linear in the records read) |",
        f"| `logs?limit=100` (newest first) | {f['logs_ms']:.1f} ms | | | |",
        f"| `SELECT count(*) FROM _logs WHERE endpoint = ...` | {f['count_ms']:.1f} ms | | | |",
        "",
        f"The log's files after the load: {f['files']} (merged by levels per node and hour). How to read it: the "
        "first row is what logging costs the hot path (a record taken into memory per run; written every second, or "
        "sooner when a buffer is half full, off the request's path); the others are what a team's reads of a busy "
        "endpoint's log cost.",
        "",
    ]
    return "\n".join(lines)


def write_logs(args, figures):
    write_section(args, LOGS_MARKER, logs_section(figures))


SHAPES_MARKER = "<!-- scenario 13, written by make bench -->"
# The dimension table the join shape reads: the demo's ten countries, with a region each.
COUNTRIES_CSV = ("code,region,name\nUS,Americas,United States\nGB,Europe,United Kingdom\nDE,Europe,Germany\n"
                 "FR,Europe,France\nIN,Asia,India\nBR,Americas,Brazil\nJP,Asia,Japan\nCA,Americas,Canada\n"
                 "ES,Europe,Spain\nNL,Europe,Netherlands\n")
# Scenario 13: shapes endpoints have, each as an endpoint (name, what it is, SQL, variables as (type, value)).
# DuckDB runs the same SQL with the values written in it as literals.
SHAPES = [
    ("filter-group", "equality on a string column, GROUP BY another",
     "SELECT browser, count(*) AS events, round(sum(revenue), 2) AS revenue FROM events "
     "WHERE country = {variables.country} GROUP BY browser ORDER BY events DESC",
     {"country": ("String", "DE")}),
    ("in-list", "`IN` a `List` variable's three values, GROUP BY",
     "SELECT country, count(*) AS events FROM events WHERE country IN {variables.countries} "
     "GROUP BY country ORDER BY events DESC",
     {"countries": ("List", ["DE", "FR", "JP"])}),
    ("in-literals", "the same `IN` list written in the SQL",
     "SELECT country, count(*) AS events FROM events WHERE country IN ('DE', 'FR', 'JP') "
     "GROUP BY country ORDER BY events DESC", {}),
    ("join-dimension", "join with a 10-row dimension table, GROUP BY its column",
     "SELECT c.region, count(*) AS events, round(sum(e.revenue), 2) AS revenue FROM events e "
     "JOIN countries c ON e.country = c.code WHERE e.event = {variables.event} GROUP BY c.region "
     "ORDER BY events DESC", {"event": ("String", "purchase")}),
    ("daily", "a month's date range, `date_trunc` GROUP BY",
     "SELECT CAST(date_trunc('day', timestamp) AS DATE) AS day, count(*) AS events, round(sum(revenue), 2) AS revenue "
     "FROM events WHERE timestamp >= {variables.since} AND timestamp < {variables.until} GROUP BY 1 ORDER BY 1",
     {"since": ("Date", "2026-02-01"), "until": ("Date", "2026-03-01")}),
    ("point-lookup", "one user's newest events (string key, ORDER BY, LIMIT)",
     "SELECT timestamp, event, country, revenue FROM events WHERE distinct_id = {variables.user} "
     "ORDER BY timestamp DESC LIMIT 20", {"user": ("String", "user_04242")}),
    ("top-n", "top 10 of 50,000 users by revenue (GROUP BY, ORDER BY the sum, LIMIT)",
     "SELECT distinct_id, round(sum(revenue), 2) AS spent FROM events WHERE event = 'purchase' "
     "GROUP BY distinct_id ORDER BY spent DESC, distinct_id LIMIT 10", {}),
    ("prefix", "`LIKE` a prefix, count",
     "SELECT count(*) AS events FROM events WHERE distinct_id LIKE {variables.pattern}",
     {"pattern": ("String", "user_012%")}),
    ("distinct", "`count(DISTINCT)` of users by country",
     "SELECT country, count(DISTINCT distinct_id) AS users FROM events GROUP BY country ORDER BY users DESC, country",
     {}),
    ("scenario-2", "scenario 2's query (a date filter, GROUP BY country)",
     "SELECT country, count(*) AS events, round(sum(revenue), 2) AS revenue FROM events "
     "WHERE timestamp >= {variables.since} GROUP BY country ORDER BY events DESC",
     {"since": ("Date", "2026-03-01")}),
]
# Runs of each shape per batch, and batches (ours and DuckDB's alternate, so a slow spell lands on both).
SHAPE_ROUNDS, SHAPE_BATCHES = 5, 2

# DuckDB's side of scenario 13, in its own process: argv = events files, countries files (DuckDB lists), rounds,
# then the shapes' SQL as JSON; prints each shape's median ms and rows, on the Parquet files (views) and on
# DuckDB's own in-memory tables loaded from the same rows in arrival order (by timestamp: what a user would
# pick instead of files). One connection each, each shape's first run left out.
DUCKDB_SHAPES = """
import duckdb, json, statistics, sys, time
events, countries, rounds, shapes = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
def timed(con):
    out = {}
    for name, sql in shapes.items():
        rows = con.sql(sql).fetchall()
        runs = []
        for _ in range(rounds):
            t = time.perf_counter(); rows = con.sql(sql).fetchall(); runs.append((time.perf_counter() - t) * 1000)
        out[name] = {"runs_ms": runs, "rows": len(rows)}
    return out
files = duckdb.connect()
files.execute(f"CREATE VIEW events AS SELECT * FROM read_parquet({events})")
files.execute(f"CREATE VIEW countries AS SELECT * FROM read_parquet({countries})")
native = duckdb.connect()
native.execute(f"CREATE TABLE events AS SELECT * FROM read_parquet({events}) ORDER BY timestamp")
native.execute(f"CREATE TABLE countries AS SELECT * FROM read_parquet({countries})")
print(json.dumps({"files": timed(files), "native": timed(native)}))
"""


def sql_literal(kind, value):
    """A variable's value as DuckDB reads it in SQL."""
    quote = lambda text: "'" + str(text).replace("'", "''") + "'"
    if kind == "List":
        return "(" + ", ".join(quote(v) for v in value) + ")"
    if kind == "Date":
        return f"DATE {quote(value)}"
    return quote(value) if kind == "String" else str(value)


def shape_path(name, variables, **extra):
    params = {f"variables.{k}": ",".join(v) if kind == "List" else v for k, (kind, v) in variables.items()}
    query = urllib.parse.urlencode({**params, "refresh": "direct", **extra})
    return f"/api/projects/1/endpoints/{name}/run?{query}"


def table_files(data_dir, table):
    """The Parquet files of a table's newest version, as its Delta log names them (its directory also holds files
    of earlier versions once a compaction sorted or merged them, until the vacuum); for a table of a build before
    Delta (round 3, what `--before-bin-dir` may be), those of the version directory its `_current` file names."""
    root = events_dir(data_dir, table)
    log_dir = os.path.join(root, "_delta_log")
    if not os.path.isdir(log_dir):
        with open(os.path.join(root, "_current")) as current:
            version = os.path.join(root, current.readline().strip())
        return sorted(os.path.join(version, f) for f in os.listdir(version) if f.endswith(".parquet"))
    files = set()
    for name in sorted(n for n in os.listdir(log_dir) if re.fullmatch(r"\d{20}\.json", n)):
        with open(os.path.join(log_dir, name)) as commit:
            for line in commit:
                action = json.loads(line)
                if "add" in action:
                    files.add(urllib.parse.unquote(action["add"]["path"]))
                elif "remove" in action:
                    files.discard(urllib.parse.unquote(action["remove"]["path"]))
    return sorted(os.path.join(root, f) for f in files)


def table_glob(data_dir, table):
    """The table's newest files as a DuckDB list literal, for `read_parquet`."""
    return "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in table_files(data_dir, table)) + "]"


def laid_out(app, table):
    """Waits until the table's files all follow the layout compaction chose for its endpoints (the shapes'
    filters sort it), so that runs are measured on the layout users get, not while it is being written."""
    reader = app.cli("key", "create", "--project", "1", "--scope", "table:read")["key"]
    for _ in range(1200):
        record = json.loads(app.request("GET", f"/api/projects/1/tables/{table}", key=reader))
        layout = record.get("layout")
        if layout is None:
            return  # a build before layouts (`--only compare`'s previous one)
        if layout["cluster_by"] and layout["files_clustered"] == record["files"]:
            log(f"{table} sorted by {', '.join(layout['cluster_by'])} in {record['files']} files")
            return
        time.sleep(0.5)
    raise RuntimeError(f"{table} was not laid out: {record}")


def prepare_shapes(app, root):
    """Creates the shapes' endpoints and the `countries` table on a dataset (its server running)."""
    writer = app.cli("key", "create", "--project", "1", "--scope", "table:write")["key"]
    path = os.path.join(root, "countries.csv")
    with open(path, "w") as f:
        f.write(COUNTRIES_CSV)
    upload(app, "countries", path, writer)
    users = os.path.join(root, "users.csv")
    with open(users, "w") as f:
        f.write("id,plan\n" + "".join(f"user_{i:05d},{('free', 'pro', 'team')[i % 3]}\n" for i in range(50_000)))
    upload(app, "users", users, writer)
    for name, _, sql, variables in SHAPES:
        declared = {k: {"type": kind} for k, (kind, _) in variables.items()}
        app.request("POST", "/api/projects/1/endpoints/", {
            "name": name, "cache_age_seconds": 0,
            "query": {"kind": "SQLQuery", "query": sql, "variables": declared}})
    laid_out(app, "events")


def run_shapes(args, app):
    """Scenario 13 on one dataset: each shape's live run (HTTP, `refresh=direct`) against DuckDB on the same
    Parquet files, batches alternating."""
    ours = {name: [] for name, *_ in SHAPES}
    theirs = {name: [] for name, *_ in SHAPES}
    answers, duck_rows = {}, {}
    duck_sql = {}
    for name, _, sql, variables in SHAPES:
        for k, (kind, value) in variables.items():
            sql = sql.replace("{variables." + k + "}", sql_literal(kind, value))
        duck_sql[name] = sql
    for name, _, _, variables in SHAPES:
        app.timed(shape_path(name, variables), 1)  # planned once, as a published endpoint's runs are
    hot_tables_settled(app)
    native = {name: [] for name, *_ in SHAPES}
    for _ in range(SHAPE_BATCHES):
        for name, _, _, variables in SHAPES:
            ms, answered = app.timed(shape_path(name, variables), SHAPE_ROUNDS)
            ours[name].append(ms)
            answers[name] = answered[-1]
        if args.duckdb_python:
            out = subprocess.run(
                [args.duckdb_python, "-c", DUCKDB_SHAPES, table_glob(app.data_dir, "events"),
                 table_glob(app.data_dir, "countries"), str(SHAPE_ROUNDS), json.dumps(duck_sql)],
                check=True, capture_output=True, text=True).stdout
            out = json.loads(out.strip().splitlines()[-1])
            for name, figure in out["files"].items():
                theirs[name] += figure["runs_ms"]
                duck_rows[name] = figure["rows"]
            for name, figure in out["native"].items():
                native[name] += figure["runs_ms"]
                assert figure["rows"] == duck_rows[name], f"{name}: DuckDB's own table gave {figure['rows']} rows"
    figures = {}
    for name, *_ in SHAPES:
        rows = len(answers[name]["results"])
        assert name not in duck_rows or duck_rows[name] == rows, f"{name}: {rows} rows, DuckDB {duck_rows[name]}"
        figures[name] = {"ms": statistics.median(ours[name]), "rows": rows,
                         "query_ms": answers[name]["timings"]["query_ms"],
                         "duckdb_ms": statistics.median(theirs[name]) if theirs[name] else None,
                         "native_ms": statistics.median(native[name]) if native[name] else None}
        log(f"shape {name}: {figures[name]['ms']:.1f} ms, DuckDB {figures[name]['duckdb_ms'] or 0:.1f} ms, "
            f"its own table {figures[name]['native_ms'] or 0:.1f} ms")
    return figures


def hot_tables_settled(app, seconds=120):
    """Waits until the server has decoded the tables the runs read (its `hot_table_decodes` stops changing for
    three seconds); a build without hot tables has no such metric and is not waited for."""
    def decodes():
        with urllib.request.urlopen(app.base + "/metrics", timeout=10) as response:
            found = re.search(r"^endpoints_hot_table_decodes_total (\S+)$", response.read().decode(), re.M)
        return float(found.group(1)) if found else None
    last, since, deadline = decodes(), time.time(), time.time() + seconds
    if last is None:
        return
    while time.time() < deadline and time.time() - since < 3.0:
        time.sleep(0.1)
        now = decodes()
        if now != last:
            last, since = now, time.time()
    log(f"{last:.0f} decodings of table files' columns")


def list_memory(args, app):
    """The `IN` list from a `List` variable against the same list written in the SQL, on a server whose queries
    run in 16 partitions: time and the server's peak RSS of each (servers started afresh, alternately)."""
    figures = {"in-list": {"ms": [], "mb": []}, "in-literals": {"ms": [], "mb": []}}
    variables = dict((name, v) for name, _, _, v in SHAPES)
    for _ in range(SHAPE_BATCHES):
        for name in figures:
            # No table kept decoded: its decoding in the background would be counted as the query's memory.
            app.start("--materialize-workers", "0", "--query-partitions", "16", "--hot-tables-mb", "0")
            try:
                with PeakRss(app.process.pid) as peak:
                    ms, _ = app.timed(shape_path(name, variables[name]), SHAPE_ROUNDS)
                figures[name]["ms"].append(ms)
                figures[name]["mb"].append(peak.peak)
            finally:
                app.stop()
    return {name: {"ms": statistics.median(f["ms"]), "mb": max(f["mb"])} for name, f in figures.items()}


def shapes(args, root, apps):
    """Scenario 13 on each of `apps` (datasets by size): the shape mix, and at the largest the `IN` list's memory."""
    figures = {"sizes": {}}
    for rows, app in sorted(apps.items()):
        app.start("--materialize-workers", "0")
        try:
            prepare_shapes(app, root)
            figures["sizes"][rows] = run_shapes(args, app)
        finally:
            app.stop()
    figures["list_memory"] = list_memory(args, apps[max(apps)])
    figures["largest"] = max(apps)
    return figures


COMPARE_MARKER = "<!-- make bench-compare, written by bench.py --only compare -->"
# Beside scenario 13's shapes: `LIKE` patterns the rewrite takes (many `_`, a short column) and one it leaves.
COMPARE_SHAPES = SHAPES + [
    ("like-fixed", "`LIKE` of text and `_` only", "SELECT count(*) AS events FROM events WHERE distinct_id LIKE "
     "{variables.pattern}", {"pattern": ("String", "_ser_0_2_3")}),
    ("like-short", "`LIKE` on a two-letter column", "SELECT count(*) AS events FROM events WHERE country LIKE "
     "{variables.pattern}", {"pattern": ("String", "_E")}),
    ("like-inner", "`LIKE` with a `%` inside (DataFusion's own)", "SELECT count(*) AS events FROM events WHERE "
     "distinct_id LIKE {variables.pattern}", {"pattern": ("String", "%_01%")}),
    # A dimension too large for the grouping below the join to pay (50,000 users by id): left as written.
    ("join-users", "join with a 50,000-row users table by id, filtered, GROUP BY its column",
     "SELECT u.plan, count(*) AS events FROM events e JOIN users u ON e.distinct_id = u.id "
     "WHERE e.event = 'purchase' GROUP BY u.plan ORDER BY 1", {}),
    # Beside `join-dimension`, whose filter leaves a tenth of the rows: every row meets the dimension.
    ("join-every-row", "join with the 10-row dimension, no filter, GROUP BY its column and a fact column",
     "SELECT c.region, e.event, count(*) AS events, round(sum(e.revenue), 2) AS revenue FROM events e "
     "JOIN countries c ON e.country = c.code GROUP BY c.region, e.event ORDER BY 1, 2", {}),
    # Scans reading three columns or more beside their filter's (rows filtered while decoded from storage).
    ("user-events", "one user's events, every column", "SELECT * FROM events WHERE distinct_id = {variables.user} "
     "ORDER BY timestamp", {"user": ("String", "user_04242")}),
    ("wide-top", "a country's largest purchases, four columns beside the filter's (a hundredth of the rows)",
     "SELECT timestamp, distinct_id, browser, revenue FROM events WHERE country = 'JP' AND event = 'purchase' "
     "ORDER BY revenue DESC, timestamp LIMIT 20", {}),
]
CACHED_COMPARE = "/api/projects/1/endpoints/cached-by-country/run"


def compare(args, root):
    """This build against `--before-bin-dir` on the dataset the earlier build wrote and prepared: each shape's
    live run and a cached run under load, builds alternating batch by batch, the answers compared. Each build
    runs on its own copy, so that a build of a later table format (which converts the tables it starts on, as
    `migrate` does) leaves the earlier build's copy as that build wrote it."""
    app = make_dataset(args.before_bin_dir, root, args.rows)
    server = Endpoints(args.before_bin_dir, app.data_dir)
    server.key = app.key
    server.start("--materialize-workers", "0")
    try:
        prepare_shapes(server, root)
        for name, _, sql, variables in COMPARE_SHAPES[len(SHAPES):]:
            declared = {k: {"type": kind} for k, (kind, _) in variables.items()}
            server.request("POST", "/api/projects/1/endpoints/", {
                "name": name, "cache_age_seconds": 0,
                "query": {"kind": "SQLQuery", "query": sql, "variables": declared}})
        server.request("POST", "/api/projects/1/endpoints/", {
            "name": "cached-by-country", "cache_age_seconds": 3600, "query": {
                "kind": "SQLQuery", "query": "SELECT country, count(*) AS n FROM events GROUP BY country"}})
    finally:
        server.stop()
    builds = {"previous build": args.before_bin_dir, "this build": args.bin_dir}
    data_dirs = {b: f"{app.data_dir}-{b.split()[0]}" for b in builds}
    for data_dir in data_dirs.values():
        shutil.copytree(app.data_dir, data_dir)
    live = {b: {name: [] for name, *_ in COMPARE_SHAPES} for b in builds}
    first = {b: {name: [] for name, *_ in COMPARE_SHAPES} for b in builds}
    cached = {b: [] for b in builds}
    answers = {b: {} for b in builds}
    for _ in range(SHAPE_BATCHES + 1):
        for build, bin_dir in builds.items():
            server = Endpoints(bin_dir, data_dirs[build])
            server.key = app.key
            server.start("--materialize-workers", "0")
            try:
                for name, _, _, variables in COMPARE_SHAPES:
                    # Planned once, as a published endpoint's runs are; the first run after a start, nothing hot.
                    ms, _ = server.timed(shape_path(name, variables), 1)
                    first[build][name].append(ms)
                hot_tables_settled(server)
                for name, _, _, variables in COMPARE_SHAPES:
                    ms, answered = server.timed(shape_path(name, variables), SHAPE_ROUNDS)
                    live[build][name].append(ms)
                    answers[build][name] = answered[-1]["results"]
                server.request("GET", CACHED_COMPARE)
                cached[build].append(wrk(server.base + CACHED_COMPARE, server.key, args.seconds)["rps"])
            finally:
                server.stop()
    for name, *_ in COMPARE_SHAPES:
        assert same_rows(answers["this build"][name], answers["previous build"][name]), f"{name}: answers differ"
    return {"rows": args.rows, "cached": {b: statistics.median(r) for b, r in cached.items()},
            "live": {b: {name: statistics.median(ms) for name, ms in shapes.items()} for b, shapes in live.items()},
            "first": {b: {name: statistics.median(ms) for name, ms in shapes.items()} for b, shapes in first.items()},
            "before": args.before_label or args.before_bin_dir}


def compare_section(f):
    before, this = f["live"]["previous build"], f["live"]["this build"]
    cold_before, cold = f["first"]["previous build"], f["first"]["this build"]
    lines = [
        f"**This build against {f['before']}** (`make bench-compare`, {datetime.date.today().isoformat()}; "
        f"{f['rows']:,} events written by the earlier build; each shape run live over HTTP, medians of "
        f"{(SHAPE_BATCHES + 1) * SHAPE_ROUNDS} runs once a build's tables were hot, and of its "
        f"{SHAPE_BATCHES + 1} first runs after a start (planning included, nothing hot, the earlier shapes' "
        "tables being decoded), the builds alternating batch by batch; the answers equal).",
        "",
        "| Shape | Previous build | This build | Ratio | First run after a start: previous, this | Ratio |",
        "|---|---|---|---|---|---|",
    ]
    for name, what, *_ in COMPARE_SHAPES:
        lines.append(f"| `{name}`: {what} | {before[name]:.1f} ms | {this[name]:.1f} ms | "
                     f"**{this[name] / before[name]:.2f}x** | {cold_before[name]:.1f} ms, {cold[name]:.1f} ms | "
                     f"**{cold[name] / cold_before[name]:.2f}x** |")
    ratios = [this[name] / before[name] for name, *_ in COMPARE_SHAPES]
    cold_ratios = [cold[name] / cold_before[name] for name, *_ in COMPARE_SHAPES]
    lines.append(f"| geometric mean of the shapes | | | **{geomean(ratios):.2f}x** | | **{geomean(cold_ratios):.2f}x** |")
    c = f["cached"]
    lines += [
        f"| a cached run, 64 connections (wrk) | {c['previous build']:,.0f} req/s | {c['this build']:,.0f} req/s | "
        f"**{c['this build'] / c['previous build']:.2f}x** | | |",
        "",
        "A ratio below 1.00x is faster for live runs; for the cached run, above 1.00x is more requests answered.",
        "",
    ]
    return "\n".join(lines)


MEMORY_MARKER = "<!-- make bench-compare's memory, written by bench.py --only compare -->"
MEMORY_ROUNDS = 2
# What the memory comparison reports, in order: its key, and what it is (a sample then, or the peak of a step).
MEMORY_STEPS = [
    ("compacted", "idle, 3 s after the start's compaction sorted the table"),
    ("decoding", "peak: scenario 2's query 10 times while its table is decoded"),
    ("settled", "idle, 3 s after"),
    ("cached", "peak: cached runs under wrk, 64 connections, 15 s (run log on)"),
    ("hot", "peak: the query 20 times hot"),
    ("after", "idle, 5 s after"),
]


def memory(args, root):
    """The server's resident memory through what a node does after its first start on a new dataset (a
    compaction sorting the table for its endpoints, decoding, a cached load, hot runs), this build against
    `--before-bin-dir`: each start on a copy of the dataset as written, builds alternating."""
    # A dataset of its own: the shapes' endpoints of `compare` would choose another layout.
    os.makedirs(os.path.join(root, "memory"), exist_ok=True)
    written = make_dataset(args.before_bin_dir, os.path.join(root, "memory"), args.rows)
    builds = {"previous build": args.before_bin_dir, "this build": args.bin_dir}
    figures = {b: {key: [] for key, _ in MEMORY_STEPS} | {"rps": []} for b in builds}
    for round_ in range(MEMORY_ROUNDS):
        for build, bin_dir in builds.items():
            data_dir = os.path.join(root, f"memory-{round_}-{build.split()[0]}")
            shutil.copytree(written.data_dir, data_dir)
            server = Endpoints(bin_dir, data_dir)
            server.key = written.key
            server.start("--materialize-workers", "0")
            f, pid = figures[build], server.process.pid
            try:
                laid_out(server, "events")
                time.sleep(3)
                f["compacted"].append(rss_kb(pid) / 1024)
                with PeakRss(pid) as peak:
                    server.timed(LIVE_PATH + "&refresh=direct", 10)
                f["decoding"].append(peak.peak)
                hot_tables_settled(server)
                time.sleep(3)
                f["settled"].append(rss_kb(pid) / 1024)
                with PeakRss(pid) as peak:
                    f["rps"].append(wrk(server.base + LIVE_PATH, server.key, 15)["rps"])
                f["cached"].append(peak.peak)
                with PeakRss(pid) as peak:
                    server.timed(LIVE_PATH + "&refresh=direct", 20)
                f["hot"].append(peak.peak)
                time.sleep(5)
                f["after"].append(rss_kb(pid) / 1024)
            finally:
                server.stop()
            shutil.rmtree(data_dir, ignore_errors=True)
            log(f"memory, {build}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in f.items()))
    return {"rows": args.rows, "before": args.before_label or args.before_bin_dir,
            "builds": {b: {k: statistics.median(v) for k, v in f.items()} for b, f in figures.items()}}


def memory_section(f):
    before, this = f["builds"]["previous build"], f["builds"]["this build"]
    lines = [
        f"**Memory, this build against {f['before']}** (`make bench-compare`, {datetime.date.today().isoformat()}; "
        f"the server's resident memory, peaks sampled every 50 ms, medians of {MEMORY_ROUNDS} starts per build "
        f"alternating, each on a copy of {f['rows']:,} events as the earlier build wrote them, so each start "
        "compacts the table first, as a node does after appends).",
        "",
        "| Step | Previous build | This build | Ratio |",
        "|---|---|---|---|",
    ]
    for key, what in MEMORY_STEPS:
        lines.append(f"| {what} | {before[key]:.0f} MB | {this[key]:.0f} MB | **{this[key] / before[key]:.2f}x** |")
    lines += [
        f"| cached runs answered | {before['rps']:,.0f} req/s | {this['rps']:,.0f} req/s | "
        f"**{this['rps'] / before['rps']:.2f}x** |",
        "",
    ]
    return "\n".join(lines)


def geomean(values):
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def shapes_section(f):
    sizes = sorted(f["sizes"])
    lines = [
        f"**Query shapes** (scenario 13, {datetime.date.today().isoformat()}; release build, local storage; "
        "each shape an endpoint run live over HTTP (`refresh=direct`, planned once before, its tables decoded "
        "once the server had them hot), against DuckDB in process with the same SQL, values written as literals: "
        "on the same Parquet files, and on its own in-memory tables loaded from the same rows in arrival "
        f"order; medians of {SHAPE_BATCHES * SHAPE_ROUNDS} runs, batches alternating).",
        "",
        "| Shape | " + " | ".join(f"{n:,} events: ours; / DuckDB files; / DuckDB's table" for n in sizes)
        + " | Target: files <= 1.1x, table <= 1.5x |",
        "|---|" + "---|" * len(sizes) + "---|",
    ]
    ratio = lambda s, theirs: s["ms"] / s[theirs] if s.get(theirs) else None
    for name, what, *_ in SHAPES:
        cells, met = [], True
        for n in sizes:
            s = f["sizes"][n][name]
            files, table = ratio(s, "duckdb_ms"), ratio(s, "native_ms")
            met = met and files is not None and files <= 1.1 and table is not None and table <= 1.5
            cells.append(f"{s['ms']:.1f} ms; **{files or 0:.2f}x**; **{table or 0:.2f}x**")
        lines.append(f"| `{name}`: {what} | " + " | ".join(cells) + f" | {check(met)} |")
    means = {}
    for theirs in ("duckdb_ms", "native_ms"):
        means[theirs] = [geomean([ratio(f["sizes"][n][name], theirs) for name, *_ in SHAPES
                                  if f["sizes"][n][name].get(theirs)]) for n in sizes]
    cells = [f"**{a or 0:.2f}x**; **{b or 0:.2f}x**" for a, b in zip(means["duckdb_ms"], means["native_ms"])]
    met = all(a is not None and a <= 0.8 for a in means["duckdb_ms"]) and \
        all(b is not None and b <= 1.0 for b in means["native_ms"])
    lines.append("| geometric mean | " + " | ".join(cells) + f" | files <= 0.8x, table <= 1.0x: {check(met)} |")
    literal = f["sizes"][f["largest"]]["in-literals"]["ms"]
    listed = f["sizes"][f["largest"]]["in-list"]["ms"]
    m = f["list_memory"]
    lines += [
        "",
        "| `IN` from a `List` variable against the literals | Time | Server peak RSS | Target |",
        "|---|---|---|---|",
        f"| {f['largest']:,} events, default partitions | {listed:.1f} ms against {literal:.1f} ms = "
        f"{listed / literal:.2f}x | | <= 1.1x: {check(listed / literal <= 1.1)} |",
        f"| {f['largest']:,} events, `--query-partitions 16` | {m['in-list']['ms']:.1f} ms against "
        f"{m['in-literals']['ms']:.1f} ms = {m['in-list']['ms'] / m['in-literals']['ms']:.2f}x | "
        f"{m['in-list']['mb']:.0f} MB against {m['in-literals']['mb']:.0f} MB | no more memory: "
        f"{check(m['in-list']['mb'] <= m['in-literals']['mb'] * 1.05 + 5)} |",
        "",
        "How to read it: our side is a client's whole run (HTTP, binding the variables, planning the physical plan, "
        "JSON); DuckDB's is `fetchall()` on a warm connection. The geometric mean is over every shape of a size. "
        "\"No more memory\" allows 5% + 5 MB of the peak RSS for its 50 ms sampling; the engine test compares the two "
        "forms' physical plans exactly.",
        "",
    ]
    return "\n".join(lines)


def write_shapes(args, figures):
    write_section(args, SHAPES_MARKER, shapes_section(figures))


def machine():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    with open("/proc/meminfo") as f:
        total_kb = int(f.readline().split()[1])
    return f"{os.cpu_count()} cores ({model}), {total_kb / 1024 / 1024:.0f} GiB, {platform.system()} {platform.release()}"


def same_rows(a, b, tolerance=1e-9):
    """Rows equal, floats to a relative tolerance: a rollup adds partial sums in another order."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= tolerance * max(abs(a), abs(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_rows(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_rows(a[k], b[k]) for k in a)
    return a == b


def core(args, root):
    """Scenarios 1 to 5 and 8 on `args.bin_dir` alone, without their baselines, on `--rows` events of its own:
    what `--only beside` compares two builds by. In `make bench`'s order: cached runs (64 and 256 connections, a
    connection per request, a run token), live runs, data in and out, materialized runs, cached runs with more
    endpoints in the store, then create/get/list on a fresh SQLite store; memory along the way."""
    data = make_dataset(args.bin_dir, root, args.rows)
    figures = {}
    app = data.start("--materialize-workers", "0")
    try:
        time.sleep(2)
        figures["idle_mb"] = rss_kb(app.process.pid) / 1024
        # Resident memory counts the binary's pages it maps, as many as the page cache holds: the memory the
        # process allocated is apart.
        figures["idle_anon_mb"] = rss_kb(app.process.pid, "RssAnon") / 1024
        url = app.base + LIVE_PATH
        app.request("GET", LIVE_PATH)
        with PeakRss(app.process.pid) as peak:
            figures["cached"] = wrk_rounds(url, app.key, args.seconds, args.rounds)
        figures["cached_mb"] = peak.peak
        figures["c256"] = wrk_rounds(url, app.key, args.seconds, args.rounds, connections=256)
        figures["close"] = wrk_rounds(url, app.key, args.seconds, args.rounds, close=True)
        figures["token"] = wrk_rounds(url, run_token(app), args.seconds, args.rounds)
        app.timed(LIVE_PATH + "&refresh=direct", 1)
        with PeakRss(app.process.pid) as peak:
            figures["live_ms"], _ = app.timed(LIVE_PATH + "&refresh=direct", args.live_rounds * LIVE_BATCHES)
        figures["live_mb"] = peak.peak
        log(f"cached {figures['cached']['rps']:.0f} req/s, live {figures['live_ms']:.1f} ms")
    finally:
        app.stop()
    figures["io"] = data_in_and_out(args, data, root, events_dir(data.data_dir))
    data.start()
    try:
        figures.update(materialized_runs(args, data))
    finally:
        data.stop()
    figures["by_count"] = by_endpoint_count(args, data)
    figures["crud"], _ = crud_on(args, root, "SQLite")
    return figures


def alone(args, root, scenario):
    """The figures of scenarios 1-5 and 8 (`core`), 10, 11 or 12 (`appends`, `fresh`, `logs`) run alone on
    `args.bin_dir`, on a data directory of its own under `root`."""
    if scenario == "core":
        return core(args, root)
    if scenario == "appends":
        return appends(args, root)
    app = make_dataset(args.bin_dir, root, args.rows)
    if scenario == "logs":
        return run_logs(args, app)
    writer = app.cli("key", "create", "--project", "1", "--scope", "table:write")["key"]
    app.start()
    try:
        return fresh(args, app, writer)
    finally:
        app.stop()


BESIDE_MARKER = "<!-- scenarios beside an earlier build, written by bench.py --only beside -->"
# Each scenario's headline figures: what it is, how to read it from the scenario's figures, and whether more is
# better (requests or rows a second), less (times, memory), or neither (`None`: what was measured over, as the
# runs a read counted, to read the figures around it by).
BESIDE_FIGURES = {
    "core": [
        ("1: cached runs, 64 connections", lambda f: f["cached"]["rps"], "req/s", True),
        ("1: the same, p99", lambda f: f["cached"]["p99"], "ms", False),
        ("1b: cached runs, 256 connections", lambda f: f["c256"]["rps"], "req/s", True),
        ("1c: cached runs, a connection per request", lambda f: f["close"]["rps"], "req/s", True),
        ("1d: cached runs with a run token", lambda f: f["token"]["rps"], "req/s", True),
        ("2: the live run (a GROUP BY over the events)", lambda f: f["live_ms"], "ms", False),
        ("3: `country-daily`'s materialized run", lambda f: f["materialized_ms"], "ms", False),
        ("3: its live run", lambda f: f["materialized_live_ms"], "ms", False),
        ("3: the rollup's materialized run", lambda f: f["rollup_ms"], "ms", False),
        ("4: cached runs with 1,000 endpoints in the store", lambda f: f["by_count"][1000]["rps"], "req/s", True),
        ("4: cached runs with 100,000 endpoints", lambda f: f["by_count"][100_000]["rps"], "req/s", True),
        *[(f"4: {what}s on SQLite (wrk)", lambda f, w=what: f["crud"][w]["rps"], "/s", True)
          for what in ("create", "get", "list")],
        ("5: RSS at rest after start", lambda f: f["idle_mb"], "MB", False),
        ("5: of which allocated (`RssAnon`, the rest the binary's mapped pages)", lambda f: f["idle_anon_mb"], "MB",
         False),
        ("5: peak RSS under the cached load", lambda f: f["cached_mb"], "MB", False),
        ("5: peak RSS during live runs", lambda f: f["live_mb"], "MB", False),
        ("5: peak RSS during materialized runs", lambda f: f["materialized_mb"], "MB", False),
        ("8: an upload of the events as CSV", lambda f: f["io"]["upload_ms"], "ms", False),
        ("8: peak RSS during the upload", lambda f: f["io"]["upload_mb"], "MB", False),
        *[(f"8: an export of 1,000,000 rows as {fmt}", lambda f, x=fmt: f["io"]["exports"][x]["ms"], "ms", False)
          for fmt in EXPORT_FORMATS],
        *[(f"8: peak RSS during the {fmt} export", lambda f, x=fmt: f["io"]["exports"][x]["peak_mb"], "MB", False)
          for fmt in EXPORT_FORMATS],
    ],
    "isolation": [
        ("9: another project's small live query alone, p95", lambda f: f["idle_p95"], "ms", False),
        *[(f"9: the same beside one project's four runs of {kind}, p95", lambda f, k=kind: f["heavy"][k]["p95"],
           "ms", False) for kind in HEAVY_PLANS],
        ("9: a valid key's cached runs (wrk, 16 connections)", lambda f: f["quiet"]["rps"], "req/s", True),
        ("9: the same during a flood of made-up keys, p99", lambda f: f["flooded"]["p99"], "ms", False),
        ("9: peak RSS under the memory-bomb corpus", lambda f: f["bomb_peak_mb"], "MB", False),
    ],
    "appends": [
        ("10: 5-row appends, 1 connection", lambda f: f["one"]["rps"], "/s", True),
        ("10: 5-row appends, 16 connections", lambda f: f["sixteen"]["rps"], "/s", True),
        ("10: 5-row appends, a project with 5,000 more endpoints, p50", lambda f: f["one_many"]["p50"], "ms", False),
        ("10: 500-row appends, 16 connections", lambda f: f["batch_rows_per_s"], "rows/s", True),
        ("10: a live GROUP BY after the stream and compaction", lambda f: f["streamed_ms"], "ms", False),
    ],
    "fresh": [
        ("11: the rollup's full refresh", lambda f: f["full_ms"], "ms", False),
        ("11: a fold of one 1,000-row append", lambda f: f["fold_ms"], "ms", False),
        ("11: the rollup's materialized run while rows stream in", lambda f: f["rollup_mat_ms"], "ms", False),
        ("11: `country-daily`'s materialized run meanwhile", lambda f: f["rows_mat_ms"], "ms", False),
        ("11: the rollup's live run meanwhile", lambda f: f["rollup_live_ms"], "ms", False),
    ],
    "logs": [
        ("12: cached runs with the run log on (64 connections)", lambda f: f["on"]["rps"], "req/s", True),
        ("12: `usage?interval=minute` over a million runs", lambda f: f["usage_minute_ms"], "ms", False),
        ("12: `usage?interval=hour` over the same", lambda f: f["usage_hour_ms"], "ms", False),
        ("12: `logs?limit=100`", lambda f: f["logs_ms"], "ms", False),
        ("12: `SELECT count(*) FROM _logs WHERE endpoint = ...`", lambda f: f["count_ms"], "ms", False),
        ("12: runs the `usage` rows counted", lambda f: f["loaded"], "runs", None),
        ("12: `usage?interval=minute` per million runs counted", lambda f: f["usage_minute_ms"] * 1e6 / f["loaded"],
         "ms", False),
        ("12: `SELECT count(*)` per million records the load added", lambda f: f["count_ms"] * 1e6 / f["logged"],
         "ms", False),
    ],
}


def beside_scenarios(text):
    """`--beside`'s comma-separated scenarios, each one of `BESIDE_FIGURES`."""
    chosen = text.split(",")
    unknown = [scenario for scenario in chosen if scenario not in BESIDE_FIGURES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown scenario {', '.join(unknown)}; of {', '.join(BESIDE_FIGURES)}")
    return chosen


def beside(args, root):
    """The scenarios of `--beside` on `--before-bin-dir` and on this build, one after the other per scenario (the
    earlier build first), each build on data directories it wrote itself under `--rows` events: their headline
    figures."""
    builds = {"previous build": args.before_bin_dir, "this build": args.bin_dir}
    chosen = [scenario for scenario in BESIDE_FIGURES if scenario in args.beside]
    figures = {scenario: {} for scenario in chosen}
    for scenario in chosen:
        for build, bin_dir in builds.items():
            own = os.path.join(root, f"{scenario}-{build.split()[0]}")
            os.makedirs(own)
            measured = argparse.Namespace(**{**vars(args), "bin_dir": bin_dir})
            try:
                f = isolation(measured, own) if scenario == "isolation" else alone(measured, own, scenario)
                figures[scenario][build] = {what: read(f) for what, read, _, _ in BESIDE_FIGURES[scenario]}
            except Exception as error:  # an earlier build may lack what a step asks for: said in the table
                log(f"{scenario} on the {build}: {error!r}")
                figures[scenario][build] = {"error": str(error).splitlines()[0][:120] if str(error) else repr(error)}
            shutil.rmtree(own, ignore_errors=True)
    return {"rows": args.rows, "before": args.before_label or args.before_bin_dir, "figures": figures}


def beside_section(f):
    # Each measure's label begins with its scenario's number (and a letter for a variant of it).
    numbers = [re.match(r"\d+", what).group() for scenario in f["figures"] for what, *_ in BESIDE_FIGURES[scenario]]
    run = ", ".join(dict.fromkeys(numbers))
    lines = [
        f"**Scenarios {run}, this build against {f['before']}** (`bench.py --only beside`, "
        f"{datetime.date.today().isoformat()}; release builds, each scenario run on the earlier build and then on "
        f"this one, each on data it wrote itself ({f['rows']:,} events for 1-5, 8, 11 and 12); one run of each, so a "
        "ratio within about 0.8-1.2x is this machine's noise).",
        "",
        "| Measure | Previous build | This build | Ratio | Better |",
        "|---|---|---|---|---|",
    ]
    for scenario, measures in BESIDE_FIGURES.items():
        if scenario not in f["figures"]:
            continue
        before, this = f["figures"][scenario]["previous build"], f["figures"][scenario]["this build"]
        for what, _, unit, more_is_better in measures:
            space = "" if unit.startswith("/") else " "
            digits = 0 if more_is_better is None else 1
            figure = lambda value: "-" if value is None else f"{value:,.{digits}f}{space}{unit}"
            if what not in before or what not in this:
                error = before.get("error") or this.get("error")
                lines.append(f"| {what} | {figure(before.get(what))} | {figure(this.get(what))} | | "
                             f"not measured: {error} |")
                continue
            ratio = this[what] / before[what] if before[what] else float("nan")
            better = "(what was measured over)" if more_is_better is None else "neither (noise)" \
                if 0.8 <= ratio <= 1.2 else "this build" if (ratio > 1) == more_is_better else "previous build"
            lines.append(f"| {what} | {figure(before[what])} | {figure(this[what])} | **{ratio:.2f}x** | {better} |")
    lines += ["", "Each ratio is this build's figure over the previous build's: below 1.00x is less (faster for "
              "times, smaller for memory), above is more (more requests or rows a second).", ""]
    return "\n".join(lines)


def check(ok):
    return "met" if ok else "**missed**"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", default="target/release")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--seconds", type=int, default=5, help="length of each wrk round")
    parser.add_argument("--rounds", type=int, default=3, help="wrk rounds per figure (the median is reported)")
    parser.add_argument("--live-rounds", type=int, default=5)
    parser.add_argument("--postgres-url", default=os.environ.get("BENCH_POSTGRES_URL"))
    parser.add_argument("--duckdb-python", default=None)
    parser.add_argument("--out", default="docs/benchmarks.md")
    parser.add_argument("--beside-out", default="docs/benchmark-beside.md",
                        help="the page of this build beside an earlier one (--only compare and --only beside)")
    parser.add_argument("--scenarios-out", default="docs/benchmark-scenarios.md",
                        help="the page of the scenarios with sections of their own (6 alone, 9-14)")
    parser.add_argument("--only", choices=["isolation", "appends", "fresh", "logs", "shapes", "commits", "nodes", "compare",
                                           "beside"],
                        default=None)
    parser.add_argument("--before-bin-dir", default=None,
                        help="with --only nodes, compare or beside: a previous build, measured beside this one in the same run")
    # Scenario 9 is not run by default: on a build before this round's isolation (a1114f9), another project's
    # small queries beside four heavy ones did not end within minutes.
    parser.add_argument("--beside", type=beside_scenarios, default=["core", "appends", "fresh", "logs"],
                        help="with --only beside: the scenarios to run, of " + ",".join(BESIDE_FIGURES)
                        + " (default: all but isolation)")
    parser.add_argument("--before-postgres-url", default=None, help="its own database for --before-bin-dir")
    parser.add_argument("--before-label", default=None, help="what --before-bin-dir was built from (a commit)")
    parser.add_argument("--node-rounds", type=int, default=4, help="rounds per build of scenario 6 alone")
    parser.add_argument("--commits", type=int, default=100_000, help="commits to one table in scenario 14")
    args = parser.parse_args()
    if args.only in ("compare", "beside") and not args.before_bin_dir:
        parser.error(f"--only {args.only} measures against --before-bin-dir")
    began = time.perf_counter()
    root = tempfile.mkdtemp(prefix="endpoints-bench-", dir=os.path.abspath("target"))
    if args.only:
        try:
            if args.only == "isolation":
                write_isolation(args, isolation(args, root))
            elif args.only == "shapes":
                small = max(args.rows // 10, 1000)
                write_shapes(args, shapes(args, root, {n: make_dataset(args.bin_dir, root, n)
                                                       for n in sorted({small, args.rows})}))
            elif args.only == "commits":
                write_commits(args, commits(args, root))
            elif args.only == "compare":
                write_section(args, COMPARE_MARKER, compare_section(compare(args, root)), args.beside_out)
                write_section(args, MEMORY_MARKER, memory_section(memory(args, root)), args.beside_out)
            elif args.only == "nodes":
                write_nodes(args, nodes_alone(args, root))
            elif args.only == "beside":
                write_section(args, BESIDE_MARKER, beside_section(beside(args, root)), args.beside_out)
            else:
                writer = {"logs": write_logs, "fresh": write_fresh, "appends": write_appends}[args.only]
                writer(args, alone(args, root, args.only))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    rows = sorted({max(args.rows // 10, 1000), max(args.rows // 2, 1000), args.rows})
    figures = {}
    try:
        # Datasets, largest last (the main one).
        apps = {n: make_dataset(args.bin_dir, root, n) for n in rows}
        main_app = apps[args.rows]

        # Scaling of the live run with table size.
        # Refreshes are measured on their own (scenario 3), so the worker is off everywhere else.
        quiet = ("--materialize-workers", "0")
        scaling, duckdb_by_size = {}, {}
        for n in rows:
            app = apps[n].start(*quiet)
            app.timed(LIVE_PATH + "&refresh=direct", 1)
            scaling[n], _ = app.timed(LIVE_PATH + "&refresh=direct", args.live_rounds)
            app.stop()
            if args.duckdb_python:
                files = os.path.join(events_dir(apps[n].data_dir), "*.parquet")
                duckdb_by_size[n] = duckdb_median(args.duckdb_python, files, args.live_rounds)["median_ms"]
            log(f"live run over {n:,} rows: {scaling[n]:.1f} ms, DuckDB {duckdb_by_size.get(n, 0):.1f} ms")
        figures["scaling"], figures["duckdb_by_size"] = scaling, duckdb_by_size
        if args.duckdb_python:
            figures["duckdb_version"] = subprocess.run(
                [args.duckdb_python, "-c", "import duckdb; print(duckdb.__version__)"],
                check=True, capture_output=True, text=True).stdout.strip()

        app = main_app.start(*quiet)
        time.sleep(2)
        figures["idle_mb"] = rss_kb(app.process.pid) / 1024

        # 1. Cached run against the minimal actix-web server.
        url = app.base + LIVE_PATH
        body = app.request("GET", LIVE_PATH)
        with PeakRss(app.process.pid) as peak:
            cached = wrk_rounds(url, app.key, args.seconds, args.rounds)
        figures["cached"], figures["cached_mb"] = cached, peak.peak
        body_file = os.path.join(root, "body.json")
        with open(body_file, "wb") as f:
            f.write(body)
        port = free_port()
        baseline = subprocess.Popen([os.path.join(args.bin_dir, "bench-baseline"), f"127.0.0.1:{port}", body_file,
                                     str(os.cpu_count())])
        time.sleep(1)
        try:
            baseline_url = f"http://127.0.0.1:{port}{LIVE_PATH}"
            figures["baseline"] = wrk_rounds(baseline_url, app.key, args.seconds, args.rounds)
            # Less friendly loads: many connections, and a new connection per request.
            for name, kwargs in (("c256", {"connections": 256}), ("close", {"close": True})):
                figures[f"cached_{name}"] = wrk_rounds(url, app.key, args.seconds, args.rounds, **kwargs)
                figures[f"baseline_{name}"] = wrk_rounds(baseline_url, app.key, args.seconds, args.rounds, **kwargs)
        finally:
            baseline.terminate()
            baseline.wait()
        log(f"cached: {cached['rps']:.0f} req/s against {figures['baseline']['rps']:.0f}")

        # 1d. The same cached run with a run token instead of the key, measured back to back with the key again.
        figures["token"] = wrk_rounds(url, run_token(app), args.seconds, args.rounds)
        figures["token_key"] = wrk_rounds(url, app.key, args.seconds, args.rounds)
        log(f"cached with a run token: {figures['token']['rps']:.0f} req/s, with the key {figures['token_key']['rps']:.0f}")

        # 2. Live run against bare DataFusion and DuckDB. The two alternate, batch by batch, so a slow spell of
        # this shared machine lands on both rather than on one side of the ratio.
        app.timed(LIVE_PATH + "&refresh=direct", 1)
        table_dir = events_dir(main_app.data_dir)
        live_runs, bare_runs, live_mb, bare_kb = [], [], 0, 0
        for _ in range(LIVE_BATCHES):
            with PeakRss(app.process.pid) as peak:
                for _ in range(args.live_rounds):
                    batch_ms, answers = app.timed(LIVE_PATH + "&refresh=direct", 1)
                    live_runs.append(batch_ms)
            live_mb = max(live_mb, peak.peak)
            bare = json.loads(subprocess.run(
                [os.path.join(args.bin_dir, "bench-datafusion"), table_dir, LIVE_SQL, str(args.live_rounds + 1),
                 "512"], check=True, capture_output=True, text=True).stdout)
            bare_runs += bare["runs_ms"][1:]  # its first round warms its session, as the service's was above
            bare_kb = max(bare_kb, bare["peak_rss_kb"])
        live_ms = statistics.median(live_runs)
        figures["live_ms"], figures["live_mb"] = live_ms, live_mb
        figures["bare"] = {**bare, "median_ms": statistics.median(bare_runs), "peak_rss_kb": bare_kb}
        assert bare["rows"] == len(answers[0]["results"]), "the baseline answers a different query"
        log(f"live: {live_ms:.1f} ms against bare DataFusion {figures['bare']['median_ms']:.1f} ms")

        # 7. The same live run on a Ballista cluster of two executors.
        if has_ballista(args.bin_dir):
            app.stop()
            ballista_ms, on_cluster = ballista_live(args.bin_dir, app, args.live_rounds)
            assert on_cluster[0]["results"] == answers[0]["results"], "Ballista answers differently"
            figures["ballista_ms"] = ballista_ms
            log(f"live on Ballista (2 executors): {ballista_ms:.1f} ms against embedded {live_ms:.1f} ms")

        # 13. Query shapes against DuckDB, while the events tables are as generated (scenario 11 appends).
        app.stop()
        shaped = shapes(args, root, {n: apps[n] for n in (min(rows), max(rows))})

        # 8. Data in and out, on the main dataset's events table.
        figures["io"] = data_in_and_out(args, main_app, root, table_dir)

        # 3. Materialized against live.
        app.start()
        figures.update(materialized_runs(args, app))

        # 11. Fresh materializations (it appends to the events table: after every scenario that reads it but 4).
        writer = main_app.cli("key", "create", "--project", "1", "--scope", "table:write")["key"]
        fresh_figures = fresh(args, app, writer)

        # 4. Cached-run throughput by number of endpoints in the store.
        app.stop()
        figures["by_count"] = by_endpoint_count(args, main_app)

        # CRUD throughput on SQLite and PostgreSQL.
        backends = {"SQLite": None, **({"PostgreSQL": args.postgres_url} if args.postgres_url else {})}
        figures["crud"] = {}
        for name, database_url in backends.items():
            figures["crud"][name], crud_app = crud_on(args, root, name, database_url)
            if name == "PostgreSQL":
                figures["nodes"] = cached_by_nodes(args.bin_dir, crud_app.data_dir, args.postgres_url, crud_app.key,
                                                   args.seconds, args.rounds)
        isolated = isolation(args, root)
        streamed = appends(args, root)
        committed = commits(args, root)
        logged = run_logs(args, main_app)
    finally:
        for app in locals().get("apps", {}).values():
            app.stop()
        shutil.rmtree(root, ignore_errors=True)
    figures["seconds"] = time.perf_counter() - began
    write_report(args, figures)
    write_isolation(args, isolated)
    write_appends(args, streamed)
    write_commits(args, committed)
    write_fresh(args, fresh_figures)
    write_logs(args, logged)
    write_shapes(args, shaped)


def write_report(args, f):
    cached, base = f["cached"], f["baseline"]
    ratio = cached["rps"] / base["rps"]
    live_ratio = f["live_ms"] / f["bare"]["median_ms"]
    mat_speedup = f["materialized_live_ms"] / f["materialized_ms"]
    rollup_speedup = f["rollup_live_ms"] / f["rollup_ms"]
    mem_ratio = f["live_mb"] / (f["bare"]["peak_rss_kb"] / 1024)
    rows = sorted(f["scaling"])
    smallest = rows[0]
    lines = [
        f"## {datetime.date.today().isoformat()}: {args.rows:,} events",
        "",
        f"Machine: {machine()}. Command: `make bench` (`tests/bench/bench.py --rows {args.rows} --seconds {args.seconds} "
        f"--rounds {args.rounds}`), release build, server and load generator on loopback. Every figure is the median "
        f"of its rounds; the whole run took {f['seconds'] / 60:.1f} minutes.",
        "",
        "| Scenario | Service | Baseline | Ratio | Target |",
        "|---|---|---|---|---|",
        f"| 1. cached run, 64 connections (wrk) | {cached['rps']:,.0f} req/s, p50 {cached['p50']:.2f} ms, p99 {cached['p99']:.2f} ms "
        f"| minimal actix-web, same bytes: {base['rps']:,.0f} req/s, p50 {base['p50']:.2f} ms, p99 {base['p99']:.2f} ms "
        f"| {ratio:.2f}x throughput | >= 0.8x and p99 < 5 ms: {check(ratio >= 0.8 and cached['p99'] < 5)} |",
    ]
    for name, label in (("c256", "1b. cached run, 256 connections"), ("close", "1c. cached run, keep-alive off (a connection per request)")):
        if f"cached_{name}" in f:
            c, b = f[f"cached_{name}"], f[f"baseline_{name}"]
            lines.append(f"| {label} | {c['rps']:,.0f} req/s, p99 {c['p99']:.2f} ms | the same: {b['rps']:,.0f} req/s, "
                         f"p99 {b['p99']:.2f} ms | {c['rps'] / b['rps']:.2f}x throughput | none (the less friendly cases) |")
    if "token" in f:
        t, k = f["token"], f["token_key"]
        lines.append(f"| 1d. cached run with a run token (HS256 JWT) | {t['rps']:,.0f} req/s, p99 {t['p99']:.2f} ms "
                     f"| the same run with the key, right after: {k['rps']:,.0f} req/s, p99 {k['p99']:.2f} ms "
                     f"| {t['rps'] / k['rps']:.2f}x throughput | >= 0.95x: {check(t['rps'] / k['rps'] >= 0.95)} |")
    lines.append(
        f"| 2. live run, `refresh=direct`, GROUP BY over {args.rows:,} rows | {f['live_ms']:.1f} ms "
        f"| bare DataFusion, same SQL and settings: {f['bare']['median_ms']:.1f} ms | {live_ratio:.2f}x time "
        f"| <= 1.10x: {check(live_ratio <= 1.10)} |")
    for n, duck in sorted(f.get("duckdb_by_size", {}).items()):
        if n in (min(f["scaling"]), args.rows):
            live = f["scaling"][n]
            lines.append(f"| 2b. the same live run over {n:,} rows, against DuckDB {f.get('duckdb_version', '')} in process, "
                         f"same SQL and files (our side includes HTTP) | {live:.1f} ms | DuckDB: {duck:.1f} ms "
                         f"| {live / duck:.2f}x time | <= 1.0x: {check(live / duck <= 1.0)} |")
    lines += [
        f"| 3. materialized run (`country-daily`, cache off) | {f['materialized_ms']:.2f} ms | the same run live: "
        f"{f['materialized_live_ms']:.1f} ms | {mat_speedup:.1f}x faster | >= 50x: {check(mat_speedup >= 50)} |",
        f"| 3b. materialized rollup (`events-by-country`: {f['rollup_rows']:,} rows by country and day, cache off) | "
        f"{f['rollup_ms']:.2f} ms | the same run live: {f['rollup_live_ms']:.1f} ms | {rollup_speedup:.1f}x faster | "
        f">= 20x: {check(rollup_speedup >= 20)} |",
        "",
        "**Scaling.**",
        "",
        "| Events | Live run | Time per row against the smallest |",
        "|---|---|---|",
    ]
    for n in rows:
        per_row = (f["scaling"][n] / n) / (f["scaling"][smallest] / smallest)
        lines.append(f"| {n:,} | {f['scaling'][n]:.1f} ms | {per_row:.2f}x |")
    lines += ["", "| Endpoints in the store | Cached run | Against the demo's 4 |", "|---|---|---|",
              f"| 4 (demo) | {cached['rps']:,.0f} req/s, p99 {cached['p99']:.2f} ms | 1.00x |"]
    for total, r in f["by_count"].items():
        lines.append(f"| {total:,} | {r['rps']:,.0f} req/s, p99 {r['p99']:.2f} ms | {r['rps'] / cached['rps']:.2f}x |")
    lines += ["", f"| Backend | Create ({CREATE_CONNECTIONS} connections: a project's query slots) | Get | List (100) |",
              "|---|---|---|---|"]
    for name, r in f["crud"].items():
        lines.append(f"| {name} | " + " | ".join(f"{r[k]['rps']:,.0f} req/s (p99 {r[k]['p99']:.1f} ms)"
                                                    for k in ("create", "get", "list")) + " |")
    if "ballista_ms" in f:
        lines += ["", f"**The distributed engine** (scenario 2's live run; Ballista: `endpoints cluster --executors 2`, "
                  f"one slot per core each, on this same {os.cpu_count()}-core machine).", "",
                  "| Engine | Live run | Against embedded |", "|---|---|---|",
                  f"| embedded DataFusion | {f['live_ms']:.1f} ms | 1.00x |",
                  f"| Ballista, 2 executors | {f['ballista_ms']:.1f} ms | {f['ballista_ms'] / f['live_ms']:.2f}x time |"]
    if "nodes" in f:
        one = f["nodes"][1]["rps"]
        lines += ["", f"**Several nodes on one PostgreSQL** (cached run; one wrk per node, 64 connections split between "
                  f"them; each node's workers are the {os.cpu_count()} cores split between the nodes, all on this one "
                  "machine). A write is a PATCH of the endpoint's description through the first node, "
                  f"{WRITES} in a row, each answered once every other node applied it (read your writes on every "
                  "node); with one node there is no other to wait for. A table append is 5 CSV rows through the "
                  "first node, answered once every other node heard of it; the live run is a `GROUP BY` over that "
                  "table on the last node (uncached), which reads the table's version it keeps without asking the "
                  "storage.", "",
                  "| Nodes | Cached run | Against one node | A write through the first node | A table append | "
                  "A live run over it on the last node |", "|---|---|---|---|---|---|"]
        for count, r in f["nodes"].items():
            w = r.get("write", {"p50": 0, "p99": 0})
            added = f" (+{w['p50'] - f['nodes'][1]['write']['p50']:.1f} ms)" if count > 1 and "write" in r else ""
            t = r.get("table", {"append": {"p50": 0, "p99": 0}, "run": {"p50": 0, "p99": 0}})
            lines.append(f"| {count} | {r['rps']:,.0f} req/s, p99 {r['p99']:.2f} ms | {r['rps'] / one:.2f}x | "
                         f"p50 {w['p50']:.1f} ms{added}, p99 {w['p99']:.1f} ms | "
                         f"p50 {t['append']['p50']:.1f} ms, p99 {t['append']['p99']:.1f} ms | "
                         f"p50 {t['run']['p50']:.1f} ms, p99 {t['run']['p99']:.1f} ms |")
    if f.get("io"):
        io = f["io"]
        upload_ratio = io["duckdb_import_ms"] / io["upload_ms"]
        lines += ["", f"**Data in and out** (the events table: an upload of it as CSV, {io['csv_bytes'] / 1e6:,.0f} MB, "
                  f"with `PUT .../tables/uploaded`, streamed; exports of {EXPORT_ROWS:,} of its rows with "
                  "`?format=...&refresh=direct`, the whole answer read by the client; DuckDB does the same work in "
                  "process on the same files: `COPY` of the CSV to Parquet, and the rows written in each format).", "",
                  "| Scenario | Service | DuckDB | Throughput ratio | Target |", "|---|---|---|---|---|",
                  f"| upload, CSV to a table | {io['upload_ms'] / 1000:.1f} s ({io['csv_bytes'] / 1e6 / (io['upload_ms'] / 1000):.0f} MB/s) "
                  f"| {io['duckdb_import_ms'] / 1000:.1f} s | {upload_ratio:.2f}x | >= 0.7x: {check(upload_ratio >= 0.7)} |"]
        for fmt, e in io["exports"].items():
            ratio = e["duckdb_ms"] / e["ms"]
            lines.append(f"| export, {fmt} ({e['bytes'] / 1e6:,.0f} MB) | {e['ms']:.0f} ms | {e['duckdb_ms']:.0f} ms "
                         f"| {ratio:.2f}x | >= 0.7x: {check(ratio >= 0.7)} |")
        limit_mb = 1.5 * io["idle_mb"] + 64
        lines += ["", "| Memory while | Peak RSS | Target |", "|---|---|---|",
                  f"| uploading the CSV | {io['upload_mb']:.0f} MB | none (flat: streamed) |"]
        for fmt in ("csv", "parquet"):
            e = io["exports"][fmt]
            lines.append(f"| exporting {EXPORT_ROWS:,} rows as {fmt} | {e['peak_mb']:.0f} MB | <= 1.5x idle "
                         f"({io['idle_mb']:.0f} MB) + 64 MB = {limit_mb:.0f} MB: {check(e['peak_mb'] <= limit_mb)} |")
    lines += [
        "",
        "**Memory** (server peak RSS, sampled every 50 ms).",
        "",
        "| State | Peak RSS | Target |",
        "|---|---|---|",
        f"| idle, after start | {f['idle_mb']:.0f} MB | < 60 MB: {check(f['idle_mb'] < 60)} |",
        f"| cached-run load | {f['cached_mb']:.0f} MB | < 200 MB: {check(f['cached_mb'] < 200)} |",
        f"| live run | {f['live_mb']:.0f} MB (bare DataFusion {f['bare']['peak_rss_kb'] / 1024:.0f} MB: {mem_ratio:.2f}x) "
        f"| <= 1.5x bare: {check(mem_ratio <= 1.5)} |",
        f"| materialized runs | {max(f['materialized_mb'], f['rollup_mb']):.0f} MB | none |",
        "",
    ]
    runs = {"cached": cached, "baseline": base, **{f"cached with {n} endpoints": r for n, r in f["by_count"].items()},
            **{f"{k} on {b}": r[k] for b, r in f["crud"].items() for k in r},
            **{f"cached on {n} nodes": r for n, r in f.get("nodes", {}).items()}}
    failed = {name: r["failed"] for name, r in runs.items() if r["failed"]}
    if failed:
        lines.insert(2, f"**Non-2xx responses during load runs ({failed}): the figures are not valid.**\n")
    section = "\n".join(lines) + "\n"
    # The page's own text above the marker is kept; the newest run replaces the one below it (history is in git).
    marker = "<!-- the newest run, written by make bench; older runs are in git -->"
    intro = f"# Benchmarks\n\n{marker}\n"
    if os.path.exists(args.out):
        with open(args.out) as f_in:
            text = f_in.read()
        if marker in text:
            intro = text.split(marker, 1)[0] + marker + "\n"
    body = intro + "\n" + section
    with open(args.out, "w") as f_out:
        f_out.write(body)
    print(section)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
