"""The web console end to end, in a real headless Chromium (Debian's `chromium`, driven by Playwright for Python),
against the real `endpoints` binary over a fresh data directory (`tests/openapi/live_server.py`).

A person's path through the console, each step asserting what they see: sign in with the keyboard (a wrong key
first), create an endpoint with a variable, see the server's validation error at the SQL, fix it, run with a
variable, page, see the chart, save a second version and see the diff, turn materialization on and see it
complete, share, browse and upload tables, see a 429 and a revoked key explained, delete. Every main page is
checked with axe-core (no serious or critical violation) and photographed into `target/console-screenshots/`;
the page must log no Content-Security-Policy violation and throw no error.
"""

import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "openapi"))

from live_server import cli, live_server  # noqa: E402
from playwright.sync_api import expect, sync_playwright  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = os.environ.get("CONSOLE_SCREENSHOTS", "target/console-screenshots")
AXE = os.environ.get("AXE_JS", "console/node_modules/axe-core/axe.min.js")
# Chromium on a machine with no internet: no background connections, no sandbox as root, no GPU.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]
SALES = "day,country,amount\n" + "".join(
    f"2026-03-0{d},{c},{a}\n"
    for d, c, a in [
        (1, "US", 10.5), (1, "GB", 4), (2, "US", 7), (2, "FR", 3), (3, "US", 2.5), (4, "US", 1), (4, "GB", 6),
    ]
)
SQL_V1 = (
    "SELECT day, country, sum(amount) AS total FROM sales WHERE country = {variables.country} "
    "GROUP BY day, country ORDER BY day"
)


class Checks:
    """What the page logged that a person would not see: CSP violations and uncaught errors."""

    def __init__(self, page):
        self.problems = []
        self.step = "start"
        page.on("console", self._console)
        page.on("pageerror", lambda err: self.problems.append(f"[{self.step}] uncaught: {err}"))

    def _console(self, message):
        text = message.text
        if "Content Security Policy" in text or "Refused to" in text:
            self.problems.append(f"[{self.step}] CSP: {text} at {message.location}")
        elif message.type == "error" and "Failed to load resource" not in text:
            self.problems.append(f"[{self.step}] console error: {text}")


def shot(page, name):
    os.makedirs(SCREENSHOTS, exist_ok=True)
    page.screenshot(path=os.path.join(SCREENSHOTS, f"{name}.png"), full_page=True)


def accessible(page, name):
    """axe-core over the page as it is: no serious or critical violation."""
    with open(AXE) as f:
        page.evaluate(f.read())
    violations = page.evaluate(
        "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
        ".filter(v => v.impact === 'serious' || v.impact === 'critical')"
        ".map(v => `${v.id}: ${v.help} (${v.nodes.map(n => n.target.join(' ')).join('; ')})`)"
    )
    assert not violations, f"axe on {name}: {violations}"


def type_sql(page, text):
    editor = page.get_by_test_id("sql-editor")
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    # CodeMirror closes brackets as they are typed; inserting the text is what a paste does.
    page.keyboard.insert_text(text)


def sign_in_with_keyboard(page, base, key):
    page.goto(f"{base}/")
    expect(page).to_have_url(f"{base}/console/")
    expect(page.get_by_role("heading", name="Endpoints console")).to_be_visible()
    accessible(page, "sign-in")
    page.keyboard.press("Tab")
    expect(page.get_by_test_id("api-key")).to_be_focused()
    page.keyboard.type("phx_" + "0" * 64)
    page.keyboard.press("Enter")
    expect(page.get_by_role("alert")).to_contain_text("This API key was not accepted")
    shot(page, "01-sign-in-refused")
    page.get_by_test_id("api-key").fill("")
    page.get_by_test_id("api-key").focus()
    page.keyboard.type(key)
    page.keyboard.press("Tab")
    expect(page.get_by_test_id("project")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.get_by_test_id("sign-in-submit")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_test_id("no-endpoints")).to_contain_text("no endpoints yet")
    # The header names the project (live_server creates it as "Checks"), not the @current typed at sign-in.
    expect(page.get_by_test_id("project-label")).to_have_text("Checks")
    accessible(page, "endpoints-empty")


