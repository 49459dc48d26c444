"""Raw examples for a task: local GLUE TSV / SQuAD JSON, your own CSV/TSV/JSONL, or the Hub.

Every loader returns a ``datasets.Dataset`` with one fixed schema per kind of task:

- classification / regression: ``text``, ``text_pair`` (pair tasks only), ``label`` (class id as
  int64, or float32 for regression);
- QA: ``id``, ``title``, ``context``, ``question``, ``answers`` = {"text": [...], "answer_start": [...]}
  (empty lists for an unanswerable SQuAD v2 question);
- token classification: ``tokens`` (the words of a sentence) and ``tags`` (one tag id a word, an index of the
  task's ``labels``).

Where data comes from: the local folder ``DataConfig.resolved_data_dir`` when there is one, in the
standard layout (``glue/<TASK>/train.tsv``, ``squad/dev-v1.1.json``, ...; the task folder directly
under the data folder, as ``download_glue_data.py`` makes it, works too), else the Hugging Face Hub.
A local folder that lacks a file is an error, never a silent fall back to the Hub.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path

import datasets
import numpy as np

from distillery.config import DataConfig
from distillery.data.tasks import TaskSpec, label_sort_key, custom_label, get_task
from distillery.data.files import check_empty_texts, custom_columns, numbered_lines, read_custom_rows, regular_file
from distillery.data.tokens import (check_file_kind, columns_given, custom_token_task, is_token_file, load_tokens_hub,
                                    ner_folder, read_token_file, read_unlabeled_tokens, token_rows)
from distillery.errors import DistilleryError, listed
from distillery.kinds import TaskKind, kind_of

logger = logging.getLogger("distillery")

SQUAD_FILES = {1: ("train-v1.1.json", "dev-v1.1.json"), 2: ("train-v2.0.json", "dev-v2.0.json")}


def column_values(dataset, name: str) -> list:
    """All values of one column as a list (datasets 4+ returns a lazy, row-by-row Column)."""
    values = dataset[name]
    return values[:] if isinstance(values, datasets.arrow_dataset.Column) else list(values)


def _features(task: TaskSpec) -> datasets.Features:
    return task.kind_object.raw_features(task)


def load_raw(task: TaskSpec, split: str, data_config: DataConfig) -> datasets.Dataset:
    """The raw examples of ``split`` ("train", "dev", or a name in ``task.dev_splits``).

    "dev" is the task's first dev split (MNLI: dev_matched). ``data_config.train_limit`` keeps a
    seeded random subset of the train split (original order kept); ``dev_limit`` keeps the first N
    dev examples. For SQuAD with ``squad_holdout`` set, both splits come from the dev file, split by
    article (see ``squad_holdout_split``).
    """
    split = _canonical_split(task, split)
    if task.kind == "embedding":
        return _load_embedding(task, split, data_config)
    if task.kind == "qa":
        ds = _load_squad(task, split, data_config)
    elif task.kind == "token_classification":
        ds = _load_tokens(task, split, data_config)
    elif task.name == "custom":
        ds = _load_custom(task, split, data_config)
    else:
        ds = _load_glue(task, split, data_config)
    if split == "train" and data_config.train_limit is not None and data_config.train_limit < len(ds):
        rng = np.random.default_rng(data_config.seed)
        keep = np.sort(rng.choice(len(ds), size=data_config.train_limit, replace=False))
        ds = ds.select(keep.tolist())
    if split != "train" and data_config.dev_limit is not None and data_config.dev_limit < len(ds):
        ds = ds.select(range(data_config.dev_limit))
    return ds


def _load_embedding(task: TaskSpec, split: str, data_config: DataConfig) -> datasets.Dataset:
    """The embedding task's rows: no train rows (its texts are the student's new rows, --unlabeled-file); as dev,
    STS-B's dev pairs and SQuAD v1.1's dev questions and paragraphs (``dev_limit``: at most that many of each)."""
    if split == "train":
        return datasets.Dataset.from_dict({"text": [], "label": []}, features=_features(task))
    whole = dataclasses.replace(data_config, dev_limit=None)
    sts = load_raw(get_task("stsb"), "dev", whole)
    return task.kind_object.dev_rows(sts, load_raw(get_task("squad"), "dev", whole), data_config.dev_limit)


def _canonical_split(task: TaskSpec, split: str) -> str:
    if split == "train":
        return split
    if split in ("dev", "validation"):
        return task.dev_splits[0]
    if split in task.dev_splits:
        return split
    raise DistilleryError(
        f"Task {task.name} has no split {split!r}; use train, dev or one of {', '.join(task.dev_splits)}."
    )


def _data_dir(data_config: DataConfig) -> Path | None:
    data_dir = data_config.resolved_data_dir
    if data_dir is not None and not data_dir.is_dir():
        raise DistilleryError(f"Data folder {data_dir} {'is a file, not a folder' if data_dir.exists() else 'does not exist'}.")
    return data_dir


# --- GLUE ----------------------------------------------------------------------------------------


def _load_glue(task: TaskSpec, split: str, data_config: DataConfig) -> datasets.Dataset:
    data_dir = _data_dir(data_config)
    if data_dir is None:
        return _load_glue_hub(task, split)
    folder = glue_folder(task, data_dir)
    path = folder / f"{split}.tsv"
    if not path.is_file():
        present = sorted(p.name for p in folder.glob("*.tsv"))
        has = f" (it holds {', '.join(present)})" if present else " (it holds no .tsv files)"
        raise DistilleryError(f"GLUE {task.glue_dir} {split}.tsv not found in {folder}{has}.")
    return read_glue_tsv(task, path)


def glue_folder(task: TaskSpec, data_dir: Path) -> Path:
    """The folder holding ``task``'s TSV files inside ``data_dir`` (several layouts accepted)."""
    candidates = [data_dir / "glue" / task.glue_dir, data_dir / "glue_data" / task.glue_dir, data_dir / task.glue_dir]
    if data_dir.name.lower() == task.glue_dir.lower():
        candidates.insert(0, data_dir)
    for folder in candidates:
        if folder.is_dir():
            return folder
    looked = ", ".join(str(c) for c in candidates)
    raise DistilleryError(f"No {task.glue_dir} folder for task {task.name} in {data_dir}; looked in {looked}.")


