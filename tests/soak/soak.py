#!/usr/bin/env python3
"""`make soak`: a mixed workload from many concurrent clients against a real `endpoints serve` on PostgreSQL,
bounded in time and in requests, on loopback only.

Each client owns its endpoints and keeps a model of what the server acknowledged: which exist, at which version,
materialized or not. It creates, changes settings and queries (new versions), turns materialization on and off,
runs cached and live, lists and deletes, at random. At the end every acknowledged write must be present with the
right versions (1..n, no gap), every acknowledged delete gone, no stored result left for an endpoint that no
longer exists, no 5xx ever answered, and the server's memory flat (the last third of the run against the first,
after warm-up). The figures go to docs/soak.md.

Standard library only. Usage: soak.py --bin-dir target/release --postgres-url URL [--seconds 180]
"""

import argparse
import collections
import datetime
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

RUN = "/api/projects/1/endpoints/events-by-country/run?variables.since=2026-03-01"
# Eligible for materialization: the variable filters a column the query outputs.
MATERIALIZABLE = ("SELECT country, count(*) AS events FROM events WHERE country = {variables.country} "
                  "GROUP BY country")


def log(message):
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Client:
    def __init__(self, base, key):
        self.base, self.key = base, key

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.key}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                return err.code, json.loads(raw)
            except ValueError:
                return err.code, raw.decode(errors="replace")


class Worker(threading.Thread):
    """One client: its own endpoints, its model of them, its tally of statuses."""

    def __init__(self, index, client, deadline, budget, seed):
        super().__init__(daemon=True)
        self.index, self.client, self.deadline, self.budget = index, client, deadline, budget
        self.random = random.Random(seed)
        self.model = {}  # name -> {"version": n, "materialized": bool} for acknowledged, live endpoints
        self.deleted = set()
        self.statuses = collections.Counter()
        self.actions = collections.Counter()
        self.server_errors = []
        self.counter = 0

    def record(self, action, status, body):
        self.actions[action] += 1
        self.statuses[status] += 1
        if status >= 500:
            self.server_errors.append((action, status, body))

    def run(self):
        base = "/api/projects/1/endpoints"
        while time.monotonic() < self.deadline and self.budget.take():
            names = sorted(self.model)
            roll = self.random.random()
            if roll < 0.15 or not names:
                self.counter += 1
                name = f"soak-{self.index}-{self.counter}"
                body = {"name": name, "query": {"kind": "SQLQuery", "query": "SELECT 1 AS one"}}
                status, answer = self.client.call("POST", base + "/", body)
                self.record("create", status, answer)
                if status == 201:
                    self.model[name] = {"version": 1, "materialized": False}
            elif roll < 0.25:
                name = self.random.choice(names)
                sql = f"SELECT {self.random.randint(1, 10**6)} AS n"
                if self.random.random() < 0.3:
                    sql = MATERIALIZABLE
                # The two queries output different columns: a breaking change of an endpoint that ran, confirmed.
                status, answer = self.client.call("PATCH", f"{base}/{name}/",
                                                  {"query": {"kind": "SQLQuery", "query": sql},
                                                   "confirm_breaking": True})
                self.record("new version", status, answer)
                if status == 200:
                    self.model[name]["version"] = answer["current_version"]
                    self.model[name]["materialized"] = answer["is_materialized"]
            elif roll < 0.32:
                name = self.random.choice(names)
                status, answer = self.client.call("PATCH", f"{base}/{name}/",
                                                  {"description": f"d{self.random.randint(0, 999)}",
                                                   "cache_age_seconds": self.random.choice([60, 300, 3600])})
                self.record("settings", status, answer)
                if status == 200 and answer["current_version"] != self.model[name]["version"]:
                    self.server_errors.append(("settings changed the version", status, answer))
            elif roll < 0.38:
                name = self.random.choice(names)
                want = not self.model[name]["materialized"]
                status, answer = self.client.call("PATCH", f"{base}/{name}/",
                                                  {"is_materialized": want, "sync_frequency": "1hour"})
                self.record("materialize", status, answer)
                if status == 200:
                    self.model[name]["materialized"] = want
                elif status != 400:  # 400: the current query is not eligible
                    self.server_errors.append(("materialize", status, answer))
            elif roll < 0.45:
                name = self.random.choice(names)
                status, answer = self.client.call("DELETE", f"{base}/{name}/")
                self.record("delete", status, answer)
                if status == 204:
                    del self.model[name]
                    self.deleted.add(name)
            elif roll < 0.75:
                status, answer = self.client.call("GET", RUN)
                self.record("run cached", status, answer)
            elif roll < 0.85:
                status, answer = self.client.call("GET", RUN + "&refresh=direct&limit=5")
                self.record("run live", status, answer)
            elif roll < 0.92 and names:
                name = self.random.choice(names)
                status, answer = self.client.call("GET", f"{base}/{name}/run?variables.country=DE")
                self.record("run own", status, answer)
            else:
                status, answer = self.client.call("GET", f"{base}/?limit=20&search=soak-{self.index}-")
                self.record("list", status, answer)


