"""The main job: teacher → method → student, evaluated and benchmarked side by side, reported.

``compress`` writes one run folder (docs/architecture.md): config.yaml, student/, metrics.json, bench.json,
train.json, report.md, plot.png, and checkpoints/ while the student trains (removed at the end).
The student's int8 export (``int8``, on unless ``--no-int8``) is scored and measured beside it
(metrics.json "others", bench.json models "student-<format>") and kept in exports/: the verdict
weighs the student and its export against the free baselines and names the one to deploy. With
``export`` formats (``--export onnx``), teacher and student are also exported, scored and measured in
each format (bench.json models "teacher-<format>", ...).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any, Mapping

import distillery.distributed as distributed
from distillery.bench import benchmark, check_settings
from distillery.card import write_card
from distillery.config import (BUDGETS, DEFAULT_BUDGET, DEFAULT_METHOD, DEFAULT_TASK, RunConfig, nested_settings,
                               check_resumed_settings, run_inputs, setting)
from distillery.data.encode import model_device, prepare_task_data
from distillery.data.loading import check_new_rows, kind_for, load_raw, load_unlabeled, task_for
from distillery.data.tasks import get_task
from distillery.errors import DistilleryError
from distillery.evaluation import chance_score, score
from distillery.export.formats import resolve_format
from distillery.folders import (RUN_TEACHER, WriteRefused, check_target, claim, discard_unstarted, locked, write_file,
                                writing)
from distillery.live_baselines import live_baselines
from distillery.method import Method, get_method
from distillery.method_context import MethodContext
from distillery.modeling import FINETUNING_TASK, save_model
from distillery.report import write_report
from distillery.run_record import Bench, Metrics, Train, chain_link, save
from distillery.runtime import is_export, load_model
from distillery.teacher import (check_export_teacher, check_teacher, get_finetuned_teacher, resolve_teacher,
                                teacher_chain, teacher_config, teacher_identity, teacher_tokenizer)

logger = logging.getLogger("distillery")

# Epochs of the quick budget where a task does not set its own (TaskSpec.quick_epochs). Large tasks get two passes
# over the 20k-example cap (one pass left the built-in teacher at 0.866 on SST-2 and still climbing); tasks far
# smaller than the cap get more passes so that they see a comparable number of examples.
QUICK_EPOCHS_DEFAULT = 2.0
QUICK_PATIENCE = 2  # evaluations without a better dev score before the quick budget stops the teacher's fine-tuning


def budget_defaults(budget: str, task_name: str) -> dict[str, Any]:
    """Settings of a budget for a task, in dotted keys (``student.lr``), as a method's budgets and presets.

    quick: at most 20k training examples (2k SQuAD questions), short sequences, 2–3 epochs; the
    built-in teacher reaches 0.87+ on SST-2 and `make demo` ends in about 11 minutes on 2 idle CPU cores.
    full: the whole train split, 3 epochs, warm-up 10 %, as the papers fine-tune. The data settings are the
    task kind's (:meth:`distillery.kinds.base.TaskKind.budget_data`).
    """
    spec = None if task_name == "custom" else get_task(task_name)  # an alias ("squad2", "SST-2") is its task
    kind = spec.kind_object if spec is not None else kind_for("custom")  # custom data: sentences, one budget either kind
    data = kind.budget_data(budget, single_sentence=spec is not None and not spec.is_pair)
    if budget == "quick":
        epochs = (spec.quick_epochs if spec is not None else None) or QUICK_EPOCHS_DEFAULT
        # The teacher stops after QUICK_PATIENCE evaluations (400 steps) without a better dev score: the built-in
        # teacher's best SST-2 weights were those of step 400 of 1,250, so a third of its fine-tuning was thrown
        # away; the best weights are kept either way. The student has none: its dev score dips early and climbs
        # late as the rate decays (SST-2's stopped at step 600 with 0.856, where its whole pass gives 0.889).
        teacher = {"epochs": epochs, "lr": kind.quick_teacher_lr, "batch_size": 32, "eval_every": 200,
                   "patience": QUICK_PATIENCE}
        student = {"epochs": epochs, "lr": kind.student_lr, "batch_size": 32, "eval_every": 200}
    else:
        teacher = {"epochs": 3.0, "lr": 5e-5, "batch_size": 32, "warmup_ratio": 0.1, "eval_every": 1000}
        student = {"epochs": 3.0, "lr": kind.student_lr, "batch_size": 32, "warmup_ratio": 0.1, "eval_every": 1000}
    return {**{f"data.{k}": v for k, v in data.items()}, **{f"teacher.train.{k}": v for k, v in teacher.items()},
            **{f"student.{k}": v for k, v in student.items()}}


def resolve_settings(*layers: Mapping[str, Any] | None, preset: str | None = None) -> RunConfig:
    """The one place a run's settings are resolved into a RunConfig. Lowest first: the defaults (config.py), the
    budget's for the task and the method's for the budget, the method's ``preset`` (moebert: ``paper``, Table 7),
    then each of ``layers`` in order (dotted keys, ``"student.lr"``; a value None is not given; a later layer
    wins): a ``--config`` file, the flags, auto's settings of one candidate. The method's options are checked
    by its specs in :func:`compress` (``Method.check``), before the run folder is touched."""
    given: dict[str, Any] = {}
    for layer in layers:
        given.update({k: v for k, v in (layer or {}).items() if v is not None})
    method, task = given.get("method", DEFAULT_METHOD), given.get("data.task", DEFAULT_TASK)
    budget = given.get("budget", DEFAULT_BUDGET)
    chosen = get_method(method)
    spec = get_task(task) if task != "custom" else None  # an unknown task fails here, before anything is loaded
    if spec is not None:  # new rows for SQuAD refused now, as the settings are read, not recorded and never used
        check_new_rows(spec, given.get("method_options.augment"), given.get("data.unlabeled_file"))
    if budget not in BUDGETS:
        raise DistilleryError(f"Unknown budget {budget!r}; choose {' or '.join(BUDGETS)}.")
    settings = {**budget_defaults(budget, task), **chosen.budget_overrides(budget),
                "method": method, "budget": budget, "data.task": task}
    if spec is not None and given.get("method_options.student") and spec.kind_object.pretrained_student_lr:
        settings["student.lr"] = spec.kind_object.pretrained_student_lr  # a --lr, a preset or a settings file wins
    if preset:  # the preset fills in; settings the user gave explicitly still win
        settings.update(_epochs_everywhere(chosen.preset(preset, task)))
    if spec is not None and not spec.kind_object.augments_by_default:  # the full budget's augmentation: sentences
        settings.pop("method_options.augment", None)
    settings.update(_epochs_everywhere(given))
    return RunConfig.from_dict(nested_settings(settings))


def build_run_config(method: str | None = None, task: str | None = None, budget: str | None = None,
                     teacher: str | None = None, data_dir: str | None = None, out: str | None = None,
                     overrides: Mapping[str, Any] | None = None, preset: str | None = None) -> RunConfig:
    """:func:`resolve_settings` with the common settings named (None: the default) and ``overrides`` in dotted
    keys (``"data.max_length"``, ``"method_options.student_layers"``) over them."""
    named = {"method": method, "data.task": task, "budget": budget, "teacher.name": teacher,
             "data.data_dir": data_dir, "out": out}
    return resolve_settings(named, overrides, preset=preset)


def _epochs_everywhere(settings: dict[str, Any]) -> dict[str, Any]:
    """A number of student epochs given explicitly (a flag, a settings file, a preset) is the student's
    number of passes whatever its data: the budget's own choice for the whole split
    (``student.whole_split_epochs``) gives way to it."""
    if "student.epochs" in settings and "student.whole_split_epochs" not in settings:
        return {**settings, "student.whole_split_epochs": settings["student.epochs"]}
    return settings


def default_out(config: RunConfig) -> Path:
    return Path("runs") / f"{config.data.task}-{config.method}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_folder_config(config: RunConfig, resume: bool, given: dict[str, Any] | None = None) -> tuple[Path, RunConfig]:
    """The run folder, and the config to run: the saved one when resuming. Writes nothing.

    ``given``: the settings the user gave explicitly (dotted keys). A resumed run continues with
    its saved settings, so one given with another value is refused rather than silently ignored;
    only the data folder may differ (the same files may have moved)."""
    # the default name holds the time: under a launcher, the main process's is everyone's
    out = Path(config.out) if config.out else distributed.on_main(default_out, config)
    if not resume:
        return out, config
    check_target(out, resume=True)  # a folder distillery did not write is not resumed into, whatever it holds
    saved = out / "config.yaml"
    if not saved.is_file():
        raise DistilleryError(f"Cannot resume: {out} holds no config.yaml of an earlier run.")
    fresh, config = config, RunConfig.load(saved)
    config.out = str(out)
    given = {k: v for k, v in (given or {}).items() if v is not None and k != "out"}
    if "data.data_dir" in given:
        config.data.data_dir = fresh.data.data_dir
    fresh_settings = fresh.to_dict()
    check_resumed_settings(out, config.to_dict(), {key: setting(fresh_settings, key) for key in given
                                                   if key != "data.data_dir"},
                           "Drop them to resume, or start a new run (another --out) to change them.")
    return out, config


def prepare_run_folder(out: Path, config: RunConfig, overwrite: bool, resume: bool) -> None:
    """Create (and mark) the run folder, its config.yaml and the teacher's identity; refuse to clobber
    anything (see folders). A resume checks that the teacher is still the one the run started with."""
    if resume:
        check_same_teacher(out, config)
        logger.info("Resuming the run in %s with its saved settings.", out)
        return
    with writing(out, "the run folder"):
        claim(out, "run", overwrite=overwrite, inputs=run_inputs(config))
        write_file(out / "config.yaml", config.to_yaml())
        write_file(out / RUN_TEACHER, json.dumps(run_identity(config), indent=2))


def run_identity(config: RunConfig) -> dict:
    """What the run's models are, by content (:func:`~distillery.teacher.teacher_identity`): the teacher's, and
    a pretrained student's (method distill's ``--student``) under ``student``."""
    identity = teacher_identity(config.teacher.name)
    student = config.method_options.get("student")
    return {**identity, "student": teacher_identity(student)} if student else identity


def check_same_teacher(out: Path, config: RunConfig) -> None:
    """Refuse to resume a run whose teacher changed since it started (weights changed in place, another
    Hub revision): its checkpoints were trained against the old one, and the report would name one teacher."""
    path = out / RUN_TEACHER
    if not path.is_file():
        logger.warning("%s has no %s (a run from before it was kept): the teacher is not checked against the one "
                       "the run started with.", out, RUN_TEACHER)
        return
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        raise DistilleryError(f"{path} is damaged; the teacher this run started with is unknown, so it is not "
                              f"resumed. Start it again (--overwrite).") from None
    now = run_identity(config)
    if saved == now:
        return
    student = config.method_options.get("student")
    if student and isinstance(saved, dict) and saved.get("student") != now.get("student"):
        raise DistilleryError(f"The student {student} is not the one this run started with (its files changed, or "
                              f"it resolves to another Hub revision); its tokenizer and checkpoints would not fit, so "
                              f"the run is not resumed. Restore the student, or start a new run (another --out, or "
                              f"--overwrite).")
    files, before = now.get("files", {}), saved.get("files", {}) if isinstance(saved, dict) else {}
    changed = sorted(name for name in set(files) | set(before) if files.get(name) != before.get(name))
    what = (f"its {', '.join(changed)} changed" if changed
            else f"it resolves to {now} now, {saved} when the run started")
    raise DistilleryError(f"The teacher {config.teacher.name} is not the one this run started with ({what}); its "
                          f"checkpoints were trained against the old teacher, so the run is not resumed. Restore the "
                          f"teacher, or start a new run (another --out, or --overwrite).")


def compress(config: RunConfig | None = None, *, overwrite: bool = False, resume: bool = False,
             given: dict[str, Any] | None = None, **kwargs) -> Path:
    """Run the whole job and return the run folder.

    Either pass a RunConfig, or keyword arguments of :func:`build_run_config` (method, task, budget,
    teacher, data_dir, out, overrides). ``given``: with ``resume``, the settings the caller gave
    explicitly (dotted keys), which must match the saved run's (see :func:`run_folder_config`).
    """
    if config is None:
        config = build_run_config(**kwargs)
    elif kwargs:
        raise DistilleryError("Pass either a RunConfig or keyword settings to compress(), not both.")
    out, config = run_folder_config(config, resume, given)
    # Everything that can be checked without training is checked before the run folder is touched.
    method = get_method(config.method)
    task = task_for(config.data)
    method.check_kind(task, config)
    if config.data.label_all_subwords and not task.kind_object.word_labels:  # it would be recorded, never used
        raise DistilleryError(f"--label-all-subwords labels the sub-words of tagged words, but task {task.name} labels "
                              f"whole sentences; drop it.")
    # a RunConfig given whole (the Python API, a resumed run's config.yaml) has not been through resolve_settings
    check_new_rows(task, getattr(method.options(config), "augment", 0), config.data.unlabeled_file)
    task.kind_object.check_data(task, config.data)
    if config.export and not task.kind_object.exports:
        raise DistilleryError(f"--export: a {task.kind} student is not exported yet; drop --export.")
    if config.data.unlabeled_file:  # a bad file is refused now, not after the teacher's fine-tuning
        load_unlabeled(config.data.unlabeled_file, task)
    check_settings(config.bench)
    model_config = teacher_config(config.teacher.name)
    check_teacher(config.teacher.name, model_config, config.data)
    # refuses a teacher whose own files say it computes something else (check_teacher) and reads the rest of them
    task.kind_object.settle_data(f"Teacher {config.teacher.name}", resolve_teacher(config.teacher.name), config.data,
                                 model_config)
    check_export_teacher(config.teacher, config.method, method.teacher_outputs_only)
    method.check(config, model_config)
    config.out = str(out)
    if not resume:  # the output path itself (a file, a link, a name too long) is refused before its lock is taken
        check_target(out, overwrite=overwrite, inputs=run_inputs(config))
    with _run_lock(out):
        # Under a launcher the main process claims the folder; the others wait for it (and stop with it
        # when it refuses: the launcher ends the group).
        distributed.on_main(prepare_run_folder, out, config, overwrite, resume)
        try:
            return _run(config, out, task, method, resume)
        except WriteRefused:
            raise  # a full disk: the folder stays, so that --resume continues once there is space
        except Exception:
            # A failure before training (a missing data file, a bug) must not leave behind a folder that
            # the corrected rerun would trip over. An interrupted run keeps its folder for --resume.
            if not resume and distributed.is_main():
                discard_unstarted(out)
            raise


def _run_lock(out: Path):
    """One process at a time in a run folder (the main one of a launch): another run on the same
    --out, or a --resume of a live run, is refused with a sentence; held until the run ends or dies."""
    return locked(out, wait=False) if distributed.is_main() else contextlib.nullcontext()


def _run(config: RunConfig, out: Path, task, method: Method, resume: bool) -> Path:
    started = time.time()
    teacher, tokenizer, task_data, teacher_info = _teacher(config, task)
    logger.info("[2/5] Student: method %s, %d training examples.", config.method, len(task_data.train))
    ctx = MethodContext(config=config, teacher=teacher, tokenizer=tokenizer, task_data=task_data,
                        out_dir=out, resume=resume)
    t0 = time.time()
    # The student's random parts (cmow's whole model, a projection, a router) are drawn after this seed,
    # not from whatever the teacher's step left in the generators (fine-tuned now, or read from the cache)
    from transformers import set_seed

    set_seed(config.student.seed)
    student = method.run(ctx)
    student_seconds = time.time() - t0
    student.eval()
    if not distributed.is_main():  # every process holds the trained student; the main one reports it
        return out
    setattr(student.config, FINETUNING_TASK, task.name)  # eval scores it on this task only (unless told otherwise)
    task.kind_object.mark_config(student.config, config.data)  # it computes as the run did (an embedder's pooling)
    with writing(out / "student", "the trained student"):
        save_model(student, ctx.student_side[0], out / "student",  # a pretrained student keeps its own tokenizer
                   more_files=lambda tmp: task.kind_object.write_files(tmp, config.data.max_length))
    # scored, exported and timed as saved: metrics.json describes the model a user loads, to the last bit (an
    # in-memory parameter's layout can change a score in its ninth decimal)
    student = load_model(out / "student").to(model_device(student))

    metrics, variants = _evaluate(config, out, task, ctx, student, teacher_info)
    save(out, metrics)

    logger.info("[4/5] Benchmarking teacher and student%s in one process.", " and their variants" if variants else "")
    bench = Bench(benchmark({"teacher": teacher.cpu(), "student": student.cpu(), **variants}, **config.bench))
    save(out, bench)

    logger.info("[5/5] Writing the report.")
    save(out, Train(teacher_seconds=teacher_info.get("seconds"), teacher_cached=teacher_info.get("cached"),
                    teacher_path=teacher_info.get("path"), student_seconds=student_seconds,
                    train_examples=ctx.student_examples or len(task_data.train),
                    teacher_train_examples=len(task_data.train), student_text=ctx.student_text,
                    total_seconds=time.time() - started, notes=ctx.notes))
    with writing(out, "the report"):
        write_report(out)
        write_card(out)  # student/README.md, the model card, from the same files as the report
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    main = task.main_metric
    logger.info("Done: %s (student %s = %.4f, teacher %.4f, latency speed-up %.2fx).", out, main,
                metrics.student[main], metrics.teacher[main], bench.student_latency_speedup())
    return out


def _teacher(config: RunConfig, task):
    """The fine-tuned teacher, its tokenizer, the task's encoded data and what the fine-tuning reported."""
    logger.info("[1/5] Teacher: %s on %s (%s budget).", config.teacher.name, task.name, config.budget)
    # A fine-tuned teacher keeps its base's tokenizer, so the data is encoded once for both.
    tokenizer = teacher_tokenizer(config.teacher.name)
    task_data = prepare_task_data(task, tokenizer, config.data)
    teacher, tokenizer, teacher_info = get_finetuned_teacher(config.teacher, task, config.data, task_data)
    task.kind_object.mark_config(teacher.config, config.data)  # its exports compute as the run reads it
    teacher.eval()
    return teacher, tokenizer, task_data, teacher_info


