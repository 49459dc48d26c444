"""A Hub-ready student: ``student/README.md`` as a Hugging Face model card, and its upload.

The pipeline writes the card beside report.md, from the same run files, and ``distillery report RUN``
rebuilds both. Its YAML front matter comes from
huggingface_hub's ``ModelCardData`` (base model, library, pipeline tag, tags, datasets, and a
``model-index`` holding exactly the student's scores in metrics.json); its body states the speed-ups
with the hardware they were measured on, how the student was made, and how to load it.

``--push-to-hub REPO`` (and ``distillery push RUN REPO``) uploads ``student/`` with
``HfApi.create_repo`` + ``upload_folder``; what can be checked without the network (the repository
name, offline mode, a token) is checked before a run trains (:func:`check_push`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from collections.abc import Mapping
from typing import Any

import yaml

from distillery.config import BASE_TEACHER, BUILTIN_TEACHER, TEACHER_HUB_IDS, setting
from distillery.errors import DistilleryError
from distillery.folders import MARKER, atomic_file
from distillery.markdown import fmt_metric, fmt_x, md
from distillery.report_parts import config_lines, rows_table, shape_text, verdict_paragraphs
from distillery.run_record import Metrics, Run, load_run, run_rows, student_name, teacher_name
from distillery.weights import check_saved_finite, verify_weights

logger = logging.getLogger("distillery")

CARD = "README.md"
# The Hub models the built-in teachers are (config.BUILTIN_TEACHER, config.BASE_TEACHER).
# Shown in the loading snippet until the card is written for a push (which names the repository).
PLACEHOLDER_REPO = "your-name/your-model"
# Datasets' display names in the model-index, by the task's Hub dataset.
DATASET_NAMES = {"nyu-mll/glue": "GLUE", "rajpurkar/squad": "SQuAD", "rajpurkar/squad_v2": "SQuAD v2"}


def _plain(value: Any) -> str:
    """A user-named value (a task, a path) on one line: a line break inside a YAML value or a heading
    would end it."""
    return " ".join(str(value).split())


def base_model(teacher: str) -> str | None:
    """The teacher's Hub id: a built-in teacher's model, or the name itself when it is a Hub id; None for
    a local folder (a path that exists, or any name the Hub would refuse as a repository id)."""
    from huggingface_hub.utils import validate_repo_id

    if teacher in TEACHER_HUB_IDS:
        return TEACHER_HUB_IDS[teacher]
    if Path(teacher).expanduser().exists():
        return None
    try:
        validate_repo_id(teacher)
    except ValueError:  # HFValidationError: "/abs/path", "./rel", "a/b/c" are folders, not Hub ids
        return None
    return teacher


# The built-in teachers' licence and language, as their model cards give them (used when the card itself is not
# at hand: mpnet-base before it was fetched).
BUILTIN_TEACHER_CARD = {"license": "apache-2.0", "language": "en"}
# The language of the GLUE and SQuAD data sets, by Hub dataset.
DATASET_LANGUAGES = {"nyu-mll/glue": "en", "rajpurkar/squad": "en", "rajpurkar/squad_v2": "en"}


def teacher_card(teacher: str) -> dict[str, Any]:
    """``license`` and ``language`` from the teacher's own model card (its README.md front matter), where one
    can be read without the network: a local folder's, a built-in teacher's, a Hub teacher's in the local
    cache. A student inherits its teacher's licence; what is unknown is left out, not guessed."""
    from huggingface_hub import metadata_load, try_to_load_from_cache

    from distillery.teacher import resolve_teacher

    known = dict(BUILTIN_TEACHER_CARD) if teacher in TEACHER_HUB_IDS else {}
    if teacher == BUILTIN_TEACHER:
        folder = Path(resolve_teacher(teacher))
    elif teacher == BASE_TEACHER:
        from distillery.mpnet_download import folder as base_folder

        folder = base_folder()  # never fetched for a card
    else:
        folder = Path(teacher).expanduser()
    readme = folder / CARD if folder.is_dir() else None
    if readme is None and base_model(teacher):
        cached = try_to_load_from_cache(teacher, CARD)
        readme = Path(cached) if isinstance(cached, str) else None
    try:
        meta = (metadata_load(readme) if readme is not None and readme.is_file() else None) or {}
    except (OSError, ValueError, yaml.YAMLError) as e:  # a malformed front matter loses only these two fields
        logger.warning("The teacher's model card %s could not be read (%s); the student's card names no licence from it.",
                       readme, e)
        meta = {}
    if isinstance(meta.get("license"), str):
        known["license"] = meta["license"]
    language = meta.get("language")
    if isinstance(language, str) or (isinstance(language, list) and all(isinstance(x, str) for x in language)):
        known["language"] = language
    return known


