"""The README's commands, walked in order as a newcomer runs them (issue 59), so that the page cannot
drift from the code: every command of its shell blocks and every Python block runs, in this
process, through the command's own entry point, and must end with exit status 0. The stage-3
page, docs/multitask.md, is walked the same way (issue 66), after the Quick start's stage-1 run.

What is substituted, and why (``SUBSTITUTIONS``, ``BOUNDS``, ``SKIPPED``):

| in the README | in the walk | why |
| --- | --- | --- |
| ``bert-base-uncased`` (named, or ``run_pretrain.py``'s default ``--model``) | a tiny random BERT | no download, seconds a run |
| ``data/`` | ``data/`` of a scratch directory (the working directory): the nine CS224N files, a few rows each, a small ``wiki1m_for_simcse.txt`` and SentEval's layout | what ``python -m bertcf.data download`` (with ``--senteval``) leaves, in small |
| ``runs/<...>`` (``runs/<run>``, ``runs/<mirror run>``) | ``runs/mirror``: the Quick start's stage-1 run (given that ``--out-dir``) | the run the page means |
| ``runs/<multitask run>`` | ``runs/stage3``: the walk's first stage-3 run (given that ``--out-dir``) | the run the page means |
| ``examples/`` | the repository's ``examples/`` | the sample files |
| a training command's length | ``BOUNDS``: a few steps of small batches, on the CPU, no progress; ``steps=`` of a Python block: 2 | bounded steps |
| ``python -m bertcf.experiments`` | ``--dry-run`` | its plan, not hours of runs |
| ``pip install``, ``python -m pytest``, ``python -m bertcf.data download`` | skipped | the install and the tests are this; the download is the data above |
| ``python -m bertcf.multitask.compare``, ``python -m bertcf.multitask.curves`` | skipped | they read runs over seeds (``RUNS_DIR``); tests/multitask/test_compare.py and test_curves.py run them |

A block indented in a list item is walked as any other; its YAML task files are checked against
the files in ``examples/`` by tests/multitask/test_first_run.py.

A command of a form the walk does not know (a new tool, a new script) fails the test: extend the
tables rather than let the page go unchecked. It takes about a minute on a small CPU: marked slow.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import runpy
import shlex
import sys
import tomllib
import warnings
from importlib import import_module
from pathlib import Path

import pytest
from helpers import make_hf_bert_dir, write_cs224n_files, write_lines, write_senteval

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
STAGE3_PAGE = ROOT / "docs" / "multitask.md"

#: Commands not run, by their first words: the install and the tests (this is them), and the
#: downloads (the scratch data directory stands for what they fetch).
SKIPPED = (("pip",), ("python", "-m", "pytest"), ("python", "-m", "bertcf.data", "download"),
           ("python", "-m", "bertcf.multitask.compare"), ("python", "-m", "bertcf.multitask.curves"))
#: Flags added to a command (after the README's, so that they win), by the command and, for a
#: command with subcommands, its subcommand.
BOUNDS = {
    "run_pretrain.py": ["--steps", "2", "--eval-every", "2", "--batch-size", "4", "--max-length", "32", "--device",
                        "cpu", "--progress", "none"],
    "run_multitask.py": ["--steps", "2", "--eval-every", "2", "--batch-size", "4", "--max-length", "32", "--device",
                         "cpu", "--progress", "none"],
    "bertcf.cross train": ["--steps", "2", "--eval-every", "2", "--batch-size", "4", "--device", "cpu", "--progress",
                           "none"],
    "bertcf.experiments": ["--dry-run"],
    "bertcf.evaluate": ["--device", "cpu", "--no-progress"],
}
#: Commands that write a run directory, and where it goes when the README gives no --out-dir.
TRAINING = ("run_pretrain.py", "run_multitask.py", "bertcf.cross train")
RUN = "runs/mirror"  # the Quick start's stage-1 run: what runs/<run> and runs/<mirror run> name
STAGE3_RUN = "runs/stage3"  # the walk's first stage-3 run: what runs/<multitask run> names
MODEL_NAMES = ("bert-base-uncased", "MODEL")


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block, in order; language "" for a bare fence. A block
    indented in a list item loses its indentation."""
    blocks = re.finditer(r"^( *)```([^\n]*)\n(.*?)^\1```", text, re.M | re.S)
    return [(m.group(2).strip(), re.sub(rf"^{m.group(1)}", "", m.group(3), flags=re.M)) for m in blocks]


