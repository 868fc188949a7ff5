"""The Airflow UI as a person uses it: log in, trigger the penguin DAG from its form, watch it finish.

A real Airflow (api-server, scheduler, dag-processor, LocalExecutor, SQLite) on loopback, driven
by Playwright in Debian's chromium. Screenshots land in test-artifacts/browser/.
"""
import json
import os
import shutil
import signal
import time
import urllib.parse
from pathlib import Path

import pytest

from airflow_stack import OUTSIDER, OUTSIDER_PASSWORD, PASSWORD, USERNAME, quote_run_id

CHROMIUM = "/usr/bin/chromium"
# The UI is at an IP literal. Even with background networking, component updates and sync off, Chromium looked up
# update.googleapis.com, accounts.google.com and content-autofill.googleapis.com (strace, 2026-11-25): every
# name now resolves to nothing, so it reaches no host but the Airflow under test.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                 "--disable-features=AutofillServerCommunication"]
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

    # The Trainer's log, as the UI shows it: hpml's own lines, and none of TensorFlow's native start-up lines (an
    # error-level "failed call to cuInit" on every CPU machine).
    log = stack.task_log("penguin", run_id, "Trainer")
    ours = [line for line in log if not line.startswith(("::", "/", "task ", "airflow."))]  # after Airflow's own
    assert ours and ours[0] == "hpml.runner Trainer: starting", log
    assert not [line for line in ours if line.startswith(("absl ", "tensorflow "))], "libraries' info lines"
    for noise in ("cuInit", "E0000 ", "cudart_stub", "absl::InitializeLog", "cpu_feature_guard"):
        assert not [line for line in log if noise in line], (noise, log)


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



@pytest.fixture(scope="module")
def training_run(page, stack):
    """A penguin run triggered from the form: two workers under MultiWorkerMirrored, long enough to watch it train,
    kill a worker and see it resume (~580 steps at ~20 a second)."""
    dialog = _open_trigger_form(page, stack)
    dialog.locator("input[name=element_epochs]").fill("10")
    dialog.locator("input[name=element_batch_size]").fill("4")
    dialog.locator("input[name=element_num_workers]").fill("2")
    # One step per call, pinned from the form: the tuned step would train this tiny model too fast to watch.
    dialog.locator("input[name=element_steps_per_execution]").fill("1")
    _choose(page, dialog, "strategy", "multi_worker_mirrored")
    return _trigger(page, dialog)


