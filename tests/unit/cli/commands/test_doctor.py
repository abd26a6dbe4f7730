"""`doctor`: the pure checks table-driven over plain config objects, then one CLI run."""

from __future__ import annotations

import base64
import io
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest

from tests.contained import WORKS
from xaf_hub import __version__
from xaf_hub.cli.commands import doctor as d
from xaf_hub.cli.main import main
from xaf_hub.config.load import Config, InstanceConfig, ModelsConfig, load_config
from xaf_hub.core.clock import to_ms
from xaf_hub.core.rules import ProjectRules
from xaf_hub.errors import Cause, ConfigError, ConfigProblem, ExitCode
from xaf_hub.ops import health as h
from xaf_hub.store import contain
from xaf_hub.store.contain import Proof
from xaf_hub.store.model_state import Blackout
from xaf_hub.store.patrol_state import PAUSE_FILE, clear_paused, pause_info, set_paused

SECRET = "hunter2-Sekret"


def inst(name: str = "lan-b", **kw: Any) -> InstanceConfig:
    roots = kw.pop("roots", ("/srv/demo",))
    exclude = kw.pop("exclude_dirs", ())
    return InstanceConfig(
        name=name, url=kw.pop("url", "http://127.0.0.1:4096"), roots=roots,
        rules=ProjectRules.build(roots=roots, exclude_dirs=exclude), **kw)


def probe(name: str = "lan-b", *dirs: str, reachable: bool = True, reason: str = "",
          cause: Cause | None = None) -> h.Probe:
    return h.Probe(name, reachable, reason, "classic" if reachable else "",
                   "1.18.33" if reachable else "", tuple(dirs), cause=cause)


def levels(findings: list[h.Finding]) -> list[str]:
    return [f.level for f in findings]


# ------------------------------------------------------------------------------------------
# config errors: the real loader's messages map to a fix, and the line names file and key


def _config_error(tmp_path: Path, text: str) -> ConfigError:
    path = tmp_path / "config.json"
    path.write_text(text, "utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(str(path), env={"XAF_HUB_HOME": str(tmp_path / "home")}, cwd=tmp_path)
    return info.value


GOOD_INSTANCE = '{"name": "a", "url": "http://127.0.0.1:1", "roots": ["/srv/x"]}'


@pytest.mark.parametrize(("text", "in_message", "in_fix"), [
    ('{"instances": [' + GOOD_INSTANCE + '],}', "line 1 column", "JSON syntax"),
    ('{"instancs": []}', "key 'instancs'", "spelling"),
    ('{"instances": [{"name": "a", "url": "http://h", "rootz": []}]}',
     "instances[0].rootz", "spelling"),
    ('{"instances": [{"name": "a", "url": "http://h", "password": "pw"}]}',
     "instances[0].password", "config.local.json"),
    ('{"instances": [{"name": "a", "url": "ftp://h"}]}', "instances[0].url", "http://127.0.0.1"),
    ('{"instances": [{"name": "a", "url": "http://h", "roots": ["srv/x"]}]}',
     "instances[0].roots[0]", "full path"),
    ('{"instances": [' + GOOD_INSTANCE + ', ' + GOOD_INSTANCE + ']}', "duplicate", "own name"),
    ('{"models": {"timezone": "Mars/Olympus"}}', "models.timezone", "IANA"),
    ('{"concurrency_limit": "two"}', "concurrency_limit", "valid value"),
])
def test_config_error_line_names_file_key_and_fix(
    tmp_path: Path, text: str, in_message: str, in_fix: str
) -> None:
    f = h.config_error_finding(_config_error(tmp_path, text))
    assert f.level == "error" and f.exit_code == ExitCode.USAGE
    assert str(tmp_path / "config.json") in f.message
    assert in_message in f.message
    assert in_fix in f.fix


def test_config_fix_for_missing_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, env={"XAF_HUB_HOME": str(tmp_path / "home")}, cwd=tmp_path)
    assert "xaf-hub init" in h.config_error_finding(info.value).fix


