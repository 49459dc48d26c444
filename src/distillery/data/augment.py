"""TinyBERT's data augmentation (Jiao et al. 2020, Algorithm 1): each example yields N new ones in which
every word is replaced, with probability p_t, by one of K candidates drawn at random.

A word's candidates: where a masked language model is given, the MLM's top-K predictions for the word
masked in its sentence when the word is one word piece, and its K nearest neighbours in a word-embedding
table when it is several; without an MLM (the built-in teacher has no MLM head), the nearest neighbours in
the teacher's own input embeddings serve for every word. Neighbours are whole-word vocabulary entries
(letters only, no '##' pieces, no special tokens), by cosine, never the word itself.

A tagger's sentences (lists of words) are augmented as their words joined by spaces and cut back into the same
words (:func:`augment_words`): a candidate is one whole word, so each word keeps the place its tag has.

The new text is cached under ``$DISTILLERY_CACHE/augment`` by its content (source, settings, seed and
the original texts), in parts written as they are done, so a second run and a killed run resumed read
them instead of augmenting again. Labels are not part of it: the teacher labels every new example.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from distillery.errors import DistilleryError
from distillery.folders import atomic_file

logger = logging.getLogger("distillery")

P_T = 0.4  # the paper's threshold probability of replacing a word
K = 15  # candidates per word
PART = 256  # originals per cached part: what a killed run loses at most
MLM_BATCH = 64
DRAWS = "one draw per distinct word of an example"  # how versions are drawn: part of the cache key
WORD = re.compile(r"[^\W\d_]+")  # a run of letters: numbers and punctuation are kept as they are
WHOLE_WORD = re.compile(r"^[^\W\d_]{2,}$")
WORD_START = ("Ġ", "▁")  # how byte-level BPE and SentencePiece vocabularies mark a word's first piece


@dataclass
class WordSource:
    """Where a word's candidates come from: ``tokenizer`` and its input ``embeddings`` (vocab, dim), and the
    masked LM ``mlm`` (same tokenizer) or None. ``name`` is what the report says."""

    name: str
    tokenizer: Any
    embeddings: torch.Tensor
    mlm: Any = None

    def __post_init__(self) -> None:
        self.embeddings = self.embeddings.detach().float().cpu()  # the neighbour search runs on the CPU
        vocab = self.tokenizer.get_vocab()
        specials = set(self.tokenizer.all_special_ids)
        size = self.embeddings.shape[0]
        # A byte-level BPE or SentencePiece vocabulary marks a word's first piece (Ġword, ▁word); WordPiece
        # marks the others (##ing). A whole word is a first piece of letters only.
        marked = any(tok[:1] in WORD_START for tok in vocab)
        forms = {i: tok[1:] if marked else tok for tok, i in vocab.items()
                 if i < size and i not in specials and (not marked or tok[:1] in WORD_START)}
        ids = sorted(i for i, form in forms.items() if WHOLE_WORD.match(form))
        if not ids:
            raise DistilleryError(f"The augmentation source ({self.name}) has no whole words in its vocabulary; "
                                  "give a masked LM with --augment-model.")
        self.word_ids = torch.tensor(ids)
        self.words = [forms[i] for i in ids]
        self.unit = torch.nn.functional.normalize(self.embeddings[self.word_ids], dim=-1)  # (n, dim)
        self.allowed = torch.zeros(size, dtype=torch.bool)
        self.allowed[self.word_ids] = True
        self.same: dict[str, list[int]] = {}  # a word (lower case) -> its columns among the whole words
        for column, form in enumerate(self.words):
            self.same.setdefault(form.lower(), []).append(column)

    def digest(self) -> str:
        """What the candidates depend on: the embeddings and, for a masked LM, every weight of it (a changed
        head with the same embeddings gives other predictions)."""
        h = hashlib.sha256(f"{self.name} {self.mlm is not None}".encode() + self.embeddings.numpy().tobytes())
        if self.mlm is not None:
            for name, tensor in sorted(self.mlm.state_dict().items()):
                h.update(name.encode() + tensor.detach().float().cpu().numpy().tobytes())
        return h.hexdigest()[:16]

    def pieces(self, word: str) -> list[int]:
        # after a space, as inside a sentence: a BPE vocabulary's word-initial piece (Ġword)
        return self.tokenizer.convert_tokens_to_ids(self.tokenizer.tokenize(" " + word))

    def neighbours(self, words: Sequence[str], k: int) -> dict[str, list[str]]:
        """The ``k`` nearest whole words of each word (mean of its pieces' embeddings, cosine), one matmul."""
        if not words:
            return {}
        pieces = [self.pieces(w) or [self.tokenizer.unk_token_id] for w in words]
        flat = torch.tensor([p for ps in pieces for p in ps])
        offsets = torch.tensor([0] + [len(ps) for ps in pieces[:-1]]).cumsum(0)
        vectors = torch.nn.functional.embedding_bag(flat, self.embeddings, offsets, mode="mean")
        sims = torch.nn.functional.normalize(vectors, dim=-1) @ self.unit.T  # (words, n_words)
        # neither the word itself nor, for a word of several pieces, one of its pieces (un-, watch for unwatchable)
        own = [{w.lower()} | ({t.lstrip("#" + "".join(WORD_START)).lower() for t in self.tokenizer.convert_ids_to_tokens(ps)}
                              if len(ps) > 1 else set()) for w, ps in zip(words, pieces)]
        rows = [(row, col) for row, forms in enumerate(own) for form in forms for col in self.same.get(form, [])]
        if rows:
            sims[tuple(torch.tensor(rows).T)] = -2.0
        top = sims.topk(min(k, sims.shape[1]), dim=-1).indices.tolist()
        return {w: [self.words[c] for c in cols] for w, cols in zip(words, top)}

    @torch.no_grad()
    def predictions(self, masked: list[tuple[str, int, int]], k: int) -> list[list[str]]:
        """The MLM's top-``k`` whole words for each (text, character start, character end) masked, in batches."""
        out: list[list[str]] = []
        device = next(self.mlm.parameters()).device
        for start in range(0, len(masked), MLM_BATCH):
            chunk = masked[start:start + MLM_BATCH]
            texts = [t[:a] + self.tokenizer.mask_token + t[b:] for t, a, b in chunk]
            enc = self.tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
            logits = self.mlm(**{k_: v.to(device) for k_, v in enc.items()}).logits.float().cpu()  # (b, len, vocab)
            rows, cols = (enc["input_ids"] == self.tokenizer.mask_token_id).nonzero(as_tuple=True)
            picked = torch.full((len(chunk), logits.shape[-1]), float("-inf"))
            picked[rows] = logits[rows, cols]  # truncated-away masks keep -inf and give no candidates
            picked[:, ~self.allowed[: logits.shape[-1]]] = float("-inf")
            itself = [(row, int(self.word_ids[c])) for row, (t, a, b) in enumerate(chunk)
                      for c in self.same.get(t[a:b].lower(), [])]
            if itself:  # the word itself is no candidate
                picked[tuple(torch.tensor(itself).T)] = float("-inf")
            values, ids = picked.topk(k, dim=-1)
            form = dict(zip(self.word_ids.tolist(), self.words))
            out += [[form[i] for i, v in zip(r, vs) if v > float("-inf")] for r, vs in zip(ids.tolist(), values.tolist())]
        return out


def _cased(candidate: str, word: str) -> str:
    if word.isupper() and len(word) > 1:
        return candidate.upper()
    return candidate[:1].upper() + candidate[1:] if word[:1].isupper() else candidate


def candidates(texts: Sequence[str], source: WordSource, k: int = K) -> list[list[tuple[int, int, list[str]]]]:
    """For each text, its words as (start, end, candidates), the MLM asked once per single-piece word."""
    spans = [[(m.start(), m.end()) for m in WORD.finditer(t)] for t in texts]
    words = sorted({t[a:b] for t, s in zip(texts, spans) for a, b in s})
    single = {w for w in words if len(source.pieces(w)) == 1} if source.mlm is not None else set()
    table = source.neighbours([w for w in words if w not in single], k)
    masked = [(t, a, b) for t, s in zip(texts, spans) for a, b in s if t[a:b] in single]
    predicted = iter(source.predictions(masked, k) if masked else [])
    out = []
    for t, s in zip(texts, spans):
        out.append([(a, b, next(predicted) if t[a:b] in single else table[t[a:b]]) for a, b in s])
    return out


def augment_texts(texts: Sequence[str], source: WordSource, n: int, rng: np.random.Generator, p: float = P_T,
                  k: int = K) -> list[list[str]]:
    """``n`` new versions of each text: each word replaced with probability ``p`` by a random candidate."""
    return [[version[0] for version in versions] for versions in _versions([texts], source, n, rng, p, k)]


def augment_pairs(texts: Sequence[str], pairs: Sequence[str], source: WordSource, n: int, rng: np.random.Generator,
                  p: float = P_T, k: int = K) -> list[list[tuple[str, str]]]:
    """``n`` new versions of each sentence pair, both sides augmented. A word found on both sides is replaced the
    same way on both: a paraphrase or entailment pair rests on the words its sides share, and independent draws
    turned most of MRPC's paraphrases into non-paraphrases in the teacher's eyes (79 % positive on the originals,
    47 % on pairs augmented side by side)."""
    return _versions([texts, pairs], source, n, rng, p, k)


def augment_words(sentences: Sequence[Sequence[str]], source: WordSource, n: int, rng: np.random.Generator,
                  p: float = P_T, k: int = K) -> list[list[list[str]]]:
    """``n`` new versions of each sentence of words (a tagger's rows), one word for one word: the sentence is read
    as its words joined by spaces, and a replaced word's letters become a candidate, a whole word of letters only,
    so no word splits or merges and each keeps the place its tag has."""
    texts = [" ".join(words) for words in sentences]
    out = []
    for words, text, versions in zip(sentences, texts, _drawn([texts], source, n, rng, p, k)):
        starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]]).tolist()
        out.append([[_render(text, swaps, s, s + len(w)) for w, s in zip(words, starts)] for (swaps,) in versions])
    return out