def _column_index(path: Path, header: list[str], name: str | int) -> int:
    if isinstance(name, int):
        return name
    if name not in header:
        raise DistilleryError(f"{path} has no column {name!r}; its columns are {', '.join(header)}.")
    return header.index(name)


def read_glue_tsv(task: TaskSpec, path: Path) -> datasets.Dataset:
    """Read one GLUE TSV file: plain split on tabs (no quoting), header by name, labels checked."""
    path = Path(path)
    lines = numbered_lines(path)
    header = None
    if task.has_header:
        first = next(lines, None)
        if first is None:
            raise DistilleryError(f"{path} is empty.")
        header = first[1].split("\t")
        header = [h.strip() for h in header]
        index = {
            key: _column_index(path, header, field)
            for key, field in (("text", task.text_field), ("text_pair", task.text_pair_field), ("label", task.label_field))
            if field is not None
        }
    else:
        index = {"text": task.text_field, "label": task.label_field}
        if task.text_pair_field is not None:
            index["text_pair"] = task.text_pair_field
    # every row has the header's fields (CoLA, without a header: up to its text's); an extra one is a
    # tab inside a text or a damaged row, never something to read past
    needed = len(header) if header is not None else max(index.values()) + 1
    label_ids = {label: i for i, label in enumerate(task.labels)} if task.labels else None
    columns: dict[str, list] = {key: [] for key in index}
    for number, line in lines:
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != needed:
            raise DistilleryError(
                f"{path}, line {number}: expected {needed} tab-separated fields"
                f"{' as its header has' if header is not None else ''}, found {len(fields)}."
            )
        raw_label = fields[index["label"]].strip()
        columns["label"].append(_parse_label(task, raw_label, label_ids, path, number))
        columns["text"].append(fields[index["text"]].strip())
        if "text_pair" in index:
            columns["text_pair"].append(fields[index["text_pair"]].strip())
    if not columns["label"]:
        raise DistilleryError(f"{path} is empty." if header is None else f"{path} has a header but no examples.")
    return datasets.Dataset.from_dict(columns, features=_features(task))


def _parse_label(task: TaskSpec, raw: str, label_ids: dict | None, path, number: int):
    if label_ids is None:
        try:
            return float(raw)
        except ValueError:
            raise DistilleryError(f"{path}, line {number}: score {raw!r} is not a number.") from None
    if raw not in label_ids:
        raise DistilleryError(
            f"{path}, line {number}: label {raw!r} is not one of the labels of task {task.name} "
            f"({listed(task.labels)})."
        )
    return label_ids[raw]


