"""The benchmark's busy-machine block without measuring anything: the report section rendered from a
fake results dict, its splicing into an existing report, the command line, and that a load's
process group is gone after it is stopped."""

from __future__ import annotations

import os
import stat
import time

import pytest

from bench import cli, session
from bench.busy import StressLoad, group_members
from bench.report.busy import render_busy
from bench.report.page import render, splice_section


def _run(rtf: float, bg: float = 0.0, cores: float = 1.0) -> dict:
    return {"rtf": rtf, "background": bg, "wall_s": rtf * 1.92, "cpu_s": cores * rtf * 1.92}


def _busy(cpu1_ours=(2.3, 2.2), cpu2=((4.0, 4.2), (30.0, 32.0))) -> dict:
    return {
        "shape": "0.6b", "quant": "q8_0", "cp": "int8", "threads": 2, "frames": 24, "reps": 2, "official_reps": 2,
        "old_reps": 1, "old_policy_env": {"OMP_WAIT_POLICY": "ACTIVE"}, "settle_s": 2.0, "date": "2026-12-01 10:00 UTC",
        "commit": "abcdef123456", "dirty_files": 0, "skipped": [],
        "loads": {
            "none": {"what": "nothing else runs", "ours": [_run(2.0, cores=1.75), _run(2.2, cores=1.75)],
                     "official": [_run(9.0, cores=1.05), _run(9.4, cores=1.07)], "old": [_run(2.1, cores=1.8)],
                     "errors": []},
            "cpu1": {"what": "one process", "command": "stress-ng --cpu 1", "load_alone_background": 0.5,
                     "ours": [_run(x, 0.4) for x in cpu1_ours], "official": [_run(11.0, 0.4), _run(11.0, 0.4)],
                     "old": [_run(8.4, 0.3)], "errors": [], "stop": {"left": []}},
            "cpu2": {"what": "two processes", "command": "stress-ng --cpu 2", "load_alone_background": 1.0,
                     "ours": [_run(x, 0.5) for x in cpu2[0]], "official": [_run(x, 0.5) for x in cpu2[1]],
                     "old": [_run(70.0, 0.3)], "errors": [], "stop": {"left": []}},
            "stream1": {"what": "a memory-bandwidth hog", "command": "stress-ng --stream 1",
                        "load_alone_background": 0.5, "ours": [_run(2.4), _run(2.4)],
                        "official": [_run(10.0), _run(10.0)], "old": [], "errors": [], "stop": {"left": []}},
        },
    }


def _table(text: str) -> list[list[str]]:
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in r.strip("|").split("|")] for r in rows]


def test_busy_table_rtf_slowdown_and_background():
    text = render_busy(_busy())
    assert text.startswith("## Busy machine\n")
    header, *rows = _table(text)
    assert header[:6] == ["load", "ours RTF", "ours slowdown", "official RTF", "official slowdown",
                          "ours with the old spinning waits: RTF (slowdown)"]
    by_load = {r[0]: r for r in rows}
    assert set(by_load) == {"none", "`stress-ng --cpu 1`", "`stress-ng --cpu 2`", "`stress-ng --stream 1`"}
    none, cpu2 = by_load["none"], by_load["`stress-ng --cpu 2`"]
    assert none[1] == "2.10 (2.00)" and none[2] == "1.00× (baseline)" and none[3] == "9.20 (9.00)"
    # slowdown = loaded median / unloaded median of the same block
    assert cpu2[2] == f"{4.1 / 2.1:.2f}×" and cpu2[4] == f"{31.0 / 9.2:.2f}×"
    assert cpu2[5] == f"70.00 ({70.0 / 2.1:.1f}×)"
    assert cpu2[7] == "100 %; 50 % / 50 % / 30 %"
    assert by_load["`stress-ng --stream 1`"][5] == "–"  # the old waits are not measured there
    assert header[6] == "ours on one thread: RTF" and cpu2[6] == "–"  # not measured in this fake block


