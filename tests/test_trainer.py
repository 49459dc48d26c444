"""The one training loop: data order, accumulation, evaluation, checkpoints, exact resume, DDP."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import datasets
import torch
from safetensors.torch import load_file, load_model

import distillery.training.checkpoint as checkpoint_module
from distillery.config import TrainConfig
from distillery.training import HiddenProjection, Trainer, find_checkpoint, hidden_mse
from distillery.training.checkpoint import TrainerState
from distillery.training.data_order import EpochSampler
from distillery.training.optim import param_groups as _param_groups
from distillery.errors import DistilleryError
from tests._ddp_train import collate, loss_fn, tiny_dataset, tiny_model
from tests.helpers import tiny_bert_config

HERE = Path(__file__).parent


def cfg(**kw) -> TrainConfig:
    base = {"batch_size": 8, "lr": 1e-3, "log_every": 0, "seed": 3, "epochs": 1.0}
    base.update(kw)
    return TrainConfig(**base)


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}  # the trainer leaves it on its device


def assert_same_weights(a: dict, b: dict, atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=atol, msg=lambda m: f"{k}: {m}")


def last_state(out: Path) -> dict:
    return json.loads((find_checkpoint(out) / "trainer_state.json").read_text())


# -- a run with everything that must survive a resume: dropout, a random collator,
#    gradient accumulation, a learned projection outside the model, two epochs --------------


def masking_collate(examples):
    batch = collate(examples)
    ids = batch["input_ids"].clone()
    masked = torch.rand(ids.shape) < 0.15  # draws from the global generator, like an MLM collator
    masked[:, 0] = False
    ids[masked] = 4
    batch["input_ids"] = ids
    return batch


class Interrupt(Exception):
    pass


def make_loss(projection, interrupt_at=None, nan_at=None):
    calls = {"n": 0}

    def fn(model, batch):
        calls["n"] += 1
        if interrupt_at is not None and calls["n"] == interrupt_at:
            raise KeyboardInterrupt  # what a kill between checkpoints looks like to the loop
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            labels=batch["labels"],
            output_hidden_states=True,
        )
        aux = hidden_mse(
            projection(out.hidden_states[-1]), out.hidden_states[0].detach(), attention_mask=batch["attention_mask"]
        )
        loss = out.loss + 0.1 * aux
        if nan_at is not None and calls["n"] == nan_at:
            loss = loss * float("nan")
        return loss, {"aux": aux.item()}

    return fn


RESUME_CFG = dict(batch_size=8, grad_accum=2, epochs=2.0, lr=2e-3, warmup_ratio=0.2)  # 48 ex: 3 steps/epoch


def resume_run(out, *, resume=False, interrupt_at=None, nan_at=None, model_seed=0, checkpoint_every=2, **kw):
    model = tiny_model(seed=model_seed, dropout=0.1)
    torch.manual_seed(model_seed + 100)
    projection = HiddenProjection(32, 32)
    with torch.no_grad():
        projection.linear.weight.add_(0.01 * torch.randn(32, 32))
    trainer = Trainer(
        model,
        cfg(**{**RESUME_CFG, **kw}),
        tiny_dataset(48),
        masking_collate,
        make_loss(projection, interrupt_at=interrupt_at, nan_at=nan_at),
        out_dir=out,
        resume=resume,
        extra_parameters=[projection],
        checkpoint_every=checkpoint_every,
        desc="resume-test",
    )
    result = trainer.train()
    projected = {f"proj.{k}": v for k, v in weights(projection).items()}
    return result, {**weights(result.model), **projected}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return resume_run(tmp_path_factory.mktemp("uninterrupted"))


def test_resume_after_a_kill_equals_an_uninterrupted_run(tmp_path, uninterrupted):
    ref_result, ref = uninterrupted
    assert ref_result.global_step == 6
    # 2 micro-batches per step, a checkpoint every 2 steps: killed inside step 5, mid-epoch 2
    with pytest.raises(KeyboardInterrupt):
        resume_run(tmp_path, interrupt_at=9)
    state = last_state(tmp_path)
    assert (state["global_step"], state["epoch"], state["batch_in_epoch"]) == (4, 1, 2)
    # a differently initialised model and projection: everything must come from the checkpoint
    result, final = resume_run(tmp_path, resume=True, model_seed=5)
    assert result.global_step == 6
    assert_same_weights(final, ref)
    assert [h["step"] for h in result.history] == [h["step"] for h in ref_result.history]
    assert result.history[-1]["loss"] == pytest.approx(ref_result.history[-1]["loss"], abs=1e-6)
    assert result.seconds > 0 and result.examples_per_s > 0


CHECKPOINT_FILES = ("model.safetensors", "extra_parameters.safetensors", "optimizer.pt", "scheduler.pt",
                    "rng_state_0.pt", "trainer_state.json")


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    """A run killed after its step-4 checkpoint (a copy to damage per test)."""
    out = tmp_path_factory.mktemp("killed")
    with pytest.raises(KeyboardInterrupt):
        resume_run(out, interrupt_at=9)
    return out


@pytest.mark.parametrize("name", CHECKPOINT_FILES)
def test_resume_from_a_truncated_checkpoint_file(name, killed_run, tmp_path, uninterrupted):
    """A truncated file in checkpoints/last: a plain error naming it, or, with a complete previous
    version beside it, the run resumes from that one and ends as if never stopped."""
    import shutil

    shutil.copytree(killed_run, tmp_path, dirs_exist_ok=True)
    last = tmp_path / "checkpoints" / "last"
    data = (last / name).read_bytes()
    (last / name).write_bytes(data[: len(data) // 2])
    with pytest.raises(DistilleryError, match=f"{name} is corrupt"):
        resume_run(tmp_path, resume=True, model_seed=5)

    shutil.copytree(killed_run / "checkpoints" / "last", tmp_path / "checkpoints" / "last.old")
    (last / name).write_bytes(b"garbage" * 3)
    _, final = resume_run(tmp_path, resume=True, model_seed=5)
    assert_same_weights(final, uninterrupted[1])


# trainer_state.json as format 1 writes it: these keys, in this order ("stopped_early" once true)
FORMAT_1_KEYS = ["format", "desc", "global_step", "total_steps", "epoch", "batch_in_epoch", "examples_seen", "seconds",
                 "best_metric", "best_step", "best_metrics", "history", "log_window", "eval_window", "main_metric",
                 "greater_is_better", "num_examples", "batch_size", "grad_accum", "seed", "num_processes"]


def test_trainer_state_round_trips_through_its_dict():
    state = TrainerState.fresh(desc="round-trip", total_steps=9, main_metric="accuracy", greater_is_better=True,
                               num_examples=48, config=cfg(**RESUME_CFG), num_processes=1)
    assert list(state.to_dict()) == FORMAT_1_KEYS
    state.global_step, state.epoch, state.batch_in_epoch, state.examples_seen = 5, 1, 2, 80
    state.seconds, state.best_metric, state.best_step = 1.25, 0.8125, 4
    state.best_metrics = {"accuracy": 0.8125, "loss": 0.5}
    state.history = [{"step": 4, "epoch": 1.33, "loss": 0.7, "lr": 1e-3, "metrics": {"accuracy": 0.8125}}]
    state.log_window, state.eval_window = {"n": 1, "loss": 0.7, "parts": {"aux": 0.1}}, None
    state.stopped_early = True
    data = json.loads(json.dumps(state.to_dict()))
    assert data["stopped_early"] is True
    again = TrainerState.from_dict(data, "trainer_state.json")
    assert again == state
    again.history[0]["step"] = 99  # no list or dict shared with the file's object
    assert data["history"][0]["step"] == 4

    state.best_metric = float("nan")  # not JSON: written as null, read back as no best yet
    assert TrainerState.from_dict(json.loads(json.dumps(state.to_dict())), "x").best_metric is None


def test_a_checkpoint_in_the_format_1_shape_resumes_exactly(killed_run, tmp_path, uninterrupted):
    """A trainer_state.json rebuilt key by key as format 1 writes it resumes to the uninterrupted weights."""
    import shutil

    shutil.copytree(killed_run, tmp_path, dirs_exist_ok=True)
    path = tmp_path / "checkpoints" / "last" / "trainer_state.json"
    written = json.loads(path.read_text())
    assert list(written) == FORMAT_1_KEYS
    path.write_text(json.dumps({key: written[key] for key in FORMAT_1_KEYS}, indent=1))
    result, final = resume_run(tmp_path, resume=True, model_seed=5)
    assert result.global_step == 6
    assert_same_weights(final, uninterrupted[1])
    assert [h["step"] for h in result.history] == [h["step"] for h in uninterrupted[0].history]


@pytest.mark.parametrize("change, message", [
    (lambda s: s.pop("history"), "it has no history"),
    (lambda s: s.update(global_step="4"), "its global_step is '4', not a whole number"),
    (lambda s: s.update(greater_is_better=1), "its greater_is_better is 1, not true or false"),
    (lambda s: s.update(log_window={"n": 1}), "its log_window is"),
])
def test_a_trainer_state_with_a_missing_or_mistyped_field_is_refused(change, message, killed_run, tmp_path):
    import shutil

    shutil.copytree(killed_run, tmp_path, dirs_exist_ok=True)
    path = tmp_path / "checkpoints" / "last" / "trainer_state.json"
    state = json.loads(path.read_text())
    change(state)
    path.write_text(json.dumps(state))
    with pytest.raises(DistilleryError) as info:
        resume_run(tmp_path, resume=True, model_seed=5)
    assert str(info.value).startswith(f"The checkpoint file {path} is corrupt: {message}")


def test_resume_at_an_epoch_boundary(tmp_path, uninterrupted):
    _, ref = uninterrupted
    with pytest.raises(KeyboardInterrupt):
        resume_run(tmp_path, interrupt_at=7, checkpoint_every=None)  # saved at the end of epoch 1 (step 3)
    state = last_state(tmp_path)
    assert (state["global_step"], state["epoch"], state["batch_in_epoch"]) == (3, 1, 0)
    _, final = resume_run(tmp_path, resume=True, model_seed=5, checkpoint_every=None)
    assert_same_weights(final, ref)


def test_a_failed_save_leaves_the_previous_checkpoint_loadable(tmp_path, monkeypatch, uninterrupted):
    _, ref = uninterrupted
    real_write_json = checkpoint_module._write_json
    calls = {"state": 0}

    def failing_write_json(obj, path):
        if Path(path).name == "trainer_state.json":
            calls["state"] += 1
            if calls["state"] == 2:  # the second checkpoint (step 3) dies after the weights were written
                raise OSError("disk full")
        real_write_json(obj, path)

    monkeypatch.setattr(checkpoint_module, "_write_json", failing_write_json)
    with pytest.raises(OSError, match="disk full"):
        resume_run(tmp_path)  # saves at steps 2, 3 (end of epoch 1), 4, 6: the one at step 3 fails
    monkeypatch.setattr(checkpoint_module, "_write_json", real_write_json)

    root = tmp_path / "checkpoints"
    assert (root / "last.tmp" / "model.safetensors").is_file()  # the half-written one
    assert not (root / "last.tmp" / "trainer_state.json").exists()
    ckpt = find_checkpoint(tmp_path)
    assert ckpt == root / "last"
    assert json.loads((ckpt / "trainer_state.json").read_text())["global_step"] == 2
    model = tiny_model(seed=9)
    load_model(model, str(ckpt / "model.safetensors"))  # loadable and complete
    torch.load(ckpt / "optimizer.pt", weights_only=True)
    torch.load(ckpt / "scheduler.pt", weights_only=True)
    torch.load(ckpt / "rng_state_0.pt", weights_only=True)

    # a crash between the two renames of a save leaves only last.old: it is still found
    os.replace(root / "last", root / "last.old")
    assert find_checkpoint(tmp_path) == root / "last.old"
    _, final = resume_run(tmp_path, resume=True, model_seed=5)
    assert_same_weights(final, ref)
    assert find_checkpoint(tmp_path) == root / "last"
    assert not (root / "last.old").exists() and not (root / "last.tmp").exists()


def test_non_finite_loss_stops_before_the_optimizer_step(tmp_path):
    with pytest.raises(DistilleryError) as info:
        resume_run(tmp_path, nan_at=5, checkpoint_every=1, epochs=1.0)  # 5th micro-batch: step 3
    message = str(info.value)
    ckpt = tmp_path / "checkpoints" / "last"
    assert "non-finite loss" in message and "step 3" in message
    assert f"the last good checkpoint is in {ckpt}" in message
    assert last_state(tmp_path)["global_step"] == 2  # nothing of the bad step was written
    assert all(torch.isfinite(t).all() for t in load_file(str(ckpt / "model.safetensors")).values())


def test_non_finite_loss_before_any_checkpoint_says_so(tmp_path):
    with pytest.raises(DistilleryError, match="non-finite loss .* step 1 .*no checkpoint had been written yet"):
        resume_run(tmp_path, nan_at=1)


def test_resume_without_a_checkpoint_starts_fresh(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="distillery")
    model = tiny_model()
    result = Trainer(model, cfg(max_steps=2), tiny_dataset(32), collate, loss_fn, out_dir=tmp_path, resume=True).train()
    assert result.global_step == 2
    assert "starting from scratch" in caplog.text


def test_resume_with_other_settings_is_refused(tmp_path):
    Trainer(tiny_model(), cfg(max_steps=1), tiny_dataset(32), collate, loss_fn, out_dir=tmp_path).train()
    with pytest.raises(DistilleryError, match="Cannot resume .*batch_size 8 \\(now 16\\)"):
        config = cfg(max_steps=2, batch_size=16)
        Trainer(tiny_model(), config, tiny_dataset(32), collate, loss_fn, out_dir=tmp_path, resume=True).train()


def test_resuming_a_finished_run_returns_it(tmp_path):
    first = Trainer(tiny_model(), cfg(max_steps=3), tiny_dataset(32), collate, loss_fn, out_dir=tmp_path).train()
    again = Trainer(
        tiny_model(seed=4), cfg(max_steps=3), tiny_dataset(32), collate, loss_fn, out_dir=tmp_path, resume=True
    ).train()
    assert again.global_step == 3
    assert_same_weights(weights(again.model), weights(first.model))


# -- data order, accumulation, schedule --------------------------------------------------


def test_data_order_is_a_seeded_permutation_per_epoch_and_extra_keys_pass_through(tmp_path):
    seen = []

    def recording_loss(model, batch):
        seen.extend(batch["idx"])  # a list, not a model input: untouched by the loop
        return loss_fn(model, batch)

    config = cfg(epochs=2.0, batch_size=8, seed=11, group_by_length=False)
    Trainer(tiny_model(), config, tiny_dataset(24), collate, recording_loss, out_dir=tmp_path).train()
    expected = []
    for epoch in range(2):
        expected += torch.randperm(24, generator=torch.Generator().manual_seed(11 + epoch)).tolist()
    assert seen == expected
    assert EpochSampler(24, 11).order(1) == expected[24:]


def test_length_grouped_order_is_a_seeded_permutation_with_less_padding():
    from distillery.data.encode import example_lengths

    lengths = [(i * 37) % 61 + 1 for i in range(1000)]
    dataset = datasets.Dataset.from_dict({"input_ids": [[1] * n for n in lengths]})
    assert example_lengths(dataset).tolist() == lengths
    sampler = EpochSampler(1000, 5, lengths=torch.tensor(lengths), batch_size=32)
    order = sampler.order(0)
    assert sorted(order) == list(range(1000)) and order == sampler.order(0) and order != sampler.order(1)

    def padded(indices):
        return sum(max(lengths[i] for i in indices[k:k + 32]) * len(indices[k:k + 32]) for k in range(0, 1000, 32))

    assert padded(order) < 0.7 * padded(EpochSampler(1000, 5).order(0))


def test_gradient_accumulation_equals_the_larger_batch(tmp_path):
    def run(batch_size, grad_accum):
        model = tiny_model(dropout=0.0)
        # plain order: length grouping forms its groups from the batch size
        config = cfg(batch_size=batch_size, grad_accum=grad_accum, max_steps=4, warmup_ratio=0.25,
                     group_by_length=False)
        trainer = Trainer(model, config, tiny_dataset(64), collate, loss_fn, out_dir=tmp_path / f"{batch_size}")
        return weights(trainer.train().model)

    assert_same_weights(run(16, 2), run(32, 1), atol=1e-5)


def test_fractional_epochs_and_max_steps(tmp_path):
    # 40 examples, batch 8: 5 batches per epoch; accumulation 2: 3 optimizer steps per epoch
    config = cfg(epochs=1.5, grad_accum=2)
    result = Trainer(tiny_model(), config, tiny_dataset(40), collate, loss_fn, out_dir=tmp_path / "a").train()
    assert result.global_step == 5  # ceil(1.5 × 3)
    assert [h["step"] for h in result.history] == [3, 5]  # end of epoch 1, then the end
    config = cfg(max_steps=7, epochs=1.0)
    result = Trainer(tiny_model(), config, tiny_dataset(40), collate, loss_fn, out_dir=tmp_path / "b").train()
    assert result.global_step == 7


def test_no_weight_decay_on_biases_and_layernorm():
    model = tiny_model()
    proj = HiddenProjection(32, 48)
    groups = _param_groups(model, [proj], list(proj.parameters()), weight_decay=0.01)
    by_id = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    for name, p in model.named_parameters():
        expected = 0.0 if (name.endswith("bias") or "LayerNorm" in name) else 0.01
        assert by_id[id(p)] == expected, name
    assert by_id[id(proj.linear.weight)] == 0.01 and by_id[id(proj.linear.bias)] == 0.0


# -- evaluation and the best weights -----------------------------------------------------


@pytest.mark.parametrize(
    "greater_is_better, select_best, best_index", [(True, True, 1), (False, True, 0), (True, False, 1)]
)
def test_evaluation_picks_the_best_step(tmp_path, greater_is_better, select_best, best_index):
    scores = [0.5, 0.9, 0.7, 0.6]
    snapshots = []

    def eval_fn(model):
        assert not model.training
        snapshots.append(weights(model))
        return {"acc": scores[len(snapshots) - 1], "n": 3}

    config = cfg(max_steps=8, eval_every=2, select_best=select_best)
    result = Trainer(
        tiny_model(), config, tiny_dataset(32), collate, loss_fn, out_dir=tmp_path,
        eval_fn=eval_fn, main_metric="acc", greater_is_better=greater_is_better,
    ).train()
    assert [h["step"] for h in result.history] == [2, 4, 6, 8]
    assert [h["metrics"]["acc"] for h in result.history] == scores
    assert result.best_step == 2 * (best_index + 1)
    assert result.best_metrics == {"acc": scores[best_index], "n": 3.0}
    best = tiny_model(seed=9)
    load_model(best, str(tmp_path / "checkpoints" / "best" / "model.safetensors"))
    assert_same_weights(weights(best), snapshots[best_index], atol=0)
    assert_same_weights(weights(result.model), snapshots[best_index if select_best else -1], atol=0)
    assert not result.model.training


def test_best_weights_found_before_a_resume_are_loaded_from_disk(tmp_path):
    scores = iter([0.2, 0.8, 0.4, 0.3])
    snapshots = []

    def eval_fn(model):
        snapshots.append(weights(model))
        return {"acc": next(scores)}

    def make(loss, resume):
        return Trainer(
            tiny_model(), cfg(max_steps=8, eval_every=2), tiny_dataset(32), collate, loss, out_dir=tmp_path,
            eval_fn=eval_fn, main_metric="acc", resume=resume,
        )

    calls = {"n": 0}

    def dying_loss(model, batch):
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt
        return loss_fn(model, batch)

    with pytest.raises(KeyboardInterrupt):
        make(dying_loss, False).train()
    result = make(loss_fn, True).train()
    assert result.best_step == 4 and result.best_metrics == {"acc": 0.8}
    assert_same_weights(weights(result.model), snapshots[1], atol=0)


def test_eval_fn_must_report_the_main_metric(tmp_path):
    with pytest.raises(ValueError, match="main_metric is required"):
        Trainer(tiny_model(), cfg(), tiny_dataset(8), collate, loss_fn, out_dir=tmp_path, eval_fn=lambda m: {})
    trainer = Trainer(
        tiny_model(), cfg(max_steps=1), tiny_dataset(8), collate, loss_fn, out_dir=tmp_path,
        eval_fn=lambda m: {"f1": 1.0}, main_metric="acc",
    )
    with pytest.raises(ValueError, match="'acc'"):
        trainer.train()


# -- saving, logging ---------------------------------------------------------------------


def test_tied_weights_are_checkpointed(tmp_path):
    from transformers import BertForMaskedLM

    config = tiny_bert_config()
    torch.manual_seed(0)
    model = BertForMaskedLM(config)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight

    def mlm_loss(m, batch):
        return m(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["input_ids"]).loss

    result = Trainer(model, cfg(max_steps=2), tiny_dataset(16), collate, mlm_loss, out_dir=tmp_path).train()
    torch.manual_seed(1)
    fresh = BertForMaskedLM(config)
    load_model(fresh, str(tmp_path / "checkpoints" / "last" / "model.safetensors"))
    assert_same_weights(weights(fresh), weights(result.model), atol=0)
    assert fresh.cls.predictions.decoder.weight is fresh.bert.embeddings.word_embeddings.weight


def test_logging_and_tensorboard(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="distillery")
    config = cfg(max_steps=2, log_every=1, tensorboard=True)
    projection = HiddenProjection(32, 32)
    Trainer(tiny_model(), config, tiny_dataset(16), collate, make_loss(projection), extra_parameters=[projection],
            out_dir=tmp_path, desc="tb").train()
    assert "tb step 2/2 | loss" in caplog.text and "| aux " in caplog.text and "ex/s" in caplog.text
    assert list((tmp_path / "tb").rglob("events.out.tfevents.*"))


def test_an_empty_dataset_is_refused(tmp_path):
    with pytest.raises(DistilleryError, match="empty"):
        Trainer(tiny_model(), cfg(), [], collate, loss_fn, out_dir=tmp_path)


# -- two processes ---------------------------------------------------------------------


def test_two_processes_match_one_process_with_the_same_global_batch(tmp_path):
    from tests._ddp_train import run

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))}
    # accelerate runs several CPU processes through torch.distributed.run when asked for
    # "multi_gpu" on a machine without one; they then train on CPU with gloo
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
        str(HERE / "_ddp_train.py"), str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "world_size.txt").read_text() == "2"
    two = load_file(str(tmp_path / "final.safetensors"))
    one = weights(run(tmp_path / "single"))
    assert_same_weights(one, two, atol=1e-4)
    # and training moved the weights well beyond that tolerance
    start = weights(tiny_model(dropout=0.0))
    assert max((one[k] - start[k]).abs().max().item() for k in one) > 10 * 1e-4


def test_a_finished_training_on_cpu_frees_its_optimizer_without_a_garbage_collection(tmp_path, monkeypatch):
    """accelerate's free_memory runs a full gc.collect (0.3 s in a large process, at every training's end) to give
    a device's cache back; on CPU the trainer's optimizer and prepared objects go with the trainer by refcount."""
    import gc
    import weakref

    collections = []
    monkeypatch.setattr(gc, "collect", lambda *a: collections.append(a) or 0)
    kept = []
    trainer = Trainer(tiny_model(seed=0), cfg(), tiny_dataset(16), collate, loss_fn, out_dir=tmp_path, desc="t")
    finish = trainer._finish
    monkeypatch.setattr(trainer, "_finish", lambda run: kept.append(weakref.ref(
        trainer.accelerator._optimizers[0].optimizer)) or finish(run))
    gc.disable()
    try:
        result = trainer.train()
        del trainer, finish
        monkeypatch.undo()  # the patches held the trainer too
        assert kept and kept[0]() is None, "the optimizer outlived its trainer without a collection"
    finally:
        gc.enable()
    assert not collections
    assert result.model is not None
