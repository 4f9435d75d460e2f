"""API conformance under generated input: schemathesis against the service's own `/api/schema`.

Starts the real `endpoints` binary on a free port over a fresh data directory with a project, a small table, a
few endpoints and a key with the write scope, then runs `st run` over every operation of both families
(`projects` and `environments`) with a fixed seed and a bounded number of examples. Every check is on (the
default; `schemathesis.toml` beside this file narrows two of them for named operations and says why): no 5xx,
every answer conforms to the document (status, content type, headers, body schema), schema-valid requests are
accepted and schema-invalid ones refused. Exits non-zero on any finding. Run by `make test`
(`make schemathesis-check`).

ST_MAX_EXAMPLES and ST_SEED change the amount of generated input and the seed (`make schemathesis-check
ST_MAX_EXAMPLES=200` for a longer run).
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

BINARY = os.environ.get("ENDPOINTS_BIN", "target/debug/endpoints")
ST = os.path.join(os.path.dirname(sys.executable), "st")
MAX_EXAMPLES = os.environ.get("ST_MAX_EXAMPLES", "10")
SEED = os.environ.get("ST_SEED", "83074570177261566347458060170853384332")

SALES = """id,country,amount,day
1,US,10.5,2026-01-01
2,US,20.25,2026-01-02
3,FR,5,2026-01-03
"""

ENDPOINTS = [
    {"name": "sales", "query": {"kind": "SQLQuery", "query": "SELECT country, amount FROM sales ORDER BY id"}},
    {
        "name": "by-country",
        "query": {
            "kind": "SQLQuery",
            "query": "SELECT country, sum(amount) AS total FROM sales WHERE country = {variables.country} "
            "GROUP BY country",
            "variables": {"country": {"type": "String", "default": "US"}},
        },
    },
]


def cli(data_dir, *args):
    out = subprocess.run([BINARY, "--data-dir", data_dir, "--json", *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def post(url, key, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("Authorization", f"Bearer {key}")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as response:
        return json.loads(response.read())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(base, server):
    for _ in range(200):
        if server.poll() is not None:
            raise SystemExit("the server exited before answering")
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=5):
                return
        except (OSError, urllib.error.URLError):
            time.sleep(0.1)
    raise SystemExit("the server did not come up")


def main():
    with tempfile.TemporaryDirectory() as work:
        data_dir = os.path.join(work, "data")
        project = cli(data_dir, "project", "create", "--name", "Conformance")["id"]
        key = cli(data_dir, "key", "create", "--project", str(project), "--scope", "endpoint:write")["key"]
        csv = os.path.join(work, "sales.csv")
        with open(csv, "w") as f:
            f.write(SALES)
        cli(data_dir, "data", "import", "--project", str(project), "--table", "sales", csv)

        base = f"http://127.0.0.1:{free_port()}"
        log_path = os.path.join(work, "server.log")
        with open(log_path, "w") as log:
            # Rate limits off: the generated traffic is a burst from one key, and a 429 would hide the answer
            # under test. The limits have their own tests.
            server = subprocess.Popen(
                [BINARY, "--data-dir", data_dir, "serve", "--bind", base.removeprefix("http://"),
                 "--rate-limit-key-per-sec", "0", "--rate-limit-project-per-sec", "0"],
                stdout=log, stderr=log,
            )
        try:
            wait_until_up(base, server)
            for endpoint in ENDPOINTS:
                post(f"{base}/api/projects/{project}/endpoints/", key, endpoint)
            command = [
                ST, "--config-file", os.path.join(os.path.dirname(__file__), "schemathesis.toml"),
                "run", f"{base}/api/schema",
                "--header", f"Authorization: Bearer {key}",
                "--max-examples", MAX_EXAMPLES,
                "--seed", SEED,
                "--workers", "1",
                "--no-color",
                "--suppress-health-check", "all",
                "--generation-database", "none",
            ]
            # In the scratch directory: schemathesis keeps its caches in the working directory.
            status = subprocess.run(command, check=False, cwd=work).returncode
            if server.poll() is not None:
                print("the server died during the run; its log:")
                with open(log_path) as f:
                    print(f.read()[-4000:])
                status = status or 1
        finally:
            server.terminate()
            server.wait(timeout=30)
        if status != 0:
            print(f"schemathesis: findings above (exit {status})")
            sys.exit(status)
    print("schemathesis: every operation conforms")


if __name__ == "__main__":
    main()
