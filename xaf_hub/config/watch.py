"""The config of a process that runs on (the patrol daemon, ``serve``), read again when saved.

``ConfigWatch.poll`` is cheap enough to call every second. A config that does not load is not
used (``problem`` says why); ``RESTART_KEYS`` keep their old value until a restart and
``restart`` names those that changed (docs/architecture.md §8).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from xaf_hub.config.load import Config, hub_home, load_config
from xaf_hub.core.catalogue import text
from xaf_hub.errors import ConfigError

# Keys a running process keeps until it restarts: its stores are open on them.
RESTART_KEYS = (
    "state_dir", "lock.dir", "lock.backend", "lock.redis_url", "lock.redis_prefix",
    "pool.backend", "models.state_backend", "patrol.lease_seconds",
)

# What a poll found: no file changed; a new config in use; the same config; a config refused.
Polled = Literal["unchanged", "loaded", "same", "refused"]


def _value(cfg: Config, key: str) -> object:
    """The value of the dotted ``key`` in ``cfg``."""
    return functools.reduce(getattr, key.split("."), cfg)


def _put(obj: Any, key: str, value: object) -> Any:
    """``obj`` with the dotted ``key`` set to ``value`` (each frozen record on the way replaced)."""
    head, _, rest = key.partition(".")
    return replace(obj, **{head: _put(getattr(obj, head), rest, value) if rest else value})


def pinned(new: Config, old: Config) -> tuple[Config, tuple[str, ...]]:
    """``new`` with ``old``'s value of every restart key, and the keys that differed (pure)."""
    changed = tuple(k for k in RESTART_KEYS if _value(new, k) != _value(old, k))
    kept = new
    for key in (*RESTART_KEYS, "lock.redis_password"):  # the password goes with its URL
        kept = _put(kept, key, _value(old, key))
    return kept, changed


def _files(cfg: Config, env: Mapping[str, str]) -> tuple[Path, ...]:
    """Every file the config was (or would be) read from."""
    found: list[Path] = []
    if cfg.path is not None:
        found += [cfg.path, cfg.path.parent / "config.local.json"]
    found.append(hub_home(env) / "config.local.json")
    found += [Path(i.password_source.removeprefix("file:")) for i in cfg.instances
              if i.password_source.startswith("file:")]
    return tuple(dict.fromkeys(found))


def _stamp(path: Path) -> object:
    """What tells a file's change: its inode, mtime and size (None: it cannot be read)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


@dataclass(frozen=True)
class ConfigState:
    """How a running process stands with its config file: what a page and `status` show."""

    loaded_at_ms: int  # when the config in use was loaded
    problem: str = ""  # why the saved config is not in use ("" : it is)
    restart: tuple[str, ...] = ()  # keys whose saved value waits for a restart

    def to_json(self) -> dict[str, object]:
        """Its form on the live board."""
        return {"loaded_at_ms": self.loaded_at_ms, "problem": self.problem,
                "restart": list(self.restart)}

    def words(self, who: str, lang: str = "en") -> list[str]:
        """One sentence per thing a person should know about ``who`` ([] when all is well), in
        ``lang``."""
        out = []
        if self.problem:
            loaded = time.strftime("%H:%M:%S", time.localtime(self.loaded_at_ms / 1000))
            out.append(text(lang, "config.kept", who=who, loaded=loaded, problem=self.problem))
        if self.restart:
            out.append(text(lang, "config.restart", who=who, keys=", ".join(self.restart)))
        return out

    @classmethod
    def from_json(cls, doc: object) -> ConfigState | None:
        """Its form on the live board or a heartbeat read back; None when not one."""
        if not isinstance(doc, dict):
            return None
        loaded, problem, restart = doc.get("loaded_at_ms"), doc.get("problem"), doc.get("restart")
        if (type(loaded) is not int or not isinstance(problem, str)
                or not isinstance(restart, list)):
            return None
        return cls(loaded, problem, tuple(str(k) for k in restart))


def _again(cfg: Config, env: Mapping[str, str]) -> Config:
    """``cfg``'s file loaded again, seen as the project ``cfg`` was."""
    new = load_config(str(cfg.path), env=env)
    if not cfg.chosen or (new.chosen and new.project_name == cfg.project_name):
        return new
    if cfg.project_name not in {p.name for p in new.projects}:
        raise ConfigError(f"{cfg.path}: project {cfg.project_name!r} is no longer configured")
    return new.choose(cfg.project_name)


class ConfigWatch:
    """The config in use by a long-running process, and the files it came from."""

    def __init__(
        self, cfg: Config, env: Mapping[str, str],
        load: Callable[[], Config] | None = None,
    ) -> None:
        self.started = cfg  # what the stores were opened with
        self.cfg = cfg
        self.env = dict(env)
        self._load = load or (lambda: _again(cfg, self.env))
        self._files = _files(cfg, self.env)
        self._stamp = tuple(map(_stamp, self._files))
        self.state = ConfigState(int(time.time() * 1000))

    def poll(self) -> Polled:
        """Load the config again if one of its files changed, and say how that went."""
        stamp = tuple(map(_stamp, self._files))
        if stamp == self._stamp:
            return "unchanged"
        self._stamp = stamp  # a change while it loads shows at the next poll
        try:
            new = self._load()
        except ConfigError as exc:
            self.state = replace(self.state, problem=str(exc))
            return "refused"
        kept, restart = pinned(new, self.started)
        changed = kept != self.cfg
        self.cfg = kept
        files = _files(kept, self.env)
        if files != self._files:
            self._files, self._stamp = files, tuple(map(_stamp, files))
        loaded = int(time.time() * 1000) if changed else self.state.loaded_at_ms
        self.state = ConfigState(loaded, "", restart)
        return "loaded" if changed else "same"

    def look(
        self, who: str, reconfigure: Callable[[Config], None], say: Callable[[str], None]
    ) -> bool:
        """``poll``; a new config goes to ``reconfigure``; ``say`` gets each line a person
        should read about ``who``'s config. Whether a file changed."""
        polled = self.poll()
        if polled == "loaded":
            reconfigure(self.cfg)
            say(f"config: read again ({len(self.cfg.instances)} instance(s))")
        for line in self.state.words(who) if polled != "unchanged" else ():
            say(f"config: {line}")
        return polled != "unchanged"


__all__ = ["RESTART_KEYS", "ConfigState", "ConfigWatch", "Polled", "pinned"]
