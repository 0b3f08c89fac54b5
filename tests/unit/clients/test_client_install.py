"""A client-only install (`pip install fairgate`) pulls only what the client needs.

The Python client (`fairgate.AsyncClient` / `Client`, the stubs under `fairgate.v1`,
the admin client) must import nothing beyond the distribution's core
dependencies, and the `fairgate` command's client side (`generate`, `models`,
`admin`) nothing beyond those plus the `cli` extra; the server, the benchmarks
and the planner are further extras. Read from the source (every import
statement, at any depth for the client) and pyproject.toml, so adding `import
redis` to the client, or moving a server package into the core list, fails here."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = {"fairgate": ROOT / "clients" / "fairgate", "scheduler": ROOT / "scheduler"}
PACKAGES["service"] = ROOT / "service"
CLIENT = ["fairgate", "fairgate.aio", "fairgate.sync", "fairgate.admin.client", "fairgate.v1"]
NOT_CLIENT = ("fairgate.cli", "fairgate.bench", "fairgate.plan", "service")


def _file(module: str) -> Path | None:
    top, *rest = module.split(".")
    if top not in PACKAGES:
        return None
    base = PACKAGES[top].joinpath(*rest)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _imports(path: Path, nested: bool) -> list[str]:
    tree = ast.parse(path.read_text())
    nodes = ast.walk(tree) if nested else iter(tree.body)
    found: list[str] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return found


def _closure(starts: list[str], nested: bool) -> tuple[set[str], set[str]]:
    """(our modules reached, third-party top-level modules imported)."""
    ours: set[str] = set()
    third: set[str] = set()
    todo = list(starts)
    while todo:
        module = todo.pop()
        path = _file(module)
        if module in ours or path is None:
            continue
        ours.add(module)
        todo += [module.rsplit(".", i)[0] for i in range(1, module.count(".") + 1)]  # parents
        if module in starts and path.name == "__init__.py":  # fairgate.v1: all its modules
            todo += [f"{module}.{p.stem}" for p in path.parent.glob("*.py") if p.stem[0] != "_"]
        for name in _imports(path, nested):
            top = name.split(".")[0]
            if top in PACKAGES:
                todo.append(name)
            elif top not in sys.stdlib_module_names and top != "__future__":
                third.add(top)
    return ours, third


def _names(requirements: list[str]) -> set[str]:
    names = {
        re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements
    }
    return {n for n in names if n != "fairgate"}


def _provided(modules: set[str], allowed: set[str]) -> dict[str, list[str]]:
    """Each module that no allowed distribution provides, with those that do."""
    dists = packages_distributions()
    missing: dict[str, list[str]] = {}
    for module in sorted(modules):
        by = [d.lower().replace("_", "-") for d in dists.get(module, [])]
        if not set(by) & allowed:
            missing[module] = by
    return missing


def _project() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]  # type: ignore[no-any-return]


def test_the_client_imports_only_core_dependencies() -> None:
    project = _project()
    core = _names(project["dependencies"])  # type: ignore[arg-type]
    ours, third = _closure(CLIENT, nested=True)
    assert "fairgate.v1.inference_pb2_grpc" in ours and "grpc" in third  # the walk reads
    assert not [m for m in ours if m.startswith(NOT_CLIENT)]
    assert _provided(third, core) == {}
    # And the core list is the client's: no server package rides along.
    assert not core & {"redis", "aiohttp", "pydantic", "opentelemetry-sdk", "jinja2", "typer"}


def test_the_command_line_client_needs_only_the_cli_extra() -> None:
    project = _project()
    extras: dict[str, list[str]] = project["optional-dependencies"]  # type: ignore[assignment]
    allowed = _names(project["dependencies"]) | _names(extras["cli"])  # type: ignore[arg-type]
    # Module level only: serve, bench and plan load lazily (fairgate.cli.lazy), and
    # commands such as sim-server import the server inside their function.
    ours, third = _closure(["fairgate.cli.main", "fairgate.cli.entry"], nested=False)
    assert "fairgate.cli.admin.cli" in ours
    assert not [m for m in ours if m.startswith(("fairgate.bench", "fairgate.plan", "service"))]
    assert _provided(third, allowed) == {}
