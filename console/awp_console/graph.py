"""A run's (or a workflow's) DAG as a drawing: which nodes to show, and where.

Tasks of a map fan-out (keys `name[i]`) are one node per fan-out, with the map task
itself (`name`): its count and progress, unless the page asked to expand it. Expanded,
each element is drawn before the map task, which ends after them. A graph still larger
than MAX_NODES is clustered: tasks of one layer and one stem (the key without its
trailing number) become one node, then, if that is still too many, tasks of one stem,
then layers, or runs of layers. The layout is layered, left to right: a node's column
is its longest path from a root; nodes in a column are ordered by the mean position of
their neighbours (a few down-and-up sweeps), which keeps most edges short and uncrossed.
The browser only draws what this computes.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from awp_protocol.states import TERMINAL_TASK_STATES

# Beyond this many nodes a drawing stops being readable (and an SVG slows the page).
MAX_NODES: Final = 300
# A fan-out with more elements than this is listed, not drawn, when expanded.
MAX_EXPANDED: Final = 200
NODE_W: Final = 168
NODE_H: Final = 40
GAP_X: Final = 64
GAP_Y: Final = 14
SWEEPS: Final = 4

ELEMENT: Final = re.compile(r"(?P<name>.+)\[(?P<index>\d+)\]")
_STEM: Final = re.compile(r"[-_.]?\d+$")


@dataclass(frozen=True, slots=True)
class Item:
    """What the graph is made of: a task's key and the keys it depends on."""

    key: str
    depends_on: Sequence[str]


@dataclass(slots=True)
class Node:
    id: str
    kind: str  # "task", "fanout" (a map's elements) or "cluster"
    label: str
    members: list[int] = field(default_factory=list)  # indexes into the items
    layer: int = 0
    order: float = 0.0
    x: int = 0
    y: int = 0
    # A fan-out's name, which the page may ask to expand.
    fanout: str = ""
    # The item of the map task a fan-out node also shows (-1: none): its state is the
    # map's, not one of the elements the node's bar and progress count.
    parent: int = -1