def _versions(sides: list[Sequence[str]], source: WordSource, n: int, rng: np.random.Generator, p: float,
              k: int) -> list[list[tuple[str, ...]]]:
    """``n`` versions of each example (one text per side): :func:`_drawn`'s replacements applied."""
    return [[tuple(_render(text, swaps) for text, swaps in zip(texts, version)) for version in versions]
            for texts, versions in zip(zip(*sides), _drawn(sides, source, n, rng, p, k))]


def _drawn(sides: list[Sequence[str]], source: WordSource, n: int, rng: np.random.Generator, p: float,
           k: int) -> list[list[list[list[tuple[int, int, str]]]]]:
    """For each example, ``n`` versions of it as the words each side replaces, (start, end, new word) in order:
    one draw per distinct word of the example (case aside), whose candidates are those of its first occurrence,
    applied wherever the word occurs."""
    words = [candidates(side, source, k) for side in sides]
    result = []
    for texts, spans in zip(zip(*sides), zip(*words)):
        keys = [[t[a:b].lower() for a, b, _ in s] for t, s in zip(texts, spans)]
        first: dict[str, list[str]] = {}
        for key_list, side_spans in zip(keys, spans):
            for key, (_, _, cands) in zip(key_list, side_spans):
                first.setdefault(key, cands)
        column = {key: j for j, key in enumerate(first)}
        replace = rng.random((n, len(first))) < p  # (n, distinct words)
        choice = rng.integers(0, k, size=(n, len(first)))
        versions = []
        for i in range(n):
            version = []
            for text, key_list, side_spans in zip(texts, keys, spans):
                swaps = []
                for key, (a, b, _) in zip(key_list, side_spans):
                    j, cands = column[key], first[key]
                    if replace[i, j] and cands:
                        swaps.append((a, b, _cased(cands[choice[i, j] % len(cands)], text[a:b])))
                version.append(swaps)
            versions.append(version)
        result.append(versions)
    return result


