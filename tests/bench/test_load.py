"""The bench's load monitor (``bertcf.bench.load``): the CPU time other processes took, from
made-up /proc snapshots (the arithmetic, the refusal with exit status 2 in one line, the JSON's
fields, in every mode through the one ``run``) and from real processes spinning beside it."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest

from bertcf.bench import load
from bertcf.bench.load import BusyMachine, Counters, LoadMonitor, between
from bertcf.cli import run_main
from bertcf.commands import bench
from helpers import assert_one_error_line

OWN = 0.7  # the bench's own CPU seconds in each made-up interval: never counted as other work


def snapshots(*others: float, cpus: int = 2) -> list[Counters]:
    """A snapshot, then one per interval of 1 s wall in which other work took ``others[i]`` cores'
    worth and the bench OWN seconds."""
    out = [Counters(busy=1000.0, total=50_000.0, own=3.0, cpus=cpus)]
    for other in others:
        last = out[-1]
        out.append(Counters(last.busy + other + OWN, last.total + cpus, last.own + OWN, cpus))
    return out


def fake_monitor(before: float, during: float) -> LoadMonitor:
    """A monitor reading the idle check (other work ``before`` cores), the run's start right after
    it, and the run's end (``during`` cores); sleeping nowhere."""
    s0, s1, s2 = snapshots(before, during)
    reads = iter([s0, s1, s1, s2])
    return LoadMonitor(reader=lambda: next(reads), sleep=lambda seconds: None)


# ---- the arithmetic ---------------------------------------------------------------------------------
PROC_STAT = """cpu  4705 150 1120 16250 520 0 120 30 100 0
cpu0 2000 100 500 8000 300 0 60 10 50 0
cpu1 2705 50 620 8250 220 0 60 20 50 0
cpu2 99999 0 0 1 0 0 0 0 0 0
intr 114930548 113199788 3 0 5 263 0 4 [... lots more numbers ...]
ctxt 1990473
procs_running 2
"""


def test_proc_stat_counts_busy_columns_of_the_chosen_cpus():
    busy, total, n = load.parse_proc_stat(PROC_STAT, cpus={0, 1})
    # user nice system irq softirq steal; idle and iowait idle; guest inside user, not twice
    assert busy == (2000 + 100 + 500 + 0 + 60 + 10) + (2705 + 50 + 620 + 0 + 60 + 20)
    assert total == busy + (8000 + 300) + (8250 + 220)
    assert n == 2
    assert load.parse_proc_stat(PROC_STAT)[2] == 3  # all cpuN lines, never the summary "cpu" line
    with pytest.raises(ValueError):
        load.parse_proc_stat("cpu  1 2 3 4\n", cpus={0})


def test_other_cores_is_busy_minus_own_over_the_wall():
    a, b = snapshots(0.5)
    interval = between(a, b)
    assert interval.seconds == pytest.approx(1.0)
    assert interval.other_cores == pytest.approx(0.5)  # the bench's own 0.7 s is not other work
    assert interval.share == pytest.approx(0.25)  # of 2 cores
    a, b = snapshots(0.0, cpus=16)
    assert between(a, b).other_cores == pytest.approx(0.0, abs=1e-9)
    # the kernel rounds the machine's and the process's ticks apart: never below zero
    assert between(a, Counters(b.busy - 0.01, b.total, b.own, b.cpus)).other_cores == 0.0
    assert between(a, Counters(b.busy + 3.0, b.total + 3 * 16, b.own, 16)).other_cores == pytest.approx(3.0 / 4)  # 4 s