@pytest.mark.parametrize(("problem", "in_fix"), [
    ("no_config", "xaf-hub init"), ("bad_json", "JSON syntax"), ("unknown_key", "spelling"),
    ("bad_timezone", "IANA"), ("value", "valid value"),
])
def test_the_config_fix_follows_the_problem_not_the_words(problem: ConfigProblem,
                                                          in_fix: str) -> None:
    # Words of another problem each time: only the code may choose the fix.
    for words in ("no config found", "invalid JSON, unknown key", "unknown time zone", "x"):
        assert in_fix in h.config_error_finding(ConfigError(words, problem)).fix


# ------------------------------------------------------------------------------------------
# instances


def test_auth_rejected_names_source_and_hides_password() -> None:
    i = inst(password=SECRET, password_source="env:XAF_HUB_PW_LAN_B")
    fs = h.instance_findings(i, probe(reachable=False, cause="auth",
                                      reason="auth rejected (HTTP 401): check the password"))
    assert levels(fs) == ["error"]
    assert fs[0].exit_code == ExitCode.UNREACHABLE
    assert "env var XAF_HUB_PW_LAN_B" in fs[0].message
    assert "env:XAF_HUB_PW_LAN_B was refused" in fs[0].fix
    assert all(SECRET not in f.message + f.fix for f in fs)


def test_auth_rejected_without_password_says_where_to_put_one() -> None:
    fs = h.instance_findings(inst(), probe(reachable=False, reason="login refused", cause="auth"))
    assert "Set XAF_HUB_PW_LAN_B" in fs[0].fix
    assert "instances.lan-b.password" in fs[0].fix


@pytest.mark.parametrize(("cause", "reason", "fix"), [
    ("refused", "connection refused (nothing listening on that port)", "opencode serve"),
    ("dns", "DNS lookup failed (host name not found)", "host name"),
    ("timeout", "connection timed out after 8s", "firewall"),
    ("html", "answered with an HTML page instead of JSON (wrong URL or path prefix?)",
     "base address"),
    ("forbidden", "access forbidden (HTTP 403)", "proxy in front"),
    ("server_error", "server error (HTTP 502)", "log"),
    ("dropped", "truncated response (the server closed the connection mid-answer)", "proxy"),
    ("garbled", "truncated or invalid JSON in the response", "cut mid-answer"),
    ("other", "something new", "/global/health"),
])
def test_unreachable_reasons_get_their_fix(cause: Cause, reason: str, fix: str) -> None:
    fs = h.instance_findings(inst(password="x", password_source="local:/c.json"),
                             probe(reachable=False, reason=reason, cause=cause))
    assert levels(fs) == ["error"]
    assert fs[0].exit_code == ExitCode.UNREACHABLE
    assert reason in fs[0].message and fix in fs[0].fix
    assert "password from config.local.json /c.json" in fs[0].message


@pytest.mark.parametrize("reason", ["HTTP 401 connection refused", "dns timed out html 403", ""])
def test_the_fix_follows_the_cause_whatever_the_reason_says(reason: str) -> None:
    i = inst(password="x", password_source="local:/c.json")
    fs = h.instance_findings(i, probe(reachable=False, reason=reason, cause="auth"))
    assert "auth rejected (HTTP 401)" in fs[0].message and "was refused" in fs[0].fix
    fs = h.instance_findings(i, probe(reachable=False, reason=reason, cause="timeout"))
    assert levels(fs) == ["error"] and "firewall" in fs[0].fix
    fs = h.instance_findings(inst(), probe(reachable=False, reason=reason, cause="no_password"))
    assert fs[0].exit_code == ExitCode.USAGE
    assert fs[0].message == "no password configured for lan-b: set XAF_HUB_PW_LAN_B"


def test_healthy_instance_is_one_ok_line_with_version_dialect_and_source() -> None:
    i = inst(password=SECRET, password_source="file:/etc/hub/pw.json")
    fs = h.instance_findings(i, probe("lan-b", "/srv/demo/app", "/tmp/x"))
    assert levels(fs) == ["ok"]
    text = fs[0].message
    assert "opencode 1.18.33" in text and "classic API" in text and "2 session(s)" in text
    assert "password_file /etc/hub/pw.json" in text and SECRET not in text


