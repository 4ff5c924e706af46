"""The console's pure parts: the graph drawing, the metrics figures, sessions, the
re-dispatch figure and the settings' checks."""

from __future__ import annotations

import argparse
import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import awp_server.metrics  # noqa: F401 (its counters, in this process's default registry)
from awp_common import flags
from awp_console import graph, metrics, pages, recovery, timeline, web
from awp_console.graph import Item, draw
from awp_console.sessions import Sessions
from awp_console.settings import Settings
from awp_console.web import outcome
from awp_coordinator.metrics import Metrics
from awp_protocol.roles import Role
from awp_protocol.states import HANDED_BACK
from awp_sdk.connection import Connection
from awp_sdk.enums import AttemptState, RunState, TaskState, WorkerState
from awp_sdk.records import Attempt, Identity, Run, TaskError, TaskStatus, Worker


def test_a_fan_out_is_one_node_with_its_count_until_expanded() -> None:
    items = [
        Item("root", []),
        *(Item(f"search[{i}]", ["root"]) for i in range(50)),
        Item("merge", [f"search[{i}]" for i in range(50)]),
    ]
    drawn = draw(items)
    assert [(n.kind, n.label, len(n.members)) for n in drawn.nodes] == [
        ("task", "root", 1),
        ("fanout", "search", 50),
        ("task", "merge", 1),
    ]
    assert drawn.edges == [(0, 1, 50), (1, 2, 50)]
    assert [n.x for n in drawn.nodes] == sorted(n.x for n in drawn.nodes)  # left to right
    expanded = draw(items, expand={"search"})
    assert len(expanded.nodes) == 52 and not expanded.too_large
    assert {expanded.nodes[expanded.node_of[i]].label for i in range(1, 51)} == {
        f"search[{i}]" for i in range(50)
    }
    assert len({n.x for n in expanded.nodes}) == 3  # three columns


def test_a_fan_out_too_large_to_draw_stays_collapsed_and_says_so() -> None:
    items = [Item(f"x[{i}]", []) for i in range(graph.MAX_EXPANDED + 1)]
    drawn = draw(items, expand={"x"})
    assert drawn.too_large == ["x"] and len(drawn.nodes) == 1


def test_dependencies_order_columns_and_neighbours_share_rows() -> None:
    # a -> b -> d, a -> c -> d: d sits right of b and c, which sit right of a.
    drawn = draw([Item("a", []), Item("b", ["a"]), Item("c", ["a"]), Item("d", ["b", "c"])])
    x = {n.label: n.x for n in drawn.nodes}
    assert x["a"] < x["b"] == x["c"] < x["d"]
    ys = {n.label: n.y for n in drawn.nodes}
    assert ys["b"] != ys["c"]
    assert drawn.width >= x["d"] + graph.NODE_W and drawn.height >= max(ys.values())
    assert all(path.startswith("M") for path, _ in drawn.paths())


@pytest.mark.parametrize(
    ("items", "clusters"),
    [
        # 50 layers of 100: one cluster per layer (each layer has its own stem).
        (
            [
                Item(f"s{layer}_{j}", [f"s{layer - 1}_{j}"] if layer else [])
                for layer in range(50)
                for j in range(100)
            ],
            50,
        ),
        # A chain of 5,000 of one stem: one node.
        ([Item(f"t{i}", [f"t{i - 1}"] if i else []) for i in range(5000)], 1),
        # 50 chains of 100: one node per chain.
        (
            [
                Item(f"c{c:02d}-{i:03d}", [f"c{c:02d}-{i - 1:03d}"] if i else [])
                for c in range(50)
                for i in range(100)
            ],
            50,
        ),
        # 5,000 keys without a shared stem in one long chain: runs of columns.
        ([Item(f"k{i}x", [f"k{i - 1}x"] if i else []) for i in range(5000)], None),
        # 5,000 independent tasks of one stem: one node.
        ([Item(f"t{i}", []) for i in range(5000)], 1),
    ],
)
def test_a_graph_beyond_the_limit_is_clustered_within_it(
    items: list[Item], clusters: int | None
) -> None:
    drawn = draw(items)
    assert drawn.clustered
    assert len(drawn.nodes) <= graph.MAX_NODES
    if clusters is not None:
        assert len(drawn.nodes) == clusters
    # Every task is shown by exactly one node, and the counts add up.
    assert sum(len(n.members) for n in drawn.nodes) == len(items)
    assert all(drawn.nodes[drawn.node_of[i]].members.count(i) == 1 for i in range(len(items)))
    counts = drawn.counts(["pending"] * len(items))
    assert sum(c["pending"] for c in counts) == len(items)