class Budget:
    """The most requests the whole run may send."""

    def __init__(self, total):
        self.left, self.lock = total, threading.Lock()

    def take(self):
        with self.lock:
            if self.left <= 0:
                return False
            self.left -= 1
            return True


def check_model(client, workers, data_dir):
    problems = []
    present = 0
    for worker in workers:
        for name, expected in worker.model.items():
            status, endpoint = client.call("GET", f"/api/projects/1/endpoints/{name}/")
            if status != 200:
                problems.append(f"{name}: acknowledged but answers {status}")
                continue
            present += 1
            if endpoint["current_version"] != expected["version"]:
                problems.append(f"{name}: version {endpoint['current_version']}, acknowledged {expected['version']}")
            status, versions = client.call("GET", f"/api/projects/1/endpoints/{name}/versions/?limit=100")
            numbers = sorted(v["version"] for v in versions["results"]) if status == 200 else []
            if numbers != list(range(1, expected["version"] + 1)):
                problems.append(f"{name}: versions {numbers}, expected 1..{expected['version']}")
            if endpoint["is_materialized"] != expected["materialized"]:
                problems.append(f"{name}: is_materialized {endpoint['is_materialized']}")
        for name in worker.deleted - set(worker.model):
            status, _ = client.call("GET", f"/api/projects/1/endpoints/{name}/")
            if status != 404:
                problems.append(f"{name}: deleted but answers {status}")
    # Stored results only for endpoints that exist.
    ids = set()
    offset = 0
    while True:
        status, page = client.call("GET", f"/api/projects/1/endpoints/?limit=100&offset={offset}")
        ids.update(e["id"] for e in page["results"])
        if not page["next"]:
            break
        offset += 100
    stored = os.path.join(data_dir, "projects", "1", "materializations")
    orphans = [d for d in (os.listdir(stored) if os.path.isdir(stored) else []) if d not in ids]
    if orphans:
        problems.append(f"stored results of endpoints that no longer exist: {orphans[:5]}")
    return present, problems


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", default="target/release")
    parser.add_argument("--postgres-url", required=True)
    parser.add_argument("--seconds", type=int, default=180)
    parser.add_argument("--max-requests", type=int, default=300_000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--out", default="docs/soak.md")
    args = parser.parse_args()
    binary = os.path.join(args.bin_dir, "endpoints")
    data_dir = tempfile.mkdtemp(prefix="endpoints-soak-", dir=os.path.abspath("target"))
    common = [binary, "--data-dir", data_dir, "--database-url", args.postgres_url, "--json"]
    server = None
    try:
        subprocess.run(common + ["migrate"], check=True, capture_output=True)
        subprocess.run(common + ["demo", "--rows", str(args.rows)], check=True, capture_output=True)
        key = json.loads(subprocess.run(common + ["key", "create", "--project", "1", "--scope", "endpoint:write"],
                                        check=True, capture_output=True, text=True).stdout)["key"]
        port = free_port()
        log_file = open(os.path.join(data_dir, "serve.log"), "w")
        server = subprocess.Popen([binary, "--data-dir", data_dir, "--database-url", args.postgres_url, "serve",
                                   "--bind", f"127.0.0.1:{port}", "--materialize-poll-ms", "500",
                                   # One key for all clients: its request limit would only measure itself.
                                   "--rate-limit-key-per-sec", "0", "--rate-limit-project-per-sec", "0"],
                                  stdout=log_file, stderr=log_file)
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                urllib.request.urlopen(base + "/healthz", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        client = Client(base, key)
        started = time.monotonic()
        deadline = started + args.seconds
        budget = Budget(args.max_requests)
        workers = [Worker(i, client, deadline, budget, seed=i) for i in range(args.clients)]
        memory = []
        for worker in workers:
            worker.start()
        while any(w.is_alive() for w in workers):
            memory.append((time.monotonic() - started, rss_mb(server.pid)))
            time.sleep(1)
        elapsed = time.monotonic() - started
        log(f"workload done in {elapsed:.0f} s; checking what the server acknowledged")
        present, problems = check_model(client, workers, data_dir)
        statuses = sum((w.statuses for w in workers), collections.Counter())
        actions = sum((w.actions for w in workers), collections.Counter())
        errors = [e for w in workers for e in w.server_errors]
        warm = [m for t, m in memory if t > elapsed / 6] or [m for _, m in memory]
        third = max(len(warm) // 3, 1)
        first, last = max(warm[:third]), max(warm[-third:])
        flat = last <= first * 1.25 + 20
        figures = {
            "seconds": elapsed, "requests": sum(actions.values()), "clients": args.clients, "statuses": statuses,
            "actions": actions, "errors": errors, "present": present, "problems": problems,
            "memory_first": first, "memory_last": last, "memory_peak": max(m for _, m in memory), "flat": flat,
        }
        for problem in problems[:20]:
            log(f"PROBLEM: {problem}")
        for action, status, body in errors[:20]:
            log(f"SERVER ERROR: {action} {status} {body}")
        write_report(args, figures)
        ok = not problems and not errors and flat
        log(f"{figures['requests']:,} requests, {len(errors)} 5xx, {len(problems)} problems, memory "
            f"{first:.0f} -> {last:.0f} MB: {'OK' if ok else 'FAILED'}")
        return 0 if ok else 1
    finally:
        if server:
            server.terminate()
            server.wait(timeout=60)
        shutil.rmtree(data_dir, ignore_errors=True)


def write_report(args, f):
    date = datetime.date.today().isoformat()
    statuses = ", ".join(f"{s}: {n:,}" for s, n in sorted(f["statuses"].items()))
    actions = ", ".join(f"{a} {n:,}" for a, n in sorted(f["actions"].items()))
    section = f"""## Soak {date}: {f['seconds']:.0f} s, {f['clients']} clients, PostgreSQL

Command: `make soak` (`tests/soak/soak.py --seconds {args.seconds} --clients {args.clients} --rows {args.rows}`),
release build, one `serve` process on PostgreSQL with its materialization worker on, loopback. The 400s are
expected refusals (materializing a query that is not eligible, running an endpoint with a variable its query
does not declare); the 429s are live runs past the per-project limit of concurrent queries.

| Figure | Result | Expected |
|---|---|---|
| requests | {f['requests']:,} ({f['requests'] / f['seconds']:,.0f}/s): {actions} | bounded by time and count |
| statuses | {statuses} | no 5xx: {'met' if not f['errors'] else '**missed** (' + str(len(f['errors'])) + ')'} |
| acknowledged endpoints checked at the end | {f['present']:,} present with versions 1..n, deletes gone, no orphaned stored results | {'met' if not f['problems'] else '**missed**: ' + '; '.join(f['problems'][:3])} |
| server RSS | {f['memory_first']:.0f} MB (peak of the first third after warm-up), {f['memory_last']:.0f} MB (last third), {f['memory_peak']:.0f} MB overall | flat (last <= 1.25x first + 20 MB): {'met' if f['flat'] else '**missed**'} |

"""
    # The newest soak replaces the one under its marker, up to the next marker (history is in git).
    text = open(args.out).read() if os.path.exists(args.out) else "# Soak\n"
    marker = "<!-- the newest soak, written by make soak; older ones are in git -->"
    if marker not in text:
        text = text.rstrip() + "\n\n" + marker + "\n"
    head, rest = text.split(marker, 1)
    following = rest.find("<!--")
    tail = rest[following:] if following >= 0 else ""
    text = head + marker + "\n\n" + section.rstrip() + "\n\n" + tail
    with open(args.out, "w") as out:
        out.write(text)


if __name__ == "__main__":
    sys.exit(main())
