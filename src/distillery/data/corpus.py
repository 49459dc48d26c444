"""Unlabelled text for masked-language-model pretraining and general distillation."""

from __future__ import annotations

from pathlib import Path

import datasets

from distillery.data.files import numbered_lines, regular_file
from distillery.errors import DistilleryError


def read_corpus(paths: list[str | Path], max_lines: int | None = None) -> list[str]:
    """Non-blank lines of plain text files or WikiExtractor output, at most ``max_lines`` of them.

    WikiExtractor wraps each article in ``<doc ...>`` / ``</doc>`` and repeats the title on the line
    after the opening tag; those lines are markup, not prose, and are dropped.
    """
    if max_lines is not None and max_lines < 1:  # 0 would still read one line, and the corpus be blamed for it
        raise DistilleryError(f"--max-lines must be at least 1 (or not given: every line), got {max_lines}.")
    if isinstance(paths, (str, Path)):
        paths = [paths]
    lines: list[str] = []
    for path in map(Path, paths):
        regular_file(path, "Corpus file")  # a device such as /dev/zero would be read forever
        title_next = False
        for _, line in numbered_lines(path):  # a line that is not UTF-8 is refused with its number
            line = line.strip()
            if line.startswith("<doc ") or line == "<doc>":
                title_next = True
                continue
            if line == "</doc>":
                title_next = False
                continue
            if not line:
                continue
            if title_next:
                title_next = False
                continue
            lines.append(line)
            if max_lines is not None and len(lines) >= max_lines:
                return lines
    if not lines:
        raise DistilleryError(f"No text found in {', '.join(map(str, paths))}.")
    return lines


def mlm_dataset(tokenizer, texts: list[str], max_length: int) -> datasets.Dataset:
    """Pack ``texts`` into blocks of ``max_length`` tokens: [CLS] tokens... [SEP].

    Lines are tokenized without special tokens, concatenated, and cut into equal blocks (the last,
    shorter block of each map batch is kept), so no compute is spent on padding.
    """
    if max_length < 8:
        raise DistilleryError(f"max_length must be at least 8 for MLM blocks, got {max_length}.")
    cls = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    sep = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    body = max_length - 2

    def pack(batch):
        ids = tokenizer(batch["text"], add_special_tokens=False, return_attention_mask=False)["input_ids"]
        stream = [t for line in ids for t in line]
        blocks = [[cls] + stream[i : i + body] + [sep] for i in range(0, len(stream), body)]
        return {"input_ids": blocks, "attention_mask": [[1] * len(b) for b in blocks]}

    raw = datasets.Dataset.from_dict({"text": list(texts)})
    return raw.map(pack, batched=True, batch_size=1000, remove_columns=["text"])


def mlm_collator(tokenizer, mlm_probability: float = 0.15):
    """BERT masking: ``mlm_probability`` of tokens chosen, 80% [MASK], 10% random, 10% kept."""
    from transformers import DataCollatorForLanguageModeling

    if tokenizer.mask_token_id is None:
        raise DistilleryError(f"{type(tokenizer).__name__} has no mask token, so it cannot be used for MLM.")
    return DataCollatorForLanguageModeling(
        tokenizer, mlm=True, mlm_probability=mlm_probability, mask_replace_prob=0.8, random_replace_prob=0.1
    )