def test_figures_sum_every_endpoint_and_count_an_unused_label_as_zero() -> None:
    server_text = generate_latest().decode()  # awp_server.metrics' counters, none counted
    coordinator = Metrics(CollectorRegistry())
    coordinator.items.labels("timed_out").inc(3)
    coordinator_text = generate_latest(coordinator.registry).decode()
    exported = {
        family.name
        for text in (server_text, coordinator_text)
        for family in text_string_to_metric_families(text)
        if family.type == "counter"
    }
    # Every figure the console reads is a counter awp-server or awp-coordinator exports.
    assert {s.sample.removesuffix("_total") for s in metrics.FIGURES} <= exported
    on_server, on_coordinator = metrics.counts_of(server_text), metrics.counts_of(coordinator_text)
    timed_out = next(i for i, s in enumerate(metrics.FIGURES) if s.labels == {"kind": "timed_out"})
    assert on_coordinator[timed_out] == 3
    duplicate = next(
        i for i, s in enumerate(metrics.FIGURES) if s.labels == {"verdict": "duplicate"}
    )
    assert duplicate in on_server  # zero or more, never "not exported"


async def test_a_scrape_names_an_endpoint_that_does_not_answer() -> None:
    scraped = await metrics.scrape(["http://127.0.0.1:9/metrics"])
    assert scraped.reached == 0
    assert [url for url, _ in scraped.failures] == ["http://127.0.0.1:9/metrics"]
    assert all(f.value is None for f in scraped.figures)


def test_sessions_expire_when_idle_and_sign_in_replaces_the_id() -> None:
    now = [0.0]
    sessions = Sessions(60, clock=lambda: now[0], limit=3)
    first = sessions.new()
    assert sessions.get(first.id) is first
    identity = Identity("alice", frozenset({Role.SUBMITTER}), True)
    signed_in = sessions.sign_in(first, "token", identity)
    assert signed_in.id != first.id and signed_in.csrf != first.csrf
    assert sessions.get(first.id) is None  # the pre-sign-in id is worth nothing now
    assert signed_in.form_token_ok(signed_in.csrf) and not signed_in.form_token_ok(first.csrf)
    assert "token" not in repr(signed_in) and signed_in.id not in repr(signed_in)
    now[0] = 59
    assert sessions.get(signed_in.id) is signed_in  # use restarts the idle clock
    now[0] = 110
    assert sessions.get(signed_in.id) is signed_in
    now[0] = 171
    assert sessions.get(signed_in.id) is None
    for _ in range(5):
        sessions.new()
    assert len(sessions) == 3  # bounded: the least recently used go first


def test_roles_decide_what_an_identity_may_call() -> None:
    viewer = Identity("victor", frozenset({Role.VIEWER}), True)
    submitter = Identity("alice", frozenset({Role.SUBMITTER}), True)
    assert viewer.may("GetRun") and not viewer.may("CancelRun") and not viewer.may("RetryRun")
    assert submitter.may("CancelRun") and submitter.may("RetryRun")
    assert not submitter.may("CreateWorkflow")


def _attempt(key: str, number: int, state: str, worker: str, start: float, end: float) -> Attempt:
    base = datetime(2025, 1, 1, tzinfo=UTC)
    error = TaskError("lost", False) if state == "interrupted" else None
    return Attempt(
        key,
        number,
        AttemptState(state),
        worker,
        0,
        0,
        base + timedelta(seconds=start),
        None,
        base + timedelta(seconds=end),
        error,
    )


def _worker(worker_id: str, state: str, heard: float) -> Worker:
    base = datetime(2025, 1, 1, tzinfo=UTC)
    return Worker(
        worker_id, f"name-{worker_id}", WorkerState(state), ("mock",), 4, 0, {}, 1, base,
        base + timedelta(seconds=heard), None,
    )  # fmt: skip