def _render(text: str, swaps: list[tuple[int, int, str]], start: int = 0, end: int | None = None) -> str:
    """``text[start:end]`` with the replacements ``swaps`` (start, end, new word; in order) that lie inside it."""
    end = len(text) if end is None else end
    pieces, last = [], start
    for a, b, word in swaps:
        if start <= a and b <= end:
            pieces += [text[last:a], word]
            last = b
    return "".join(pieces) + text[last:end]


def augmented_rows(texts: Sequence[str], pairs: Sequence[str] | None, source: WordSource, n: int, seed: int,
                   cache: Path, p: float = P_T, k: int = K) -> dict[str, list[str]]:
    """``n`` new examples per original (``texts``, and ``pairs`` for a pair task, both sides augmented
    and kept aligned), as columns ``text`` (and ``text_pair``), read from or written to the cache
    folder ``cache`` part by part. Deterministic for ``seed``."""
    # the part size too: a part's file holds the rows of its PART originals
    key = [DRAWS, source.digest(), n, p, k, seed, PART, list(texts), list(pairs or [])]

    def part(start: int, end: int, rng: np.random.Generator) -> list[list[str]]:
        if pairs is None:
            return [[version] for versions in augment_texts(texts[start:end], source, n, rng, p, k)
                    for version in versions]
        return [list(version) for versions in augment_pairs(texts[start:end], pairs[start:end], source, n, rng, p, k)
                for version in versions]

    return _in_parts(key, len(texts), n, seed, cache, ["text"] + (["text_pair"] if pairs is not None else []), part)