def test_missing_password_on_open_server_is_a_warning() -> None:
    fs = h.instance_findings(inst(), probe())
    assert levels(fs) == ["ok", "warn"]
    assert "no password configured" in fs[1].message
    assert h.worst(fs) == ExitCode.OK


# ------------------------------------------------------------------------------------------
# roots and default_directory


@pytest.mark.parametrize(("kw", "expect"), [
    ({}, []),
    ({"default_directory": "/srv/demo/app"}, []),
    ({"roots": ()}, ["warn"]),
    ({"roots": (), "danger": True}, ["info"]),
    ({"default_directory": "/srv/other"}, ["warn"]),
    ({"default_directory": "/srv/demo/vendor/x", "exclude_dirs": ("/srv/demo/vendor",)},
     ["warn"]),
    ({"roots": ("/srv/demo", "srv/rel")}, ["error"]),
    ({"default_directory": "app"}, ["error"]),
    ({"roots": ("/srv/demo", "/srv/demo/vendor"), "exclude_dirs": ("/srv/demo/vendor",)},
     ["warn"]),
    ({"roots": ("C:\\Work\\Demo",), "default_directory": "c:/work/demo/app"}, []),
])
def test_layout(kw: dict[str, Any], expect: list[str]) -> None:
    fs = h.layout_findings(inst(**kw))
    assert levels(fs) == expect
    assert all(f.fix for f in fs if f.level in ("warn", "error"))


def test_root_without_sessions_warns_with_typo_hint() -> None:
    i = inst(roots=("/srv/project", "/srv/used"))
    fs = h.root_usage_findings(i, probe("lan-b", "/srv/projekt/app", "/SRV/Used/x/"))
    assert levels(fs) == ["warn"]
    assert "/srv/project has no sessions" in fs[0].message
    assert "closest session folder: /srv/projekt" in fs[0].message


def test_root_usage_is_silent_when_unreachable_or_used() -> None:
    i = inst(roots=("D:\\Repo",))
    assert h.root_usage_findings(i, probe("lan-b", "d:/repo/sub")) == []
    assert h.root_usage_findings(i, probe(reachable=False, reason="refused")) == []


# ------------------------------------------------------------------------------------------
# config.local.json and credential files


def _cfg(tmp_path: Path, scope: str, *instances: InstanceConfig) -> Config:
    return Config(path=tmp_path / "config.json", home=tmp_path / "home",
                  state_dir=tmp_path / "home", instances=instances,
                  local_config=tmp_path / "home" / "config.local.json", local_scope=scope)


def test_home_local_config_reports_scope_and_ignored_keys(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "home", inst("lan-b"), inst("lan-c"))
    doc = {"instances": {"lan-b": {"password": SECRET, "roots": ["/x"]},
                         "lan_c": {"password": SECRET}}}
    fs = h.config_findings(cfg, doc)
    text = "\n".join(f.message for f in fs)
    assert "scope 'home'" in text
    assert "instances.lan-b: roots ignored" in text
    assert "instances.lan_c matches no configured instance" in text
    assert any(f.fix == "Rename it to 'lan-c'." for f in fs)
    assert SECRET not in text


def test_beside_local_config_may_override_anything(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "beside", inst("lan-b"))
    fs = h.config_findings(cfg, {"instances": [{"name": "lan-b", "roots": ["/x"]}]})
    assert levels(fs) == ["ok", "ok"]
    assert "scope 'beside'" in fs[1].message


def test_no_local_config_is_info(tmp_path: Path) -> None:
    cfg = Config(path=tmp_path / "config.json", home=tmp_path, state_dir=tmp_path,
                 instances=(inst(),))
    assert levels(h.config_findings(cfg)) == ["ok", "info"]


@pytest.mark.parametrize(("mode", "warns"), [(0o100600, False), (0o100644, True),
                                              (0o100640, True), (None, False)])
