"""Tables are Delta tables: the `deltalake` Python package (delta-rs, the reader a data team uses from Python)
reads every table the API wrote and gets exactly the rows a run returns.

Starts the real `endpoints` binary (see `live_server.py`) with compaction every 200 ms, then through the API:
replaces a table from NDJSON (text, integers, floats, booleans, dates and timestamps, nulls), appends to it in many
small bodies (group commits), appends with `?on_error=quarantine` so that bad lines land in `{table}_quarantine`,
waits for a compaction (an `OPTIMIZE` commit) and replaces another table twice. Each table is then opened with
`deltalake.DeltaTable` at its place in the data directory, and its rows are compared with `SELECT *` run live
through an endpoint; its history must show the service's operations and the record's `files` the version's file
count. Last, a Delta table the `deltalake` package writes (partitioned, outside the data directory) is registered
as a source (`"format": "delta"`), and its next version is served. Run by `make test` (`make delta-check`).
"""

import datetime
import json
import os
import tempfile
import time
import urllib.error
import urllib.request

import deltalake
import pyarrow

from live_server import live_server, request

SALES = "id,country,amount\n1,US,10\n2,FR,20\n"


def upload(base, project, key, table, body, content_type, path="", method="PUT"):
    """Sends rows to `{table}{path}`; answers the JSON answer."""
    req = urllib.request.Request(f"{base}/api/projects/{project}/tables/{table}{path}", data=body.encode(),
                                 method=method)
    req.add_header("Authorization", f"Bearer {key}")
    req.add_header("Content-Type", content_type)
    with urllib.request.urlopen(req, timeout=60) as response:
        return json.loads(response.read())


def events(first, count):
    """NDJSON rows `first..first+count` with every kind of value, some null."""
    lines = []
    for i in range(first, first + count):
        lines.append(json.dumps({
            "id": i,
            "name": None if i % 7 == 3 else f"name-{i} ✓",
            "price": None if i % 5 == 1 else round(i * 1.5, 2),
            "vip": i % 3 == 0,
            "day": (datetime.date(2026, 1, 1) + datetime.timedelta(days=i % 300)).isoformat(),
        }))
    return "\n".join(lines) + "\n"


def run_all(base, project, key, table):
    """Every row of `table`, by id, through an endpoint run live."""
    name = f"all-{table.replace('_', '-')}"
    query = {"kind": "SQLQuery", "query": f"SELECT * FROM {table}"}
    try:
        request(f"{base}/api/projects/{project}/endpoints/", key, {"name": name, "query": query})
    except urllib.error.HTTPError as err:
        if err.code != 409:
            raise
        request(f"{base}/api/projects/{project}/endpoints/{name}", key, {"query": query}, method="PATCH")
    answer = request(f"{base}/api/projects/{project}/endpoints/{name}/run?refresh=direct&limit=1000", key)
    return answer["results"]


def comparable(value):
    """A value as both readers print it: dates and times as ISO text, floats rounded."""
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, float):
        return round(value, 9)
    return value


def read_delta(data_dir, project, table):
    """The rows of the Delta table at the table's place, read by the `deltalake` package, and the table."""
    path = os.path.join(data_dir, "projects", str(project), "tables", table)
    delta = deltalake.DeltaTable(path)
    rows = delta.to_pyarrow_table().to_pylist()
    return [{k: comparable(v) for k, v in row.items()} for row in rows], delta


def same_rows(label, ours, theirs, key):
    ours = sorted(({k: comparable(v) for k, v in row.items()} for row in ours), key=lambda r: r[key])
    theirs = sorted(theirs, key=lambda r: r[key])
    if ours != theirs:
        for a, b in zip(ours, theirs):
            if a != b:
                raise SystemExit(f"{label}: a run and deltalake differ: {a} != {b}")
        raise SystemExit(f"{label}: {len(ours)} rows by a run, {len(theirs)} read by deltalake")
    print(f"{label}: deltalake reads the {len(ours)} rows a run returns")