def create_with_validation(page):
    page.get_by_test_id("new-endpoint").click()
    expect(page).to_have_url(re.compile(r".*/console/endpoints/new$"))
    page.get_by_test_id("endpoint-name").fill("sales-by-day")
    page.get_by_test_id("endpoint-description").fill("Sales per day in one country")
    type_sql(page, SQL_V1)
    # The variable is used but not declared: the server's dry run says so at the SQL.
    expect(page.get_by_test_id("query-error")).to_contain_text("country")
    expect(page.get_by_test_id("undeclared")).to_contain_text("{variables.country}")
    shot(page, "02-editor-validation-error")
    page.get_by_test_id("declare-country").click()
    page.get_by_test_id("decl-default-0").fill("US")
    page.get_by_test_id("decl-required-0").uncheck()
    expect(page.get_by_test_id("query-error")).to_have_count(0)
    columns = page.get_by_test_id("output-columns")
    expect(columns).to_contain_text("day")
    expect(columns).to_contain_text("date")
    expect(columns).to_contain_text("total")
    expect(columns).to_contain_text("float")
    accessible(page, "editor")
    shot(page, "03-editor-valid")
    page.get_by_test_id("save-endpoint").click()
    expect(page.get_by_test_id("endpoint-title")).to_have_text("sales-by-day")
    expect(page.get_by_test_id("current-version")).to_have_text("Version 1")


def run_page_and_chart(page):
    page.get_by_test_id("variable-country").fill("US")
    page.get_by_test_id("run-limit").fill("2")
    page.get_by_test_id("run").click()
    table = page.get_by_test_id("result-table")
    expect(table.locator("tbody tr")).to_have_count(2)
    expect(table).to_contain_text("2026-03-01")
    expect(table).to_contain_text("10.5")
    expect(page.get_by_test_id("run-rows")).to_have_text("Rows 1–2, more follow")
    expect(page.get_by_test_id("run-source")).to_contain_text("computed now")
    accessible(page, "run")
    shot(page, "04-run-table")
    page.get_by_test_id("page-next").click()
    expect(page.get_by_test_id("run-rows")).to_have_text("Rows 3–4")
    expect(table).to_contain_text("2026-03-04")
    expect(table).not_to_contain_text("2026-03-01")
    page.get_by_test_id("page-previous").click()
    expect(page.get_by_test_id("run-rows")).to_have_text("Rows 1–2, more follow")
    # The same page again comes from the cache.
    expect(page.get_by_test_id("run-source")).to_contain_text("cached")
    page.get_by_test_id("variable-country").fill("GB")
    page.get_by_test_id("run-limit").fill("10")
    page.get_by_test_id("run").click()
    expect(page.get_by_test_id("run-rows")).to_have_text("Rows 1–2")
    page.get_by_test_id("view-chart").click()
    chart = page.get_by_test_id("chart")
    expect(chart).to_have_attribute("data-kind", "line")
    expect(chart).to_have_attribute("aria-label", "Line chart of total by day")
    expect(chart.locator("canvas")).to_be_visible()
    accessible(page, "chart")
    shot(page, "05-run-chart")


def second_version_and_diff(page):
    page.get_by_test_id("edit-endpoint").click()
    expect(page.get_by_test_id("output-columns")).to_contain_text("total")
    type_sql(page, SQL_V1.replace("AS total", "AS total, count(*) AS orders"))
    expect(page.get_by_test_id("output-columns")).to_contain_text("orders")
    page.get_by_test_id("save-endpoint").click()
    expect(page.get_by_test_id("current-version")).to_have_text("Version 2")
    page.get_by_test_id("tab-versions").click()
    expect(page.get_by_test_id("version-list").locator("tbody tr")).to_have_count(2)
    diff = page.get_by_test_id("sql-diff")
    changed = diff.locator("tr[data-kind=changed]")
    expect(changed).to_have_count(1)
    expect(changed.locator("td.old")).not_to_contain_text("orders")
    expect(changed.locator("td.new")).to_contain_text("count(*) AS orders")
    expect(page.get_by_test_id("column-change-orders")).to_contain_text("added")
    expect(page.get_by_test_id("column-change-total")).not_to_contain_text("added")
    accessible(page, "versions")
    shot(page, "06-versions-diff")
    # Any version runs: the first one has no `orders` column.
    page.get_by_test_id("run-version-1").click()
    expect(page.get_by_test_id("run-version")).to_have_value("1")
    page.get_by_test_id("run").click()
    expect(page.get_by_test_id("result-table").locator("thead")).not_to_contain_text("orders")
    page.get_by_test_id("run-version").select_option("2")
    page.get_by_test_id("run").click()
    expect(page.get_by_test_id("result-table").locator("thead")).to_contain_text("orders")