def test_credential_file_mode(mode: int | None, warns: bool) -> None:
    f = h.file_mode_finding(Path("/h/config.local.json"), mode, "config.local.json")
    assert (f is not None) == warns
    if f is not None:
        assert "chmod 600 /h/config.local.json" in f.fix


# ------------------------------------------------------------------------------------------
# state folder, clock, patrol flag, severity


def test_check_writable(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    assert d.check_writable(folder) == (None, False)
    assert list(folder.iterdir()) == []  # the temp file is gone again
    missing = folder / "a" / "b"
    assert d.check_writable(missing) == (None, True)
    assert not (folder / "a").exists()  # the doctor looks, it does not create
    blocker = tmp_path / "file"
    blocker.write_text("x")
    problem, _ = d.check_writable(blocker / "state")
    assert problem is not None and "is a file" in problem
    f = h.folder_finding("state folder", blocker / "state", problem, True)
    assert f.level == "error" and f.exit_code == ExitCode.USAGE and "state_dir" in f.fix


def test_clock_shows_zone_next_reset_and_active_blackouts() -> None:
    tz = ZoneInfo("Europe/Berlin")
    now = datetime(2025, 3, 29, 9, 0, tzinfo=UTC)  # 10:00 in Berlin, DST starts that night
    until = datetime(2025, 3, 30, 6, 0, tzinfo=UTC)  # 08:00 CEST
    blackouts = {"opencode": Blackout("opencode", to_ms(until), "free usage limit",
                                      "patrol.fix_free_limit", to_ms(now))}
    fs = h.clock_findings(ModelsConfig(timezone="Europe/Berlin"), tz, now, blackouts,
                          {"opencode": ["opencode/"]})
    assert levels(fs) == ["ok", "ok", "warn"]
    assert "Europe/Berlin" in fs[0].message
    assert "rests a model of opencode (opencode/) until 08:00" in fs[1].message
    assert "next 2025-03-30 08:00 CEST (in 21h 00m)" in fs[1].message
    assert "until 2025-03-30 08:00" in fs[2].message and "free usage limit" in fs[2].message
    assert "reset hour" in fs[2].message and fs[2].subject == "family opencode"
    assert "xaf-hub models clear opencode" in fs[2].fix
    assert h.worst(fs) == ExitCode.OK
    stated = {"fake/m": Blackout("fake/m", to_ms(now) + 300_000, "429", "p", to_ms(now),
                                 scope="model", why="stated")}
    # No family chosen: the zone and the rests in force, no daily reset.
    fs = h.clock_findings(ModelsConfig(timezone="Europe/Berlin"), tz, now, stated)
    assert [f.subject for f in fs] == ["time zone", "model fake/m"]
    assert "stated by the server" in fs[1].message and "reset" not in fs[0].message


@pytest.mark.parametrize(("models", "chosen"), [
    ({}, {}),  # nobody chose: the built-in family over models nobody named
    ({"default_dispatch_model": "fake/m", "chain": ["anthropic/x"]}, {}),
    ({"chain": ["opencode/big-pickle", "fake/m"]}, {"opencode": ["opencode/", "opencode-go/"]}),
    ({"blackout_families": {"paid": ["anthropic/"]}}, {"paid": ["anthropic/"]}),
    ({"blackout_families": {"paid": ["anthropic/"], "free": ["opencode/"]},
      "chain": ["opencode/a"]}, {"paid": ["anthropic/"], "free": ["opencode/"]}),
])
def test_the_daily_reset_is_shown_for_families_a_person_chose(
    tmp_path: Path, models: dict[str, Any], chosen: dict[str, list[str]]
) -> None:
    from xaf_hub.ops.models import families_chosen

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"models": models, "instances": [
        {"name": "a", "url": "http://127.0.0.1:1", "roots": ["/srv"]}]}), "utf-8")
    assert families_chosen(load_config(str(path), env={}, cwd=tmp_path)) == chosen


