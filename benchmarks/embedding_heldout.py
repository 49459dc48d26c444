"""Issue 55: embedders scored on rows the benchmark's dev split does not hold, for choosing a recipe without tuning to
dev: Spearman of the cosines on STS-B TRAIN pairs 0..1999 (no embedder run trains on STS-B) and retrieval (MRR@10,
distillery's metric) of SQuAD v1.1 dev questions 3000..4499 among their paragraphs (benchmarks/embedding.py with
``data.dev_limit=1500`` scores the first 1,500).

    python benchmarks/embedding_heldout.py --data-dir ../shared/data --label "16,000 sentences" RUN/student ...

Each folder is loaded as sentence-transformers loads it (after ``distillery.register_models()``), an export folder
(its ``model.onnx`` or int8 weights, with the pooling) through ``distillery.runtime.load_export``, at 128 tokens. One
record per folder goes to benchmarks/results/embedding-heldout.json (folder, label, scores, hardware). With
``--against TEACHER`` each record also gets its share of the teacher's scores on the same rows and a paired
bootstrap's 95 % interval of it (scipy.stats.bootstrap over the questions, and over the STS-B pairs)::

    python benchmarks/embedding_heldout.py --against TEACHER RUN/student RUN/exports/student-onnx-int8
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from common import RESULTS, upsert_record

STS_ROWS = range(0, 2000)
SQUAD_QUESTIONS = range(3000, 4500)


def question_range(text: str) -> range:
    """``START:END`` (SQuAD dev question indices, END excluded) as a range, checked."""
    try:
        start, end = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--squad-questions {text!r}: give START:END, e.g. 3000:4500") from None
    if not 1500 <= start < end:  # the benchmark's dev rows are the first 1,500
        raise argparse.ArgumentTypeError(f"--squad-questions {text!r}: START must be 1500 or more (the first 1,500 "
                                         "are the benchmark's dev rows) and below END")
    return range(start, end)


def held_out_rows(data_dir: Path, squad_questions: range = SQUAD_QUESTIONS):
    """(STS-B train pairs with their scores, SQuAD questions with the index of their paragraph, the paragraphs),
    read by distillery's own loaders."""
    from distillery.config import DataConfig
    from distillery.data.loading import load_raw
    from distillery.data.tasks import get_task

    config = DataConfig(data_dir=str(data_dir))
    sts = load_raw(get_task("stsb"), "train", config).select(STS_ROWS)
    pairs = list(zip(sts["text"], sts["text_pair"], sts["label"]))
    squad = load_raw(get_task("squad"), "dev", config)
    squad = squad.select(range(squad_questions.start, min(squad_questions.stop, len(squad))))
    paragraphs = list(dict.fromkeys(squad["context"]))
    where = {c: i for i, c in enumerate(paragraphs)}
    return pairs, [(q, where[c]) for q, c in zip(squad["question"], squad["context"])], paragraphs


def encoder(folder: str):
    """texts -> their sentence vectors (numpy), as the folder's model computes them at 128 tokens."""
    if (Path(folder) / "distillery_export.json").is_file():
        import torch
        from transformers import AutoTokenizer

        from distillery.kinds.embedding import sentence_vectors
        from distillery.runtime import load_export

        model, tokenizer = load_export(folder), AutoTokenizer.from_pretrained(folder)

        def encode(texts):
            texts, out = list(texts), []
            for i in range(0, len(texts), 64):
                batch = tokenizer(texts[i:i + 64], padding=True, truncation=True, max_length=128, return_tensors="pt")
                with torch.inference_mode():
                    found = model(**batch)
                out.append(sentence_vectors(found, batch).numpy())
            return np.concatenate(out)
        return encode
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(folder, device="cpu")
    model.max_seq_length = 128
    return lambda texts: model.encode(list(texts), batch_size=64, convert_to_numpy=True)


def per_row(folder: str, pairs, questions, paragraphs) -> dict:
    """The folder's cosine of each STS-B pair, each question's rank of its paragraph, and its vectors of each form
    of text (``vectors``: STS-B sentences, the pairs' first sides; questions; paragraphs)."""
    from distillery.metrics import gold_ranks, pair_cosines

    encode = encoder(folder)
    first, asked, found = encode(a for a, _, _ in pairs), encode(q for q, _ in questions), encode(paragraphs)
    return {"cosines": pair_cosines(first, encode(b for _, b, _ in pairs)),
            "ranks": gold_ranks(asked, found, np.array([i for _, i in questions])),
            "vectors": {"sts_sentences": first, "questions": asked, "paragraphs": found}}


