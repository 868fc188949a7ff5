"""The Airflow UI as a person uses it: log in, trigger the penguin DAG from its form, watch it finish.

A real Airflow (api-server, scheduler, dag-processor, LocalExecutor, SQLite) on loopback, driven
by Playwright in Debian's chromium. Screenshots land in test-artifacts/browser/.
"""
import os
import shutil
import time
import urllib.parse
from pathlib import Path

import pytest

from airflow_stack import PASSWORD, USERNAME

CHROMIUM = "/usr/bin/chromium"
# The UI is at an IP literal. Even with background networking, component updates and sync off, Chromium looked up
# update.googleapis.com, accounts.google.com and content-autofill.googleapis.com (strace, 2026-11-25): every
# name now resolves to nothing, so it reaches no host but the Airflow under test.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--disable-features=AutofillServerCommunication"]
SHOTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "browser"
RUN_TIMEOUT_S = 600

if not os.path.exists(CHROMIUM):
    pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium", pytrace=False)


@pytest.fixture(scope="module")
def page(stack):
    from playwright.sync_api import sync_playwright

    shutil.rmtree(SHOTS, ignore_errors=True)
    SHOTS.mkdir(parents=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(120_000)  # a loaded 2-core CI machine is slow to render
        page.goto(f"{stack.url}/dags/penguin")
        page.get_by_label("Username").fill(USERNAME)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url("**/dags/penguin")
        page.get_by_text("finish_run").first.wait_for()  # the DAG's task list is shown
        page.screenshot(path=SHOTS / "01-dag.png")
        yield page
        browser.close()


def _open_trigger_form(page, stack):
    page.goto(f"{stack.url}/dags/penguin")
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_text("Run Parameters").wait_for()
    return dialog


def _choose(page, dialog, field: str, value: str):
    """Pick `value` in the select whose hidden input is element_<field>."""
    row = dialog.locator(f"input[name=element_{field}]").locator("xpath=..")
    row.get_by_role("combobox").click()
    page.get_by_role("option", name=value, exact=True).click()


def _trigger(page, dialog) -> str:
    """Press the dialog's Trigger button; return the run id from the POST the form sends.

    The run id comes from the UI's own request, not from the URL it navigates to: the UI navigates
    only after refetching the DAG page's queries, which on a loaded 2-core CI machine took over a
    minute once. An error reply fails here with the server's message.
    """
    def is_trigger_post(response) -> bool:
        return response.request.method == "POST" and response.url.endswith("/api/v2/dags/penguin/dagRuns")

    with page.expect_response(is_trigger_post) as posted:
        dialog.get_by_role("button", name="Trigger").click()
    response = posted.value
    assert response.ok, f"trigger refused: HTTP {response.status} {response.text()}"
    return response.json()["dag_run_id"]


def test_form_trigger_runs_the_pipeline_with_exactly_those_values(page, stack):
    from hpml.pipelines import records

    dialog = _open_trigger_form(page, stack)
    # The form explains itself: titles, descriptions and enum choices come from the Params.
    for text in ("Distribution strategy", "Rematerialisation (gpipe)", "Full passes over the train split."):
        assert dialog.get_by_text(text).first.is_visible(), text
    dialog.locator("input[name=element_epochs]").fill("2")
    _choose(page, dialog, "strategy", "mirrored")
    dialog.screenshot(path=SHOTS / "02-trigger-form.png")
    run_id = _trigger(page, dialog)

    run = stack.wait_for_run("penguin", run_id, RUN_TIMEOUT_S)
    page.goto(f"{stack.url}/dags/penguin/runs/{urllib.parse.quote(run_id, safe='')}")
    page.get_by_text("finish_run").first.wait_for()
    page.screenshot(path=SHOTS / "03-finished-run.png", full_page=True)
    assert run["state"] == "success", (stack.task_states("penguin", run_id), stack.logs)
    assert run["conf"]["epochs"] == 2 and run["conf"]["strategy"] == "mirrored"

    mlflow_run_id = records.find("airflow.run_id", run_id, "penguin")
    summary = records.load(mlflow_run_id)
    assert summary.params["epochs"] == "2" and summary.params["strategy"] == "mirrored"
    assert summary.params["batch_size"] == "32", "untouched fields keep their defaults"
    assert summary.tags["hpml.strategy"] == "mirrored"
    assert len(records.history(mlflow_run_id, "loss")) == 2


def test_form_refuses_invalid_values(page, stack):
    dialog = _open_trigger_form(page, stack)
    epochs = dialog.locator("input[name=element_epochs]")
    epochs.fill("0")
    dialog.locator("input[name=element_batch_size]").click()
    assert epochs.input_value() == "1", "the form holds epochs to its minimum"

    # What the schema cannot say (allowed data roots) is refused by the run's first task, before any work.
    data_path = dialog.locator("input[name=element_data_path]")
    data_path.fill("/etc/passwd")
    data_path.blur()  # commit the field before the click, so no re-render lands between press and release
    run_id = _trigger(page, dialog)
    run = stack.wait_for_run("penguin", run_id, RUN_TIMEOUT_S)
    assert run["conf"]["data_path"] == "/etc/passwd" and run["conf"]["epochs"] == 1, run["conf"]
    assert run["state"] == "failed"
    states = stack.task_states("penguin", run_id)
    assert states["start_run"] == "failed" and states["ExampleGen"] == "upstream_failed"
    page.goto(f"{stack.url}/dags/penguin/runs/{urllib.parse.quote(run_id, safe='')}/tasks/start_run")
    message = page.get_by_text("outside the allowed data roots").first
    message.wait_for()
    page.screenshot(path=SHOTS / "04-refused-value.png", full_page=True)

