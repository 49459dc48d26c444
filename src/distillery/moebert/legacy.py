"""MoEBERT folders of the first format: a BERT/RoBERTa-shaped MoEBERT model with its own parameter
names and BERT's config fields inline (with ``embedding_type`` / ``classifier_type``); they load as the
current format, the config's fields gathered into ``encoder_config`` and the weights renamed."""

from __future__ import annotations

import json
from pathlib import Path

# Fields of a first-format config.json (a BERT config with these two) that say which family it was.
_LEGACY_FIELDS = ("embedding_type", "classifier_type")


def legacy_encoder_config(kwargs: dict, config) -> dict:
    """The family config of a first-format MoEBERT config.json (BERT's fields inline, with
    ``embedding_type`` / ``classifier_type`` "bert" or "roberta"); pops those fields from ``kwargs``."""
    kinds = {kwargs.get(k, "bert") for k in _LEGACY_FIELDS}
    if len(kinds) != 1 or not kinds <= {"bert", "roberta"}:
        raise ValueError(f"This MoEBERT config.json of the first format has embedding_type / classifier_type "
                         f"{sorted(kinds)}, which no Hugging Face model has together; convert the teacher again.")
    keep = ("torch_dtype", "name_or_path", "output_attentions", "attn_implementation", "experts_implementation")
    fields = {k: kwargs.pop(k) for k in list(kwargs) if not k.startswith("_") and k not in keep}
    for k in _LEGACY_FIELDS:
        fields.pop(k, None)
    fields.update(model_type=kinds.pop(), id2label=config.id2label, label2id=config.label2id)
    return fields


# First-format folders: parameter names of the BERT/RoBERTa-shaped MoEBERT model -> the family's.
_LEGACY_KEYS = (
    (r"^moebert\.layers\.(\d+)\.attention\.", r"{p}.encoder.layer.\1.attention."),
    (r"^moebert\.layers\.(\d+)\.LayerNorm\.", r"{p}.encoder.layer.\1.output.LayerNorm."),
    (r"^moebert\.layers\.(\d+)\.experts\.", r"{p}.encoder.layer.\1.intermediate.experts."),
    (r"^moebert\.layers\.(\d+)\.gate\.", r"{p}.encoder.layer.\1.intermediate.gate."),
    (r"^moebert\.layers\.(\d+)\.hash_table$", r"{p}.encoder.layer.\1.intermediate.hash_table"),
    (r"^moebert\.embeddings\.", r"{p}.embeddings."),
    (r"^moebert\.pooler\.", r"{p}.pooler."),
)


def legacy_key_mapping(folder) -> dict[str, str] | None:
    """``from_pretrained``'s key_mapping for a local folder of the first format, else None."""
    path = Path(str(folder)) / "config.json"
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or saved.get("model_type") != "moebert" or "encoder_config" in saved:
        return None
    prefix = "roberta" if saved.get("classifier_type") == "roberta" else "bert"
    return {source: target.replace("{p}", prefix) for source, target in _LEGACY_KEYS}
