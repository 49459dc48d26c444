"""The Hugging Face side of every model distillery makes: student types, heads, folders.

The Auto class is chosen from the saved config's architecture, so one call serves every task head
and every student type; method packages register their configs with the Auto classes on import.
A config class may carry its ONNX settings (:class:`OnnxSpec`, the class attribute
``onnx_export``) for the export to read. Loading any saved folder, export folders included, into a
callable model is ``distillery.runtime.load_model``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import (
    CONFIG_MAPPING,
    AutoConfig,
    AutoModel,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PreTrainedModel,
)
from transformers.modeling_outputs import (BaseModelOutput, QuestionAnsweringModelOutput, SequenceClassifierOutput,
                                           TokenClassifierOutput)
from transformers.utils import ModelOutput, cached_file

from distillery.config import BASE_TEACHER, BUILTIN_TEACHER
from distillery.errors import DistilleryError, json_object, listed
from distillery.folders import atomic_folder, mark
from distillery.weights import check_against_config, check_finite, pickle_refusal, record_weights, verify_weights
import distillery.encoders as encoders

# Modules whose import registers a student type (its config and heads) with the Auto classes. The method
# packages themselves import nothing (the command line reads their options without torch).
MODEL_MODULES = ("distillery.moebert.modeling_moebert", "distillery.cmow.modeling_cmow",
                 "distillery.cmow.modeling_embedder", "distillery.autotinybert.modeling_autotinybert",
                 "distillery.prune.modeling_prune", "distillery.static.modeling_static")


def register_models() -> None:
    """Register every distillery student type with AutoConfig / AutoModel*.

    Done on first load rather than on ``import distillery``, which stays instant (the CLI's startup
    would otherwise pay for importing torch and transformers); call it, or import the student's
    ``modeling_*`` module, before using the Auto classes directly on a distillery student.
    """
    import importlib

    for name in MODEL_MODULES:
        importlib.import_module(name)


def registration_code(model_type: str) -> tuple[list[str], str]:
    """A usage snippet's lines for a student of distillery's own ``model_type`` (a model card's): the lines before
    its imports (why distillery is needed, and its import), and the call registering the type with the Auto
    classes, written after them."""
    return ([f"# needs distillery installed: the model type {model_type!r} is distillery's own, not transformers'",
             "import distillery"],
            "distillery.register_models()  # registers moebert, cmow, autotinybert and prunedbert with the Auto classes")


@dataclass(frozen=True)
class Head:
    """A task head: its name (in export manifests), the suffix of its model classes' names
    (``BertForSequenceClassification``), output fields, Auto class and output class. A task kind names the
    head it is trained with (``distillery.kinds``)."""

    name: str
    suffix: str
    outputs: tuple[str, ...]
    auto_class: Any
    output_class: Any
    # its outputs hold one entry a token (QA's logits, a tagger's, hidden states), which an export padded to its
    # block length gives back cut to the input's (runtime.OnnxModel); else one a text (a class, a sentence vector)
    per_position: bool = True


SEQUENCE_HEAD = Head("sequence-classification", "ForSequenceClassification", ("logits",),
                     AutoModelForSequenceClassification, SequenceClassifierOutput, per_position=False)
QUESTION_ANSWERING_HEAD = Head("question-answering", "ForQuestionAnswering", ("start_logits", "end_logits"),
                               AutoModelForQuestionAnswering, QuestionAnsweringModelOutput)
TOKEN_HEAD = Head("token-classification", "ForTokenClassification", ("logits",), AutoModelForTokenClassification,
                  TokenClassifierOutput)
# The task-head registry: every choice of a head by a model's class or architecture name, or by an export
# manifest's name, reads it.
HEADS = (SEQUENCE_HEAD, QUESTION_ANSWERING_HEAD, TOKEN_HEAD)
BASE_HEAD = Head("base", "Model", ("last_hidden_state",), AutoModel, BaseModelOutput)


@dataclass
class SentenceEmbeddingOutput(ModelOutput):
    """An embedder's output: one unit vector a text (sentence-transformers' name for it)."""

    sentence_embedding: torch.FloatTensor | None = None


# A bare encoder with its pooling and normalisation (``distillery.kinds.embedding.PooledEncoder``): what an
# embedder's exports compute. Named by export manifests (and by the suffix of a model giving its sentence vector
# itself, method cmow's embedder, which loads through AutoModel as a bare encoder does: head_of gives BASE_HEAD),
# so it is no task head of the registry.
SENTENCE_HEAD = Head("sentence-embedding", "ForSentenceEmbedding", ("sentence_embedding",), AutoModel,
                     SentenceEmbeddingOutput, per_position=False)


def head_of_class(name: str) -> Head | None:
    """The head of a model class (or architecture) name: ``...ForQuestionAnswering``, the bare encoder
    for ``...Model``; None for any other (``BertForMaskedLM``)."""
    return next((h for h in (*HEADS, BASE_HEAD) if name.endswith(h.suffix)), None)


def head_of(config) -> Head:
    """The head of a config's (first) architecture; the bare encoder when it names none we know."""
    arch = (getattr(config, "architectures", None) or [""])[0]
    return head_of_class(arch) or BASE_HEAD


