"""Every result format, read back by a real reader and compared with the JSON answer of the same run.

Starts the real `endpoints` binary over a fresh data directory (see `live_server.py`), loads a table whose values
need care in every format (quotes, commas and newlines in text, nulls, dates, timestamps, booleans, large and
negative numbers), and runs one endpoint as JSON, then as CSV (Python's `csv`), NDJSON (`json`, line by line),
Parquet and Arrow IPC stream (`pyarrow`), under both route families and through each way of asking for a format
(`?format=`, the body's `format`, `Accept`, and the export operation `.../run/{format}` by POST and GET). Each answer's rows must equal the JSON rows, and its headers the JSON
answer's fields. Also checked: `ETag`/`If-None-Match` (304), `Cache-Control`, 406 for a format the service does
not write, the export cap (`--max-export-rows`) and a page that has more rows. Run by `make test`
(`make formats-check`).
"""

import csv
import datetime
import decimal
import io
import json
import tempfile
import urllib.error
import urllib.parse
import urllib.request

import pyarrow.ipc
import pyarrow.parquet

from live_server import live_server, request

ROWS = 120
EXPORT_CAP = 100


def table_rows():
    """The `things` table as NDJSON: one line per row, with the awkward values spread over the rows."""
    notes = ['plain', 'a, comma', 'a "quoted" word', 'two\nlines', '', None, 'ünïcödé ✓', "it's"]
    lines = []
    for i in range(ROWS):
        lines.append(json.dumps({
            "id": i + 1,
            "big": None if i % 11 == 5 else (i - 60) * 123_456_789_012,
            "price": None if i % 13 == 7 else round((i - 40) * 1.25 + 0.1, 2),
            "note": notes[i % len(notes)],
            "day": None if i % 17 == 3 else (datetime.date(2026, 1, 1) + datetime.timedelta(days=i)).isoformat(),
            "at": (datetime.datetime(2026, 3, 1, 12, 30, 15, 250000) + datetime.timedelta(hours=i * 7))
            .isoformat(),
            "flag": None if i % 19 == 2 else i % 3 == 0,
        }))
    return "\n".join(lines) + "\n"


ENDPOINT = {
    "name": "things-export",
    "query": {
        "kind": "SQLQuery",
        # NDJSON's dates and times load as text: the query makes them a date, a timestamp and a decimal.
        "query": "SELECT id, big, price, CAST(price AS DECIMAL(12, 2)) AS exact, note, CAST(day AS DATE) AS day, "
                 "CAST(at AS TIMESTAMP) AS at, flag, id * 2 AS doubled FROM things "
                 "WHERE id >= {variables.from_id} ORDER BY id",
        "variables": {"from_id": {"type": "Integer", "default": 1}},
    },
}


def fetch(url, key, body=None, accept=None, headers=()):
    """`(status, headers, body bytes)` of a request; error statuses are answers, not exceptions."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST" if body is not None else "GET")
    req.add_header("Authorization", f"Bearer {key}")
    if body is not None:
        req.add_header("Content-Type", "application/json")
    if accept:
        req.add_header("Accept", accept)
    for name, value in headers:
        req.add_header(name, value)
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def upload(base, project, key, name, text):
    req = urllib.request.Request(f"{base}/api/projects/{project}/tables/{name}", data=text.encode(), method="PUT")
    req.add_header("Authorization", f"Bearer {key}")
    req.add_header("Content-Type", "application/x-ndjson")
    with urllib.request.urlopen(req, timeout=60) as response:
        assert response.status in (200, 201), response.status


def canonical(value, kind):
    """A value of any reader in the JSON answer's form for its column type."""
    if value is None or value == "":
        return None
    if kind == "integer":
        return int(value)
    if kind in ("float", "decimal"):
        return float(value)
    if kind == "boolean":
        return value if isinstance(value, bool) else {"true": True, "false": False}[value]
    if kind == "date":
        return value.isoformat() if isinstance(value, datetime.date) else str(value)
    if kind == "datetime":
        if isinstance(value, str):
            value = datetime.datetime.fromisoformat(value.removesuffix("Z"))
        return value.replace(tzinfo=None).isoformat(timespec="microseconds")
    if isinstance(value, decimal.Decimal):
        return float(value)
    return value


def canonical_rows(rows, types):
    return [{name: canonical(row[name], kind) for name, kind in types} for row in rows]


def csv_rows(body, types):
    reader = csv.DictReader(io.StringIO(body.decode("utf-8"), newline=""))
    assert reader.fieldnames == [name for name, _ in types], reader.fieldnames
    rows = list(reader)
    # CSV has no null: an empty field is null, so an empty string and a null both read as null here and in JSON.
    return canonical_rows(rows, types)


def ndjson_rows(body, types):
    rows = [json.loads(line) for line in body.decode("utf-8").splitlines() if line]
    # NDJSON leaves a null value out of its object.
    return canonical_rows([{name: row.get(name) for name, _ in types} for row in rows], types)


def arrow_rows(table, types):
    assert table.column_names == [name for name, _ in types], table.column_names
    return canonical_rows(table.to_pylist(), types)


def parquet_rows(body, types):
    return arrow_rows(pyarrow.parquet.read_table(io.BytesIO(body)), types)


def ipc_rows(body, types):
    return arrow_rows(pyarrow.ipc.open_stream(io.BytesIO(body)).read_all(), types)


