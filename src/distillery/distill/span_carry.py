"""SQuAD start/end distributions carried from one tokenizer's windows to another's, through character offsets.

A teacher and a pretrained student with different tokenizers cut the same context into different tokens and
windows, so the teacher's start/end distribution over its tokens cannot be compared position by position
with the student's. It is carried through the characters both share:

1. teacher token → character: a token's start probability lands on its first character, its end probability
   on its last. Where teacher windows overlap, a character gets the mean of the windows that hold it (each of
   them saw it; a window without it says nothing about it). What a window puts on tokens outside the context
   ([CLS]: "not in this window") is left behind.
2. character → student token: a start lands on the student token that holds the character, or the next one
   when the character sits in a gap between tokens (a space); an end on the token that holds it, or the one
   before. What a student window's tokens do not take goes to its [CLS], where SQuAD training points a window
   that does not hold the answer (a window gathering more than one from overlapping teacher windows is
   scaled back to one).

Each student window's distribution then sums to one. :func:`carry` does this for a whole split at once with
prefix sums over one flat array of characters (no loop over tokens or examples); :func:`carry_reference` is
the slow per-character definition it is tested against.

Offsets are ``(windows, positions, 2)`` integer arrays of character spans within each example's context,
``-1`` at positions outside the context (special tokens, the question, padding).
"""

from __future__ import annotations

import numpy as np

WHICH = ("start", "end")


def _bases(context_lengths: np.ndarray) -> np.ndarray:
    # each example owns len(context) character slots, one after another in one flat array
    return np.concatenate([[0], np.cumsum(np.asarray(context_lengths, dtype=np.int64))[:-1]])


def _teacher_chars(probs, offsets, samples, context_lengths, which) -> np.ndarray:
    """The teacher's distribution as mass per character (flat, every example's characters one after another)."""
    lengths = np.asarray(context_lengths, dtype=np.int64)
    total = int(lengths.sum())
    bases = _bases(lengths)[samples][:, None]
    a, b = offsets[..., 0], offsets[..., 1]
    inside = a >= 0
    # how many teacher windows hold each character: +1 where a window's context starts, -1 past its end
    first = np.where(inside, a, np.iinfo(np.int64).max).min(axis=1)
    last = np.where(inside, b, -1).max(axis=1)
    held = inside.any(axis=1)
    edges = np.bincount((bases[:, 0] + first)[held], minlength=total + 1)[: total + 1] \
        - np.bincount((bases[:, 0] + last)[held], minlength=total + 1)[: total + 1]
    coverage = np.cumsum(edges)[:total]
    char = np.where(inside, a if which == "start" else np.maximum(b - 1, a), 0)
    where = (bases + char)[inside]
    mass = np.bincount(where, weights=probs.astype(np.float64)[inside], minlength=total)
    return mass / np.maximum(coverage, 1)


def carry(teacher_probs, teacher_offsets, teacher_samples, student_offsets, student_samples, context_lengths,
          which: str) -> tuple[np.ndarray, np.ndarray]:
    """The teacher's ``which`` ("start" or "end") distribution carried onto the student's windows.

    ``teacher_probs``: ``(Wt, Lt)``, each row a distribution (zero on padding); ``*_samples``: the example index
    of each window; ``context_lengths``: characters in each example's context. Returns ``(mass, rest)``:
    ``(Ws, Ls)`` probability of each student context token (zero elsewhere), and ``(Ws,)`` the probability
    that belongs on the window's [CLS] (the answer outside this window, or nowhere in the teacher's view)."""
    if which not in WHICH:
        raise ValueError(f"which must be start or end, got {which!r}.")
    teacher_samples = np.asarray(teacher_samples, dtype=np.int64)
    student_samples = np.asarray(student_samples, dtype=np.int64)
    chars = _teacher_chars(np.asarray(teacher_probs), np.asarray(teacher_offsets, dtype=np.int64), teacher_samples,
                           context_lengths, which)
    prefix = np.concatenate([[0.0], np.cumsum(chars)])  # mass of slots [i, j) = prefix[j] - prefix[i]
    s_off = np.asarray(student_offsets, dtype=np.int64)
    S, E = s_off[..., 0], s_off[..., 1]
    inside = S >= 0
    # a window's context tokens are one run of positions, so the neighbour in the run is the one beside it
    before = np.zeros_like(inside)
    before[:, 1:] = inside[:, :-1]
    after = np.zeros_like(inside)
    after[:, :-1] = inside[:, 1:]
    if which == "start":  # characters after the previous token's end, up to this token's end
        lo = np.where(before, np.roll(E, 1, axis=1), S)
        hi = E
    else:  # characters from this token's start up to the next token's start
        lo = S
        hi = np.where(after, np.roll(S, -1, axis=1), E)
    base = _bases(context_lengths)[student_samples][:, None]
    counted = inside & (hi > lo)
    mass = np.where(counted, prefix[np.where(counted, base + hi, 0)] - prefix[np.where(counted, base + lo, 0)], 0.0)
    return _with_rest(mass)


def _with_rest(mass: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    total = mass.sum(axis=1, keepdims=True)
    mass = np.where(total > 1.0, mass / np.maximum(total, 1e-300), mass)
    return mass, np.clip(1.0 - mass.sum(axis=1), 0.0, None)


def carry_reference(teacher_probs, teacher_offsets, teacher_samples, student_offsets, student_samples,
                    context_lengths, which: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`carry`, one character at a time: the definition, for the tests."""
    chars = [np.zeros(int(length)) for length in context_lengths]
    coverage = [np.zeros(int(length)) for length in context_lengths]
    for w, sample in enumerate(teacher_samples):
        spans = [(a, b) for a, b in teacher_offsets[w] if a >= 0]
        if spans:
            coverage[sample][spans[0][0]:max(b for _, b in spans)] += 1
        for k, p in enumerate(teacher_probs[w]):
            a, b = teacher_offsets[w][k]
            if a >= 0:
                chars[sample][a if which == "start" else max(b - 1, a)] += p
    chars = [c / np.maximum(n, 1) for c, n in zip(chars, coverage)]
    mass = np.zeros(np.asarray(student_offsets).shape[:2])
    for v, sample in enumerate(student_samples):
        spans = [(k, a, b) for k, (a, b) in enumerate(student_offsets[v]) if a >= 0]
        for c, p in enumerate(chars[sample]):
            if which == "start":  # the first token ending after c, if c is not before the window
                hit = next((k for k, a, b in spans if b > c), None) if spans and c >= spans[0][1] else None
            else:  # the last token starting at or before c, if c is not past the window
                hit = next((k for k, a, b in reversed(spans) if a <= c), None) if spans and c < spans[-1][2] else None
            if hit is not None:
                mass[v, hit] += p
    return _with_rest(mass)