def placeholders(text: str) -> str:
    """``runs/<multitask run>`` the walk's stage-3 run, any other ``runs/<...>`` its stage-1 run."""
    return re.sub(r"runs/<[^>]+>", RUN, text.replace("runs/<multitask run>", STAGE3_RUN))


def shell_commands(body: str) -> list[list[str]]:
    """The commands of a shell block, each split as the shell does (comments dropped, lines ending
    in a backslash joined), the placeholders ``runs/<...>`` (which a reader replaces, and a shell
    would read as a redirection) the walk's run first."""
    body = placeholders(body.replace("\\\n", " "))
    return [words for line in body.splitlines() if (words := shlex.split(line, comments=True))]


def skipped(words: list[str]) -> bool:
    return any(words[:len(prefix)] == list(prefix) for prefix in SKIPPED) or "&&" in words


def scripts() -> dict[str, str]:
    """pyproject.toml's console scripts: {name: "module:function"}."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def command_key(words: list[str]) -> tuple[str, str, list[str]]:
    """(kind, the key of BOUNDS and TRAINING, the arguments) of a command the walk runs: kind
    "script" (python run_*.py), "module" (python -m M) or "console" (an installed bertcf-* command)."""
    if words[0] == "python" and len(words) > 1 and words[1].endswith(".py"):
        return "script", words[1], words[2:]
    if words[:2] == ["python", "-m"] and len(words) > 2:
        sub = f" {words[3]}" if len(words) > 3 and not words[3].startswith("-") else ""
        return "module", words[2] + sub, words[3:]
    if words[0] in scripts():
        module = scripts()[words[0]].split(":")[0]
        sub = f" {words[1]}" if len(words) > 1 and not words[1].startswith("-") else ""
        return "console", module.rsplit(".", 1)[-1] if module.startswith("bertcf.commands.") else module, words[1:]
    raise AssertionError(f"the README walk does not know how to run {shlex.join(words)!r}: add it to "
                         f"tests/test_readme.py's tables")


def substituted(args: list[str], tiny: Path) -> list[str]:
    """The README's arguments with the model substituted (data/, runs/ and examples/ are the scratch
    directory's, the walk's working directory)."""
    return [str(tiny) if arg in MODEL_NAMES else arg for arg in args]


def bounded(key: str, args: list[str], tiny: Path, index: int) -> list[str]:
    """``args`` with the command's bounds, a model where the README leaves run_pretrain.py's default
    (bert-base-uncased), and an --out-dir for a training command that gives none (the first
    stage-1 run: runs/mirror)."""
    args = list(args)
    if key == "run_pretrain.py" and not {"--model", "--init", "--resume"} & set(args):
        args += ["--model", str(tiny)]
    if any(key.startswith(t) for t in TRAINING) and "--out-dir" not in args:
        first = {"run_pretrain.py": RUN, "run_multitask.py": STAGE3_RUN}.get(key)
        args += ["--out-dir", first if first and not (Path.cwd() / first).exists() else f"runs/walk-{index}"]
    for name, extra in BOUNDS.items():
        if key == name or key.startswith(name + " "):
            args += extra
    return args


def run(kind: str, key: str, words: list[str], args: list[str]) -> int:
    """The command's exit status, run in this process through its entry point."""
    old = sys.argv
    try:
        if kind == "script":
            sys.argv = [words[1], *args]
            runpy.run_path(str(ROOT / words[1]), run_name="__main__")
        elif kind == "module":
            sys.argv = [words[2], *args]
            with warnings.catch_warnings():  # a module imported already (bertcf.evaluate) runs again as __main__
                warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
                runpy.run_module(words[2], run_name="__main__", alter_sys=True)
        else:
            module, function = scripts()[words[0]].split(":")
            sys.argv = [words[0], *args]
            return int(getattr(import_module(module), function)() or 0)
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        sys.argv = old
    return 0


def python_block(body: str, tiny: Path) -> str:
    """A Python block as the walk runs it: the model named in it the tiny BERT, the runs the
    walk's, ``steps=`` 2."""
    body = placeholders(body.replace('"bert-base-uncased"', repr(str(tiny))))
    return re.sub(r"\bsteps=[\d_]+", "steps=2", body)


