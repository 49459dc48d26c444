"""Issue 55: embedders scored on rows the benchmark's dev split does not hold, for choosing a recipe without tuning to
dev: Spearman of the cosines on STS-B TRAIN pairs 0..1999 (no embedder run trains on STS-B) and retrieval (MRR@10,
distillery's metric) of SQuAD v1.1 dev questions 3000..4499 among their paragraphs (benchmarks/embedding.py with
``data.dev_limit=1500`` scores the first 1,500).

    python benchmarks/embedding_heldout.py --data-dir ../shared/data --label "16,000 sentences" RUN/student ...

Each folder is loaded as sentence-transformers loads it (after ``distillery.register_models()``), at 128 tokens. One
record per folder goes to benchmarks/results/embedding-heldout.json (folder, label, scores, hardware).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from common import RESULTS, upsert_record

STS_ROWS = range(0, 2000)
SQUAD_QUESTIONS = range(3000, 4500)


def held_out_rows(data_dir: Path):
    """(STS-B train pairs with their scores, SQuAD questions with the index of their paragraph, the paragraphs),
    read by distillery's own loaders."""
    from distillery.config import DataConfig
    from distillery.data.loading import load_raw
    from distillery.data.tasks import get_task

    config = DataConfig(data_dir=str(data_dir))
    sts = load_raw(get_task("stsb"), "train", config).select(STS_ROWS)
    pairs = list(zip(sts["text"], sts["text_pair"], sts["label"]))
    squad = load_raw(get_task("squad"), "dev", config).select(SQUAD_QUESTIONS)
    paragraphs = list(dict.fromkeys(squad["context"]))
    where = {c: i for i, c in enumerate(paragraphs)}
    return pairs, [(q, where[c]) for q, c in zip(squad["question"], squad["context"])], paragraphs


def scores(folder: str, pairs, questions, paragraphs) -> dict[str, float]:
    from sentence_transformers import SentenceTransformer

    from distillery.metrics import retrieval_scores, sts_correlations

    model = SentenceTransformer(folder, device="cpu")
    model.max_seq_length = 128
    encode = lambda texts: model.encode(list(texts), batch_size=64, convert_to_numpy=True)  # noqa: E731
    sts = sts_correlations(encode(a for a, _, _ in pairs), encode(b for _, b, _ in pairs),
                           np.array([s for _, _, s in pairs]))
    found = retrieval_scores(encode(q for q, _ in questions), encode(paragraphs), np.array([i for _, i in questions]))
    return {"sts_spearman": sts["sts_spearman"], "mrr_at_10": found["mrr_at_10"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", help="Embedder folders (a run's student/, the teacher's folder).")
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--label", default="", help="What the folders are, for the record (the recipe, the text).")
    parser.add_argument("--results", default=str(RESULTS / "embedding-heldout.json"))
    args = parser.parse_args(argv)
    import distillery
    from distillery.bench import hardware_fingerprint

    distillery.register_models()
    rows = held_out_rows(Path(args.data_dir))
    for folder in args.folders:
        record = {"folder": folder, "label": args.label, **scores(folder, *rows), "hardware": hardware_fingerprint()}
        upsert_record(Path(args.results), record, lambda r: (r["folder"], r["label"]))
        print(f"{folder}: STS-B train Spearman {record['sts_spearman']:.4f}, MRR@10 {record['mrr_at_10']:.4f}")


if __name__ == "__main__":
    main()
