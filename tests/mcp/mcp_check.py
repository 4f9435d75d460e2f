"""`/mcp` from outside, with the official MCP Python SDK (`mcp`, pinned in the Makefile) as the client, against
the real `endpoints` binary (`tests/openapi/live_server.py`): list the tools, call one with variables and compare
its rows with the REST run's, call with a bad variable, past the query timeout, past a run token's rate and on an
unknown endpoint (tool errors with the REST codes), see the list follow the endpoints, call with a read-only key
and with a run token (its endpoints only, its fixed variables gone from the input schema and refused), and
without credentials (401).
"""

import asyncio
import json
import os
import sys
import tempfile
import urllib.error
import urllib.request

import httpx2
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "openapi"))

from live_server import cli, live_server, request  # noqa: E402

SALES = "day,country,amount\n2026-03-01,US,10.5\n2026-03-01,GB,4\n2026-03-02,US,7\n2026-03-02,FR,3\n"
BY_DAY = {
    "name": "sales-by-day",
    "description": "Sales per day in one country",
    "query": {
        "kind": "SQLQuery",
        "query": "SELECT day, sum(amount) AS total, count(*) AS orders FROM sales WHERE country = {variables.country} "
                 "AND amount >= {variables.min_amount} GROUP BY day ORDER BY day",
        "variables": {
            "country": {"type": "String", "required": True, "description": "ISO country code"},
            "min_amount": {"type": "Number", "default": 0},
        },
    },
}
PLAIN = {"name": "countries", "query": {"kind": "SQLQuery", "query": "SELECT DISTINCT country FROM sales ORDER BY country"}}
INACTIVE = {"name": "retired", "is_active": False, "query": {"kind": "SQLQuery", "query": "SELECT 1 AS one"}}
# Cancelled by the server's one-second query timeout.
SLOW = {"name": "slow", "query": {"kind": "SQLQuery",
                                  "query": "SELECT count(*) AS n FROM generate_series(1, 50000000000) AS t(v) WHERE v % 7 = 3"}}


async def with_session(url, credential, work):
    headers = {"Authorization": f"Bearer {credential}"}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await work(session)


def tool_named(tools, name):
    return next(t for t in tools.tools if t.name == name)