READERS = {
    "csv": ("text/csv", csv_rows),
    "ndjson": ("application/x-ndjson", ndjson_rows),
    "parquet": ("application/vnd.apache.parquet", parquet_rows),
    "arrow": ("application/vnd.apache.arrow.stream", ipc_rows),
}


def check_format(family, key, fmt, how, expected, limit):
    media, read = READERS[fmt]
    run = f"{family}/things-export/run"
    if how == "query":
        status, headers, body = fetch(f"{run}?format={fmt}&limit={limit}&variables.from_id=1", key)
    elif how == "export":
        # The export operation: the format in the path (what a generated client calls).
        status, headers, body = fetch(f"{run}/{fmt}", key, {"limit": limit, "variables": {"from_id": 1}})
    elif how == "export-get":
        status, headers, body = fetch(f"{run}/{fmt}?limit={limit}&variables.from_id=1", key)
    elif how == "body":
        status, headers, body = fetch(run, key, {"format": fmt, "limit": limit, "variables": {"from_id": 1}})
    else:
        status, headers, body = fetch(f"{run}?limit={limit}", key, accept=f"image/png;q=0.9, {media}")
    assert status == 200, (fmt, how, status, body[:500])
    assert headers["Content-Type"].split(";")[0] == media, headers["Content-Type"]
    assert int(headers["Content-Length"]) == len(body), (headers["Content-Length"], len(body))
    assert headers["X-Endpoint-Version"] == str(expected["endpoint_version"]), headers["X-Endpoint-Version"]
    assert headers["X-Has-More"] == ("true" if expected["hasMore"] else "false"), headers["X-Has-More"]
    assert headers["X-Is-Cached"] == "false"
    assert headers["X-Execution-Id"]
    assert f'filename="things-export.{fmt}"' in headers["Content-Disposition"], headers["Content-Disposition"]
    assert "private" in headers["Cache-Control"], headers["Cache-Control"]
    got = read(body, expected["types"])
    want = canonical_rows(expected["results"], expected["types"])
    assert len(got) == len(want), (fmt, how, len(got), len(want))
    for i, (g, w) in enumerate(zip(got, want)):
        if fmt == "csv":
            # CSV cannot tell an empty string from a null.
            w = {k: (None if v == "" else v) for k, v in w.items()}
        assert g == w, (fmt, how, i, g, w)

    etag = headers["ETag"]
    status, again, body = fetch(f"{run}?format={fmt}&limit={limit}&variables.from_id=1", key,
                                headers=[("If-None-Match", etag)])
    assert (status, body) == (304, b""), (fmt, status, body[:200])
    assert again["ETag"] == etag
    return len(got)


def main():
    with tempfile.TemporaryDirectory() as work, live_server(
        work, "id\n1\n", serve_args=("--max-export-rows", str(EXPORT_CAP))
    ) as (base, project, key):
        upload(base, project, key, "things", table_rows())
        request(f"{base}/api/projects/{project}/endpoints/", key, ENDPOINT)
        checked = 0
        for family in (f"{base}/api/projects/{project}/endpoints", f"{base}/api/environments/{project}/endpoints"):
            for limit in (EXPORT_CAP, 30):
                status, _, body = fetch(f"{family}/things-export/run?limit={limit}&variables.from_id=1", key)
                assert status == 200, body
                expected = json.loads(body)
                assert len(expected["results"]) == limit and expected["hasMore"], expected["hasMore"]
                assert [name for name, _ in expected["types"]] == expected["columns"]
                kinds = [kind for _, kind in expected["types"]]
                assert {"date", "datetime", "decimal", "boolean", "float"} <= set(kinds), kinds
                for fmt in READERS:
                    for how in ("query", "body", "accept", "export", "export-get"):
                        checked += check_format(family, key, fmt, how, expected, limit)

            # What no format fits is refused before anything runs; an explicit format wins over Accept.
            run = f"{family}/things-export/run"
            status, headers, body = fetch(run, key, accept="image/png")
            assert status == 406 and json.loads(body)["code"] == "not_acceptable", (status, body)
            status, headers, _ = fetch(f"{run}?format=csv", key, accept="image/png")
            assert status == 200 and headers["Content-Type"].startswith("text/csv"), status
            status, _, body = fetch(f"{run}?format=xml", key)
            assert status == 400 and json.loads(body)["attr"] == "format", (status, body)
            # An export's path names its format: another one besides is refused, an unknown one is no route.
            status, _, body = fetch(f"{run}/csv", key, {"format": "json"})
            assert status == 400 and json.loads(body)["attr"] == "format", (status, body)
            status, _, body = fetch(f"{run}/csv?format=parquet", key)
            assert status == 400 and json.loads(body)["attr"] == "format", (status, body)
            status, _, body = fetch(f"{run}/xml", key)
            assert status == 404, (status, body)
            # Past the export cap (or JSON's 10,000 rows) is a 400 on the limit.
            status, _, body = fetch(f"{run}?format=csv&limit={EXPORT_CAP + 1}", key)
            assert status == 400 and json.loads(body)["attr"] == "limit", (status, body)

            # JSON answers carry an ETag and a Cache-Control too; a held one is a 304.
            status, headers, body = fetch(f"{run}?limit=5", key)
            assert status == 200 and headers["ETag"] and "max-age=" in headers["Cache-Control"], headers
            status, _, body = fetch(f"{run}?limit=5", key, headers=[("If-None-Match", headers["ETag"])])
            assert (status, body) == (304, b""), status
        print(f"formats: {checked} rows read back in 4 formats, 5 ways of asking, 2 families, all equal to JSON")


if __name__ == "__main__":
    main()
