"""Tasks, raw loading, encoding and unlabelled corpora (the "data" stage of the pipeline)."""

from distillery.data.corpus import mlm_collator, mlm_dataset, read_corpus
from distillery.data.encode import (
    PadCollator,
    TaskData,
    encode_pair,
    encode_separate_pair,
    encode_single,
    encode_squad_eval,
    encode_squad_train,
    postprocess_squad,
    prepare_task_data,
)
from distillery.data.loading import custom_task, load_raw, squad_holdout_split, task_for
from distillery.data.tasks import TASKS, TaskSpec, get_task

__all__ = [
    "TASKS",
    "PadCollator",
    "TaskData",
    "TaskSpec",
    "custom_task",
    "encode_pair",
    "encode_separate_pair",
    "encode_single",
    "encode_squad_eval",
    "encode_squad_train",
    "get_task",
    "load_raw",
    "mlm_collator",
    "mlm_dataset",
    "postprocess_squad",
    "prepare_task_data",
    "read_corpus",
    "squad_holdout_split",
    "task_for",
]
