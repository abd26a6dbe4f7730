"""A running process's config read again when saved (config/watch.py): what it notices, what
it keeps on a bad save, what waits for a restart, and what of the environment it can see."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from xaf_hub.config.load import load_config
from xaf_hub.config.watch import ConfigState, ConfigWatch


def _save(path: Path, doc: Any) -> None:
    """Save as an editor does; the clock step makes a same-size save within one tick of the
    file system's clock visible too (a person does not save twice in a millisecond)."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), "utf-8")
    os.utime(path, ns=(before + 10_000_000, before + 10_000_000))


def _doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "project": {"name": "demo"},
        "instances": [{"name": "a", "url": "http://127.0.0.1:4096", "roots": ["/srv/demo"]}],
    }
    doc.update(changes)
    return doc


def _watch(tmp_path: Path, doc: dict[str, Any], **env: str) -> ConfigWatch:
    env = {"XAF_HUB_HOME": str(tmp_path / "home"), **env}
    _save(tmp_path / "config.json", doc)
    return ConfigWatch(load_config(str(tmp_path / "config.json"), env=env), env)


def test_a_saved_config_is_used_and_an_unsaved_one_costs_a_stat(tmp_path: Path) -> None:
    w = _watch(tmp_path, _doc())
    first = w.cfg
    assert w.poll() == "unchanged" and w.cfg is first
    doc = _doc()
    doc["instances"] = [{"name": "renamed", "url": "http://127.0.0.1:4096",
                         "roots": ["/srv/demo", "/srv/new-folder"], "concurrency_limit": 5}]
    _save(tmp_path / "config.json", doc)
    assert w.poll() == "loaded"
    (inst,) = w.cfg.instances
    assert (inst.name, inst.roots, inst.concurrency_limit) == (
        "renamed", ("/srv/demo", "/srv/new-folder"), 5)
    assert inst.rules.is_project("/srv/new-folder/app")
    assert w.poll() == "unchanged"
    _save(tmp_path / "config.json", json.dumps(doc, indent=4))  # saved, nothing new in it
    assert w.poll() == "same" and w.state == ConfigState(w.state.loaded_at_ms)


def test_a_bad_save_keeps_the_config_in_use_until_a_good_one(tmp_path: Path) -> None:
    w = _watch(tmp_path, _doc())
    kept = w.cfg
    _save(tmp_path / "config.json", '{"instances": [')
    assert w.poll() == "refused"
    assert w.cfg is kept
    assert "config.json: invalid JSON at line 1" in w.state.problem
    (line,) = w.state.words("the patrol daemon")
    assert line.startswith("the patrol daemon keeps the config it loaded at ")
    assert w.poll() == "unchanged" and w.state.problem  # still said until fixed
    _save(tmp_path / "config.json", _doc(concurrency_limit=7, instances=[]))
    assert w.poll() == "loaded"  # a valid save is used
    assert w.cfg.concurrency_limit == 7 and w.state.problem == ""
    assert w.state.words("serve") == []


def test_a_look_hands_a_new_config_on_and_says_what_a_person_should_read(
    tmp_path: Path,
) -> None:
    w = _watch(tmp_path, _doc())
    used: list[object] = []
    said: list[str] = []
    assert not w.look("serve", used.append, said.append) and (used, said) == ([], [])
    _save(tmp_path / "config.json", _doc(concurrency_limit=7))
    assert w.look("serve", used.append, said.append)
    assert used == [w.cfg] and said == ["config: read again (1 instance(s))"]
    _save(tmp_path / "config.json", "{")
    assert w.look("serve", used.append, said.append) and len(used) == 1
    assert said[1].startswith("config: serve keeps the config it loaded at ")


def test_the_stores_keep_their_backends_until_a_restart(tmp_path: Path) -> None:
    w = _watch(tmp_path, _doc())
    moved = _doc(state_dir=str(tmp_path / "elsewhere"), concurrency_limit=4,
                 lock={"backend": "redis", "redis_url": "redis://127.0.0.1:6379/0"},
                 pool={"backend": "redis"})
    _save(tmp_path / "config.json", moved)
    assert w.poll() == "loaded"  # the limit is used now ...
    assert w.cfg.concurrency_limit == 4
    # ... the stores are not moved under a running process: it says what waits for a restart.
    assert (w.cfg.state_dir, w.cfg.lock.backend, w.cfg.pool.backend, w.cfg.lock.redis_url) == (
        tmp_path / "home", "file", "file", "")
    assert w.state.restart == ("state_dir", "lock.backend", "lock.redis_url", "pool.backend")
    (line,) = w.state.words("serve")
    assert line == ("serve needs a restart to use the new state_dir, lock.backend, "
                    "lock.redis_url, pool.backend (until then it keeps the old value)")
    _save(tmp_path / "config.json", _doc())
    assert w.poll() == "loaded" and w.state.restart == ()


def test_passwords_from_files_are_read_again_but_the_environment_is_the_process_own(
    tmp_path: Path,
) -> None:
    w = _watch(tmp_path, _doc(), XAF_HUB_PW_OTHER="from-the-env")
    assert w.cfg.instances[0].password is None
    # config.local.json made after the start is seen ...
    _save(tmp_path / "config.local.json", {"instances": [{"name": "a", "password": "pw-one"}]})
    assert w.poll() == "loaded" and w.cfg.instances[0].password == "pw-one"
    _save(tmp_path / "config.local.json", {"instances": []})
    assert w.poll() == "loaded" and w.cfg.instances[0].password is None
    # ... and so is a password file, and a change of the file's content.
    secret = tmp_path / "pw.json"
    _save(secret, {"password": "pw-file-1"})
    doc = _doc()
    doc["instances"][0]["password_file"] = str(secret)
    _save(tmp_path / "config.json", doc)
    assert w.poll() == "loaded" and w.cfg.instances[0].password == "pw-file-1"
    _save(secret, {"password": "pw-file-2"})
    assert w.poll() == "loaded" and w.cfg.instances[0].password == "pw-file-2"
    # A variable: the process's own environment, as it was at its start. Naming one it has
    # is seen; one exported in another shell since is not (this process has no such value).
    doc["instances"][0]["password_env"] = "XAF_HUB_PW_OTHER"
    _save(tmp_path / "config.json", doc)
    assert w.poll() == "loaded" and w.cfg.instances[0].password == "from-the-env"
    os.environ["XAF_HUB_PW_LATER"] = "exported-later"
    try:
        doc["instances"][0]["password_env"] = "XAF_HUB_PW_LATER"
        doc["instances"][0].pop("password_file")
        _save(tmp_path / "config.json", doc)
        assert w.poll() == "loaded" and w.cfg.instances[0].password is None
    finally:
        del os.environ["XAF_HUB_PW_LATER"]
    assert "pw-one" not in repr(w.cfg) and "pw-file" not in repr(w.cfg)


@pytest.mark.parametrize("doc", [{"config": 1}, {"config": {"loaded_at_ms": "x"}}, {}])
def test_a_state_read_back_that_is_not_one_is_none(doc: dict[str, Any]) -> None:
    assert ConfigState.from_json(doc.get("config")) is None


def test_a_state_read_back_is_the_state_written() -> None:
    state = ConfigState(1_800_000_000_000, "config.json: bad", ("pool.backend",))
    assert ConfigState.from_json(state.to_json()) == state
