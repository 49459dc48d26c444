"""Issue 53's diagnosis of deep-cut students (docs/distill.md, "Deep cuts"): one process per task, the teacher
fine-tuned once (or read from the cache) and many 2-of-6 or 1-of-6 layer-drop students trained through the
project's own trainer and distillation loss, each setting given as JSON. Results append to
runs/deep-cut-diagnosis/results.jsonl (DEEP_CUT_DIAGNOSIS sets the folder).

    python benchmarks/deep_cut_diagnosis.py TASK [stats] [init] [static] [check=DATA_DIR] [SETTING_JSON ...]

stats: the teacher's logits on the train split (mean top-1 probability and soft-CE floor per temperature);
init: every 1- and 2-layer copy scored before training; static: the static-embedding baseline.
check=DATA_DIR: the students train on DATA_DIR's train split and are scored on its dev split, a part held out of
the task's train split (the teacher stays the one fine-tuned on the whole train split, read from the cache: the
students never see the held-out rows, so choices made on them leave the real dev split untouched).
SETTING_JSON keys: name, layers (list), kd (kd_weight), T (a number, or "rule": deep_cut's choice), hw
(hidden_weight), aw (attention_weight), hmap ("copied" | "uniform"), epochs, steps (at least this many optimizer steps), lr, warmup,
seed, augment (N augmented rows per row, labelled by the teacher). The measurements of docs/distill.md, e.g.:

    python benchmarks/deep_cut_diagnosis.py stsb static '{"name": "rule", "layers": [2, 5], "T": "rule", "hw": 1,
        "steps": 600, "warmup": 0.1, "lr": 3e-4}'
"""
import json
import logging
import os
import sys
import time
from itertools import combinations
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from distillery.pipeline import build_run_config, _teacher
from distillery.data.loading import task_for
from distillery.method_context import MethodContext
from distillery.evaluation import predict, score
from distillery.distill.deep_cut import FALLBACK_TEMPERATURE, temperature_from_logits, uniform_layer_map
from distillery.distill.recipe import build_student
from distillery.training.losses import distillation_loss

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
torch.set_num_threads(int(os.environ.get("DIAG_THREADS", "1")))
EXP = Path(os.environ.get("DEEP_CUT_DIAGNOSIS", "runs/deep-cut-diagnosis"))
RESULTS = EXP / "results.jsonl"


