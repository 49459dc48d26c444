"""Task metrics: GLUE-style classification/regression scores, the official SQuAD EM/F1, and seqeval's entity
scores of token classification (NER).

Classification, regression and token-classification scores are fractions in [0, 1] (correlations in [-1, 1]), as
scikit-learn, scipy and seqeval return them; SQuAD scores are percentages (×100), as the official
evaluation scripts print them.
"""

from __future__ import annotations

import collections
import math
import re
import string
import warnings
from typing import Any, Iterable

import numpy as np


def compute_metrics(task, predictions, labels) -> dict[str, float]:
    """Every metric of ``task`` (a ``TaskSpec``: its ``metrics``, ``num_labels``) for class ids (classification)
    or scores (regression); SQuAD's are :func:`squad_metrics`.

    Degenerate inputs never give NaN: a constant prediction has correlation 0.0, F1 with no
    predicted positives is 0.0, MCC of a constant is 0.0.
    """
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    predictions = np.asarray(predictions)
    labels = np.asarray(labels)
    if predictions.shape[0] != labels.shape[0]:
        raise ValueError(f"{predictions.shape[0]} predictions for {labels.shape[0]} labels")
    out: dict[str, float] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn/scipy warn on degenerate inputs; we define those cases
        for name in task.metrics:
            if name == "accuracy":
                value = accuracy_score(labels, predictions)
            elif name == "f1":
                value = f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0)
            elif name == "macro_f1":
                value = f1_score(
                    labels, predictions, labels=list(range(task.num_labels)), average="macro", zero_division=0
                )
            elif name == "mcc":
                value = matthews_corrcoef(labels, predictions)
            elif name in ("pearson", "spearman"):
                x, y = predictions.astype(np.float64).ravel(), labels.astype(np.float64).ravel()
                if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
                    value = 0.0
                else:
                    value = (pearsonr if name == "pearson" else spearmanr)(x, y)[0]
            else:
                raise ValueError(f"unknown metric {name!r} for task {task.name}")
            value = float(value)
            out[name] = 0.0 if not np.isfinite(value) else value
    return out