def _load_glue_hub(task: TaskSpec, split: str) -> datasets.Dataset:
    hub_split = task.hub_split(split)
    try:
        ds = datasets.load_dataset(task.hub_id, task.hub_name, split=hub_split)
    except Exception as e:  # offline, no such dataset, ...: the user needs the same advice
        raise DistilleryError(
            f"Could not load {task.hub_id}/{task.hub_name} ({hub_split}) from the Hugging Face Hub ({type(e).__name__}: "
            f"{e}); pass --data-dir with a local GLUE copy or set $DISTILLERY_DATA."
        ) from None
    if task.kind == "classification":
        names = ds.features["label"].names
        if all(label.isdigit() for label in task.labels):
            mapping = list(range(len(names)))  # files write the Hub's class ids as digits
        else:
            mapping = [task.labels.index(name) for name in names]
        labels = [mapping[y] for y in column_values(ds, "label")]
    else:
        labels = [float(y) for y in column_values(ds, "label")]
    columns = {"text": column_values(ds, task.hub_text)}
    if task.is_pair:
        columns["text_pair"] = column_values(ds, task.hub_text_pair)
    columns["label"] = labels
    return datasets.Dataset.from_dict(columns, features=_features(task))


# --- token classification (CoNLL-style files, token JSONL, the Hub) ------------------------------


def _load_tokens(task: TaskSpec, split: str, data_config: DataConfig) -> datasets.Dataset:
    if task.name == "custom":
        path = _custom_path(task, split, data_config)
        check_file_kind(path, task, data_config)
    else:
        data_dir = _data_dir(data_config)
        if data_dir is None:
            return load_tokens_hub(task, split)
        folder = ner_folder(task, data_dir)
        path = folder / f"{split}.txt"
        if not path.is_file():
            raise DistilleryError(f"{task.name} {split}.txt not found in {folder} (it holds "
                                  f"{listed(sorted(p.name for p in folder.iterdir())) or 'no files'}).")
    return token_rows(task, path, read_token_file(path, task.token_column, task.tag_column),
                      "the train file" if task.train_file else "the model's tags")


# --- SQuAD ---------------------------------------------------------------------------------------


def _load_squad(task: TaskSpec, split: str, data_config: DataConfig) -> datasets.Dataset:
    train_name, dev_name = SQUAD_FILES[task.squad_version]
    holdout = data_config.squad_holdout
    data_dir = _data_dir(data_config)
    if data_dir is None:
        hub_split = "validation" if holdout or split != "train" else "train"
        examples = _load_squad_hub(task, hub_split)
    else:
        folder = squad_folder(task, data_dir)
        path = folder / (dev_name if holdout or split != "train" else train_name)
        if not path.is_file():
            hint = "; use --squad-holdout FRACTION to train on part of the dev set" if path.name == train_name else ""
            raise DistilleryError(f"SQuAD {path.name} not found in {folder}{hint}.")
        examples = read_squad_json(path)
    if holdout:
        train, dev = squad_holdout_split(examples, holdout)
        return train if split == "train" else dev
    return examples


def squad_folder(task: TaskSpec, data_dir: Path) -> Path:
    """The folder with the SQuAD JSON files: ``<data_dir>/squad`` or the data folder itself."""
    names = SQUAD_FILES[task.squad_version]
    candidates = [data_dir / "squad", data_dir / "SQuAD", data_dir]
    for folder in candidates:
        if any((folder / n).is_file() for n in names):
            return folder
    version = "v1.1" if task.squad_version == 1 else "v2.0"
    looked = ", ".join(str(c) for c in candidates[:1] + candidates[2:])
    raise DistilleryError(f"No SQuAD {version} files ({', '.join(names)}) in {data_dir}; looked in {looked}.")


SQUAD_LAYOUT = '{"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers": [...]}]}]}]}'


def _json_kind(value) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "true or false", type(None): "null"}
    return kinds.get(type(value), "a number")


def _squad_part(value, kind: type, path: Path, where: str):
    """``value`` when it is a JSON ``kind`` (object or list); else a sentence naming where in the file."""
    if not isinstance(value, kind):
        raise DistilleryError(f"{path} does not have the SQuAD layout: {where} is {_json_kind(value)}, not "
                              f"{_json_kind(kind())}; a SQuAD file is {SQUAD_LAYOUT}.")
    return value


