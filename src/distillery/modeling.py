"""Load any saved model distillery made (a student folder, a run folder, a fine-tuned teacher).

The Auto class is chosen from the saved config's architecture, so one call serves every task head
and every student type; method packages register their configs with the Auto classes on import.
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
    """The model saved in ``path`` with its task head, in eval mode."""
    folder = model_folder(path)
    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError) as e:
        raise DistilleryError(f"Cannot read the model config in {folder}: {e}") from None
    arch = (config.architectures or [""])[0]
    cls = next((auto for suffix, auto in HEADS.items() if arch.endswith(suffix)), AutoModel)
    try:
        model = cls.from_pretrained(folder)
    except (OSError, ValueError) as e:
        raise DistilleryError(f"Cannot load the model in {folder}: {e}") from None
    return model.eval()