def test_one_thread_runs_bound_the_slowdown_where_the_kernel_shares_by_session():
    """With autogroup, one busy process leaves our session one core: the one-thread runs say what that core
    gives (the second core's speed-up is what the load takes back)."""
    busy = _busy(cpu1_ours=(3.5, 3.3))
    busy.update(one_reps=2, autogroup=True)
    busy["loads"]["none"]["one"] = [_run(2.9, cores=1.0), _run(3.1, cores=1.0)]
    busy["loads"]["cpu1"]["one"] = [_run(3.0, 0.5, cores=1.0), _run(3.2, 0.5, cores=1.0)]
    text = render_busy(busy)
    row = next(r for r in _table(text) if r[0] == "`stress-ng --cpu 1`")
    assert row[6] == "3.10 (3.00)"
    assert "*One thread*: our engine with `threads=1`" in text and "2 runs." in text
    assert ("autogroup" in text
            and "our run got 1.00 cores, whatever its thread count (it keeps 1.75 busy alone)" in text)
    assert ("On one thread our engine took RTF 3.00 with no load and 3.10 beside this load (a core of its own), "
            "against 2.10 on 2 threads with no load: the second core speeds our run up 1.43×") in text
    assert "switching to one thread under load would gain 1.10×" in text  # 3.40 / 3.10
    assert "an even split of the 2 cores" not in text

    assert "The memory-bandwidth hog is a busy process as well" in text  # said whichever bound applies
    assert "With a larger CPU weight" not in text  # not measured in this block

    busy["autogroup"] = False  # threads share the cores: the even split bounds it
    assert "an even split of the 2 cores" in render_busy(busy)


def test_a_larger_cpu_weight_is_reported_against_the_unloaded_runs():
    busy = _busy(cpu1_ours=(3.5, 3.3))
    busy.update(weighted_reps=2, weighted_nice=-5, autogroup=True)
    busy["loads"]["cpu1"]["weighted"] = [_run(2.4, 0.3, cores=1.4), _run(2.6, 0.3, cores=1.4)]  # 2.5 / 2.1
    text = render_busy(busy)
    assert ("With a larger CPU weight: our engine in a session of its own at autogroup nice -5 (a CFS weight "
            "about 3.1× the load's, 1.25× per nice step") in text
    assert ("took RTF 2.50 beside `stress-ng --cpu 1`, keeping 1.40 cores busy: 1.19× our unloaded RTF, within the "
            "1.3× target") in text

    busy["loads"]["cpu1"]["weighted"] = []
    busy["loads"]["cpu1"]["weighted_error"] = "PermissionError: [Errno 13] Permission denied: '/proc/self/autogroup'"
    assert "With a larger CPU weight: not measured (PermissionError" in render_busy(busy)


def test_a_worker_leaves_for_a_session_of_its_own_at_the_nice_asked(monkeypatch, tmp_path):
    from bench import worker

    calls, written = [], tmp_path / "autogroup"
    monkeypatch.setattr(worker.os, "setsid", lambda: calls.append("setsid"))
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(written if path == "/proc/self/autogroup"
                                                                          else path, *a, **k))
    worker._own_session_at(-5)
    assert calls == ["setsid"] and written.read_text() == "-5"


def test_busy_targets_reached_and_not():
    text = render_busy(_busy(cpu1_ours=(2.3, 2.2)))  # 2.25 / 2.1 = 1.07, stream 2.4 / 2.1 = 1.14
    assert "slowdown ≤ 1.3×. Measured: 1.07× under `stress-ng --cpu 1`, 1.14× under `stress-ng --stream 1`. " \
           "**Reached.**" in text
    assert "ours 1.95×, official 3.37×. **Reached.**" in text
    assert "The lever (OpenMP wait policy)" in text and "RTF 70.00 with spinning waits, 4.10 with sleeping ones" in text
    assert "What bounds it" not in text
    assert "Ours kept 1.75 cores busy alone and got 1.00 under this load" in text
    assert "The official pipeline kept 1.06 busy alone and got 1.00, which explains 1.06× of its 3.37×" in text
    assert "slower even with no load" not in text  # old waits 2.1 vs 2.1 quiet


def test_old_waits_slower_with_no_load_is_explained():
    busy = _busy()
    busy["loads"]["none"]["old"] = [_run(3.0, cores=1.97)]
    text = render_busy(busy)
    assert "so it is slower even with no load" in text and "kept 1.97 cores busy with no load, against 1.75" in text

    text = render_busy(_busy(cpu1_ours=(3.5, 3.3), cpu2=((40.0, 42.0), (30.0, 32.0))))
    assert text.count("**Not reached.**") == 2
    # the bound comes from the cores the runs kept busy: 1.75 with no load, 1.00 beside the load
    assert "CPU each run kept busy, in cores" in text and "ours 1.75 / 1.00 / 1.00 / 1.00" in text
    assert "the CPU share alone explains about 1.75×, and ≤ 1.3× needs 1.35 of the 2 cores" in text
    assert "our run got 1.00 cores instead of the 1.75 it keeps busy alone" in text
    assert "keeps only 1.06 cores busy with no load" in text
    assert "its RTF is 31.00, ours 41.00" in text


