"""gpulab's import rules, checked statically over the source tree.

- The policy core (``spawner/`` except its adapters) imports no framework
  (tornado, kubernetes, jupyterhub, kubespawner) and no adapter module.
- ``spawner/`` imports nothing from ``hub_config``, ``idle_culler`` or ``labextension``.
- ``idle_culler`` never imports ``hub_config`` (it talks to the hub over HTTP).
- No import cycles between modules, counting imports inside functions (which hide
  a cycle from Python but not from a reader). Imports under ``if TYPE_CHECKING:``
  are for annotations only and do not count.

Run ``python scripts/import_rules.py`` (exit 1 with one line per broken rule); the
test suite and the pre-commit hook run it too.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("spawner", "hub_config", "idle_culler", "labextension")
#: Modules of spawner/ that adapt the core to a framework or the machine; the rest is core.
ADAPTERS = frozenset(
    {
        "spawner.local",
        "spawner.kube",
        "spawner.kube_conventions",
        "spawner.nvml",
        "spawner.accounts",
        "spawner.sudo",
        "spawner.mediator",
        "spawner.mediator_client",
        "spawner.home_files",
        "spawner.processes",
        "spawner.account_spawner",
        "spawner.kube_ledger",
        "spawner.config",
        "spawner.cgroups",
        "spawner.devices",
        "spawner.namespaces",
        "spawner.output_capture",
        "spawner.confinement",
        "spawner",
    }
)
FRAMEWORKS = ("tornado", "kubernetes", "kubernetes_asyncio", "jupyterhub", "kubespawner")


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


def violations(root: Path = REPO) -> list[str]:
    """One sentence per broken rule; empty when the tree follows them all."""
    graph = import_graph(root)
    out: list[str] = []
    for mod, names in sorted(graph.items()):
        top = {n.split(".")[0] for n in names}
        if mod.startswith("spawner") and mod not in ADAPTERS:
            for n in sorted(names):
                if n.split(".")[0] in FRAMEWORKS:
                    out.append(f"{mod}: the policy core imports the framework {n}; move that code to an adapter")
                elif n in ADAPTERS and n != "spawner":
                    out.append(f"{mod}: the policy core imports the adapter {n}; pass what it needs in instead")
        if mod.startswith("spawner"):
            for pkg in sorted(top & {"hub_config", "idle_culler", "labextension"}):
                out.append(f"{mod}: spawner/ imports {pkg}; the hub side depends on the spawner, not the reverse")
        if mod.startswith("idle_culler") and "hub_config" in top:
            out.append(f"{mod}: idle_culler imports hub_config; the culler reaches the hub only over its HTTP API")
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