def wait_for_compaction(base, project, key, table):
    for _ in range(300):
        record = request(f"{base}/api/projects/{project}/tables/{table}", key)
        if record.get("last_compacted_at"):
            return record
        time.sleep(0.1)
    raise SystemExit(f"{table} was never compacted: {record}")


def orders(first, count):
    """Rows `first..first+count` of a lake's orders table, partitioned by region."""
    ids = list(range(first, first + count))
    return pyarrow.table({
        "id": pyarrow.array(ids, pyarrow.int64()),
        "region": [("eu", "us", "apac")[i % 3] for i in ids],
        "amount": [i * 2.5 for i in ids],
    })


def check_delta_source(base, project, key, lake):
    """A team's Delta table, written by the `deltalake` package, served as a source and followed."""
    path = os.path.join(lake, "orders")
    deltalake.write_deltalake(path, orders(1, 30), partition_by=["region"])
    body = json.dumps({"source": {"url": f"file://{path}", "format": "delta"}})
    record = upload(base, project, key, "orders", body, "application/json")
    assert record["format"] == "delta" and record["row_count"] == 30, record
    theirs = deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()
    same_rows("orders (a Delta source)", run_all(base, project, key, "orders"), theirs, "id")
    # The writer's next version is what the next run reads (the server checks at every run here).
    deltalake.write_deltalake(path, orders(31, 5), mode="append", partition_by=["region"])
    theirs = deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()
    ours = run_all(base, project, key, "orders")
    same_rows("orders (its next version)", ours, theirs, "id")
    assert len(ours) == 35, len(ours)


def main():
    with tempfile.TemporaryDirectory() as work, tempfile.TemporaryDirectory() as lake, live_server(
        work, SALES,
        serve_args=("--compaction-interval-ms", "200", "--allow-source", f"file://{lake}/",
                    "--source-refresh-secs", "0"),
    ) as (base, project, key):
        data_dir = os.path.join(work, "data")
        ndjson = "application/x-ndjson"
        created = upload(base, project, key, "events", events(1, 50), ndjson)
        assert created["row_count"] == 50, created
        # Many small appends, some together: group commits of one Delta commit each.
        for batch in range(12):
            upload(base, project, key, "events", events(51 + batch * 5, 5), ndjson, "/rows", "POST")
        # Bad lines set aside in the quarantine table, the good ones appended.
        mixed = events(200, 3) + '{"id": "not a number"}\n' + "not json at all\n"
        answer = upload(base, project, key, "events", mixed, ndjson, "/rows?on_error=quarantine", "POST")
        assert (answer["rows_added"], answer["rows_quarantined"]) == (3, 2), answer
        record = wait_for_compaction(base, project, key, "events")

        rows, delta = read_delta(data_dir, project, "events")
        same_rows("events (appended, compacted)", run_all(base, project, key, "events"), rows, "id")
        operations = [commit.get("operation") for commit in delta.history()]
        assert "OPTIMIZE" in operations and "WRITE" in operations, operations
        assert record["files"] == len(delta.file_uris()), (record, delta.file_uris())
        assert delta.version() + 1 == len(operations), (delta.version(), operations)

        quarantined, _ = read_delta(data_dir, project, "events_quarantine")
        same_rows("events_quarantine", run_all(base, project, key, "events_quarantine"), quarantined, "line")
        assert len(quarantined) == 2 and all(row["error"] for row in quarantined), quarantined

        # The CLI's table, and a table replaced twice over HTTP with other columns: the newest version only.
        sales, _ = read_delta(data_dir, project, "sales")
        same_rows("sales (imported by the CLI)", run_all(base, project, key, "sales"), sales, "id")
        upload(base, project, key, "things", "a,b\n1,x\n2,y\n", "text/csv")
        upload(base, project, key, "things", "b,c\nz,3.5\n", "text/csv")
        things, delta = read_delta(data_dir, project, "things")
        same_rows("things (replaced)", run_all(base, project, key, "things"), things, "b")
        assert delta.version() == 1 and [f.name for f in delta.schema().fields] == ["b", "c"], delta.schema()
        check_delta_source(base, project, key, lake)
        print("delta: 7 passed, 0 failed")


if __name__ == "__main__":
    main()