def read_squad_json(path: Path) -> datasets.Dataset:
    """Read a SQuAD v1.1/v2.0 JSON file, checking that every answer sits at its answer_start."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8-sig") as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        raise DistilleryError(f"{path} is not valid JSON (line {e.lineno}: {e.msg}).") from None
    rows = {"id": [], "title": [], "context": [], "question": [], "answers": []}
    try:
        articles = _squad_part(_squad_part(raw, dict, path, "the whole file")["data"], list, path, '"data"')
        for a, article in enumerate(articles):
            title = _squad_part(article, dict, path, f"data[{a}]").get("title", f"article-{a}")
            for p, paragraph in enumerate(_squad_part(article["paragraphs"], list, path, f"data[{a}].paragraphs")):
                where = f"data[{a}].paragraphs[{p}]"
                context = _squad_part(paragraph, dict, path, where)["context"]
                for q, qa in enumerate(_squad_part(paragraph["qas"], list, path, f"{where}.qas")):
                    qid = _squad_part(qa, dict, path, f"{where}.qas[{q}]")["id"]
                    texts, starts = _squad_answers(path, qa, context)
                    rows["id"].append(qid)
                    rows["title"].append(title)
                    rows["context"].append(context)
                    rows["question"].append(qa["question"])
                    rows["answers"].append({"text": texts, "answer_start": starts})
    except (KeyError, TypeError) as e:
        raise DistilleryError(f"{path} does not have the SQuAD layout (missing or malformed field {e}).") from None
    if not rows["id"]:
        raise DistilleryError(f"{path} holds no questions.")
    return datasets.Dataset.from_dict(rows, features=_features(_QA_SHAPE))


def _squad_answers(path: Path, qa: dict, context: str) -> tuple[list[str], list[int]]:
    """(texts, starts) of one question's answers, each checked to sit at its answer_start."""
    texts, starts = [], []
    answers = [] if qa.get("is_impossible") else _squad_part(qa.get("answers", []), list, path, f"question {qa['id']}'s answers")
    for i, answer in enumerate(answers):
        text, start = _squad_part(answer, dict, path, f"question {qa['id']}'s answers[{i}]")["text"], int(answer["answer_start"])
        if context[start : start + len(text)] != text:
            raise DistilleryError(
                f"{path}, question {qa['id']}: answer {text!r} is not at its answer_start {start} in the context."
            )
        texts.append(text)
        starts.append(start)
    return texts, starts


def _load_squad_hub(task: TaskSpec, hub_split: str) -> datasets.Dataset:
    try:
        ds = datasets.load_dataset(task.hub_id, split=hub_split)
    except Exception as e:
        raise DistilleryError(
            f"Could not load {task.hub_id} ({hub_split}) from the Hugging Face Hub ({type(e).__name__}: {e}); "
            f"pass --data-dir with a folder holding squad/{SQUAD_FILES[task.squad_version][1]}."
        ) from None
    ds = ds.select_columns(["id", "title", "context", "question", "answers"])
    return ds.cast(_features(_QA_SHAPE))