def emit(rec):
    rec["time"] = time.strftime("%H:%M:%S")
    print("RESULT", json.dumps(rec), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a") as f:
        f.write(json.dumps(rec) + "\n")


def main():
    task_name, args = sys.argv[1], sys.argv[2:]
    data_dir = os.environ.get("DISTILLERY_DATA", "../shared/data")
    config = build_run_config(method="distill", task=task_name, data_dir=data_dir,
                              out=str(EXP / "diag" / task_name), overrides={"method_options.student_layers": 2})
    task = task_for(config.data)
    teacher, tokenizer, task_data, info = _teacher(config, task)
    main_metric = task.main_metric
    tmetrics = info.get("metrics") or score(teacher, task_data)
    check = next((a.split("=", 1)[1] for a in args if a.startswith("check=")), None)
    if check:  # the students' data: a held-out part of the train split, with the same teacher
        from distillery.data.encode import prepare_task_data

        config = build_run_config(method="distill", task=task_name, data_dir=check, out=str(EXP / "diag" / task_name),
                                  overrides={"method_options.student_layers": 2})
        task_data = prepare_task_data(task, tokenizer, config.data)
        tmetrics = score(teacher, task_data)
        emit({"task": task_name, "what": "teacher-on-check", "check": check, main_metric: tmetrics[main_metric],
              "n_train": len(task_data.train), "n_check": len(task_data.dev)})
    ctx = MethodContext(config=config, teacher=teacher, tokenizer=tokenizer, task_data=task_data,
                        out_dir=EXP / "diag" / task_name)
    train = ctx.distillation_train(True, 0)
    kind = task.kind  # the name, as distillation_loss takes it
    t_dev = torch.tensor(np.asarray(predict(teacher, task_data)))
    if "stats" in args:
        tl = torch.tensor(np.asarray(train["teacher_logits"], dtype=np.float32))
        rec = {"task": task_name, "what": "teacher", main_metric: tmetrics[main_metric], "n_train": len(train)}
        if task_data.task.kind_object.softened_outputs:
            for T in (0.5, 1.0, 2.0, 4.0):
                p = F.softmax(tl / T, -1)
                ent = -(p * p.clamp_min(1e-12).log()).sum(-1).mean()
                rec[f"T{T}"] = {"maxp": round(float(p.max(-1).values.mean()), 3),
                                "softce_floor_T2H": round(float(T * T * ent), 3)}
            centered = tl - tl.mean(-1, keepdim=True)
            spread = torch.quantile(centered.abs().max(-1).values, torch.tensor([.5, .95]))
            rec["logit_absmax_p50_p95"] = [round(float(x), 2) for x in spread]
            top2 = tl.topk(2, -1).values
            rec["logit_gap_top2_mean"] = round(float((top2[:, 0] - top2[:, 1]).mean()), 2)
            right = tl.argmax(-1) == torch.tensor(train["labels"])
            rec["train_acc_of_teacher"] = round(float(right.float().mean()), 3)
        emit(rec)
    if "init" in args:
        n = teacher.config.num_hidden_layers
        for k in (1, 2):
            for layers in combinations(range(n), k):
                student = build_student(teacher, list(layers))
                s_dev, m = scored_outputs(student, task_data)
                name, distance = distance_to_teacher(s_dev, t_dev, task_data)
                rec = {"task": task_name, "what": "init", "layers": list(layers), main_metric: round(m[main_metric], 4),
                       f"{name}_dev": distance}
                emit(rec)
    if "static" in args:
        from distillery.live_baselines import static_embedding_baseline
        model = static_embedding_baseline(teacher, tokenizer, task_data)
        m = score(model, task_data)
        emit({"task": task_name, "what": "static", main_metric: round(m[main_metric], 4)})
    for spec in [a for a in args if a.startswith("{")]:
        s = json.loads(spec)
        run_setting(ctx, teacher, task_data, train, kind, main_metric, tmetrics, s, t_dev)


def scored_outputs(model, task_data):
    """The model's dev outputs and the task's metrics on them, from one pass over the dev split."""
    outputs = predict(model, task_data)
    return torch.tensor(np.asarray(outputs)), task_data.task.kind_object.scores(task_data, outputs)


def distance_to_teacher(s_dev, t_dev, task_data) -> tuple[str, float]:
    """How far the student's dev outputs are from the teacher's: KL(teacher || student) at T = 1 where the kind's
    outputs are softened (logits), else the mean squared difference."""
    if task_data.task.kind_object.softened_outputs:
        return "kl_T1", round(float(F.kl_div(F.log_softmax(s_dev, -1), F.log_softmax(t_dev, -1),
                                             reduction="batchmean", log_target=True)), 4)
    return "mse", round(float(((s_dev - t_dev) ** 2).mean()), 4)


def run_setting(ctx, teacher, task_data, train, kind, main_metric, tmetrics, s, t_dev):
    layers = s.get("layers", [0, 3])
    hmap = layers if s.get("hmap", "copied") == "copied" else uniform_layer_map(len(layers),
                                                                               teacher.config.num_hidden_layers)
    student = build_student(teacher, layers)
    torch.manual_seed(s.get("seed", 42))
    T = s.get("T", 2.0)
    if T == "rule":
        softened = task_data.task.kind_object.softened_outputs
        T = temperature_from_logits(train["teacher_logits"]) if softened else FALLBACK_TEMPERATURE
        s = {**s, "T_used": T}
    if "steps" in s:  # at least this many optimizer steps
        per_epoch = -(-len(train) // 32)
        s = {**s, "epochs": max(3.0, s["steps"] / per_epoch)}
    inner = distillation_loss(kind, teacher, s.get("kd", 0.5), T, s.get("hw", 0.0), hmap,
                              attention_weight=s.get("aw", 0.0))
    seen = []

    def loss_fn(model, batch):
        loss, logs = inner(model, batch)
        seen.append(logs)
        return loss, logs

    ctx.out_dir = EXP / "diag" / task_data.task.name / s["name"]
    if ctx.out_dir.exists():
        import shutil
        shutil.rmtree(ctx.out_dir)
    ctx.out_dir.mkdir(parents=True)
    use = train if not (s.get("hw") or s.get("aw")) else task_data.train  # these terms run the teacher
    if s.get("augment"):
        use = ctx.distillation_train(True, s["augment"])
        print("augmented train rows", len(use), flush=True)
    started = time.time()
    settings = {"epochs": s.get("epochs", 3.0), "lr": s.get("lr", 1e-4), "warmup_ratio": s.get("warmup", 0.0),
                "seed": s.get("seed", 42), "eval_every": s.get("eval_every", 200), "log_every": 25}
    model = ctx.train(student, loss_fn, desc=s["name"], train_dataset=use, **settings)
    s_dev, m = scored_outputs(model, task_data)
    np.save(ctx.out_dir / "dev_outputs.npy", s_dev.numpy())  # for paired comparisons between settings
    # how closely the student follows its teacher on the scored rows (paired: both models on the same rows)
    name, distance = distance_to_teacher(s_dev, t_dev, task_data)
    fidelity = {f"{name}_to_teacher": distance}
    if task_data.task.kind_object.softened_outputs:
        fidelity["agreement_with_teacher"] = round(float((s_dev.argmax(-1) == t_dev.argmax(-1)).float().mean()), 4)

    def mean(part, rows):
        vals = [r[part] for r in rows if part in r]
        return round(float(np.mean(vals)), 4) if vals else None

    first, last = seen[:25], seen[-25:]
    rec = {"task": task_data.task.name, "what": "train", **s, "hmap_layers": hmap if s.get("hw") else None,
           main_metric: round(m[main_metric], 4), "retention": round(m[main_metric] / tmetrics[main_metric], 3),
           **fidelity, "steps": len(seen), "secs": round(time.time() - started)}
    for part in ("ce", "kd", "kl", "hidden", "attention"):
        rec[f"{part}_first25"], rec[f"{part}_last25"] = mean(part, first), mean(part, last)
    emit(rec)


if __name__ == "__main__":
    main()