def test_counters_come_from_proc_with_the_live_children(tmp_path):
    """read_counters: /proc/stat's CPUs this process may use, and the own time of this process plus
    its live descendants (a child and its grandchild, which os.times cannot see yet)."""
    cpus = sorted(os.sched_getaffinity(0))
    ticks = os.sysconf("SC_CLK_TCK")
    lines = [f"cpu{c} 100 0 50 800 50 0 0 0 0 0" for c in cpus] + ["cpu99999 5000 0 0 0 0 0 0 0 0 0"]
    (tmp_path / "stat").write_text("cpu  1 2 3 4 5 6 7 8 9 10\n" + "\n".join(lines) + "\n")
    pid = os.getpid()
    for parent, kids in ((pid, "4242 "), (4242, "4243"), (4243, "")):
        (tmp_path / str(parent) / "task" / str(parent)).mkdir(parents=True)
        (tmp_path / str(parent) / "task" / str(parent) / "children").write_text(kids)
    # utime stime cutime cstime are fields 14-17; the command name holds a space and a ')'
    (tmp_path / "4242" / "stat").write_text("4242 (torch compile) S " + "1 " * 10 + "30 20 5 5 " + "0 " * 30)
    (tmp_path / "4243" / "stat").write_text("4243 (w) R " + "1 " * 10 + "40 0 0 0 " + "0 " * 30)
    t = os.times()
    counters = load.read_counters(tmp_path)
    assert counters.cpus == len(cpus)
    assert counters.busy == pytest.approx(150 * len(cpus) / ticks)
    assert counters.total == pytest.approx(1000 * len(cpus) / ticks)
    own_before = t.user + t.system + t.children_user + t.children_system
    assert counters.own - own_before == pytest.approx(100 / ticks, abs=0.05)  # 60 + 40 ticks of the children
    assert load.read_counters(tmp_path / "nothing") is None  # no /proc: not measured


# ---- the judgement ----------------------------------------------------------------------------------
def test_a_quiet_machine_is_recorded_and_passes(capsys):
    monitor = fake_monitor(before=0.02, during=0.05)
    monitor.begin(1.0, allow_busy=False)
    assert monitor.end().other_cores == pytest.approx(0.05)
    out = capsys.readouterr()
    assert out.err == ""
    assert "load: other processes kept 0.02 of 2 cores busy during a 1.0 s check before the run" in out.out
    assert "0.05 of 2 cores busy on average during the run" in out.out
    assert monitor.record() == {"measured": True, "cpus": 2, "limit_cores": load.LIMIT_CORES,
                                "before": {"seconds": 1.0, "other_cores": 0.02, "share": 0.01},
                                "during": {"seconds": 1.0, "other_cores": 0.05, "share": 0.025},
                                "busy": False, "allow_busy": False}


@pytest.mark.parametrize("before, during", [(0.3, 0.0), (0.0, 0.3)])
def test_a_busy_machine_is_refused_before_or_after_the_run(before, during):
    monitor = fake_monitor(before, during)
    with pytest.raises(BusyMachine, match="--allow-busy") as refused:
        monitor.begin(1.0, allow_busy=False)
        monitor.end()
    assert "0.30 of 2 cores" in str(refused.value) and "\n" not in str(refused.value)
    assert monitor.busy


def test_allow_busy_warns_in_one_line_and_records_it(capsys):
    monitor = fake_monitor(before=0.0, during=1.5)
    monitor.begin(1.0, allow_busy=True)
    monitor.end()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("warning: the machine is busy") and "1.50 of 2 cores" in err
    record = monitor.record()
    assert record["busy"] and record["allow_busy"] and record["during"]["other_cores"] == 1.5


def test_no_proc_stat_is_said_and_not_judged(capsys):
    monitor = LoadMonitor(reader=lambda: None, sleep=lambda s: None)
    monitor.begin(1.0, allow_busy=False)
    assert monitor.end() is None
    assert capsys.readouterr().out.count("load: not measured") == 1
    assert monitor.record()["measured"] is False and monitor.record()["before"] is None


def test_the_idle_check_waits_its_seconds_or_not_at_all():
    waits = []
    monitor = LoadMonitor(reader=lambda: snapshots(0.0)[0], sleep=waits.append)
    monitor.begin(0.0, allow_busy=False)
    assert waits == [] and monitor.loads["before"] is None
    monitor.begin(2.5, allow_busy=False)
    assert waits == [2.5]


# ---- every mode through the one run -----------------------------------------------------------------
MODES = {"workloads": ["--tiny", "--device", "cpu"], "onnx": ["--onnx", "EXPORT"], "search": ["--search", "random"]}


