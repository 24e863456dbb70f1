"""plumbing.forking: children forked from the preloaded server adopt their starter's state of now, and a forked
agent's watch on its starter sees it gone (exited, a zombie, or its pid reused)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedge.plumbing.forking import ParentState, ParentWatch, preloaded_context


def report_state(out: str, parent: ParentState) -> None:
    parent.adopt()
    Path(out).write_text(f"{os.getcwd()}\n{os.environ.get('FEDGE_FORKING_PROBE', '')}\n{sys.path[0]}\n")


def test_a_forked_child_adopts_its_starters_directory_environment_and_path_of_now(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    context = preloaded_context("json")
    first = context.Process(target=report_state, args=(str(tmp_path / "first"), ParentState.now()))
    first.start()  # starts the server (if this process has none yet) with the state of now
    first.join(60)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDGE_FORKING_PROBE", "set after the server started")
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    second = context.Process(target=report_state, args=(str(tmp_path / "second"), ParentState.now()))
    second.start()
    second.join(60)
    assert first.exitcode == second.exitcode == 0
    assert (tmp_path / "second").read_text().splitlines() == [str(tmp_path), "set after the server started",
                                                            str(tmp_path / "plugins")]


def test_a_watch_sees_its_process_exit_as_a_zombie_and_reaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    watch = ParentWatch(child.pid)
    assert not watch.gone()
    assert child.stdin is not None
    child.stdin.close()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert watch.gone()
    child.wait()
    assert watch.gone()


def test_a_watch_sees_a_reused_pid_and_a_process_gone_before_it_started() -> None:
    watch = ParentWatch(os.getpid())
    assert not watch.gone()
    watch.started = (watch.started or 0.0) - 10.0  # the same pid, another process's start time
    assert watch.gone()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert ParentWatch(child.pid).gone()
