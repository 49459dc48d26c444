"""SQuAD start/end distributions carried across tokenizers through character offsets (distill.span_carry)."""

from __future__ import annotations

import numpy as np
import pytest

from distillery.distill.span_carry import carry, carry_reference


def _tokenize(rng, length: int) -> list[tuple[int, int]]:
    """Random token spans over ``length`` characters, with gaps (spaces) between some of them."""
    spans, c = [], 0
    while c < length:
        c += int(rng.random() < 0.3)  # a gap
        if c >= length:
            break
        end = min(length, c + int(rng.integers(1, 5)))
        spans.append((c, end))
        c = end
    return spans


def _windows(rng, samples_spans, width: int, prefix: int):
    """Windows of ``width`` context tokens (stride width // 2) after ``prefix`` non-context positions, padded."""
    rows, samples = [], []
    for n, spans in enumerate(samples_spans):
        step = max(1, width // 2)
        for first in range(0, max(1, len(spans) - width + step), step):
            rows.append([(-1, -1)] * prefix + spans[first:first + width] + [(-1, -1)])
            samples.append(n)
    longest = max(len(r) for r in rows) + int(rng.integers(0, 3))  # padding past the longest window
    offsets = np.full((len(rows), longest, 2), -1, dtype=np.int64)
    for w, r in enumerate(rows):
        offsets[w, : len(r)] = r
    return offsets, np.asarray(samples)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("which", ["start", "end"])
def test_carry_equals_the_per_character_reference(seed, which):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 60, size=6)
    t_off, t_samples = _windows(rng, [_tokenize(rng, n) for n in lengths], width=6, prefix=3)
    s_off, s_samples = _windows(rng, [_tokenize(rng, n) for n in lengths], width=5, prefix=2)
    logits = rng.normal(size=t_off.shape[:2]) * 3
    real = np.arange(t_off.shape[1])[None, :] < (t_off.shape[1] - rng.integers(0, 2, size=len(t_off)))[:, None]
    probs = np.where(real, np.exp(logits), 0.0)
    probs /= probs.sum(axis=1, keepdims=True)
    fast = carry(probs, t_off, t_samples, s_off, s_samples, lengths, which)
    slow = carry_reference(probs, t_off, t_samples, s_off, s_samples, lengths, which)
    np.testing.assert_allclose(fast[0], slow[0], atol=1e-6, rtol=0)
    np.testing.assert_allclose(fast[1], slow[1], atol=1e-6, rtol=0)
    # each student window's distribution (its tokens plus what goes to [CLS]) sums to one
    np.testing.assert_allclose(fast[0].sum(axis=1) + fast[1], 1.0, atol=1e-9)


def test_same_tokens_carry_the_distribution_unchanged():
    """One window, the same tokens on both sides: the student gets exactly the teacher's distribution."""
    offsets = np.array([[[-1, -1], [0, 3], [4, 7], [8, 10], [-1, -1]]])
    probs = np.array([[0.1, 0.2, 0.3, 0.25, 0.15]])
    for which in ("start", "end"):
        mass, rest = carry(probs, offsets, [0], offsets, [0], [10], which)
        np.testing.assert_allclose(mass[0], [0, 0.2, 0.3, 0.25, 0], atol=1e-12)
        np.testing.assert_allclose(rest, [0.25], atol=1e-12)


def test_a_coarser_student_token_gathers_its_pieces():
    # teacher: "play" "ing" ; student: "playing"
    t_off = np.array([[[0, 4], [4, 7]]])
    s_off = np.array([[[0, 7]]])
    probs = np.array([[0.7, 0.3]])
    assert carry(probs, t_off, [0], s_off, [0], [7], "start")[0][0, 0] == pytest.approx(1.0)
    assert carry(probs, t_off, [0], s_off, [0], [7], "end")[0][0, 0] == pytest.approx(1.0)


@pytest.mark.parametrize("teacher_family,student_family", [("bert", "roberta"), ("roberta", "electra")])
def test_a_confident_teacher_points_the_student_at_the_same_answer(tiny_family, tmp_path, teacher_family,
                                                                  student_family):
    """Real tokenizers (WordPiece, byte-level BPE with its leading-space tokens): a teacher sure of the answer's
    first and last token makes the student's carried distribution peak on its own tokens of that answer."""
    import datasets
    from transformers import AutoTokenizer

    from distillery.data.encode import squad_window_offsets

    context = "london is a city on a river . the river is the thames and it is long ."
    answer = "the thames"
    start_char = context.index(answer)
    end_char = start_char + len(answer)
    raw = datasets.Dataset.from_dict({"question": ["which river ?"], "context": [context]})
    t_tok, s_tok = (AutoTokenizer.from_pretrained(tiny_family(f, 2)) for f in (teacher_family, student_family))
    t, s = (squad_window_offsets(raw, tok, 20, 4) for tok in (t_tok, s_tok))
    assert len(t["sample"]) > 1 and len(s["sample"]) > 1  # several windows on both sides
    for which, char in (("start", start_char), ("end", end_char)):
        probs = np.zeros(t["offsets"].shape[:2])
        for w in range(len(probs)):  # each teacher window: all mass on the answer's token, or [CLS] without it
            a, b = t["offsets"][w, :, 0], t["offsets"][w, :, 1]
            hit = np.flatnonzero((a == char) if which == "start" else (b == char))
            probs[w, hit[0] if len(hit) else t["cls"][w]] = 1.0
        mass, rest = carry(probs, t["offsets"], t["sample"], s["offsets"], s["sample"], t["context_lengths"], which)
        for v in range(len(mass)):
            a, b = s["offsets"][v, :, 0], s["offsets"][v, :, 1]
            own = np.flatnonzero((a <= start_char) & (b > start_char)) if which == "start" else \
                np.flatnonzero((a < end_char) & (b >= end_char))
            if len(own):  # the window holds the answer: its peak is the student's own answer token
                assert mass[v].argmax() == own[0] and mass[v].max() > rest[v]
