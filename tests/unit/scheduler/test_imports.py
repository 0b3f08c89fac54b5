"""The scheduler's tests stay pure: no module here (nor a test helper it uses)
imports the service, the client package, the bench or the simulator; the
tests that drive the simulated fleet live in tests/unit/fleet."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
FORBIDDEN = ("service", "fairgate")
# The redis-server process the store tests start (and a free port for a dead one)
# comes from the bench's helper; the conftest's fixtures share it.
ALLOWED = {"tests.redis_server"}


def _runtime_imports(path: Path) -> set[str]:
    """Imports outside `if TYPE_CHECKING:` blocks."""
    tree = ast.parse(path.read_text())
    checking = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If)
        and isinstance(block.test, ast.Name)
        and block.test.id == "TYPE_CHECKING"
        for n in ast.walk(block)
    }
    names: set[str] = set()
    for node in tree.body:  # module level: what importing the module runs
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue  # an import in a function runs only when it is called
        for n in ast.walk(node):
            if id(n) in checking:
                continue
            if isinstance(n, ast.Import):
                names.update(a.name for a in n.names)
            elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
                names.add(n.module)
                if n.module.startswith("tests."):  # `from tests.pkg import module`
                    names.update(f"{n.module}.{a.name}" for a in n.names)
    return names


def test_scheduler_tests_import_no_service_client_or_bench_code() -> None:
    seen: set[str] = set()
    todo = list(HERE.glob("*.py"))
    found: dict[str, str] = {}
    while todo:
        path = todo.pop()
        for name in _runtime_imports(path):
            if name in ALLOWED:
                continue
            if name.split(".")[0] in FORBIDDEN:
                found[str(path.relative_to(ROOT))] = name
            elif name.startswith("tests.") and name not in seen:
                seen.add(name)
                base = ROOT / name.replace(".", "/")
                # A module, a package (its __init__), or a name defined in one: skipped.
                todo += [f for f in (base.with_suffix(".py"), base / "__init__.py") if f.exists()]
    assert found == {}
