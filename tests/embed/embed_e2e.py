"""A run token used from a page of another origin, in a real headless Chromium (Debian's `chromium`, driven by
Playwright), against the real `endpoints` binary: `docs/examples/embed.html`, served by this script on loopback,
charts one customer's rows when its origin is allowed, and is refused by the browser when it is not.
Screenshots go to `target/console-screenshots/embed-*.png`.
"""

import contextlib
import functools
import http.server
import os
import sys
import tempfile
import threading

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "openapi"))

from live_server import cli, free_port, live_server, request  # noqa: E402
from playwright.sync_api import expect, sync_playwright  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = os.environ.get("CONSOLE_SCREENSHOTS", "target/console-screenshots")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]
PAGES = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "examples")
SALES = "day,country,amount\n2026-03-01,US,10.5\n2026-03-01,GB,4\n2026-03-02,US,7\n2026-03-02,FR,3\n"


@contextlib.contextmanager
def static_site():
    """`docs/examples` on a loopback port of its own: an origin other than the API's."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=PAGES)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def shot(page, name):
    os.makedirs(SCREENSHOTS, exist_ok=True)
    page.screenshot(path=os.path.join(SCREENSHOTS, f"{name}.png"), full_page=True)


def main():
    with tempfile.TemporaryDirectory() as work, live_server(work, SALES) as (base, project, key):
        data_dir = os.path.join(work, "data")
        endpoints = f"{base}/api/projects/{project}/endpoints"
        request(endpoints, key, {
            "name": "my-sales",
            "query": {
                "kind": "SQLQuery",
                "query": "SELECT day, sum(amount) AS total FROM sales WHERE country = {variables.country} "
                         "GROUP BY day ORDER BY day",
                "variables": {"country": {"type": "String", "required": True}},
            },
        })
        token = request(f"{base}/api/projects/{project}/run_tokens", key, {
            "endpoints": ["my-sales"], "fixed_variables": {"country": "US"}, "expires_in_seconds": 600,
        })["token"]
        with static_site() as allowed, static_site() as other, sync_playwright() as p:
            cli(data_dir, "project", "update", "--project", str(project), "--allow-origin", allowed)
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 800, "height": 400})
            errors = []
            page.on("pageerror", lambda err: errors.append(str(err)))
            fragment = f"#api={base}&project={project}&endpoint=my-sales&token={token}"

            # An allowed origin: the customer's two days of US sales, and nothing of other countries.
            page.goto(f"{allowed}/embed.html{fragment}")
            expect(page.locator("body")).to_have_attribute("data-state", "loaded")
            expect(page.locator("#status")).to_have_text("2 rows of my-sales")
            expect(page.locator("#chart rect")).to_have_count(2)
            expect(page.locator("#chart")).to_contain_text("2026-03-01: 10.5")
            expect(page.locator("#chart")).to_contain_text("2026-03-02: 7")
            expect(page.locator("#chart")).to_have_attribute("aria-label", "Bar chart of total by day")
            shot(page, "embed-allowed-origin")
            print("embed: an allowed origin charts its customer's rows: ok")

            # Another origin: the browser keeps the answer from the page.
            page.goto(f"{other}/embed.html{fragment}")
            expect(page.locator("body")).to_have_attribute("data-state", "failed")
            expect(page.locator("#status")).to_contain_text("refused")
            expect(page.locator("#chart rect")).to_have_count(0)
            shot(page, "embed-other-origin")
            print("embed: another origin is blocked by the browser: ok")

            # The token cannot be widened from the page: a variable it fixes is refused by the service.
            answer = page.evaluate(
                """async ([api, project, token]) => {
                    const r = await fetch(`${api}/api/projects/${project}/endpoints/my-sales/run`, {
                        method: "POST",
                        headers: {Authorization: `Bearer ${token}`, "Content-Type": "application/json"},
                        body: JSON.stringify({variables: {country: "FR"}}),
                    }).catch((e) => null);
                    return r && {status: r.status, body: await r.json()};
                }""",
                [base, project, token],
            )
            assert answer is None, "another origin read an answer"
            page.goto(f"{allowed}/embed.html{fragment}")
            expect(page.locator("body")).to_have_attribute("data-state", "loaded")
            answer = page.evaluate(
                """async ([api, project, token]) => {
                    const r = await fetch(`${api}/api/projects/${project}/endpoints/my-sales/run`, {
                        method: "POST",
                        headers: {Authorization: `Bearer ${token}`, "Content-Type": "application/json"},
                        body: JSON.stringify({variables: {country: "FR"}}),
                    });
                    return {status: r.status, body: await r.json()};
                }""",
                [base, project, token],
            )
            assert answer["status"] == 400 and answer["body"]["code"] == "fixed_variable", answer
            print("embed: a fixed variable cannot be sent from the page: ok")
            assert not errors, errors
            browser.close()
    print(f"embed: every step passed; screenshots in {SCREENSHOTS}/")


if __name__ == "__main__":
    main()
