"""Whether the bench ran alone: the CPU time other processes took, before and during a run.

A timing is only worth reporting when the bench had its cores to itself. In issue 60, work running
beside ``--onnx`` slowed torch more than ONNX Runtime and inflated every ratio by about 1.6x, and
nothing in the output said so. So every mode of the command (the workloads, ``--onnx``,
``--search``) runs inside one :class:`LoadMonitor` (``bertcf.commands.bench.run``), which reads the
kernel's counters: the busy time of the CPUs the bench may run on (``/proc/stat``) minus the CPU time
of the bench's own process tree (its threads, and its children: torch.compile's workers), over the
same interval, is the time other work took. It is measured twice: in a short idle check before
anything is loaded (a machine busy already is caught before a long run starts), and over the whole
run. Either above :data:`LIMIT_CORES` refuses the run, or its report (:class:`BusyMachine`: one
line, exit status 2), unless ``--allow-busy``, which goes on with a one-line warning. The JSON
records both intervals (``info.load``, :meth:`LoadMonitor.record`).

The counters come through an injectable ``reader`` (a callable returning :class:`Counters`), so
that the arithmetic and the refusals are testable on made-up snapshots.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import UsageError

#: Other work above this many cores' worth (averaged over an interval) makes the machine busy. The
#: kernel's counters tick in 1/SC_CLK_TCK s (0.01 s on Linux), so over the 1-s idle check a tick is
#: 0.01 of a core: 0.10 is ten ticks, clear of the counters' rounding (a tick or two) and of an idle
#: machine's background (the kernel, a shell: a few hundredths), so a quiet machine passes; any
#: process doing real work beside the bench (a test run, an install, a compile) takes tenths of a
#: core or more, so it is caught. On the project's 2 cores, 0.10 is 5% of the machine: the most
#: other work may take with the run still counted as alone.
LIMIT_CORES = 0.10
DEFAULT_CHECK_S = 1.0  # the idle check before a run: long enough for ten ticks a core, short beside any run

PROC = Path("/proc")
#: /proc/stat's columns after ``cpuN``: user nice system idle iowait irq softirq steal guest guest_nice.
#: Busy: user, nice, system, irq, softirq and steal (a hypervisor running another machine on this CPU
#: slows the bench as much as a process would). idle and iowait are idle. guest and guest_nice are
#: already counted inside user and nice, so they are left out.
BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)
IDLE_COLUMNS = (3, 4)


class BusyMachine(UsageError):
    """Other work took more than :data:`LIMIT_CORES` before or during a run, and ``--allow-busy``
    was not given: one line, exit status 2 (``cli.run_main``)."""


@dataclass(frozen=True)
class Counters:
    """One snapshot, in CPU seconds since boot (only differences between two are meaningful)."""
    busy: float   # the CPUs' busy time, summed over the CPUs the bench may run on
    total: float  # those CPUs' busy + idle time: the wall time they have run, times their number
    own: float    # the bench's process tree: this process (every thread) and its children
    cpus: int


@dataclass(frozen=True)
class Load:
    """What other work took over one interval."""
    seconds: float      # the interval's wall time, from the CPUs' own clocks (total / cpus)
    other_cores: float  # the average number of cores other work kept busy (1.0: one core, all the time)
    cpus: int

    @property
    def share(self) -> float:
        """other_cores as a share of the CPUs the bench may use."""
        return self.other_cores / self.cpus

    def as_dict(self) -> dict:
        return {"seconds": round(self.seconds, 3), "other_cores": round(self.other_cores, 4),
                "share": round(self.share, 4)}

    def describe(self) -> str:
        return f"{self.other_cores:.2f} of {self.cpus} cores"


def between(a: Counters, b: Counters) -> Load:
    """The load from snapshot ``a`` to ``b``: (busy - own) / wall. Clipped at 0: the kernel rounds
    the machine's and the process's counters separately, so an idle interval can come out a tick
    below zero."""
    wall = (b.total - a.total) / b.cpus
    other = (b.busy - a.busy) - (b.own - a.own)
    return Load(wall, max(0.0, other) / wall if wall > 0 else 0.0, b.cpus)


def parse_proc_stat(text: str, cpus=None) -> tuple[int, int, int]:
    """(busy ticks, total ticks, CPUs counted) from /proc/stat's ``cpuN`` lines, of the CPUs in
    ``cpus`` (None: all). Per CPU rather than the summary line, so that a process pinned to some
    CPUs (a container's cpuset reading the host's /proc/stat) is not blamed for work on others."""
    busy = total = n = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        values = [int(v) for v in rest.split()]
        values += [0] * (8 - len(values))  # old kernels write fewer columns
        busy += sum(values[i] for i in BUSY_COLUMNS)
        total += sum(values[i] for i in BUSY_COLUMNS + IDLE_COLUMNS)
        n += 1
    if not n:
        raise ValueError("no cpuN lines")
    return busy, total, n


def descendants(pid: int, proc: Path = PROC) -> list[int]:
    """The live descendants of ``pid`` (/proc/PID/task/TID/children, recursively)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for children in (proc / str(parent) / "task").glob("*/children"):
            try:
                kids = [int(c) for c in children.read_text().split()]
            except OSError:  # the thread or process ended meanwhile
                continue
            found += kids
            todo += kids
    return found


