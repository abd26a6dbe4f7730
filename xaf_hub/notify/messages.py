"""An event in plain words, in English or Chinese: a short headline and one or two lines.

The catalogue is small on purpose: one headline and one body per event type and language.
Error texts quoted from servers stay as the server wrote them. Rendering is pure: the clock's
zone for local times and the overview link are passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import tzinfo
from typing import Any

from xaf_hub.core.clock import local_iso
from xaf_hub.notify.events import Event

# A chat line is read on a phone: long titles and error texts are cut.
_TITLE_CHARS = 80
_DETAIL_CHARS = 300

CATALOGUE: dict[str, dict[str, tuple[str, str]]] = {
    "en": {
        "task_done": (
            "Task done: {title}",
            "Task {task} finished in its session on {instance}.{judged}",
        ),
        "task_finished": (
            "Task finished, not verified: {title}",
            "Task {task} finished in its session on {instance}, on the agent's word: without "
            "project.repository the hub cannot check its work. Set project.repository to the "
            "remote the agents push to.",
        ),
        "task_parked": (
            "Task parked: {title}",
            "Task {task} is parked and waits for a person ({attempts} failed attempt(s)): "
            "{error}\nTo try it again: xaf-hub backlog set {task} --status pending --reset",
        ),
        "needs_person": (
            "Needs a person: {title}",
            "Session \u201c{title}\u201d on {instance} {state}",
        ),
        "waiting_person": (
            "Waiting for a person: {title}",
            "Session \u201c{title}\u201d on {instance} stopped and waits: {detail}. "
            "It holds one of the server's places until answered.\nTo answer: {answer}",
        ),
        "healed": (
            "Healed: {title}",
            "Session \u201c{title}\u201d on {instance} hit a limit on {from_model}; "
            "it goes on with {model}.",
        ),
        "blackout": (
            "Provider resting: {family}",
            "{family} models hit a rate limit. The hub stops using them until {until}.",
        ),
        "run_ceiling": (
            "Run stopped over its ceiling: {title}",
            "Session \u201c{title}\u201d on {instance} was stopped: {reason}",
        ),
        "rest_ended": (
            "Rest ended: {family}",
            "{family} no longer rests (it was to rest until {until}): ended by a person. "
            "The hub uses it again.",
        ),
        "instance_down": (
            "Server down: {instance}",
            "{instance} does not answer ({reason}). Its work waits until it is back.",
        ),
        "instance_up": ("Server back: {instance}", "{instance} answers again."),
        "daily_summary": (
            "Daily summary for {day}",
            "Last 24 hours: {done} task(s) done and verified, {finished} finished but not "
            "verified, {parked} parked, {healed} healed, {people} needing a person.\n"
            "Now: {running} running, {asking} waiting for a person, "
            "{waiting} waiting in the queue; {up} of {servers} server(s) answering.",
        ),
        "budget": (
            "Daily budget {level} % spent: {scope}",
            "{scope} spent {spent} of its daily budget {budget} today ({day}). {budget_next}",
        ),
        "failover": (
            "Patrol moved: {from_host} \u2192 {to_host}",
            "The patrol moved from host {from_host} to host {to_host}: {from_host} stopped "
            "renewing its lease, and {to_host} now heals and fills the fleet.",
        ),
        "test": (
            "Test message",
            "A test from xaf-hub for the webhook \u201c{webhook}\u201d. "
            "If you can read this, notifications work.",
        ),
    },
    "zh": {
        "task_done": ("任务完成:{title}", "任务 {task} 已在 {instance} 上的会话中完成。{judged}"),
        "task_finished": (
            "任务已结束,未验证:{title}",
            "任务 {task} 已在 {instance} 上的会话中结束,这只是智能体的说法:没有设置 "
            "project.repository,汇总工具无法核对它的工作。请把 project.repository "
            "设为智能体推送到的远程仓库。",
        ),
        "task_parked": (
            "任务搁置:{title}",
            "任务 {task} 已搁置,等人处理(失败 {attempts} 次):{error}\n"
            "重新排队:xaf-hub backlog set {task} --status pending --reset",
        ),
        "needs_person": ("需要人工处理:{title}", "{instance} 上的会话“{title}”{state}"),
        "waiting_person": (
            "等人回答:{title}",
            "{instance} 上的会话“{title}”停下来等待:{detail}。"
            "回答之前它一直占用服务器的一个名额。\n回答方式:{answer}",
        ),
        "healed": (
            "已自动恢复:{title}",
            "{instance} 上的会话“{title}”在 {from_model} 上遇到限额,已改用 {model} 继续。",
        ),
        "blackout": (
            "模型暂停使用:{family}",
            "{family} 系列模型遇到限流,{until} 之前不再使用。",
        ),
        "run_ceiling": (
            "运行超过上限已停止:{title}",
            "{instance} 上的会话“{title}”已被停止:{reason}",
        ),
        "rest_ended": (
            "模型恢复使用:{family}",
            "{family} 的暂停(原定到 {until})已由人工结束,系统重新使用它。",
        ),
        "instance_down": (
            "服务器无响应:{instance}",
            "{instance} 没有响应({reason})。它上面的工作等它恢复后继续。",
        ),
        "instance_up": ("服务器已恢复:{instance}", "{instance} 又能正常响应了。"),
        "daily_summary": (
            "{day} 每日汇总",
            "过去 24 小时:完成并验证 {done} 个任务,结束但未验证 {finished} 个,"
            "搁置 {parked} 个,自动恢复 {healed} 次,"
            "{people} 次需要人工处理。\n现在:{running} 个在运行,{asking} 个在等人回答,"
            "{waiting} 个在排队;"
            "{servers} 台服务器中 {up} 台正常响应。",
        ),
        "budget": (
            "每日预算已用 {level}%:{scope}",
            "{scope} 今天({day})已花费 {spent},每日预算 {budget}。{budget_next}",
        ),
        "failover": (
            "巡检已转移:{from_host} \u2192 {to_host}",
            "巡检从主机 {from_host} 转移到了主机 {to_host}:{from_host} 不再续租,"
            "现在由 {to_host} 负责修复会话和派发任务。",
        ),
        "test": (
            "测试消息",
            "这是 xaf-hub 发给 webhook“{webhook}”的测试消息。能看到它,说明通知已经接通。",
        ),
    },
}

_STATES: dict[str, dict[str, str]] = {
    "en": {
        "failed": "stopped with an error: {detail}",
        "interrupted": "was interrupted and will not be restarted automatically: {detail}",
        "stale_busy": "has been busy with no progress for a long time: {detail}",
        "person": "\u2014 {detail}. The patrol leaves it alone until someone acts.",
        "": "needs a look: {detail}",
    },
    "zh": {
        "failed": "出错停下了:{detail}",
        "interrupted": "被中断了,不会再自动续跑:{detail}",
        "stale_busy": "长时间忙碌却没有进展:{detail}",
        "person": "——{detail}。在有人处理之前,巡检不会再动它。",
        "": "需要有人看一下:{detail}",
    },
}

_BUDGET_NEXT = {
    "en": {
        100: "No new work starts until tomorrow; runs already started go on.",
        80: "New work stops when the budget is reached.",
    },
    "zh": {
        100: "明天之前不再开始新的工作;已开始的运行继续。",
        80: "预算用完后将不再开始新的工作。",
    },
}
_PROJECT = {"en": "The project", "zh": "项目"}

_PREFIX = {"en": "[xaf-hub \u00b7 {project}]", "zh": "[xaf-hub \u00b7 {project}]"}
_LINK = {"en": "Overview: {url}", "zh": "总览页:{url}"}
_UNKNOWN = {"en": "unknown", "zh": "未知"}


def _cut(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _fields(event: Event, lang: str, tz: tzinfo) -> dict[str, Any]:
    data: Mapping[str, Any] = event.data
    unknown = _UNKNOWN[lang]
    detail = _cut(str(data.get("detail") or unknown), _DETAIL_CHARS)
    states = _STATES[lang]
    counts = data.get("counts") if isinstance(data.get("counts"), Mapping) else {}
    assert isinstance(counts, Mapping)
    return {
        "title": _cut(event.title or event.task or event.session or unknown, _TITLE_CHARS),
        "task": event.task or "-",
        "instance": event.instance or unknown,
        "attempts": data.get("attempts", "?"),
        "error": _cut(str(data.get("error") or unknown), _DETAIL_CHARS),
        "state": states.get(str(data.get("state") or ""), states[""]).format(detail=detail),
        "from_model": data.get("from_model") or unknown,
        "model": data.get("model") or unknown,
        "family": data.get("family") or unknown,
        "until": local_iso(str(data.get("until") or ""), tz, seconds=False, unknown="?"),
        "reason": _cut(str(data.get("reason") or unknown), _DETAIL_CHARS),
        # Which rule made it done: "verified: commit ... (new work...; check: passed)".
        "judged": "\n" + _cut(str(data["judged"]), _DETAIL_CHARS) if data.get("judged") else "",
        "day": data.get("day") or "",
        "done": counts.get("task_done", 0),
        "finished": counts.get("task_finished", 0),
        "parked": counts.get("task_parked", 0),
        "healed": counts.get("healed", 0),
        "people": counts.get("needs_person", 0),
        "running": data.get("running", 0),
        "waiting": data.get("waiting", 0),
        "asking": data.get("asking", 0),
        "detail": detail,
        "answer": _cut(str(data.get("answer") or unknown), _DETAIL_CHARS),
        "up": data.get("up", 0),
        "servers": data.get("servers", 0),
        "webhook": data.get("webhook") or "",
        "from_host": data.get("from_host") or unknown,
        "to_host": data.get("to_host") or unknown,
        "level": data.get("level", "?"),
        "scope": event.instance or _PROJECT[lang],
        "spent": _dollars(data.get("spent_usd")),
        "budget": _dollars(data.get("budget_usd")),
        "budget_next": _BUDGET_NEXT[lang].get(100 if data.get("level") == 100 else 80, ""),
    }


def _dollars(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"${value:,.2f}"
    return "?"


def render(
    event: Event, *, language: str, project: str, page_url: str, tz: tzinfo
) -> tuple[str, str]:
    """(headline, body) for ``event``; the headline names the hub and project."""
    lang = language if language in CATALOGUE else "en"
    head, body = CATALOGUE[lang].get(event.type, ("{title}", "{state}"))
    values = _fields(event, lang, tz)
    headline = _PREFIX[lang].format(project=project) + " " + head.format(**values)
    text = body.format(**values)
    if page_url:
        text += "\n" + _LINK[lang].format(url=page_url)
    return headline, text
