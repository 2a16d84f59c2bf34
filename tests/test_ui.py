"""End to end through the Prefect UI in headless Chromium: open the `adhoc` deployment, start a custom
run from its form (workloads narrowed to seed_mlp in the enum list, a short time budget, one measuring
process), wait for the run to complete, and find the seed_mlp row in the report artifact rendered by
the UI. CPU only, as in CI.

Needs Debian's chromium and the playwright Python package (never `playwright install`):
    apt-get install -y chromium && pip install playwright
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from .ui_helpers import BROWSER_ARGS, PageDiagnostics, chromium_path, deployment_id, served_for_ui, tail, wait_for_final_state

playwright_api = pytest.importorskip("playwright.sync_api", reason="needs `pip install playwright`")
expect = playwright_api.expect

pytestmark = pytest.mark.slow

TIMEOUT_MS = 90_000  # generous: the server and the UI are slow on a 2-core CI machine
SEED_CONFIG = "batch_size=1, dtype=float32, width=128"
NUMBER_WITH_CI = re.compile(r"\d+(\.\d+)? \[\d+(\.\d+)?, \d+(\.\d+)?\]")
LATEST_SCREENSHOTS = {"form": Path("/tmp/ui-form.png"), "artifact": Path("/tmp/ui-artifact.png")}


@pytest.fixture(scope="module")
def ui_served(tmp_path_factory):
    home = tmp_path_factory.mktemp("prefect")
    work = tmp_path_factory.mktemp("work")
    with served_for_ui(home, work) as api:
        yield SimpleNamespace(api=api, base=api.removesuffix("/api"), home=home, work=work)


@pytest.fixture(scope="module")
def browser():
    executable = chromium_path()
    if executable is None:
        pytest.skip("needs Debian's chromium: apt-get install -y chromium")
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=BROWSER_ARGS, timeout=120_000)
        yield browser
        browser.close()


def form_property(page, label: str):
    """The schema-form property whose own label is `label` (not an enclosing object's)."""
    return page.get_by_text(label, exact=True).locator(
        "xpath=ancestor::div[contains(concat(' ', normalize-space(@class), ' '), ' schema-form-property ')][1]"
    )


def submit_the_form(page, deployment: str, tries: int = 3):
    """Submit, and submit again as a user would while the server answers 503: Prefect's SQLite server
    says so when a write meets another (SQLITE_BUSY), and its own client retries on it; the UI does not."""
    for attempt in range(tries):
        if attempt:
            page.wait_for_timeout(2_000)
        with page.expect_response(
            lambda r: r.request.method == "POST" and r.url.endswith(f"/deployments/{deployment}/create_flow_run")
        ) as created:
            page.get_by_role("button", name="Submit", exact=True).click()
        if created.value.status != 503:
            break
    return created.value


def screenshot(page, path: Path, name: str) -> None:
    page.screenshot(path=str(path))
    shutil.copyfile(path, LATEST_SCREENSHOTS[name])


@pytest.mark.timeout(900)
def test_a_custom_run_from_the_ui_form_completes_and_its_report_renders(ui_served, browser, tmp_path):
    expect.set_options(timeout=TIMEOUT_MS)
    context = browser.new_context(viewport={"width": 1400, "height": 2300})
    context.set_default_timeout(TIMEOUT_MS)
    context.set_default_navigation_timeout(TIMEOUT_MS)
    page = context.new_page()
    diagnostics = PageDiagnostics(page)
    logs = {"serve.log": ui_served.work / "serve.log", "server.log": ui_served.home / "server.log"}
    try:
        drive_the_ui(page, ui_served, tmp_path)
    except BaseException:
        print("\n=== UI test diagnostics ===\n" + diagnostics.report(tmp_path / "failure.png", logs))
        raise
    finally:
        context.close()


def drive_the_ui(page, served, tmp_path: Path) -> None:
    api, base = served.api, served.base

    # a. the adhoc deployment's page
    adhoc = deployment_id(api, "replaybench/adhoc")
    page.goto(f"{base}/deployments/deployment/{adhoc}")
    expect(page.get_by_text("flows/benchmark.py:benchmark")).to_be_visible()  # the deployment's entrypoint

    # b. Run -> Custom run
    page.get_by_role("button", name="Run", exact=True).click()
    page.get_by_text("Custom run", exact=True).click()
    expect(page).to_have_url(re.compile(rf"/deployments/deployment/{adhoc}/run"))

    # c. the form: wait until it holds the schema's defaults, then change three parameters
    precision = form_property(page, "Precision (Optional)").locator("input")
    expect(precision).to_have_value("0.02")
    workloads = form_property(page, "Workloads (Optional)")
    select = workloads.get_by_role("button", name="No items selected")
    seed_mlp = page.get_by_role("option", name="seed_mlp", exact=True)
    select.focus()
    page.keyboard.press("ArrowDown")  # opens the list; a plain click does not, in this UI version
    try:
        expect(seed_mlp).to_be_visible(timeout=10_000)
    except AssertionError:
        select.click()
        expect(seed_mlp).to_be_visible()
    expect(page.get_by_role("option")).to_have_count(11)  # every registered workload is offered
    seed_mlp.click()
    page.get_by_text("Parameters", exact=True).first.click()  # closes the list
    expect(page.get_by_role("option")).to_have_count(0)
    expect(workloads.get_by_text("seed_mlp", exact=True)).to_be_visible()  # the chosen item's tag
    time_budget = form_property(page, "Time Budget S (Optional)").locator("input")
    processes = form_property(page, "Processes (Optional)").locator("input")
    time_budget.fill("0.3")
    processes.fill("1")
    expect(time_budget).to_have_value("0.3")
    expect(processes).to_have_value("1")
    screenshot(page, tmp_path / "ui-form.png", "form")

    # d. submit; the browser's POST names the new flow run
    created = submit_the_form(page, adhoc)
    assert created.ok, created.text()
    flow_run_id = created.json()["id"]
    submitted = httpx.get(f"{api}/flow_runs/{flow_run_id}", timeout=30).json()
    assert submitted["deployment_id"] == adhoc
    assert "trigger" not in submitted["parameters"]  # the form cannot label a run nightly
    assert submitted["parameters"]["parameters"]["workloads"] == ["seed_mlp"]
    assert submitted["parameters"]["parameters"]["time_budget_s"] == 0.3
    assert submitted["parameters"]["parameters"]["processes"] == 1

    final = wait_for_final_state(api, flow_run_id)
    assert final["state_type"] == "COMPLETED", (
        f"flow run {final['state_name']}: {final['state']['message']}\n" + tail(served.work / "serve.log")
    )
    page.goto(f"{base}/runs/flow-run/{flow_run_id}")
    expect(page.get_by_text("Completed", exact=True).first).to_be_visible()

    # e. the run's Artifacts tab -> the report artifact, rendered
    page.get_by_role("tablist").get_by_text("Artifacts", exact=True).click()
    page.get_by_role("link").filter(has_text="replaybench-report").first.click()
    expect(page).to_have_url(re.compile(r"/artifacts/artifact/[0-9a-f-]{36}$"))
    (artifact,) = httpx.post(
        f"{api}/artifacts/filter",
        json={"artifacts": {"flow_run_id": {"any_": [flow_run_id]}, "key": {"any_": ["replaybench-report"]}}},
        timeout=30,
    ).json()
    assert page.url.endswith(artifact["id"])
    expect(page.get_by_role("heading", name="seed_mlp", exact=True)).to_be_visible()
    row = (
        page.get_by_role("row")
        .filter(has=page.get_by_role("cell", name=SEED_CONFIG, exact=True))
        .filter(has=page.get_by_role("cell", name="eager", exact=True))
        .first
    )
    expect(row).to_be_visible()
    expect(row).to_contain_text(NUMBER_WITH_CI)  # a measured throughput with its confidence interval
    screenshot(page, tmp_path / "ui-artifact.png", "artifact")
