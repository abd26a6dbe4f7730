"""Model policy: blackout families and the reset clock, the ``ModelState`` store
(``mark_blackout`` its one writer of blackouts, ``remember_healed`` the memory behind "never
heal twice") and model resolution (docs/architecture.md §7).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any, TypeVar

from xaf_hub.core.clock import next_reset, to_ms
from xaf_hub.errors import StateFileError
from xaf_hub.store.statefile import read_json, update_json

__all__ = [
    "DEFAULT_BLACKOUT_FAMILIES",
    "REST_SCOPES",
    "REST_WHYS",
    "WHY_WORDS",
    "HEALED_RETENTION",
    "HEAL_PREFIX",
    "MODEL_STATE_FILE",
    "SCHEMA_VERSION",
    "Blackout",
    "Healed",
    "HealedSession",
    "ModelState",
    "family_of",
    "next_model_in_chain",
    "resolve_dispatch_model",
]

_T = TypeVar("_T")


SCHEMA_VERSION = 1
MODEL_STATE_FILE = ".model_state.json"
HEALED_RETENTION = timedelta(days=14)
HEAL_PREFIX = "heal:"  # healed-memory keys of heals (resumes have their own)
DEFAULT_BLACKOUT_FAMILIES: Mapping[str, Sequence[str]] = {"opencode": ("opencode/", "opencode-go/")}

_WHAT = "model state"

# ---------------------------------------------------------------------------------------------
# Families, time zones and the reset clock


def family_of(model: str, families: Mapping[str, Sequence[str]]) -> str | None:
    """Return the blackout family whose provider prefix the model starts with, or None."""
    wanted = model.strip().casefold()
    best: tuple[int, str] | None = None
    for family, prefixes in families.items():
        for prefix in prefixes:
            p = prefix.casefold()
            # Longest prefix wins, so "opencode-go/" can form its own family next to "opencode".
            if p and wanted.startswith(p) and (best is None or len(p) > best[0]):
                best = (len(p), family)
    return best[1] if best else None


# ---------------------------------------------------------------------------------------------
# Store


REST_SCOPES = ("family", "model")
# Why a rest ends when it does: the provider stated the time, the daily reset hour (nothing
# stated), or a person set it (``xaf-hub models rest``).
REST_WHYS = ("stated", "reset_hour", "person")
WHY_WORDS = {
    "stated": "stated by the server",
    "reset_hour": "reset hour",
    "person": "set by a person",
}


@dataclass(frozen=True)
class Blackout:
    """One rest: a family (or, with ``scope`` "model", one model) unusable until ``until_ms``.

    ``family`` names what rests: the family, or the model id for a model's own rest.
    """

    family: str
    until_ms: int
    reason: str
    source: str
    marked_at_ms: int
    scope: str = "family"
    why: str = "reset_hour"


_REST_KEYS = ("until_ms", "reason", "source", "marked_at_ms", "scope", "why")


def _blackout(target: str, entry: Mapping[str, Any]) -> Blackout:
    """A stored rest as a record (one written before ``scope`` and ``why``: their defaults)."""
    return Blackout(target, **{k: entry[k] for k in _REST_KEYS if k in entry})


def default_state() -> dict[str, Any]:
    """The document of a store nothing was written to yet."""
    return {"schema_version": SCHEMA_VERSION, "blackouts": {}, "healed": {}}


_ABSENT = object()  # a key an entry does not hold
_MS = (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer (ms since epoch)")
_TEXT = (lambda v: isinstance(v, str), "a string")
_TEXT_OR_NULL = (lambda v: v in (None, _ABSENT) or isinstance(v, str), "a string or null")


def _absent_or(allowed: tuple[str, ...]) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v is _ABSENT or v in allowed), f"one of {', '.join(allowed)}"


# What each entry of the document's two sections must hold: key -> (test, words for the error).
# A rest's scope and why are written since rests may follow the provider's word (absent: a
# family, the reset hour).
_ENTRY_CHECKS: dict[str, dict[str, tuple[Callable[[Any], bool], str]]] = {
    "blackouts": {
        "until_ms": _MS, "marked_at_ms": _MS, "reason": _TEXT, "source": _TEXT,
        "scope": _absent_or(REST_SCOPES), "why": _absent_or(REST_WHYS),
    },
    "healed": {"at_ms": _MS, "from_model": _TEXT_OR_NULL, "to_model": _TEXT_OR_NULL},
}


class ModelState(abc.ABC):
    """Blackouts per family and the healed-failure memory: the interface and its rules.

    The rules (one writer of blackouts, rests, the healed memory) work on one checked
    document; where it is kept is the store's: ``FileModelState`` (``.model_state.json``) or
    ``store.redis.model_state.RedisModelState`` (one Redis for every host), which reads and
    writes it (``_read``, ``_update``) and says where it is in errors (``name``).
    """

    #: What an error about a damaged document names: the store and where it keeps it.
    name: str

    def __init__(
        self,
        reset_hour: int,
        tz: tzinfo,
        families: Mapping[str, Sequence[str]],
        lock_timeout: float = 20,
    ) -> None:
        if not 0 <= reset_hour <= 23:
            raise ValueError(f"reset_hour must be 0..23, got {reset_hour}")
        self.reset_hour = reset_hour
        self.tz = tz
        self.families = families
        self.lock_timeout = lock_timeout

    # -- the store's part -----------------------------------------------------------------

    @abc.abstractmethod
    def _read(self) -> dict[str, Any]:
        """The checked document (the empty one when there is none)."""

    @abc.abstractmethod
    def _update(self, mutate: Callable[[dict[str, Any]], _T]) -> _T:
        """Apply ``mutate`` to the checked document and store it, as one step against every
        other writer; ``mutate``'s result."""

    # -- reading and checking ------------------------------------------------------------

    def _bad(self, where: str, problem: str) -> StateFileError:
        """The error for a damaged document, naming where it is kept."""
        return StateFileError(f"{self.name}: {where}: {problem}")

    def _check(self, data: Any) -> dict[str, Any]:
        """Validate the whole document; anything unexpected is an error, never a reset."""
        if not isinstance(data, dict):
            raise self._bad("top level", f"expected an object, found {type(data).__name__}")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise self._bad(
                "schema_version",
                f"expected {SCHEMA_VERSION}, found {version!r} "
                "(written by another xaf-hub version?)",
            )
        for section, checks in _ENTRY_CHECKS.items():
            entries = data.setdefault(section, {})
            if not isinstance(entries, dict):
                raise self._bad(section, "expected an object")
            for name, entry in entries.items():
                if not isinstance(entry, dict):
                    raise self._bad(f"{section}.{name}", "expected an object")
                for key, (ok, words) in checks.items():
                    if not ok(entry.get(key, _ABSENT)):
                        raise self._bad(f"{section}.{name}.{key}", f"expected {words}")
        return data

    # -- blackouts ------------------------------------------------------------------------

    def mark_blackout(self, family: str, reason: str, source: str, now: datetime) -> int:
        """Black out ``family`` until the next reset hour (nothing stated a time)."""
        until_ms = to_ms(next_reset(now, self.reset_hour, self.tz))
        return self.mark_rest(
            family,
            scope="family",
            until_ms=until_ms,
            why="reset_hour",
            reason=reason,
            source=source,
            now=now,
        )

    def mark_rest(
        self, target: str, *,
        scope: str, until_ms: int, why: str, reason: str, source: str, now: datetime,
    ) -> int:
        """Rest a family or a model until ``until_ms``; the one writer of rests.

        Returns the rest's end after the write. A repeat inside a rest keeps the end it has,
        except: a person's rest (``why`` "person") is set exactly; a provider's stated end
        later than the current one pushes it out (the provider knows), and so does a limit
        that stated nothing over a stated rest (it rests to the reset hour); a reset-hour
        repeat may pull a later reset-hour end back to this reset (the hour changed).
        """
        if scope == "family" and target not in self.families:
            raise ValueError(f"unknown blackout family {target!r}")
        if scope not in REST_SCOPES or why not in REST_WHYS:
            raise ValueError(f"bad rest scope {scope!r} or why {why!r}")
        now_ms = to_ms(now)

        def mutate(data: dict[str, Any]) -> int:
            current = data["blackouts"].get(target)
            if current is not None and current["until_ms"] > now_ms and why != "person":
                held = current.get("why", "reset_hour")
                later = until_ms > current["until_ms"]
                if later and (why == "stated" or held == "stated"):
                    current.update(until_ms=until_ms, why=why, reason=reason, source=source)
                elif why == "reset_hour" and held == "reset_hour":
                    current["until_ms"] = min(current["until_ms"], until_ms)
                return int(current["until_ms"])
            rest = (until_ms, reason, source, now_ms, scope, why)
            data["blackouts"][target] = dict(zip(_REST_KEYS, rest, strict=True))
            return until_ms

        return self._update(mutate)

    def end_rests(self, targets: Iterable[str], now: datetime) -> list[Blackout]:
        """End the rests of ``targets`` (families or models); return those that were in force."""
        wanted = set(targets)
        now_ms = to_ms(now)

        def mutate(data: dict[str, Any]) -> list[Blackout]:
            ended = [
                _blackout(target, entry)
                for target, entry in data["blackouts"].items()
                if target in wanted and entry["until_ms"] > now_ms
            ]
            for target in wanted:
                data["blackouts"].pop(target, None)
            return ended

        return self._update(mutate)

    def active_blackouts(self, now: datetime) -> dict[str, Blackout]:
        """Return the rests still in force at ``now``, by family (or model, for its own)."""
        now_ms = to_ms(now)
        return {
            target: _blackout(target, entry)
            for target, entry in self._read()["blackouts"].items()
            if entry["until_ms"] > now_ms
        }

    def blacked_out_families(self, now: datetime) -> set[str]:
        """Return the families blacked out at ``now`` (expired entries are ignored)."""
        return {t for t, b in self.active_blackouts(now).items() if b.scope == "family"}

    def resting(self, now: datetime) -> set[str]:
        """Everything that rests at ``now``: families and models (what resolution skips)."""
        return set(self.active_blackouts(now))

    # -- healed-failure memory ------------------------------------------------------------

    def was_healed(self, key: str) -> bool:
        """Return whether the failure identified by ``key`` was already healed."""
        return key in self._read()["healed"]

    def remember_healed(
        self,
        key: str,
        from_model: str | None,
        to_model: str | None,
        now: datetime,
        *,
        who: HealedSession | None = None,
    ) -> None:
        """Record that ``key`` was healed; forget entries older than 14 days while writing.

        ``who`` (instance, session, title) lets the notifications re-derive the ``healed``
        notice from this store when the process died before queueing it.
        """
        now_ms = to_ms(now)
        horizon_ms = to_ms(now - HEALED_RETENTION)
        entry = healed_entry(now_ms, from_model, to_model, who)

        def mutate(data: dict[str, Any]) -> None:
            healed: dict[str, Any] = data["healed"]
            for old in [k for k, v in healed.items() if v["at_ms"] < horizon_ms]:
                del healed[old]
            healed[key] = entry

        self._update(mutate)

    def healed_since(self, since: datetime) -> list[Healed]:
        """The heals (not resumes) recorded at or after ``since``, oldest first."""
        return healed_list(self._read()["healed"].items(), to_ms(since))