def breaking_version(page):
    """Back to the first SQL: `orders` goes, which breaks callers of the endpoint, which ran minutes ago."""
    page.get_by_test_id("nav-endpoints").click()
    page.get_by_test_id("search").fill("by-day")
    page.get_by_test_id("endpoint-row-sales-by-day").get_by_role("link").click()
    page.get_by_test_id("edit-endpoint").click()
    expect(page.get_by_test_id("output-columns")).to_contain_text("orders")
    type_sql(page, SQL_V1)
    warning = page.get_by_test_id("breaking-change")
    expect(warning).to_contain_text("column 'orders' (integer) is removed")
    shot(page, "12-breaking-change")
    # Saving without confirming is refused: the editor stays, saying why.
    page.get_by_test_id("save-endpoint").click()
    expect(warning).to_contain_text("send \"confirm_breaking\": true")
    expect(page.get_by_test_id("save-endpoint")).to_have_text("Save changes")
    page.get_by_test_id("confirm-breaking").check()
    page.get_by_test_id("save-endpoint").click()
    expect(page.get_by_test_id("current-version")).to_have_text("Version 3")
    page.get_by_test_id("tab-versions").click()
    expect(page.get_by_test_id("breaking-3")).to_have_attribute("title", "Breaks callers of the version before: orders (integer) removed.")
    expect(page.get_by_test_id("breaking-2")).to_have_count(0)
    accessible(page, "breaking version")
    shot(page, "12-breaking-version")
    page.get_by_test_id("nav-endpoints").click()


# What the service says of `median(...)` (tests/api/materialization.rs checks the service says it).
REFRESHED_IN_FULL = (
    "its aggregate `median(sales.amount)` cannot be recombined from partial results "
    "(COUNT, SUM, MIN, MAX and AVG can, DISTINCT of one argument without FILTER too), so its final rows are stored"
)


def materialize(page):
    page.get_by_test_id("tab-materialization").click()
    expect(page.get_by_test_id("materialization-status")).to_have_text("Disabled")
    page.get_by_test_id("materialize-on").click()
    expect(page.get_by_test_id("materialization-status")).to_have_text("Completed", timeout=30_000)
    # The stored result holds every country's days: the run filters it.
    expect(page.get_by_test_id("materialized-rows")).to_have_text("7")
    # Its variable filters a group key: stored as a rollup of its keys (partial sums), so appended rows fold in.
    expect(page.get_by_test_id("rollup-grouping")).to_have_text("sales.day, sales.country")
    expect(page.get_by_test_id("sync-frequency")).to_have_value("24hour")
    expect(page.get_by_test_id("freshness")).to_have_value("60")
    expect(page.get_by_test_id("refresh-counts")).to_have_text("1 full, 0 appended rows folded in")
    expect(page.get_by_test_id("fold")).to_have_text("folded in: the query runs over the new rows alone")
    # The freshness is a setting of the endpoint, saved at once.
    page.get_by_test_id("freshness").select_option("5")
    expect(page.get_by_test_id("freshness")).to_have_value("5")
    expect(page.get_by_test_id("freshness")).to_be_enabled()
    # So is when it hibernates, a week without a run unless set; "never" is a null.
    expect(page.get_by_test_id("hibernation")).to_have_value("7")
    expect(page.get_by_test_id("hibernated")).to_have_count(0)
    page.get_by_test_id("hibernation").select_option("never")
    expect(page.get_by_test_id("hibernation")).to_have_value("never")
    expect(page.get_by_test_id("hibernation")).to_be_enabled()
    page.get_by_test_id("hibernation").select_option("30")
    expect(page.get_by_test_id("hibernation")).to_have_value("30")
    accessible(page, "materialization")
    shot(page, "07-materialization")
    # A month without a run is not waited for here: the service's own status, as it reads once the endpoint
    # hibernates, is replayed to the page.
    def asleep(route):
        status = route.fetch().json()
        status.update(status="Hibernating", hibernated_at="2026-11-01T10:00:00Z", next_run_at=None)
        # And as a query whose aggregate no rollup recombines reads: refreshed in full, with the reason.
        status.update(fold="full_refresh_only", fold_reason=REFRESHED_IN_FULL)
        route.fulfill(json=status)

    status_path = re.compile(r".*/endpoints/sales-by-day/materialization_status$")
    page.route(status_path, asleep)
    page.get_by_test_id("hibernation").select_option("7")
    expect(page.get_by_test_id("materialization-status")).to_have_text("Hibernating")
    expect(page.get_by_test_id("hibernated")).to_contain_text("its next run answers live and wakes it")
    expect(page.get_by_test_id("fold")).to_have_text(f"refreshed in full, since {REFRESHED_IN_FULL}")
    shot(page, "07-hibernating")
    page.unroute(status_path)
    page.get_by_test_id("tab-run").click()
    page.get_by_test_id("run").click()
    expect(page.get_by_test_id("run-source")).to_contain_text("materialized")