def process_ticks(pid: int, proc: Path = PROC) -> int:
    """utime + stime + cutime + cstime of /proc/PID/stat (0 when it ended meanwhile): the process's
    own threads and the children it has waited for."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return 0
    fields = text.rpartition(")")[2].split()  # after the command name, which may hold spaces and ')'
    return sum(int(fields[i]) for i in (11, 12, 13, 14))  # fields 14-17 of proc(5), counted from state (3)


def own_seconds(proc: Path = PROC) -> float:
    """CPU seconds of the bench's process tree: this process, every thread of it (os.times is
    process-wide), the children it has waited for, and its live descendants, which os.times does not
    see until they are waited for (torch.compile's worker pool lives as long as the run). The
    descendants are read first: a child reaped in between is then counted twice (the load reads a
    little low for a moment), never missed (which would blame the bench's own work on others)."""
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    children = sum(process_ticks(pid, proc) for pid in descendants(os.getpid(), proc)) / ticks_per_s
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system + children


def read_counters(proc: Path = PROC) -> Counters | None:
    """The snapshot of this machine now, or None where there is no /proc/stat to read (not Linux)."""
    try:
        text = (proc / "stat").read_text()
    except OSError:
        return None
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    busy, total, n = parse_proc_stat(text, cpus)
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    return Counters(busy / ticks_per_s, total / ticks_per_s, own_seconds(proc), n)


class LoadMonitor:
    """The load before a run (an idle check) and during it, each printed in one line and judged
    against ``limit_cores``: ``begin`` before anything is loaded, ``end`` before anything is
    reported; :meth:`record` is what the JSON keeps. ``reader``: returns :class:`Counters`, or None
    where the machine cannot tell (then nothing is judged, and the record says so); ``sleep``: the
    idle check's wait (tests pass a no-op)."""

    def __init__(self, reader: Callable[[], Counters | None] = read_counters,
                 sleep: Callable[[float], None] = time.sleep, limit_cores: float = LIMIT_CORES):
        self.reader, self.sleep, self.limit_cores = reader, sleep, limit_cores
        self.loads: dict[str, Load | None] = {"before": None, "during": None}
        self.measured = True
        self.busy = False
        self.allow_busy = False
        self._start: Counters | None = None

    def _read(self) -> Counters | None:
        counters = self.reader()
        if counters is None and self.measured:
            print("load: not measured (no /proc/stat on this machine)", flush=True)
            self.measured = False
        return counters

    def begin(self, check_seconds: float, allow_busy: bool) -> None:
        """The idle check (the load over ``check_seconds`` of waiting; 0: none), then the run's start."""
        self.allow_busy = allow_busy
        if check_seconds > 0:
            a = self._read()
            self.sleep(check_seconds)
            b = self._read()
            if a is not None and b is not None:
                load = self.loads["before"] = between(a, b)
                self._judge(load, f"during a {load.seconds:.1f} s check before the run", "; run the bench alone, "
                            "or pass --allow-busy to run it anyway (the load goes into the JSON)")
        self._start = self._read()

    def end(self) -> Load | None:
        """The load over the run since :meth:`begin`, judged before anything is reported."""
        end = self._read()
        if self._start is None or end is None:
            return None
        load = self.loads["during"] = between(self._start, end)
        self._judge(load, f"on average during the run ({load.seconds:.1f} s)",
                    ", so its figures are not reported; run the bench alone, or pass --allow-busy to report them "
                    "(marked busy in the JSON)")
        return load

    def _judge(self, load: Load, when: str, advice: str) -> None:
        """Print the load's line; above the limit, refuse (BusyMachine) or, with --allow-busy, warn."""
        line = f"other processes kept {load.describe()} busy {when}"
        if load.other_cores <= self.limit_cores:
            print(f"load: {line} (limit {self.limit_cores:.2f})", flush=True)
            return
        self.busy = True
        if not self.allow_busy:
            raise BusyMachine(f"the machine is busy: {line}, above the limit of {self.limit_cores:.2f}{advice}")
        print(f"load: {line}", flush=True)
        print(f"warning: the machine is busy ({line}, limit {self.limit_cores:.2f}): --allow-busy, so the figures "
              f"are reported, marked busy in the JSON", file=sys.stderr, flush=True)

    def record(self) -> dict:
        """The JSON's ``info.load``: whether it was measured, the CPUs, the limit, each interval's
        seconds, other_cores and share (None: not measured), whether it was busy and allowed."""
        cpus = next((load.cpus for load in self.loads.values() if load), None)
        return {"measured": self.measured, "cpus": cpus, "limit_cores": self.limit_cores,
                **{name: load.as_dict() if load else None for name, load in self.loads.items()},
                "busy": self.busy, "allow_busy": self.allow_busy}
