"""The live board (ops/live_board.py): what a follower publishes, what `status` takes of it,
and every reason it must scan instead (stale, stopped, per-directory, another config, a
corrupt or foreign file), judged on labelled boards."""

from __future__ import annotations

import io
import json
import re
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from xaf_hub.cli.main import main
from xaf_hub.config.load import Config, load_config
from xaf_hub.core.records import SessionRecord, Waiting
from xaf_hub.fleet.follow import FleetFollower, FollowState
from xaf_hub.fleet.live_view import LiveInstance
from xaf_hub.fleet.scan import InstanceScan
from xaf_hub.ops.live_board import board_path, publish, read_board

NOW = 1_800_000_000_000


def config(tmp_path: Path, **patrol: Any) -> Config:
    doc = {
        "state_dir": str(tmp_path / "state"),
        "patrol": patrol,
        "instances": [
            {"name": "a", "url": "http://a.test:4096", "roots": ["/srv/proj"],
             "concurrency_limit": 2},
            {"name": "b", "url": "http://b.test:4096", "roots": ["/srv/proj"]},
        ],
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), "utf-8")
    return load_config(path, env={"XAF_HUB_HOME": str(tmp_path / "home")})


def record(name: str, sid: str, *, running: bool = False, project: bool = True,
           waiting: Waiting | None = None) -> SessionRecord:
    return SessionRecord(
        name, sid, f"title {sid}", "/srv/proj/app" if project else "/elsewhere", created=1,
        updated=NOW - 5000, cost=0.25, running=running, run_state="busy" if running else "idle",
        project=project, waiting=waiting,
    )


ASKED = Waiting("permission", "per_1", "bash: rm -rf build", since=NOW - 1000,
                permission="bash", patterns=("rm -rf build",), always=("rm *",))


def view(cfg: Config, name: str, sessions: list[SessionRecord], *, confirmed: int = NOW - 2000,
         mode: str = "global") -> LiveInstance:
    inst = cfg.instance(name)
    scan = InstanceScan(inst, reachable=True, version="1.18.33", api="classic",
                        release="1.18.33 (per-directory run state)", sessions=sessions)
    return LiveInstance(scan, mode, confirmed)


def write(cfg: Config, views: list[LiveInstance], writer: str = "patrol",
          now: int = NOW) -> None:
    """The board and its summary, as ``publish`` writes them (at ``now``)."""
    from xaf_hub.ops.live_board import document, summary_path
    from xaf_hub.store.statefile import write_text_atomic

    write_text_atomic(board_path(cfg, writer), json.dumps(document(cfg, views, writer, now)))
    write_text_atomic(summary_path(cfg, writer),
                      json.dumps(document(cfg, views, writer, now, summary=True)))


