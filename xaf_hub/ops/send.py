"""Send work: the one path every prompt takes, for commands and patrol jobs alike.

``send_work`` carries out a ``planner.Plan``: a steer of a running session is sent as is; a
new session or an idle one started again passes the gate: hold the instance lock, re-count
the load (``ops.load.instance_load``) from a fresh read of the server, reserve a slot,
create the session, attach it to the reservation, record the work (``before_prompt``), send
the prompt, release the lock. Every outcome is written to the audit log. The result carries
the warnings met on the way (fail-closed scan notes, gate problems, an audit write that
failed after the work was sent), so no caller depends on a shared mailbox.

``abort_and_prompt`` (a heal of a run stuck in retry) and ``build_prompt`` (the task text
plus the commit/branch discipline, from ``xaf_hub.discipline``) live here too: this is the
only module that calls ``OpencodeClient.prompt_async`` (docs/architecture.md, "Sending work").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from xaf_hub.client import OpencodeClient
from xaf_hub.config import InstanceConfig
from xaf_hub.discipline import compose_prompt, slugify
from xaf_hub.errors import BusyError, HubError, StateFileError, UnreachableError
from xaf_hub.gate import Gate
from xaf_hub.ops.context import OpsContext
from xaf_hub.ops.load import instance_load
from xaf_hub.planner import Plan
from xaf_hub.scan import scan_instance

# How long to wait for an aborted retry to go idle before sending the new prompt.
ABORT_SETTLE_SECONDS = 10.0


def build_prompt(
    ops: OpsContext, inst: InstanceConfig, text: str, title: str, override: str | None = None
) -> str:
    """Task text plus the discipline block for ``inst`` (the one place prompts are built)."""
    return compose_prompt(
        text,
        "mainline" if inst.branch_policy == "mainline" else "branch",
        base_branch=ops.cfg.patrol.base_branch,
        slug=slugify(title or text),
        override=override,
    )


def pool_discipline(ops: OpsContext) -> tuple[str | None, str]:
    """The task pool's discipline override, and why it could not be read ("" when it could).

    A corrupt pool never stops a send: the prompt then carries the default discipline.
    """
    try:
        return ops.backlog().load().discipline, ""
    except StateFileError as exc:
        return None, f"task pool unreadable, prompts use the default discipline: {exc}"


@dataclass(frozen=True)
class SendResult:
    """What was done, and what the caller should tell a person."""

    action: str  # steer | reuse | create
    instance: str
    session_id: str
    directory: str
    title: str
    model: str | None
    steered_instead: bool = False
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def to_json(self) -> dict[str, object]:
        """The JSON form (warnings go to stderr, not into the document)."""
        doc = dict(self.__dict__)
        doc.pop("warnings")
        return doc


def _drain(gate: Gate) -> list[str]:
    out = list(gate.warnings)
    gate.warnings.clear()
    return out


async def send_work(
    ops: OpsContext,
    plan: Plan,
    prompt: str,
    model: str | None,
    client: OpencodeClient,
    gate: Gate | None = None,
    *,
    command: str = "dispatch",
    before_prompt: Callable[[str], None] | None = None,
) -> SendResult:
    """Send the prompt; for gated plans hold the lock, re-count, reserve, create, prompt.

    ``before_prompt(session_id)`` runs once the target session is known (created, or the
    existing one) and before the prompt is sent, so a caller can record the work first: a
    crash between the two then leaves a record of work not yet sent, never work sent twice
    or running unrecorded. When it raises, nothing is sent.
    """
    gate = gate if gate is not None else ops.gate()
    inst = plan.instance
    warnings: list[str] = []
    try:
        if not plan.gated:
            assert plan.session is not None
            await _send(client, plan.session.id, plan.directory, prompt, model, before_prompt)
            result = SendResult(
                "steer", inst.name, plan.session.id, plan.directory, plan.title, model
            )
        else:
            result = await _gated(plan, prompt, model, client, gate, warnings, before_prompt)
    except Exception as exc:
        ops.audit(
            command,
            instance=inst.name,
            session=plan.session.id if plan.session else "",
            result="failed",
            reason=str(exc),
        )
        raise
    finally:
        warnings.extend(_drain(gate))
    try:
        ops.audit(
            command,
            instance=inst.name,
            session=result.session_id,
            result=result.action,
            reason=plan.via,
            extra={"model": model or "", "directory": result.directory},
        )
    except HubError as exc:
        # The work is sent: failing now would make the caller think it was not.
        warnings.append(f"the audit log could not record this dispatch: {exc}")
    return SendResult(**{**result.__dict__, "warnings": tuple(warnings)})


async def _send(
    client: OpencodeClient,
    session_id: str,
    directory: str,
    prompt: str,
    model: str | None,
    before_prompt: Callable[[str], None] | None,
) -> None:
    """Run ``before_prompt`` (see ``send_work``), then send the prompt: every path ends here."""
    if before_prompt is not None:
        before_prompt(session_id)
    await client.prompt_async(session_id, prompt, model)


async def _gated(
    plan: Plan,
    prompt: str,
    model: str | None,
    client: OpencodeClient,
    gate: Gate,
    warnings: list[str],
    before_prompt: Callable[[str], None] | None = None,
) -> SendResult:
    inst = plan.instance
    with gate.lock(inst.name):
        # Re-read the running state under the lock: the plan was made without it.
        fresh = await scan_instance(client, inst, project_only=True)
        if not fresh.reachable:
            raise UnreachableError(inst.name, fresh.reason)
        warnings.extend(fresh.warnings)
        load = instance_load(fresh, gate, allow_prod=True)
        session = plan.session if plan.action == "reuse" else None
        if session is not None and session.id in load.running_ids:
            # It started running meanwhile: a prompt now steers it and takes no slot.
            await _send(client, session.id, plan.directory, prompt, model, before_prompt)
            return SendResult(
                "steer", inst.name, session.id, plan.directory, plan.title, model, True
            )
        assert load.reserved is not None
        if load.running_project + load.reserved >= inst.concurrency_limit:
            raise BusyError(
                f"{inst.name} is at its limit: {load.running_project} running + "
                f"{load.reserved} reserved of {inst.concurrency_limit}; try later or steer a "
                "running session with --session"
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
            await _send(client, session_id, directory, prompt, model, before_prompt)
        except BaseException:
            gate.release(res)
            raise
    return SendResult(plan.action, inst.name, session_id, directory, plan.title, model)


async def wait_until_idle(
    client: OpencodeClient, directory: str, session: str, timeout: float
) -> bool:
    """Poll the directory's status until ``session`` is no longer running (or timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        if session not in await client.status(directory):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.2)


async def abort_and_prompt(
    ops: OpsContext,
    inst: InstanceConfig,
    session: str,
    directory: str,
    prompt: str,
    model: str,
    *,
    command: str,
    reason: str,
) -> None:
    """Abort a running session and send a new prompt while holding the instance's gate lock.

    The session holds a slot while it runs; holding the lock across abort -> prompt keeps
    any other dispatch from taking that slot in between.
    """
    try:
        async with ops.client(inst) as client:
            with ops.gate().lock(inst.name):
                await client.abort(session)
                await wait_until_idle(client, directory, session, ABORT_SETTLE_SECONDS)
                await client.prompt_async(session, prompt, model)
    except Exception as exc:
        ops.audit(command, instance=inst.name, session=session, result="failed", reason=str(exc))
        raise
    ops.audit(
        command,
        instance=inst.name,
        session=session,
        result="abort+prompt",
        reason=reason,
        extra={"model": model},
    )

