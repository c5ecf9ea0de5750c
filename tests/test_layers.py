"""The import layering ARCHITECTURE.md sets, held by CI: no import circle among amibake's and
fleet's modules (function-level imports included: they must not dodge one), and the local
cloud behind its seam (it imports only leaves; the product reaches it only through
amibake/connect.py). A new circle or a new edge across the seam fails here, naming it."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What the local cloud may import of the product: the leaves both sides share.
LEAVES = {
    "amibake.errors",
    "amibake.config",
    "amibake.procs",
    "amibake.saved",
    "amibake.cloud.tags",
    "amibake.cloud.regions",
    "amibake.cloud.media_types",
    "amibake.checks",
    "amibake.tomlfile",
    "amibake.service_models",
    "amibake.ssh_keys",
}


def _modules() -> dict[str, Path]:
    found = {}
    for package in ("amibake", "fleet"):
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _imports() -> dict[str, set[str]]:
    """Each module -> the project modules it imports, anywhere in it (a name imported from a
    package counts as its module when it is one)."""
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle() -> None:
    graph = _imports()
    circles = _circles(graph)
    described = [
        "; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(c)))}" for m in c) for c in circles
    ]
    assert circles == [], "import circles:\n" + "\n".join(described)


def _reaching_out(graph: dict[str, set[str]], package: str, allowed: set[str]) -> set[str]:
    """The imports of `package`'s modules outside it, other than `allowed`, as "a -> b"."""
    return {
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith(package)
        for target in targets
        if not target.startswith(package) and target not in allowed
    }


def test_the_local_cloud_imports_only_leaves_of_the_product() -> None:
    crossing = _reaching_out(_imports(), "amibake.local", LEAVES)
    assert crossing == set(), crossing


def test_the_product_reaches_the_local_cloud_only_through_connect() -> None:
    """Besides amibake.connect, only the CLIs' own `local` commands and gc's view of its
    state may name it; the AWS session, runner, steps and pipelines never do."""
    graph = _imports()
    allowed = {"amibake.connect", "amibake.cli", "amibake.config"}
    crossing = {
        f"{module} -> {target}"
        for module, targets in graph.items()
        if not module.startswith("amibake.local") and module not in allowed
        for target in targets
        if target.startswith("amibake.local")
    }
    assert crossing == set(), crossing


# What fleet's search core (fleet/search) may import outside itself: the space it searches, the
# price catalog its features read, the results its record reads, and the errors. Never an
# evaluator (replay, cloud trials, bench), the tune file's spec or the CLI (issue 22's shape).
SEARCH_CORE_READS = {"fleet.space", "fleet.prices", "fleet.results", "amibake.errors"}


def test_the_search_core_depends_on_no_evaluator_nor_the_cli() -> None:
    crossing = _reaching_out(_imports(), "fleet.search", SEARCH_CORE_READS)
    assert crossing == set(), crossing


def test_the_circle_finder_finds_a_circle() -> None:
    """The finder itself can fail: a made-up graph with one circle and one chain."""
    graph: dict[str, set[str]] = defaultdict(set, {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert _circles(graph) == [["a", "b", "c"]]
