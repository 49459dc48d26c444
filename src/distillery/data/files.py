"""The user's own text files, read strictly: every line numbered, every row checked against its
header, so that a damaged or misread file is refused with its file and line instead of training on
shifted columns, Python reprs or empty texts. :mod:`distillery.data.loading` builds datasets from these rows."""

from __future__ import annotations

import csv
import functools
import json
import logging
from pathlib import Path
from types import MappingProxyType
from typing import Iterable, Iterator, Mapping

from distillery.errors import DistilleryError, listed

logger = logging.getLogger("distillery")

CUSTOM_EXTENSIONS = (".csv", ".tsv", ".jsonl", ".json")

def numbered_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its end) for a UTF-8 text file; a BOM is dropped. A line that is not
    UTF-8 (a Latin-1 export) is refused with its number: decoding it with replacement characters would train on
    "Katar\ufffdna"."""
    # Split on "\n" alone, as bytes: a stray carriage return inside a field must not start a new row, and "\n" is
    # never part of a multi-byte UTF-8 character, so each line decodes on its own and names itself when it fails.
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise DistilleryError(f"{path}, line {number}: not UTF-8 text (byte {raw[e.start]:#04x}); save the "
                                      f"file as UTF-8.") from None
            yield number, line.rstrip("\n").rstrip("\r")


def regular_file(path: str | Path, what: str) -> Path:
    """``path`` as a Path when it is a regular file; else a sentence saying what it is instead
    (a device such as /dev/zero would be read forever)."""
    path = Path(path)
    if path.is_file():
        return path
    if path.is_dir():
        raise DistilleryError(f"{what} {path} is a folder, not a file.")
    if path.exists():
        raise DistilleryError(f"{what} {path} is not a regular file (a device, pipe or socket); give a text file.")
    raise DistilleryError(f"{what} {path} does not exist.")




# A share of rows with an empty text this large is a wrong column or a damaged export, not a few
# blank reviews: refused. Fewer are kept (an empty text is a valid, if uninformative, example) with a warning.
EMPTY_TEXT_LIMIT = 0.1


def check_empty_texts(path, rows: list[tuple[int, dict[str, str]]], text_columns: list[str]) -> None:
    """Refuse a file where at least EMPTY_TEXT_LIMIT of the rows have an empty text; warn below that."""
    empty = [number for number, row in rows if any(not row[c] for c in text_columns)]
    if not empty:
        return
    columns = " or ".join(repr(c) for c in text_columns)
    what = (f"{path}: {len(empty)} of {len(rows)} rows have an empty text in column {columns} "
            f"(the first at line {empty[0]})")
    if len(empty) >= EMPTY_TEXT_LIMIT * len(rows):
        raise DistilleryError(f"{what}; that many means a wrong --text-column or a damaged file. Fill or drop them.")
    logger.warning("%s; they are kept as examples.", what)


def _as_text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # JSON 1.0 and 1 are the same class
    return str(value)


def read_custom_rows(path: str | Path, columns: Iterable[str | None]) -> list[tuple[int, Mapping[str, str]]]:
    """Rows of your CSV/TSV/JSONL file as (line number, {column: text}) for the named columns.

    ``.csv``: the csv module, quoting on. ``.tsv``: a header row, then plain split on tabs.
    ``.jsonl`` / ``.json``: one JSON object per line (a single JSON list of objects works too).
    """
    path = regular_file(path, "Data file")
    return list(_parsed_rows(path, *_version(path), tuple(c for c in columns if c is not None)))


def custom_columns(path: str | Path) -> list[str]:
    """The column names of your CSV/TSV/JSONL file (a JSONL file's: every key of any row), in order."""
    path = regular_file(path, "Data file")
    return list(_records(path, *_version(path))[0])


def _version(path: Path) -> tuple[int, int]:
    # A run reads its custom file for the task's labels, its train split and the whole split: parsed once
    # per version of the file (its size and modification time), shared by every reader in the process.
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=8)
def _parsed_rows(path: Path, size: int, mtime_ns: int, wanted: tuple[str, ...]) -> tuple[tuple[int, Mapping[str, str]], ...]:
    present, records = _records(path, size, mtime_ns)
    missing = [c for c in wanted if c not in present]
    if missing:
        raise DistilleryError(
            f"{path} has no column {missing[0]!r}; its columns are {listed(present) or '(none)'}."
        )
    rows = []
    for number, record in records:
        row = {}
        for c in wanted:
            if isinstance(record.get(c), (dict, list)):  # str() would train on its Python repr
                kind = "an object" if isinstance(record[c], dict) else "a list"
                raise DistilleryError(f"{path}, line {number}: field {c!r} holds {kind}, not a text or a label.")
            value = _as_text(record.get(c))
            if value is None:
                raise DistilleryError(f"{path}, line {number}: no value in column {c!r}.")
            row[c] = value.strip()
        rows.append((number, MappingProxyType(row)))
    return tuple(rows)