@pytest.fixture
def stub_modes(monkeypatch):
    """Each mode's measurement and table replaced by a stub that records its call."""
    import bertcf.bench.search as search

    calls = []

    def measure(mode):
        def run(*args):
            calls.append(mode)
            return {"info": {"mode": mode}, "results": {mode: {"x": 1}}}
        return run

    def report(mode):
        return lambda out: calls.append(f"{mode} table")

    monkeypatch.setattr(bench, "run_workloads", measure("workloads"))
    monkeypatch.setattr(bench, "print_workloads_report", report("workloads"))
    monkeypatch.setattr(bench, "run_onnx", measure("onnx"))
    monkeypatch.setattr(bench, "print_onnx", report("onnx"))
    monkeypatch.setattr(search, "run_search", measure("search"))
    monkeypatch.setattr(search, "print_search", report("search"))
    return calls


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_records_the_load_in_its_json(mode, stub_modes, tmp_path):
    out = tmp_path / "out.json"
    result = bench.run([*MODES[mode], "--json", str(out)], monitor=fake_monitor(0.01, 0.02))
    assert stub_modes == [mode, f"{mode} table"]
    written = json.loads(out.read_text())
    assert written["info"]["load"]["during"]["other_cores"] == 0.02 and written["info"]["load"]["busy"] is False
    assert written == json.loads(json.dumps(result, default=str))


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_refuses_a_busy_machine_before_it_runs(mode, stub_modes, capsys, tmp_path):
    status = run_main(functools.partial(bench.run, monitor=fake_monitor(0.5, 0.0)),
                      [*MODES[mode], "--json", str(tmp_path / "out.json")])
    assert status == 2
    assert_one_error_line(capsys, "the machine is busy", "0.50 of 2 cores", "before the run", "--allow-busy")
    assert stub_modes == [] and not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_withholds_figures_taken_under_load(mode, stub_modes, capsys, tmp_path):
    status = run_main(functools.partial(bench.run, monitor=fake_monitor(0.0, 0.8)),
                      [*MODES[mode], "--json", str(tmp_path / "out.json")])
    assert status == 2
    assert_one_error_line(capsys, "0.80 of 2 cores busy on average during the run", "not reported")
    assert stub_modes == [mode] and not (tmp_path / "out.json").exists()  # measured, neither table nor JSON


def test_allow_busy_reports_and_marks_the_json(stub_modes, capsys, tmp_path):
    out = tmp_path / "out.json"
    assert run_main(functools.partial(bench.run, monitor=fake_monitor(0.5, 0.8)),
                    ["--search", "random", "--allow-busy", "--json", str(out)]) == 0
    assert capsys.readouterr().err.count("warning: the machine is busy") == 2  # before and during
    record = json.loads(out.read_text())["info"]["load"]
    assert record["busy"] and record["allow_busy"] and record["before"]["other_cores"] == 0.5


def test_bad_load_check_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        bench.build_parser().parse_args(["--load-check", "-1"])
    assert e.value.code == 2
    assert_one_error_line(capsys, "--load-check", "-1")


# ---- real processes ---------------------------------------------------------------------------------
#: A process that takes {s} s of CPU time (whatever the wall time it needs on a busy machine), says
#: "done", and lives on until its stdin closes. Counting CPU time, not wall time, keeps the assertions
#: below free of timing: the interval holds at least its {s} s however busy the machine is.
SPIN = ("import sys, time\nstart = time.process_time()\nprint('spinning', flush=True)\n"
        "while time.process_time() - start < {s}:\n    pass\nprint('done', flush=True)\nsys.stdin.read()\n")


def test_a_process_spinning_beside_the_bench_is_seen():
    """A process that is not the bench's (started through a shell that exits at once, so it is no
    descendant) spinning for 0.4 s of CPU: the run's load counts at least 0.3 s of other work (it
    spins one core; whatever else runs beside it only adds)."""
    shell = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "$0" </dev/null &', SPIN.format(s=0.4)],
                             stdout=subprocess.PIPE, text=True)
    shell.wait()
    try:
        assert shell.stdout.readline().strip() == "spinning"
        monitor = LoadMonitor(limit_cores=float("inf"))
        monitor.begin(0, allow_busy=False)
        assert shell.stdout.readline().strip() == "done"
        interval = monitor.end()
        assert interval.other_cores * interval.seconds > 0.3
    finally:
        shell.stdout.read()  # its end: the spinner closes the pipe when it exits
        shell.stdout.close()


def test_the_bench_s_own_children_are_its_own():
    """A child of the bench spinning for 0.4 s of CPU (as torch.compile's workers do), not yet
    waited for: its CPU time counts as the bench's own, which os.times alone would miss until the wait."""
    child = subprocess.Popen([sys.executable, "-c", SPIN.format(s=0.4)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "spinning"
        start = load.own_seconds()
        assert child.stdout.readline().strip() == "done"
        assert load.own_seconds() - start > 0.3  # the child is alive, so os.times has none of it yet
    finally:
        child.stdin.close()
        child.wait()
        child.stdout.close()