def model_head(model) -> Head:
    """The head a model object computes: a wrapper's own ``export_head`` (an embedder with its pooling:
    ``TaskKind.export_module``), else its class's, else its config's. The class comes first: a model built in code
    has no ``architectures`` in its config, and a bare encoder loaded from a classifier's folder keeps the
    classifier's."""
    return getattr(model, "export_head", None) or head_of_class(type(model).__name__) or head_of(model.config)


def head_named(name: str) -> Head:
    """The head an export manifest names."""
    return next((h for h in (*HEADS, SENTENCE_HEAD) if h.name == name), BASE_HEAD)


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


def wants_dict(return_dict: bool | None, config) -> bool:
    """Whether a student's forward returns its output class (else ``to_tuple()``): the argument, else
    the config's ``return_dict``, as transformers' own models decide."""
    return config.return_dict if return_dict is None else return_dict


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
    for folder in (path, path / "student"):
        if (folder / "config.json").is_file():
            check_model_type(folder / "config.json")  # before anything of the folder is loaded
            return folder
    if not path.exists():
        if str(path) in (BUILTIN_TEACHER, BASE_TEACHER):  # a teacher's name, not a folder
            raise DistilleryError(
                f"{path} names a built-in teacher, a pretrained encoder without a task head, not a saved model: this "
                f"command takes a saved model folder or a run folder. Fine-tune it first (`distillery teacher --teacher "
                f"{path} --task TASK --out DIR`) and give DIR, or compress it (`--teacher {path}`).")
        raise DistilleryError(f"{path} does not exist.")
    raise DistilleryError(f"{path} is not a saved model: it has no config.json (nor student/config.json).")


# Why a folder's auto_map is refused (config.json, tokenizer_config.json).
NEVER_RUNS_CODE = "distillery never runs code that comes with a model"


def check_model_type(config_file: str | Path) -> None:
    """Refuse, from ``config_file`` (a config.json) read as plain JSON before transformers reads anything, a
    model that would be code of its own folder or repository: an ``auto_map`` (transformers would offer to run
    the Python it names, and an answer of y on stdin runs it) or a model_type that neither transformers nor
    distillery defines. Every load also passes ``trust_remote_code=False``; this check makes the refusal
    one sentence before any load, instead of transformers' prompt or a refusal after it."""
    path = Path(config_file)
    content = json_object(path, "The model config")
    if "auto_map" in content:
        raise DistilleryError(f"The model config {path} maps the model to its own Python code (auto_map "
                              f"{json.dumps(content['auto_map'])}), and {NEVER_RUNS_CODE}: give a model of a type that "
                              f"transformers defines, without auto_map.")
    model_type = content.get("model_type")
    register_models()
    if not isinstance(model_type, str) or not model_type or model_type not in CONFIG_MAPPING:
        named = f"model_type {model_type!r}" if model_type is not None else "no model_type"
        raise DistilleryError(f"The model config {path} names {named}, which neither transformers nor distillery "
                              f"defines, and {NEVER_RUNS_CODE}.")