def test_a_fresh_board_gives_back_what_was_published(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    sessions_a = [record("a", "s1", running=True, waiting=ASKED), record("a", "s2"),
                  record("a", "x9", project=False, running=True)]
    write(cfg, [view(cfg, "a", sessions_a), view(cfg, "b", [])])
    got = read_board(cfg, cfg.instances, now_ms=NOW)
    assert got.stale == {}
    assert got.scans["a"].sessions == sessions_a  # the waiting request included
    assert got.scans["a"].version == "1.18.33" and got.scans["a"].reachable
    assert got.ages == {"a": 2.0, "b": 2.0}
    summary = got.scans["a"].summary()
    assert (summary.running_project, summary.running_total, summary.waiting) == (1, 2, 1)



def test_an_unreachable_instances_cause_travels_as_its_code(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    down = InstanceScan(cfg.instance("b"), reason="worded any way", cause="no_password")
    write(cfg, [view(cfg, "a", []), LiveInstance(down, "global", NOW - 2000)])
    doc = json.loads(board_path(cfg, "patrol").read_text("utf-8"))
    assert [i["cause"] for i in doc["instances"]] == ["", "no_password"]
    got = read_board(cfg, cfg.instances, now_ms=NOW).scans
    assert (got["a"].cause, got["b"].cause) == (None, "no_password")
    assert str(got["b"].failure()) == "no password configured for b: set XAF_HUB_PW_B"

# Each labelled board: (what is wrong, how to make it so, the reason status must scan).
STALE = [
    ("confirmed too long ago", dict(confirmed=NOW - 16_000), "16 s old (over 15 s)"),
    ("its stream is down", dict(confirmed=0), "not followed right now"),
    ("followed per directory", dict(confirmed=0, mode="directory"), "per directory"),
    ("a clock far ahead", dict(confirmed=NOW + 60_000), "ahead of this host's clock"),
]


@pytest.mark.parametrize(("case", "change", "why"), STALE, ids=[c[0] for c in STALE])
def test_a_view_that_is_not_current_is_scanned(
    tmp_path: Path, case: str, change: dict[str, Any], why: str
) -> None:
    cfg = config(tmp_path)
    write(cfg, [view(cfg, "a", [record("a", "s1")], **change), view(cfg, "b", [])])
    got = read_board(cfg, cfg.instances, now_ms=NOW)
    assert set(got.scans) == {"b"}, case
    assert why in got.stale["a"]


def test_a_view_judged_with_other_rules_or_address_is_not_taken(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    write(cfg, [view(cfg, "a", [record("a", "s1")]), view(cfg, "b", [])])
    doc = json.loads((tmp_path / "config.json").read_text("utf-8"))
    doc["instances"][0]["roots"] = ["/srv/other"]
    doc["instances"][1]["url"] = "http://b2.test:4096"
    (tmp_path / "config.json").write_text(json.dumps(doc), "utf-8")
    changed = load_config(tmp_path / "config.json", env={"XAF_HUB_HOME": str(tmp_path)})
    got = read_board(changed, changed.instances, now_ms=NOW)
    assert got.scans == {}
    assert all("another address, other directory rules or credentials" in w
               for w in got.stale.values())


def test_a_view_judged_with_credentials_the_reader_lacks_is_not_taken(tmp_path: Path) -> None:
    """The writer had a password for ``a`` (its own environment); a reader whose environment
    gives none (a misspelled variable) scans ``a``, and so hears the server ask for one. The
    password itself is nowhere on the board."""
    cfg = config(tmp_path)
    env = {"XAF_HUB_HOME": str(tmp_path / "home"), "XAF_HUB_PW_A": "s3cret-writer-pw"}
    writer = load_config(tmp_path / "config.json", env=env)
    write(writer, [view(writer, "a", [record("a", "s1")]), view(writer, "b", [])])
    assert "s3cret" not in board_path(cfg, "patrol").read_text("utf-8")
    got = read_board(cfg, cfg.instances, now_ms=NOW)
    assert set(got.scans) == {"b"}
    assert "credentials" in got.stale["a"]
    assert set(read_board(writer, writer.instances, now_ms=NOW).scans) == {"a", "b"}
    other = load_config(tmp_path / "config.json", env={**env, "XAF_HUB_PW_A": "another"})
    assert set(read_board(other, other.instances, now_ms=NOW).scans) == {"a", "b"}


def test_a_publishing_writer_says_how_it_stands_with_its_config(tmp_path: Path) -> None:
    """A writer that kept an older config, or waits for a restart, says so on its board and
    its summary; a reader repeats it while the writer publishes, and not after."""
    from xaf_hub.config.watch import ConfigState
    from xaf_hub.ops.live_board import document, summary_path
    from xaf_hub.store.statefile import write_text_atomic

    cfg = config(tmp_path)
    state = ConfigState(NOW - 60_000, "config.json: invalid JSON at line 1", ("pool.backend",))
    for path, summary in ((board_path, False), (summary_path, True)):
        doc = document(cfg, [view(cfg, "a", [])], "patrol", NOW - 1000, summary=summary,
                       state=state)
        write_text_atomic(path(cfg, "patrol"), json.dumps(doc))
    for summary in (False, True):
        notes = read_board(cfg, cfg.instances, now_ms=NOW, summary=summary).notes
        assert len(notes) == 2, notes
        assert notes[0].startswith("the patrol daemon (pid ")
        assert "keeps the config it loaded at" in notes[0] and "invalid JSON" in notes[0]
        assert "needs a restart to use the new pool.backend" in notes[1]
    assert read_board(cfg, cfg.instances, now_ms=NOW + 60_000).notes == ()  # it stopped
    write(cfg, [view(cfg, "a", [])])  # all well again: nothing to say
    assert read_board(cfg, cfg.instances, now_ms=NOW).notes == ()


@pytest.mark.parametrize("raw", [
    b"", b'{"format": 1, "fields": [], "instances": []', b"\xff\xfe", b"[]",
    b'{"format": 99, "fields": [], "instances": []}',
    b"[" * 100_000,  # nested past Python's recursion limit: status died "internal error"
    b'{"format": 1, "fields": ' + b"[" * 100_000,
])
@pytest.mark.parametrize("summary", [False, True], ids=["board", "summary"])
def test_a_corrupt_or_foreign_board_is_scanned_never_raised(
    tmp_path: Path, raw: bytes, summary: bool
) -> None:
    from xaf_hub.ops.live_board import summary_path

    cfg = config(tmp_path)
    path = (summary_path if summary else board_path)(cfg, "patrol")
    path.parent.mkdir(parents=True)
    path.write_bytes(raw)
    got = read_board(cfg, cfg.instances, now_ms=NOW, summary=summary)
    assert got.scans == {}
    assert all("live board unreadable" in w and path.name in w for w in got.stale.values())


def test_a_row_of_the_wrong_shape_loses_only_its_instance(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    write(cfg, [view(cfg, "a", [record("a", "s1")]), view(cfg, "b", [record("b", "s2")])])
    path = board_path(cfg, "patrol")
    doc = json.loads(path.read_text("utf-8"))
    doc["instances"][0]["sessions"][0] = doc["instances"][0]["sessions"][0][:3]
    doc["instances"][1]["sessions"][0][0] = "a"  # a session of a under b
    path.write_text(json.dumps(doc), "utf-8")
    got = read_board(cfg, cfg.instances, now_ms=NOW)
    assert got.scans == {} and all("unreadable" in w for w in got.stale.values())


def test_the_fresher_of_two_writers_wins_per_instance(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    write(cfg, [view(cfg, "a", [record("a", "old")], confirmed=NOW - 9000)], "patrol")
    write(cfg, [view(cfg, "a", [record("a", "new")], confirmed=NOW - 1000),
                view(cfg, "b", [], confirmed=0)], "serve")
    got = read_board(cfg, cfg.instances, now_ms=NOW)
    assert [s.id for s in got.scans["a"].sessions] == ["new"]
    assert "not followed" in got.stale["b"]


def test_zero_seconds_turns_the_board_off(tmp_path: Path) -> None:
    cfg = config(tmp_path, live_board_seconds=0)
    write(cfg, [view(cfg, "a", [])])
    assert read_board(cfg, cfg.instances, now_ms=NOW).scans == {}


def test_publish_writes_a_board_a_reader_takes_now(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    publish(cfg, [view(cfg, "a", [record("a", "s1")], confirmed=int(time.time() * 1000))],
            "serve")
    assert set(read_board(cfg, cfg.instances).scans) == {"a"}


# ---------------------------------------------------------------------------------------------
# The follower's side: what it calls current


def follower(cfg: Config) -> FleetFollower:
    f = FleetFollower(cfg, emit=lambda ev: None, publish=lambda v: None)
    inst = cfg.instance("a")
    f.live.scans["a"] = InstanceScan(inst, reachable=True, sessions=[
        record("a", "s1"), record("a", "x1", project=False, running=True)])
    f.boards["a"].sessions = {"s1": record("a", "s1", running=True)}
    f.boards["a"].foreign = {"x1": f.live.scans["a"].sessions[1]}  # as ``_reconcile`` gives it
    f.state["a"] = FollowState(mode="global", up=True)
    f.live.heard_ms["a"] = NOW - 500
    return f


def test_the_follower_publishes_its_boards_sessions_and_the_rest_as_last_scanned(
    tmp_path: Path,
) -> None:
    (live,) = follower(config(tmp_path)).live_view()
    assert live.confirmed_at_ms == NOW - 500
    assert {(s.id, s.running) for s in live.scan.sessions} == {("s1", True), ("x1", True)}


def test_frames_left_unread_date_the_view_to_when_the_follower_fell_behind(
    tmp_path: Path,
) -> None:
    f = follower(config(tmp_path))
    f.live.behind_ms["a"] = NOW - 7000  # reading frames since then; the stream was heard later
    assert f.live_view()[0].confirmed_at_ms == NOW - 7000


@pytest.mark.parametrize("state", [
    FollowState(mode="global", up=False), FollowState(mode="directory", up=True),
])
def test_a_stream_down_or_per_directory_is_published_as_not_current(
    tmp_path: Path, state: FollowState
) -> None:
    f = follower(config(tmp_path))
    f.state["a"] = state
    assert f.live_view()[0].confirmed_at_ms == 0


def test_a_stopped_follower_leaves_the_board_not_current_even_with_a_write_under_way(
    tmp_path: Path,
) -> None:
    """Caught by CI: a write still in its thread when the follower stopped landed after the
    "nothing is current" board, and a daemon exited before writing that board at all."""
    import threading

    from xaf_hub.fleet.follow import run_in_thread

    written: list[list[int]] = []
    started = threading.Event()

    def slow_publish(v: list[LiveInstance]) -> None:
        if not written and not started.is_set():
            started.set()
            time.sleep(1.0)  # the first write is slow: the stop comes while it is under way
        written.append([live.confirmed_at_ms for live in v])

    f = follower(config(tmp_path))
    f.live.publish = slow_publish

    async def quiet(inst: Any) -> None:
        await f._pause(60)

    f._follow = quiet  # type: ignore[method-assign]
    run_in_thread(f)
    assert started.wait(10)
    f.close()
    assert not f.thread.is_alive()
    assert written == [[NOW - 500], [0]]


# ---------------------------------------------------------------------------------------------
# status: the board instead of a scan


def status(tmp_path: Path, cfg_path: Path, asked: list[str], *args: str) -> tuple[int, Any]:
    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.host)
        if request.url.path == "/global/health":
            return httpx.Response(200, json={"healthy": True, "version": "1.18.33"})
        if request.url.path in ("/experimental/session", "/session"):
            return httpx.Response(200, json=[])
        return httpx.Response(200, json={} if "status" in request.url.path else [])

    out, err = io.StringIO(), io.StringIO()
    code = main(["--config", str(cfg_path), "status", "--json", *args], stdout=out, stderr=err,
                env={"XAF_HUB_HOME": str(tmp_path / "home")},
                transport_factory=lambda inst: httpx.MockTransport(handler))
    assert out.getvalue(), err.getvalue()
    return code, json.loads(out.getvalue())


def test_status_with_a_fresh_board_asks_no_server(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    now = int(time.time() * 1000)
    write(cfg, [view(cfg, "a", [record("a", "s1", running=True)], confirmed=now - 1000),
                view(cfg, "b", [], confirmed=now - 3000)], now=now)
    asked: list[str] = []
    code, doc = status(tmp_path, tmp_path / "config.json", asked)
    assert code == 0 and asked == []
    assert doc["source"] == "live" and 2.5 < doc["live_age_seconds"] < 10
    a = doc["instances"][0]
    assert (a["running_project"], a["dispatchable"], a["reason"]) == (1, True, "1 free slot(s)")


def test_status_scans_what_the_board_does_not_keep_and_fresh_scans_all(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    now = int(time.time() * 1000)
    write(cfg, [view(cfg, "a", [record("a", "s1", running=True)], confirmed=now - 1000),
                view(cfg, "b", [], confirmed=now - 60_000)], now=now)
    asked: list[str] = []
    code, doc = status(tmp_path, tmp_path / "config.json", asked)
    assert set(asked) == {"b.test"} and doc["source"] == "mixed"
    assert doc["live_instances"] == ["a"]
    asked.clear()
    code, doc = status(tmp_path, tmp_path / "config.json", asked, "--fresh")
    assert set(asked) == {"a.test", "b.test"} and doc["source"] == "scan"
    assert doc["instances"][0]["running_project"] == 0  # the servers' word, not the board's


def test_status_from_a_fresh_board_loads_no_http_client_or_event_loop(tmp_path: Path) -> None:
    import subprocess
    import sys

    cfg = config(tmp_path)
    now = int(time.time() * 1000)
    write(cfg, [view(cfg, "a", [record("a", "s1")], confirmed=now),
                view(cfg, "b", [], confirmed=now)], now=now)
    probe = (
        "import io, sys; from xaf_hub.cli.main import main; "
        f"code = main(['--config', {str(tmp_path / 'config.json')!r}, 'status', '--json'], "
        "stdout=io.StringIO(), stderr=sys.stderr, "
        f"env={{'XAF_HUB_HOME': {str(tmp_path / 'home')!r}}}); "
        "print(code, sorted(m for m in ('httpx', 'asyncio') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out == ["0", "[]"], out


# ---------------------------------------------------------------------------------------------
# sessions: the board as status reads it


def sessions(tmp_path: Path, asked: list[str], *args: str) -> tuple[int, str, str]:
    """`sessions ARGS` over servers that answer with one idle project session each and its
    last message; ``asked`` gets each request's host and path."""
    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(f"{request.url.host}{request.url.path}")
        path = request.url.path
        if path == "/global/health":
            return httpx.Response(200, json={"healthy": True, "version": "1.18.33"})
        if path in ("/experimental/session", "/session"):
            sid = "scanned_" + request.url.host[0]
            return httpx.Response(200, json=[{"id": sid, "title": "from the server",
                                              "directory": "/srv/proj/app",
                                              "time": {"created": 1, "updated": NOW}}])
        if path.endswith("/message"):
            msg = {"info": {"role": "assistant", "id": "msg_1", "time": {"completed": 3},
                            "finish": "stop"}, "parts": []}
            return httpx.Response(200, json=[msg])
        return httpx.Response(200, json={} if "status" in path else [])

    out, err = io.StringIO(), io.StringIO()
    code = main(["--config", str(tmp_path / "config.json"), "sessions", *args], stdout=out,
                stderr=err, env={"XAF_HUB_HOME": str(tmp_path / "home")},
                transport_factory=lambda inst: httpx.MockTransport(handler))
    return code, out.getvalue(), err.getvalue()


def fresh_board(tmp_path: Path, b_confirmed_ago_ms: int = 3000) -> Config:
    cfg = config(tmp_path)
    now = int(time.time() * 1000)
    write(cfg, [view(cfg, "a", [record("a", "s1", running=True), record("a", "s2"),
                                record("a", "x9", project=False)], confirmed=now - 1000),
                view(cfg, "b", [record("b", "s3")], confirmed=now - b_confirmed_ago_ms)],
          now=now)
    return cfg


def test_sessions_json_reads_a_fresh_board_and_says_so(tmp_path: Path) -> None:
    fresh_board(tmp_path)
    asked: list[str] = []
    code, out, err = sessions(tmp_path, asked, "--json")
    doc = json.loads(out)
    assert code == 0 and asked == [], err
    assert sorted(s["id"] for s in doc["sessions"]) == ["s1", "s2", "s3"]
    assert doc["by_instance"]["a"] == {"project_sessions": 2, "running": 1}
    assert doc["source"] == "live" and 2.5 < doc["live_age_seconds"] < 10
    assert doc["live_instances"] == ["a", "b"]
    # --fresh asks the servers, whatever the board says.
    code, out, err = sessions(tmp_path, asked, "--json", "--fresh")
    doc = json.loads(out)
    assert code == 0 and {a.split("/")[0] for a in asked} == {"a.test", "b.test"}, err
    assert sorted(s["id"] for s in doc["sessions"]) == ["scanned_a", "scanned_b"]
    assert (doc["source"], doc["live_age_seconds"], doc["live_instances"]) == ("scan", None, [])


def test_sessions_scans_what_the_board_does_not_keep_and_says_which(tmp_path: Path) -> None:
    fresh_board(tmp_path, b_confirmed_ago_ms=60_000)
    asked: list[str] = []
    code, out, err = sessions(tmp_path, asked, "--json")
    doc = json.loads(out)
    assert code == 0 and {a.split("/")[0] for a in asked} == {"b.test"}, err
    assert sorted(s["id"] for s in doc["sessions"]) == ["s1", "s2", "scanned_b"]
    assert (doc["source"], doc["live_instances"]) == ("mixed", ["a"])
    code, out, err = sessions(tmp_path, asked)  # the table says it too
    assert code == 0 and re.search(
        r"source: live for a \(\d+ s old\), the rest scanned \(--fresh scans\)", err), err


def test_sessions_table_says_live_and_its_age(tmp_path: Path) -> None:
    fresh_board(tmp_path)
    asked: list[str] = []
    code, out, err = sessions(tmp_path, asked)
    assert code == 0 and asked == [] and "s2" in out
    assert re.search(r"source: live, \d+ s old \(--fresh scans\)", err), err
    code, out, err = sessions(tmp_path, asked, "--fresh")
    assert code == 0 and "source:" not in err


def test_sessions_outcomes_from_the_board_ask_only_the_last_messages(tmp_path: Path) -> None:
    fresh_board(tmp_path)
    asked: list[str] = []
    code, out, err = sessions(tmp_path, asked, "--json", "--outcomes")
    doc = json.loads(out)
    assert code == 0 and doc["source"] == "live", err
    # No listing: the client's version check, then one message request per idle project
    # session, none for the running one.
    assert sorted(asked) == ["a.test/global/health", "a.test/session/s2/message",
                             "b.test/global/health", "b.test/session/s3/message"]
    outcomes = {s["id"]: s["outcome"] for s in doc["sessions"]}
    assert outcomes == {"s1": "running", "s2": "succeeded", "s3": "succeeded"}


def test_sessions_html_and_json_file_say_their_source(tmp_path: Path) -> None:
    fresh_board(tmp_path)
    asked: list[str] = []
    page, export = tmp_path / "page.html", tmp_path / "out.json"
    code, out, err = sessions(tmp_path, asked, "--html", str(page), "--out", str(export))
    assert code == 0, err
    assert re.search(r"Source: live, \d+ s old\.", page.read_text("utf-8"))
    assert json.loads(export.read_text("utf-8"))["source"] == "live"
    code, out, err = sessions(tmp_path, asked, "--html", str(page), "--fresh")
    assert code == 0 and "Source:" not in page.read_text("utf-8")


# ---------------------------------------------------------------------------------------------
# The summary: what `status` reads without the idle sessions


def test_the_summary_keeps_the_running_sessions_and_the_counts_of_all(tmp_path: Path) -> None:
    from xaf_hub.ops.live_board import document

    cfg = config(tmp_path)
    idle = [record("a", f"i{j}") for j in range(1000)]
    running = [record("a", "r1", running=True, waiting=ASKED),
               record("a", "r2", running=True, project=False)]
    doc = document(cfg, [view(cfg, "a", idle + running)], "patrol", NOW, summary=True)
    (a,) = doc["instances"]
    assert [row[1] for row in a["sessions"]] == ["r1", "r2"]  # the idle thousand are not there
    assert {k: a["tally"][k] for k in ("total_sessions", "project_sessions", "running_total",
                                       "running_project", "waiting")} == {
        "total_sessions": 1002, "project_sessions": 1001, "running_total": 2,
        "running_project": 1, "waiting": 1}
    assert len(json.dumps(doc)) < 3000  # whatever the number of idle sessions


def test_status_from_the_summary_says_what_the_whole_board_says(tmp_path: Path) -> None:
    """The same fleet read three ways: the summary, the whole board (an older writer wrote no
    summary), the counts written out by hand. Spend today on Kathmandu's clock (+5:45)."""
    from zoneinfo import ZoneInfo

    from xaf_hub.core.clock import day_start, to_ms
    from xaf_hub.ops.live_board import summary_path

    doc = json.loads((config(tmp_path).path or Path()).read_text("utf-8"))
    doc["models"] = {"timezone": "Asia/Kathmandu"}
    doc["budget"] = {"daily_usd": 10.0}
    (tmp_path / "config.json").write_text(json.dumps(doc), "utf-8")
    cfg = load_config(tmp_path / "config.json", env={"XAF_HUB_HOME": str(tmp_path / "home")})
    now = int(time.time() * 1000)
    from datetime import UTC, datetime

    midnight = to_ms(day_start(datetime.fromtimestamp(now / 1000, UTC),
                               ZoneInfo("Asia/Kathmandu")))

    def at(sid: str, updated: int, cost: float | None, **kw: Any) -> SessionRecord:
        return SessionRecord("a", sid, "t", "/srv/proj/app", created=1, updated=updated,
                             cost=cost, project=kw.pop("project", True), **kw)

    sessions = [
        at("today1", now - 1000, 1.25, running=True, run_state="busy"),
        at("today2", max(midnight, now - 3_600_000), 0.5),
        at("today-unknown", max(midnight, now - 60_000), None),
        at("yesterday", midnight - 1, 4.0),
        at("elsewhere", now - 500, 9.0, project=False, running=True, run_state="busy"),
        *[at(f"old{j}", midnight - 86_400_000 - j, 0.1) for j in range(300)],
    ]
    write(cfg, [view(cfg, "a", sessions, confirmed=now - 1000),
                view(cfg, "b", [], confirmed=now - 1000)], now=now)
    asked: list[str] = []
    _, from_summary = status(tmp_path, tmp_path / "config.json", asked)
    summary_path(cfg, "patrol").unlink()
    _, from_board = status(tmp_path, tmp_path / "config.json", asked)
    assert asked == [] and from_summary["source"] == from_board["source"] == "live"
    assert from_summary["instances"] == from_board["instances"]
    assert from_summary["project"] == from_board["project"]
    a = from_summary["instances"][0]
    assert (a["running_total"], a["running_project"], a["project_sessions"]) == (2, 1, 304)
    assert (a["spent_today_usd"], a["cost_unknown_sessions"]) == (1.75, 1)


def test_a_summary_that_cannot_say_today_is_scanned(tmp_path: Path) -> None:
    from xaf_hub.ops.live_board import summary_path

    cfg = config(tmp_path)
    write(cfg, [view(cfg, "a", [record("a", "s1")]), view(cfg, "b", [])])
    path = summary_path(cfg, "patrol")
    doc = json.loads(path.read_text("utf-8"))
    doc["instances"][0]["tally"]["spend_since_ms"] = NOW  # the slots begin after midnight
    doc["instances"][1]["tally"]["running_project"] = -1
    path.write_text(json.dumps(doc), "utf-8")
    got = read_board(cfg, cfg.instances, now_ms=NOW, summary=True)
    assert got.scans == {}
    assert "does not reach back to today's start" in got.stale["a"]
    assert "unreadable" in got.stale["b"] and "whole number" in got.stale["b"]
    # The whole board is not touched by what its summary says.
    assert set(read_board(cfg, cfg.instances, now_ms=NOW).scans) == {"a", "b"}


def _forge(tmp_path: Path, change: Any, *, whole: bool = False) -> Any:
    """A fresh board whose summary (``whole``: whose board, the summary gone) ``change``
    alters, read as `status` reads it."""
    from xaf_hub.ops.live_board import summary_path

    cfg = config(tmp_path)
    now = int(time.time() * 1000)
    a = [record("a", "r1", running=True, waiting=ASKED), record("a", "r2", running=True),
         record("a", "x1", running=True, project=False), record("a", "i1"),
         record("a", "i2", project=False)]
    write(cfg, [view(cfg, "a", a, confirmed=now - 1000),
                view(cfg, "b", [], confirmed=now - 1000)], now=now)
    path = summary_path(cfg, "patrol")
    if whole:
        path.unlink()
        path = board_path(cfg, "patrol")
    doc = json.loads(path.read_text("utf-8"))
    change(doc["instances"][0])
    path.write_text(json.dumps(doc), "utf-8")
    return read_board(cfg, cfg.instances, now_ms=now, summary=True)


def _set(**values: Any) -> Any:
    def change(item: dict[str, Any]) -> None:
        item["tally"].update(values)
    return change


def _slot(i: int, value: Any) -> Any:
    def change(item: dict[str, Any]) -> None:
        item["tally"]["spend"][0][i] = value
    return change


WAITING = [f.name for f in fields(SessionRecord)].index("waiting")


def _wait_since(value: float) -> Any:
    def change(item: dict[str, Any]) -> None:
        item["sessions"][0][WAITING]["since"] = value
    return change


def _row(i: int, value: Any) -> Any:
    def change(item: dict[str, Any]) -> None:
        item["sessions"][0][i] = value
    return change


def _drop_row(item: dict[str, Any]) -> None:
    del item["sessions"][0]


def _idle_row(item: dict[str, Any]) -> None:
    item["sessions"][1][7] = False  # ``running``: a summary keeps only the running sessions


IMPOSSIBLE = {
    "running fewer than its rows": _set(running_total=2),
    "running project fewer than its rows": _set(running_project=0),
    "waiting not its rows'": _set(waiting=0),
    "a running session dropped": _drop_row,
    "an idle row": _idle_row,
    "project under running project": _set(project_sessions=1),
    "total under project and the others running": _set(total_sessions=3),
    "usd NaN": _slot(1, float("nan")),
    "usd infinite": _slot(1, float("inf")),
    "usd negative": _slot(1, -0.25),
    "unknown negative": _slot(2, -1),
    "sessions negative": _slot(3, -4),
    "more unknown than sessions": _slot(2, 9),
    "more sessions in the slots than the project has": _slot(3, 99),
    "a wait since forever": _wait_since(float("inf")),  # int(inf): OverflowError, a crash
    "a wait since NaN": _wait_since(float("nan")),
    "a wait since after the year 9999": _wait_since(10**20),
    "a row updated after the year 9999": _row(5, 10**20),  # `sessions --json`: gmtime raised
    "a row created before 1970": _row(4, -1),
    "a slot of a count past any float": _slot(3, 10**400),
}


@pytest.mark.parametrize("change", IMPOSSIBLE.values(), ids=IMPOSSIBLE)
def test_a_summary_that_contradicts_itself_is_scanned(tmp_path: Path, change: Any) -> None:
    """Counts its own rows deny, a spend no scan could give (NaN would print "$nan" and
    never reach a budget): the summary is corrupt, its instance is scanned."""
    got = _forge(tmp_path, change)
    assert "a" not in got.scans and "unreadable" in got.stale["a"], got.stale
    assert "b" in got.scans  # the rest of the summary still counts


@pytest.mark.parametrize("cost", [float("nan"), float("inf"), -0.25, 1e300])
def test_a_whole_board_row_with_a_cost_no_scan_gives_is_scanned(
    tmp_path: Path, cost: float | bool
) -> None:
    """An older writer's board (no summary) is read whole and its rows' costs are today's
    spend: one no scan could give (``wire.cost_value``: it would say unknown) is corrupt."""
    def change(item: dict[str, Any]) -> None:
        item["sessions"][3][6] = cost

    got = _forge(tmp_path, change, whole=True)
    assert "a" not in got.scans and "unreadable" in got.stale["a"], got.stale


def test_an_untouched_summary_is_taken(tmp_path: Path) -> None:
    """What the two tests above alter, unaltered: taken, with the counts of all five."""
    got = _forge(tmp_path, lambda item: None)
    tally = got.scans["a"].tally
    assert tally is not None and set(got.scans) == {"a", "b"}
    assert (tally.total_sessions, tally.project_sessions, tally.running_total,
            tally.running_project, tally.waiting) == (5, 3, 3, 2, 1)


def test_a_run_outside_the_project_shows_in_the_running_total_as_a_scan_shows_it(
    tmp_path: Path,
) -> None:
    """Seen on real opencode 1.18.33: a run started outside the project once the daemon ran
    left `status` from the board saying running 0 where `status --fresh` said 1, because the
    board ignored every frame of a session outside the project."""
    from xaf_hub.fleet.events import Frame

    f = follower(config(tmp_path))
    scan = replace(f.live.scans["a"], sessions=[record("a", "s1", running=True),
                                           record("a", "x1", project=False)])  # idle
    f._reconcile(scan.inst, f.boards["a"], scan, "rescan")
    board = f.boards["a"]

    def total() -> int:
        (live,) = f.live_view()
        return live.scan.summary().running_total

    assert total() == 1
    busy = {"type": "busy"}
    assert board.apply(Frame("session.status", {"sessionID": "x1", "status": busy})) == []
    assert total() == 2  # s1 and x1, as a scan counts them; no event for a foreign session
    board.apply(Frame("session.idle", {"sessionID": "x1"}))
    assert total() == 1
    # A session created outside the project after the rescan: its frames tell its runs too.
    info = {"id": "x2", "title": "elsewhere", "directory": "/elsewhere",
            "time": {"created": NOW, "updated": NOW}}
    assert board.apply(Frame("session.created", {"info": info})) == []
    assert board.missing == []  # no lookup for a session outside the project
    board.apply(Frame("session.status", {"sessionID": "x2", "status": busy}))
    (live,) = f.live_view()
    by_id = {s.id: s for s in live.scan.sessions}
    assert by_id["x2"].running and not by_id["x2"].project
    assert live.scan.summary().running_total == 2
    assert live.scan.summary().running_project == 1
    board.apply(Frame("session.deleted", {"sessionID": "x2"}))
    assert total() == 1
    # The next rescan is the truth again.
    board.apply(Frame("session.status", {"sessionID": "x1", "status": busy}))
    f._reconcile(scan.inst, board, scan, "rescan")
    assert total() == 1


def test_a_session_outside_the_project_deleted_since_the_rescan_is_gone_from_the_view(
    tmp_path: Path,
) -> None:
    """The view took the last scan's sessions outside the project and laid the board's over
    them: one deleted since (no longer on the board) came back as the scan saw it, running."""
    from xaf_hub.fleet.events import Frame

    f = follower(config(tmp_path))
    scan = replace(f.live.scans["a"], sessions=[record("a", "s1", running=True),
                                           record("a", "x1", project=False, running=True)])
    f._reconcile(scan.inst, f.boards["a"], scan, "rescan")
    board = f.boards["a"]
    board.apply(Frame("session.idle", {"sessionID": "x1"}))
    board.apply(Frame("session.deleted", {"sessionID": "x1"}))
    (live,) = f.live_view()
    summary = live.scan.summary()
    assert [s.id for s in live.scan.sessions] == ["s1"]  # as a scan now lists them
    assert (summary.total_sessions, summary.running_total) == (1, 1)


def test_a_session_outside_the_project_named_before_its_info_counts_once_its_info_comes(
    tmp_path: Path,
) -> None:
    """A frame naming a session the board did not know, from a directory outside the project,
    left its id among those ignored; its ``session.created`` (or ``updated``) info that came
    next was then ignored too, and its runs never counted until the stream reconnected. So
    too for an id deleted and created again."""
    from xaf_hub.fleet.events import Frame

    f = follower(config(tmp_path))
    scan = replace(f.live.scans["a"], sessions=[record("a", "s1", running=True)])
    f._reconcile(scan.inst, f.boards["a"], scan, "rescan")
    board = f.boards["a"]
    busy = {"type": "busy"}
    for sid in ("x2", "x3"):
        board.apply(Frame("session.status", {"sessionID": sid, "status": busy}, "/elsewhere"))
        info = {"id": sid, "title": "", "directory": "/elsewhere"}
        assert board.apply(Frame("session.created", {"info": info}, "/elsewhere")) == []
        board.apply(Frame("session.status", {"sessionID": sid, "status": busy}, "/elsewhere"))
    board.apply(Frame("session.deleted", {"sessionID": "x3"}, "/elsewhere"))
    board.apply(Frame("session.created", {"info": {"id": "x3", "directory": "/elsewhere"}}))
    board.apply(Frame("session.status", {"sessionID": "x3", "status": busy}, "/elsewhere"))
    assert board.missing == []
    (live,) = f.live_view()
    summary = live.scan.summary()
    assert (summary.running_total, summary.running_project) == (3, 1)


def test_what_frames_tell_of_sessions_outside_the_project_is_kept_only_so_large(
    tmp_path: Path,
) -> None:
    """Each session outside the project a frame told of kept that frame's title, folder and
    model whole: a stream of frames with 1 MB titles held 1 MB per session, 10 GB at
    ``MAX_REMEMBERED`` (measured: 301 MB held after 300 such frames, 1 MB before the board
    kept these sessions)."""
    from xaf_hub.fleet.events import Frame

    f = follower(config(tmp_path))
    board = f.boards["a"]
    board.reconcile(f.live.scans["a"].sessions, "rescan")  # x1, outside the project
    big = "T" * 1_000_000
    for sid in ("x1", "y1"):
        info = {"id": sid, "title": big, "directory": "/elsewhere/" + big, "parentID": big,
                "model": {"providerID": big, "id": big}}
        board.apply(Frame("session.created", {"info": info}, "/elsewhere"))
        board.apply(Frame("session.updated", {"info": info}, "/elsewhere"))
    assert set(board.foreign) == {"x1", "y1"}
    for rec in board.foreign.values():
        # a real title, folder or model name is far shorter than 1000 characters
        assert max(len(rec.title), len(rec.directory), len(rec.model), len(rec.parent_id)) <= 1000
    assert board.foreign["y1"].directory.startswith("/elsewhere/T")


def test_a_stream_of_long_directory_names_leaves_nothing_held(tmp_path: Path) -> None:
    """The board kept the project verdict of every directory a frame named, keyed by the whole
    name: 10,000 names of 1 MB would hold 10 GB (200 of 100 kB held 20 MB). A name longer
    than any real folder is judged each time and not kept."""
    import tracemalloc

    from xaf_hub.fleet.events import Frame

    f = follower(config(tmp_path))
    board = f.boards["a"]
    board.reconcile(f.live.scans["a"].sessions, "rescan")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(200):
            name = f"/elsewhere/{i}/" + "d" * 100_000
            board.apply(Frame("session.status", {"sessionID": f"z{i}",
                                                 "status": {"type": "busy"}}, name))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 2_000_000, held
    # Still judged as the scan judges it: a long name inside the project is the project's.
    assert board.is_project("/srv/proj/app/" + "d" * 5000)
    assert not board.is_project("/elsewhere/" + "d" * 5000)


@pytest.mark.parametrize("nxt", ["soon", float("nan"), 1e400, 10**22, -5, [1], {"at": 1}])
def test_a_retry_with_a_next_no_clock_gives_is_read_as_a_scan_reads_it(
    tmp_path: Path, nxt: Any
) -> None:
    """A retry frame's ``next`` that is no time (the scan reads it as 0, ``read_status``)
    raised in ``apply`` (the frame dropped as unreadable, the run state lost) or, out of
    range, went on the board as is, and every reader then threw the instance's summary away
    and scanned; for a project session as for one outside the project."""
    from xaf_hub.fleet.events import Frame

    cfg = config(tmp_path)
    f = follower(cfg)
    scan = replace(f.live.scans["a"],
                   sessions=[record("a", "s1"), record("a", "x1", project=False)])
    f._reconcile(scan.inst, f.boards["a"], scan, "rescan")
    f.live.heard_ms["a"] = NOW - 500
    for sid in ("s1", "x1"):
        retry = {"type": "retry", "message": {"not": "text"}, "next": nxt}
        f.boards["a"].apply(Frame("session.status", {"sessionID": sid, "status": retry}))
    (live,) = f.live_view()
    assert {(s.id, s.run_state, s.retry_next, s.retry_message) for s in live.scan.sessions} == {
        ("s1", "retry", 0, ""), ("x1", "retry", 0, "")}
    write(cfg, f.live_view())
    got = read_board(cfg, [cfg.instance("a")], now_ms=NOW, summary=True)
    assert got.stale == {}
    assert got.scans["a"].summary().running_total == 2


def test_a_stream_of_made_up_foreign_sessions_is_remembered_only_so_far(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xaf_hub.fleet import events
    from xaf_hub.fleet.events import Frame

    monkeypatch.setattr(events, "MAX_REMEMBERED", 5)
    f = follower(config(tmp_path))
    board = f.boards["a"]
    board.reconcile(f.live.scans["a"].sessions, "rescan")
    for i in range(50):
        info = {"id": f"y{i}", "title": "", "directory": f"/elsewhere/{i}"}
        board.apply(Frame("session.created", {"info": info}))
    assert len(board.foreign) == 1 + 5  # the scan's x1 and the first five
    board.reconcile(f.live.scans["a"].sessions, "rescan")
    assert set(board.foreign) == {"x1"}


def test_a_summary_older_than_its_board_is_not_taken_for_it(tmp_path: Path) -> None:
    """A hub from before the summaries runs again where a newer one left its summary (or the
    writer died between the two files): the board is newer than the summary beside it, so
    the summary is not the board's, and `status` reads the board whole, as for a writer that
    wrote no summary, instead of judging a summary nobody keeps (and scanning)."""
    import os

    from xaf_hub.ops.live_board import document, summary_path

    cfg = config(tmp_path)
    now = int(time.time() * 1000)
    write(cfg, [view(cfg, "a", [record("a", "s1")], confirmed=now - 600_000),
                view(cfg, "b", [], confirmed=now - 600_000)], now=now - 600_000)
    os.utime(summary_path(cfg, "patrol"), (time.time() - 600, time.time() - 600))
    fresh = [view(cfg, "a", [record("a", "s1", running=True)], confirmed=now - 1000),
             view(cfg, "b", [], confirmed=now - 1000)]
    board_path(cfg, "patrol").write_text(json.dumps(document(cfg, fresh, "patrol", now)))
    got = read_board(cfg, cfg.instances, now_ms=now, summary=True)
    assert set(got.scans) == {"a", "b"}, got.stale
    assert got.scans["a"].tally is None and got.scans["a"].sessions[0].running


@pytest.mark.parametrize("confirmed", [10**400, 10**20, -5], ids=["past-float", "year-3e9", "neg"])
@pytest.mark.parametrize("summary", [False, True], ids=["board", "summary"])
def test_a_confirmation_no_clock_could_give_is_not_current_never_raised(
    tmp_path: Path, confirmed: int, summary: bool
) -> None:
    """JSON has integers of any size: one past a float's range made `(now - confirmed) /
    1000` raise OverflowError out of `status` and `sessions`."""
    def change(item: dict[str, Any]) -> None:
        item["confirmed_at_ms"] = confirmed

    got = _forge(tmp_path, change, whole=not summary)
    assert "a" not in got.scans and "b" in got.scans
    assert "not followed right now" in got.stale["a"] or "ahead" in got.stale["a"]


def test_a_board_of_every_project_is_read_by_a_view_of_every_project(tmp_path: Path) -> None:
    doc = {
        "state_dir": str(tmp_path / "state"),
        "projects": {"shop": {"roots": {"a": ["/srv/proj"]}}, "blog": {"roots": {"a": ["/srv/b"]}}},
        "instances": [{"name": "a", "url": "http://a.test:4096"}],
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), "utf-8")
    every = load_config(path, env={"XAF_HUB_HOME": str(tmp_path / "home")})
    now = int(time.time() * 1000)
    rows = [replace(record("a", "s1", running=True), owner="shop"),
            replace(record("a", "s2", running=True), directory="/srv/b/x", owner="blog")]
    write(every, [view(every, "a", rows, confirmed=now - 1000)], now=now)
    got = read_board(every, every.instances, now_ms=now)
    assert got.scans["a"].sessions == rows
    # a view of one project does not take a board of every project (its project flags differ)
    shop = every.choose("shop")
    assert "other directory rules" in read_board(shop, shop.instances, now_ms=now).stale["a"]
    # status of every project reads it, asks no server, and counts each project apart
    asked: list[str] = []
    code, out = status(tmp_path, path, asked)
    assert code == 0 and asked == [] and out["source"] == "live"
    assert [(p["project"], p["running"]) for p in out["instances"][0]["projects"]] == [
        ("shop", 1), ("blog", 1)]
