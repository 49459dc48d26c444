"""The Hugging Face side of every model distillery makes: student types, heads, folders.

The Auto class is chosen from the saved config's architecture, so one call serves every task head
and every student type; method packages register their configs with the Auto classes on import.
A config class may carry its ONNX settings (:class:`OnnxSpec`, the class attribute
``onnx_export``) for the export to read. Loading any saved folder, export folders included, into a
callable model is ``distillery.runtime.load_model``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
)
from transformers.modeling_outputs import BaseModelOutput, QuestionAnsweringModelOutput, SequenceClassifierOutput

from distillery.errors import DistilleryError
from distillery.folders import atomic_folder, mark

# Packages whose import registers a student type (its config and heads) with the Auto classes.
MODEL_PACKAGES = ("distillery.moebert", "distillery.cmow", "distillery.autotinybert")


def register_models() -> None:
    """Register every distillery student type with AutoConfig / AutoModel*.

    Done on first load rather than on ``import distillery``, which stays instant (the CLI's startup
    would otherwise pay for importing torch and transformers); call it, or import the method
    package, before using the Auto classes directly on a distillery student.
    """
    import importlib

    for name in MODEL_PACKAGES:
        importlib.import_module(name)


@dataclass(frozen=True)
class Head:
    """A task head: its name (in export manifests), output fields, Auto class and output class."""

    name: str
    outputs: tuple[str, ...]
    auto_class: Any
    output_class: Any


HEADS = {  # architecture suffix -> head
    "ForSequenceClassification": Head("sequence-classification", ("logits",), AutoModelForSequenceClassification,
                                      SequenceClassifierOutput),
    "ForQuestionAnswering": Head("question-answering", ("start_logits", "end_logits"), AutoModelForQuestionAnswering,
                                 QuestionAnsweringModelOutput),
}
BASE_HEAD = Head("base", ("last_hidden_state",), AutoModel, BaseModelOutput)


def head_of(config) -> Head:
    """The head of a config's (first) architecture; the bare encoder when it names none we know."""
    arch = (getattr(config, "architectures", None) or [""])[0]
    return next((h for suffix, h in HEADS.items() if arch.endswith(suffix)), BASE_HEAD)


def head_named(name: str) -> Head:
    """The head an export manifest names."""
    return next((h for h in HEADS.values() if h.name == name), BASE_HEAD)


@dataclass(frozen=True)
class OnnxSpec:
    """How one model type goes to ONNX: a config class that needs other settings than the defaults
    carries its own as the class attribute ``onnx_export`` (bert, roberta, ... use the default).

    ``inputs``: graph inputs, in order (None: the tokenizer's among input_ids, attention_mask,
    token_type_ids that the model's forward names). ``outputs``: output fields (None: the head's).
    ``dynamo``: the dynamo exporter (True) or the TorchScript one, for a model torch.export cannot
    trace. ``seq_multiple``: the graph takes sequence lengths that are a multiple of this (a model
    whose shape-dependent loop is exported as fixed steps over blocks); the ONNX runtime model pads
    with padding tokens (attention mask 0) and cuts per-position outputs back, so a model listing it
    must ignore masked positions exactly. ``max_length``: the longest sequence the graph computes
    right; longer inputs are refused with a sentence. ``int8``: the backend ``--format int8`` picks for
    this type when it is not the export's default.
    """

    inputs: tuple[str, ...] | None = None
    outputs: tuple[str, ...] | None = None
    dynamo: bool = True
    seq_multiple: int = 1
    max_length: int | None = None
    int8: str | None = None  # this type's faster int8 backend where it is not the default


def onnx_spec(config) -> OnnxSpec:
    """The ONNX settings of a config, or of the config class registered for a model type (a string)."""
    if isinstance(config, str):
        from transformers import CONFIG_MAPPING

        try:
            config = CONFIG_MAPPING[config]
        except KeyError:  # a type nobody registered exports with the defaults
            return OnnxSpec()
    return getattr(config, "onnx_export", None) or OnnxSpec()


def model_folder(path: str | Path) -> Path:
    """The folder holding config.json: the path itself, or a run folder's ``student/``."""
    path = Path(path).expanduser()
    if (path / "config.json").is_file():
        return path
    if (path / "student" / "config.json").is_file():
        return path / "student"
    if not path.exists():
        raise DistilleryError(f"{path} does not exist.")
    raise DistilleryError(f"{path} is not a saved model: it has no config.json (nor student/config.json).")


def read_config(folder: str | Path):
    """The PretrainedConfig saved in ``folder`` (distillery's student types included)."""
    register_models()
    try:
        return AutoConfig.from_pretrained(folder)
    except (OSError, ValueError) as e:
        raise DistilleryError(f"Cannot read the model config {Path(folder) / 'config.json'}: {e}") from None


def load_pretrained(folder: str | Path) -> PreTrainedModel:
    """The Hugging Face model (fp32, with its head) saved with ``save_pretrained`` in ``folder``."""
    from safetensors import SafetensorError

    folder = Path(folder)
    config = read_config(folder)
    cls = head_of(config).auto_class
    try:
        model = cls.from_pretrained(folder)
    except SafetensorError as e:  # a truncated or garbled weights file
        weights = ", ".join(str(p) for p in sorted(folder.glob("*.safetensors"))) or str(folder)
        raise DistilleryError(f"Cannot load the model in {folder}: {weights} is corrupt ({e}).") from None
    except (OSError, ValueError) as e:
        raise DistilleryError(f"Cannot load the model in {folder}: {e}") from None
    return model.eval()


def save_model(model, tokenizer, folder: Path, kind: str = "model") -> None:
    """save_pretrained (safetensors) + tokenizer into a temporary folder, marked as distillery's,
    then moved into place; an existing ``folder`` is replaced only if distillery wrote it."""
    with atomic_folder(folder) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        mark(tmp, kind)


def find_encoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The ModuleList of transformer layers (``bert.encoder.layer``, ``roberta.encoder.layer``, ...)."""
    n = model.config.num_hidden_layers
    candidates = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) == n]
    if len(candidates) != 1:
        raise DistilleryError(
            f"Cannot find the transformer layers of {type(model).__name__}: expected one list of "
            f"{n} layers, found {len(candidates)}."
        )
    return candidates[0]


def load_tokenizer(source: str):
    """AutoTokenizer from a folder or Hub id; a sentence naming the source when there is none."""
    try:
        return AutoTokenizer.from_pretrained(source)
    except OSError as e:
        raise DistilleryError(f"Could not load a tokenizer from {source}: {first_line(e)}") from None


def first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