def _wait_for_task(stack, run_id: str, task_id: str, state: str, timeout: float = RUN_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = stack.task_states("penguin", run_id)
        if states.get(task_id) == state:
            return
        assert "failed" not in states.values(), states
        time.sleep(0.5)
    raise TimeoutError(f"{task_id} of {run_id} never {state}: {stack.task_states('penguin', run_id)}")


def _step(view) -> int:
    return int(view.locator('[data-fact="step"]').inner_text().split("/")[0])


def _epoch(view) -> int:
    return int(view.locator('[data-fact="epoch"]').inner_text().split("/")[0])


def _worker_pids(run_id: str, timeout: float = RUN_TIMEOUT_S) -> dict:
    """The Trainer's worker processes of run `run_id`, from the pids.json its local launcher writes beside the job."""
    from hpml.components.trainer.progress_state import working_dir_for
    from hpml.pipelines import records
    from hpml.pipelines.runner import output_uri

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        mlflow_run_id = records.find("airflow.run_id", run_id, "penguin")
        if mlflow_run_id:
            run_dir = records.load(mlflow_run_id).tags["hpml.run_dir"]
            path = os.path.join(working_dir_for(output_uri(run_dir, "Trainer", "model")), "pids.json")
            if os.path.exists(path):
                try:
                    return {name: pid for name, pid in json.load(open(path)).items() if name.startswith("worker")}
                except ValueError:  # caught mid-write
                    pass
        time.sleep(0.5)
    raise TimeoutError(f"no worker pids for {run_id}")


def test_the_report_view_shows_training_advance_a_killed_worker_resume_then_the_finished_report(
        page, stack, training_run):
    """The run's Report tab, as a user opens it from the run's page. While the Trainer runs, its step, epoch and
    ETA redraw without a reload; when a worker is SIGKILLed, the tab lists the restart with its reason and the step
    moves on from the backup; once the run finishes, the tab shows the run's report."""
    run_id = training_run
    _wait_for_task(stack, run_id, "Trainer", "running")
    page.goto(f"{stack.url}/dags/penguin/runs/{urllib.parse.quote(run_id, safe='')}")
    page.get_by_role("link", name="Report", exact=True).click()  # the plugin's tab on the run's page
    view = page.frame_locator("iframe").first
    view.locator('[data-fact="step"]').wait_for()
    first = _step(view)
    assert view.locator('tr[data-node="Trainer"] td').nth(1).inner_text() == "running"
    deadline = time.monotonic() + 120
    while _step(view) <= first and time.monotonic() < deadline:
        time.sleep(0.5)
    later = _step(view)
    assert later > first, "the step redraws while the Trainer trains"
    epoch = view.locator('[data-fact="epoch"]').inner_text()
    assert epoch.endswith("/10") and int(epoch.split("/")[0]) >= 1, epoch
    assert view.locator('[data-fact="ETA"]').inner_text() not in ("", "measuring")
    view.locator('svg[aria-label="loss per step"]').wait_for()
    assert "tensorboard --logdir" in view.locator("#links").inner_text()

    deadline = time.monotonic() + 180
    while _epoch(view) < 3 and time.monotonic() < deadline:  # a backup (each epoch's end) to resume from
        time.sleep(0.2)
    assert _epoch(view) >= 3, "training runs before the kill"
    view.locator('svg[aria-label="loss per epoch"]').wait_for()
    stall = view.locator('[data-fact="input stall"]').inner_text()  # measured at the end of the first epoch
    assert stall.endswith("%") and 0 <= float(stall[:-1]) < 100, stall
    assert view.locator("#input-stall").inner_text().startswith("Input stall: "), "in plain words, live"
    page.screenshot(path=SHOTS / "05-report-view-training.png")
    workers = _worker_pids(run_id)
    assert sorted(workers) == ["worker-0", "worker-1"], workers
    os.kill(workers["worker-1"], signal.SIGKILL)

    view.get_by_text("1 restart(s):").wait_for(timeout=180_000)
    reason = view.locator("#training li").first.inner_text()
    assert "worker-1" in reason and "-9" in reason, reason
    view.get_by_text("Resumed from step").wait_for(timeout=180_000)
    resumed = _step(view)
    deadline = time.monotonic() + 120
    while _step(view) <= resumed and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _step(view) > resumed, "the step moves on after the restart"
    page.screenshot(path=SHOTS / "07-report-view-restart.png")

    run = stack.wait_for_run("penguin", run_id, RUN_TIMEOUT_S)
    assert run["state"] == "success", stack.task_states("penguin", run_id)
    report = view.frame_locator("#report-frame")
    report.get_by_role("heading", name="Per class").wait_for()
    for heading in ("Evaluation", "Gate and push", "Strategy plan: multi_worker_mirrored"):
        assert report.get_by_role("heading", name=heading).first.is_visible(), heading
    assert report.locator('img[alt="confusion matrix"]').is_visible()
    assert view.locator('[data-status="FINISHED"]').is_visible()
    page.screenshot(path=SHOTS / "06-report-view-finished.png")
    from hpml.pipelines import records

    metrics = records.client().get_run(records.find("airflow.run_id", run_id, "penguin")).data.metrics
    assert metrics["restarts"] == 1

    # Signed in as a user whom Airflow's auth manager denies this DAG, the browser gets the view's 403, not the run.
    context = page.context.browser.new_context()
    try:
        other = context.new_page()
        other.goto(f"{stack.url}/dags/penguin")
        other.get_by_label("Username").fill(OUTSIDER)
        other.get_by_label("Password").fill(OUTSIDER_PASSWORD)
        other.get_by_role("button", name="Sign in").click()
        other.wait_for_url(lambda url: "login" not in url)
        response = other.goto(f"{stack.url}/hpml/runs/penguin/{urllib.parse.quote(run_id, safe='')}/")
        assert response.status == 403 and "you may not read the runs of DAG 'penguin'" in other.content()
        assert other.goto(f"{stack.url}/hpml/runs/penguin/{urllib.parse.quote(run_id, safe='')}/report/"
                          "report.html").status == 403
    finally:
        context.close()


def test_the_report_views_endpoints_need_a_user_who_may_read_the_dag_and_serve_only_that_runs_report(
        stack, training_run, tmp_path):
    run_id = training_run
    stack.wait_for_run("penguin", run_id, RUN_TIMEOUT_S)
    base = f"/hpml/runs/penguin/{urllib.parse.quote(run_id, safe='')}"
    admin, outsider = stack.token(), stack.token(OUTSIDER, OUTSIDER_PASSWORD)
    paths = [f"{base}/", f"{base}/status.json", f"{base}/report/report.html"]
    for path in paths:
        assert stack.get(path)[0] == 401, path  # no token, no cookie
        assert stack.get(path, token="not-a-token")[0] in (401, 403), path
        assert stack.get(path, token=outsider)[0] == 403, path  # a user whom Airflow denies this DAG
        status, body = stack.get(path, cookie=admin)  # the UI's session cookie
        assert status == 200, (path, body[:300])
    assert stack.get("/api/v2/dags/penguin", token=outsider)[0] == 403, "Airflow itself denies the outsider"
    status = json.loads(stack.get(f"{base}/status.json", token=admin)[1])
    assert status["status"] == "FINISHED" and status["report"] is True
    assert [c["node"] for c in status["components"]] == ["ExampleGen", "Transform", "Trainer", "Gate", "Pusher"]
    assert {c["state"] for c in status["components"]} == {"done"}

    # Only files inside this run's report: no climbing out, no absolute paths, no symlinks out.
    from hpml.pipelines import records

    tags = records.load(records.find("airflow.run_id", run_id, "penguin")).tags
    assert tags["hpml.step.steps_per_execution"] == "1", "the form's pinned knob reached the Trainer"
    run_dir = tags["hpml.run_dir"]
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the browser")
    os.symlink(secret, os.path.join(run_dir, "report", "link.txt"))
    for attempt in ("..%2F..%2F..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd", "../report/report.html", "link.txt",
                    "..%2Freport%2Freport.html", "%2E%2E/%2E%2E/params.json", "", "nope.png"):
        status, body = stack.get(f"{base}/report/{attempt}", token=admin)
        assert status in (404, 400) and b"root:" not in body and b"not for the browser" not in body, (attempt, status)
    # Another DAG's name in front of this run's id, and a run id this DAG does not have.
    assert stack.get(f"/hpml/runs/distillation/{urllib.parse.quote(run_id, safe='')}/status.json",
                     token=admin)[0] == 404
    assert stack.get("/hpml/runs/penguin/manual__1999-01-01T00%3A00%3A00%2B00%3A00/status.json",
                     token=admin)[0] == 404
    # The tab on a run that has no hpml record (a DAG that is not an hpml pipeline) says so, and polls nothing.
    status, page = stack.get("/hpml/runs/some_other_dag/scheduled__2026-01-01/", token=admin)
    assert status == 200 and b"has no hpml run record" in page and b"const LIVE = false;" in page


def test_run_ids_that_fold_together_get_folders_of_their_own_and_a_run_id_of_a_dot_fails_at_once(stack):
    """Airflow accepts both `sec~col` and `sec_col`: each run writes its own folder and its own report. Airflow also
    accepts `.`, which its own execution API cannot carry: that run fails in its first task, with a message."""
    from hpml.pipelines import records

    ids = ["sec~col", "sec_col"]
    for run_id in [*ids, "."]:
        stack.api("dags/penguin/dagRuns", "POST", {"dag_run_id": run_id, "logical_date": None,
                                                   "conf": {"epochs": 1}})
    dot = stack.wait_for_run("penguin", ".", RUN_TIMEOUT_S)
    assert dot["state"] == "failed"
    assert stack.task_states("penguin", ".")["start_run"] == "failed"
    log = json.dumps(stack.api("dags/penguin/dagRuns/%2E/taskInstances/start_run/logs/1?full_content=true"))
    assert "run id '.' cannot be used: Airflow cannot pass results between the tasks" in log, log[-3000:]
    assert records.find("airflow.run_id", ".", "penguin") is None, "no run record is left RUNNING"

    token, folders = stack.token(), set()
    for run_id in ids:
        assert stack.wait_for_run("penguin", run_id, RUN_TIMEOUT_S)["state"] == "success", run_id
        folders.add(records.load(records.find("airflow.run_id", run_id, "penguin")).tags["hpml.run_dir"])
        status, body = stack.get(f"/hpml/runs/penguin/{quote_run_id(run_id)}/report/report.html", token=token)
        assert status == 200 and f"<h1>penguin run {run_id}</h1>".encode() in body, (run_id, body[:300])
    assert len(folders) == 2


def test_report_files_are_served_as_content_that_runs_no_script(page, stack, training_run):
    """An HTML or SVG file planted in a run's report folder (a user module or a shared store can write there) runs
    no script on Airflow's origin, where the UI's token lives: the browser gets it sandboxed, with no scripts."""
    from hpml.pipelines import records
    from hpml.pipelines.airflow.report_app import REPORT_FILE_POLICY

    run_id = training_run
    stack.wait_for_run("penguin", run_id, RUN_TIMEOUT_S)
    report = os.path.join(records.load(records.find("airflow.run_id", run_id, "penguin")).tags["hpml.run_dir"],
                          "report")
    planted = {
        "planted.html": "<!doctype html><html><body><p>planted</p><img src=x onerror=\"console.log('ran:img '"
                        " + document.cookie)\"><script>console.log('ran:html ' + document.cookie)</script>"
                        "</body></html>",
        "planted.svg": "<svg xmlns='http://www.w3.org/2000/svg' onload=\"console.log('ran:svg-onload')\">"
                       "<script>console.log('ran:svg ' + document.cookie)</script><text y='20'>planted</text></svg>",
    }
    for name, text in planted.items():
        with open(os.path.join(report, name), "w") as handle:
            handle.write(text)
    ran = []

    def console(message):
        if message.text.startswith("ran:"):
            ran.append(message.text)

    page.on("console", console)
    # The same markup does run script where no policy stops it: the check below could fail.
    page.set_content(planted["planted.html"])
    page.wait_for_timeout(500)
    assert any(text.startswith("ran:html") for text in ran), ran
    ran.clear()

    base = f"{stack.url}/hpml/runs/penguin/{urllib.parse.quote(run_id, safe='')}"
    for name in [*planted, "report.html"]:
        response = page.goto(f"{base}/report/{name}")
        assert response.status == 200, name
        assert response.headers["content-security-policy"] == REPORT_FILE_POLICY
        assert response.headers["x-content-type-options"] == "nosniff"
        page.get_by_text("planted" if name != "report.html" else "Per class").first.wait_for()
        page.wait_for_timeout(500)
    page.remove_listener("console", console)
    assert ran == [], "a planted file ran script"
    # The report itself needs none: it still draws, images included, in the Report tab's frame and on its own.
    assert page.locator('img[alt="confusion matrix"]').evaluate("img => img.naturalWidth") > 0

    # Raw requests: a NUL byte in a report path is a 404 like every other bad path, not a server error.
    token = stack.token()
    for path in ("report.html%00.png", "%00", "report.html%00"):
        status, body = stack.get(f"/hpml/runs/penguin/{urllib.parse.quote(run_id, safe='')}/report/{path}",
                                 token=token)
        assert status == 404, (path, status, body[:200])
    assert stack.get(f"/hpml/runs/penguin/{urllib.parse.quote(run_id, safe='')}%00/status.json",
                     token=token)[0] == 404
    # The view's own text never lands inside the user's: a run id that names a placeholder stays as it is.
    status, body = stack.get("/hpml/runs/penguin/%40BODY%40%3Cb%3E/", token=token)
    assert status == 200 and b"<title>hpml \xc2\xb7 penguin \xc2\xb7 @BODY@&lt;b&gt;</title>" in body, body[:400]
    assert body.count(b"has no hpml run record") == 1