def squad_holdout_split(examples: datasets.Dataset, fraction: float) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Split SQuAD examples into (train, held-out dev) by article, deterministically.

    An article (all its questions) is held out as dev when
    ``int(sha1(title.encode("utf-8")).hexdigest(), 16) % 10000 < fraction * 10000``, else it trains.
    Whole articles move together, so no paragraph is seen in both parts, and the split does not
    depend on the seed, the order of the file or the machine.
    """
    titles = column_values(examples, "title")
    held = {
        t for t in set(titles) if int(hashlib.sha1(t.encode("utf-8")).hexdigest(), 16) % 10000 < fraction * 10000
    }
    dev_idx = [i for i, t in enumerate(titles) if t in held]
    train_idx = [i for i, t in enumerate(titles) if t not in held]
    if not dev_idx or not train_idx:
        part = "held-out dev" if not dev_idx else "train"
        raise DistilleryError(
            f"--squad-holdout {fraction} leaves the {part} part empty ({len(set(titles))} articles); "
            f"choose a fraction nearer 0.5."
        )
    logger.info(
        "SQuAD holdout %.3g: %d articles / %d questions held out as dev, %d questions train",
        fraction, len(held), len(dev_idx), len(train_idx),
    )
    return examples.select(train_idx), examples.select(dev_idx)


# --- Custom files ---------------------------------------------------------------------------------


def _custom_path(task: TaskSpec, split: str, data_config: DataConfig) -> str:
    # The files named in data_config win; the task keeps the ones its labels were read from.
    if split == "train":
        path = data_config.train_file or task.train_file
    else:
        path = data_config.dev_file or task.dev_file
    if not path:
        option = "--train-file" if split == "train" else "--dev-file"
        raise DistilleryError(f"Task 'custom' needs {option} for its {split} split.")
    return path


def _load_custom(task: TaskSpec, split: str, data_config: DataConfig) -> datasets.Dataset:
    path = _custom_path(task, split, data_config)
    check_file_kind(path, task, data_config)
    rows = read_custom_rows(path, [task.text_column, task.text_pair_column, task.label_column])
    check_empty_texts(path, rows, [c for c in (task.text_column, task.text_pair_column) if c is not None])
    label_ids = {label: i for i, label in enumerate(task.labels)} if task.labels else None
    columns: dict[str, list] = {"text": [], "label": []}
    if task.is_pair:
        columns["text_pair"] = []
    for number, row in rows:
        columns["text"].append(row[task.text_column])
        if task.is_pair:
            columns["text_pair"].append(row[task.text_pair_column])
        raw = custom_label(row[task.label_column], f"{path}, line {number}", task.label_column, label_ids is None)
        if label_ids is None:
            columns["label"].append(raw)
        elif raw not in label_ids:
            source = "the train file" if task.train_file else "the model's labels"
            raise DistilleryError(
                f"{path}, line {number}: label {raw!r} does not occur in {source} (labels: {listed(task.labels)})."
            )
        else:
            columns["label"].append(label_ids[raw])
    ordered = {k: columns[k] for k in ("text", "text_pair", "label") if k in columns}
    return datasets.Dataset.from_dict(ordered, features=_features(task))

# A stand-in spec for the QA schema (read_squad_json does not know which SQuAD version it reads).
_QA_SHAPE = TaskSpec(name="qa", kind="qa", labels=None, metrics=("f1",), main_metric="f1")
# A stand-in for custom data of sentences, before its labels are read
_SENTENCE_SHAPE = TaskSpec(name="custom", kind="classification", labels=None, metrics=("accuracy",),
                           main_metric="accuracy")


def custom_task(data_config: "DataConfig") -> TaskSpec:
    """A TaskSpec for your own CSV/TSV/JSONL files, labels discovered from the train file.

    Classification labels are the distinct values of the label column in ``train_file`` (or in
    ``dev_file`` when there is no train file), sorted (numbers by value, then strings), so class
    ids are stable across runs. With ``data_config.regression`` every label must be a number.
    Metrics: accuracy and macro F1 (main: accuracy), or Pearson/Spearman (main: Pearson).
    """
    source = data_config.train_file or data_config.dev_file
    if not source:
        raise DistilleryError("Task 'custom' reads your own CSV/TSV/JSONL files: give --dev-file (the examples to score) "
                              "and, to train, --train-file.")
    text_column = data_config.text_column or "text"
    label_column = data_config.label_column or "label"
    other = data_config.dev_file if source == data_config.train_file else None
    if is_token_file(source, columns_given(data_config)):
        return custom_token_task(data_config, source, other)
    if other:
        check_file_kind(other, _SENTENCE_SHAPE, data_config, "--dev-file")
    _check_distinct_columns({"--text-column": text_column, "--text-pair-column": data_config.text_pair_column,
                             "--label-column": label_column})
    rows = read_custom_rows(source, [text_column, data_config.text_pair_column, label_column])
    common = dict(
        name="custom",
        is_pair=data_config.text_pair_column is not None,
        train_file=data_config.train_file,
        dev_file=data_config.dev_file,
        text_column=text_column,
        text_pair_column=data_config.text_pair_column,
        label_column=label_column,
        hub_splits=(),
    )
    for line, row in rows:
        custom_label(row[label_column], f"{source}, line {line}", label_column, data_config.regression)
    if data_config.regression:
        return TaskSpec(kind="regression", labels=None, metrics=("pearson", "spearman"), main_metric="pearson", **common)
    labels = tuple(sorted({row[label_column] for _, row in rows}, key=label_sort_key))
    if len(labels) < 2:
        raise DistilleryError(
            f"{source}: column {label_column!r} holds only the label {labels[0]!r}; classification needs at least two "
            f"labels (use --regression for numeric targets)."
        )
    return TaskSpec(kind="classification", labels=labels, metrics=("accuracy", "macro_f1"), main_metric="accuracy", **common)


def _check_distinct_columns(columns: dict[str, str | None]) -> None:
    """Text, pair and label must be three columns: one column as two of them trains on nonsense."""
    seen: dict[str, str] = {}
    for option, column in columns.items():
        if column is None:
            continue
        if column in seen:
            raise DistilleryError(f"{seen[column]} and {option} both name column {column!r}; each must be a "
                                  f"column of its own (the defaults are 'text' and 'label').")
        seen[column] = option


def task_for(data_config: "DataConfig") -> TaskSpec:
    """The TaskSpec a DataConfig asks for: a registered task, or one built from custom files."""
    if str(data_config.task).lower() == "custom":
        return custom_task(data_config)
    return get_task(data_config.task)


def kind_for(task_name: str, regression: bool = False) -> TaskKind:
    """The kind of the task called ``task_name``, known before any file is read (:func:`task_for` reads them): a
    built-in task's, or custom data's (regression with ``--regression``, else classification)."""
    if task_name == "custom":
        return kind_of("regression" if regression else "classification")
    return get_task(task_name).kind_object


def check_new_rows(task: TaskSpec, augment: int | None, unlabeled_file: str | Path | None) -> None:
    """Refuse the student's new rows (``--augment``, ``--unlabeled-file``) for a task whose kind has no teacher
    labels for them (``takes_new_rows`` False): a SQuAD answer is a span of its context that no new text has (the
    rows would be recorded and never used)."""
    given = [option for option, value in (("--augment", augment), ("--unlabeled-file", unlabeled_file)) if value]
    if not task.kind_object.takes_new_rows and given:
        options = " and ".join(given)
        raise DistilleryError(f"{options} {'make' if len(given) > 1 else 'makes'} new rows for the teacher to "
                              f"label, but a {task.kind_object.pipeline_tag} task's teacher does not label new rows "
                              f"(a SQuAD answer is a span of a context no new row has); drop {options} for task "
                              f"{task.name}.")


def load_unlabeled(path: str | Path, task: TaskSpec) -> datasets.Dataset:
    """The rows of ``--unlabeled-file`` (CSV/TSV/JSONL, read as custom data is) as ``text`` (and
    ``text_pair`` for a pair task), no labels: the teacher labels them. The columns are the task's own where the
    file has them (:func:`unlabeled_columns`), else ``text`` and ``text_pair``: what `distillery transfer-set`
    writes serves any task, whatever its columns are called. A token-classification task's file holds sentences
    of words (``tokens``): :func:`distillery.data.tokens.read_unlabeled_tokens`."""
    check_new_rows(task, 0, path)
    if task.kind_object.word_labels:
        return read_unlabeled_tokens(path, task.token_column)
    path = regular_file(path, "--unlabeled-file")
    check_file_kind(path, task, option="--unlabeled-file")
    present = custom_columns(path)
    looked = unlabeled_columns(task)
    found = next(((text, pair) for text, pair in looked if text in present and (pair is None or pair in present)), None)
    if found is None:
        names = " or ".join(" and ".join(repr(c) for c in (text, pair) if c is not None) for text, pair in looked)
        raise DistilleryError(f"--unlabeled-file {path} has no column{'s' if task.is_pair else ''} {names} (what task "
                              f"{task.name} reads its texts from); its columns are {listed(present)}.")
    text, pair = found
    if pair is None and "text_pair" in present and text != "text_pair":  # its second texts would be dropped unseen
        raise DistilleryError(f"--unlabeled-file {path} has a column 'text_pair' (a second text a row), but task "
                              f"{task.name} classifies one text a row; give a file of single texts (distillery "
                              f"transfer-set --single writes one).")
    rows = read_custom_rows(path, [text, pair])
    check_empty_texts(path, rows, [c for c in (text, pair) if c is not None])
    columns = {"text": [row[text] for _, row in rows]}
    if pair is not None:
        columns["text_pair"] = [row[pair] for _, row in rows]
    return datasets.Dataset.from_dict(columns)


def unlabeled_columns(task: TaskSpec) -> list[tuple[str, str | None]]:
    """The (text, pair) columns an unlabeled file may hold the task's texts in, first found first: the task's own
    (custom data's --text-column and --text-pair-column, a GLUE file's header: RTE's sentence1 and sentence2), then
    ``text`` and ``text_pair``; pair None for a single-sentence task."""
    own = (task.text_column or task.text_field, task.text_pair_column or task.text_pair_field)
    looked: list[tuple[str, str | None]] = []
    for text, pair in (own, ("text", "text_pair")):
        pair = pair if task.is_pair else None
        named = isinstance(text, str) and (pair is None or isinstance(pair, str))  # CoLA's header-less file: indices
        if named and (text, pair) not in looked:
            looked.append((text, pair))
    return looked
