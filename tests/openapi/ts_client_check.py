"""End to end: a TypeScript client of a live endpoint, generated and called as docs/clients.md suggests.

Starts the real `endpoints` binary (see `live_server.py`), creates an endpoint with typed variables, fetches its
OpenAPI document, generates types with openapi-typescript 7, and compiles a program that calls the run and an
export through openapi-fetch 0.17 with strict `tsc`: `data.results[0].country` must be typed as the column's type
(a wrong type or an unknown column must not compile). The program then runs under Node against the server and its
answers are checked. The tools are the console's own (console/node_modules, installed by `make console`). Run by
`make test` (`make ts-client-check`).
"""

import json
import os
import subprocess
import sys
import tempfile

from live_server import live_server, request

from client_e2e import ENDPOINT, SALES

CONSOLE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "console"))
BIN = os.path.join(CONSOLE, "node_modules", ".bin")

PROGRAM = """\
import createClient from "openapi-fetch";
import type { paths } from "./schema";

const client = createClient<paths>({ baseUrl: BASE, headers: { Authorization: `Bearer ${KEY}` } });
const run = "/api/projects/PROJECT/endpoints/sales-by-country/run" as const;

const { data, error } = await client.POST(run, { body: { variables: { max_id: 3, countries: ["US", "FR"] } } });
if (error !== undefined || data === undefined) throw new Error(JSON.stringify(error));
// The answer is the run's JSON, its rows typed by the endpoint's columns (null only for a force_cache run with
// nothing stored).
if (data.results === null) throw new Error("no rows");
const first = data.results[0];
const country: string | null = first.country;
const total: number | null = first.total;
const n: number | null = first.n;
const version: number | null = data.endpoint_version;
// @ts-expect-error a text column is not a number
const wrong: number = first.country;
// @ts-expect-error no such column
const missing = first.no_such_column;
// @ts-expect-error a required variable left out (those with a default may be)
await client.POST(run, { body: { variables: { countries: ["US"] } } });

// An export is its own operation, its answer text.
const csv = await client.POST(`${run}/csv`, { body: { variables: { max_id: 3 } }, parseAs: "text" });
const text: string | undefined = csv.data;

console.log(JSON.stringify({ country, total, n, version, rows: data.results.length, csv: text, unused: [wrong, missing] }));
"""

TSCONFIG = {
    "compilerOptions": {
        "strict": True,
        "target": "ES2022",
        "module": "ES2022",
        "moduleResolution": "bundler",
        "lib": ["ES2022", "DOM"],
        "outDir": "out",
        "skipLibCheck": True,
    },
    "files": ["client.ts", "schema.d.ts"],
}


# The generator's default flags, as a newcomer runs it first: a request property with a `default` would be made
# required (openapi-ts/openapi-typescript#2012), so the documents say request defaults in words instead.
GENERATE = [os.path.join(BIN, "openapi-typescript"), "openapi.json", "--output", "schema.d.ts"]


def run(args, cwd):
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def main():
    with tempfile.TemporaryDirectory() as work, live_server(work, SALES) as (base, project, key):
        request(f"{base}/api/projects/{project}/endpoints/", key, ENDPOINT)
        doc = request(f"{base}/api/projects/{project}/endpoints/sales-by-country/openapi.json", key)
        # The run's 200 is JSON only; each export is an operation of its own with its one media type.
        path = f"/api/projects/{project}/endpoints/sales-by-country/run"
        assert list(doc["paths"][path]["post"]["responses"]["200"]["content"]) == ["application/json"], doc
        csv = doc["paths"][f"{path}/csv"]["post"]
        assert csv["operationId"] == "export_sales_by_country_csv"
        assert list(csv["responses"]["200"]["content"]) == ["text/csv"], csv

        client = os.path.join(work, "client")
        os.makedirs(client)
        os.symlink(os.path.join(CONSOLE, "node_modules"), os.path.join(client, "node_modules"))
        with open(os.path.join(client, "openapi.json"), "w") as f:
            json.dump(doc, f)
        with open(os.path.join(client, "package.json"), "w") as f:
            json.dump({"type": "module", "private": True}, f)
        with open(os.path.join(client, "tsconfig.json"), "w") as f:
            json.dump(TSCONFIG, f)
        program = PROGRAM.replace("PROJECT", str(project))
        program = f"const BASE = {json.dumps(base)};\nconst KEY = {json.dumps(key)};\n" + program
        with open(os.path.join(client, "client.ts"), "w") as f:
            f.write(program)
        run(GENERATE, client)
        run([os.path.join(BIN, "tsc"), "-p", "tsconfig.json"], client)
        answer = json.loads(run(["node", os.path.join("out", "client.js")], client))
        assert answer["country"] == "US" and answer["total"] == 30.75 and answer["n"] == 2, answer
        assert answer["version"] == 1 and answer["rows"] == 2, answer
        assert answer["csv"].splitlines()[0] == "country,total,n,last_day", answer["csv"]

        # The same program against the document as it was before exports had their own operations (five media
        # types under the run's 200) does not compile: what this check guards.
        for op in ("get", "post"):
            content = doc["paths"][path][op]["responses"]["200"]["content"]
            content["text/csv"] = {"schema": {"type": "string"}}
        with open(os.path.join(client, "openapi.json"), "w") as f:
            json.dump(doc, f)
        run(GENERATE, client)
        broken = subprocess.run([os.path.join(BIN, "tsc"), "-p", "tsconfig.json"], cwd=client,
                                capture_output=True, text=True)
        assert broken.returncode != 0 and "'results' does not exist" in broken.stdout, broken.stdout
    print("ts client: 1 passed, 0 failed")


if __name__ == "__main__":
    sys.exit(main())
