"""A real `endpoints serve` over a fresh data directory, for the scripts that check the service from outside
(`client_e2e.py`, `formats_check.py`, `schemathesis_check.py`): a project with a `sales` table and a key, then the
server on a free loopback port.
"""

import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

BINARY = os.environ.get("ENDPOINTS_BIN", "target/debug/endpoints")


def cli(data_dir, *args):
    out = subprocess.run([BINARY, "--data-dir", data_dir, "--json", *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def request(url, key, body=None, method=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method or ("POST" if body is not None else "GET"))
    req.add_header("Authorization", f"Bearer {key}")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as response:
        body = response.read()
        return json.loads(body) if body else None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def live_server(work, sales_csv, serve_args=()):
    """Yields `(base_url, project_id, key)` of a server over a new data directory under `work`, whose project
    has a `sales` table loaded from the text `sales_csv` and a key with the endpoint and table write scopes. The
    server's output goes
    to `work/server.log`, shown if it exits early."""
    data_dir = os.path.join(work, "data")
    project = cli(data_dir, "project", "create", "--name", "Checks")["id"]
    key = cli(data_dir, "key", "create", "--project", str(project), "--scope", "endpoint:write",
              "--scope", "table:write")["key"]
    csv = os.path.join(work, "sales.csv")
    with open(csv, "w") as f:
        f.write(sales_csv)
    cli(data_dir, "data", "import", "--project", str(project), "--table", "sales", csv)
    base = f"http://127.0.0.1:{free_port()}"
    log_path = os.path.join(work, "server.log")
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [BINARY, "--data-dir", data_dir, "serve", "--bind", base.removeprefix("http://"), *serve_args],
            stdout=log, stderr=log,
        )
    try:
        for _ in range(200):
            if server.poll() is not None:
                with open(log_path) as f:
                    raise SystemExit(f"the server exited: {f.read()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=5):
                    break
            except (OSError, urllib.error.URLError):
                time.sleep(0.1)
        else:
            raise SystemExit("the server did not come up")
        yield base, project, key
        if server.poll() is not None:
            with open(log_path) as f:
                raise SystemExit(f"the server died during the check: {f.read()[-4000:]}")
    finally:
        server.terminate()
        server.wait(timeout=30)