@dataclass(frozen=True, slots=True)
class Drawing:
    nodes: list[Node]
    # (from node index, to node index, how many task edges it stands for)
    edges: list[tuple[int, int, int]]
    # For each item, the index of the node that shows it.
    node_of: list[int]
    width: int
    height: int
    clustered: bool
    # Fan-outs asked to expand that are too large to draw.
    too_large: list[str]

    node_w: int = NODE_W
    node_h: int = NODE_H

    def counts(self, states: Sequence[str]) -> list[dict[str, int]]:
        """How many of each node's tasks are in each state (states: one per item); a
        fan-out's map task is not one of them."""
        found: list[dict[str, int]] = [defaultdict(int) for _ in self.nodes]
        for item, node in enumerate(self.node_of):
            if self.nodes[node].parent != item:
                found[node][states[item]] += 1
        return found

    def paths(self) -> list[tuple[str, int]]:
        """Each edge as an SVG path (right side of its source to left side of its
        target, a horizontal S-curve) and how many task edges it stands for."""
        found = []
        for a, b, count in self.edges:
            source, target = self.nodes[a], self.nodes[b]
            x1, y1 = source.x + NODE_W, source.y + NODE_H // 2
            x2, y2 = target.x, target.y + NODE_H // 2
            bend = max((x2 - x1) // 2, GAP_X // 2)
            found.append((f"M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}", count))
        return found


def fanout_of(key: str) -> str | None:
    found = ELEMENT.fullmatch(key)
    return found["name"] if found else None


def map_progress(counts: Mapping[str, int]) -> str:
    """A fan-out's progress as its node writes it: "12/40 done, 2 failed" (run.js writes
    it the same way as the elements change)."""
    total = sum(counts.values())
    done = sum(counts.get(state, 0) for state in TERMINAL_TASK_STATES)
    failed = counts.get("failed", 0)
    return f"{done}/{total} done" + (f", {failed} failed" if failed else "")


def draw(
    items: Sequence[Item], expand: Collection[str] = (), max_nodes: int = MAX_NODES
) -> Drawing:
    index = {item.key: i for i, item in enumerate(items)}
    # Dependencies on keys the items do not hold (none in a valid run) are left out.
    deps = [[index[d] for d in item.depends_on if d in index] for item in items]
    sizes: dict[str, int] = defaultdict(int)
    for i, item in enumerate(items):
        if (name := fanout_of(item.key)) is not None:
            sizes[name] += 1
            # An element shares its map task's dependencies; the map task ends after it.
            if name in index:
                deps[index[name]].append(i)
    too_large = sorted(name for name in expand if sizes.get(name, 0) > MAX_EXPANDED)
    shown = {name for name in expand if 0 < sizes.get(name, 0) <= MAX_EXPANDED}

    def group(i: int) -> tuple[str, str, str]:
        key = items[i].key
        name = fanout_of(key)
        if name is None and key in sizes:
            name = key  # the map task, drawn with its elements
        if name is not None and name not in shown:
            return (f"f:{name}", "fanout", name)
        return (f"t:{key}", "task", key)

    nodes, node_of = _merge(len(items), group)
    for node in nodes:
        if node.kind == "fanout":
            node.parent = index.get(node.fanout, -1)
    layers = _layers(len(nodes), _edges(deps, node_of))
    clustered = False
    if len(nodes) > max_nodes:
        clustered = True
        nodes, node_of = _cluster(items, node_of, layers, max_nodes)
        layers = _layers(len(nodes), _edges(deps, node_of))
    edges = _edges(deps, node_of)
    for node, layer in zip(nodes, layers, strict=True):
        node.layer = layer
    width, height = _place(nodes, edges)
    return Drawing(
        nodes,
        sorted((a, b, n) for (a, b), n in edges.items()),
        node_of,
        width,
        height,
        clustered,
        too_large,
    )


def _merge(count: int, group: Any) -> tuple[list[Node], list[int]]:
    """Nodes from each item's (id, kind, label), in first-seen order."""
    nodes: list[Node] = []
    by_id: dict[str, int] = {}
    node_of = []
    for i in range(count):
        node_id, kind, label = group(i)
        at = by_id.get(node_id)
        if at is None:
            at = by_id[node_id] = len(nodes)
            nodes.append(Node(node_id, kind, label, fanout=label if kind == "fanout" else ""))
        nodes[at].members.append(i)
        node_of.append(at)
    return nodes, node_of


def _edges(deps: Sequence[Sequence[int]], node_of: Sequence[int]) -> dict[tuple[int, int], int]:
    edges: dict[tuple[int, int], int] = defaultdict(int)
    for target, sources in enumerate(deps):
        for source in sources:
            a, b = node_of[source], node_of[target]
            if a != b:
                edges[(a, b)] += 1
    return edges


def _layers(count: int, edges: Iterable[tuple[int, int]]) -> list[int]:
    """Each node's longest path from a root (Kahn's order). Merging tasks into nodes can
    close a cycle (a cluster on both ends of a path): its nodes keep the layer reached."""
    successors: list[list[int]] = [[] for _ in range(count)]
    indegree = [0] * count
    for a, b in edges:
        successors[a].append(b)
        indegree[b] += 1
    layer = [0] * count
    ready = [n for n in range(count) if indegree[n] == 0]
    while ready:
        node = ready.pop()
        for after in successors[node]:
            layer[after] = max(layer[after], layer[node] + 1)
            indegree[after] -= 1
            if indegree[after] == 0:
                ready.append(after)
    return layer


def _stem(key: str) -> str:
    name = fanout_of(key)
    return name if name is not None else (_STEM.sub("", key) or key)


def _cluster(
    items: Sequence[Item],
    node_of: Sequence[int],
    layers: Sequence[int],
    max_nodes: int,
) -> tuple[list[Node], list[int]]:
    """The first grouping with at most max_nodes nodes: by column and stem, by stem
    alone (a chain of `c07-000`..`c07-099` is one node), by column, then by runs of
    columns wide enough to fit."""
    depth = max(layers, default=0) + 1

    def column(i: int) -> int:
        return layers[node_of[i]]

    def by_column_and_stem(i: int) -> tuple[str, str, str]:
        stem = _stem(items[i].key)
        return (f"c:{column(i)}:{stem}", "cluster", f"{stem}* (column {column(i) + 1})")

    def by_stem(i: int) -> tuple[str, str, str]:
        stem = _stem(items[i].key)
        return (f"s:{stem}", "cluster", f"{stem}*")

    merged = _merge(len(items), by_column_and_stem)
    if len(merged[0]) <= max_nodes:
        return merged
    merged = _merge(len(items), by_stem)
    if len(merged[0]) <= max_nodes:
        return merged
    span = math.ceil(depth / max_nodes)

    def by_columns(i: int) -> tuple[str, str, str]:
        first = column(i) // span * span
        last = min(first + span, depth)
        where = f"column {first + 1}" if last == first + 1 else f"columns {first + 1}-{last}"
        return (f"c:{first}", "cluster", where)

    return _merge(len(items), by_columns)


def _place(nodes: list[Node], edges: dict[tuple[int, int], int]) -> tuple[int, int]:
    columns: dict[int, list[int]] = defaultdict(list)
    for n, node in enumerate(nodes):
        columns[node.layer].append(n)
    before: list[list[int]] = [[] for _ in nodes]
    after: list[list[int]] = [[] for _ in nodes]
    for a, b in edges:
        before[b].append(a)
        after[a].append(b)
    for column in columns.values():
        for position, n in enumerate(column):
            nodes[n].order = position
    layer_ids = sorted(columns)
    for sweep in range(SWEEPS):
        downward = sweep % 2 == 0
        for layer in layer_ids if downward else reversed(layer_ids):
            column = columns[layer]
            for n in column:
                neighbours = before[n] if downward else after[n]
                if neighbours:
                    nodes[n].order = sum(nodes[m].order for m in neighbours) / len(neighbours)
            column.sort(key=lambda n: nodes[n].order)
            for position, n in enumerate(column):
                nodes[n].order = position
    tallest = max((len(c) for c in columns.values()), default=0)
    for layer, column in columns.items():
        # Each column centred on the tallest, so that a lone node sits in the middle.
        offset = (tallest - len(column)) * (NODE_H + GAP_Y) // 2
        for position, n in enumerate(column):
            nodes[n].x = layer * (NODE_W + GAP_X)
            nodes[n].y = offset + position * (NODE_H + GAP_Y)
    width = (max(columns, default=0) + 1) * (NODE_W + GAP_X) - GAP_X
    height = max(tallest * (NODE_H + GAP_Y) - GAP_Y, NODE_H)
    return width, height
