"""What a model folder's weights files must be before a model is built from them.

- **Integrity**: every folder distillery saves records the SHA-256 of each weights file
  (``distillery_weights.json``, :func:`record_weights`); loading such a folder checks them
  (:func:`verify_weights`), so a byte changed inside tensor data (same size, valid header: nothing
  else would notice) is refused. A folder without the record loads without this check when it is a user's
  own model; one distillery saved (it holds ``.distillery``) is refused, since its record was deleted.
- **Agreement with config.json**, read from the safetensors header alone (:func:`check_against_config`),
  so that a config asking for 100000 layers is refused before a model of that size is built.
- **Format**: only safetensors, or ``.bin`` files of plain tensors, are read; a pickle holding
  anything else is refused with a sentence on how to convert it (:func:`pickle_refusal`).
- **Values**: non-finite weights (a diverged or damaged model) are refused (:func:`check_finite`).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from distillery.errors import DistilleryError
from distillery.folders import MARKER, atomic_file

WEIGHTS_RECORD = "distillery_weights.json"
# The files whose bytes are the model: safetensors weights (model, shards, a super-net's head and
# projection) and ONNX graphs, which hold their weights inline.
WEIGHT_PATTERNS = ("*.safetensors", "*.onnx")
HASH_CHUNK = 1 << 20
# The first "layer.N." / "layers.N." of a key numbers the encoder layer it belongs to
# (bert.encoder.layer.3.attention..., moebert's layers.3....).
LAYER_INDEX = re.compile(r"(?:^|\.)layers?\.(\d+)\.")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# sha256 of a file by (path, inode, size, mtime_ns): a teacher's weights are read once per process.
_FILE_DIGESTS: dict[tuple, str] = {}


def file_digest(path: Path) -> str:
    """sha256 of the file at ``path`` (memoised while its path, inode, size and mtime stay the same)."""
    stat = path.stat()
    memo = (str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if memo not in _FILE_DIGESTS:
        _FILE_DIGESTS[memo] = sha256_file(path)
    return _FILE_DIGESTS[memo]


def weight_files(folder: Path) -> list[Path]:
    return sorted(p for pattern in WEIGHT_PATTERNS for p in Path(folder).glob(pattern) if p.is_file())


def record_weights(folder: str | Path) -> None:
    """Write ``folder``'s weights record (the SHA-256 of each weights file), replacing it atomically."""
    folder = Path(folder)
    record = {"sha256": {p.name: sha256_file(p) for p in weight_files(folder)}}
    with atomic_file(folder / WEIGHTS_RECORD, "w") as f:
        f.write(json.dumps(record, indent=2) + "\n")


