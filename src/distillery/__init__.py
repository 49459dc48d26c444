"""distillery: turn a pretrained BERT-family encoder into a smaller, faster student, measured.

Public API::

    import distillery
    run = distillery.compress(method="distill", task="sst2", data_dir="../shared/data")
    student = distillery.load_student(run)
    distillery.evaluate(student_folder, task="sst2", data_dir=...)
    distillery.benchmark({"teacher": teacher, "student": student})
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["compress", "load_student", "evaluate", "benchmark", "register_models", "DistilleryError"]

from distillery.errors import DistilleryError


def compress(*args, **kwargs):
    """Teacher → student → evaluation → benchmark → report; returns the run folder. See pipeline.compress."""
    from distillery.pipeline import compress as _compress

    return _compress(*args, **kwargs)


def load_student(path):
    """Load a saved student (or a run folder's student) with its head, or an export folder (ONNX, int8)
    as a model called the same way. See runtime.load_model and distillery.export."""
    from distillery.runtime import load_model

    return load_model(path)


def evaluate(model, task=None, **kwargs):
    """Score a model (object or folder) on a task's dev split (a folder: by default its own task). See evaluation.evaluate."""
    from distillery.evaluation import evaluate as _evaluate

    return _evaluate(model, task, **kwargs)


def benchmark(models, **kwargs):
    """Latency and throughput of several models in one process. See bench.benchmark."""
    from distillery.bench import benchmark as _benchmark

    return _benchmark(models, **kwargs)


def register_models():
    """Register distillery's student types (moebert, ...) with the transformers Auto classes, for
    code that loads them with AutoModel* directly. load_student does it by itself."""
    from distillery.modeling import register_models as _register

    _register()
