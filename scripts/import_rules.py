"""gpulab's import rules, checked statically over the source tree, by path.

Each module belongs to a room, the longest of the paths in :data:`ROOMS` that names
it, and a room imports only the gpulab rooms :data:`ROOMS` lists for it:

- ``spawner.core`` (the policy core) imports only ``spawner.core`` and the standard
  library (and PyYAML, :data:`CORE_THIRD_PARTY`): no framework, no adapter, no I/O
  library. A new module under ``spawner/core/`` is checked because of where it is.
- ``spawner.local`` (the single server) and ``spawner.kube`` (Kubernetes) adapt the
  core and never import each other; what both need lives at the top of ``spawner/``
  (``spawner.runtime``), which imports the core only.
- ``spawner/`` imports nothing from ``hub_config``, ``idle_culler`` or ``labextension``
  (the hub side depends on the spawner, not the reverse).
- ``idle_culler`` never imports ``hub_config`` (it talks to the hub over HTTP).
- No import cycles between modules, counting imports inside functions (which hide
  a cycle from Python but not from a reader). Imports under ``if TYPE_CHECKING:``
  are for annotations only and do not count.

The same paths drive mypy's strict section (``pyproject.toml``: ``spawner.core.*``) and
the purity test (``tests/unit/test_core_purity.py`` imports every module under
``spawner/core/``), so no list of modules is kept anywhere.

Run ``python scripts/import_rules.py`` (exit 1 with one line per broken rule); the
test suite and the pre-commit hook run it too.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("spawner", "hub_config", "idle_culler", "labextension", "gpulab_run")
CORE = "spawner.core"
#: The rooms by path, and the gpulab rooms each may import (its own always included).
ROOMS: dict[str, frozenset[str]] = {
    CORE: frozenset({CORE}),
    # The top of spawner/ (the runtime): shared by both adapters, so it knows neither.
    "spawner": frozenset({CORE}),
    "spawner.local": frozenset({CORE, "spawner"}),
    "spawner.kube": frozenset({CORE, "spawner"}),
    "idle_culler": frozenset({CORE, "spawner.local"}),
    "labextension": frozenset({CORE, "spawner.local"}),
    "hub_config": frozenset({CORE, "spawner", "spawner.local", "spawner.kube"}),
    # What a job's own code imports (its metrics, its parameters): the standard library only.
    "gpulab_run": frozenset(),
}
#: What the core may import that is not the standard library: PyYAML, to read catalog
#: text with the line of every node (``spawner/core/catalog/yaml_text.py``).
CORE_THIRD_PARTY = frozenset({"yaml"})
FRAMEWORKS = ("tornado", "kubernetes", "kubernetes_asyncio", "jupyterhub", "kubespawner", "traitlets")
#: Why a room may not import another, for the sentence that reports it.
_WHY = {
    ("spawner.local", "spawner.kube"): "the single-server and Kubernetes adapters never import each other",
    ("spawner.kube", "spawner.local"): "the single-server and Kubernetes adapters never import each other",
}


def room_of(module: str) -> str | None:
    """The room a gpulab module belongs to: the longest path in :data:`ROOMS` naming it."""
    best = None
    for room in ROOMS:
        if (module == room or module.startswith(room + ".")) and (best is None or len(room) > len(best)):
            best = room
    return best


def module_files(root: Path) -> dict[str, Path]:
    """``{module name: file}`` for every Python module of gpulab's packages under ``root``."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        base = root / pkg
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            if any(part in ("node_modules", "__pycache__") or part.startswith(".") for part in rel.parts):
                continue
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if _type_checking_block(child):
                stack.extend(getattr(child, "orelse", []))  # the else branch runs
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            stack.append(child)


def imported_names(module: str, path: Path, known: Iterable[str]) -> set[str]:
    """Absolute names ``module`` imports: gpulab modules resolved to the deepest known one,
    others (frameworks, the standard library) as written."""
    known = set(known)
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # "from pkg import name": a submodule when one is called so, else an attribute of pkg.
            targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in known else prefix for a in node.names]
        for name in targets:
            while name not in known and "." in name and name.split(".")[0] in PACKAGES:
                name = name.rsplit(".", 1)[0]
            if name != module:
                out.add(name)
    return out


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    files = module_files(root)
    return {m: imported_names(m, p, files) for m, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        work = [(v, iter(sorted(graph.get(v, ()))))]
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, children = work[-1]
            for w in children:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _room_violation(mod: str, room: str, name: str, target: str) -> str | None:
    """The sentence for ``mod`` (in ``room``) importing gpulab module ``name`` (in ``target``)."""
    if target == room or target in ROOMS[room]:
        return None
    if room == CORE:
        return f"{mod}: the policy core imports the adapter {name}; pass what it needs in instead"
    if target in ("hub_config", "idle_culler", "labextension") and room.startswith("spawner"):
        return f"{mod}: spawner/ imports {target}; the hub side depends on the spawner, not the reverse"
    if room == "idle_culler" and target == "hub_config":
        return f"{mod}: idle_culler imports hub_config; the culler reaches the hub only over its HTTP API"
    why = _WHY.get((room, target)) or f"{room} may import only {', '.join(sorted(ROOMS[room]))}"
    return f"{mod}: {room} imports {name}; {why}: move the shared part to spawner/ or the core"


def _core_violation(mod: str, name: str) -> str | None:
    """The sentence for a core module importing a name from outside gpulab, if not allowed."""
    top = name.split(".")[0]
    if top in sys.stdlib_module_names or top in CORE_THIRD_PARTY or top == "__future__":
        return None
    if top in FRAMEWORKS:
        return f"{mod}: the policy core imports the framework {name}; move that code to an adapter"
    return (
        f"{mod}: the policy core imports {name}, which is neither spawner.core nor the standard library; "
        "move that code to an adapter"
    )


def violations(root: Path = REPO) -> list[str]:
    """One sentence per broken rule; empty when the tree follows them all."""
    graph = import_graph(root)
    out: list[str] = []
    for mod, names in sorted(graph.items()):
        room = room_of(mod)
        if room is None:
            continue
        for name in sorted(names):
            target = room_of(name) if name.split(".")[0] in PACKAGES else None
            problem = (
                _room_violation(mod, room, name, target)
                if target is not None
                else (_core_violation(mod, name) if room == CORE else None)
            )
            if problem:
                out.append(problem)
    for comp in cycles(graph):
        out.append(
            "import cycle between "
            + ", ".join(comp)
            + " (imports inside functions count); move the shared part to a module both can import"
        )
    return out


def main() -> int:
    problems = violations(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO)
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