def cosines_to_teacher(rows: dict, teacher: dict) -> dict[str, float]:
    """The mean cosine of the model's vector of each text to the teacher's, by form of text: where a student's
    vectors drift from its teacher's (issue 55: furthest on questions and STS-B's captions)."""
    from distillery.metrics import pair_cosines

    return {form: float(pair_cosines(vectors, teacher["vectors"][form]).mean())
            for form, vectors in rows["vectors"].items()}


def scores(rows: dict[str, np.ndarray], gold: np.ndarray) -> dict[str, float]:
    from distillery.metrics import cosine_correlations, reciprocal_ranks

    return {"sts_spearman": cosine_correlations(rows["cosines"], gold)["sts_spearman"],
            "mrr_at_10": float(reciprocal_ranks(rows["ranks"]).mean())}


def retention(rows: dict[str, np.ndarray], teacher: dict[str, np.ndarray], gold: np.ndarray) -> dict:
    """The model's share of the teacher's STS-B Spearman and MRR@10 on these rows, each with a paired bootstrap's
    95 % interval (the same resampled rows for both)."""
    from scipy.stats import bootstrap, spearmanr

    from distillery.metrics import reciprocal_ranks

    def sts_share(model, taught, gold_scores):
        return spearmanr(model, gold_scores)[0] / spearmanr(taught, gold_scores)[0]

    def mrr_share(model, taught, axis=-1):
        return model.mean(axis=axis) / taught.mean(axis=axis)

    rr, taught_rr = reciprocal_ranks(rows["ranks"]), reciprocal_ranks(teacher["ranks"])
    sts = bootstrap((rows["cosines"], teacher["cosines"], gold), sts_share, paired=True, vectorized=False,
                    n_resamples=1000, method="percentile", random_state=0)
    mrr = bootstrap((rr, taught_rr), mrr_share, paired=True, n_resamples=2000, method="percentile", random_state=0)
    return {"sts_spearman_retention": float(sts_share(rows["cosines"], teacher["cosines"], gold)),
            "sts_spearman_retention_95": [float(sts.confidence_interval.low), float(sts.confidence_interval.high)],
            "mrr_at_10_retention": float(mrr_share(rr, taught_rr)),
            "mrr_at_10_retention_95": [float(mrr.confidence_interval.low), float(mrr.confidence_interval.high)]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", help="Embedder folders (a run's student/, the teacher's folder).")
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--label", default="", help="What the folders are, for the record (the recipe, the text).")
    parser.add_argument("--results", default=str(RESULTS / "embedding-heldout.json"))
    parser.add_argument("--against", help="The teacher's folder: each record also gets its share of the teacher's "
                                          "scores, with a paired bootstrap's 95 % interval.")
    parser.add_argument("--squad-questions", type=question_range, default=SQUAD_QUESTIONS, metavar="START:END",
                        help="The SQuAD dev questions scored (default 3000:4500; the first 1,500 are the "
                             "benchmark's dev rows). Their paragraphs are the retrieval pool.")
    args = parser.parse_args(argv)
    import distillery
    from distillery.bench import hardware_fingerprint

    distillery.register_models()
    pairs, questions, paragraphs = held_out_rows(Path(args.data_dir), args.squad_questions)
    gold = np.array([s for _, _, s in pairs])
    teacher = per_row(args.against, pairs, questions, paragraphs) if args.against else None
    for folder in args.folders:
        rows = per_row(folder, pairs, questions, paragraphs)
        asked = args.squad_questions
        record = {"folder": folder, "label": args.label, **scores(rows, gold),
                  **({} if asked == SQUAD_QUESTIONS else
                     {"squad_questions": [asked.start, asked.start + len(questions)], "paragraphs": len(paragraphs)}),
                  **({"against": args.against, **retention(rows, teacher, gold),
                      "cosine_to_teacher": cosines_to_teacher(rows, teacher)} if teacher else {}),
                  "hardware": hardware_fingerprint()}
        upsert_record(Path(args.results), record, lambda r: (r["folder"], r["label"], tuple(r.get("squad_questions", ()))))
        shares = (f" ({100 * record['sts_spearman_retention']:.1f} % [{100 * record['sts_spearman_retention_95'][0]:.1f}, "
                  f"{100 * record['sts_spearman_retention_95'][1]:.1f}] and {100 * record['mrr_at_10_retention']:.1f} % "
                  f"[{100 * record['mrr_at_10_retention_95'][0]:.1f}, {100 * record['mrr_at_10_retention_95'][1]:.1f}] "
                  f"of the teacher's)") if teacher else ""
        drift = ("; cosine to the teacher's vectors: " + ", ".join(
            f"{form.replace('_', ' ')} {c:.3f}" for form, c in record["cosine_to_teacher"].items())) if teacher else ""
        print(f"{folder}: STS-B train Spearman {record['sts_spearman']:.4f}, MRR@10 {record['mrr_at_10']:.4f}{shares}"
              f"{drift}")


if __name__ == "__main__":
    main()