def augmented_word_rows(sentences: Sequence[Sequence[str]], source: WordSource, n: int, seed: int, cache: Path,
                        p: float = P_T, k: int = K) -> dict[str, list[list[str]]]:
    """``n`` new sentences of words per original (:func:`augment_words`, a word for a word), as a column ``tokens``,
    cached as :func:`augmented_rows` caches its texts. Deterministic for ``seed``."""
    key = ["words", DRAWS, source.digest(), n, p, k, seed, PART, [list(s) for s in sentences]]

    def part(start: int, end: int, rng: np.random.Generator) -> list[list[list[str]]]:
        return [[version] for versions in augment_words(sentences[start:end], source, n, rng, p, k)
                for version in versions]

    return _in_parts(key, len(sentences), n, seed, cache, ["tokens"], part)


def _in_parts(key: list, originals: int, n: int, seed: int, cache: Path, names: list[str], make) -> dict[str, list]:
    """The columns ``names`` of ``n`` new rows per original, made ``PART`` originals at a time by ``make(start, end,
    rng)`` (one row a list of the columns' values) and cached under ``cache`` by the content ``key``: read back where
    a part is there (a second run, a killed run resumed), else made and written whole."""
    from tqdm.auto import tqdm

    folder = cache / hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    columns: dict[str, list] = {name: [] for name in names}
    bar = tqdm(total=originals, desc=f"augmenting x{n}", unit="example", leave=False)
    for part, start in enumerate(range(0, originals, PART)):
        end = min(start + PART, originals)
        path = folder / f"part-{part:05d}.json"
        rows = _read_part(path, n * (end - start))
        if rows is None:
            rows = make(start, end, np.random.default_rng([seed, part]))
            with atomic_file(path, "w") as f:  # a killed run leaves whole parts only
                json.dump(rows, f)
        for row in rows:
            for column, value in zip(columns.values(), row):
                column.append(value)
        bar.update(end - start)
    bar.close()
    return columns


def _read_part(path: Path, rows_expected: int) -> list | None:
    if not path.is_file():
        return None
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(rows, list) or len(rows) != rows_expected:
            raise ValueError("not a list of the part's rows")
        return rows
    except (ValueError, OSError):
        logger.warning("The cached augmented text %s is damaged; it is augmented again.", path)
        path.unlink(missing_ok=True)
        return None