def test_redispatch_after_a_worker_death_counts_from_its_last_heartbeat() -> None:
    attempts = [
        _attempt("a", 1, "interrupted", "dead", 0, 20),
        _attempt("a", 2, "succeeded", "alive", 22, 23),
        _attempt("b", 1, "interrupted", "dead", 0, 20),  # not run again yet
        _attempt("c", 1, "interrupted", "alive", 0, 5),  # its worker lives: a lost lease
        _attempt("c", 2, "succeeded", "alive", 6, 7),
    ]
    workers = {"dead": _worker("dead", "offline", 4), "alive": _worker("alive", "active", 30)}
    found = recovery.recoveries(attempts, workers)
    assert [(r.task_key, r.worker_name, r.seconds) for r in found] == [
        ("a", "name-dead", 18.0),
        ("b", "name-dead", None),
    ]
    assert recovery.summary(found) == recovery.Summary(1, 18.0, 18.0)
    assert recovery.summary([]) == recovery.Summary(0, None, None)


def test_a_hand_back_is_told_from_a_lost_lease() -> None:
    lost = _attempt("a", 1, "interrupted", "w", 0, 1)
    handed = Attempt(
        "a", 1, AttemptState.INTERRUPTED, "w", 0, 0, None, None, None, TaskError(HANDED_BACK, True)
    )
    assert outcome(lost) == "interrupted" and outcome(handed) == "handed back"
    assert outcome(_attempt("a", 1, "timed_out", "w", 0, 1)) == "timed out"


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"listen": "0.0.0.0:8080"}, "reachable from other machines"),
        ({"https_cert_file": "cert.pem"}, "go together"),
    ],
)
def test_settings_refuse_what_would_be_unsafe(overrides: dict[str, str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Settings(**overrides)  # type: ignore[arg-type]


def test_the_console_answers_only_to_its_own_host_names() -> None:
    assert set(Settings().hosts()) >= {"127.0.0.1", "localhost"}
    assert Settings(listen="0.0.0.0:80", insecure=True).hosts() == ["*"]
    assert Settings(listen="10.1.2.3:80", insecure=True).hosts() == ["10.1.2.3"]
    named = Settings(listen="10.1.2.3:80", insecure=True, allowed_hosts=("awp.example",))
    assert named.hosts() == ["awp.example"]


def test_the_server_address_defaults_as_every_clients() -> None:
    """One default (the SDK's), and a host alone means its default port, as for `awp`."""

    def read(*given: str, environ: dict[str, str] | None = None) -> Settings:
        parser = argparse.ArgumentParser()
        flags.add_flags(parser, Settings)
        return flags.settings(Settings, parser, parser.parse_args(given), environ or {})

    assert read().address == Settings().address == Connection().address
    assert read("--address", "awp.internal").address == "awp.internal:50051"
    assert read(environ={"AWP_ADDRESS": "[::1]"}).address == "[::1]:50051"
    assert read("--address", "awp.internal:7000").address == "awp.internal:7000"
    with pytest.raises(SystemExit):
        read("--address", "awp.internal:port")


def test_a_map_is_one_node_with_its_task_and_its_progress() -> None:
    # plan -> search (a map over plan) -> merge; the elements share the map's dependency.
    items = [
        Item("plan", []),
        Item("search", ["plan"]),
        Item("merge", ["search"]),
        *(Item(f"search[{i}]", ["plan"]) for i in range(5)),
    ]
    drawn = draw(items)
    assert [(n.kind, n.label, n.parent) for n in drawn.nodes] == [
        ("task", "plan", -1),
        ("fanout", "search", 1),
        ("task", "merge", -1),
    ]
    assert drawn.edges == [(0, 1, 6), (1, 2, 1)]
    states = [
        "succeeded",
        "running",
        "pending",
        "succeeded",
        "failed",
        "running",
        "skipped",
        "ready",
    ]
    counts = drawn.counts(states)
    # The map task's own state is not one of its elements'.
    assert counts[1] == {"succeeded": 1, "failed": 1, "running": 1, "skipped": 1, "ready": 1}
    assert graph.map_progress(counts[1]) == "3/5 done, 1 failed"
    assert graph.map_progress({"running": 4}) == "0/4 done"
    # Expanded, each element is a node before the map task, which ends after them.
    expanded = draw(items, expand={"search"})
    x = {n.label: n.x for n in expanded.nodes}
    assert x["plan"] < x["search[0]"] == x["search[4]"] < x["search"] < x["merge"]
    assert all(n.kind == "task" and n.parent == -1 for n in expanded.nodes)


def _task(key: str, state: str, finished_s: float | None = None, error: str = "") -> TaskStatus:
    base = datetime(2025, 1, 1, tzinfo=UTC)
    return TaskStatus(
        key,
        TaskState(state),
        "mock",
        "noop",
        (),
        1,
        3,
        output=None,
        error=TaskError(error, False) if error else None,
        retry_at=None,
        finished_at=None if finished_s is None else base + timedelta(seconds=finished_s),
    )


def test_a_failed_run_failed_on_its_first_failed_task_a_map_s_element_first() -> None:
    tasks = [
        _task("fetch", "succeeded", 1),
        _task("each", "failed", 5, "element each[1] failed"),
        _task("later", "failed", 9, "later"),
        _task("each[0]", "succeeded", 3),
        _task("each[1]", "failed", 5, "item -2 is negative"),
    ]
    found = pages.first_failure(tasks)
    assert found is not None
    assert (found.task_key, found.error) == ("each[1]", TaskError("item -2 is negative", False))
    assert pages.first_failure(tasks[:1]) is None


def test_a_task_shows_its_last_attempt_s_error() -> None:
    retried = _task("t", "succeeded", 2, "boom")  # the task keeps its first failure
    failed_then_ok = [
        _attempt("t", 1, "interrupted", "w", 0, 1),
        _attempt("t", 2, "succeeded", "w", 1, 2),
    ]
    assert pages.shown_error(retried, failed_then_ok) is None
    assert pages.shown_error(retried, failed_then_ok[:1]) == TaskError("lost", False)
    never_ran = _task("map", "failed", 2, "element map[3] failed")
    assert pages.shown_error(never_ran, []) == TaskError("element map[3] failed", False)


def test_the_task_panel_shows_hand_backs_apart_and_a_map_element_s_parent() -> None:
    task = dataclasses.replace(
        _task("each[3]", "running"), attempts=3, hand_backs=2, map_parent="each", map_index=3
    )
    run = Run(
        "r", "w", 1, RunState.RUNNING, {}, "", 1, 1, None, None, None, started_by="admin"
    )  # fmt: skip
    template = web.templates().env.get_template("task.html")
    shown = template.render(
        run=run,
        task=task,
        definition=None,
        attempts=[],
        error=None,
        timeline=[],
        may_cancel=False,
        may_retry=False,
        retry_request_id="x",
        decisions=[],
    )
    assert "1 of at most 3" in shown  # the charged attempts: hand-backs are free
    assert "2 handed back by draining workers" in shown
    assert 'element 3 of <a href="#" class="task-link" data-key="each">' in shown
    plain = template.render(
        run=run,
        task=dataclasses.replace(task, hand_backs=0, attempts=1, map_parent=None, map_index=None),
        definition=None,
        attempts=[],
        error=None,
        timeline=[],
        may_cancel=False,
        may_retry=False,
        retry_request_id="x",
        decisions=[],
    )
    assert "1 of at most 3" in plain and "handed back" not in plain and "element" not in plain


def test_the_timeline_puts_each_task_s_attempts_on_its_row_in_time() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def attempt(key: str, number: int, state: AttemptState, start: float, end: float) -> Attempt:
        return Attempt(
            task_key=key,
            attempt=number,
            state=state,
            worker_id=f"w{number}",
            dispatch_id=number,
            fencing_token=10 + number,
            started_at=t0 + timedelta(seconds=start),
            deadline=None,
            finished_at=t0 + timedelta(seconds=end),
            error=None,
        )

    drawn = timeline.draw(
        [
            attempt("a", 1, AttemptState.SUCCEEDED, 0, 1),
            attempt("b", 1, AttemptState.INTERRUPTED, 1, 5),
            attempt("b", 2, AttemptState.SUCCEEDED, 6, 10),
        ],
        {"w1": "alpha"},
        t0,
        t0 + timedelta(seconds=10),
    )
    assert drawn is not None
    assert [r.task_key for r in drawn.rows] == ["a", "b"]
    a, lost, again = drawn.bars
    scale = timeline.PLOT_W / 10
    assert (a.x, a.width) == (timeline.LABEL_W, scale)
    assert lost.y == again.y > a.y
    assert (lost.state, again.x) == ("interrupted", timeline.LABEL_W + 6 * scale)
    assert lost.label == "#1 alpha" and again.label == "#2 w2"
    assert "fencing token 12" in again.title
    assert timeline.draw([], {}, t0, t0) is None