class FileModelState(ModelState):
    """The model state in ``.model_state.json`` on this host."""

    def __init__(
        self,
        path: Path,
        reset_hour: int,
        tz: tzinfo,
        families: Mapping[str, Sequence[str]],
        lock_timeout: float = 20,
    ) -> None:
        super().__init__(reset_hour, tz, families, lock_timeout)
        self.path = path
        self.name = f"{_WHAT} {path}"

    def _read(self) -> dict[str, Any]:
        # No lock needed: writers replace the file in one step, so a reader sees old or new.
        return self._check(read_json(self.path, what=_WHAT, missing=default_state))

    def _update(self, mutate: Callable[[dict[str, Any]], _T]) -> _T:
        def checked(data: Any) -> _T:
            return mutate(self._check(data))

        return update_json(
            self.path, checked, default=default_state, what=_WHAT, timeout=self.lock_timeout
        )


# ---------------------------------------------------------------------------------------------
# Resolution


@dataclass(frozen=True)
class HealedSession:
    """Which session a heal was for (what a notice about it names)."""

    instance: str
    session: str
    title: str = ""


@dataclass(frozen=True)
class Healed:
    """One heal as the store remembers it."""

    key: str
    at_ms: int
    from_model: str
    to_model: str
    who: HealedSession


def healed_entry(
    at_ms: int, from_model: str | None, to_model: str | None, who: HealedSession | None
) -> dict[str, Any]:
    """The stored form of one heal (both backends)."""
    entry: dict[str, Any] = {"at_ms": at_ms, "from_model": from_model, "to_model": to_model}
    if who is not None:
        entry.update(instance=who.instance, session=who.session, title=who.title[:200])
    return entry


