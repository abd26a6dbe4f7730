"""Carry out a dispatch plan: gate, create, prompt, audit (SPEC §6 step 4-5, §6a).

Also home of the pieces every dispatch path shares (manual dispatch, fill_slots, resume,
heal): the model choice and the prompt with its discipline block.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from xaf_hub import audit
from xaf_hub.client import OpencodeClient
from xaf_hub.config import Config, InstanceConfig
from xaf_hub.discipline import compose_prompt, slugify
from xaf_hub.errors import BusyError, HubError
from xaf_hub.gate import Gate
from xaf_hub.model_state import ModelState, resolve_dispatch_model, resolve_timezone
from xaf_hub.planner import Plan
from xaf_hub.records import SessionRecord
from xaf_hub.scan import scan_instance


def model_state(cfg: Config) -> ModelState:
    """The fleet's model state store (blackouts, healed failures): a file, or Redis if asked."""
    policy = (
        cfg.models.blackout_reset_hour,
        resolve_timezone(cfg.models.timezone),
        cfg.models.families(),
    )
    if cfg.models.state_backend == "redis":
        from xaf_hub.redis_backend import RedisModelState, connect

        return RedisModelState(
            connect(cfg.lock),
            cfg.lock.redis_prefix,
            *policy,
            lock_timeout=cfg.lock.lock_timeout_seconds,
        )
    return ModelState(
        cfg.state_dir / ".model_state.json", *policy, lock_timeout=cfg.lock.lock_timeout_seconds
    )


def model_chain(cfg: Config, inst: InstanceConfig) -> tuple[str, ...]:
    """The instance's model chain, else the global one."""
    return inst.models or cfg.models.chain


def choose_model(
    cfg: Config, inst: InstanceConfig, explicit: str | None, now: datetime | None = None
) -> str | None:
    """resolve_dispatch_model for one instance with the current blackouts."""
    now = now or datetime.now(UTC)
    blacked = model_state(cfg).blacked_out_families(now)
    return resolve_dispatch_model(
        explicit=explicit,
        chain=model_chain(cfg, inst),
        default_model=cfg.models.default_dispatch_model,
        blacked_out=blacked,
        families=cfg.models.families(),
    )


def build_prompt(
    cfg: Config, inst: InstanceConfig, text: str, title: str, override: str | None = None
) -> str:
    """Task text plus the discipline block for ``inst`` (the one place prompts are built)."""
    return compose_prompt(
        text,
        "mainline" if inst.branch_policy == "mainline" else "branch",
        base_branch=cfg.patrol.base_branch,
        slug=slugify(title or text),
        override=override,
    )


@dataclass(frozen=True)
class DispatchResult:
    """What was done."""

    action: str
    instance: str
    session_id: str
    directory: str
    title: str
    model: str | None
    steered_instead: bool = False


def _running_ids(sessions: list[SessionRecord]) -> set[str]:
    return {s.id for s in sessions if s.running}


async def execute(
    cfg: Config,
    plan: Plan,
    prompt: str,
    model: str | None,
    client: OpencodeClient,
    gate: Gate,
    *,
    command: str = "dispatch",
    env: Mapping[str, str] | None = None,
    before_prompt: Callable[[str], None] | None = None,
) -> DispatchResult:
    """Send the prompt; for gated plans hold the lock, re-count, reserve, create, prompt.

    ``before_prompt(session_id)`` runs once the target session is known (created, or the
    existing one) and before the prompt is sent, so a caller can record the work first: a
    crash between the two then leaves a record of work not yet sent, never work sent twice
    or running unrecorded. When it raises, nothing is sent.
    """
    inst = plan.instance
    try:
        if not plan.gated:
            assert plan.session is not None
            await _send(client, plan.session.id, prompt, model, before_prompt)
            result = DispatchResult(
                "steer", inst.name, plan.session.id, plan.directory, plan.title, model
            )
        else:
            result = await _gated(cfg, plan, prompt, model, client, gate, before_prompt)
    except Exception as exc:
        audit.append(
            cfg.state_dir,
            command=command,
            instance=inst.name,
            session=plan.session.id if plan.session else "",
            result="failed",
            reason=str(exc),
            env=env,
        )
        raise
    try:
        audit.append(
            cfg.state_dir,
            command=command,
            instance=inst.name,
            session=result.session_id,
            result=result.action,
            reason=plan.via,
            env=env,
            extra={"model": model or "", "directory": result.directory},
        )
    except HubError as exc:
        # The work is sent: failing now would make the caller think it was not.
        gate.warnings.append(f"the audit log could not record this dispatch: {exc}")
    return result


async def _send(
    client: OpencodeClient,
    session_id: str,
    prompt: str,
    model: str | None,
    before_prompt: Callable[[str], None] | None,
) -> None:
    """Run ``before_prompt`` (see ``execute``), then send the prompt: every path sends here."""
    if before_prompt is not None:
        before_prompt(session_id)
    await client.prompt_async(session_id, prompt, model)


async def _gated(
    cfg: Config,
    plan: Plan,
    prompt: str,
    model: str | None,
    client: OpencodeClient,
    gate: Gate,
    before_prompt: Callable[[str], None] | None = None,
) -> DispatchResult:
    inst = plan.instance
    with gate.lock(inst.name):
        # Re-read the running state under the lock: the plan was made without it.
        fresh = await scan_instance(client, inst, project_only=True)
        if not fresh.reachable:
            from xaf_hub.errors import UnreachableError

            raise UnreachableError(inst.name, fresh.reason)
        gate.warnings.extend(fresh.warnings)
        running = _running_ids(fresh.sessions)
        running_project = sum(1 for s in fresh.sessions if s.project and s.running)
        if plan.action == "reuse" and plan.session is not None and plan.session.id in running:
            # It started running meanwhile: a prompt now steers it and takes no slot.
            await _send(client, plan.session.id, prompt, model, before_prompt)
            return DispatchResult(
                "steer",
                inst.name,
                plan.session.id,
                plan.directory,
                plan.title,
                model,
                steered_instead=True,
            )
        reserved = gate.pending(inst.name, running)
        if running_project + len(reserved) >= inst.concurrency_limit:
            raise BusyError(
                f"{inst.name} is at its limit: {running_project} running + {len(reserved)} "
                f"reserved of {inst.concurrency_limit}; try later or steer a running session "
                "with --session"
            )
        res = gate.reserve(inst.name)
        try:
            if plan.action == "create":
                created = await client.create_session(plan.directory, plan.title)
                session_id, directory = created.id, created.directory
            else:
                assert plan.session is not None
                session_id, directory = plan.session.id, plan.directory
            res = gate.attach(res, session_id)
            await _send(client, session_id, prompt, model, before_prompt)
        except BaseException:
            gate.release(res)
            raise
    return DispatchResult(plan.action, inst.name, session_id, directory, plan.title, model)


def now_utc() -> datetime:
    """The current time, timezone-aware."""
    return datetime.fromtimestamp(time.time(), UTC)
