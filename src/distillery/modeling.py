"""Load any saved model distillery made (a student folder, a run folder, a fine-tuned teacher).

The Auto class is chosen from the saved config's architecture, so one call serves every task head
and every student type; method packages register their configs with the Auto classes on import.
An export folder (``distillery export``: ONNX or int8, marked by its ``distillery_export.json``)
loads through ``distillery.export.load_export`` into a model called the same way.
"""

from __future__ import annotations

from pathlib import Path

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    PreTrainedModel,
)

from distillery.errors import DistilleryError
from distillery.folders import EXPORT_MANIFEST

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

HEADS = {
    "ForSequenceClassification": AutoModelForSequenceClassification,
    "ForQuestionAnswering": AutoModelForQuestionAnswering,
}


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


def load_model(path: str | Path) -> PreTrainedModel:
    """The model saved in ``path`` with its task head, in eval mode; an export folder's model
    (ONNX Runtime or torch int8), called like the Hugging Face model it came from."""
    folder = model_folder(path)
    if (folder / EXPORT_MANIFEST).is_file():
        # Imported here: export sits at the end of the data flow and needs onnx only when used.
        from distillery.export import load_export

        return load_export(folder)
    return load_pretrained(folder)


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
    arch = (config.architectures or [""])[0]
    cls = next((auto for suffix, auto in HEADS.items() if arch.endswith(suffix)), AutoModel)
    try:
        model = cls.from_pretrained(folder)
    except SafetensorError as e:  # a truncated or garbled weights file
        weights = ", ".join(str(p) for p in sorted(folder.glob("*.safetensors"))) or str(folder)
        raise DistilleryError(f"Cannot load the model in {folder}: {weights} is corrupt ({e}).") from None
    except (OSError, ValueError) as e:
        raise DistilleryError(f"Cannot load the model in {folder}: {e}") from None
    return model.eval()
