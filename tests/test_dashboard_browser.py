"""The dashboard in a real browser (Debian's chromium and chromium-driver, driven by selenium with the driver's path
given, so nothing is downloaded): the page shows a real run's id, charts with one point per non-null value of
metrics.jsonl, one table row per agent and no console error; rows appended to a copied run appear within 2 s, a
partial line waits for its end, a resume's rewritten file is reloaded; two runs side by side; a live simulated-fleet
coordinator followed to its end. One browser session serves the module; the dashboard and the coordinator are real
processes on 127.0.0.1 (tests/e2e.py), killed by pid at the end. CI installs the browser (.ci/run); a missing one
fails these tests under CI and skips them, with its reason, elsewhere (tests/tools.py)."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import tools
from tests.e2e import Processes
from tests.simfleet import run_here

SHORT_RUN = ["model.name=mlp", "fleet.mode=simulated", "fleet.backend=inline", "data.clients=4",
             "data.train_limit=120", "run.rounds=5", "run.export_onnx=false", "algorithm.name=fedavg"]
PRIVATE_RUN = ["model.name=mlp", "fleet.mode=simulated", "fleet.backend=inline", "data.clients=12",
               "data.train_limit=120", "run.rounds=4", "round.fraction=0.5", "run.export_onnx=false",
               "privacy.mode=central", "privacy.noise_multiplier=1.0", "algorithm.name=fedavg",
               "train.optimizer=sgd"]
CHART_FIELDS = {"accuracy": ("test_accuracy", "test_loss"), "accuracy_bytes": ("test_accuracy",),
                "bytes": ("bytes_down", "bytes_up")}


def rows_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def source_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("source") / "run"
    run_here(SHORT_RUN, path)
    return path


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def dashboard(runs_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``coordinator dashboard RUNS --listen 127.0.0.1:0``, a real process for the module; its address."""
    processes = Processes(tmp_path_factory.mktemp("dashboard"))
    try:
        process = processes.start(["fedge.runtime.cli", "dashboard", str(runs_root), "--listen", "127.0.0.1:0"],
                                  "dashboard")
        until = time.monotonic() + 30
        while not processes.output("dashboard").strip() and time.monotonic() < until and process.poll() is None:
            time.sleep(0.05)
        url = processes.output("dashboard").splitlines()[0]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/"), processes.output("dashboard")
        yield url
    finally:
        processes.cleanup()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    chromium, driver_path = tools.command("chromium"), tools.command("chromedriver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1600",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    until = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > until:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def page_rows(browser: Any, run_id: str) -> int:
    return int(browser.execute_script("return (window.fedgeRows[arguments[0]] || {length: -1}).length;", run_id))


def known(dashboard: str, run_id: str) -> bool:
    """Whether the dashboard has found the run (it looks for new runs at most every 0.25 s: a page asking before
    then gets a 404, which the browser logs as an error)."""
    import urllib.error
    import urllib.request
    from urllib.parse import quote

    try:
        with urllib.request.urlopen(f"{dashboard}api/run?id={quote(run_id, safe='')}", timeout=5) as answer:
            return bool(answer.status == 200)
    except urllib.error.HTTPError:
        return False


def open_runs(browser: Any, dashboard: str, *run_ids: str) -> None:
    from urllib.parse import quote

    for run_id in run_ids:
        wait_until(lambda run_id=run_id: known(dashboard, run_id), 10, f"the dashboard to find {run_id}")
    browser.get(dashboard + "#" + "&".join("run=" + quote(i, safe="") for i in run_ids))
    browser.refresh()  # a new page: the hash alone would not reload it


def console_errors(browser: Any) -> list[dict[str, Any]]:
    return [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def test_the_page_shows_a_real_runs_charts_and_agents_without_console_errors(
        browser: Any, dashboard: str, source_run: Path, runs_root: Path, tmp_path: Path) -> None:
    shutil.copytree(source_run, runs_root / "complete")
    rows = rows_of(runs_root / "complete" / "metrics.jsonl")
    open_runs(browser, dashboard, "complete")
    wait_until(lambda: page_rows(browser, "complete") == len(rows), 10, "the run's rows")
    assert browser.find_element("css selector", ".run .run-id").text == "complete"
    assert "done" in browser.find_element("css selector", ".run .run-state").text
    drawn = browser.execute_script(
        "const c = window.fedgeCharts['complete']; const out = {};"
        "for (const name in c) out[name] = c[name].data.slice(1).map(s => s.filter(v => v !== null).length);"
        "return out;")
    for chart, fields in CHART_FIELDS.items():
        assert drawn[chart] == [sum(row.get(f) is not None for row in rows) for f in fields], chart
    assert drawn["accuracy"][0] == len(rows) > 0
    agents = json.loads((runs_root / "complete" / "agents.json").read_text())["agents"]
    table = browser.find_elements("css selector", ".run table.agents tbody tr")
    assert len(table) == len(agents) == 4
    assert sorted(row.find_element("css selector", "td").text for row in table) == sorted(a["client_id"] for a in agents)
    shot = tmp_path / "dashboard.png"
    browser.save_screenshot(str(shot))
    print(f"screenshot: {shot}")
    assert console_errors(browser) == []


def test_appended_rows_show_within_2_s_a_partial_line_waits_and_a_resume_is_reloaded(
        browser: Any, dashboard: str, source_run: Path, runs_root: Path) -> None:
    run = runs_root / "live"
    shutil.copytree(source_run, run)
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join(lines[:-2]))
    open_runs(browser, dashboard, "live")
    wait_until(lambda: page_rows(browser, "live") == len(lines) - 2, 10, "the rows written so far")
    with open(metrics, "a") as handle:  # the next real row, cut mid-line
        handle.write(lines[-2][:20])
        handle.flush()
    time.sleep(1.5)
    assert page_rows(browser, "live") == len(lines) - 2
    with open(metrics, "a") as handle:
        handle.write(lines[-2][20:])
    appended = time.monotonic()
    wait_until(lambda: page_rows(browser, "live") == len(lines) - 1, 2.0, "the appended row, within 2 s")
    print(f"the appended row showed after {time.monotonic() - appended:.2f} s")
    resumed = run / "metrics.jsonl.resumed"  # --resume truncates by writing a new file
    resumed.write_text("".join(lines[:2]))
    os.replace(resumed, metrics)
    wait_until(lambda: page_rows(browser, "live") == 2, 5, "the page to reload the rewritten file")
    points = browser.execute_script("return window.fedgeCharts['live'].accuracy.data[0].length;")
    assert points == 2 and console_errors(browser) == []


def test_two_runs_side_by_side_and_the_run_list(browser: Any, dashboard: str, source_run: Path,
                                                runs_root: Path) -> None:
    for name in ("left", "right"):
        shutil.copytree(source_run, runs_root / "pair" / name)
    open_runs(browser, dashboard, "pair/left", "pair/right")
    wait_until(lambda: page_rows(browser, "pair/right") > 0 and page_rows(browser, "pair/left") > 0, 10,
               "both runs")
    shown = [e.text for e in browser.find_elements("css selector", "#runs-shown .run .run-id")]
    assert shown == ["pair/left", "pair/right"]
    browser.get(dashboard)
    browser.refresh()
    listed = wait_until(lambda: browser.find_elements("css selector", "#runs tbody tr"), 10, "the run list")
    found = sorted(p.parent.relative_to(runs_root).as_posix() for p in runs_root.rglob("provenance.json"))
    assert sorted(row.get_attribute("data-run") for row in listed) == found
    assert console_errors(browser) == []


def test_a_running_simulated_fleet_coordinator_is_followed_to_its_end(browser: Any, dashboard: str,
                                                                       runs_root: Path, procs: Processes) -> None:
    run = runs_root / "running"
    sets = [s for s in SHORT_RUN if not s.startswith("run.rounds")]
    process = procs.cli(sets, run, "--rounds", "12")
    wait_until(lambda: (run / "provenance.json").exists(), 60, "the run to start")
    open_runs(browser, dashboard, "running")
    seen = wait_until(lambda: page_rows(browser, "running") > 0 and page_rows(browser, "running"), 60, "a first row")
    procs.finish(process, "running", 180)
    assert seen < 12  # the page showed the run before it ended
    wait_until(lambda: page_rows(browser, "running") == 12, 10, "the last row")
    wait_until(lambda: "done" in browser.find_element("css selector", ".run .run-state").text, 10, "the done state")
    assert len(browser.find_elements("css selector", ".run table.agents tbody tr")) == 4
    assert console_errors(browser) == []


def test_a_private_runs_epsilon_is_charted_against_rounds(browser: Any, dashboard: str, runs_root: Path) -> None:
    run = runs_root / "private"
    run_here(PRIVATE_RUN, run)
    rows = rows_of(run / "metrics.jsonl")
    open_runs(browser, dashboard, "private")
    wait_until(lambda: page_rows(browser, "private") == len(rows), 10, "the private run's rows")
    chart = browser.find_element("css selector", '.run [data-chart="epsilon"]')
    assert chart.is_displayed()
    drawn = browser.execute_script("return window.fedgeCharts['private'].epsilon.data[1];")
    assert drawn == [row["epsilon"] for row in rows] and all(e > 0 for e in drawn)
    assert "epsilon" in browser.find_element("css selector", ".run .run-state").text
    open_runs(browser, dashboard, "complete")  # a run without privacy: no epsilon chart
    wait_until(lambda: page_rows(browser, "complete") > 0, 10, "the non-private run")
    assert not browser.find_element("css selector", '.run [data-chart="epsilon"]').is_displayed()
    assert console_errors(browser) == []


def test_a_regression_runs_figure_is_charted_and_switching_views_leaves_one_refresh_loop(
        browser: Any, dashboard: str, source_run: Path, runs_root: Path) -> None:
    run = runs_root / "regression"
    shutil.copytree(source_run, run)
    rows = rows_of(run / "metrics.jsonl")
    (run / "metrics.jsonl").write_text("".join(  # as a regression task writes them: mse, no accuracy
        json.dumps({**{k: v for k, v in r.items() if k != "test_accuracy"}, "test_accuracy": None,
                    "test_mse": r["test_accuracy"]}) + "\n" for r in rows))
    open_runs(browser, dashboard, "regression")
    wait_until(lambda: page_rows(browser, "regression") == len(rows), 10, "the regression run's rows")
    assert browser.find_element("css selector", '.run [data-chart="accuracy"] h3').text == "Test mse and loss per round"
    drawn = browser.execute_script("return window.fedgeCharts['regression'].accuracy.data[1];")
    assert drawn == [r["test_accuracy"] for r in rows]
    shutil.copytree(source_run, runs_root / "other")
    wait_until(lambda: known(dashboard, "other"), 10, "the dashboard to find the new run")
    for target in ("", "run=regression", "", "run=other&run=other", "run=regression"):  # quick switches
        browser.execute_script("location.hash = arguments[0];", target)

    def settled() -> bool:
        shown = [e.text for e in browser.find_elements("css selector", "#runs-shown .run .run-id")]
        return shown == ["regression"] and not browser.find_element("css selector", "#list").is_displayed() \
            and page_rows(browser, "regression") == len(rows)

    wait_until(settled, 10, "the last view alone")
    time.sleep(2.0)  # an earlier view's refresh loop, had one survived, would have redrawn by now
    assert settled()
    assert console_errors(browser) == []