@pytest.fixture
def scratch(tmp_path, monkeypatch, vocab_path) -> tuple[Path, Path]:
    """(the working directory, the tiny BERT): data/ as after the README's set-up, in small."""
    data = write_cs224n_files(tmp_path / "data")
    write_senteval(data / "SentEval")
    sentences = [line for f in ("sentences.txt", "calibration.txt", "docs.txt")
                 for line in (ROOT / "examples" / f).read_text(encoding="utf-8").splitlines()]
    write_lines(data / "wiki1m_for_simcse.txt", sentences)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    tiny = make_hf_bert_dir(tmp_path / "tiny-bert", vocab_path, max_position_embeddings=128)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BERTCF_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path, tiny


def test_the_tables_name_commands_that_exist():
    """Every bounded command and every console script the walk may meet is one the project has."""
    assert set(scripts()) >= {"bertcf-export", "bertcf-encode"}
    for key in BOUNDS:
        module = key.split()[0]
        assert (ROOT / module).is_file() if module.endswith(".py") else import_module(module), key


@pytest.mark.parametrize("page", [README, STAGE3_PAGE], ids=["README", "multitask"])
def test_the_walk_parses_the_page(page):
    blocks = code_blocks(page.read_text(encoding="utf-8"))
    commands = [w for lang, body in blocks if lang in ("", "bash", "sh") for w in shell_commands(body)]
    assert any(w[:2] == ["python", "run_pretrain.py" if page == README else "run_multitask.py"] for w in commands)
    assert any(lang == "python" for lang, _ in blocks)
    for words in commands:  # every command is one the walk can run, or one it skips on purpose
        if not skipped(words):
            command_key(words)


def walk(blocks: list[tuple[str, str]], tiny: Path, capsys, page: str) -> list[str]:
    """Run every command of the shell blocks and every Python block of ``blocks``, in order, each
    to exit status 0 (see the module's docstring); returns what ran."""
    ran = []
    for index, (lang, body) in enumerate(blocks):
        if lang == "python":
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(python_block(body, tiny), f"{page} block {index}", "exec"), {"__name__": "readme"})
            ran.append(f"python block {index}")
            continue
        if lang not in ("", "bash", "sh"):
            continue
        for words in shell_commands(body):
            if skipped(words):
                continue
            kind, key, args = command_key(words)
            args = bounded(key, substituted(args, tiny), tiny, len(ran))
            capsys.readouterr()
            status = run(kind, key, words, args)
            captured = capsys.readouterr()
            assert status == 0, f"{page}: {shlex.join(words)}\n  ran as {shlex.join(args)}\n  exit {status}: " \
                                f"{(captured.err or captured.out)[-1500:]}"
            ran.append(shlex.join(words))
    print(f"{page} walk:", *ran, sep="\n  ")
    return ran


@pytest.mark.slow
def test_every_readme_command_runs_as_written(scratch, capsys):
    pytest.importorskip("faiss", reason="the README's search commands need the [search] extra")
    _, tiny = scratch
    ran = walk(code_blocks(README.read_text(encoding="utf-8")), tiny, capsys, "README.md")
    assert len(ran) >= 10, ran  # the walk reached the stages, the evaluation, the Python API and serving
    assert os.path.isdir(RUN)


@pytest.mark.slow
def test_every_stage3_page_command_runs_as_written(scratch, capsys):
    """docs/multitask.md from a clone, after the Quick start's stage-1 run: its task files and the
    samples in examples/, the --task example, the Python example, --predict-only of its run."""
    _, tiny = scratch
    walk([("", "python run_pretrain.py --stage mirror\n")], tiny, capsys, "the Quick start")
    ran = walk(code_blocks(STAGE3_PAGE.read_text(encoding="utf-8")), tiny, capsys, "docs/multitask.md")
    assert sum("run_multitask.py" in r for r in ran) >= 5 and any(r.startswith("python block") for r in ran), ran
    assert (Path(STAGE3_RUN) / "predictions" / "para-dev-output.csv").is_file()
    assert (Path("runs") / "mt-python" / "metrics.json").is_file()
