"""Token-labelled data (token classification): CoNLL-style files (a word and its tag a line, a blank line between
sentences), JSON lines of ``tokens`` and ``tags``, CoNLL-2003's folder and the Hub's copy, read strictly: a line
without its tag, a tag outside IOB, an empty sentence is refused with its file and line. Rows are ``tokens`` and
``tags`` (tag ids, indices of the task's ``labels``); :mod:`distillery.data.loading` dispatches here."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import datasets
import numpy as np

from distillery.config import DataConfig
from distillery.data.files import _records, _version, numbered_lines, regular_file
from distillery.data.tasks import TaskSpec
from distillery.errors import DistilleryError, listed
from distillery.kinds import kind_of
from distillery.metrics import iob_problem, tag_names


# A file in CoNLL's columns (a word a line, its tag in a column, a blank line between sentences) is named so;
# any file is read so when --token-column or --tag-column is given.
CONLL_EXTENSIONS = (".conll", ".iob", ".bio")  # a .txt file is read so with --token-column or --tag-column
DOCSTART = "-DOCSTART-"  # CoNLL-2003's document separator line: no word of any sentence
TOKENS, TAGS = "tokens", "tags"  # a token JSONL row's fields


def is_token_file(path: str | Path, columns: bool = False) -> bool:
    """Whether ``path`` holds tagged words (token classification): a CoNLL-style file (its extension, or
    ``columns``: --token-column/--tag-column given), or a JSON(L) file whose first row holds a list of ``tokens``
    or both ``tokens`` and ``tags``."""
    path = regular_file(path, "Data file")
    suffix = path.suffix.lower()
    if columns or suffix in CONLL_EXTENSIONS:
        return True
    if suffix not in (".jsonl", ".json"):
        return False
    _, records = _records(path, *_version(path))
    # a list of tokens, or the two fields of a token row whatever they hold (read_token_jsonl names what is wrong)
    return any(isinstance(record.get(TOKENS), list) or {TOKENS, TAGS} <= set(record) for _, record in records[:1])


def read_token_file(path: str | Path, token_column: int | None = None,
                    tag_column: int | None = None) -> list[tuple[int, list[str], list[str]]]:
    """The sentences of a token-labelled file as (line of its first word, words, tag names): CoNLL-style columns
    (:func:`read_conll`) or JSON lines ``{"tokens": [...], "tags": [...]}`` (:func:`read_token_jsonl`). Every tag is
    checked to be IOB (``O``, ``B-TYPE``, ``I-TYPE``)."""
    path = regular_file(path, "Data file")
    if path.suffix.lower() in (".jsonl", ".json") and token_column is None and tag_column is None:
        return read_token_jsonl(path)
    return read_conll(path, token_column, tag_column)


def _checked_tag(path: Path, number: int, tag: str) -> str:
    problem = iob_problem(tag)
    if problem:
        raise DistilleryError(f"{path}, line {number}: {problem}.")
    return tag


def read_conll(path: str | Path, token_column: int | None = None,
               tag_column: int | None = None) -> list[tuple[int, list[str], list[str]]]:
    """A CoNLL-style file: a word a line in whitespace-separated columns, the word in ``token_column`` (default
    the first) and its tag in ``tag_column`` (default the last, of at least two), a blank line (or CoNLL-2003's
    ``-DOCSTART-`` line) between sentences. The tags are kept as written: IOB2 (CoNLL-2003's shared copy is) or
    IOB1, whose ``I-`` after ``O`` seqeval reads as the start of an entity just as IOB2's ``B-``."""
    path = regular_file(path, "Data file")
    token_at = 0 if token_column is None else int(token_column)
    tag_at = tag_column
    for option, column in (("--token-column", token_column), ("--tag-column", tag_column)):
        if column is not None and int(column) < 0:
            raise DistilleryError(f"{option} is a 0-based column index (0 is the first), got {column}.")
    if tag_at is not None and int(tag_at) == token_at:
        raise DistilleryError(f"--token-column and --tag-column both name column {token_at} of {path}; the word "
                              f"and its tag are two columns.")
    needed = token_at + 2 if tag_at is None else max(token_at, int(tag_at)) + 1  # tag None: the last, after the word
    sentences: list[tuple[int, list[str], list[str]]] = []
    words: list[str] = []
    tags: list[str] = []
    start = 0
    for number, line in numbered_lines(path):
        fields = line.split()
        if not fields or fields[0] == DOCSTART:
            if words:
                sentences.append((start, words, tags))
            words, tags = [], []
            continue
        if len(fields) < needed:
            where = "the last column (after the word)" if tag_at is None else f"column {tag_at}"
            raise DistilleryError(f"{path}, line {number}: no tag in {where}; the line has {len(fields)} "
                                  f"column{'s' if len(fields) != 1 else ''} ({line.strip()!r}).")
        if not words:
            start = number
        words.append(fields[token_at])
        tags.append(_checked_tag(path, number, fields[-1] if tag_at is None else fields[int(tag_at)]))
    if words:
        sentences.append((start, words, tags))
    if not sentences:
        raise DistilleryError(f"{path} holds no sentences (a word and its tag a line, a blank line between "
                              f"sentences).")
    return sentences


def read_token_jsonl(path: str | Path) -> list[tuple[int, list[str], list[str]]]:
    """JSON lines (or a JSON list) of ``{"tokens": [words], "tags": [tag names]}``, one sentence a row."""
    path = regular_file(path, "Data file")
    _, records = _records(path, *_version(path))
    sentences = []
    for number, record in records:
        tokens, tags = record.get(TOKENS), record.get(TAGS)
        for name, value in ((TOKENS, tokens), (TAGS, tags)):
            if not isinstance(value, list):
                raise DistilleryError(f"{path}, line {number}: {name!r} must be a list of "
                                      f"{'words' if name == TOKENS else 'tag names'}, not "
                                      f"{'missing' if value is None else type(value).__name__}.")
        if not tokens:
            raise DistilleryError(f"{path}, line {number}: an empty sentence (its 'tokens' list is empty).")
        if len(tokens) != len(tags):
            raise DistilleryError(f"{path}, line {number}: {len(tokens)} tokens but {len(tags)} tags; each word "
                                  f"needs one tag.")
        bad = next((v for v in (*tokens, *tags) if not isinstance(v, str) or not v.strip()), None)
        if bad is not None:
            raise DistilleryError(f"{path}, line {number}: every token and tag must be a non-empty text; found "
                                  f"{bad!r}.")
        sentences.append((number, list(tokens), [_checked_tag(path, number, t) for t in tags]))
    return sentences


UNLABELED_FORMS = ("JSON lines of 'tokens' (a list of words a sentence), or a text file of one word a line with a "
                   "blank line between sentences")


def read_unlabeled_tokens(path: str | Path, token_column: int | None = None) -> datasets.Dataset:
    """``--unlabeled-file`` of a token-classification task: sentences of words without tags, as a ``tokens`` column
    for the teacher to tag. JSON lines (or a JSON list) of ``{"tokens": [words]}`` (a ``tags`` field is not read),
    or a text file of one word a line, a blank line (or CoNLL-2003's ``-DOCSTART-`` line) between sentences; in a
    file of CoNLL's columns (.conll, .iob, .bio, or any file with ``token_column`` given) the word is that column
    (default the first) and the others are not read. A line of several words in a word-a-line file, a sentence
    file (CSV/TSV), an empty or non-text word is refused with the file and line."""
    path = regular_file(path, "--unlabeled-file")
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        raise DistilleryError(f"--unlabeled-file {path} holds sentences (a CSV/TSV file), but a token-classification "
                              f"task tags words; give {UNLABELED_FORMS}.")
    if suffix in (".jsonl", ".json"):
        sentences = []
        for number, record in _records(path, *_version(path))[1]:
            tokens = record.get(TOKENS)
            if not isinstance(tokens, list) or not tokens:
                what = "missing" if tokens is None else "empty" if tokens == [] else type(tokens).__name__
                raise DistilleryError(f"{path}, line {number}: 'tokens' must be a non-empty list of words, not {what} "
                                      f"(an unlabeled file of a token task holds {UNLABELED_FORMS}).")
            bad = next((w for w in tokens if not isinstance(w, str) or not w.strip() or len(w.split()) != 1), None)
            if bad is not None:
                raise DistilleryError(f"{path}, line {number}: every token must be one word of text (no spaces); "
                                      f"found {bad!r}.")
            sentences.append(tokens)
    else:
        columns = token_column is not None or suffix in CONLL_EXTENSIONS
        at = int(token_column or 0)
        sentences, words = [], []
        for number, line in numbered_lines(path):
            fields = line.split()
            if not fields or fields[0] == DOCSTART:
                if words:
                    sentences.append(words)
                words = []
                continue
            if not columns and len(fields) > 1:
                raise DistilleryError(f"{path}, line {number}: {len(fields)} words on one line ({line.strip()!r}); an "
                                      f"unlabeled file of a token task holds one word a line, a blank line between "
                                      f"sentences (a CoNLL file's words are read from a .conll file, or with "
                                      f"--token-column).")
            if len(fields) <= at:
                raise DistilleryError(f"{path}, line {number}: no word in column {at}; the line has {len(fields)} "
                                      f"column{'s' if len(fields) != 1 else ''} ({line.strip()!r}).")
            words.append(fields[at])
        if words:
            sentences.append(words)
    if not sentences:
        raise DistilleryError(f"--unlabeled-file {path} holds no sentences ({UNLABELED_FORMS}).")
    return datasets.Dataset.from_dict({TOKENS: sentences},
                                      features=datasets.Features({TOKENS: datasets.List(datasets.Value("string"))}))


def token_rows(task: TaskSpec, path, sentences, source: str = "the task's tags") -> datasets.Dataset:
    """Sentences of (line, words, tag names) as ``tokens`` and ``tags`` (ids of ``task.labels``); a tag the task
    does not have is refused with its file and line."""
    ids = {tag: i for i, tag in enumerate(task.labels)}
    one_line = Path(path).suffix.lower() in (".jsonl", ".json")  # a JSON row is a sentence; CoNLL's, a word a line
    tags = []
    for number, words, names in sentences:
        unknown = next((t for t in names if t not in ids), None)
        if unknown is not None:
            where = number if one_line else next(number + k for k, t in enumerate(names) if t == unknown)
            raise DistilleryError(f"{path}, line {where}: tag {unknown!r} does not occur in {source} "
                                  f"({listed(task.labels)}).")
        tags.append([ids[t] for t in names])
    return datasets.Dataset.from_dict({"tokens": [w for _, w, _ in sentences], "tags": tags},
                                      features=task.kind_object.raw_features(task))


def ner_folder(task: TaskSpec, data_dir: Path) -> Path:
    """The folder holding ``task``'s CoNLL-style {split}.txt files inside ``data_dir``."""
    candidates = [data_dir / "ner" / task.ner_dir, data_dir / task.ner_dir, data_dir]
    for folder in candidates:
        if (folder / "train.txt").is_file() or (folder / "dev.txt").is_file():
            return folder
    looked = ", ".join(str(c) for c in candidates)
    raise DistilleryError(f"No {task.name} files (train.txt, dev.txt, test.txt) in {data_dir}; looked in {looked}.")


# The Hub's CoNLL-2003 tag ids where its column does not name them (the original dataset's order)
CONLL_HUB_TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")


def load_tokens_hub(task: TaskSpec, split: str) -> datasets.Dataset:
    hub_split = task.hub_split(split)
    try:
        ds = datasets.load_dataset(task.hub_id, split=hub_split)
    except Exception as e:  # offline, no such dataset, ...
        raise DistilleryError(
            f"Could not load {task.hub_id} ({hub_split}) from the Hugging Face Hub ({type(e).__name__}: {e}); pass "
            f"--data-dir with a folder holding ner/{task.ner_dir}/{split}.txt or set $DISTILLERY_DATA.") from None
    column = next((c for c in ("ner_tags", "tags") if c in ds.column_names), None)
    if column is None or task.hub_text not in ds.column_names:
        raise DistilleryError(f"{task.hub_id} ({hub_split}) has no {task.hub_text!r} and 'ner_tags' columns; its "
                              f"columns are {listed(ds.column_names)}.")
    feature = getattr(ds.features[column], "feature", None)
    names = list(getattr(feature, "names", None) or CONLL_HUB_TAGS)  # a ClassLabel names its ids
    ids = {tag: i for i, tag in enumerate(task.labels)}
    mapping = np.asarray([ids[n] for n in names], dtype=np.int64)
    tags = [mapping[np.asarray(t, dtype=np.int64)].tolist() for t in list(ds[column])]
    return datasets.Dataset.from_dict({"tokens": list(ds[task.hub_text]), "tags": tags},
                                      features=task.kind_object.raw_features(task))


def columns_given(data_config: DataConfig) -> bool:
    return data_config.token_column is not None or data_config.tag_column is not None


def check_file_kind(path, task: TaskSpec, data_config: DataConfig | None = None, option: str = "Data file") -> None:
    """Refuse a token-labelled file (tagged words) for a task that classifies sentences, and a file of sentences for
    a token-classification task, in one sentence naming the file."""
    tokens = is_token_file(path, data_config is not None and columns_given(data_config))
    wanted = task.kind == "token_classification"
    if tokens and not wanted:
        raise DistilleryError(f"{option} {path} holds tagged words (a word and its tag a line, or JSON rows of "
                              f"'tokens' and 'tags': token classification), but task {task.name} labels whole "
                              f"sentences; give a CSV/TSV/JSONL file of texts and labels.")
    if wanted and not tokens:
        raise DistilleryError(f"{option} {path} holds sentences, but task {task.name} tags words (token "
                              f"classification); give a CoNLL-style file (a word and its tag a line, a blank line "
                              f"between sentences: .conll, .txt) or JSON lines of 'tokens' and 'tags'.")


def custom_token_task(data_config: "DataConfig", source: str, other: str | None) -> TaskSpec:
    """Task custom of token-labelled files: its tags read from ``source`` (``tag_names``: O first, both ``B-`` and
    ``I-`` of every entity type that occurs)."""
    given = [f"--{name.replace('_', '-')}" for name in ("text_column", "text_pair_column", "label_column", "regression")
             if getattr(data_config, name) not in (None, False)]
    if given:
        raise DistilleryError(f"{source} holds tagged words (token classification), which {listed(given)} do not "
                              f"apply to; its columns are --token-column and --tag-column.")
    task = TaskSpec(name="custom", kind="token_classification", labels=("O", "B-X", "I-X"),
                    metrics=kind_of("token_classification").metrics, main_metric="entity_f1",
                    train_file=data_config.train_file, dev_file=data_config.dev_file,
                    token_column=data_config.token_column, tag_column=data_config.tag_column, hub_splits=())
    if other:
        check_file_kind(other, task, data_config, "--dev-file")
    sentences = read_token_file(source, data_config.token_column, data_config.tag_column)
    labels = tag_names({t for _, _, tags in sentences for t in tags})
    if len(labels) < 2:
        raise DistilleryError(f"{source}: every word is tagged O; token classification needs at least one entity.")
    return dataclasses.replace(task, labels=labels)
