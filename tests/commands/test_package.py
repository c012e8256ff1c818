"""The package as pip builds and installs it: a wheel whose metadata lists requirements.txt's
dependencies and the eight commands, and installed commands that run from outside the repository."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import run_side_by_side

REPO = Path(__file__).resolve().parents[2]
COMMANDS = {"bertcf-pretrain": "run_pretrain.py", "bertcf-multitask": "run_multitask.py",
            "bertcf-evaluate": "python -m bertcf.evaluate", "bertcf-experiments": "python -m bertcf.experiments",
            "bertcf-bench": "python -m bertcf.bench", "bertcf-export": "python -m bertcf.export",
            "bertcf-encode": "python -m bertcf.encode", "bertcf-search": "python -m bertcf.search",
            "bertcf-cross": "python -m bertcf.cross", "bertcf-gpl": "python -m bertcf.gpl"}


def requirements() -> list[str]:
    lines = (REPO / "requirements.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel pip builds from a copy of the source tree (so no build/ lands in the repository)."""
    pytest.importorskip("setuptools", minversion="70.1")  # pip install -e ".[test]" brings it
    tmp = tmp_path_factory.mktemp("package")
    source = tmp / "src"
    anywhere = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info")

    def ignore(directory, names):  # runs/, data/ ... at the top only: bertcf/data/ is a package
        top = {"runs", "data", "build", "dist", ".gpu"} if Path(directory) == REPO else set()
        return anywhere(directory, names) | (top & set(names))
    shutil.copytree(REPO, source, ignore=ignore)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                           str(tmp / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    wheels = list((tmp / "dist").glob("bertcf-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def dist_info(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        return z.read(next(n for n in z.namelist() if n.endswith(f".dist-info/{name}"))).decode()


@pytest.mark.slow
def test_the_wheel_lists_the_dependencies_and_the_commands(wheel):
    from packaging.requirements import Requirement

    def ranges(lines):
        return {(r.name, r.specifier) for r in map(Requirement, lines) if r.marker is None}
    metadata = dist_info(wheel, "METADATA")
    required = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert ranges(required) == ranges(requirements())  # one source: requirements.txt
    assert any("pytest" in r and 'extra == "test"' in r for r in required)
    entry_points = dist_info(wheel, "entry_points.txt")
    for command in COMMANDS:
        assert f"{command} = " in entry_points, command
    with zipfile.ZipFile(wheel) as z:
        files = set(z.namelist())
    assert {"bertcf/objectives/mirror.py", "bertcf/experiments/suite.py", "minbert/model.py", "bertcf/st.py",
            "bertcf/data/tasks.py", "bertcf/search/quantization.py", "bertcf/search/__main__.py"} <= files


@pytest.mark.slow
def test_installed_commands_run_from_outside_the_repository(wheel, tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(site),
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = os.environ | {"PYTHONPATH": str(site)}  # the installed package; its dependencies from this environment
    done = run_side_by_side({command: [str(site / "bin" / command), "--help"] for command in COMMANDS} | {
        "where": [sys.executable, "-c", "import bertcf; print(bertcf.__file__)"]}, cwd=elsewhere, env=env)
    for command, prog in COMMANDS.items():
        proc = done[command]
        assert proc.returncode == 0, (command, proc.stderr[-2000:])
        assert proc.stdout.startswith(f"usage: {prog}"), (command, proc.stdout[:200])
    assert done["where"].stdout.startswith(str(site)), done["where"]  # not the repository's copy


#: Every command the README shows, as a user types it (from the repository root): its --help works.
DOCUMENTED = {
    "run_pretrain.py": [sys.executable, "run_pretrain.py"],
    "run_multitask.py": [sys.executable, "run_multitask.py"],
    "python -m bertcf.evaluate": [sys.executable, "-m", "bertcf.evaluate"],
    "python -m bertcf.experiments": [sys.executable, "-m", "bertcf.experiments"],
    "python -m bertcf.bench": [sys.executable, "-m", "bertcf.bench"],
    "python -m bertcf.data download": [sys.executable, "-m", "bertcf.data", "download"],
    "python -m bertcf.data beir-quora": [sys.executable, "-m", "bertcf.data", "beir-quora"],
    "python -m bertcf.data genq": [sys.executable, "-m", "bertcf.data", "genq"],
    "python -m bertcf.gpl": [sys.executable, "-m", "bertcf.gpl"],
    "python -m bertcf.st_format": [sys.executable, "-m", "bertcf.st_format"],
    "bertcf-export onnx": [sys.executable, "-m", "bertcf.export", "onnx"],
    "bertcf-encode": [sys.executable, "-m", "bertcf.encode"],
    "python -m bertcf.search build": [sys.executable, "-m", "bertcf.search", "build"],
    "python -m bertcf.search query": [sys.executable, "-m", "bertcf.search", "query"],
    "python -m bertcf.cross train": [sys.executable, "-m", "bertcf.cross", "train"],
    "python -m bertcf.cross evaluate": [sys.executable, "-m", "bertcf.cross", "evaluate"],
}


@pytest.fixture(scope="module")
def documented_help() -> dict:
    """Each documented command's ``--help``, run side by side once for the module: name -> its CompletedProcess."""
    return run_side_by_side({name: argv + ["--help"] for name, argv in DOCUMENTED.items()}, cwd=REPO)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_every_documented_command_answers_help(documented_help, name):
    proc = documented_help[name]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage:"), proc.stdout[:200]


@pytest.mark.slow  # starts a Python process
def test_the_downloader_starts_without_torch():
    """``python -m bertcf.data download`` runs where torch is not installed yet (a fresh machine)."""
    code = ("import sys, runpy; sys.argv = ['bertcf.data', 'download', '--help']\n"
            "try:\n    runpy.run_module('bertcf.data', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch was imported'")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_names_earlier_versions_used_still_import():
    """Old checkpoints' modules.json names ``bertcf.st.Flow``; code written before the layout of
    2026-11-25 imports ``bertcf.flow.Glow``."""
    from bertcf.flow import Glow
    from bertcf.models.flow import Glow as ModelsGlow
    from bertcf.models.st_flow import Flow as ModelsFlow
    from bertcf.st import Flow

    assert Flow is ModelsFlow and Glow is ModelsGlow