def load_config(source: str | Path, failure: str):
    """The PretrainedConfig of a folder or Hub id (distillery's student types included), its config.json
    checked first (:func:`check_model_type`); ``failure`` begins the sentence of a config transformers cannot
    read."""
    register_models()
    try:
        # a Hub id's config.json is fetched (or found in the cache) to be checked before transformers reads it
        config_file = Path(source) / "config.json" if Path(source).is_dir() else cached_file(str(source), "config.json")
        check_model_type(config_file)
        return AutoConfig.from_pretrained(str(source), trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise DistilleryError(f"{failure}: {first_line(e)}") from None


def read_config(folder: str | Path):
    """The PretrainedConfig saved in ``folder`` (distillery's student types included)."""
    return load_config(folder, f"Cannot read the model config {Path(folder) / 'config.json'}")


def load_pretrained(folder: str | Path) -> PreTrainedModel:
    """The Hugging Face model (fp32, with its head) saved with ``save_pretrained`` in ``folder``:
    every weight must be there, of its shape, finite, and (in a folder distillery saved) unchanged."""
    folder = Path(folder)
    config = read_config(folder)
    model, _ = load_checked(head_of(config).auto_class, folder, f"the model {folder}", strict=True)
    return model.eval()


def load_checked(cls, source: str | Path, what: str, *, new_head: bool = False, strict: bool = False, **kwargs):
    """``cls.from_pretrained(source, **kwargs)`` and its loading info, refusing with a sentence what
    transformers would only log while leaving weights random: weights missing, of another shape or
    (``strict``, or inside the encoder) unexpected. A local folder is checked first: its weights
    record (:func:`distillery.weights.verify_weights`) and config.json against the weights' header,
    before a model of the config's size is built. ``new_head``: the task head (and pooler) may be
    missing or of another shape; it is replaced by a new one, trained next. ``what`` names the model
    and where it is (``teacher 'path'``, ``the model path``)."""
    import pickle

    from safetensors import SafetensorError

    folder = Path(source)
    if folder.is_dir():
        verify_weights(folder)
        check_against_config(folder, read_config(folder))
    try:
        # weights of another shape are reported in the loading info, not raised: check_loading_info
        # names them, or lets a new head (new_head) take their place
        model, info = cls.from_pretrained(str(source), output_loading_info=True, ignore_mismatched_sizes=True,
                                          trust_remote_code=False, **kwargs)
    except SafetensorError as e:  # a truncated or garbled weights file
        weights = ", ".join(str(p) for p in sorted(folder.glob("*.safetensors"))) or str(folder)
        raise DistilleryError(f"Cannot load {what}: {weights} is corrupt ({e}).") from None
    except pickle.UnpicklingError:  # torch's weights-only reader met a pickle of more than tensors
        raise pickle_refusal(folder) from None
    except (OSError, ValueError) as e:
        raise DistilleryError(f"Cannot load {what}: {first_line(e)}") from None
    check_loading_info(model, info, what, new_head=new_head, strict=strict)
    check_finite(model, source)
    return model, info


def _head_keys(model):
    """A test of whether a weight name belongs to the task head or pooler rather than to the encoder."""
    prefix = getattr(model, "base_model_prefix", "")
    if not prefix or model.base_model is model:
        # A bare encoder: its pooler is all that is task-specific of its own, and a saved weight under none of its
        # parts (classifier.*, qa_outputs.*) is the task head of the checkpoint it is loaded from, which an
        # encoder leaves behind.
        own = {key.split(".")[0] for key in model.state_dict()}
        return lambda key: key.startswith("pooler.") or key.split(".")[0] not in own
    return lambda key: not key.startswith(prefix + ".") or key.startswith(f"{prefix}.pooler.")


def check_loading_info(model, info: dict, what: str, *, new_head: bool = False, strict: bool = False) -> None:
    """Refuse a load that left encoder weights random (missing or of another shape), or, ``strict``
    (a model saved whole) or inside the encoder, put saved weights nowhere (unexpected)."""
    is_head = _head_keys(model)
    allowed = is_head if new_head else (lambda key: False)
    missing = [k for k in info.get("missing_keys", ()) if not allowed(k)]
    mismatched = [m for m in info.get("mismatched_keys", ()) if not allowed(m[0])]
    unexpected = list(info.get("unexpected_keys", ()))
    stray = unexpected if strict else [k for k in unexpected if not is_head(k)]
    if mismatched:
        key, saved, wanted = sorted(mismatched)[0]
        raise DistilleryError(f"The weights of {what} do not fit its config.json: {len(mismatched)} have another "
                              f"shape (e.g. {key}: {tuple(saved)} saved, {tuple(wanted)} in the config's model).")
    if missing or stray:
        # a missing weight would stay as initialised (random); a saved one the model has no place for, dropped
        parts = []
        if missing:
            parts.append(f"{len(missing)} weights missing ({listed(sorted(missing), 3)}), which would be left random")
        if unexpected:  # all of them: beside missing ones, a head-like name may be an encoder weight renamed
            parts.append(f"{len(unexpected)} saved weights it has no place for ({listed(sorted(unexpected), 3)}), "
                         f"which would be dropped")
        raise DistilleryError(f"The weights of {what} do not match its config.json ({getattr(model.config, 'model_type', '?')} "
                              f"model {type(model).__name__}): {' and '.join(parts)}. "
                              f"Were the weights renamed, or saved from another architecture?")


# The config.json key naming the task a model was trained for (transformers' own name for it): written into
# every model distillery trains for a task (teacher, student), read by eval (evaluation.trained_task).
FINETUNING_TASK = "finetuning_task"


def save_model(model, tokenizer, folder: Path, kind: str = "model", more_files=None) -> None:
    """save_pretrained (safetensors), the tokenizer and the weights' SHA-256 record into a temporary
    folder, marked as distillery's, then moved into place; an existing ``folder`` is replaced only if
    distillery wrote it. ``more_files(tmp)``: adds files (a task kind's) before the weights are recorded."""
    with atomic_folder(folder) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if more_files is not None:
            more_files(tmp)
        record_weights(tmp)
        mark(tmp, kind)


def find_encoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """(state-dict prefix, ModuleList) of a model's transformer layers, read through its family's layout
    (:mod:`distillery.encoders`, the one place that knows them)."""
    return encoders.layers_prefix(model), encoders.encoder_layers(model)


# The other JSON files a tokenizer folder may hold; each must be a JSON object.
# (tokenizer.json is read by the tokenizers library itself, below: one parse of a file that can be large.)
TOKENIZER_JSON = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json")


def check_tokenizer_files(folder: Path) -> None:
    """Refuse, naming it, a tokenizer file of a local folder that is not what its name says
    (transformers would fail on it with a bare JSON or key error naming no file), or that maps the tokenizer
    to the folder's own code."""
    for name in TOKENIZER_JSON:
        path = folder / name
        if not path.is_file():
            continue
        content = json_object(path, "The tokenizer file")
        if "auto_map" in content:  # a tokenizer class of the folder's own code (see check_model_type)
            raise DistilleryError(f"The tokenizer file {path} maps the tokenizer to its own Python code (auto_map "
                                  f"{json.dumps(content['auto_map'])}), and {NEVER_RUNS_CODE}.")
    fast = folder / "tokenizer.json"
    if fast.is_file():
        from tokenizers import Tokenizer

        try:
            Tokenizer.from_file(str(fast))
        except Exception as e:  # noqa: BLE001 -- the tokenizers library raises bare Exception for a file it cannot read
            raise DistilleryError(f"The tokenizer file {fast} is not a tokenizer ({first_line(e)}).") from None


def load_tokenizer(source: str):
    """AutoTokenizer from a folder or Hub id; a sentence naming the source when there is none, or
    naming the file of a local folder that is broken."""
    if Path(source).is_dir():
        check_tokenizer_files(Path(source))
    try:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    except OSError as e:
        raise DistilleryError(f"Could not load a tokenizer from {source}: {first_line(e)}") from None


def first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