def _dataset(task_name: str, metrics: Metrics, config: Mapping[str, Any]) -> dict[str, Any]:
    """The model-index dataset of the run's scores: the Hub dataset of a GLUE/SQuAD task (with its
    config and split), or the user's dev file of a custom task (``hub`` None)."""
    from distillery.data.tasks import get_task

    split = str(metrics.split or "dev")
    dev_limit = metrics.dev_limit or setting(config, "data.dev_limit")
    holdout = setting(config, "data.squad_holdout")
    # scores on part of the split say which part: the first N examples in datasets' slice syntax, a held-out share
    cut = f"[:{int(dev_limit)}]" if isinstance(dev_limit, int) and not isinstance(dev_limit, bool) else ""
    args = {"squad_holdout": holdout} if holdout else None
    try:
        spec = get_task(task_name)
    except DistilleryError:  # custom, or a name this version does not know
        dev_file = setting(config, "data.dev_file")
        name = f"{_plain(task_name)} ({_plain(Path(str(dev_file)).name)})" if dev_file else _plain(task_name)
        return {"hub": None, "type": "custom", "name": name, "config": None, "split": _plain(split) + cut, "args": None}
    hub_split = dict(spec.hub_splits).get(split, split)
    label = DATASET_NAMES.get(spec.hub_id, spec.hub_id)
    name = f"{label} {spec.glue_dir}" if spec.glue_dir else label
    return {"hub": spec.hub_id, "type": spec.hub_id, "name": name, "config": spec.hub_name, "split": hub_split + cut,
            "args": args}


def card_data(run: Run, student_config, repo_id: str | None = None, model: str = "student"):
    """The card's front matter (``ModelCardData``) for a run loaded by :func:`distillery.run_record.load_run`;
    ``model``: whose scores (the student, or an export or baseline of the run)."""
    from huggingface_hub import EvalResult, ModelCardData

    from distillery.kinds import pipeline_tag_of

    config, metrics = run.config, run.metrics
    task, method = run.task(), str(setting(config, "method", "distillation"))
    kind = run_kind(run)
    # a bare encoder's head names no kind: the run's kind does (an embedder's sentence-similarity)
    pipeline_tag = pipeline_tag_of(student_config) or (kind.pipeline_tag if kind is not None else None)
    dataset = _dataset(task, metrics, config)
    main = metrics.main()
    scores = metrics.scores().get(model, {})
    results = [EvalResult(task_type=pipeline_tag or "feature-extraction", dataset_type=dataset["type"],
                          dataset_name=dataset["name"], dataset_config=dataset["config"], dataset_split=dataset["split"],
                          dataset_args=dataset["args"], metric_type=name, metric_name=name, metric_value=value)
               for name, value in sorted(scores.items(), key=lambda item: item[0] != main)]  # the main metric first
    tags = list(dict.fromkeys(["distillery", _plain(method), _plain(task)] + (["onnx", "int8"] if "int8" in model else [])))
    student = student_name(config)
    if student and base_model(teacher_name(config)):  # a pretrained student's card names its teacher in a tag too
        tags.append(f"teacher:{base_model(teacher_name(config))}")
    teacher = teacher_card(teacher_name(config))
    # the data's language where the task says it (GLUE, SQuAD: English), else the teacher's
    language = DATASET_LANGUAGES.get(dataset["hub"]) or teacher.get("language")
    # base_model is the model these weights started from: a pretrained student's own origin (base_model names a
    # packaged encoder by its Hub id), else the teacher
    return ModelCardData(base_model=base_model(student or teacher_name(config)),
                         # an export's folder is the exported graph, loaded by distillery.load_export (its card says)
                         library_name=kind.library_name if kind is not None and model == "student" else "transformers",
                         license=teacher.get("license"), language=language,
                         pipeline_tag=pipeline_tag, tags=tags, datasets=[dataset["hub"]] if dataset["hub"] else None,
                         model_name=_plain(repo_id or f"{method}-{task}-{model}"), eval_results=results or None)