def prepare_teacher(config: RunConfig) -> dict[str, Any]:
    """The run's teacher fine-tuned now, or read from the cache, ahead of any run (``--method auto`` times it
    apart from its candidates, which then read it from the cache): its record (``seconds``, ``cached``,
    ``train_examples``, ``path``) with ``whole_split``, the number of examples in the task's train split."""
    from dataclasses import replace

    task = task_for(config.data)
    model_config = teacher_config(config.teacher.name)
    check_teacher(config.teacher.name, model_config, config.data)
    task.kind_object.settle_data(f"Teacher {config.teacher.name}", resolve_teacher(config.teacher.name), config.data,
                                 model_config)
    _, _, task_data, info = _teacher(config, task)
    whole = len(load_raw(task, "train", replace(config.data, train_limit=None)))
    return {"seconds": info.get("seconds"), "cached": info.get("cached"), "path": info.get("path"),
            "train_examples": info.get("train_examples") or len(task_data.train), "whole_split": whole}


def _evaluate(config: RunConfig, out: Path, task, ctx: MethodContext, student, teacher_info: dict):
    """metrics.json's content (teacher and student on dev, other dev splits, export variants, the chain
    of teachers), and the export variants to measure beside them."""
    teacher, tokenizer, task_data = ctx.teacher, ctx.tokenizer, ctx.task_data
    student_tokenizer, student_data = ctx.student_side  # the teacher's, or a pretrained student's own
    batch_size = config.student.eval_batch_size
    logger.info("[3/5] Evaluating teacher and student on %s dev (%d examples).", task.name, len(task_data.dev_examples))
    # A teacher fine-tuned here (now or cached under a key holding these data settings) was already
    # scored on this dev set; only a teacher given fine-tuned needs a pass.
    teacher_metrics = teacher_info.get("metrics") or score(teacher, task_data, batch_size=batch_size)
    student_metrics = score(student, student_data, batch_size=batch_size)
    main = task.main_metric
    metrics = Metrics(task=task.name, split=task.dev_splits[0], main_metric=main, teacher=teacher_metrics,
                      student=student_metrics,
                      retention=student_metrics[main] / teacher_metrics[main] if teacher_metrics[main] else None)
    # the report flags a teacher that scores no better than a model that learned nothing
    metrics.chance = chance_score(task_data)
    metrics.dev_examples = task.kind_object.dev_size(task_data)  # what the main metric averages over
    metrics.tie_metrics = task.kind_object.tie_metrics(task_data) or None
    for split in task.dev_splits[1:]:  # MNLI: dev_mismatched beside the main dev_matched
        other = {id(tok): prepare_task_data(task, tok, config.data, splits=(split,)) for tok in (tokenizer, student_tokenizer)}
        metrics.other_splits = metrics.other_splits or {}
        metrics.other_splits[split] = {
            name: score(model, other[id(tok)], batch_size=batch_size)
            for name, model, tok in (("teacher", teacher, tokenizer), ("student", student, student_tokenizer))
        }
    variants: dict[str, Any] = {}
    if config.export:
        from distillery.export import build_variants, kept_exports_folder  # onnx is needed only when asked for

        logger.info("[3/5] Exporting teacher and student as %s; scoring the variants.", ", ".join(config.export))
        # a teacher given as an export (ONNX, int8) is already one of them: only the student is exported. Each
        # is scored on its own tokenizer's encoding (a pretrained student's differs from the teacher's).
        models = {"teacher": (teacher, tokenizer, task_data)} if not is_export(teacher) else {}
        metrics.others = {}
        for name, (model, tok, data) in {**models, "student": (student, student_tokenizer, student_data)}.items():
            made, scores, _ = build_variants(
                {name: (model, tok)}, config.export, task_data=data,
                source_metrics={"teacher": teacher_metrics, "student": student_metrics},
                save_dir=out / "exports", save=("student",),
                sources={"teacher": teacher_info.get("path"), "student": str(out / "student")},
                kept={"teacher": kept_exports_folder(teacher_info.get("path"), data)} if name == "teacher" else None)
            variants.update(made)
            metrics.others.update(scores)
    if not task.kind_object.exports and (config.int8 or config.baselines):
        ctx.notes.append(f"No int8 export and no free baselines: a student of kind {task.kind} is not exported yet.")
    elif config.int8:
        try:
            exported, scores = student_int8(student, student_tokenizer, student_data, student_metrics, out, variants)
        except DistilleryError as e:  # asked for by default, not by the user: the run keeps its fp32 student
            logger.warning("The student's int8 export failed, so only the fp32 student is measured: %s", e)
            ctx.notes.append(f"No int8 export of the student: {e}")
        else:
            variants.update(exported)
            if scores:
                metrics.others = {**(metrics.others or {}), **scores}
    if config.baselines and task.kind_object.exports:
        variants.update(_baselines(config, ctx, metrics, variants, teacher_info.get("path")))
    if config.data.dev_limit:
        metrics.dev_limit = config.data.dev_limit
    chain = teacher_chain(config.teacher.name)  # the teacher is an earlier run's student: the models before it
    if chain:
        metrics.chain = chain + [chain_link(str(out / "student"), config.method, task.name, student_metrics)]
    return metrics, variants


