"""The package's layout (python/stoker): no import cycle between its modules, no module over 500
lines, and the mode of a DataLoader tested only where it is decided (the plan) and where it
is carried out (the pipelines). Read from the sources, nothing imported."""

import ast
import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "python" / "stoker"
MAX_LINES = 500


def _modules() -> dict[str, pathlib.Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["stoker", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imports(name: str, path: pathlib.Path, modules: dict) -> set[str]:
    """The package's modules `name` imports (at any depth of its code: lazy imports count)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        base = ".".join(package[:len(package) - node.level + 1] + (
            [node.module] if node.module else []))
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            if sub in modules or sub == "stoker._stoker":  # a module (the extension is one)
                found.add(sub)
            elif base in modules:  # a name from a module
                found.add(base)
    found.discard(name)
    return {m for m in found if m in modules}


def test_no_import_cycle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        for dep in sorted(graph[name]):
            assert dep not in path, " -> ".join(path[path.index(dep):] + [dep])
            if dep not in done:
                visit(dep, path + [dep])
        done.add(name)

    for name in sorted(graph):
        visit(name, [name])


def test_no_module_over_500_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long


def test_the_mode_is_tested_only_in_the_plan_and_the_pipelines():
    allowed = {"loader/plan.py", "loader/pipelines.py", "loader/engine_pipeline.py",
               "loader/stream_pipeline.py"}
    mode_test = re.compile(r"\bmode\s*[!=]=|\b(SAMPLES|BATCH_JOBS|STREAM)\b|_streams is|"
                           r"is_stream\(")
    testing = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
               if mode_test.search(p.read_text())}
    # workers/jobs.py defines is_stream (what the plan asks); the plan is its one caller.
    assert testing - allowed <= {"workers/jobs.py"}, testing - allowed