def test_single_runs_show_one_figure_and_the_counts_are_said():
    busy = _busy()
    busy.update(official_loaded_reps=1)
    busy["loads"]["cpu1"]["official"] = [_run(11.0, 0.4)]
    text = render_busy(busy)
    row = next(r for r in _table(text) if r[0] == "`stress-ng --cpu 1`")
    assert row[3] == "11.00" and row[1] == "2.25 (2.20)"
    assert "(official: 2 with no load, 1 under each load; old waits: 1; a single run shows one figure)" in text


def test_busy_skipped_and_failed_rows():
    text = render_busy({"status": "skipped: `stress-ng` is not installed", "date": "d", "commit": "c"})
    assert "**Not measured**: skipped: `stress-ng` is not installed." in text
    busy = _busy()
    busy["loads"]["cpu2"].update(ours=[], official=[], old=[], errors=["stress-ng exited with 1"])
    text = render_busy(busy)
    assert "| `stress-ng --cpu 2` | failed: stress-ng exited with 1 |" in text
    assert "ours –×, official –× (incomplete)" in text


DOC = "# Benchmarks\n\nintro\n\n## 0.6B CustomVoice\n\nx\n\n### sub\n\ny\n\n## Machine limits (measured)\n\nz\n\n" \
      "## Reproduce\n\nr\n"


def test_splice_inserts_then_replaces_keeping_every_section():
    first = splice_section(DOC, "## Busy machine", render_busy(_busy(), standalone=True))
    assert first.index("## 0.6B") < first.index("## Busy machine") < first.index("## Machine limits")
    assert "by `python -m bench --only busy`" in first
    second = splice_section(first, "## Busy machine", "## Busy machine\n\nnew figures\n")
    assert second.count("## Busy machine") == 1 and "new figures" in second and "| load |" not in second
    assert second.replace("## Busy machine\n\nnew figures\n\n", "") == DOC
    assert (splice_section("# B\n\ntext\n", "## Busy machine", "## Busy machine\n\nf\n")
            == "# B\n\ntext\n\n## Busy machine\n\nf\n\n")


def _results_with(busy: dict) -> dict:
    plan = dict(cli.MODES["full"], **cli.BUSY, mode="full")
    machine = {"date": "2026-12-01", "commit": "abc", "versions": {}, "cpu": "cpu", "cores": 2, "flags": [],
               "kernel": "k", "python": "3.11", "ram_gib": 8}
    return {"plan": plan, "machine": machine, "shapes": {}, "busy": busy}


def test_full_render_includes_the_section():
    text = render(_results_with(_busy()))
    assert "## Busy machine" in text and "python -m bench --only busy" in text


def test_command_line():
    p = cli.build_parser()
    assert cli._plan(p.parse_args([]))["busy"] is True
    assert cli._plan(p.parse_args(["--quick"]))["busy"] is False
    assert cli._plan(p.parse_args(["--quick", "--busy"]))["busy"] is True
    assert p.parse_args(["--only", "busy"]).only == "busy"
    with pytest.raises(SystemExit):
        p.parse_args(["--only", "everything"])
    assert "--only" in p.format_help() and "--busy" in p.format_help()