def test_patrol_flag_as_the_patrol_writes_it(tmp_path: Path) -> None:
    flag = tmp_path / PAUSE_FILE
    assert h.patrol_finding(flag, pause_info(tmp_path)).level == "ok"
    set_paused(tmp_path, "ops@host", datetime(2025, 5, 1, 9, 30, tzinfo=UTC))
    f = h.patrol_finding(flag, pause_info(tmp_path))
    assert f.level == "warn"
    assert "since 2025-05-01T09:30:00+00:00 by ops@host" in f.message and str(flag) in f.message
    assert "xaf-hub patrol resume" in f.fix
    clear_paused(tmp_path)
    flag.write_text("{not json")  # a damaged flag still means paused
    assert h.patrol_finding(flag, pause_info(tmp_path)).level == "warn"


def test_daemon_heartbeat_line() -> None:
    assert "no patrol daemon" in h.daemon_finding(None).message
    running = h.daemon_finding({"pid": 42, "host": "box", "started_at": "2025-05-01T09:00:00",
                                "ticks": 3, "tick_at": "2025-05-01T11:00:00", "last": "ran",
                                "stopped_at": ""})
    assert running.level == "info"
    assert "pid 42 on box" in running.message and "no clean stop recorded" in running.message
    assert "3 cycle(s), last at 2025-05-01T11:00:00 (ran)" in running.message
    stopped = h.daemon_finding({"pid": 42, "host": "box", "stopped_at": "2025-05-01T12:00:00"})
    assert "stopped at 2025-05-01T12:00:00" in stopped.message
    text = d.render(None, [stopped], ExitCode.OK)
    assert "hint: `xaf-hub patrol status`" in text and "fix:" not in text


def _err(code: ExitCode) -> h.Finding:
    return h.error("x", "y", "m", "f", code)


@pytest.mark.parametrize(("findings", "code"), [
    ([], ExitCode.OK),
    ([h.warn("a", "b", "c", "d"), h.info("a", "b", "c")], ExitCode.OK),
    ([_err(ExitCode.UNREACHABLE), _err(ExitCode.USAGE)], ExitCode.USAGE),
    ([_err(ExitCode.INTERNAL), _err(ExitCode.USAGE)], ExitCode.INTERNAL),
    ([_err(ExitCode.INTERNAL)], ExitCode.INTERNAL),
])
def test_worst(findings: list[h.Finding], code: ExitCode) -> None:
    assert h.worst(findings) == code


def test_render_puts_fix_under_problem_and_sums_up() -> None:
    fs = [h.ok("config", "config", "fine"),
          _err(ExitCode.UNREACHABLE),
          h.warn("roots", "lan-b", "no roots", "add roots")]
    text = d.render(Path("/c.json"), fs, h.worst(fs))
    lines = text.splitlines()
    assert lines[0] == f"xaf-hub {__version__} doctor: config /c.json"
    assert lines[3].strip() == "fix: f" and lines[5].strip() == "fix: add roots"
    assert lines[-1] == "1 problem(s), 1 warning(s): exit 2"
    assert d.render(None, [h.ok("a", "b", "c")], ExitCode.OK).splitlines()[-1] == "all well"


LONG_FIX = (
    "start the server on that host (`opencode serve --port 4096 --hostname 0.0.0.0`), or "
    "correct instances[2].url in /home/operator/.xaf_hub/config.json; a firewall or a VPN "
    "that is down gives the same answer, so try `curl http://build-box:4096/global/health`"
)


def test_render_wraps_messages_and_fixes_at_the_terminal_width() -> None:
    fs = [h.error("instance", "lan-unreachable-long-name",
                  "connection refused (http://build-box:4096) after 2 tries, 8s in all; "
                  "the server did not answer at all", LONG_FIX, ExitCode.UNREACHABLE),
          h.ok("config", "config", "fine")]
    flat = d.render(None, fs, h.worst(fs))
    assert max(len(line) for line in flat.splitlines()) > 170  # the issue: one 170+ line
    for columns in (80, 60):
        text = d.render(None, fs, h.worst(fs), columns=columns)
        lines = text.splitlines()
        assert all(len(line) <= columns for line in lines[1:]), text
        fix_at = next(i for i, line in enumerate(lines) if "fix: " in line)
        start = lines[fix_at].index("fix: ") + len("fix: ")
        follow = lines[fix_at + 1 : next(i for i, ln in enumerate(lines) if "fine" in ln)]
        # Under the fix's own column at 80; under the marks when that column is narrow.
        indent = start if columns == 80 else 8
        assert follow and all(ln[:indent].strip() == "" and ln[indent] != " " for ln in follow)
        # Nothing lost or changed but the breaks.
        joined = " ".join([lines[fix_at][start:], *(ln.strip() for ln in follow)])
        assert joined == LONG_FIX