def _speed_section(run: Run, rows, main: str) -> list[str]:
    """The speed-ups against the teacher, with the hardware and shapes they were measured at."""
    lat_shape, tp_shape = shape_text(rows, "latency_shape", "1×128"), shape_text(rows, "throughput_shape", "256×64")
    hardware = run.bench.hardware_line()
    where = f"on {md(hardware)}" if hardware else "on an unrecorded machine"
    return ["## Speed and accuracy", "", *verdict_paragraphs(run, rows, main, lat_shape, tp_shape),
            (f"Measured {where}, teacher and student side by side in one process (latency: median of single "
             f"forwards at {lat_shape}; throughput at {tp_shape}). Speed-ups depend on the hardware: measure on "
             "yours with `distillery bench`."), "",
            rows_table(rows, main)]


def _made_section(run: Run) -> list[str]:
    """How the student was made: the run's settings (config.yaml) and training record (train.json)."""
    config = dict(run.config)
    teacher = teacher_name(config)
    if base_model(teacher) is None and isinstance(config.get("teacher"), Mapping):
        # a card is meant to be published: a local teacher is named by its folder, not by a path of this machine
        config["teacher"] = {**config["teacher"], "name": Path(teacher).name or teacher}
    lines = ["## How it was made", "",
             "Made with distillery (`distillery compress`), whose run recorded these settings:", ""]
    lines += config_lines(config, run.train, run.metrics)
    student = setting(config, "student", {})
    if isinstance(student, Mapping):
        settings = ", ".join(md(f"{key}={student[key]}", code=True) for key in ("epochs", "lr", "batch_size", "seed")
                             if student.get(key) is not None)
        if settings:
            lines.append(f"- student training: {settings}")
    max_length = setting(config, "data.max_length")
    if max_length is not None:
        lines.append(f"- maximum tokens per example: {md(max_length)}")
    return lines + [""]


def _task_spec(run: Run):
    """The registered task of the run (its ``TaskSpec``); None for a custom task or a name this version does not know."""
    from distillery.data.tasks import TASKS

    return TASKS.get(str(run.task()))


def run_kind(run: Run):
    """The task kind of the run's task (``distillery.kinds``); None for a custom task, whose student's head says
    enough (its kind is read from its files)."""
    spec = _task_spec(run)
    return spec.kind_object if spec is not None else None


def is_pair_task(run: Run) -> bool:
    """Whether the run's task reads sentence pairs (MRPC, STS-B, ...; custom data with a text-pair column)."""
    if run.task() == "custom":
        return bool(setting(run.config, "data.text_pair_column"))
    spec = _task_spec(run)
    return bool(spec is not None and spec.is_pair)


def _usage_section(student_config, repo_id: str | None, pair: bool = False, kind=None) -> list[str]:
    """A snippet that loads the student as it really loads: the run's task ``kind``'s own where it has one
    (``TaskKind.usage_code``: an embedder's, by sentence-transformers), else transformers' Auto class of its head,
    after ``distillery.register_models()`` for a student type of distillery's own (moebert, cmow, autotinybert),
    which transformers does not know; a sentence pair in, where the task reads pairs (``pair``)."""
    from distillery.encoders import is_distillery_student
    from distillery.modeling import head_of, registration_code

    head = head_of(student_config)
    auto = head.auto_class.__name__
    custom = is_distillery_student(student_config)
    model_type = str(getattr(student_config, "model_type", "?"))
    model_id = repo_id or PLACEHOLDER_REPO
    own = kind.usage_code(model_id, student_config, custom) if kind is not None else None
    code = ["```python"]
    if own is not None:
        return ["## How to use it", "", *code, *own, "```", "", *_load_student_line()]
    before, register = registration_code(model_type)
    if custom:
        code += before
    code += [f"from transformers import {auto}, AutoTokenizer", ""]
    if custom:
        code += [register]
    code += [f"model_id = {model_id!r}  # or the path of this folder",
             "tokenizer = AutoTokenizer.from_pretrained(model_id)",
             f"model = {auto}.from_pretrained(model_id).eval()"]
    if head.name == "question-answering":
        code += ['inputs = tokenizer("Who wrote it?", "It was written by Ada.", return_tensors="pt")',
                 "outputs = model(**inputs)  # outputs.start_logits, outputs.end_logits"]
    elif head.name == "token-classification":
        code += ['inputs = tokenizer("Ada Lovelace was born in London.", return_tensors="pt")',
                 "tags = model(**inputs).logits.argmax(-1)[0]  # one tag id a sub-word token",
                 "# model.config.id2label[int(t)] names each tag; a word's tag is its first sub-word's",
                 "# or, grouped into entities: transformers.pipeline(\"token-classification\", model=model_id, "
                 "aggregation_strategy=\"simple\")"]
    elif head.name == "sequence-classification":
        what = ("logits[0, 0] is the predicted score" if getattr(student_config, "num_labels", 2) == 1
                else "model.config.id2label[int(logits.argmax())] is the predicted class")
        text = '"The cat sat on the mat.", "A cat was sitting on the mat."' if pair else '"a sentence to classify"'
        code += [f'logits = model(**tokenizer({text}, return_tensors="pt")).logits',
                 f"# {what}"]
    code += ["```"]
    return ["## How to use it", "", *code, "", *_load_student_line()]


