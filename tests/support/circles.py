"""Print the import circles of the `edgefleet` package found first on the path (the
installed layout `tests.support.layers.import_circles` lays out), as JSON."""

from __future__ import annotations

import json
import sys

import grimp


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Groups of modules that import each other (strongly connected, more than one)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in graph.find_modules_directly_imported_by(module):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                group.append(other)
                if other == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


if __name__ == "__main__":
    sys.setrecursionlimit(10_000)
    graph = grimp.build_graph("edgefleet", cache_dir=None)
    print(json.dumps({"modules": len(graph.modules), "circles": circles(graph)}))
