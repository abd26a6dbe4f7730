"""What dispatch gives the matcher (ops/dispatch.py): each session's pool task texts, and the
candidates with what they share with the task."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest

from tests.unit.ops.planner_support import A, B, sess
from xaf_hub.config.load import load_config
from xaf_hub.core.discipline import CONTINUE_PROMPT, RESUME_PROMPT, compose_prompt
from xaf_hub.fleet.scan import InstanceScan
from xaf_hub.fleet.wire import (
    MAX_TRACE_FILES,
    MAX_TRACE_PROMPT_CHARS,
    MAX_TRACE_PROMPTS,
    MAX_TRACE_TODO_CHARS,
    MAX_TRACE_TODOS,
    SessionTrace,
    messages_of,
    session_trace,
)
from xaf_hub.ops import dispatch as dispatch_ops
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.dispatch import match_candidates, session_tasks
from xaf_hub.store.tasks import Task


def task(tid: str, session: str | None, instance: str, *prompts: str) -> Task:
    return Task(
        id=tid,
        title=prompts[0] if prompts else tid,
        status="dispatched" if session else "pending",
        prompt=prompts[0] if prompts else "",
        prompts=prompts,
        session_id=session,
        dispatched_to=instance if session else None,
    )


def test_session_tasks_gathers_the_texts_sent_into_each_session() -> None:
    tasks = [
        task("T-1", "ses_1", "lan-a", "Add CSV export of orders", "also the amount column"),
        task("T-2", "ses_1", "lan-b", "same id on another instance"),
        task("T-3", None, "lan-a", "not sent yet"),
        task("T-4", "ses_1", "lan-a", "a second row for the same session"),
    ]
    assert session_tasks(tasks) == {
        ("lan-a", "ses_1"): (
            "Add CSV export of orders",
            "also the amount column",
            "a second row for the same session",
        ),
        ("lan-b", "ses_1"): ("same id on another instance",),
    }


def test_candidates_match_on_pool_texts_and_say_which_words() -> None:
    export = sess("lan-a", "ses_1", "Orders list", directory="/srv/demo/web")
    other = sess("lan-a", "ses_2", "Orders list", directory="/srv/demo/web")
    outside = sess("lan-b", "ses_9", "CSV export amount", directory="/tmp/x", project=False)
    scans = [
        InstanceScan(A, reachable=True, sessions=[export, other]),
        InstanceScan(B, reachable=True, sessions=[outside]),
    ]
    sent = {("lan-a", "ses_1"): ("Export the filtered orders as CSV with the amount",)}
    scores, evidence = match_candidates(scans, "the CSV export drops the amount", sent)
    # Equal titles and folders: only the pool text tells them apart. A non-project session
    # is never a candidate.
    assert [s.id for s, _ in scores] == ["ses_1", "ses_2"]
    assert scores[0][1] > 0.3 and scores[1][1] < 0.05
    assert {"csv", "amount"} <= set(evidence[0].shared) and evidence[0].tasks == 1
    assert evidence[1].tasks == 0


# -- the best candidates' own messages (issue 36) ------------------------------------------

ROOT = "/srv/demo/web"


def user(text: str, **extra: object) -> dict[str, object]:
    return {"info": {"role": "user"}, "parts": [{"type": "text", "text": text, **extra}]}


def tool(name: str, **given: object) -> dict[str, object]:
    part = {"type": "tool", "tool": name, "state": {"status": "completed", "input": given}}
    return {"info": {"role": "assistant"}, "parts": [part]}


def test_a_trace_keeps_the_prompts_and_the_files_touched_and_nothing_else() -> None:
    hub_prompt = (
        "Add a CSV export to the orders list\n\n--- xaf-hub discipline ---\nBranch policy: x\n"
        "--- end of xaf-hub discipline ---"
    )
    patch = "*** Begin Patch\n*** Update File: web/src/orders/csv.ts\n@@\n*** End Patch"
    messages = [
        user(hub_prompt),
        user("a reminder the server added", synthetic=True),
        {"info": {"role": "assistant"}, "parts": [{"type": "text", "text": "Sure, on it"}]},
        tool("read", filePath=f"{ROOT}/src/orders/List.tsx"),
        tool("edit", filePath=f"{ROOT}/src/orders/export.ts", oldString="a", newString="b"),
        tool("grep", pattern="csv", path=ROOT),  # the session's own folder says nothing
        tool("apply_patch", patchText=patch),
        user("also the amount column", parts_are="ignored"),
        {"info": {"role": "user"}, "parts": [{"type": "file", "source": {"path": "/etc/x.csv"}}]},
        user(hub_prompt),  # sent twice, counted once
        {"info": "broken", "parts": "broken"},
        {"parts": [{"type": "tool", "state": "broken"}, "broken"]},
    ]
    trace = session_trace(messages_of(messages), ROOT)
    assert trace.prompts == ("Add a CSV export to the orders list", "also the amount column")
    assert trace.files == (
        "src/orders/List.tsx", "src/orders/export.ts", "web/src/orders/csv.ts", "/etc/x.csv"
    )
    # Of those, the ones its tools changed (not the one read, nor the file attached).
    assert trace.changed == ("src/orders/export.ts", "web/src/orders/csv.ts")
    # A hostile server's endless listing costs at most the caps.
    many = [user(f"prompt {i}") for i in range(500)]
    many += [tool("read", filePath=f"{ROOT}/f{i}.py") for i in range(500)]
    trace = session_trace(messages_of(many), ROOT)
    assert len(trace.prompts) == MAX_TRACE_PROMPTS and trace.prompts[-1] == "prompt 499"
    assert len(trace.files) == MAX_TRACE_FILES and trace.files[-1] == "f499.py"


def test_the_hubs_own_resume_and_continue_prompts_are_no_task_text() -> None:
    # The patrol resumes an interrupted session with RESUME_PROMPT, a heal continues one on
    # another model with CONTINUE_PROMPT: words of no task ("continue", "stopped", "status",
    # "interrupted"). Read as task texts, with every session of the labelled fleet resumed
    # once, "Continue the migration where it stopped" scored 0.306 (over match_threshold),
    # 0.158 without them.
    resumed = compose_prompt(RESUME_PROMPT, "branch", base_branch="main", slug="csv-export")
    healed = compose_prompt(CONTINUE_PROMPT, "mainline", base_branch="main", slug="")
    messages = messages_of(
        [user("Add a CSV export"), user(resumed), user(healed), user("also the totals")]
    )
    assert session_trace(messages, ROOT).prompts == ("Add a CSV export", "also the totals")


def said(text: str, synthetic: bool = False) -> dict[str, object]:
    part = {"type": "text", "text": text, **({"synthetic": True} if synthetic else {})}
    return {"info": {"role": "assistant"}, "parts": [part]}


def test_a_trace_keeps_the_agents_newest_todo_list_and_reply() -> None:
    first = [{"content": "Draft the export", "status": "in_progress", "priority": "high"}]
    newest = [
        {"content": "Add the CSV button", "status": "completed", "priority": "high", "id": "1"},
        {"content": "  Handle zero-decimal currencies (JPY)  ", "status": "pending"},
        {"content": ""}, "broken", {"content": 7}, {"status": "pending"},
        {"content": "Add the CSV button", "status": "completed"},  # twice, counted once
    ]
    messages = [
        user("Add a CSV export"),
        tool("todowrite", todos=first),
        said("Looking at the orders list first"),
        tool("todowrite", todos=newest),  # each call holds the whole list: the newest wins
        tool("todowrite", todos="broken"),  # not a list: the list stays as it was
        {"info": {"role": "assistant"}, "parts": [
            {"type": "text", "text": "Done: the button exports the filtered orders."},
            {"type": "reasoning", "text": "thinking aloud"},
            {"type": "text", "text": "JPY is left for later."},
        ]},
        said("a reminder the server added", synthetic=True),
        user("thanks"),
    ]
    trace = session_trace(messages_of(messages), ROOT)
    assert trace.todos == ("Add the CSV button", "Handle zero-decimal currencies (JPY)", "7")
    assert trace.reply == "Done: the button exports the filtered orders.\nJPY is left for later."
    assert trace.prompts == ("Add a CSV export", "thanks")  # the agent's words are not prompts
    # A hostile server's endless list or reply costs at most the caps.
    huge = [{"content": f"{i} " + "x" * 10_000, "status": "pending"} for i in range(500)]
    trace = session_trace(messages_of([tool("todowrite", todos=huge), said("y" * 100_000)]), ROOT)
    assert len(trace.todos) == MAX_TRACE_TODOS
    assert all(len(t) == MAX_TRACE_TODO_CHARS for t in trace.todos)
    assert len(trace.reply) == MAX_TRACE_PROMPT_CHARS
    assert session_trace(messages_of([user("x")]), ROOT) == SessionTrace(("x",))


def test_a_todowrite_call_that_failed_or_has_not_run_leaves_the_list_as_it_was() -> None:
    # opencode writes the list only when the call runs: one whose input the tool refused
    # (state "error": an item without a priority, a status it does not know) or one still
    # being streamed ("pending") leaves GET /session/{id}/todo as the last call that ran.
    kept = [{"content": "Add the CSV button", "status": "in_progress", "priority": "high"}]
    refused = [{"content": "Rewrite the whole billing module", "status": "doing"}]

    def call(status: str, todos: list[dict[str, str]]) -> dict[str, object]:
        state = {"status": status, "input": {"todos": todos}}
        return {"info": {"role": "assistant"}, "parts": [
            {"type": "tool", "tool": "todowrite", "state": state}
        ]}

    for status in ("error", "pending"):
        trace = session_trace(messages_of([call("completed", kept), call(status, refused)]), ROOT)
        assert trace.todos == ("Add the CSV button",), status
    # A call that runs writes the list as it starts: it is the list already.
    running = [{"content": "Add the JSON button", "status": "in_progress", "priority": "high"}]
    trace = session_trace(messages_of([call("completed", kept), call("running", running)]), ROOT)
    assert trace.todos == ("Add the JSON button",)


def test_a_follow_up_of_the_agents_own_todo_list_finds_its_session() -> None:
    # Two sessions on the orders list; the follow-up names what one agent left on its list.
    export = sess("lan-a", "ses_1", "Orders export", directory=ROOT)
    other = sess("lan-a", "ses_2", "Orders filters", directory=ROOT)
    scans = [InstanceScan(A, reachable=True, sessions=[export, other])]
    text = "handle the zero-decimal currencies, yen amounts come out wrong"
    without = {
        ("lan-a", "ses_1"): SessionTrace(("Add a CSV export of the orders list",)),
        ("lan-a", "ses_2"): SessionTrace(("Add status and date filters to the orders list",)),
    }
    scores, _ = match_candidates(scans, text, {}, without)
    assert scores[0][1] < 0.1  # nothing of the orders' words in the text
    traces = {
        ("lan-a", "ses_1"): SessionTrace(
            ("Add a CSV export of the orders list",),
            todos=("Add the CSV button", "Handle zero-decimal currencies like JPY"),
            reply="Exported amounts use two decimals; zero-decimal currencies are left open.",
        ),
        ("lan-a", "ses_2"): SessionTrace(
            ("Add status and date filters to the orders list",),
            todos=("Status filter", "Date range filter"),
            reply="Filters are in the URL now.",
        ),
    }
    scores, evidence = match_candidates(scans, text, {}, traces)
    assert [s.id for s, _ in scores][:1] == ["ses_1"] and scores[0][1] > 0.3
    assert scores[1][1] < 0.1
    assert evidence[0].todos == ("Handle zero-decimal currencies like JPY",)
    assert evidence[0].to_json()["todos"] == ["Handle zero-decimal currencies like JPY"]
    assert evidence[1].todos == ()


def test_a_session_started_outside_the_hub_is_matched_on_what_its_messages_show() -> None:
    # Two sessions a person started in the TUI: untitled, same folder, nothing in the pool.
    export = sess("lan-a", "ses_1", "New session - 2026-11-30T09:12:44.000Z", directory=ROOT)
    other = sess("lan-a", "ses_2", "New session - 2026-11-30T10:01:02.000Z", directory=ROOT)
    scans = [InstanceScan(A, reachable=True, sessions=[export, other])]
    text = "export.ts writes the amount column twice"
    scores, _ = match_candidates(scans, text, {})
    assert not scores or scores[0][1] < 0.05  # nothing to tell them apart
    traces = {
        ("lan-a", "ses_1"): SessionTrace(
            ("Add a CSV export of the orders list with the amount",), ("src/orders/export.ts",)
        ),
        ("lan-a", "ses_2"): SessionTrace(("Fix the login page style",), ("src/login.scss",)),
    }
    scores, evidence = match_candidates(scans, text, {}, traces)
    assert [s.id for s, _ in scores][:1] == ["ses_1"] and scores[0][1] > 0.3
    assert scores[0][1] - scores[1][1] > 0.2
    assert evidence[0].files == ("src/orders/export.ts",) and evidence[0].tasks == 1
    assert "amount" in evidence[0].shared


class Messages:
    """An instance whose message listing answers per session: a listing, an error, a hang."""

    def __init__(self, answers: dict[str, object]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def __call__(self, req: httpx.Request) -> httpx.Response:
        if req.url.path == "/global/health":
            return httpx.Response(200, json={"healthy": True, "version": "1.18.33"})
        sid = req.url.path.split("/")[2]
        self.asked.append(f"{req.url.path}?{req.url.query.decode()}")
        answer = self.answers[sid]
        if answer == "hang":
            await asyncio.sleep(30)
        if isinstance(answer, int):
            return httpx.Response(answer, json={"error": "boom"})
        return httpx.Response(200, json=answer)


def test_reading_the_candidates_never_fails_or_stalls_a_dispatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatch_ops, "TRACE_SECONDS", 0.5)
    server = Messages({
        "ses_ok": [user("Add a CSV export"), tool("edit", filePath=f"{ROOT}/export.ts")],
        "ses_500": 500,
        "ses_gone": 404,
        "ses_junk": {"not": "a list"},
        "ses_hang": "hang",
    })
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"instances": [
        {"name": "lan-a", "url": "http://127.0.0.1:9", "roots": ["/srv/demo"]}]}), "utf-8")
    cfg = load_config(str(path), env={"XAF_HUB_HOME": str(tmp_path / "home")}, cwd=tmp_path)
    ops = OpsContext(cfg, transport_factory=lambda _: httpx.MockTransport(server))
    sessions = [sess("lan-a", sid, "t", directory=ROOT) for sid in server.answers]
    started = time.monotonic()
    traces = asyncio.run(dispatch_ops.read_traces(ops, sessions))
    assert time.monotonic() - started < 5
    assert traces == {
        ("lan-a", "ses_ok"): SessionTrace(("Add a CSV export",), ("export.ts",), ("export.ts",))
    }
    # Only the newest messages, and in the session's own folder.
    asked = next(a for a in server.asked if "/ses_ok/" in a)
    assert f"limit={dispatch_ops.TRACE_MESSAGES}" in asked and "directory=" in asked


def test_a_file_a_session_only_read_is_not_named_as_its_work() -> None:
    # Both read the cart queue; only the second changed it.
    looked = sess("lan-a", "ses_1", "Cart totals", directory=ROOT)
    wrote = sess("lan-a", "ses_2", "Cart offline", directory=ROOT)
    scans = [InstanceScan(A, reachable=True, sessions=[looked, wrote])]
    traces = {
        ("lan-a", "ses_1"): session_trace(messages_of(
            [user("Show the cart totals with tax"), tool("read", filePath=f"{ROOT}/src/queue.ts")]),
            ROOT,
        ),
        ("lan-a", "ses_2"): session_trace(messages_of(
            [
                user("Keep cart ops while offline"),
                tool("read", filePath=f"{ROOT}/src/queue.ts"),
                tool("edit", filePath=f"{ROOT}/src/queue.ts", oldString="a", newString="b"),
            ]),
            ROOT,
        ),
    }
    scores, evidence = match_candidates(scans, "queue.ts needs an op id", {}, traces)
    named = {s.id: e.named for (s, _), e in zip(scores, evidence, strict=True)}
    # Was: both named it (it was among the files each touched), so it told them apart no more
    # than a shared word.
    assert named == {"ses_1": (), "ses_2": ("src/queue.ts",)}
