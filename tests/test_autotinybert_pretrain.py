"""Issue 39: `autotinybert pretrain`, the super-net's task-agnostic distillation on a corpus, and a task
run from what it writes (tiny teacher, tiny corpus, a handful of steps)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from distillery.errors import DistilleryError
from distillery.training import trainer as trainer_module
from tests.helpers import TINY_RUN, assert_one_line_error, flop_timed, make_tiny_bert, run_cli, write_corpus

PRETRAIN = ("--steps", "4", "--batch-size", "4", "--max-length", "16", "--log-every", "2")
TASK = {"supernet_steps": 2, "latency_archs": 8, "latency_runs": 1, "generations": 1, "population": 2,
        "proxy_examples": 16, "probe_examples": 16, "speedup": 1.5, "budget_floor": 0}


def pretrain(monkeypatch, capsys, out, corpus, teacher, *more):
    return run_cli(monkeypatch, capsys, "autotinybert", "pretrain", "--out", str(out), "--corpus", str(corpus),
                   "--teacher", str(teacher), *PRETRAIN, *more)


def task_config(teacher, data, out, supernet, **more):
    from distillery.pipeline import build_run_config

    opts = {**TASK, "supernet": str(supernet), **more}
    return build_run_config(method="autotinybert", task="sst2", budget="quick", teacher=str(teacher), data_dir=str(data),
                            out=str(out), overrides={**TINY_RUN, **{f"method_options.{k}": v for k, v in opts.items()}})


def test_pretrain_then_a_task_run_from_its_supernet(tiny_bert, glue_dir, tmp_path, monkeypatch, capsys):
    import distillery
    from distillery.pipeline import compress

    monkeypatch.setenv("DISTILLERY_CACHE", str(tmp_path / "cache"))
    flop_timed(monkeypatch)
    corpus = write_corpus(tmp_path / "corpus.txt", lines=60)
    code, out, err = pretrain(monkeypatch, capsys, tmp_path / "pre", corpus, tiny_bert)
    assert code == 0, err
    folder = tmp_path / "pre" / "supernet"
    assert f"supernet={folder}" in out
    facts = json.loads((folder / "supernet.json").read_text())
    # its own record of what it was trained from
    assert facts["trained_on"] == "corpus" and facts["teacher"] == str(tiny_bert) and facts["encoder_digest"]
    assert facts["corpus"] == [str(corpus)] and facts["lines"] == 60 and facts["steps"] == 4
    assert [step for step, _ in facts["loss"]] == [2, 4]
    # the objective on blocks held out of training, before and after, for three fixed sub-networks
    held = facts["held_out"]
    assert set(held) == {"smallest", "sampled", "largest"} and facts["held_out_blocks"] >= 1
    assert held["largest"]["before"] < 1e-6 < held["smallest"]["before"]  # at full size it starts as the teacher
    assert not (tmp_path / "pre" / "checkpoints").exists()

    run = compress(task_config(tiny_bert, glue_dir, tmp_path / "task", folder))
    report = (run / "report.md").read_text()
    assert "pre-trained on 60 corpus lines" in report and "Trained one-shot on the task" in report
    task_facts = json.loads((run / "supernet" / "supernet.json").read_text())
    assert task_facts["pretrained"] == str(folder) and task_facts["task"] == "sst2"
    assert type(distillery.load_student(run)).__name__ == "AutoTinyBertForSequenceClassification"

    # the paper's order: search the pre-trained super-net as it is, then train further
    run = compress(task_config(tiny_bert, glue_dir, tmp_path / "no-phase", folder, task_phase=False))
    assert "task_phase=false" in (run / "report.md").read_text()
    assert not (run / "supernet").exists()


def test_pretrain_killed_then_resumed_is_bitwise_the_uninterrupted_run(tiny_bert, tmp_path, monkeypatch):
    from distillery.autotinybert.pretrain import pretrain_supernet
    from distillery.config import TrainConfig

    corpus = write_corpus(tmp_path / "corpus.txt", lines=80)
    train = TrainConfig(epochs=1.0, max_steps=6, batch_size=4, lr=1e-3, select_best=False, seed=3)

    def run(name, resume=False):
        folder = pretrain_supernet([corpus], tmp_path / name, teacher=str(tiny_bert), train=train, samples=3,
                                   max_length=16, resume=resume, checkpoint_every=2)
        return {**load_file(str(folder / "model.safetensors")), **load_file(str(folder / "projection.safetensors"))}

    save_last, saves = trainer_module.save_last, []

    def counted(*args, **kwargs):
        saves.append(1)
        return save_last(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "save_last", counted)
    first = run("a")
    uninterrupted, seen = len(saves), []

    def killed(*args, **kwargs):
        seen.append(1)
        if len(seen) == 2:  # trained past the first checkpoint (step 2), killed on its way to the second
            raise KeyboardInterrupt
        return save_last(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "save_last", killed)
    with pytest.raises(KeyboardInterrupt):
        run("killed")
    assert (tmp_path / "killed" / "checkpoints").is_dir()
    monkeypatch.setattr(trainer_module, "save_last", counted)
    saves.clear()
    resumed = run("killed", resume=True)
    assert len(saves) == uninterrupted - 1, "the resume went on from the checkpoint at step 2"
    assert first.keys() == resumed.keys()
    assert [k for k in first if not torch.equal(first[k], resumed[k])] == []


def test_pretrain_resumed_with_other_settings_is_refused_naming_them(tiny_bert, tmp_path, monkeypatch, capsys):
    """Issue 52: `pretrain --lr 0.5 --resume` on a run started at 1e-4 continued at 1e-4 and wrote "lr": 0.5 into
    supernet.json. Refused, as compress --resume refuses a changed setting; the same settings are resumed."""
    corpus = write_corpus(tmp_path / "corpus.txt", lines=60)
    code, _, err = pretrain(monkeypatch, capsys, tmp_path / "pre", corpus, tiny_bert)
    assert code == 0, err
    facts = (tmp_path / "pre" / "supernet" / "supernet.json").read_text()
    code, _, err = pretrain(monkeypatch, capsys, tmp_path / "pre", corpus, tiny_bert, "--lr", "0.5", "--resume")
    assert_one_line_error(code, err, f"--resume continues the run in {tmp_path / 'pre'} with its saved settings, but "
                                     "these were given differently: lr (saved 0.0001, given 0.5).")
    other = write_corpus(tmp_path / "other.txt", lines=60, seed=1)
    code, _, err = pretrain(monkeypatch, capsys, tmp_path / "pre", other, tiny_bert, "--strategy", "heads", "--resume")
    assert_one_line_error(code, err, f"corpus (saved ['{corpus}'], given ['{other}']); strategy (saved 'head-dims', "
                                     "given 'heads')")
    assert (tmp_path / "pre" / "supernet" / "supernet.json").read_text() == facts
    monkeypatch.chdir(tmp_path)  # the same corpus, named from elsewhere, is the same setting
    code, _, err = pretrain(monkeypatch, capsys, "pre", "corpus.txt", tiny_bert, "--resume")
    assert code == 0, err


def test_pretrain_refuses_an_empty_or_missing_corpus(tiny_bert, tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n<doc id=1>\nTitle\n</doc>\n")
    code, _, err = pretrain(monkeypatch, capsys, tmp_path / "e", empty, tiny_bert)
    assert_one_line_error(code, err, "No text found")
    assert not (tmp_path / "e").exists(), "refused before the run folder is made"
    code, _, err = pretrain(monkeypatch, capsys, tmp_path / "m", tmp_path / "missing.txt", tiny_bert)
    assert_one_line_error(code, err, "missing.txt")
    code, _, err = pretrain(monkeypatch, capsys, tmp_path / "w", write_corpus(tmp_path / "c.txt"), tiny_bert,
                            "--attention-weight", "-1")
    assert_one_line_error(code, err, "--attention-weight")


def test_a_task_run_refuses_a_supernet_of_another_teacher(tiny_bert, tiny_bert4, glue_dir, tmp_path, monkeypatch,
                                                          capsys):
    monkeypatch.setenv("DISTILLERY_CACHE", str(tmp_path / "cache"))
    corpus = write_corpus(tmp_path / "corpus.txt", lines=40)
    assert pretrain(monkeypatch, capsys, tmp_path / "four", corpus, tiny_bert4)[0] == 0
    other = make_tiny_bert(tmp_path / "other-bert", seed=1)  # the tiny BERT's shape, other weights
    assert pretrain(monkeypatch, capsys, tmp_path / "other", corpus, other)[0] == 0
    not_one, damaged = tmp_path / "not-a-supernet", tmp_path / "damaged"
    not_one.mkdir()
    damaged.mkdir()
    (damaged / "supernet.json").write_text("[1]")
    cases = [(tmp_path / "four" / "supernet", "(4 layers of width 32)"),
             (tmp_path / "other" / "supernet", "pre-trained from teacher"),
             (not_one, "not a super-net folder"), (damaged, "not the JSON object")]
    for folder, fragment in cases:
        code, _, err = run_cli(monkeypatch, capsys, "compress", "--task", "sst2", "--method", "autotinybert",
                               "--teacher", str(tiny_bert), "--data-dir", str(glue_dir), "--out", str(tmp_path / "run"),
                               "--overwrite", "--train-limit", "32", "--option", f"supernet={folder}")
        assert_one_line_error(code, err, fragment)
        assert "Option supernet" in err


def test_a_supernet_pretrained_from_a_teacher_with_a_head_serves_that_teacher(tiny_bert, tmp_path, monkeypatch,
                                                                              capsys):
    """Issue 52: pre-training from a teacher saved with a task head was refused, its head's weights said to be "left
    random" (an encoder drops them); and the super-net's teacher was its files, so that the same encoder saved without
    the head was refused as another teacher. The encoder's weights are the teacher now."""
    from transformers import AutoTokenizer, BertForSequenceClassification

    from distillery.autotinybert.pretrain import check_teacher

    tuned, encoder = tmp_path / "tuned", tmp_path / "encoder"
    with_head = BertForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)
    torch.manual_seed(3)
    with torch.no_grad():  # an encoder of its own, as fine-tuning leaves it
        for p in with_head.bert.parameters():
            p.add_(0.01 * torch.randn_like(p))
    with_head.save_pretrained(tuned)
    with_head.bert.save_pretrained(encoder)  # the same encoder, saved without the head
    for folder in (tuned, encoder):
        AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(folder)
    code, _, err = pretrain(monkeypatch, capsys, tmp_path / "pre", write_corpus(tmp_path / "corpus.txt", lines=40), tuned)
    assert code == 0, err
    assert "its head's weights (classifier.*) are dropped, since pre-training needs only the encoder" in err
    assert "left random" not in err
    folder = tmp_path / "pre" / "supernet"
    check_teacher(folder, str(tuned))
    check_teacher(folder, str(encoder))
    with pytest.raises(DistilleryError, match="pre-trained from teacher"):
        check_teacher(folder, tiny_bert)  # the encoder before that fine-tuning is another


