"""The house's shape (docs/architecture.md): no import circles anywhere in the three code roots (type-only and
function-level imports count), a small server package root whose subpackages say the flow, and
a docstring on every subpackage."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CODE_ROOTS = [ROOT / "server", ROOT / "client", ROOT / "proto_schemas"]
SERVER = ROOT / "server" / "flightfeed" / "server"


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for root in CODE_ROOTS:
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports, wherever the import statement stands (module
    level, ``if TYPE_CHECKING:``, inside a function). ``from pkg import name`` points at
    ``pkg.name`` when that is a module, else at ``pkg``."""
    mods = _modules()

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [owner(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [owner(f"{node.module}.{a.name}") or owner(node.module) for a in node.names]
            graph[mod].update(t for t in targets if t is not None and t != mod)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_in_server_and_wire() -> None:
    found = [c for c in cycles(import_graph()) if not any(m.startswith("flightfeed.client") for m in c)]
    assert found == [], f"import cycles (move the shared type down or invert the dependency): {found}"


def test_no_import_cycles_in_client() -> None:
    found = [c for c in cycles(import_graph()) if any(m.startswith("flightfeed.client") for m in c)]
    assert found == [], f"import cycles (move the shared type down or invert the dependency): {found}"


def test_the_server_root_is_small_and_every_subpackage_says_what_it_is() -> None:
    entries = sorted(p.name for p in SERVER.iterdir() if p.name not in {"__init__.py", "__main__.py", "__pycache__"})
    assert len(entries) <= 14, entries
    for sub in (p for p in SERVER.iterdir() if p.is_dir() and p.name != "__pycache__"):
        init = sub / "__init__.py"
        assert init.exists(), f"{sub.name}/ has no __init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 80, f"{sub.name}/__init__.py needs a paragraph saying what the package does"


@pytest.mark.parametrize("package", ["request", "guards", "observe", "data"])
def test_the_flow_packages_exist(package: str) -> None:
    assert (SERVER / package / "__init__.py").exists()


CLIENT = ROOT / "client" / "flightfeed" / "client"
#: the client's rooms (docs/architecture.md); ``_cli`` is the client's own user and may import the surface
ROOMS = ("_state", "_connect", "_receive", "_tensors", "_device", "_images")
#: what a room may import of the client besides the rooms: the settings
ROOM_MAY_IMPORT = {"flightfeed.client._options"}


def test_rooms_never_import_the_torch_surface() -> None:
    """A room imports only ``_options``, ``flightfeed.wire`` and other rooms: never the torch surface
    (``_dataset``, ``_iteration``, ``_position``, ``_workers``, ``_mixture``, ``_adapters``, ...)."""
    rooms = tuple(f"flightfeed.client.{r}" for r in ROOMS)
    wrong = sorted(
        f"{mod} imports {target}"
        for mod, targets in import_graph().items()
        if mod.startswith(rooms)
        for target in targets
        if target.startswith("flightfeed.client")
        and not target.startswith(rooms)
        and target not in ROOM_MAY_IMPORT
    )
    assert wrong == [], f"a room imports the torch surface (move the shared piece into a room): {wrong}"


def test_the_client_root_is_small() -> None:
    flat = sorted(p.name for p in CLIENT.glob("*.py") if p.name != "__init__.py")
    assert len(flat) <= 16, f"{len(flat)} modules flat in client/flightfeed/client/ (at most 16): {flat}"
    rooms = sorted(p.name for p in CLIENT.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert rooms == sorted([*ROOMS, "_cli"]), rooms
