"""Issue 41: equal settings and seed give a bitwise-equal student, for every method (and a tagger distilled from
its teacher's per-word logits with augmented sentences); and a run killed between two checkpoints, then resumed,
gives the uninterrupted run's student bitwise.

Runs of the same settings share this module's cache: the first one fine-tunes the teacher and the
others reuse it, so a student that drew its initialisation from whatever the process had done before
(cmow did) differs here. The kill is the trainer's view of one: the process stops on its way to a
checkpoint, after training past the previous one."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from distillery.training import trainer as trainer_module
from distillery.folders import unrecorded
from distillery.pipeline import compress
from tests.helpers import flop_timed, size_timed, tiny_config, write_conll_dir, write_glue, write_squad

OPTIONS = {  # the tiny sizes of each method (AutoTinyBERT's timings made FLOP-proportional: see below)
    "distill": {},
    "moebert": {"method_options.importance_examples": 40},
    "cmow": {"method_options.matrix_dim": 4, "method_options.vector_dim": 16},
    "autotinybert": {"method_options.supernet_steps": 3, "method_options.latency_archs": 8,
                     "method_options.latency_runs": 1, "method_options.generations": 1,
                     "method_options.population": 2, "method_options.proxy_examples": 16,
                     "method_options.budget_floor": 0},
    "prune": {"method_options.mask_steps": 4, "method_options.latency_shapes": 8, "method_options.latency_runs": 1},
}

# the cases: every method on SST-2; token classification (CoNLL's tiny fixture) with distill, whose student reads the
# teacher's cached per-word logits, on augmented sentences too
# and an embedder (issue 55: the teacher a plain encoder, mean-pooled) learning from unlabeled texts
CASES = [(method, "sst2", {}) for method in OPTIONS] + [("distill", "conll2003", {"method_options.augment": 1}),
                                                        ("distill", "embedding", {}), ("static", "embedding", {}),
                                                        ("moebert", "embedding", {}), ("autotinybert", "embedding", {}),
                                                        ("cmow", "embedding", {}),
                                                        ("prune", "embedding", {"method_options.mode": "cheap",
                                                                                "method_options.fisher_examples": 32})]


def student(run) -> dict:
    return load_file(str(run / "student" / "model.safetensors"))


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    differing = [name for name in a if not (a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]))]
    assert not differing, f"{len(differing)} of {len(a)} tensors differ, e.g. {differing[:3]}"


@pytest.mark.parametrize("method, task, more", CASES, ids=[f"{m}-{t}" for m, t, _ in CASES])
def test_same_seed_same_student_and_a_killed_run_resumes_bitwise(method, task, more, tiny_bert4, glue_dir, tmp_path,
                                                                 monkeypatch):
    # AutoTinyBERT chooses its architecture from measured latencies: with wall-clock timings two runs may
    # choose differently (see docs/autotinybert.md); what the run does with equal timings is under test
    flop_timed(monkeypatch)
    size_timed(monkeypatch)  # prune's latency model likewise
    monkeypatch.setenv("DISTILLERY_CACHE", str(tmp_path / "cache"))
    data = glue_dir if task == "sst2" else write_conll_dir(tmp_path / "conll", n_train=64, n_dev=16, n_test=8)
    if task == "embedding":
        data = write_squad(write_glue(tmp_path / "embedding", n_train=4, n_dev=16))
        (tmp_path / "texts.csv").write_text("text\n" + "\n".join(f"text number {i} is here" for i in range(96)))
        more = {**more, "data.unlabeled_file": str(tmp_path / "texts.csv")}
    config = lambda name: tiny_config(tiny_bert4, data, tmp_path / name, task=task, method=method,  # noqa: E731
                                      **{"student.epochs": 1.0, **OPTIONS.get(method, {}), **more})
    saves = []
    save_last = trainer_module.save_last

    def counted(*args, **kwargs):
        saves.append(1)
        return save_last(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "save_last", counted)
    first = student(compress(config("a")))
    assert unrecorded(tmp_path / "a") is None, "every file of the run is in its record: --overwrite may replace it"
    second = student(compress(config("b")))
    assert_bitwise_equal(first, second)

    calls = len(saves)
    assert calls >= 4, "two runs, each checkpointed at least twice"
    per_run = calls // 2
    seen = []

    def killed(*args, **kwargs):
        seen.append(1)
        if len(seen) == per_run - 1:  # trained past the previous checkpoint, killed before this one
            raise KeyboardInterrupt
        return save_last(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "save_last", killed)
    with pytest.raises(KeyboardInterrupt):
        compress(config("killed"))
    monkeypatch.setattr(trainer_module, "save_last", save_last)
    if method == "autotinybert":  # killed in its further training: the architecture chosen before is kept
        from distillery.autotinybert import recipe

        assert (tmp_path / "killed" / "architecture.json").is_file()
        monkeypatch.setattr(recipe, "choose_architecture", lambda *a: pytest.fail("the resume chose again"))
    if method == "prune":  # the latency model of the killed run is read back (latency.json), not timed again
        from distillery.prune import latency

        assert (tmp_path / "killed" / "latency.json").is_file()
        monkeypatch.setattr(latency, "checked_latency_ms", lambda *a, **k: pytest.fail("the resume timed again"))
    resumed = student(compress(config("killed"), resume=True))
    assert_bitwise_equal(first, resumed)


def test_resume_refuses_a_teacher_whose_weights_changed_in_place(tiny_bert, glue_dir, tmp_path, monkeypatch, capsys):
    """Issue 41: after a kill, the teacher folder's weights are changed in place; --resume would fine-tune
    the new teacher and continue a student trained against the old one. It is refused with a sentence."""
    import shutil

    from safetensors.torch import save_file

    from tests.helpers import assert_one_line_error, run_cli

    monkeypatch.setenv("DISTILLERY_CACHE", str(tmp_path / "cache"))
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_bert, teacher)
    out = tmp_path / "run"

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer_module, "save_last", killed)
    with pytest.raises(KeyboardInterrupt):
        compress(tiny_config(teacher, glue_dir, out, **{"teacher.train.epochs": 0.5}))
    weights = teacher / "model.safetensors"
    state = load_file(str(weights))
    save_file({k: v * 1.5 for k, v in state.items()}, str(weights), metadata={"format": "pt"})
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    capsys.readouterr()  # what the interrupted run wrote is not the resume's
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--out", str(out), "--resume")
    assert_one_line_error(code, err, f"The teacher {teacher} is not the one this run started with "
                                     f"(its model.safetensors changed)")
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before
