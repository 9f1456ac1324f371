"""Strongly connected parts of a dependency graph: what needs each other, directly or around a circle.

``make diffs`` groups the changes that need each other into one commit with it; the
architecture test finds import circles with it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import TypeVar

Node = TypeVar("Node", bound=Hashable)


def strongly_connected_parts(graph: Mapping[Node, Iterable[Node]]) -> list[list[Node]]:
    """Every strongly connected part of ``graph`` (node -> the nodes it needs), each sorted.

    Tarjan's algorithm, visiting nodes and their needs in sorted order, so the result does
    not depend on how ``graph`` was built: a part comes after every part it needs. Recursive:
    meant for the few dozen nodes of a patch set or a package.
    """
    index: dict[Node, int] = {}
    low: dict[Node, int] = {}
    stack: list[Node] = []
    on_stack: set[Node] = set()
    parts: list[list[Node]] = []

    def visit(v: Node) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.append(w)
                if w == v:
                    break
            parts.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return parts
