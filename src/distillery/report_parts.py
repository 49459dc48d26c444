"""What the report and the model card both say about a run: the side-by-side table, the verdict on the
student against the teacher, the run's settings, and the student against the free baselines measured beside
it (their table, and which model to deploy). Pure: a :class:`distillery.run_record.Run`'s records in, Markdown
out; ``--method auto``'s report and the CLI's deploy line read it too."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from distillery.config import setting
from distillery.errors import DistilleryError
from distillery.markdown import fmt_metric, fmt_ms, fmt_pct, fmt_rate, fmt_seconds, fmt_x, format_count, md
from distillery.metrics import is_finite_number
from distillery.run_record import (BASELINE_NAMES, STATIC_NAME, Bench, Metrics, Run, Train, is_student, student_name,
                                   teacher_name)

# --------------------------------------------------------------------------------------------
# The table and the verdict


def shape_text(rows: Sequence[Mapping[str, Any]], key: str, default: str) -> str:
    for row in rows:
        batch, seq = row[key]
        if batch and seq:
            return f"{md(batch)}×{md(seq)}"
    return default


def rows_table(rows: Sequence[Mapping[str, Any]], main: str, *, with_run: bool = False) -> str:
    """Markdown table: sizes, speed, speed-ups, main metric first then the other metrics, retention."""
    others = []
    for row in rows:
        for k in row["metrics"]:
            if k != main and k not in others:
                others.append(k)
    lat_shape = shape_text(rows, "latency_shape", "1×128")
    tp_shape = shape_text(rows, "throughput_shape", "256×64")
    head = (["run"] if with_run else []) + [
        "model",
        "params",
        "effective params",
        f"latency {lat_shape} median (ms)",
        f"throughput {tp_shape} (sent/s)",
        "latency speed-up (FLOP-ideal)",
        "throughput speed-up (FLOP-ideal)",
        md(main),
        *map(md, others),
        f"retention ({md(main)})",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = ([md(row.get("run", ""))] if with_run else []) + [
            md(row["model"]),
            format_count(row["params"]) if row["params"] is not None else "—",
            format_count(row["effective_params"]) if row["effective_params"] is not None else "—",
            fmt_ms(row["latency_ms"]),
            fmt_rate(row["throughput"]),
            _with_ideal(row["latency_speedup"], row.get("flop_ideal_latency")),
            _with_ideal(row["throughput_speedup"], row.get("flop_ideal_throughput")),
            fmt_metric(row["main"]),
            *[fmt_metric(row["metrics"].get(k)) for k in others],
            fmt_pct(row["retention"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _with_ideal(measured: float | None, ideal: float | None) -> str:
    """A measured speed-up with the FLOP-ideal one for the same shape beside it: ``1.64× (1.87×)``."""
    return fmt_x(measured) + (f" ({fmt_x(ideal)})" if ideal else "")


def _faster(x: float) -> str:
    return f"{x:.1f}× faster" if x >= 1 else f"{1 / x:.1f}× slower"


def verdict(rows: Sequence[Mapping[str, Any]], main: str, lat_shape: str = "1×128", tp_shape: str = "256×64",
            at_chance: bool = False) -> str:
    """A few sentences stating what the numbers say about the student against the teacher (``at_chance``:
    the teacher learned nothing, so the student's share of its score is not given)."""
    by_name = {r["model"]: r for r in rows}
    student, teacher = by_name.get("student"), by_name.get("teacher")
    if student is None or teacher is None:
        return "There is no teacher/student pair in this run to compare."
    parts = []
    if student["latency_speedup"] is not None:
        s = f"The student is {_faster(student['latency_speedup'])} than the teacher at {lat_shape}"
        if student["throughput_speedup"] is not None:
            s += f" ({student['throughput_speedup']:.1f}× the teacher's throughput at {tp_shape})"
        parts.append(s)
    else:
        parts.append("The student was not measured for speed")
    if at_chance:
        parts.append(f"scores {fmt_metric(student['main'])} ({md(main)}; the teacher {fmt_metric(teacher['main'])}, "
                     "at chance)")
    elif student["retention"] is not None:
        parts.append(
            f"keeps {100 * student['retention']:.1f} % of the teacher's {md(main)} "
            f"({fmt_metric(student['main'])} against {fmt_metric(teacher['main'])})"
        )
    text = " and ".join(parts) + "."
    if teacher["params"] and student["params"]:
        text += f" It has {_ratio_words(teacher['params'], student['params'], 'parameters')}"
        if teacher["effective_params"] and student["effective_params"]:
            text += f" ({_ratio_words(teacher['effective_params'], student['effective_params'], 'used per token')})"
        text += "."
    return text


def below_static_warning(metrics: Metrics) -> str | None:
    """One sentence, plain text, when the student and every export of it score below the static-embedding
    baseline measured in the same run (a bag of token vectors with a linear head), else None."""
    main, scores = metrics.main_metric, metrics.scores()
    static = scores.get(STATIC_NAME, {}).get(main)
    students = {name: values[main] for name, values in scores.items() if is_student(name) and main in values}
    if static is None or not students or max(students.values()) >= static:
        return None
    best = max(students, key=students.get)
    return (f"The student learned less than the free static-embedding baseline: {main} "
            f"{students[best]:.3f} ({best}) against {static:.3f} for {STATIC_NAME} on the same dev set. "
            "The verdict below weighs it; a shallower cut (more of the teacher's layers), more text "
            "(--unlabeled-file, distillery transfer-set) or more steps may close the gap.")


def verdict_paragraphs(run: Run, rows: Sequence[Mapping[str, Any]], main: str, lat_shape: str,
                       tp_shape: str, *, chance_line: bool = True) -> list[str]:
    """The verdict the report and the model card share, as paragraphs (each followed by a blank line): the
    student against the teacher, a teacher at chance and a student below the static-embedding baseline
    (``chance_line``: the report says them first instead), unstable timings, and what to deploy."""
    at_chance, unstable = run.metrics.chance_warning(), run.bench.noise_warning()
    below_static = below_static_warning(run.metrics)
    deploy = deploy_sentence(run.bench, run.metrics)
    return [verdict(rows, main, lat_shape, tp_shape, at_chance=bool(at_chance)), "",
            *([f"**{md(at_chance)}**", ""] if at_chance and chance_line else []),
            *([f"**{md(below_static)}**", ""] if below_static and chance_line else []),
            *([f"**{md(unstable)}**", ""] if unstable else []), *([deploy, ""] if deploy else [])]


def _ratio_words(teacher: float, student: float, what: str) -> str:
    """'2.0× fewer parameters' or, for a student with more (CMOW's embedding tables), '1.6× more parameters'."""
    if student <= teacher:
        return f"{teacher / student:.1f}× fewer {what}"
    return f"{student / teacher:.1f}× more {what}"


def fact_text(value: Any) -> str:
    """A titled field's value (:meth:`distillery.run_record.Metrics.facts`) as the report prints it."""
    if is_finite_number(value) and not isinstance(value, int):
        return fmt_metric(value)
    return md(f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else value)


def config_lines(config: Mapping[str, Any], train: Train, metrics: Metrics | None = None) -> list[str]:
    """The run's settings (config.yaml) and training record (train.json), and the titled fields of its
    metrics.json, as list items."""
    lines = []
    if config.get("teacher"):
        finetuned = setting(config, "teacher.finetuned")
        lines.append(f"- teacher: {md(teacher_name(config), code=True)}" + (" (given fine-tuned)" if finetuned else ""))
    if student_name(config):
        lines.append(f"- student: the pretrained encoder {md(student_name(config), code=True)}, distilled from the teacher")
    for label, key in (("method", "method"), ("budget", "budget"), ("task", "data.task")):
        value = setting(config, key)
        if value is not None:
            lines.append(f"- {label}: {md(value, code=True)}")
    options = setting(config, "method_options")
    if isinstance(options, Mapping) and options:
        lines.append("- method options: " + ", ".join(md(f"{k}={v}", code=True) for k, v in options.items()))
    if setting(config, "student.select_best", False):
        lines.append("- the student's weights are those of its best evaluation on this same dev split "
                     "(as GLUE papers select), so its dev score is slightly optimistic")
    used = [train.teacher_train_examples, train.train_examples]
    limits = {"train_limit": setting(config, "data.train_limit"),
              "dev_limit": setting(config, "data.dev_limit") or (metrics.dev_limit if metrics else None)}
    for key, what in (("train_limit", "training examples"), ("dev_limit", "dev examples")):
        value = limits[key]
        # a train limit the split never reached, or that only the teacher kept to (the student had them all),
        # limited nothing the scores rest on
        if key == "train_limit" and is_finite_number(value) and all(map(is_finite_number, used)) \
                and (used[0] < value or used[1] > value):
            continue
        if value:
            lines.append(f"- limited to {md(value)} {what} (`{key}`): scores are noisier than on the full set")
    lines += [f"- {md(title)}: {fact_text(value)}" for title, value in (metrics.facts() if metrics else [])]
    return lines + train_lines(config, train)


def train_lines(config: Mapping[str, Any], train: Train) -> list[str]:
    """train.json as list items: examples, the student's text, the teacher's cache, times and notes."""
    lines = []
    if is_finite_number(train.train_examples):
        teacher_n = train.teacher_train_examples
        lines.append(f"- training examples: {int(train.train_examples):,}"
                     + (f" (the teacher fine-tuned on {int(teacher_n):,} of them, and labelled the rest)"
                        if is_finite_number(teacher_n) and teacher_n < train.train_examples else ""))
    lines += student_text_lines(train)
    if train.teacher_cached and not setting(config, "teacher.finetuned"):  # a given one is not fine-tuned here
        lines.append("- teacher fine-tuning reused from the cache")
    for key, value in train.times():
        what = key.replace("_", " ")
        label = "whole run time" if what == "total" else f"{what} training time"
        lines.append(f"- {md(label)}: {fmt_seconds(value)}")
    return lines + [f"- note: {md(note)}" for note in train.notes]


def student_text_lines(train: Train) -> list[str]:
    """What the student's text held (train.json's ``student_text``): labelled, augmented and unlabeled rows,
    the augmentation source and the time the teacher spent labelling them; none for a run without new rows."""
    text = train.student_text_counts()
    if text is None:
        return []
    counts, source, seconds = text
    line = "- the student's text: " + ", ".join(f"{n:,} {k}" for k, n in counts) \
        + (f" (augmented from {md(source)})" if source else "")
    if seconds is not None:
        line += "; the teacher labelled them in " + (fmt_seconds(seconds) if seconds else "no time (its logits were cached)")
    return [line]


# --------------------------------------------------------------------------------------------
# The student against the free baselines (the records in, rows and sentences out)


def student_names(bench: Bench) -> list[str]:
    """The student and its exports measured in a bench record."""
    return [n for n in bench.models if is_student(n)]


def deploy_path(name: str) -> str:
    """Where a student variant lies in its run folder: ``student`` or ``exports/<name>``."""
    return "student" if name == "student" else f"exports/{name}"


def baseline_rows(bench: Bench, metrics: Metrics,
                  names: Sequence[str] = BASELINE_NAMES, students: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Teacher, the student variants (``students``, default the student and every export of it measured)
    and every live baseline that was both scored and measured, as rows ``{"model", "main", "latency_ms",
    "latency_speedup", "throughput_speedup"}`` (speed-ups against the teacher of the same bench record).
    A score that is not a finite number is an error: no verdict can rest on it."""
    main = metrics.main_metric
    rows = []
    for name in dict.fromkeys(("teacher", *(student_names(bench) if students is None else students), *names)):
        latency, values = bench.latency_ms(name), metrics.recorded(name)
        if latency is None or not values or values.get(main) is None:
            continue
        value = values[main]
        if not is_finite_number(value):
            raise DistilleryError(f"The run's metrics.json records {main} {value!r} for {name}, not a finite number: "
                                  "no verdict can be drawn from it. Score the model again (distillery eval).")
        speed = bench.speedup(name)
        rows.append({"model": name, "main": float(value), "latency_ms": latency,
                     "latency_speedup": speed.get("latency"), "throughput_speedup": speed.get("throughput")})
    return rows


def compare_scores(a: float, b: float) -> int:
    """1, 0 or -1 as score ``a`` is above, equal to or below ``b`` at the precision the report prints them
    (three decimals): two scores that read the same are as accurate as each other."""
    if fmt_metric(a) == fmt_metric(b):
        return 0
    return 1 if a > b else -1


def at_least_as_good(base: Mapping[str, Any], student: Mapping[str, Any]) -> bool:
    """``base`` is as accurate or more, and as fast or faster, than ``student``: nothing to gain from the student."""
    return compare_scores(base["main"], student["main"]) >= 0 and base["latency_ms"] <= student["latency_ms"]


def beats(student: Mapping[str, Any], base: Mapping[str, Any]) -> bool:
    """``student`` is as accurate or more than ``base``, and faster: the user loses nothing by taking it."""
    return compare_scores(student["main"], base["main"]) >= 0 and student["latency_ms"] < base["latency_ms"]


def _clause(student: Mapping[str, Any], base: Mapping[str, Any], main: str) -> str:
    name = f"the {base['model']} baseline"
    ours = f"{main} {fmt_metric(student['main'])} against {fmt_metric(base['main'])}"
    theirs = f"{main} {fmt_metric(base['main'])} against {fmt_metric(student['main'])}"
    speed = f"{fmt_x(student['latency_speedup'])} against {fmt_x(base['latency_speedup'])} the teacher's speed"
    their_speed = f"{fmt_x(base['latency_speedup'])} against {fmt_x(student['latency_speedup'])} the teacher's speed"
    order, faster = compare_scores(student["main"], base["main"]), student["latency_ms"] < base["latency_ms"]
    if faster:
        if order > 0:
            return f"it beats {name} on both score ({ours}) and latency ({speed})"
        if order == 0:
            return f"it is as accurate as {name} ({ours}) and faster ({speed})"
        return f"it is faster than {name} ({speed}) but less accurate ({ours})"
    if order > 0:
        return f"it is more accurate than {name} ({ours}) but slower ({speed})"
    accurate = "as accurate" if order == 0 else "more accurate"
    return f"{name} is both faster ({their_speed}) and {accurate} ({theirs})"


def deploy_choice(rows: Sequence[Mapping[str, Any]], names: Sequence[str] = BASELINE_NAMES) -> dict[str, Any] | None:
    """The student variant to deploy against the free baselines in ``rows`` (:func:`baseline_rows`), or None
    without a student row. Among the variants that no baseline matches on both score and latency, the one
    that beats the most baselines (as accurate or more, and faster), then the most accurate, then
    the fastest; when a baseline is at least as good as every variant, the most accurate variant,
    marked ``"dominated_by"`` with the baseline to use instead (the most accurate of those, then the fastest)."""
    students = [r for r in rows if is_student(r["model"])]
    bases = [r for r in rows if r["model"] in names]
    if not students:
        return None

    def rank(r):
        return (sum(beats(r, b) for b in bases), r["main"], -r["latency_ms"])

    free = [s for s in students if not any(at_least_as_good(b, s) for b in bases)]
    if free:
        return {**max(free, key=rank), "dominated_by": None}
    best = max(students, key=lambda r: (r["main"], -r["latency_ms"]))
    winners = [b for b in bases if at_least_as_good(b, best)]
    return {**best, "dominated_by": max(winners, key=lambda r: (r["main"], -r["latency_ms"]))}


def deploy_sentence(bench: Bench, metrics: Metrics, names: Sequence[str] = BASELINE_NAMES,
                    students: Sequence[str] | None = None, paths: Mapping[str, str] | None = None) -> str | None:
    """What to deploy, in one sentence, from the run's own numbers: the student variant of
    :func:`deploy_choice`, or the free baseline to use instead. None without a baseline measured beside it.
    ``paths``: where a variant lies when not at :func:`deploy_path` (auto's chosen folder)."""
    rows = baseline_rows(bench, metrics, names, students)
    pick = deploy_choice(rows, names)
    if pick is None or not any(r["model"] in names for r in rows):
        return None
    return _deploy_words(pick, metrics.main_metric, paths)


def _deploy_words(pick: Mapping[str, Any], main: str, paths: Mapping[str, str] | None) -> str:
    """:func:`deploy_sentence` for a :func:`deploy_choice` already made."""
    base, where = pick["dominated_by"], (paths or {}).get(pick["model"]) or deploy_path(pick["model"])
    if base is None:
        return (f"Deploy `{where}`: {main} {fmt_metric(pick['main'])} at "
                f"{fmt_x(pick['latency_speedup'])} the teacher's speed; no free baseline is at least as good on both "
                "score and latency, so the student earns its place.")
    return (f"Deploy the {base['model']} baseline instead ({main} {fmt_metric(base['main'])} at "
            f"{fmt_x(base['latency_speedup'])} the teacher's speed): it is at least as good on both score and latency "
            f"as the best student variant, `{where}` ({fmt_metric(pick['main'])} at "
            f"{fmt_x(pick['latency_speedup'])}), so the student is not worth its training on this task and machine.")


def baseline_verdict(bench: Bench, metrics: Metrics, names: Sequence[str] = BASELINE_NAMES,
                     students: Sequence[str] | None = None, paths: Mapping[str, str] | None = None) -> str:
    """Sentences comparing the student variant to deploy (:func:`deploy_choice`) with each live baseline of
    the same run, from its own numbers, ending with what to deploy."""
    main = metrics.main_metric
    rows = baseline_rows(bench, metrics, names, students)
    pick = deploy_choice(rows, names)
    bases = [r for r in rows if r["model"] in names]
    if pick is None or not bases:
        return "No live baseline was measured beside the student in this run, so the verdict rests on the teacher alone."
    subject = "the student" if pick["model"] == "student" else f"the student's export {pick['model']}"
    clauses = [_clause(pick, b, main) for b in bases]
    return (f"Against the free baselines measured here, {subject}: " + "; ".join(clauses) + ". "
            + _deploy_words(pick, main, paths))


def baseline_section(bench: Bench, metrics: Metrics, notes: Sequence[str] = (),
                     students: Sequence[str] | None = None, paths: Mapping[str, str] | None = None) -> str:
    """The report's "Against what you can get for free" section: the live rows and the verdict sentences
    (``students``: the student variants weighed, default the student and its exports; ``paths``: see
    :func:`deploy_sentence`)."""
    main = metrics.main_metric
    intro = ("Measured live in this run: scored on the same dev set and timed in the same process, on the same "
             "machine and shapes, as the teacher and the student. `teacher-int8` is the teacher's dynamic int8 "
             "copy; `static-embeddings` is made of token vectors distilled from the teacher (model2vec's recipe): a "
             "sentence's mean vector read by a linear head fitted on the train split (a tagger reads each word's "
             "with its neighbours'; an embedder's mean vector is its sentence vector, with no head).")
    lines = ["## Against what you can get for free", "", intro, "",
             f"| model | {md(main)} | latency (ms) | latency speed-up | throughput speed-up |", "|---|---|---|---|---|"]
    for r in baseline_rows(bench, metrics, students=students):
        lines.append(f"| {md(r['model'])} | {fmt_metric(r['main'])} | {fmt_ms(r['latency_ms'])} | "
                     f"{fmt_x(r['latency_speedup'])} | {fmt_x(r['throughput_speedup'])} |")
    lines += ["", baseline_verdict(bench, metrics, students=students, paths=paths)]
    if notes:
        lines += [""] + [f"- note: {md(n)}" for n in notes]
    return "\n".join(lines) + "\n"