def logs_and_usage(page):
    """The runs so far (live, cached, materialized) and the refresh, in the Logs and Usage tabs."""
    page.get_by_test_id("tab-logs").click()
    rows = page.get_by_test_id("log-row")
    table = page.get_by_test_id("log-list")
    # Records are written within a second: refresh until they are there, the last run's (materialized) too.
    deadline = time.time() + 15
    while (rows.count() < 6 or "materialized" not in table.inner_text()) and time.time() < deadline:
        time.sleep(0.5)
        page.get_by_test_id("log-refresh").click()
        page.wait_for_timeout(300)
    assert rows.count() >= 6, f"{rows.count()} log rows"
    expect(table).to_contain_text("cache")
    expect(table).to_contain_text("materialized")
    # The country asked for ("GB") is a variable's value: never shown.
    expect(table).not_to_contain_text("GB")
    page.get_by_test_id("log-kind").select_option("refresh")
    expect(rows.first).to_contain_text("refresh")
    for i in range(rows.count()):
        expect(rows.nth(i)).to_contain_text("refresh")
    page.get_by_test_id("log-kind").select_option("")
    expect(rows.first).to_be_visible()
    accessible(page, "logs")
    shot(page, "07b-logs")
    page.get_by_test_id("tab-usage").click()
    expect(page.get_by_test_id("usage-chart").locator("canvas")).to_be_visible()
    requests = int(page.get_by_test_id("usage-requests").inner_text().replace(",", ""))
    assert requests >= 5, requests
    expect(page.get_by_test_id("usage-errors")).to_contain_text("0 (0.0%)")
    shot(page, "07c-usage-by-minute")
    page.get_by_test_id("usage-interval").select_option("hour")
    expect(page.get_by_test_id("usage-chart").locator("canvas")).to_be_visible()
    accessible(page, "usage")
    shot(page, "07d-usage-by-hour")


def share(page, base):
    page.get_by_test_id("tab-share").click()
    expect(page.get_by_test_id("curl")).to_contain_text(f"{base}/api/projects/")
    expect(page.get_by_test_id("curl")).to_contain_text('"variables":{"country":"US"}')
    expect(page.get_by_test_id("curl")).to_contain_text("$ENDPOINTS_API_KEY")
    expect(page.get_by_test_id("typescript")).to_contain_text("export async function runSalesByDay(")
    expect(page.get_by_test_id("typescript")).to_contain_text("orders: number | null;")
    expect(page.get_by_test_id("openapi")).to_contain_text('"openapi": "3.0.3"')
    accessible(page, "share")
    shot(page, "08-share")


def tables(page, work):
    page.get_by_test_id("nav-tables").click()
    row = page.get_by_test_id("table-row-sales")
    expect(row).to_contain_text("7")
    expect(row).to_contain_text("sales-by-day")
    accessible(page, "tables")
    upload = os.path.join(work, "Refunds 2026.csv")
    with open(upload, "w") as f:
        f.write("day,amount\n2026-03-01,2.5\n2026-03-02,1\n")
    page.get_by_test_id("upload-file").set_input_files(upload)
    expect(page.get_by_test_id("upload-name")).to_have_value("Refunds_2026")
    page.get_by_test_id("upload-submit").click()
    expect(page.get_by_test_id("upload-done")).to_have_text("Table Refunds_2026 now holds 2 rows.")
    expect(page.get_by_test_id("table-row-Refunds_2026")).to_contain_text("day date")
    # A file whose columns do not match is refused with the server's reason, and the table stays as it was.
    mismatched = os.path.join(work, "other.csv")
    with open(mismatched, "w") as f:
        f.write("when,what\nx,y\n")
    page.get_by_test_id("upload-file").set_input_files(mismatched)
    page.get_by_text("Append rows").click()
    page.get_by_test_id("upload-submit").click()
    expect(page.get_by_test_id("upload-problem")).to_contain_text("column")
    expect(page.get_by_test_id("table-row-Refunds_2026")).to_contain_text("2")
    shot(page, "09-tables")
    page.get_by_test_id("table-row-sales").get_by_role("link", name="sales", exact=True).click()
    expect(page.get_by_test_id("table-schema")).to_contain_text("amount")
    expect(page.get_by_test_id("result-table").locator("tbody tr")).to_have_count(7)
    accessible(page, "table")
    shot(page, "10-table-preview")


