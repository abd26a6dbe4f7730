"""Each config key is declared once: its name, type, default and check (architecture §11).

The messages below are the loader's exact words for a wrong type, an unknown key, a number
out of range and a failed check, section by section: declaring the keys once must not change
a word of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from xaf_hub.config.load import parse_config
from xaf_hub.errors import ConfigError

INSTANCE = {"name": "lan-a", "url": "http://127.0.0.1:4096"}


def _with_instance(doc: dict[str, Any], **instance: Any) -> dict[str, Any]:
    return {**doc, "instances": [{**INSTANCE, **instance}]}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        # the top level and its timeouts
        (
            {"concurrency_limit": True},
            "key 'concurrency_limit': expected a whole number, got a boolean",
        ),
        ({"retries": 1.5}, "key 'retries': expected a whole number, got a number"),
        ({"page_size": 0}, "key 'page_size': must be at least 1, got 0"),
        ({"scan_workers": "3"}, "key 'scan_workers': expected a whole number, got a string"),
        ({"session_ttl_days": -1}, "key 'session_ttl_days': must be at least 0, got -1"),
        ({"match_margin": -0.1}, "key 'match_margin': must be at least 0, got -0.1"),
        ({"steer_threshold": "x"}, "key 'steer_threshold': expected a number, got a string"),
        ({"auto_match": 1}, "key 'auto_match': expected a boolean, got a number"),
        (
            {"timeouts": {"scan_seconds": 0.05}},
            "key 'timeouts.scan_seconds': must be at least 0.1, got 0.05",
        ),
        (
            {"timeouts": {"conect_seconds": 1}},
            "key 'timeouts.conect_seconds': unknown key (did you mean 'connect_seconds'?)",
        ),
        ({"project": {"nam": "x"}}, "key 'project.nam': unknown key (did you mean 'name'?)"),
        (
            {"project": {"fallback_segments": [1]}},
            "key 'project.fallback_segments[0]': expected a string, got a number",
        ),
        # lock
        (
            {"lock": {"slot_ttl_seconds": 0.5}},
            "key 'lock.slot_ttl_seconds': must be at least 1, got 0.5",
        ),
        (
            {"lock": {"slot_grace_seconds": "x"}},
            "key 'lock.slot_grace_seconds': expected a number, got a string",
        ),
        ({"lock": {"dir": 3}}, "key 'lock.dir': expected a string, got a number"),
        ({"lock": {"backend": "sql"}}, "key 'lock.backend': must be 'file' or 'redis', got 'sql'"),
        (
            {"lock": {"backend": "redis"}},
            "key 'lock.redis_url': required when lock.backend is 'redis' (redis://HOST:6379/0)",
        ),
        (
            {"lock": {"redis_url": "redis://h/0", "redis_prefix": "a b"}},
            "key 'lock.redis_prefix': use letters, digits and _ . : - only, got 'a b'",
        ),
        (
            {"lock": {"slot_ttl": 3}},
            "key 'lock.slot_ttl': unknown key (did you mean 'slot_ttl_seconds'?)",
        ),
        # models
        (
            {"models": {"default_dispatch_model": "x"}},
            "key 'models.default_dispatch_model': expected 'provider/model', got 'x'",
        ),
        (
            {"models": {"chain": ["a/b", "bad"]}},
            "key 'models.chain[1]': expected 'provider/model', got 'bad'",
        ),
        (
            {"models": {"blackout_reset_hour": 24}},
            "key 'models.blackout_reset_hour': must be 0..23, got 24",
        ),
        (
            {"models": {"blackout_reset_hour": -1}},
            "key 'models.blackout_reset_hour': must be at least 0, got -1",
        ),
        ({"models": {"timezone": "Mars/X"}}, "key 'models.timezone': unknown time zone 'Mars/X'"),
        (
            {"models": {"max_rest_hours": 0}},
            "key 'models.max_rest_hours': must be at least 0.01, got 0",
        ),
        (
            {"models": {"max_rest_hours": 1e400}},
            "key 'models.max_rest_hours': must be 0.01..8760, got inf",
        ),
        (
            {"models": {"max_rest_hours": float("nan")}},
            "key 'models.max_rest_hours': must be at least 0.01, got nan",
        ),
        (
            {"models": {"rest_scope": "all"}},
            "key 'models.rest_scope': must be 'family' or 'model', got 'all'",
        ),
        (
            {"models": {"state_backend": "redis"}},
            "key 'models.state_backend': 'redis' needs lock.redis_url "
            "(e.g. redis://hub-redis.example.internal:6379/0)",
        ),
        ({"models": {"chian": []}}, "key 'models.chian': unknown key (did you mean 'chain'?)"),
        # pool and budget
        ({"pool": {"backend": "sql"}}, "key 'pool.backend': must be file or redis, got 'sql'"),
        ({"pool": {"backend": 3}}, "key 'pool.backend': expected a string, got a number"),
        ({"pool": {"backed": "redis"}}, "key 'pool.backed': unknown key (did you mean 'backend'?)"),
        (
            {"budget": {"run_usd": -2}},
            "key 'budget.run_usd': must be an amount of US dollars, at least 0, got -2",
        ),
        (
            {"budget": {"daily_usd": True}},
            "key 'budget.daily_usd': expected a number, got a boolean",
        ),
        # patrol
        (
            {"patrol": {"interval_minutes": 0}},
            "key 'patrol.interval_minutes': must be at least 0.01, got 0",
        ),
        ({"patrol": {"minute_offset": 60}}, "key 'patrol.minute_offset': must be 0..59, got 60"),
        (
            {"patrol": {"minute_offset": -1}},
            "key 'patrol.minute_offset': must be at least 0, got -1",
        ),
        ({"patrol": {"repo_root": 3}}, "key 'patrol.repo_root': expected a string, got a number"),
        (
            {"patrol": {"design_dirs": "x"}},
            "key 'patrol.design_dirs': expected a list, got a string",
        ),
        (
            {"patrol": {"batch_patterns": ["("]}},
            "key 'patrol.batch_patterns[0]': invalid regular expression: "
            "missing ), unterminated subpattern at position 0",
        ),
        (
            {"patrol": {"base_branch": "origin/"}},
            "key 'patrol.base_branch': must name the integration branch, got 'origin/'",
        ),
        ({"patrol": {"max_attempts": 0}}, "key 'patrol.max_attempts': must be at least 1, got 0"),
        (
            {"patrol": {"lease_seconds": -1}},
            "key 'patrol.lease_seconds': must be at least 0, got -1",
        ),
        (
            {"patrol": {"intervl_minutes": 3}},
            "key 'patrol.intervl_minutes': unknown key (did you mean 'interval_minutes'?)",
        ),
    ],
)
def test_a_section_s_errors_keep_their_words(
    tmp_path: Path, doc: dict[str, Any], message: str
) -> None:
    path = tmp_path / "config.json"
    with pytest.raises(ConfigError) as err:
        parse_config(_with_instance(doc), path=path, env={})
    assert str(err.value) == f"{path}: {message}"


def test_an_exclusion_spelt_with_dot_segments_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    doc = _with_instance({"project": {"name": "p", "exclude_dirs": ["/srv/a/./vendor"]}})
    with pytest.raises(ConfigError, match="exclude_dirs\\[0\\]': must not hold '.' or '..'"):
        parse_config(doc, path=path, env={})
    names = {"roots": ["/srv/.hidden/..x", "/srv/..."], "default_directory": "/srv/.hidden"}
    assert parse_config(_with_instance({}, **names), path=path, env={})  # names, not steps


@pytest.mark.parametrize(
    ("instance", "message"),
    [
        ({"username": 3}, "username': expected a string, got a number"),
        ({"roots": ["rel"]}, "roots[0]': must be an absolute path, got 'rel'"),
        ({"default_directory": "rel"}, "default_directory': must be an absolute path, got 'rel'"),
        (
            {"roots": ["/srv/a", "/srv/a/../b"]},
            "roots[1]': must not hold '.' or '..' segments, got '/srv/a/../b': write the folder",
        ),
        (
            {"default_directory": "C:\\a\\.\\b"},
            "default_directory': must not hold '.' or '..' segments, got 'C:\\\\a\\\\.\\\\b': "
            "write the folder",
        ),
        (
            {"dir_aliases": {"/x/..": "/srv"}},
            "dir_aliases': must not hold '.' or '..' segments, got '/x/..': write the folder",
        ),
        (
            {"dir_aliases": {"/x": "/srv/../etc"}},
            "dir_aliases./x': must not hold '.' or '..' segments, got '/srv/../etc': write the "
            "folder",
        ),
        ({"branch_policy": "x"}, "branch_policy': must be 'branch' or 'mainline', got 'x'"),
        ({"models": ["bad"]}, "models[0]': expected 'provider/model', got 'bad'"),
        ({"api": 3}, "api': expected a string, got a number"),
        ({"concurrency_limit": 0}, "concurrency_limit': must be at least 1, got 0"),
        ({"readonly_default": 1}, "readonly_default': expected a boolean, got a number"),
        (
            {"budget_run_usd": -1},
            "budget_run_usd': must be an amount of US dollars, at least 0, got -1",
        ),
        ({"rootz": []}, "rootz': unknown key (did you mean 'roots'?)"),
    ],
)
def test_an_instance_s_errors_keep_their_words(
    tmp_path: Path, instance: dict[str, Any], message: str
) -> None:
    path = tmp_path / "config.json"
    with pytest.raises(ConfigError) as err:
        parse_config(_with_instance({}, **instance), path=path, env={})
    assert str(err.value) == f"{path}: key 'instances[0].{message}"


def test_numbers_read_as_their_declared_type(tmp_path: Path) -> None:
    """A whole number in the file is a float where the key is a float, and stays an int."""
    doc = {
        "lock": {"slot_ttl_seconds": 90},
        "patrol": {"stale_minutes": 30, "max_attempts": 2},
        "budget": {"daily_usd": 2},
        "timeouts": {"read_seconds": 10},
    }
    cfg = parse_config(_with_instance(doc), path=tmp_path / "config.json", env={})
    assert repr(cfg.lock.slot_ttl_seconds) == "90.0" and repr(cfg.patrol.stale_minutes) == "30.0"
    assert repr(cfg.patrol.max_attempts) == "2" and repr(cfg.budget.daily_usd) == "2.0"
    assert (cfg.read_timeout, cfg.scan_timeout) == (10.0, 15.0)  # scan: read + 5 unless given


def test_a_declared_default_is_what_an_empty_section_reads(tmp_path: Path) -> None:
    """Each default is written once, in its field: reading an empty section gives it back."""
    from dataclasses import fields, is_dataclass

    from xaf_hub.config import load

    cfg = parse_config(_with_instance({}), path=tmp_path / "config.json", env={})
    read: list[tuple[type, Any]] = [
        (load.Config, cfg),
        (load.RepositoryConfig, cfg.repository),
        (load.ProjectConfig, cfg.projects[0]),
        (load.MatchRule, cfg.match),
        (load.LockConfig, cfg.lock),
        (load.ModelsConfig, cfg.models),
        (load.PoolConfig, cfg.pool),
        (load.BudgetConfig, cfg.budget),
        (load.PatrolConfig, cfg.patrol),
        (load.PermissionsConfig, cfg.permissions),
        (load.InstanceConfig, cfg.instances[0]),
        (load.NotifyConfig, cfg.notify),
    ]
    # Worked out at load time: one scan worker per instance (here one).
    at_load = {(load.Config, "scan_workers"): 1}
    for cls, section in read:
        for f in fields(cls):
            if "setting" in f.metadata:
                want = at_load.get((cls, f.name), f.default)
                assert getattr(section, f.name) == want, f"{cls.__name__}.{f.name}"
    declaring = {
        cls
        for cls in vars(load).values()
        if isinstance(cls, type)
        and is_dataclass(cls)
        and any("setting" in f.metadata for f in fields(cls))
    }
    assert declaring == {cls for cls, _ in read}


def test_setting_reads_each_declared_type() -> None:
    from dataclasses import dataclass

    from xaf_hub.config.reader import Reader, read_section, setting

    def loud(r: Reader, name: str, value: str) -> str:
        if value == "quiet":
            raise r.fail(name, "must not be quiet")
        return value.upper()

    @dataclass(frozen=True)
    class Toy:
        count: int = setting(3, minimum=1, maximum=9)
        ratio: float = setting(0.5, key="share")
        on: bool = setting(True)
        words: tuple[str, ...] = setting(("a",))
        mode: str = setting("x", choices=("x", "y"), check=loud)
        cap: float | None = setting(None)
        fixed: str = "not read"

    def read(data: dict[str, Any]) -> Toy:
        r = Reader(data, "toy.json", "toy")
        toy = read_section(Toy, r)
        r.finish()
        return toy

    assert read({}) == Toy()
    got = read({"count": 9, "share": 1, "on": False, "words": [], "mode": "y", "cap": 2})
    assert got == Toy(9, 1.0, False, (), "Y", 2) and isinstance(got.ratio, float)
    for data, message in (
        ({"count": 10}, "key 'toy.count': must be 1..9, got 10"),
        ({"count": 0}, "key 'toy.count': must be at least 1, got 0"),
        ({"share": "1"}, "key 'toy.share': expected a number, got a string"),
        ({"mode": "z"}, "key 'toy.mode': must be 'x' or 'y', got 'z'"),
        ({"mode": "quiet"}, "key 'toy.mode': must be 'x' or 'y', got 'quiet'"),
        ({"shares": 1}, "key 'toy.shares': unknown key (did you mean 'share'?)"),
        ({"fixed": "x"}, "key 'toy.fixed': unknown key"),
    ):
        with pytest.raises(ConfigError) as err:
            read(data)
        assert str(err.value) == f"toy.json: {message}"
