"""The code's layout holds what the code map (README.md, docs/code-map.md) says: packages by concern
in layers, every import pointing down a layer or within its own package, no import circles, and
the size limits (a function at most 80 lines, a class at most 250, a module of bertcf at most
400); and no command's parsed arguments are assigned to after parsing."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bertcf", "minbert")
#: The layers, bottom up: a module may import its own layer or a lower one. A key is a module or a
#: package of bertcf (its first name under bertcf), or minbert. A ``__main__`` module (a package's
#: ``python -m`` alias of a command) is in the top layer, whatever its package.
LAYERS = {
    "minbert": 0, "errors": 0, "utils": 0,
    # settings: the machinery of typed settings (a field, its flag, its check) that objectives and
    # config both build on.
    "runs": 1, "cli": 1, "settings": 1, "data": 1, "search": 1,
    "models": 2,
    "evaluation": 3, "backend": 3,
    # One layer each, so that an import back up (config -> training, objectives -> config) fails:
    # an objective declares its settings, a config composes them, training runs a config.
    "objectives": 4,
    "config": 5,
    "training": 6,
    # Stage 3's workflow (its settings, data, model, training, evaluation): above training, whose
    # loop it runs, and below bench and experiments, which run it.
    "multitask": 7,
    "bench": 8,
    "experiments": 9,
    # The commands; the package's Python API (__init__); the ``python -m`` names of commands and
    # the names earlier versions used (evaluate, encode, export, st_format; st, flow).
    "commands": 10, "__init__": 10, "evaluate": 10, "encode": 10, "export": 10, "st_format": 10, "st": 10,
    "flow": 10, "gpl": 10, "cross": 10,
}
TOP_LAYER = max(LAYERS.values())
MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 250
MAX_MODULE_LINES = 400
ONE_FILE_MODELS = ("minbert/model.py",)  # minBERT stays one readable file, as nanoGPT's model.py


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict) -> set[str]:
    """The project modules ``name`` imports, anywhere in the file (lazy imports in functions too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                out.add(target if target in known else base)
    return {m for m in out if m in known and m != name}


def layer(module: str) -> int:
    parts = module.split(".")
    if parts[-1] == "__main__":
        return TOP_LAYER
    key = parts[0] if parts[0] == "minbert" else parts[1] if len(parts) > 1 else "__init__"
    return LAYERS[key]


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_every_module_has_a_layer():
    assert [m for m in modules() if not _has_layer(m)] == []


def _has_layer(module: str) -> bool:
    try:
        layer(module)
    except KeyError:
        return False
    return True


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    return [f"{a} -> {b}" for a, targets in sorted(edges.items()) for b in sorted(targets) if layer(b) > layer(a)]


def test_imports_point_down_or_sideways_within_a_layer():
    assert upward_imports(graph()) == []


def test_no_import_circles():
    edges = graph()
    state, circles = {}, []

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                circles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert circles == []


def test_the_layout_test_finds_a_circle_and_an_upward_import(tmp_path, monkeypatch):
    """The checks above can fail: a circle and an upward import planted in a copy are found."""
    pkg = tmp_path / "bertcf"
    (pkg / "utils").mkdir(parents=True)
    (tmp_path / "minbert").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "utils" / "__init__.py").write_text("")
    (pkg / "utils" / "files.py").write_text("from ..runs import STATE_FILE\n")
    (pkg / "runs.py").write_text("from .utils.files import write\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    edges = graph()
    assert "bertcf.runs" in edges["bertcf.utils.files"] and "bertcf.utils.files" in edges["bertcf.runs"]
    assert layer("bertcf.runs") > layer("bertcf.utils.files")


def test_the_layout_test_finds_imports_back_up_between_the_training_packages(tmp_path, monkeypatch):
    """The two back doors issue 58 found stay shut: a config module importing training for a
    constant, and an objective importing a config module for the settings machinery."""
    pkg = tmp_path / "bertcf"
    for sub in ("config", "training", "objectives"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (tmp_path / "minbert").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "settings.py").write_text("")
    (pkg / "training" / "sampler.py").write_text("MIX_SAMPLINGS = ()\n")
    (pkg / "config" / "fields.py").write_text("from ..settings import *\n")
    (pkg / "config" / "pretrain.py").write_text("from ..training.sampler import MIX_SAMPLINGS\n")
    (pkg / "objectives" / "base.py").write_text("from ..config.fields import Settings\nfrom ..settings import *\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert upward_imports(graph()) == ["bertcf.config.pretrain -> bertcf.training.sampler",
                                       "bertcf.objectives.base -> bertcf.config.fields"]


def test_functions_and_classes_stay_within_their_size_limits():
    too_long = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            limit = (MAX_CLASS_LINES if isinstance(node, ast.ClassDef)
                     else MAX_FUNCTION_LINES if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)
            if limit and node.end_lineno - node.lineno + 1 > limit:
                too_long.append(f"{name}:{node.name} ({node.end_lineno - node.lineno + 1} lines, limit {limit})")
    assert too_long == []


def test_modules_stay_within_their_size_limit():
    too_long = [f"{path.relative_to(ROOT)} ({n} lines)" for path in modules().values()
                if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
                and str(path.relative_to(ROOT)) not in ONE_FILE_MODELS]
    assert too_long == []


def assignments_to_parsed_arguments(tree: ast.AST) -> list[int]:
    """The lines that assign to an attribute of ``args`` (the name every command gives its parsed
    arguments), or set one through ``vars(args)`` or ``setattr(args, ...)``."""
    lines = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "args":
                    lines.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and \
                node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "args":
            lines.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update" and \
                isinstance(node.func.value, ast.Call) and getattr(node.func.value.func, "id", None) == "vars":
            lines.append(node.lineno)
    return lines


#: The modules that parse a command line; only they may complete what argparse parsed (none does now:
#: every command builds its typed config from the parsed values).
PARSING_MODULES = ()


def test_no_module_assigns_to_the_parsed_arguments_after_parsing():
    """Settings are resolved once, where they are parsed (``bertcf.config``, and the experiments'
    own options): no other module completes or changes them later."""
    found = [f"{name}:{line}" for name, path in modules().items() if name not in PARSING_MODULES
             for line in assignments_to_parsed_arguments(ast.parse(path.read_text(encoding="utf-8")))]
    assert found == []


def test_the_assignment_check_finds_an_assignment():
    planted = "def f(args):\n    args.lr = 1\n    setattr(args, 'x', 2)\n    vars(args).update(y=3)\n"
    assert assignments_to_parsed_arguments(ast.parse(planted)) == [2, 3, 4]