def verify_weights(folder: str | Path, required: bool = False) -> None:
    """Refuse ``folder`` when a weights file it recorded is missing or its bytes changed, and when it has
    no record although distillery saved it (it holds distillery's ``.distillery`` file: every folder of
    weights distillery saves has a record) or ``required``. A user's own model, without either, passes."""
    folder = Path(folder)
    path = folder / WEIGHTS_RECORD
    if not path.is_file():
        if weight_files(folder) and (required or (folder / MARKER).exists()):
            raise DistilleryError(f"{folder} has no weights record ({WEIGHTS_RECORD}, which distillery writes beside "
                                  f"every model it saves), so its weights cannot be verified; it is not used. Save "
                                  f"the model again (or rerun the command that made it).")
        return
    try:
        record = json.loads(path.read_text())
        hashes = record["sha256"]
        items = [(str(name), str(digest)) for name, digest in hashes.items()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise DistilleryError(f"{path} is not a readable weights record; the model in {folder} cannot be "
                              f"checked, so it is not loaded.") from None
    for name, digest in items:
        weights = folder / name
        if Path(name).name != name or not weights.is_file():
            raise DistilleryError(f"{weights} is missing: {path} records it as part of this model.")
        if sha256_file(weights) != digest:
            raise DistilleryError(f"{weights} was changed after distillery saved it (its SHA-256 no longer "
                                  f"matches {path.name}); the model is damaged, so it is not loaded.")


def model_weights(folder: Path) -> list[Path]:
    """The safetensors files of a ``save_pretrained`` folder: model.safetensors, or its shards."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
            raise DistilleryError(f"{index} is not a readable safetensors index.") from None
        return [folder / name for name in names]
    single = folder / "model.safetensors"
    return [single] if single.is_file() else []


def header_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Every tensor's name and shape, from the safetensors headers alone (no tensor data is read)."""
    from safetensors import SafetensorError, safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    shapes[key] = tuple(f.get_slice(key).get_shape())
        except FileNotFoundError:
            raise DistilleryError(f"{path} is missing: the model's safetensors index names it.") from None
        except SafetensorError as e:
            raise DistilleryError(f"{path} is corrupt ({e}).") from None
    return shapes


def check_against_config(folder: str | Path, config) -> None:
    """Refuse a config.json whose layer count, hidden size or vocabulary disagrees with the weights
    saved beside it: building the model first would take as long as the config asks (minutes for
    100000 layers) and then train the missing or resized weights from random."""
    folder = Path(folder)
    files = model_weights(folder)
    if not files:
        return
    shapes = header_shapes(files)
    where = files[0] if len(files) == 1 else folder
    layers = {int(m.group(1)) for key in shapes if (m := LAYER_INDEX.search(key))}
    expected = getattr(config, "num_hidden_layers", None)
    if layers and isinstance(expected, int) and expected != len(layers):
        raise DistilleryError(f"{folder / 'config.json'} says num_hidden_layers={expected}, but {where} holds "
                              f"{len(layers)} layers: config and weights are not of the same model.")
    embedding = next((shape for key, shape in shapes.items() if key.endswith("embeddings.word_embeddings.weight")), None)
    if embedding is None or len(embedding) != 2:
        return
    width = getattr(config, "embedding_size", None) or getattr(config, "hidden_size", None)
    for name, value, saved in (("vocab_size", getattr(config, "vocab_size", None), embedding[0]),
                               ("hidden_size", width, embedding[1])):
        if isinstance(value, int) and value != saved:
            raise DistilleryError(f"{folder / 'config.json'} says {name}={value}, but the word embeddings in "
                                  f"{where} have {saved}: config and weights are not of the same model.")


def pickle_refusal(folder: str | Path) -> DistilleryError:
    """The sentence for a ``.bin`` weights file that holds more than tensors (torch's weights-only
    reader refused it; nothing in it ran)."""
    files = sorted(Path(folder).glob("*.bin")) if Path(folder).is_dir() else []
    name = ", ".join(str(p) for p in files) or str(folder)
    return DistilleryError(
        f"{name} is a pickle holding more than tensors, and distillery never unpickles: it loads only "
        f"safetensors (or .bin files of plain tensors). If you trust its source, convert it: load the model in "
        f"Python with the code that wrote it and save it with model.save_pretrained(folder, safe_serialization=True).")


def check_finite(model, folder: str | Path) -> None:
    """Refuse a model with NaN or infinite weights: it would score as if it guessed."""
    _refuse_non_finite(model.state_dict().items(), folder)


def check_saved_finite(folder: str | Path) -> None:
    """:func:`check_finite` on the safetensors files of ``folder`` as saved, one tensor at a time (no model built)."""
    from safetensors import SafetensorError, safe_open

    for path in sorted(Path(folder).glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as f:
                _refuse_non_finite(((key, f.get_tensor(key)) for key in f.keys()), path)
        except SafetensorError as e:
            raise DistilleryError(f"{path} is corrupt ({e}).") from None


def _refuse_non_finite(tensors, folder: str | Path) -> None:
    import torch

    for name, tensor in tensors:
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            files = weight_files(Path(folder)) if Path(folder).is_dir() else []
            where = files[0] if len(files) == 1 else folder
            raise DistilleryError(f"{where} holds non-finite weights (NaN or inf, e.g. in {name}): the model is "
                                  f"damaged or its training diverged, so it is not used.")