def test_a_secret_is_redacted_before_the_wrap_splits_anything() -> None:
    secret = "hunter2-very-secret"
    fs = [h.error("instance", "a", "m", f"the server answered 401 for {secret} " * 4,
                  ExitCode.UNREACHABLE)]
    text = d.render(None, fs, ExitCode.UNREACHABLE, columns=40,
                    clean=lambda t: t.replace(secret, "***"))
    assert secret not in text and "hunter2" not in text and "***" in text


# ------------------------------------------------------------------------------------------
# the command end to end, over a mock transport


def _server(password: str | None) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        expected = "Basic " + base64.b64encode(f"opencode:{password}".encode()).decode()
        if password and request.headers.get("authorization") != expected:
            return httpx.Response(401)
        if request.url.path == "/global/health":
            return httpx.Response(200, json={"healthy": True, "version": "1.18.33"})
        if request.url.path == "/experimental/session":
            return httpx.Response(200, json=[{"id": "ses_1", "directory": "/srv/demo/app",
                                              "time": {"created": 1, "updated": 2}}])
        if request.url.path == "/global/event":
            hello = b'data: {"payload":{"type":"server.connected","properties":{}}}\n\n'
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  content=hello)
        if request.url.path == "/session/status":
            return httpx.Response(200, json={})
        return httpx.Response(404)
    return httpx.MockTransport(handler)