def healed_list(items: Iterable[tuple[str, Any]], since_ms: int) -> list[Healed]:
    """The heals among stored entries at or after ``since_ms`` that name their session."""
    out = []
    for key, entry in items:
        if not (key.startswith(HEAL_PREFIX) and isinstance(entry, Mapping)):
            continue
        at_ms, instance, session = entry.get("at_ms"), entry.get("instance"), entry.get("session")
        if not (isinstance(at_ms, int) and isinstance(instance, str) and isinstance(session, str)):
            continue  # written before heals named their session
        if at_ms < since_ms:
            continue
        who = HealedSession(instance, session, str(entry.get("title") or ""))
        from_model, to_model = (str(entry.get(k) or "") for k in ("from_model", "to_model"))
        out.append(Healed(key, at_ms, from_model, to_model, who))
    return sorted(out, key=lambda h: (h.at_ms, h.key))


def _usable(
    model: str | None, blacked_out: set[str], families: Mapping[str, Sequence[str]]
) -> bool:
    # ``blacked_out`` holds resting families and resting models (``ModelState.resting``).
    if not model or not model.strip() or model in blacked_out:
        return False
    family = family_of(model, families)
    return family is None or family not in blacked_out


def resolve_dispatch_model(
    *,
    explicit: str | None,
    chain: Sequence[str],
    default_model: str | None,
    blacked_out: set[str],
    families: Mapping[str, Sequence[str]],
) -> str | None:
    """Pick the dispatch model: explicit, else chain's first usable, else default, else None."""
    # An explicit model of a blacked-out family falls through like no explicit model at all:
    # the blackout exists precisely so that a pinned free model stops eating 429s.
    picks = (explicit, *chain, default_model)
    return next((m for m in picks if _usable(m, blacked_out, families)), None)


def next_model_in_chain(
    current: str | None,
    chain: Sequence[str],
    blacked_out: set[str],
    families: Mapping[str, Sequence[str]],
) -> str | None:
    """Return the next usable model after ``current`` in the chain, or None when none is left."""
    rest: Sequence[str] = chain
    if current is not None and current in chain:
        rest = chain[list(chain).index(current) + 1 :]
    return next((m for m in rest if m != current and _usable(m, blacked_out, families)), None)
