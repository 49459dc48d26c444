"""A transfer set from a plain-text corpus: in-domain texts or sentence pairs without labels, for
``--unlabeled-file``, which the teacher labels (DistilBERT-style transfer sets). A pair task's own train split is
small (RTE has 2,490 pairs); on a transfer set the student learns the teacher's function from far more pairs than
the task holds.

Each pair's first side is one or two consecutive sentences of a paragraph; its second side is, in equal shares:

- ``part``: a contiguous part of one of those sentences (what the first side says, shorter);
- ``next``: the paragraph's next sentence (on the topic, a new claim);
- ``swap``: one of the first side's sentences with one capitalised word or number replaced by one of another
  paragraph (nearly the same words, another fact);
- ``far``: a sentence of another paragraph.

No label is written: whether a pair is entailed, a paraphrase or similar is the teacher's to say. A single-text
set (``pairs=False``) holds one or two consecutive sentences a row. Deterministic for a seed.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from distillery.data.corpus import read_corpus
from distillery.errors import DistilleryError

PAIR_KINDS = ("part", "next", "swap", "far")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
SWAPPABLE = re.compile(r"^(?:[A-Z][a-z]+|\d[\d,.]*)$")  # a capitalised word or a number
PUNCTUATION = ",.;:"
JSON_LINES = (".jsonl", ".json")  # the extensions read_custom_rows reads as one JSON object a line
MIN_WORDS, MAX_WORDS = 6, 60  # a sentence's words: shorter ones are headings, longer ones split badly


def paragraph_sentences(lines: list[str]) -> list[list[str]]:
    """The sentences of each line (a paragraph) that has two or more of MIN_WORDS..MAX_WORDS words."""
    found = []
    for line in lines:
        sentences = [s for s in SENTENCE_END.split(line) if MIN_WORDS <= len(s.split()) <= MAX_WORDS]
        if len(sentences) >= 2:
            found.append(sentences)
    return found


def _part_of(sentence: str, rng: random.Random) -> str:
    words = sentence.rstrip(".!?").split()
    size = rng.randint(max(4, len(words) // 3), max(4, 2 * len(words) // 3))
    start = rng.randint(0, max(0, len(words) - size))
    return " ".join(words[start:start + size]) + "."


def _swapped(sentence: str, donor: str, rng: random.Random) -> str | None:
    words = sentence.split()
    spots = [i for i, w in enumerate(words[1:], 1) if SWAPPABLE.match(w.strip(PUNCTUATION))]
    donors = [w.strip(PUNCTUATION) for w in donor.split()[1:] if SWAPPABLE.match(w.strip(PUNCTUATION))]
    if not spots or not donors:
        return None
    spot = rng.choice(spots)
    words[spot] = rng.choice(donors) + words[spot][len(words[spot].rstrip(PUNCTUATION)):]
    return " ".join(words)


def _second_side(kind: str, para: list[str], start: int, first: list[str], other: list[str],
                 rng: random.Random) -> str | None:
    if kind == "part":
        return _part_of(rng.choice(first), rng)
    if kind == "next":
        return para[min(start + len(first), len(para) - 1)]
    if kind == "swap":
        return _swapped(rng.choice(first), " ".join(other), rng)
    return rng.choice(other)


def transfer_rows(paragraphs: list[list[str]], count: int, seed: int, pairs: bool = True) -> list[dict[str, str]]:
    """``count`` rows (``text``, and ``text_pair`` when ``pairs``) drawn from ``paragraphs`` (lists of sentences,
    :func:`paragraph_sentences`), the pair kinds (PAIR_KINDS) in turn."""
    rng = random.Random(seed)
    rows: list[dict[str, str]] = []
    tries = 0
    while len(rows) < count:
        tries += 1
        if tries > 20 * count:  # only when the paragraphs give no usable second side (no word to swap, all alike)
            raise DistilleryError(f"The corpus gave only {len(rows)} of {count} rows; give more text.")
        para = rng.choice(paragraphs)
        start = rng.randrange(len(para) - 1)
        first = para[start:start + rng.choice((1, 2))]
        if not pairs:
            rows.append({"text": " ".join(first)})
            continue
        kind = PAIR_KINDS[len(rows) % len(PAIR_KINDS)]
        second = _second_side(kind, para, start, first, rng.choice(paragraphs), rng)
        if second and second not in first:
            rows.append({"text": " ".join(first), "text_pair": second})
    return rows


def write_transfer_set(corpus: list[str], out: Path, count: int, *, pairs: bool = True, seed: int = 0,
                       max_lines: int | None = None) -> int:
    """Write :func:`transfer_rows` of the ``corpus`` files (plain lines or WikiExtractor output, at most
    ``max_lines`` lines read) to ``out`` as JSONL; returns the number of paragraphs drawn from."""
    from distillery.folders import write_file

    if count < 1:
        raise DistilleryError(f"--rows must be at least 1, got {count}.")
    if Path(out).suffix.lower() not in JSON_LINES:  # --unlabeled-file reads a file by its extension
        raise DistilleryError(f"--out {out}: a transfer set is written as JSON lines; name it *.jsonl.")
    paragraphs = paragraph_sentences(read_corpus(corpus, max_lines))
    if not paragraphs:
        raise DistilleryError(f"No paragraph of {', '.join(map(str, corpus))} has two sentences of {MIN_WORDS} to "
                              f"{MAX_WORDS} words; a transfer set is drawn from prose, one paragraph a line.")
    check_rows(count, paragraphs, corpus, pairs)
    rows = transfer_rows(paragraphs, count, seed, pairs)
    write_file(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return len(paragraphs)


def check_rows(count: int, paragraphs: list[list[str]], corpus: list, pairs: bool) -> None:
    """Refuse, before any row is drawn, more rows than ``paragraphs`` can give: every row's first side is one of
    their spans of one or two consecutive sentences, and a span gives one row a pair kind (one a single-text set);
    past that the draws only repeat rows (and an absurd ``--rows`` would fill memory without end)."""
    spans = sum(2 * (len(p) - 1) for p in paragraphs)
    per_span = len(PAIR_KINDS) if pairs else 1
    if count > spans * per_span:
        each = f"{per_span} rows a span (one of each kind: {', '.join(PAIR_KINDS)})" if pairs else "one row a span"
        raise DistilleryError(f"--rows {count:,} is more than {', '.join(map(str, corpus))} can give: its "
                              f"{len(paragraphs):,} paragraphs hold {spans:,} spans of one or two sentences, at most "
                              f"{each}; give --rows {spans * per_span:,} or fewer, or more text (--corpus, --max-lines).")