@functools.lru_cache(maxsize=4)
def _records(path: Path, size: int, mtime_ns: int) -> tuple[tuple[str, ...], tuple[tuple[int, dict], ...]]:
    """(column names, (line number, record) of every row) of a file, parsed once per version."""
    suffix = path.suffix.lower()
    if suffix not in CUSTOM_EXTENSIONS:
        raise DistilleryError(f"{path}: unknown data format {suffix or '(no extension)'}; use .csv, .tsv or .jsonl "
                              f"(tagged words: .conll, or --tag-column for a file in CoNLL's columns).")
    if size == 0:
        raise DistilleryError(f"{path} is empty.")
    if suffix in (".jsonl", ".json"):
        records = list(_json_records(path))
        present: list[str] = []
        for _, record in records:
            present += [k for k in record if k not in present]
    else:
        header, records = _table_records(path, delimiter="," if suffix == ".csv" else "\t")
        present = header
    if not records:
        raise DistilleryError(f"{path} has no examples.")
    return tuple(present), tuple(records)


def _json_records(path: Path) -> Iterator[tuple[int, dict]]:
    text_lines = list(numbered_lines(path))
    first = next((line for _, line in text_lines if line.strip()), "")
    if first.lstrip().startswith("["):
        try:
            records = json.loads("\n".join(line for _, line in text_lines))
        except json.JSONDecodeError as e:
            raise DistilleryError(f"{path} is not valid JSON (line {e.lineno}: {e.msg}).") from None
        for i, record in enumerate(records, start=1):
            if not isinstance(record, dict):
                raise DistilleryError(f"{path}: item {i} is not a JSON object.")
            yield i, record
        return
    for number, line in text_lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DistilleryError(f"{path}, line {number}: not valid JSON ({e.msg}).") from None
        if not isinstance(record, dict):
            raise DistilleryError(f"{path}, line {number}: expected a JSON object with named fields.")
        yield number, record


def _table_records(path: Path, delimiter: str) -> tuple[list[str], list[tuple[int, dict]]]:
    records = []
    if delimiter == "\t":
        lines = numbered_lines(path)
        first = next(lines, None)
        header = _header(path, first[1].split("\t") if first else [])
        for number, line in lines:
            if not line.strip():
                continue
            fields = line.split("\t")
            _check_field_count(path, number, header, fields, "tab-separated")
            records.append((number, dict(zip(header, fields))))
        return header, records
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f)
            header = _header(path, next(reader, []))
            start = reader.line_num
            for fields in reader:
                if not any(field.strip() for field in fields):
                    start = reader.line_num
                    continue
                _check_field_count(path, start + 1, header, fields, "comma-separated")
                records.append((start + 1, dict(zip(header, fields))))
                start = reader.line_num
    except UnicodeDecodeError:
        for _ in numbered_lines(path):  # names the first line that is not UTF-8 (the decoder's offset is a chunk's)
            pass
        raise DistilleryError(f"{path} is not UTF-8 text; save it as UTF-8.") from None
    except csv.Error as e:
        raise DistilleryError(f"{path}, line {reader.line_num}: {e}.") from None
    return header, records


def _header(path: Path, names: list[str]) -> list[str]:
    """A table's column names; one named twice is refused (a dict of the row would keep the last)."""
    header = [h.strip() for h in names]
    first: dict[str, int] = {}
    for number, name in enumerate(header, start=1):
        if name in first:
            raise DistilleryError(
                f"{path}: the header names column {name!r} twice (columns {first[name]} and {number}); rename one."
            )
        first[name] = number
    return header


def _check_field_count(path: Path, number: int, header: list[str], fields: list[str], kind: str) -> None:
    # A row with more fields than the header is a text holding the separator unquoted: the fields
    # after it would shift into the label column.
    if len(fields) != len(header):
        hint = "" if len(fields) < len(header) else (
            "; a text holding a comma must be quoted" if kind == "comma-separated" else "; a text holds a tab")
        raise DistilleryError(
            f"{path}, line {number}: expected {len(header)} {kind} fields, found {len(fields)}{hint}."
        )

