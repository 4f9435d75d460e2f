"""End to end: generate a typed Python client from a live endpoint's OpenAPI document and use it.

Starts the real `endpoints` binary on a free port over a fresh data directory, loads a small table, creates an
endpoint with typed variables, fetches its document, generates a client with openapi-python-client, runs the
endpoint through the generated client and checks the typed rows. Run by `make test` (`make client-check`).
"""

import datetime
import importlib
import json
import os
import subprocess
import sys
import tempfile

from live_server import live_server, request

VENV_BIN = os.path.dirname(sys.executable)

SALES = """id,country,amount,day
1,US,10.5,2026-01-01
2,US,20.25,2026-01-02
3,FR,5,2026-01-03
4,DE,100,2026-01-05
"""

ENDPOINT = {
    "name": "sales-by-country",
    "description": "Sales per country since a day",
    "query": {
        "kind": "SQLQuery",
        "query": "SELECT country, sum(amount) AS total, count(*) AS n, max(day) AS last_day FROM sales "
        "WHERE day >= {variables.since} AND id <= {variables.max_id} AND country IN {variables.countries} "
        "GROUP BY country ORDER BY total DESC",
        "variables": {
            "since": {"type": "Date", "default": "2026-01-01"},
            "max_id": {"type": "Integer"},
            "countries": {"type": "List", "default": ["US", "FR", "DE"]},
        },
    },
}


def main():
    with tempfile.TemporaryDirectory() as work, live_server(work, SALES) as (base, project, key):
        request(f"{base}/api/projects/{project}/endpoints/", key, ENDPOINT)
        doc = request(f"{base}/api/projects/{project}/endpoints/sales-by-country/openapi.json", key)
        doc_path = os.path.join(work, "openapi.json")
        with open(doc_path, "w") as f:
            json.dump(doc, f)

        env = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
        subprocess.run(
            [os.path.join(VENV_BIN, "openapi-python-client"), "generate", "--path", doc_path, "--meta", "none",
             "--output-path", os.path.join(work, "sales_by_country_client")],
            check=True, capture_output=True, text=True, env=env, cwd=work,
        )
        sys.path.insert(0, work)
        client_pkg = importlib.import_module("sales_by_country_client")
        run = importlib.import_module("sales_by_country_client.api.default.run_sales_by_country")
        models = importlib.import_module("sales_by_country_client.models")

        client = client_pkg.AuthenticatedClient(base_url=base, token=key)
        body = models.RunRequest(variables=models.RunRequestVariables(max_id=3, countries=["US", "FR"]))
        result = run.sync(client=client, body=body)
        assert isinstance(result, models.RunResult), f"expected a RunResult, got {result!r}"
        rows = result.results
        assert [(r.country, r.total, r.n) for r in rows] == [("US", 30.75, 2), ("FR", 5.0, 1)], rows
        assert isinstance(rows[0].total, float) and isinstance(rows[0].n, int)
        assert rows[0].last_day == datetime.date(2026, 1, 2), rows[0].last_day
        assert result.has_more is False and result.endpoint_version == 1

        # The generated model knows the variable without a default is required.
        try:
            models.RunRequestVariables.from_dict({})
            raise AssertionError("max_id should be required")
        except KeyError:
            pass
        # An error answer comes back as the typed error model.
        missing = models.RunRequest(variables=models.RunRequestVariables(max_id=1), version=9)
        error = run.sync(client=client, body=missing)
        assert isinstance(error, models.Error) and error.type_ == models.ErrorType.NOT_FOUND, error
    print("client: 1 passed, 0 failed")


if __name__ == "__main__":
    main()
