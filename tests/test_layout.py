"""The code's layout holds what README's code map says: packages by concern in layers, every import
pointing down a layer or within its own package, no import circles, and the size limits (a
function at most 80 lines, a class at most 250)."""
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
    "runs": 1, "cli": 1, "data": 1,
    "models": 2,
    "evaluation": 3, "export": 3,
    "objectives": 4, "training": 4,
    "pretrain": 5, "multitask": 5, "evaluate": 5, "bench": 5, "onnx": 5, "encode": 5, "st": 5, "flow": 5, "st_format": 5, "__init__": 5,
    "experiments": 6,
    "commands": 7,
}
TOP_LAYER = max(LAYERS.values())
MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 250


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


def test_imports_point_down_or_sideways_within_a_layer():
    upward = [f"{a} -> {b}" for a, targets in graph().items() for b in targets if layer(b) > layer(a)]
    assert upward == []


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


def test_functions_and_classes_stay_within_their_size_limits():
    too_long = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            limit = (MAX_CLASS_LINES if isinstance(node, ast.ClassDef)
                     else MAX_FUNCTION_LINES if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)
            if limit and node.end_lineno - node.lineno + 1 > limit:
                too_long.append(f"{name}:{node.name} ({node.end_lineno - node.lineno + 1} lines, limit {limit})")
    assert too_long == []