def test_a_teacher_given_fine_tuned_is_checked_by_its_shape(tiny_bert, tiny_bert4, glue_dir, tmp_path, monkeypatch,
                                                            capsys):
    """A teacher given fine-tuned names no checkpoint it was tuned from: the super-net's shape is compared."""
    from transformers import AutoTokenizer, BertForSequenceClassification

    corpus = write_corpus(tmp_path / "corpus.txt", lines=40)
    assert pretrain(monkeypatch, capsys, tmp_path / "four", corpus, tiny_bert4)[0] == 0
    tuned = tmp_path / "tuned"
    BertForSequenceClassification.from_pretrained(tiny_bert, num_labels=2).save_pretrained(tuned)
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(tuned)
    code, _, err = run_cli(monkeypatch, capsys, "compress", "--task", "sst2", "--method", "autotinybert", "--teacher",
                           str(tuned), "--teacher-finetuned", "--data-dir", str(glue_dir), "--out", str(tmp_path / "run"),
                           "--train-limit", "32", "--option", f"supernet={tmp_path / 'four' / 'supernet'}")
    assert_one_line_error(code, err, "(4 layers of width 32), not from an encoder of this run's teacher's shape")


@pytest.mark.parametrize("family", ["roberta", "electra", "deberta-v2", "mpnet", "modernbert"])
def test_pretrain_on_other_encoder_families(family, tiny_family, tmp_path):
    """The super-net is cut from a pre-trained encoder of any family the task phase takes."""
    from distillery.autotinybert.oneshot import load_supernet
    from distillery.autotinybert.pretrain import pretrain_supernet
    from distillery.config import TrainConfig

    train = TrainConfig(epochs=1.0, max_steps=2, batch_size=4, lr=1e-3, select_best=False)
    folder = pretrain_supernet([write_corpus(tmp_path / "corpus.txt", lines=60)], tmp_path / "pre",
                               teacher=tiny_family(family), train=train, max_length=16)
    facts = json.loads((folder / "supernet.json").read_text())
    assert facts["steps"] == 2 and facts["held_out"]["largest"]["before"] < 1e-6
    assert load_supernet(folder).config.hidden_size == facts["hidden"]