def test_workers_get_the_wait_policy_the_bench_was_started_with(monkeypatch):
    # loading llama_cpp in the orchestrator (a conversion) sets the engine's policy and spin count there;
    # the official pipeline's worker and the old-waits worker must not inherit them
    monkeypatch.setattr(session, "LAUNCH_OPENMP_WAITS", {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None})
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("GOMP_SPINCOUNT", "300")
    assert "OMP_WAIT_POLICY" not in session.child_env() and "GOMP_SPINCOUNT" not in session.child_env()
    old = session.child_env({"OMP_WAIT_POLICY": "ACTIVE"})
    assert old["OMP_WAIT_POLICY"] == "ACTIVE" and "GOMP_SPINCOUNT" not in old  # a spin count would cap ACTIVE
    monkeypatch.setattr(session, "LAUNCH_OPENMP_WAITS", {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None})
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert session.child_env()["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("SOMETHING", "x")
    assert "SOMETHING" not in session.child_env({"SOMETHING": None})


def test_stopping_a_load_leaves_no_process_of_its_group(tmp_path):
    # stands in for stress-ng: a parent with a child, both ignoring SIGTERM, so the kill must escalate
    exe = tmp_path / "fake-stress"
    exe.write_text("#!/bin/sh\ntrap '' TERM\nsh -c \"trap '' TERM; sleep 60\" &\nsleep 60\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    load = StressLoad(str(exe), ["--cpu", "1"], 60, term_grace_s=0.5)
    with load:
        deadline = time.time() + 5
        while len(group_members(load.proc.pid)) < 3 and time.time() < deadline:
            time.sleep(0.05)
        assert load.alive() and len(group_members(load.proc.pid)) >= 2
        pgid = load.proc.pid
    assert load.stopped["left"] == [] and group_members(pgid) == []
    assert os.getpgid(os.getpid()) != pgid


def test_measure_runs_each_extra_session_where_it_belongs(monkeypatch):
    """The block's orchestration with stand-ins for the workers and the loads: our headline session and the
    official one alternate under every load; the old-waits, one-thread and larger-weight sessions each run
    under their loads with their own parameters and are closed; a session that does not load is reported."""
    from bench import busy

    started = []

    class FakeSession:
        def __init__(self, progress, label, kind, params, timeout=0, env=None):
            self.label, self.params, self.env = label, params, env
            self.ready = {"error": "PermissionError: no"} if "autogroup_nice" in params and refuse else {"ready": True}
            self.proc = type("P", (), {"pid": 4242})()
            self.closed = False
            started.append(self)

        @property
        def ok(self):
            return "error" not in self.ready

        def call(self, op, rep):
            return {"rtf": 2.0 + rep, "wall_s": 0.0, "cpu_s": 0.0, "background": 0.0}

        def close(self):
            self.closed = True
            return {"closed": self.label}

    class FakeLoad:
        stopped = {"left": []}

        def __init__(self, exe, args, max_s):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def alive(self):
            return True

    monkeypatch.setattr("bench.session.Session", FakeSession)
    monkeypatch.setattr(busy, "StressLoad", FakeLoad)
    monkeypatch.setattr(busy, "SETTLE_S", 0.0)
    monkeypatch.setattr(busy.shutil, "which", lambda exe: "/usr/bin/stress-ng")
    monkeypatch.setattr(busy.subprocess, "run", lambda *a, **k: type("R", (), {"stdout": "stress-ng 0.1"})())
    refuse = False
    kwargs = dict(model_dir="m", checkpoint="c", threads=2, frames=8, reps=2, official_reps=1, old_reps=1,
                  one_reps=2, weighted_reps=2, quiet_s=0.0, budget_s=None)
    out = busy.measure(None, print, **kwargs)
    loads = out["loads"]
    assert [len(loads[k]["ours"]) for k in loads] == [2, 2, 2, 2]
    assert {k for k in loads if loads[k]["old"]} == set(busy.OLD_POLICY_LOADS)
    assert {k for k in loads if loads[k]["one"]} == {"none", "cpu1"} == set(busy.ONE_THREAD_LOADS)
    assert {k for k in loads if loads[k]["weighted"]} == {"cpu1"} and len(loads["cpu1"]["weighted"]) == 2
    extra = {s.label: s for s in started[2:]}
    assert extra["busy ours (on one thread)"].params["threads"] == 1
    assert extra["busy ours (with spinning waits)"].env == busy.OLD_POLICY
    weighted = extra["busy ours (at autogroup nice -5)"]
    assert weighted.params["autogroup_nice"] == -5 and weighted.params["threads"] == 2
    assert all(s.closed for s in started)
    assert out["weighted_nice"] == -5 and out["one_reps"] == 2 and out["autogroup"] in (True, False, None)

    refuse, started[:] = True, []
    out = busy.measure(None, print, **kwargs)
    assert out["loads"]["cpu1"]["weighted"] == [] and out["loads"]["cpu1"]["weighted_error"] == "PermissionError: no"
    assert "ours at autogroup nice -5: PermissionError: no" in out["loads"]["cpu1"]["errors"]
    assert "With a larger CPU weight: not measured (PermissionError: no)" in render_busy(out)