def _load_student_line() -> list[str]:
    return [("A local copy of this folder also loads with `distillery.load_student(folder)`, which first "
             "checks the weights against the SHA-256 record in `distillery_weights.json`."), ""]


def card_text(run: Run, student_config, repo_id: str | None = None) -> str:
    """The card's Markdown body; every user-named value goes through :func:`md`."""
    config, metrics = run.config, run.metrics
    task, method, teacher = run.task(), setting(config, "method", "distillation"), teacher_name(config)
    hub = base_model(teacher)
    origin = (f"the teacher [{md(hub)}](https://huggingface.co/{hub})" if hub else
              f"the teacher {md(Path(teacher).name or teacher, code=True)}, a local model folder (so this card names "
              "no `base_model`)")
    student = student_name(config)
    if student:
        own = base_model(student)
        origin = (f"the pretrained encoder [{md(own)}](https://huggingface.co/{own})" if own else
                  f"the pretrained encoder {md(Path(student).name or student, code=True)}, a local model folder,") + \
            f" distilled from {origin}"
    lines = [f"# {md(_plain(method))} student on {md(_plain(task))}", "",
             f"A student of {origin}, compressed by distillery's {md(method, code=True)} method and "
             f"fine-tuned for {md(task, code=True)}. Its scores on the {md(metrics.split or 'dev')} split"
             + (f" (its first {md(metrics.dev_limit)} examples)" if metrics.dev_limit else "")
             + " are in this card's `model-index`, exactly as the run measured them (metrics.json).", ""]
    main = metrics.main()
    lines += _speed_section(run, run_rows(run), main)
    lines += _made_section(run)
    lines += _usage_section(student_config, repo_id, is_pair_task(run), run_kind(run))
    return "\n".join(lines).rstrip() + "\n"


def write_card(run_dir: str | os.PathLike, repo_id: str | None = None) -> Path | None:
    """Write ``student/README.md`` of a run folder from its files; return its path (None when the run has
    no saved student). ``repo_id``: the Hub repository the card is for (its loading snippet names it)."""
    from huggingface_hub import ModelCard

    from distillery.modeling import read_config

    folder = Path(run_dir).expanduser() / "student"
    if not (folder / "config.json").is_file():
        return None
    run = load_run(run_dir)
    student_config = read_config(folder)
    # The template only places the front matter: ModelCardData writes the YAML, md() made the body safe.
    card = ModelCard.from_template(card_data(run, student_config, repo_id),
                                   template_str="---\n{{ card_data }}\n---\n\n{{ body }}",
                                   body=card_text(run, student_config, repo_id))
    path = folder / CARD
    with atomic_file(path, "w") as f:  # README.md is no weights file: the weights record and marker are untouched
        f.write(str(card))
    return path