def _run(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    transports = {"good": _server(SECRET), "bad": _server("the-real-one")}
    code = main(["--config", str(tmp_path / "config.json"), "doctor", *args],
                stdout=out, stderr=err, env=env, cwd=tmp_path,
                transport_factory=lambda i: transports[i.name])
    return code, out.getvalue(), err.getvalue()


def test_command_reports_each_instance_and_exits_with_the_worst(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (tmp_path / "config.json").write_text(json.dumps({"instances": [
        {"name": "good", "url": "http://good:1", "roots": ["/srv/demo"]},
        {"name": "bad", "url": "http://bad:1", "roots": ["/srv/demo"]},
    ], "project": {"repository": "https://git.example/demo.git"}}), "utf-8")
    home.mkdir()
    set_paused(home / "patrol", "ops", datetime(2025, 5, 1, tzinfo=UTC))
    env = {"XAF_HUB_HOME": str(home), "XAF_HUB_PW_GOOD": SECRET, "XAF_HUB_PW_BAD": "nope-nope"}
    code, out, err = _run(tmp_path, env)
    assert code == ExitCode.UNREACHABLE, out + err
    assert "good" in out and "auth accepted" in out and "opencode 1.18.33" in out
    assert "bad" in out and "auth rejected (HTTP 401)" in out
    assert "env:XAF_HUB_PW_BAD was refused" in out
    assert "patrol paused" in out
    assert SECRET not in out + err and "nope-nope" not in out + err

    code, out, _ = _run(tmp_path, env, "--json")
    doc = json.loads(out)
    assert code == doc["exit_code"] == 2 and doc["errors"] == 1
    assert doc["version"] == __version__
    bad = [f for f in doc["findings"] if f["subject"] == "bad"]
    assert bad[0]["level"] == "error" and bad[0]["fix"]

    env["XAF_HUB_PW_BAD"] = "the-real-one"
    clear_paused(home / "patrol")
    code, out, _ = _run(tmp_path, env)
    assert code == ExitCode.OK, out
    assert out.splitlines()[-1] == "all well"


def test_command_config_error_exits_4_with_file_and_key(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"instances": [], "scan_wokers": 3}', "utf-8")
    code, out, err = _run(tmp_path, {"XAF_HUB_HOME": str(tmp_path / "home")})
    assert code == ExitCode.USAGE
    assert f"{tmp_path / 'config.json'}: key 'scan_wokers'" in out
    assert "did you mean 'scan_workers'" in out and "fix: Remove the key" in out
    assert err == ""


def test_command_corrupt_model_state_is_named_and_exits_1(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".model_state.json").write_text('{"schema_version": 1, "blackouts": [', "utf-8")
    (tmp_path / "config.json").write_text(json.dumps({"instances": [
        {"name": "good", "url": "http://good:1", "roots": ["/srv/demo"]}]}), "utf-8")
    code, out, _ = _run(tmp_path, {"XAF_HUB_HOME": str(home), "XAF_HUB_PW_GOOD": SECRET})
    assert code == ExitCode.INTERNAL, out
    assert f"{home / '.model_state.json'}" in out and "line 1" in out
    assert "fix: Repair or move aside the named file" in out
    assert "models.timezone" in out  # the clock itself is still shown


def test_opencode_missing_is_one_line_saying_how_to_get_it(tmp_path: Path) -> None:
    from xaf_hub.ops.health import opencode_finding

    missing = opencode_finding({"PATH": str(tmp_path)})
    assert missing.level == "info" and missing.exit_code == ExitCode.OK
    assert "npm install -g opencode-ai@" in missing.fix and "\n" not in missing.fix
    tool = tmp_path / "opencode"
    tool.write_text("#!/bin/sh\n", "utf-8")
    tool.chmod(0o755)
    found = opencode_finding({"PATH": str(tmp_path)})
    assert found.level == "ok" and str(tool) in found.message


def test_file_backends_on_two_hosts_warn_with_the_fix() -> None:
    # One host, file backends, its own heartbeat: nothing to say.
    assert h.file_backend_findings("file", "file", "box", "box", []) == []
    assert h.file_backend_findings("file", "file", "box", None, []) == []
    # Both in Redis: the lease keeps one daemon active, whatever the hosts.
    assert h.file_backend_findings("redis", "redis", "box", "box", ["a", "b"]) == []
    # A shared state folder last written by a daemon elsewhere: two hosts on files.
    (f,) = h.file_backend_findings("file", "file", "box", "other", [])
    assert f.level == "warn" and f.exit_code == ExitCode.OK
    assert "last patrol daemon ran on other, this is box" in f.message
    assert 'pool.backend "redis"' in f.fix and "backlog import" in f.fix
    # A shared gate with pools on each host: warned always, with the hosts when seen.
    (f,) = h.file_backend_findings("redis", "file", "box", "box", ["box"])
    assert f.level == "warn"
    assert 'pool.backend is "file" while lock.backend is "redis"' in f.message
    assert "every hub that shares this gate" in f.message and "sent twice" in f.message
    (f,) = h.file_backend_findings("redis", "file", "box", "box", ["b", "a", "b"])
    assert "patrol daemons seen on 2 hosts (a, b)" in f.message
    # A shared pool with a gate per host: only when daemons on two hosts are seen.
    assert h.file_backend_findings("file", "redis", "box", "box", ["box"]) == []
    (f,) = h.file_backend_findings("file", "redis", "box", "box", ["a", "b"])
    assert "go past an instance's limit" in f.message


def test_doctor_warns_of_a_file_pool_beside_a_redis_gate(
    tmp_path: Path, redis_server: Any
) -> None:
    from tests.redis_fixture import RedisServer

    doc = {
        "instances": [{"name": "good", "url": "http://good:1", "roots": ["/srv/demo"]}],
        "lock": {"backend": "redis", "redis_url": redis_server.url,
                 "redis_prefix": RedisServer.prefix()},
    }
    (tmp_path / "config.json").write_text(json.dumps(doc), "utf-8")
    env = {"XAF_HUB_HOME": str(tmp_path / "home"), "XAF_HUB_PW_GOOD": SECRET,
           **redis_server.env()}
    code, out, err = _run(tmp_path, env, "--json")
    findings = json.loads(out)["findings"]
    found = [f for f in findings if f["subject"] == "file pool, shared gate"]
    assert len(found) == 1 and found[0]["level"] == "warn", findings
    assert code == ExitCode.OK, findings  # a warning, not an error
    code, out, err = _run(tmp_path, env)
    assert "WARN" in out and 'pool.backend is "file" while lock.backend is "redis"' in out
    assert redis_server.password not in out


@pytest.mark.parametrize(("proof", "network", "consent", "level", "said"), [
    (Proof("contained", port=9, reached=False, processes=4), False, False, "ok",
     "contained (bubblewrap): a probe check could not read a secret planted in the state "
     "folder, could not reach 127.0.0.1:9, and saw only its own 4 processes"),
    (Proof("contained", port=9, reached=True, processes=4), True, False, "ok",
     "reached 127.0.0.1:9 (project.check_network is on)"),
    (Proof("contained", port=9, reached=True), False, False, "error",
     "the check is not contained: a probe check reached 127.0.0.1:9"),
    (Proof("contained", secret_read=True, reached=False), False, False, "error",
     "a probe check read a secret planted in the state folder"),
    (Proof("refused", "bubblewrap refuses here: x"), False, False, "error",
     "no check can run: no sandbox works here: bubblewrap refuses here: x"),
    (Proof("refused", "bubblewrap refuses here: x"), False, True, "warn",
     "checks run uncontained (project.check_uncontained): bubblewrap refuses here: x"),
])
def test_the_sandbox_line_says_what_the_probe_check_found(
    proof: Proof, network: bool, consent: bool, level: str, said: str
) -> None:
    f = h.sandbox_finding(proof, network, consent)
    assert f.level == level and said in f.message
    assert f.level == "ok" or f.fix


@pytest.mark.parametrize("bwrap", [True, False])
def test_doctor_proves_the_checks_sandbox_by_a_probe_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bwrap: bool
) -> None:
    if bwrap and not WORKS:
        pytest.skip("no working bubblewrap here")
    if not bwrap:
        monkeypatch.setattr(contain, "BWRAP", "no-such-bwrap")
    home = tmp_path / "home"
    (tmp_path / "config.json").write_text(json.dumps({
        "project": {"name": "p", "repository": "/srv/origin.git", "check_command": "make test"},
        "instances": [{"name": "good", "url": "http://good:1", "roots": ["/srv/demo"]}],
    }), "utf-8")
    code, out, _ = _run(tmp_path, {"XAF_HUB_HOME": str(home), "XAF_HUB_PW_GOOD": SECRET}, "--json")
    [line] = [f for f in json.loads(out)["findings"] if f["subject"] == "sandbox"]
    if bwrap:
        assert code == ExitCode.OK and line["level"] == "ok", line
        assert "could not read a secret planted in the state folder" in line["message"]
    else:
        assert code == ExitCode.USAGE and line["level"] == "error"
        assert line["message"] == (
            "no check can run: no sandbox works here: "
            "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
        )
    assert list((home / "checks").iterdir()) == []  # the probe's folder is gone


@pytest.mark.parametrize(
    ("project", "area", "says"),
    [
        ({}, "verification", "finished, not verified"),
        ({"isolation": "worktree"}, "worktrees", "neither verify nor land"),
        ({"repository": "https://git.example/shop.git"}, None, ""),
    ],
)
def test_doctor_says_how_to_get_verification(
    tmp_path: Path, project: dict[str, Any], area: str | None, says: str
) -> None:
    doc = {"project": project, "instances": [{"name": "a", "url": "http://127.0.0.1:9"}]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), "utf-8")
    cfg = load_config(str(path), env={"XAF_HUB_HOME": str(tmp_path / "h")}, cwd=tmp_path)
    found = h.repository_findings(cfg)
    if area is None:
        assert found == []
        return
    [f] = found
    assert (f.area, f.subject, f.level) == (area, "project.repository", "warn")
    assert says in f.message and "Set project.repository" in f.fix and "init --root" in f.fix