# --- SQuAD (official evaluate-v1.1.py / evaluate-v2.0.py logic) --------------------------------


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles (a, an, the) and extra whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _f1(prediction: str, gold: str, version_2: bool) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        # v2: two empty answers agree fully (a correct "no answer"); v1 has no such rule.
        return float(version_2 and pred_tokens == gold_tokens)
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _exact(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def squad_metrics(predictions: dict[str, str], examples: Iterable[dict], version_2: bool) -> dict[str, float]:
    """EM and F1 (×100) over ``examples`` (rows with ``id`` and ``answers``), max over gold answers.

    v1: gold answers as given. v2: gold answers that normalise to nothing are dropped and a
    question with none left has the single gold answer "" (unanswerable), and the scores are also
    broken down into HasAns_* / NoAns_* where such questions exist. A question without a
    prediction scores 0.
    """
    exact, f1, has_answer = [], [], []
    for example in examples:
        golds = list(example["answers"]["text"])
        if version_2:
            golds = [g for g in golds if normalize_answer(g)] or [""]
        prediction = predictions.get(example["id"])
        if prediction is None:
            exact.append(0.0), f1.append(0.0)
        else:
            exact.append(max(_exact(prediction, g) for g in golds))
            f1.append(max(_f1(prediction, g, version_2) for g in golds))
        has_answer.append(golds != [""])
    if not exact:
        raise ValueError("squad_metrics needs at least one example")
    exact_a, f1_a, has = np.array(exact), np.array(f1), np.array(has_answer, dtype=bool)
    out = {"exact_match": 100.0 * exact_a.mean(), "f1": 100.0 * f1_a.mean()}
    if version_2:
        for prefix, mask in (("HasAns", has), ("NoAns", ~has)):
            if mask.any():
                out[f"{prefix}_exact"] = 100.0 * exact_a[mask].mean()
                out[f"{prefix}_f1"] = 100.0 * f1_a[mask].mean()
    return {k: float(v) for k, v in out.items()}


# --- token classification (seqeval) -------------------------------------------------------------------

ENTITY_METRICS = ("entity_f1", "entity_precision", "entity_recall", "token_accuracy")
OUTSIDE = "O"  # the IOB tag of a word outside every entity (a word cut off by the length is predicted so)


def iob_problem(tag: str) -> str | None:
    """Why ``tag`` is not an IOB tag (``O``, ``B-TYPE``, ``I-TYPE``), or None when it is one. ``I-`` after ``O``
    is one (seqeval counts it as the start of an entity)."""
    if tag == OUTSIDE:
        return None
    prefix, dash, kind = tag.partition("-")
    if not dash or prefix not in ("B", "I") or not kind:
        return f"tag {tag!r} is not an IOB tag (O, B-TYPE or I-TYPE)"
    return None


def tag_names(tags) -> tuple[str, ...]:
    """The tag set of a task read from its data: ``O`` first, then ``B-`` and ``I-`` of every entity type that
    occurs (both, whichever the data has), sorted."""
    kinds = {t.partition("-")[2] for t in tags if t != OUTSIDE}
    return (OUTSIDE, *sorted(f"{p}-{k}" for k in kinds for p in ("B", "I")))

# prefixes of an entity type's scores: "f1_PER", "precision_PER" and "recall_PER" are those of the type PER
ENTITY_TYPE_SCORES = {"f1-score": "f1_", "precision": "precision_", "recall": "recall_"}


def entity_metrics(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
    """Entity-level precision, recall and F1 over all entities (seqeval's micro average, its default mode: the
    CoNLL-2003 ``conlleval`` definition, where ``I-X`` after ``O`` starts an entity), the same of each entity type
    (``f1_PER``, ``precision_PER``, ``recall_PER``, ...), and the share of words whose tag is right (``token_accuracy``). ``gold`` and
    ``predicted``: one list of IOB tags a sentence, as long as each other. A set with no entity at all, gold or
    predicted, scores 0.0, never NaN."""
    from seqeval.metrics import classification_report

    if len(gold) != len(predicted) or any(len(g) != len(p) for g, p in zip(gold, predicted)):
        raise ValueError("every sentence needs one predicted tag a gold tag")
    flat_gold = np.asarray([t for s in gold for t in s], dtype=object)
    flat_pred = np.asarray([t for s in predicted for t in s], dtype=object)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seqeval warns on types with no predicted or gold entity: those score 0
        report = classification_report(gold, predicted, output_dict=True, zero_division=0)
    micro = report.get("micro avg", {})
    out = {"entity_f1": micro.get("f1-score", 0.0), "entity_precision": micro.get("precision", 0.0),
           "entity_recall": micro.get("recall", 0.0),
           "token_accuracy": float((flat_gold == flat_pred).mean()) if flat_gold.size else 0.0}
    for name, row in report.items():
        if not name.endswith(" avg"):
            out.update({f"{prefix}{name}": row[field] for field, prefix in ENTITY_TYPE_SCORES.items()})
    return {k: 0.0 if not np.isfinite(float(v)) else float(v) for k, v in out.items()}



# --- sentence embeddings (the embedding kind) -----------------------------------------------------------------

EMBEDDING_METRICS = ("sts_spearman", "sts_pearson", "mrr_at_10", "recall_at_1", "recall_at_10")


def pair_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The cosine of each pair of sentence vectors (``a[i]``, ``b[i]``), in float64."""
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return np.einsum("ij,ij->i", a.astype(np.float64), b.astype(np.float64))


def sts_correlations(a: np.ndarray, b: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """Spearman and Pearson correlation of the cosine of each pair of sentence vectors (``a[i]``, ``b[i]``) with
    its gold similarity score (STS-B's), as sentence-transformers' EmbeddingSimilarityEvaluator reports them."""
    return cosine_correlations(pair_cosines(a, b), gold)


def cosine_correlations(cosine: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """:func:`sts_correlations` of the pairs' cosines (:func:`pair_cosines`)."""
    from scipy.stats import pearsonr, spearmanr

    cosine, gold = np.asarray(cosine, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if len(cosine) < 2 or np.ptp(cosine) == 0 or np.ptp(gold) == 0:  # a constant: no correlation, never NaN
        return {"sts_spearman": 0.0, "sts_pearson": 0.0}
    return {"sts_spearman": float(spearmanr(cosine, gold)[0]), "sts_pearson": float(pearsonr(cosine, gold)[0])}


def gold_ranks(queries: np.ndarray, passages: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Each query's rank of its ``gold`` passage among all ``passages`` by cosine (1: first), in one matrix product.
    A tie with the gold passage counts against it (the rank is the number of passages scored at least as high, the
    gold passage included)."""
    q = queries / np.maximum(np.linalg.norm(queries, axis=1, keepdims=True), 1e-12)
    p = passages / np.maximum(np.linalg.norm(passages, axis=1, keepdims=True), 1e-12)
    similarity = q.astype(np.float32) @ p.astype(np.float32).T  # (queries, passages)
    gold = np.asarray(gold, dtype=np.int64)
    own = similarity[np.arange(len(gold)), gold]
    return (similarity >= own[:, None]).sum(axis=1)


def reciprocal_ranks(rank: np.ndarray, k: int = 10) -> np.ndarray:
    """1 / rank within the first ``k`` (:func:`gold_ranks`), 0 past it: each query's share of MRR@k."""
    return np.where(rank <= k, 1.0 / rank, 0.0)


def retrieval_scores(queries: np.ndarray, passages: np.ndarray, gold: np.ndarray, k: int = 10) -> dict[str, float]:
    """Each query (row of ``queries``) against every passage by cosine: the mean reciprocal rank of its ``gold``
    passage (an index into ``passages``; its rank by :func:`gold_ranks`) within the first ``k`` (0 past it), and
    recall at 1 and at ``k`` (the gold passage among the first 1 or ``k``)."""
    rank = gold_ranks(queries, passages, gold)
    return {"mrr_at_10": float(reciprocal_ranks(rank, k).mean()) if len(rank) else 0.0,
            "recall_at_1": float((rank <= 1).mean()) if len(rank) else 0.0,
            "recall_at_10": float((rank <= k).mean()) if len(rank) else 0.0}


# Where each score this module computes lies (the module docstring): rates are fractions, correlations
# (MCC, Pearson, Spearman) in [-1, 1], SQuAD's scores percentages, its F1 too. A run file's score outside its
# range was damaged or edited by hand (run_record refuses it).
FRACTION, CORRELATION, PERCENTAGE = (0.0, 1.0), (-1.0, 1.0), (0.0, 100.0)
SCORE_RANGES = {"accuracy": FRACTION, "f1": FRACTION, "macro_f1": FRACTION, "mcc": CORRELATION,
                "pearson": CORRELATION, "spearman": CORRELATION, **{name: FRACTION for name in ENTITY_METRICS},
                "sts_spearman": CORRELATION, "sts_pearson": CORRELATION,
                **{name: FRACTION for name in ("mrr_at_10", "recall_at_1", "recall_at_10")},
                **{name: PERCENTAGE for name in ("exact_match", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1")}}


def score_range(name: str, squad: bool) -> tuple[float, float] | None:
    """The range of the score ``name`` (None: not one this module computes); ``squad``: a SQuAD score,
    whose F1 is a percentage."""
    if name.startswith(tuple(ENTITY_TYPE_SCORES.values())):
        return FRACTION
    return PERCENTAGE if squad and name == "f1" else SCORE_RANGES.get(name)


def is_finite_number(v: Any) -> bool:
    """A real number read from a run's files: not a bool, a string, None, NaN or infinite."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