def write_export_card(folder: str | os.PathLike, run_dir: str | os.PathLike, model: str, chosen: str) -> Path:
    """``folder/README.md``, the model card of an exported model of a run (``model``: ``student-onnx-int8``,
    ``teacher-int8``, ...), as ``--method auto`` chose it (``chosen``: the sentence saying why): its scores
    and speed-up exactly as the run measured them, with the hardware, and how to load it."""
    from huggingface_hub import ModelCard

    from distillery.modeling import read_config

    folder = Path(folder)
    run = load_run(run_dir)
    config = read_config(folder)
    main = run.metrics.main()
    rows = {r["model"]: r for r in run_rows(run)}
    row, teacher = rows.get(model) or {}, rows.get("teacher") or {}
    hardware = run.bench.hardware_line()
    where = f"on {md(hardware)}" if hardware else "on an unrecorded machine"
    body = [f"# {md(model)}: {md(_plain(run.task()))}", "", md(chosen), "",
            f"Its {md(main)} on the {md(run.metrics.split or 'dev')} split is {fmt_metric(row.get('main'))} "
            f"(the fp32 teacher: {fmt_metric(teacher.get('main'))}); its latency at 1×128 is "
            f"{fmt_x(row.get('latency_speedup'))} the teacher's speed, measured {where}, beside the teacher in one "
            "process (run folder: `" + md(Path(run_dir).name) + "`). Speed-ups depend on the hardware: measure on "
            "yours with `distillery bench`.", "", "## How to use it", "", "```python",
            "import distillery", "", "model = distillery.load_export(folder)  # this folder; onnxruntime runs an ONNX "
            "graph", "# or, with onnxruntime alone: onnxruntime.InferenceSession(f\"{folder}/model.onnx\") and "
            "AutoTokenizer.from_pretrained(folder)", "```", "",
            "`distillery_export.json` records the format, the parity against the fp32 model and the versions used.", ""]
    card = ModelCard.from_template(card_data(run, config, model=model),
                                   template_str="---\n{{ card_data }}\n---\n\n{{ body }}", body="\n".join(body))
    path = folder / CARD
    if path.is_file() and path.read_text(encoding="utf-8", errors="replace") == str(card):
        return path  # a resumed auto run leaves a finished candidate's files as they were
    with atomic_file(path, "w") as f:
        f.write(str(card))
    return path


def check_push(repo_id: str) -> None:
    """Refuse, before anything trains, a push that cannot happen: a repository id the Hub would refuse,
    offline mode, or no Hugging Face token."""
    from huggingface_hub import constants, get_token
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except ValueError:
        raise DistilleryError(f"--push-to-hub {repo_id!r} is not a Hub repository id: give one as name or "
                              f"user/name (letters, digits, '-', '_', '.').") from None
    # read now, not at import: huggingface_hub reads HF_HUB_OFFLINE once, when first imported
    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in constants.ENV_VARS_TRUE_VALUES:
        raise DistilleryError(f"Cannot push to the Hugging Face Hub repository {repo_id}: offline mode is on "
                              f"(HF_HUB_OFFLINE); unset it, then push the run with `distillery push RUN {repo_id}`.")
    if get_token() is None:
        raise DistilleryError(f"Cannot push to the Hugging Face Hub repository {repo_id}: no Hugging Face token "
                              f"(log in with `hf auth login`, or set HF_TOKEN).")


def push_student(run_dir: str | os.PathLike, repo_id: str, private: bool | None = None) -> str:
    """Upload the run's ``student/`` (its card rewritten to name ``repo_id``) to the Hub repository
    ``repo_id``, created when missing; return the repository's URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HTTPError

    from distillery.modeling import first_line

    check_push(repo_id)
    folder = Path(run_dir).expanduser() / "student"
    if not (folder / "config.json").is_file():
        raise DistilleryError(f"{run_dir} holds no saved student ({folder / 'config.json'} is missing): nothing to push.")
    # what is uploaded is what was trained: checked before the card is rewritten or anything is sent
    verify_weights(folder, required=True)
    check_saved_finite(folder)
    write_card(run_dir, repo_id)
    api = HfApi()
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True)
        # the marker says distillery may replace this local folder: it means nothing in a Hub repository
        api.upload_folder(repo_id=repo_id, folder_path=folder, ignore_patterns=[MARKER],
                          commit_message="Upload a distillery student")
    except (OSError, ValueError, HTTPError) as e:  # no network, a refused token, a repository of someone else's
        raise DistilleryError(f"Could not push {folder} to the Hugging Face Hub repository {repo_id}: {first_line(e)}. "
                              f"The run is kept; push it again with `distillery push {run_dir} {repo_id}`.") from None
    logger.info("Pushed %s to %s.", folder, url)
    return str(url)
