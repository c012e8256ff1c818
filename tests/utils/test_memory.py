"""utils.memory: the process's peak resident set against the kernel's own count (/proc), and its
growth by a buffer written in a fresh process."""
import subprocess
import sys
from pathlib import Path

import pytest

from bertcf.utils.memory import peak_memory_mb

STATUS = Path("/proc/self/status")


def kernel_mib(field: str) -> float:
    """VmHWM (the resident set's high-water mark) or VmRSS from /proc, in MiB."""
    line = next(l for l in STATUS.read_text().splitlines() if l.startswith(field + ":"))
    return int(line.split()[1]) / 1024


@pytest.mark.skipif(not STATUS.exists(), reason="no /proc/self/status on this system (Linux only)")
def test_the_peak_is_the_kernels_high_water_mark():
    peaks = peak_memory_mb("cpu")
    assert set(peaks) == {"peak_rss_mb"}  # no GPU figure on the CPU
    assert peaks["peak_rss_mb"] == pytest.approx(kernel_mib("VmHWM"), abs=8)
    assert peaks["peak_rss_mb"] >= kernel_mib("VmRSS") - 8


@pytest.mark.skipif(not STATUS.exists(), reason="no /proc/self/status on this system (Linux only)")
def test_the_peak_grows_by_what_a_fresh_process_writes():
    """512 MiB written (torch.ones: every page touched) put a fresh process's peak at its resident set
    before them plus about 512 MiB (or leave it where it was, were that higher)."""
    code = ("import torch; from bertcf.utils.memory import peak_memory_mb as p\n"
            "from pathlib import Path\n"
            "rss = next(int(l.split()[1]) for l in Path('/proc/self/status').read_text().splitlines()\n"
            "           if l.startswith('VmRSS:')) / 1024\n"
            "a = p('cpu')['peak_rss_mb']; x = torch.ones(2 ** 27); b = p('cpu')['peak_rss_mb']\n"
            "print(rss, a, b)")
    rss, before, after = map(float, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                                   check=True).stdout.split())
    assert after >= rss + 500
    assert after <= max(before, rss + 512) + 16