def student_int8(student, tokenizer, task_data, student_metrics: dict, out: Path,
                 variants: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The student's int8 export (the faster int8 backend for its model type), kept in
    ``exports/student-<format>``, scored on dev: the variant and its metrics, or nothing when ``--export``
    made it already. A student that cannot be exported is reported by the export's own sentence."""
    from distillery.export import build_variants  # imported here: onnx is loaded only when a run exports

    if f"student-{resolve_format('int8', student.config)}" in variants:
        return {}, {}
    logger.info("[3/5] Exporting the student to int8 and scoring it.")
    exported, scores, _ = build_variants({"student": (student, tokenizer)}, ["int8"], task_data=task_data,
                                         source_metrics={"student": student_metrics}, save_dir=out / "exports",
                                         save=("student",), sources={"student": str(out / "student")})
    return exported, scores


def _baselines(config: RunConfig, ctx: MethodContext, metrics: Metrics, variants: dict[str, Any],
               teacher_folder: str | None) -> dict[str, Any]:
    """The free baselines, measured live on this task and machine (the teacher's int8 copy, a static-embedding
    model distilled from the teacher): their dev metrics go into ``metrics.baselines``, the models to the bench."""
    if is_export(ctx.teacher):
        metrics.baseline_notes = ["No live baselines: the teacher is an export (its int8 copy or token vectors "
                                     "come from the PyTorch model it was exported from)."]
        return {}
    logger.info("[3/5] The free baselines: the teacher's int8 copy and static embeddings distilled from it.")
    # an --export int8 of the teacher is this baseline already: reuse it rather than export and score it again
    exported = f"teacher-{resolve_format('int8', ctx.teacher.config)}"
    given = (variants[exported], metrics.others[exported]) \
        if exported in variants and exported in (metrics.others or {}) else None
    texts = ctx.distillation_train(False) if ctx.task_data.task.kind_object.static_table_baseline else None
    bl = live_baselines(ctx.teacher, ctx.tokenizer, ctx.task_data, teacher_metrics=metrics.teacher,
                        teacher_int8=given, batch_size=max(config.student.eval_batch_size, 256),
                        teacher_folder=teacher_folder, texts=texts)
    metrics.baselines = {name: m for name, (_, m) in bl.items()}
    metrics.baseline_notes = list(bl.notes)
    return {name: model for name, (model, _) in bl.items()}
