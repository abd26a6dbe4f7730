"""`python -m bench --match`: how well smart matching tells a continuation from new work.

The labelled set is bench/data/match_sessions.json (a fleet of 36 project sessions with what the
hub knows of each) and bench/data/match_cases.json (dispatch texts, each labelled with the
session it continues or null for new work; a 'tune' part, and a 'heldout' and an 'unseen'
part that are only ever scored as a whole; 'unseen' was written after the defaults were
chosen), and bench/data/match_cases_blind.json (a 'blind' part of 150 texts, written by
someone who had not read the matcher, its results or the other cases, committed before it was
first scored), and bench/data/match_cases_blind2.json (a 'blind2' part of 150 more, written
the same way on 2026-12-04 after the glossary had been chosen, and scored once), and
bench/data/match_cases_blind3.json (a 'blind3' part of 150 more, written the same way after the
files-named and refers-back rules had been chosen on the other parts, and scored once), and
bench/data/match_cases_blind4.json (a 'blind4' part of 150 more, written the same way before
the fault rule was committed, and scored once), and bench/data/match_cases_blind5.json (a
'blind5' part of 150 more, written the same way before the agent's words were read, and scored
once), and bench/data/match_cases_blind6.json (a 'blind6' part of 150 more, written the same
way after the agent's words were in, and scored once with the rule as it then stood).
bench/data/match_session_work.json holds what each session's agent said (its newest
reply, its todo list), written by a helper that read only the fleet file. Two readings:

* the curve: for each threshold, a text "continues a session" when its best candidate scores
  at least the threshold. Precision: of the texts matched, the share matched to the right
  session. Recall: of the continuations, the share matched to the right session. New work
  matched: of the texts that are new work, the share matched to any session.
* the decision: what the planner's rule (``ops.planner.match_decision``, with the config's
  default thresholds and margin) does with each text, scored the same way.

Pure computation, no servers; prints tables, writes bench/results/match.json.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
SPLITS = ("tune", "heldout", "unseen", "blind", "blind2", "blind3", "blind4", "blind5", "blind6")
THRESHOLDS = tuple(round(0.05 * i, 2) for i in range(1, 13))


@dataclass(frozen=True)
class Case:
    """One labelled dispatch text."""

    text: str
    expect: str | None  # the session it continues; None: new work
    kind: str  # continue, same_area, generic
    split: str  # tune, heldout, unseen


@dataclass(frozen=True)
class Session:
    """One session of the labelled fleet and what the hub can know of it."""

    id: str
    title: str
    folder: str
    running: bool
    tasks: tuple[str, ...]
    files: tuple[str, ...]
    said: tuple[str, ...] = ()  # its agent's todo items and newest reply (match_session_work)


def load() -> tuple[list[Session], list[Case]]:
    """The labelled fleet and cases."""
    fleet = json.loads((DATA / "match_sessions.json").read_text("utf-8"))
    work = json.loads((DATA / "match_session_work.json").read_text("utf-8"))["sessions"]

    def said(sid: str) -> tuple[str, ...]:
        agent = work.get(sid, {})
        return (*(t["content"] for t in agent.get("todos", [])), agent.get("reply", ""))

    sessions = [
        Session(
            s["id"], s["title"], s["dir"], s["running"], tuple(s["tasks"]), tuple(s["files"]),
            said(s["id"]),
        )
        for s in fleet["sessions"]
    ]
    doc = json.loads((DATA / "match_cases.json").read_text("utf-8"))
    doc |= json.loads((DATA / "match_cases_blind.json").read_text("utf-8"))
    doc |= json.loads((DATA / "match_cases_blind2.json").read_text("utf-8"))
    doc |= json.loads((DATA / "match_cases_blind3.json").read_text("utf-8"))
    doc |= json.loads((DATA / "match_cases_blind4.json").read_text("utf-8"))
    doc |= json.loads((DATA / "match_cases_blind5.json").read_text("utf-8"))
    doc |= json.loads((DATA / "match_cases_blind6.json").read_text("utf-8"))
    cases = [
        Case(text, expect, kind, split)
        for split in SPLITS
        for text, expect, kind in doc.get(split, [])
    ]
    known = {s.id for s in sessions}
    bad = [c.text for c in cases if c.expect is not None and c.expect not in known]
    if bad:
        raise ValueError(f"cases name sessions not in the fleet: {bad}")
    return sessions, cases


# A ranking: the text -> candidates (session id, score, the session's files the text names, as
# core.cues sees them in what the matcher knows of it), best first.
Ranking = Callable[[str], list[tuple[str, float, tuple[str, ...]]]]


EVIDENCE = ("read", "prompts", "pool", "full", "title", "outside")


def ranking(sessions: Sequence[Session], evidence: str) -> Ranking:
    """The hub's matcher over the fleet, seeing of each session:

    * 'title': its title and folder;
    * 'pool': also the task texts the hub sent into it;
    * 'read' (what dispatch does): ranked on 'pool', then the best ``READ_CANDIDATES`` read
      (their prompts and changed files, their agent's todo items and newest reply, as their
      own messages show them) and ranked again;
    * 'prompts': as 'read' without the agent's words (what dispatch read before them);
    * 'outside': sessions started outside the hub (no pool texts): ranked on 'title', then
      the best few read and ranked again;
    * 'full': every session's pool texts and changed files, all read (a bound, not a path
      dispatch takes).
    """
    from xaf_hub.core import matcher
    from xaf_hub.core.cues import named_files
    from xaf_hub.ops.dispatch import READ_CANDIDATES

    by_id = {s.id: s for s in sessions}
    hub_sent = evidence in ("pool", "read", "prompts", "full")
    docs = [
        (s.id, matcher.Evidence(s.title, s.folder, s.tasks if hub_sent else ()))
        for s in sessions
    ]
    if evidence == "full":
        docs = [(k, e.adding(files=by_id[k].files)) for k, e in docs]
    index = matcher.Index(docs)
    reads = evidence in ("read", "prompts", "outside")
    agent = evidence != "prompts"
    seen: dict[str, list[tuple[str, float, tuple[str, ...]]]] = {}  # ranked once, scored often

    def rank(text: str) -> list[tuple[str, float, tuple[str, ...]]]:
        if text not in seen:
            seen[text] = ranked(text)
        return seen[text]

    def ranked(text: str) -> list[tuple[str, float, tuple[str, ...]]]:
        found = index.rank(text, top=5)
        known = dict(docs)
        if reads and found:
            best = {c.key for c in found[:READ_CANDIDATES]}
            read = [
                (k, e.adding(by_id[k].tasks, by_id[k].files, by_id[k].said if agent else ())
                 if k in best else e)
                for k, e in docs
            ]
            known = dict(read)
            found = matcher.Index(read).rank(text, top=5)
        named = [named_files(text, known[c.key].tasks, known[c.key].files) for c in found]
        return [(c.key, c.score, n) for c, n in zip(found, named, strict=True)]

    return rank


def score(picks: Sequence[tuple[Case, str | None]]) -> dict[str, Any]:
    """Precision, recall and new work matched for (case, chosen session or None) pairs."""
    matched = [(c, p) for c, p in picks if p is not None]
    right = sum(1 for c, p in matched if p == c.expect)
    continuations = sum(1 for c, _ in picks if c.expect is not None)
    new = [(c, p) for c, p in picks if c.expect is None]
    new_matched = sum(1 for _, p in new if p is not None)
    return {
        "precision": right / len(matched) if matched else 1.0,
        "recall": right / continuations if continuations else 1.0,
        "new_matched": new_matched / len(new) if new else 0.0,
        "counts": {
            "right": right,
            "continuations": continuations,
            "matched": len(matched),
            "new_matched": new_matched,
            "new": len(new),
        },
    }


def curve(cases: Sequence[Case], rank: Ranking) -> list[dict[str, Any]]:
    """One row per threshold: the best candidate at or above it is the match."""
    ranked = [(c, rank(c.text)) for c in cases]
    rows = []
    for t in THRESHOLDS:
        picks = [(c, r[0][0] if r and r[0][1] >= t else None) for c, r in ranked]
        rows.append({"threshold": t, **score(picks)})
    return rows


def decision(sessions: Sequence[Session], cases: Sequence[Case], rank: Ranking) -> dict[str, Any]:
    """The planner's rule with the default thresholds (every instance has a free slot)."""
    from xaf_hub.config.load import MatchRule
    from xaf_hub.core.cues import refers_back
    from xaf_hub.ops.planner import MatchEvidence, judging_order, match_decision

    rule = MatchRule()
    running = {s.id: s.running for s in sessions}
    picks = []
    for c in cases:
        found = list(rank(c.text))
        order, first = judging_order(  # as the planner judges them
            [sc for _, sc, _ in found], [MatchEvidence(named=n) for _, _, n in found]
        )
        back = refers_back(c.text)
        chosen = None
        for j, runner_up in order:
            key, sc, named = found[j]
            verdict = match_decision(
                rule,
                sc,
                runner_up,
                running=running[key],
                named=named if first is not None else (),
                refers_back=back,
            )
            if verdict.take:
                chosen = key
            break  # only the best candidate may be taken; below it is only weaker evidence
        picks.append((c, chosen))
    return {"rule": rule.to_json(), **score(picks)}


