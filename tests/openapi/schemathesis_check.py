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

import os
import subprocess
import sys
import tempfile

from live_server import live_server, request

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


def main():
    # Rate limits off: the generated traffic is a burst from one key and one address (its missing and forged
    # credentials included), and a 429 would hide the answer under test.
    # The limits have their own tests.
    no_limits = (
        "--rate-limit-key-per-sec", "0", "--rate-limit-project-per-sec", "0", "--auth-failures-per-sec", "0",
    )
    with tempfile.TemporaryDirectory() as work, live_server(work, SALES, no_limits) as (base, project, key):
        for endpoint in ENDPOINTS:
            request(f"{base}/api/projects/{project}/endpoints/", key, endpoint)
        command = [
            ST, "--config-file", os.path.join(os.path.dirname(os.path.abspath(__file__)), "schemathesis.toml"),
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
    if status != 0:
        print(f"schemathesis: findings above (exit {status})")
        sys.exit(status)
    print("schemathesis: every operation conforms")


if __name__ == "__main__":
    main()