def throttled(page):
    """A 429 reads as a sentence with the wait, not JSON (the answer is the service's own, replayed)."""
    def answer(route):
        route.fulfill(
            status=429,
            headers={"Retry-After": "7", "Content-Type": "application/json"},
            body='{"type":"throttled","code":"rate_limited","detail":"Too many requests for this API key.","attr":null}',
        )

    listing = re.compile(r".*/api/projects/[^/]+/endpoints\?.*")
    page.route(listing, answer)
    page.get_by_test_id("nav-endpoints").click()
    expect(page.get_by_test_id("problem")).to_have_text("Too many requests for now. Try again in 7 seconds.")
    shot(page, "11-throttled")
    page.unroute(listing)


def delete(page):
    page.get_by_test_id("search").fill("by-day")
    page.get_by_test_id("endpoint-row-sales-by-day").get_by_role("link").click()
    page.get_by_test_id("delete-endpoint").click()
    page.get_by_test_id("confirm-delete").click()
    expect(page.get_by_test_id("no-endpoints")).to_be_visible()
    expect(page.get_by_test_id("endpoint-row-sales-by-day")).to_have_count(0)


def revoked(page, data_dir, key_id):
    """A key revoked while the console is open signs the user out with the reason."""
    cli(data_dir, "key", "revoke", key_id)
    # Another process revoked it: the server trusts the key it knows for --key-cache-ms (1 s) more. The user
    # goes on clicking until a page's request is refused.
    notice = page.get_by_test_id("notice")
    for attempt in range(40):
        if notice.count() > 0:
            break
        page.get_by_test_id("nav-tables" if attempt % 2 == 0 else "nav-endpoints").click()
        page.wait_for_timeout(250)
    expect(notice).to_contain_text("not accepted")
    expect(page.get_by_test_id("api-key")).to_be_visible()
    shot(page, "12-signed-out")


def main():
    with tempfile.TemporaryDirectory() as work, live_server(work, SALES, ("--materialize-poll-ms", "200")) as (
        base,
        project,
        key,
    ):
        data_dir = os.path.join(work, "data")
        key_id = next(k["id"] for k in cli(data_dir, "key", "list") if key.startswith(k["prefix"]))
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            context = browser.new_context(viewport={"width": 1280, "height": 860})
            page = context.new_page()
            checks = Checks(page)
            steps = [
                ("sign in with the keyboard", lambda: sign_in_with_keyboard(page, base, key)),
                ("create an endpoint, fixing a validation error", lambda: create_with_validation(page)),
                ("run, page and chart", lambda: run_page_and_chart(page)),
                ("a second version and its diff", lambda: second_version_and_diff(page)),
                ("materialize", lambda: materialize(page)),
                ("logs and usage", lambda: logs_and_usage(page)),
                ("share", lambda: share(page, base)),
                ("tables", lambda: tables(page, work)),
                ("a 429", lambda: throttled(page)),
                ("a breaking version, confirmed", lambda: breaking_version(page)),
                ("delete", lambda: delete(page)),
                ("a revoked key", lambda: revoked(page, data_dir, key_id)),
            ]
            for name, step in steps:
                checks.step = name
                try:
                    step()
                except Exception:
                    shot(page, f"failed-{name.replace(' ', '-')}")
                    raise
                print(f"console: {name}: ok")
            assert not checks.problems, "\n".join(checks.problems)
            browser.close()
    print(f"console: every step passed; screenshots in {SCREENSHOTS}/")


if __name__ == "__main__":
    main()