def measure(evidence: str = "read") -> dict[str, Any]:
    """Curves (all, tune, heldout) and the decision's figures."""
    sessions, cases = load()
    rank = ranking(sessions, evidence)
    out: dict[str, Any] = {"evidence": evidence, "cases": len(cases), "sessions": len(sessions)}
    for part in ("all", *SPLITS):
        chosen = [c for c in cases if part in ("all", c.split)]
        out[part] = {"curve": curve(chosen, rank), "decision": decision(sessions, chosen, rank)}
    return out


def render(result: dict[str, Any]) -> str:
    """The curves and the decision as text tables."""
    lines = [
        f"match evaluation: {result['cases']} cases, {result['sessions']} sessions, "
        f"evidence: {result['evidence']}"
    ]
    for part in ("all", *SPLITS):
        lines.append(f"\n[{part}]  threshold  precision  recall  new work matched")
        for row in result[part]["curve"]:
            n = row["counts"]
            lines.append(
                f"            {row['threshold']:.2f}      {row['precision']:6.1%}  "
                f"{row['recall']:6.1%}  {row['new_matched']:6.1%} "
                f"({n['new_matched']}/{n['new']})"
            )
        d = result[part]["decision"]
        n = d["counts"]
        lines.append(
                f"  decision {d['rule']}: precision {d['precision']:.1%}, recall "
                f"{d['recall']:.1%} ({n['right']}/{n['continuations']}), new work matched "
                f"{d['new_matched']:.1%} ({n['new_matched']}/{n['new']})"
            )
    return "\n".join(lines) + "\n"


def run(evidence: str, out: Path) -> int:
    """Measure, print, write the JSON."""
    result = measure(evidence)
    text = render(result)
    print(text, end="")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, ensure_ascii=False, indent=2), encoding="utf-8")
    return 0
