"""The student's command line: ``list``, ``show``, a prediction given as a plain number, the progress file that
``status`` reads, the note on what the reference stood in for, and the Makefile's ``check`` and ``student`` rules.

The Makefile is tested without installing anything: ``make -n`` prints a rule's commands, and ``make -o setup``
runs the ``check`` rule alone, with this environment's Python (``VENV`` pointed at it).
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import minfer.exercises.__main__ as cli
import minfer.exercises.checking as checking
import minfer.exercises.progress as progress
from minfer.exercises import EXERCISES, check, run_exercise
from minfer.exercises.harness import CheckResult
from minfer.exercises.standin import ROOT, StandIns, is_student_build

pytestmark = pytest.mark.skipif(is_student_build(), reason="tests the repository's command line")
needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")


@pytest.fixture
def progress_file(tmp_path, monkeypatch) -> Path:
    """Checks record into a progress file of the test's own, as they would in a student build."""
    path = tmp_path / "progress.json"
    monkeypatch.setattr(progress, "progress_file", lambda: path)
    monkeypatch.setattr(cli, "_prepare_triton", lambda: None)  # E3.2's measurement runs no kernel
    return path


def main(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().out


def usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main(list(argv))
    assert e.value.code == 2
    return capsys.readouterr().err


def test_list_names_every_exercise_with_its_kind_and_chapter(capsys):
    code, out = main(capsys, "list")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["id", "kind", "chapter", "difficulty", "time", "after", "title"]
    for e, line in zip(EXERCISES, lines[1:], strict=True):
        assert line.split()[:4] == [e.id, e.kind, f"{e.chapter:02d}", str(e.difficulty)] and line.endswith(e.title)
        assert f" {e.minutes} min " in line and (", ".join(e.requires) or "-") in line


def test_show_prints_the_task_where_the_code_goes_and_how_to_check_it(capsys):
    code, out = main(capsys, "show", "e4.1")
    assert code == 0
    assert out.startswith("E4.1: the scheduler's running-request loop\nbuild exercise, chapter 04 §The scheduler")
    assert "notebooks/04_continuous_batching.ipynb" in out and "Scheduler._schedule_running" in out
    assert "minfer/scheduler/scheduler.py:" in out and "make check EX=E4.1" in out
    assert " ".join(out.split()).count("Write Scheduler._schedule_running: every running request") == 1
    _, out = main(capsys, "show", "E3.2")
    assert "make check EX=E3.2 ANSWER=<number>" in out and "check E3.2 <number>" in out
    _, out = main(capsys, "show", "E3.3")
    assert "nothing to run" in out
    assert "no exercise 'E9'" in usage_error(capsys, "show", "E9")


def test_a_prediction_is_a_plain_number_after_the_exercise(capsys, progress_file):
    code, out = main(capsys, "check", "E3.2", "4")
    assert code == 0 and "PASSED -- you predicted 4 blocks, measured 4 blocks" in out
    code, out = main(capsys, "check", "E3.2", "3")
    assert code == 1 and "NOT YET -- you predicted 3 blocks" in out
    assert main(capsys, "check", "E3.2", "4", "--answer", "4")[0] == 0  # the same answer twice: fine
    assert "two answers for E3.2" in usage_error(capsys, "check", "E3.2", "4", "--answer", "5")
    assert "E3.1 is a build exercise: it takes no number" in usage_error(capsys, "check", "E3.1", "4")
    assert "give it no exercise" in usage_error(capsys, "check", "--all", "E3.1")


def test_an_unanswered_prediction_says_how_to_answer_in_a_shell_too(capsys, progress_file):
    code, out = main(capsys, "check", "E3.2")
    assert code == 0 and "check('E3.2', your_number)" in out
    assert "make check EX=E3.2 ANSWER=your_number" in out and "check E3.2 your_number" in out
    assert not progress_file.exists(), "a check that judged nothing is not recorded"


def test_checks_and_predictions_are_recorded_and_status_shows_the_latest(capsys, progress_file):
    main(capsys, "check", "E3.2", "3")
    main(capsys, "check", "E3.2", "4")
    main(capsys, "check", "E3.2", "5", "--json")  # grading's and check()'s machine form records nothing itself
    progress.record(CheckResult("E4.1", "build", "failed", case="the token budget", hint="stop when it is spent"))
    progress.record(CheckResult("E5.1", "build", "failed", stub="E5.1", hint="(a stub has no hint)"))
    progress.record(CheckResult("E1.3", "explain", "written"))
    entries = json.loads(progress_file.read_text())["checks"]
    assert [(e["exercise"], e["status"]) for e in entries] == [
        ("E3.2", "failed"), ("E3.2", "passed"), ("E4.1", "failed"), ("E5.1", "not written")]
    assert entries[1]["prediction"] == 4 and entries[1]["measured"] == 4 and entries[1]["unit"] == "blocks"
    assert entries[2]["case"] == "the token budget" and entries[3]["hint"] == ""
    assert all(e["when"][:4].isdigit() for e in entries)

    rows = {r[0]: r for r in progress.status()}
    capsys.readouterr()
    assert rows["E3.2"][4].startswith("passed (predicted 4, measured 4 blocks), ") and "(2 checks)" in rows["E3.2"][4]
    assert rows["E4.1"][4].startswith("not yet, ") and rows["E5.1"][4].startswith("not written, ")
    assert rows["E1.3"][4] == "" and rows["E3.1"][4] == ""
    _, out = main(capsys, "show", "E4.1")
    assert "Your latest check" in out and "failing case: the token budget" in out and "hint: stop when" in out


def test_check_in_a_notebook_records_its_result(capsys, progress_file):
    assert check("E3.2", 4, quiet=True).passed
    (entry,) = json.loads(progress_file.read_text())["checks"]
    assert entry["exercise"] == "E3.2" and entry["status"] == "passed" and entry["prediction"] == 4


def test_the_repository_keeps_no_progress_file():
    assert progress.progress_file() is None


def test_the_stand_in_note_names_what_stood_in_and_why():
    plain = CheckResult("E4.1", "build", "failed", message="boom")
    assert "stood in" not in plain.report() and plain.stand_in_note() == ""
    r = CheckResult("E4.1", "build", "failed", message="boom", stand_ins=["E5.1", "E6.1"], set_aside=["E3.1"])
    assert r.stand_in_note() == ("during this check the reference stood in for E5.1 and E6.1, not written yet, and "
                                 "for your own E3.1, set aside so that only E4.1 is judged")
    assert r.report().endswith(f"({r.stand_in_note()})")
    only = CheckResult("E4.1", "build", "failed", stand_ins=["E5.1"])
    assert only.stand_in_note() == "during this check the reference stood in for E5.1, not written yet"


def test_a_check_names_the_stand_ins_it_called_unwritten_or_set_aside(monkeypatch):
    assert (run_exercise("E10.1").stand_ins, run_exercise("E10.1").set_aside) == ([], []), \
        "in the repository every region is the reference: nothing stands in"

    original = StandIns.install

    def install(self, exercises, only_stubs=True, always=False):  # as in a student build: every other one swapped
        if always:  # a hidden case compiling the reference to compare with: the real thing
            return original(self, exercises, only_stubs, always)
        self.exercises += ["E3.1", "E5.1", "E6.1"]
        self.ran |= {"E3.1", "E5.1"}  # ... and E6.1's stand-in never called
        return ["E3.1", "E5.1", "E6.1"]

    monkeypatch.setattr(StandIns, "install", install)
    monkeypatch.setattr(checking, "build_states", lambda: {"E3.1": "written", "E5.1": "not started",
                                                           "E6.1": "not started"})
    result = run_exercise("E10.1")
    assert result.passed and result.stand_ins == ["E5.1"] and result.set_aside == ["E3.1"]


def test_a_stand_in_notes_when_it_is_called_and_still_shows_the_students_code():
    from minfer.kv.block_pool import BlockPool

    student = BlockPool.__dict__["blocks_for"]
    with StandIns() as swaps:
        assert swaps.install(["E3.1"], always=True) == ["E3.1"] and swaps.ran == set()
        assert BlockPool.__dict__["blocks_for"] is not student
        assert inspect.unwrap(BlockPool.__dict__["blocks_for"]) is student  # what show_source follows
        assert BlockPool(4, 16).blocks_for(17) == 2 and swaps.ran == {"E3.1"}
    assert BlockPool.__dict__["blocks_for"] is student and swaps.ran == set()


def make(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    return subprocess.run(["make", "--no-print-directory", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


@needs_make
def test_make_check_passes_the_exercise_and_the_answer():
    assert ".venv/bin/python -m minfer.exercises check E3.2 4 " in make("-n", "check", "EX=E3.2", "ANSWER=4").stdout
    assert "minfer.exercises check --all " in make("-n", "check").stdout


@needs_make
def test_make_check_ends_a_failed_check_with_one_line_saying_it_is_no_crash():
    here = [f"VENV={sys.prefix}"]  # this environment's Python; -o setup: nothing is installed
    run = make("-s", "-o", "setup", "check", "EX=E3.2", "ANSWER=3", *here)
    assert run.returncode != 0, "scripts and CI must see that the check did not pass"
    last = run.stdout.strip().splitlines()[-1]
    assert last.startswith("make check: not passed yet") and "not a crash" in last and "Traceback" not in run.stderr
    run = make("-s", "-o", "setup", "check", "EX=E3.2", "ANSWER=4", *here)
    assert run.returncode == 0 and "not passed yet" not in run.stdout and run.stderr == ""


@needs_make
def test_make_student_links_the_build_to_this_checkouts_venv():
    out = make("-n", "student").stdout
    assert "-m minfer.exercises student build/student" in out and "ln -s ../../.venv build/student/.venv" in out


@needs_make
def test_a_linked_venv_is_never_installed_into_and_its_tree_comes_first(tmp_path):
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / ".venv").symlink_to(sys.prefix)
    out = make("-n", "setup", cwd=tmp_path).stdout
    assert "pip install" not in out and "holds no Python" in out
    shown = make("-s", "--eval", "pythonpath: ; @echo $$PYTHONPATH", "pythonpath", cwd=tmp_path).stdout
    assert shown.split(":")[0].strip() == str(tmp_path)
    (tmp_path / ".venv").unlink()  # a venv of its own: installed, saying what that costs first
    out = make("-n", "setup", cwd=tmp_path).stdout
    assert "pip install" in out and "about 2.9 GB" in out and "ln -s" in out
