"""``--method auto``'s results: ``auto.json``, ``report.md`` and ``plot.png``, and the model card of the model it
chose (:func:`finish` reads the finished candidates and chooses through :mod:`distillery.auto_choice`)."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping, Sequence

from distillery.auto_budget import split_lines
from distillery.auto_choice import (FREE_INT8, Target, candidate_points, choose, free_int8_point, point_record,
                                    reference_rows, write_json)
from distillery.card import write_export_card
from distillery.config import BUILTIN_TEACHER, DEFAULT_BUDGET, DEFAULT_TASK
from distillery.errors import DistilleryError
from distillery.folders import atomic_file
from distillery.markdown import fmt_metric, fmt_ms, fmt_seconds, fmt_x, md
from distillery.plot import pareto_front, write_plot
from distillery.report_parts import baseline_section, rows_table
from distillery.run_record import Run, load_run

logger = logging.getLogger("distillery")


def chosen_baselines(run: Run, model: str, folder: str | None = None) -> str:
    """The report's live-baseline section with the chosen point in the student's place: the baselines
    were timed in the same process as it (its candidate's bench). ``folder``: where the chosen point lies,
    named in the sentence on what to deploy."""
    paths = {"student": folder} if folder else None
    run = run.with_student_as(model)
    return baseline_section(run.bench, run.metrics, run.metrics.baseline_notes or (), students=("student",),
                            paths=paths)


def _verdict(p: Mapping[str, Any]) -> str:
    if p.get("failed"):
        return f"not chosen: {md(p['failed'])}"
    if p.get("within_noise"):
        return f"meets the target within its timing's {100 * (p.get('noise') or 0):.0f} % noise"
    return "meets the target" if p["meets_target"] else "misses the target"


def _point_line(p: Mapping[str, Any], main: str) -> str:
    return (f"  - {md(p['point'], code=True)}: {md(main)} {fmt_metric(p['score'])}, {fmt_ms(p['latency_ms'])} ms, "
            f"{fmt_x(p['speedup'])}: {_verdict(p)}")


def report_lines(summary: Mapping[str, Any], rows: list[dict[str, Any]], runs: Mapping[str, Any]) -> list[str]:
    main, chosen, settings = summary["main_metric"], summary["chosen"], summary["settings"]
    target = Target(**summary["target"]).for_choice(summary.get("plan_speedup"))
    budget = summary["time_budget_s"]
    lines = [f"# auto on {md(summary['task'])}: the most accurate model at {target.words()}", "",
             f"- teacher: {md(settings.get('teacher.name', BUILTIN_TEACHER), code=True)}; budget "
             f"{md(settings.get('budget', DEFAULT_BUDGET), code=True)}",
             f"- time budget: {fmt_seconds(budget) if budget else 'none'}; the teacher and the candidates took "
             f"{fmt_seconds(summary['seconds'])} ({fmt_seconds(summary['seconds_this_call'])} in this call; a finished "
             "candidate is reused, not retrained):"]
    lines += split_lines(summary.get("teacher"), summary["candidates"], runs)
    if summary.get("teacher_ms"):
        lines.append(f"- the teacher took {fmt_ms(summary['teacher_ms'])} ms here when planning, so the target is a "
                     f"{fmt_x(summary['plan_speedup'])} speed-up")
    if (summary.get("int8_gain") or 1.0) > 1.0:
        lines.append(f"- an int8 export of the teacher's architecture ran {fmt_x(summary['int8_gain'])} as fast as "
                     "fp32 here when planning: a candidate (a layer-drop depth, a pruned cut, a searched sub-network, "
                     "MoEBERT) is planned where its int8 export is expected to reach the target")
    lines += ["", "## Chosen model", "", summary["why"], ""]
    if chosen:
        lines += [f"Its folder, with its model card: {md(chosen['folder'], code=True)}.", ""]
    lines += ["## Candidates", "", "Each candidate is an ordinary compress run in `candidates/<name>/` (its own "
              "report.md beside it); its student and its int8 export were scored on the same dev set and timed in "
              "the same process as its teacher. Speed-ups are against that teacher, so points timed in different "
              "processes are compared by these ratios, never by milliseconds; a point short of the target by less "
              "than its timing's own noise (at most 5 %) meets it. The free int8 teacher is a candidate like the others; "
              "the static-embedding baseline is shown for reference only (distillery does not write it as a model "
              "to deploy).", ""]
    skipped = {s["name"] for s in summary["skipped"]}
    for c in summary["candidates"]:
        if c["name"] in skipped:  # listed below, with the reason
            continue
        # its estimate is beside its measured time in the budget's split above
        lines.append(f"- {md(c['name'], code=True)} ({md(c['method'])}: {md(c['why'])}), {c['status']}")
        lines += [_point_line(p, main) for p in c.get("points", [])]
    free = summary.get("free_int8")
    if free:
        lines.append(f"- {md(FREE_INT8, code=True)} (the teacher quantized to int8: free, no training), measured in "
                     f"every candidate's run; the median run's figures, {md(free['measured_in'], code=True)}'s:")
        lines.append(_point_line(free, main))
    for s in summary["skipped"]:
        lines.append(f"- {md(s['name'], code=True)} ({md(s['method'])}) skipped: {md(s['reason'])}")
    if rows:
        lines += ["", rows_table(rows, main, with_run=True)]
        hardware = next(iter(runs.values())).bench.hardware_line()
        lines += [f"Hardware: {md(hardware)}.", ""] if hardware else []
    return lines


def write_report(out: Path, summary: Mapping[str, Any], rows: list[dict[str, Any]], runs: Mapping[str, Any],
                 ref: str | None) -> Path:
    """``out/report.md`` and ``plot.png``: every point at its latency relative to the teacher of its own run,
    the Pareto frontier dashed, the chosen point ringed, the target drawn."""
    lines = report_lines(summary, rows, runs)
    chosen = summary["chosen"]
    if ref is not None and not (chosen and chosen["model"] == FREE_INT8):
        lines += [chosen_baselines(runs[ref], chosen["model"] if chosen else "student",
                                   chosen["folder"] if chosen else None)]
    points = [{"label": str(r["point"]), "latency_ms": 1.0 / r["latency_speedup"], "metric": r["main"]}
              for r in rows if r.get("latency_speedup") and r["main"] is not None and (r["model"] != "teacher"
                                                                                      or r.get("run") == ref)]
    if points:
        main = summary["main_metric"]
        target = Target(**summary["target"]).for_choice(summary.get("plan_speedup"))
        front = {label for label, _, _ in pareto_front(points)}
        write_plot(points, out / "plot.png", main, title=f"auto on {summary['task']}: {main} vs relative latency",
                   x_label="latency relative to the teacher timed in the same run (teacher = 1, lower is better)",
                   chosen=chosen["point"] if chosen else None, label_only=front | {"teacher"},
                   target_x=1.0 / target.speedup if target.speedup else None)
        lines += ["![score against relative latency: Pareto frontier dashed, chosen point ringed, target dotted; "
                  "the points off the frontier are named in the table](plot.png)", ""]
    path = out / "report.md"
    with atomic_file(path, "w") as f:  # a reader never finds half a report
        f.write("\n".join(lines).rstrip() + "\n")
    return path


def write_chosen_card(out: Path, summary: Mapping[str, Any], runs: Mapping[str, Run]) -> None:
    """A model card beside the chosen model: a student already has its run's; an export gets one of its own;
    the free int8 teacher is first exported into ``<out>/teacher-int8`` from the fine-tuned teacher."""
    chosen = summary["chosen"]
    if chosen["model"] == "student":
        return
    run_name = chosen.get("measured_in") or chosen["candidate"]
    folder = Path(chosen["folder"])
    if chosen["model"] == FREE_INT8:
        export_free_int8(runs[run_name], folder)
    write_export_card(folder, out / "candidates" / run_name, chosen["model"], summary["why"])


def export_free_int8(run: Run, folder: Path) -> None:
    """The run's fine-tuned teacher (train.json ``teacher_path``) exported to int8 as its free baseline was:
    the backend the baseline used for this model type (dynamic quantization is deterministic, so this is
    the model that was measured)."""
    from distillery.export import export
    from distillery.live_baselines import int8_backend
    from distillery.modeling import load_tokenizer
    from distillery.runtime import load_model

    path = run.train.teacher_path
    if not path or not Path(path).is_dir():
        raise DistilleryError(f"The int8 teacher was chosen, but its fine-tuned teacher {path} is gone, so it cannot "
                              "be exported: run `distillery export` on the teacher, or --resume after fine-tuning it.")
    teacher = load_model(path)
    fmt, _ = int8_backend("int8", teacher)
    export(teacher, load_tokenizer(str(path)), fmt, folder, source=str(path), overwrite=True)


def finish(out: Path, state: dict[str, Any], candidates: Sequence[Any], ran: Sequence[Mapping[str, Any]],
           skipped: Sequence[Mapping[str, str]]) -> Path:
    """Read the finished candidates, choose, and write ``auto.json``, ``report.md`` and ``plot.png``; the chosen
    model carries a model card (the free int8 teacher is exported into ``<out>/teacher-int8`` first)."""
    target = Target(**state["target"]).for_choice(state.get("plan_speedup"))
    folders = {c.name: out / "candidates" / c.name for c in candidates}
    runs = {name: load_run(folder) for name, folder in folders.items() if (folder / "report.md").is_file()}
    first = next(iter(runs.values()), None)
    main = first.metrics.main() if first else "score"
    points = {name: candidate_points(name, run) for name, run in runs.items()}
    free = free_int8_point(runs)
    chosen, why = choose([p for ps in points.values() for p in ps] + ([free] if free else []), target, main)
    ref = (chosen.get("measured_in") or chosen["candidate"]) if chosen else next(iter(runs), None)
    unstable = {name: warning for name, run in runs.items() if (warning := run.bench.noise_warning())}
    if ref in unstable and chosen:  # the choice rests on this run's timings
        why += f" In its run: {unstable[ref]}"
    status = {r["name"]: r for r in ran}
    entries = []
    for c in candidates:
        # a reused candidate's time is its run's own record (train.json), not this call's
        seconds = runs[c.name].train.total_seconds if c.name in runs else status.get(c.name, {}).get("seconds")
        entries.append({**asdict(c), "status": status.get(c.name, {}).get("status", "skipped"), "seconds": seconds,
                        "folder": str(folders[c.name]),
                        "points": [point_record(p, target, out) for p in points.get(c.name, [])],
                        "timings_stable": c.name not in unstable if c.name in runs else None})
    baselines = reference_rows(ref, runs[ref]) if ref else []
    teacher_spent = (state.get("teacher") or {}).get("spent_seconds") or 0.0
    summary = {**state, "status": "done", "main_metric": main, "task": first.metrics.task if first else None,
               "seconds": round(sum(e["seconds"] or 0.0 for e in entries) + teacher_spent, 1),
               "seconds_this_call": round(sum(r.get("seconds") or 0.0 for r in ran) + teacher_spent, 1),
               "candidates": entries, "skipped": list(skipped),
               "free_int8": point_record(free, target, out) if free else None,
               "chosen": point_record(chosen, target, out) if chosen else None, "why": why,
               "baselines": [{"model": r["model"], "score": r["main"], "latency_ms": r["latency_ms"],
                              "speedup": r["latency_speedup"], "measured_in": ref} for r in baselines]}
    summary["task"] = summary["task"] or state["settings"].get("data.task", DEFAULT_TASK)
    if chosen:
        write_chosen_card(out, summary, runs)
    write_json(out / "auto.json", summary)
    report = write_report(out, summary, baselines + [p for ps in points.values() for p in ps], runs, ref)
    if chosen is None:  # the run's files say everything; the exit status says it failed
        raise DistilleryError(f"{why} Every candidate is in {report}.")
    logger.info("auto: %s", why)
    return report