async def main_async(base, project, key, reader, loader, token, slow_token):
    url = f"{base}/mcp"
    endpoints = f"{base}/api/projects/{project}/endpoints"

    async def as_writer(session):
        tools = await session.list_tools()
        names = sorted(t.name for t in tools.tools)
        assert names == ["run_countries", "run_sales-by-day", "run_slow"], names
        tool = tool_named(tools, "run_sales-by-day")
        assert tool.description == "Sales per day in one country", tool
        schema = tool.input_schema
        assert schema["properties"]["country"]["type"] == "string", schema
        assert schema["properties"]["country"]["description"] == "ISO country code", schema
        assert schema["required"] == ["country"], schema
        assert schema["additionalProperties"] is False, schema
        rows = tool.output_schema["properties"]["rows"]["items"]["properties"]
        assert set(rows) == {"day", "total", "orders"}, tool.output_schema
        assert "integer" in rows["orders"]["type"], rows

        result = await session.call_tool("run_sales-by-day", {"country": "US", "min_amount": 5})
        assert not result.is_error, result
        rest = request(f"{endpoints}/sales-by-day/run", key, {"variables": {"country": "US", "min_amount": 5}})
        assert result.structured_content["rows"] == rest["results"], (result.structured_content, rest["results"])
        assert json.loads(result.content[0].text) == result.structured_content
        assert result.structured_content["has_more"] is False
        print("mcp: list tools, call one, same rows as the REST run: ok")

        for arguments, code, attr in [
            ({"country": "US", "nope": 1}, "unknown_variable", "variables.nope"),
            ({"country": "US", "min_amount": "lots"}, "invalid", "variables.min_amount"),
            ({}, "required", "variables.country"),
        ]:
            bad = await session.call_tool("run_sales-by-day", arguments)
            assert bad.is_error, bad
            body = json.loads(bad.content[0].text)
            assert (body["code"], body["attr"]) == (code, attr), body
        slow = await session.call_tool("run_slow", {})
        assert slow.is_error and json.loads(slow.content[0].text)["code"] == "query_timeout", slow
        unknown = await session.call_tool("run_nothing", {})
        assert unknown.is_error and json.loads(unknown.content[0].text)["code"] == "not_found", unknown
        print("mcp: bad variables, a timeout and an unknown endpoint are tool errors with the REST codes: ok")

        # The list follows the endpoints: a new one is listed, a deactivated or deleted one is not.
        request(endpoints, key, {"name": "added", "query": {"kind": "SQLQuery", "query": "SELECT 2 AS two"}})
        request(f"{endpoints}/countries", key, {"is_active": False}, method="PATCH")
        listed = sorted(t.name for t in (await session.list_tools()).tools)
        assert listed == ["run_added", "run_sales-by-day", "run_slow"], listed
        request(f"{endpoints}/added", key, method="DELETE")
        request(f"{endpoints}/countries", key, {"is_active": True}, method="PATCH")
        listed = sorted(t.name for t in (await session.list_tools()).tools)
        assert listed == names, listed
        print("mcp: the list follows created, deactivated and deleted endpoints: ok")
        return names

    async def list_names(session):
        return sorted(t.name for t in (await session.list_tools()).tools)

    async def as_reader(session):
        names = sorted(t.name for t in (await session.list_tools()).tools)
        result = await session.call_tool("run_countries", {})
        assert not result.is_error and [r["country"] for r in result.structured_content["rows"]] == ["FR", "GB", "US"]
        return names

    async def as_token(session):
        tools = await session.list_tools()
        assert [t.name for t in tools.tools] == ["run_sales-by-day"], tools
        schema = tool_named(tools, "run_sales-by-day").input_schema
        assert "country" not in schema["properties"] and "country" not in schema.get("required", []), schema
        result = await session.call_tool("run_sales-by-day", {})
        assert not result.is_error, result
        assert [r["day"] for r in result.structured_content["rows"]] == ["2026-03-02"], result.structured_content
        widened = await session.call_tool("run_sales-by-day", {"country": "US"})
        assert widened.is_error and json.loads(widened.content[0].text)["code"] == "fixed_variable", widened
        other = await session.call_tool("run_countries", {})
        assert other.is_error and json.loads(other.content[0].text)["code"] == "permission_denied", other
        print("mcp: a run token lists and runs its endpoint only, its fixed variable gone and refused: ok")

    async def as_slow_token(session):
        # The token's own rate: two a second, in bursts of four. Every message counts (initialize and its
        # notification, the SDK's own list of the tools before its first call), so the budget runs out within
        # four calls.
        results = [await session.call_tool("run_sales-by-day", {}) for _ in range(4)]
        assert not results[0].is_error, results[0]
        body = json.loads(results[-1].content[0].text)
        assert results[-1].is_error and body["code"] == "rate_limited" and "run token" in body["detail"], body
        # Listing takes from the same budget: over it, the list is a JSON-RPC error carrying the 429 body.
        try:
            await session.list_tools()
            raise AssertionError("a list over the token's rate was answered")
        except MCPError as err:
            assert err.error.data["code"] == "rate_limited", err.error
        print("mcp: over the token's rate, a call is a tool error and a list a JSON-RPC error, with the REST code: ok")

    writer_names = await with_session(url, key, as_writer)
    reader_names = await with_session(url, reader, as_reader)
    assert reader_names == writer_names, reader_names
    print("mcp: a read key lists and calls the same tools: ok")
    assert await with_session(url, loader, list_names) == [], "a key that may not run endpoints lists no tool"
    await with_session(url, token, as_token)
    await with_session(url, slow_token, as_slow_token)

    listing = b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
    both = "application/json, text/event-stream"
    for credential in [None, "phx_" + "0" * 64, token[:-2] + "xx"]:
        status, headers, body = raw(url, credential, "POST", listing, "application/json", both)
        assert status == 401 and body["code"] == "not_authenticated", (status, body)
        assert headers["WWW-Authenticate"] == "Bearer"
    print("mcp: no, an unknown or a forged credential: 401: ok")

    # What is not an MCP request gets the REST API's error bodies, never the transport's plain text.
    for method, data, content_type, accept, status, code in [
        ("GET", None, None, "text/event-stream", 405, "method_not_allowed"),
        ("DELETE", None, None, both, 405, "method_not_allowed"),
        ("POST", listing, "text/plain", both, 415, "unsupported_media_type"),
        ("POST", b"{nope", "application/json", both, 400, "parse_error"),
        ("POST", listing, "application/json", "application/json", 406, "not_acceptable"),
        ("POST", b'[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]', "application/json", both, 400, "invalid"),
        ("POST", b'{"x":"' + b"a" * 2_000_000 + b'"}', "application/json", both, 413, "payload_too_large"),
    ]:
        got, headers, body = raw(url, key, method, data, content_type, accept)
        assert (got, body["code"]) == (status, code), (method, content_type, accept, got, body)
        assert headers["Content-Type"] == "application/json", headers
    print("mcp: wrong methods, media types and bodies: JSON errors with the REST codes: ok")


def raw(url, credential, method, data, content_type, accept):
    """One HTTP request to `/mcp` that is expected to be refused: `(status, headers, JSON body)`."""
    req = urllib.request.Request(url, data=data, method=method)
    for name, value in [("Authorization", credential and f"Bearer {credential}"), ("Content-Type", content_type),
                        ("Accept", accept)]:
        if value:
            req.add_header(name, value)
    try:
        urllib.request.urlopen(req, timeout=10)
    except urllib.error.HTTPError as err:
        return err.code, err.headers, json.loads(err.read())
    raise AssertionError(f"{method} {content_type} {accept} was answered")


def main():
    serve_args = ["--query-timeout-secs", "1"]
    with tempfile.TemporaryDirectory() as work, live_server(work, SALES, serve_args) as (base, project, key):
        data_dir = os.path.join(work, "data")
        for endpoint in (BY_DAY, PLAIN, INACTIVE, SLOW):
            request(f"{base}/api/projects/{project}/endpoints", key, endpoint)
        reader = cli(data_dir, "key", "create", "--project", str(project), "--scope", "endpoint:read")["key"]
        loader = cli(data_dir, "key", "create", "--project", str(project), "--scope", "table:write")["key"]
        token = request(f"{base}/api/projects/{project}/run_tokens", key, {
            "endpoints": ["sales-by-day"], "fixed_variables": {"country": "FR"},
        })["token"]
        slow_token = request(f"{base}/api/projects/{project}/run_tokens", key, {
            "endpoints": ["sales-by-day"], "fixed_variables": {"country": "FR"}, "rate_limit_per_sec": 2,
        })["token"]
        asyncio.run(main_async(base, project, key, reader, loader, token, slow_token))
    print("mcp: every check passed")


if __name__ == "__main__":
    main()
