"""Reading a sentence-transformers model's files: how it pools (:func:`folder_pooling`), its prompts
(:func:`folder_prompts`) and settings, from a folder or a Hub repository's cache; what distillery cannot distil as
sentence-transformers computes it is refused in a sentence. Writing them is
:meth:`distillery.kinds.embedding.Embedding.write_files`'s."""

from __future__ import annotations

import json
from pathlib import Path

from distillery.config import SENTENCE_POOLINGS as POOLINGS
from distillery.errors import DistilleryError
from distillery.modeling import SENTENCE_HEAD

# sentence-transformers' Transformer module reading a model's own sentence vector (its forward's
# ``sentence_embedding``) instead of token embeddings to pool: what a student giving one is saved with
# (:func:`gives_own_vector`; method cmow's embedder)
OWN_VECTOR = {"modality_config": {"text": {"method": "forward", "method_output_name": SENTENCE_HEAD.outputs[0]}},
              "module_output_name": SENTENCE_HEAD.outputs[0]}

# sentence-transformers' pooling config before version 6: one flag a mode
LEGACY_POOLING_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                        "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                        "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}


def gives_own_vector(config: dict) -> bool:
    """Whether a model (its config.json, read as JSON) gives its sentence vector itself (``sentence_embedding``,
    an architecture named ``...ForSentenceEmbedding``: method cmow's embedder) rather than token states to pool."""
    return str((config.get("architectures") or [""])[0]).endswith(SENTENCE_HEAD.suffix)


def _model_file(folder, relative: str) -> Path | None:
    """``relative`` in a model's folder, or in its Hub repository's local cache (fetched; None where it has none)."""
    local = Path(folder) / relative
    if Path(folder).is_dir():
        return local if local.is_file() else None
    from transformers.utils import cached_file

    try:
        found = cached_file(str(folder), relative, _raise_exceptions_for_missing_entries=False,
                            _raise_exceptions_for_connection_errors=False)
    except (OSError, ValueError):  # not a Hub id either: a plain encoder's name that resolves elsewhere
        return None
    return Path(found) if found else None


def folder_pooling(name: str, folder) -> str | None:
    """How the sentence-transformers model in ``folder`` (a folder or Hub id; ``name`` says which in a sentence)
    pools: one of :data:`POOLINGS`; None where it holds no sentence-transformers modules (a plain encoder)
    or gives its own sentence vector (:func:`gives_own_vector`, read by sentence-transformers' transformer module as
    that vector, then normalised). Any other pipeline (several poolings at once, a Dense module...) is refused with a sentence:
    its vectors would not be the ones the student learns to give, or the export computes."""
    modules_file = _model_file(folder, "modules.json")
    if modules_file is None:
        return None
    try:
        modules = json.loads(modules_file.read_text())
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        pooling = next((_model_file(folder, f"{m['path']}/config.json") for m in modules
                        if m["type"].endswith("Pooling")), None)
        modes = json.loads(pooling.read_text()) if pooling is not None else {}
        first, config = (_model_file(folder, f"{modules[0]['path']}/{f}".lstrip("/"))
                         for f in ("sentence_bert_config.json", "config.json"))
        reads = json.loads(first.read_text()).get("module_output_name") if first is not None else None
        own = config is not None and gives_own_vector(json.loads(config.read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise DistilleryError(f"{name}: {modules_file} is not a sentence-transformers modules list "
                              f"({type(e).__name__}: {e}).") from None
    if modes.get("include_prompt") is False:  # INSTRUCTOR's: pooling without the prompt's tokens
        raise DistilleryError(f"{name} pools its tokens without its prompt's (include_prompt: false in its pooling "
                              f"config); distillery pools every token of the text it is given.")
    if own and kinds[:1] == ["Transformer"] and set(kinds[1:]) <= {"Normalize"} \
            and reads == OWN_VECTOR["module_output_name"]:
        return None
    # sentence-transformers 6 writes "pooling_mode": "mean" (or a list of modes); earlier versions a flag a mode
    mode = modes.get("pooling_mode")
    if "pooling_mode" in modes:
        used = [mode] if isinstance(mode, str) else list(mode) if isinstance(mode, list) else [str(mode)]
    else:
        used = [LEGACY_POOLING_FLAGS.get(k, k) for k, v in modes.items() if k.startswith("pooling_mode_") and v]
    if kinds[:2] != ["Transformer", "Pooling"] or set(kinds[2:]) - {"Normalize"} or len(used) != 1 \
            or used[0] not in POOLINGS:
        raise DistilleryError(f"{name} is a sentence-transformers model of modules {', '.join(kinds)} with "
                              f"pooling {' + '.join(map(str, used)) or 'unknown'}; distillery distils and exports a "
                              f"transformer with one pooling ({', '.join(POOLINGS)}) and normalisation so far.")
    similarity = None if "Normalize" in kinds else _model_settings(name, folder).get("similarity_fn_name")
    if similarity in ("dot", "dot_product"):
        raise DistilleryError(f"{name} ranks texts by the dot product of vectors it does not normalise "
                              f"(similarity_fn_name {similarity!r}, no Normalize module); distillery distils and "
                              f"scores an embedder's unit vectors (cosine), which rank them otherwise.")
    return used[0]


def _model_settings(name: str, folder) -> dict:
    """The sentence-transformers model settings in ``folder`` (``config_sentence_transformers.json``: prompts,
    similarity function), ``{}`` where it has none; one that is not a JSON object is refused in a sentence."""
    found = _model_file(folder, "config_sentence_transformers.json")
    if found is None:
        return {}
    try:
        settings = json.loads(found.read_text())
        if not isinstance(settings, dict):
            raise ValueError(f"it holds a {type(settings).__name__}, not an object")
    except (OSError, ValueError) as e:
        raise DistilleryError(f"{name}: {found} is not a sentence-transformers model config ({e}).") from None
    return settings


def folder_prompts(name: str, folder) -> tuple[dict[str, str], str | None]:
    """The prompts of the sentence-transformers model in ``folder`` (a folder or Hub id) and its default prompt's name:
    ``({}, None)`` where it has none (an empty prompt is none)."""
    settings = _model_settings(name, folder)
    prompts, default = settings.get("prompts") or {}, settings.get("default_prompt_name")
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        problem = f"its prompts are not a mapping of names to texts: {prompts!r}"
    elif default is not None and default not in prompts:
        problem = f"its default_prompt_name {default!r} is not one of its prompts"
    else:
        problem = None
    if problem:
        raise DistilleryError(f"{name}: {_model_file(folder, 'config_sentence_transformers.json')} is not a "
                              f"sentence-transformers model config ({problem}).")
    prompts = {str(k): v for k, v in prompts.items() if v}
    return prompts, default if default in prompts else None
