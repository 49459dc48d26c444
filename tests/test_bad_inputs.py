"""Bad inputs through the CLI, one table: each fails before any training with exactly one plain
``distillery: error:`` line naming what is wrong (a file, a line, a field or an option), a non-zero
exit and no traceback."""

from __future__ import annotations

import shutil

import pytest

from tests.helpers import assert_one_line_error, run_cli, write_glue


@pytest.fixture(scope="module")
def glue(tmp_path_factory):
    return write_glue(tmp_path_factory.mktemp("glue"), n_train=16, n_dev=8)


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_bert):
    """Saved tiny BERTs with a 2-class, a 3-class and a regression head, and damaged copies."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    root = tmp_path_factory.mktemp("models")
    for name, labels in (("two", 2), ("three", 3), ("regression", 1)):
        AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=labels).save_pretrained(root / name)
        AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(root / name)
    weights = (root / "two" / "model.safetensors").read_bytes()
    for name, damage in (("truncated", lambda d: (d / "model.safetensors").write_bytes(weights[: len(weights) // 2])),
                         ("garbage", lambda d: (d / "model.safetensors").write_bytes(b"garbage" * 50)),
                         ("bad-config", lambda d: (d / "config.json").write_text("{not json"))):
        shutil.copytree(root / "two", root / name)
        damage(root / name)
    return root


class Paths:
    """What a case's command line may refer to."""

    def __init__(self, tmp, glue, bert, roberta, gpt2, models, family=None):
        self.tmp, self.glue, self.bert, self.roberta, self.gpt2, self.models = tmp, glue, bert, roberta, gpt2, models
        self.family = family  # tiny_family: the folder of a tiny teacher of an encoder family (tests/families.py)
        self.file = tmp / "a-file"
        self.file.write_text("not a folder\n")

    def corpus(self):
        """A small text file."""
        corpus = self.tmp / "corpus.txt"
        corpus.write_text("the movie was good\nthe film was bad\n" * 20)
        return str(corpus)

    def corpus_command(self, *args):
        """A corpus step (cmow pretrain, autotinybert pretrain) on a small text file."""
        *command, option, value = args
        return [*command, "--out", str(self.tmp / "step"), "--corpus", self.corpus(), "--teacher", self.bert, option, value]

    def bare_teacher(self):
        """The tiny BERT's weights and config without its tokenizer files."""
        bare = self.tmp / "bare-teacher"
        bare.mkdir()
        for name in ("config.json", "model.safetensors"):
            shutil.copy(f"{self.bert}/{name}", bare / name)
        return bare

    def link(self, target):
        """A symbolic link to ``target``."""
        link = self.tmp / "link"
        link.symlink_to(target)
        return link

    def linked_run(self):
        """A symbolic link to a finished run folder."""
        from distillery.folders import claim

        run = claim(self.tmp / "old-run", "run")
        (run / "metrics.json").write_text("{}")
        return self.link(run)

    def user_run(self, marker=None):
        """A folder of the user's shaped like a run (config.yaml, report.md), with a .distillery file
        holding ``marker`` when given."""
        folder = self.tmp / "mine"
        folder.mkdir()
        (folder / "config.yaml").write_text(GOOD_CONFIG.format(bert=self.bert, glue=self.glue))
        (folder / "report.md").write_text("my notes\n")
        if marker is not None:
            (folder / ".distillery").write_text(marker)
        return folder

    def finished_run(self, name, student=None, hardware=None):
        """A run folder with what a report reads (``student``'s scores, ``hardware``, when given)."""
        import json

        from distillery.folders import claim

        run = claim(self.tmp / name, "run")
        (run / "config.yaml").write_text("method: distill\ndata: {task: sst2}\n")
        metrics = {"task": "sst2", "teacher": {"accuracy": 0.9}, **({"student": student} if student else {})}
        (run / "metrics.json").write_text(json.dumps(metrics))
        (run / "bench.json").write_text(json.dumps({"models": {"teacher": {"latency_ms": {"median": 1.0}}},
                                                    **({"hardware": hardware} if hardware else {})}))
        return run

    def saved_without_record(self):
        """The 2-class model saved by distillery (marked, with its weights record), its record then deleted."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from distillery.modeling import save_model

        folder = self.tmp / "saved"
        save_model(AutoModelForSequenceClassification.from_pretrained(self.models / "two"),
                   AutoTokenizer.from_pretrained(self.models / "two"), folder)
        (folder / "distillery_weights.json").unlink()
        return str(folder)

    def compress(self, *args, teacher=None):
        return ["compress", "--teacher", teacher or self.bert, "--data-dir", str(self.glue),
                "--out", str(self.tmp / "run"), *args]


def saved_run(p: Paths, config_yaml: str) -> list[str]:
    """A run folder (marked as distillery's) whose config.yaml holds ``config_yaml``, resumed."""
    from distillery.folders import mark

    run = p.tmp / "run"
    run.mkdir(exist_ok=True)
    mark(run, "run")
    (run / "config.yaml").write_text(config_yaml)
    return ["compress", "--out", str(run), "--resume"]


def custom(p: Paths, train_rows: list[str], *args: str) -> list[str]:
    """compress on a custom CSV whose train rows (text,label) are ``train_rows``."""
    train, dev = p.tmp / "train.csv", p.tmp / "dev.csv"
    train.write_text("text,label\n" + "\n".join(train_rows) + "\n")
    dev.write_text("text,label\ngood movie,1\nbad movie,0\n")
    return p.compress("--task", "custom", "--train-file", str(train), "--dev-file", str(dev), *args)


def custom_jsonl(p: Paths, lines: list[str]) -> list[str]:
    train = p.tmp / "train.jsonl"
    train.write_text("\n".join(lines) + "\n")
    return p.compress("--task", "custom", "--train-file", str(train), "--dev-file", str(train))


def settings_file(p: Paths, text: str, *args: str) -> list[str]:
    """compress --config FILE with ``text`` as the file."""
    path = p.tmp / "settings.yaml"
    path.write_text(text)
    return p.compress("--config", str(path), *args)


def evaluate(p: Paths, model: str, *args: str) -> list[str]:
    return ["eval", str(p.models / model), "--data-dir", str(p.glue), *args]


GOOD_CONFIG = "method: distill\nbudget: quick\nteacher: {{name: {bert}}}\ndata: {{data_dir: {glue}}}\n"

CASES = {
    # compress --config FILE.yaml
    "config-file-missing": (lambda p: p.compress("--config", str(p.tmp / "none.yaml")), "none.yaml"),
    "config-file-a-folder": (lambda p: p.compress("--config", str(p.tmp)), "No config file"),
    "config-file-not-yaml": (lambda p: settings_file(p, "student: [lr: 1"), "not valid YAML"),
    "config-file-a-list": (lambda p: settings_file(p, "- lr: 1"), "mapping of settings"),
    "config-file-unknown-key": (lambda p: settings_file(p, "student: {learning_rate: 0.1}"), "student.learning_rate"),
    "config-file-bad-type": (lambda p: settings_file(p, "student: {epochs: many}"), "student.epochs"),
    "config-file-bad-option": (lambda p: settings_file(p, "method_options: {kd_weight: 3}"), "kd_weight"),
    "config-file-a-device": (lambda p: p.compress("--config", "/dev/zero"), "/dev/zero is not a regular file"),
    "config-file-too-large": (lambda p: settings_file(p, "# padding\n" * 200_000), "larger than 1 MiB"),
    "config-file-duplicate-key": (lambda p: settings_file(p, "method: distill\nbudget: quick\nmethod: cmow\n"),
                                  "the key 'method' appears twice (first on line 1) (line 3"),
    "config-file-duplicate-nested-key": (lambda p: settings_file(p, "student:\n  lr: 0.1\n  lr: 0.2\n"),
                                         "the key 'lr' appears twice (first on line 2) (line 3"),
    # training and data settings (config.py's dataclasses)
    "epochs-nan": (lambda p: p.compress("--epochs", "nan"), "student.epochs"),
    "epochs-inf": (lambda p: p.compress("--epochs", "inf"), "student.epochs"),
    "epochs-not-a-number": (lambda p: p.compress("--epochs", "abc"), "--epochs"),
    "lr-nan": (lambda p: p.compress("--lr", "nan"), "student.lr"),
    "lr-inf": (lambda p: p.compress("--lr", "inf"), "student.lr"),
    "lr-negative": (lambda p: p.compress("--lr", "-1e-4"), "student.lr"),
    "teacher-epochs-inf": (lambda p: p.compress("--teacher-epochs", "inf"), "teacher.train.epochs"),
    "batch-size-0": (lambda p: p.compress("--batch-size", "0"), "student.batch_size"),
    "max-length-4": (lambda p: p.compress("--max-length", "4"), "data.max_length"),
    "train-limit-negative": (lambda p: p.compress("--train-limit", "-5"), "data.train_limit"),
    "dev-limit-0": (lambda p: p.compress("--dev-limit", "0"), "data.dev_limit"),
    "squad-holdout-nan": (lambda p: p.compress("--task", "squad", "--squad-holdout", "nan"), "data.squad_holdout"),
    "export-bogus": (lambda p: p.compress("--export", "bogus"), "bogus"),
    # distill options
    "temperature-0": (lambda p: p.compress("--temperature", "0"), "temperature"),
    "temperature-negative": (lambda p: p.compress("--temperature", "-2"), "temperature"),
    "temperature-nan": (lambda p: p.compress("--temperature", "nan"), "temperature"),
    "kd-weight-2.5": (lambda p: p.compress("--kd-weight", "2.5"), "kd_weight"),
    "kd-weight-negative": (lambda p: p.compress("--kd-weight", "-0.1"), "kd_weight"),
    "alpha-renamed": (lambda p: p.compress("--option", "alpha=0.3"), "kd_weight"),
    "hidden-weight-negative": (lambda p: p.compress("--hidden-weight", "-1"), "hidden_weight"),
    "student-layers-abc": (lambda p: p.compress("--option", "student_layers=abc"), "student_layers"),
    "student-layers-list-of-text": (lambda p: p.compress("--option", "student_layers=[0, a]"), "student_layers"),
    "unknown-option": (lambda p: p.compress("--option", "bogus=1"), "bogus"),
    "option-without-value": (lambda p: p.compress("--option", "alpha"), "--option"),
    # an option given twice (issue 52): the flag used to win over --option, and the last --option over the first
    "option-and-its-flag": (lambda p: p.compress("--kd-weight", "0.1", "--option", "kd_weight=0.9"),
                            "kd_weight is given twice: --kd-weight 0.1 and --option kd_weight=0.9; give it once."),
    "option-twice": (lambda p: p.compress("--option", "kd_weight=0.1", "--option", "kd-weight=0.9"),
                     "kd_weight is given twice: --option kd_weight=0.1 and --option kd-weight=0.9; give it once."),
    "option-and-its-bool-flag": (lambda p: p.compress("--method", "moebert", "--no-refit", "--option", "refit=true"),
                                 "refit is given twice: --no-refit and --option refit=true"),
    "option-and-its-flag-auto": (lambda p: p.compress("--method", "auto", "--speedup", "2", "--option", "speedup=3"),
                                 "speedup is given twice: --speedup 2.0 and --option speedup=3"),
    "atb-search-option-further-training": (lambda p: ["autotinybert", "search", "--teacher", p.bert, "--data-dir",
                                                      str(p.glue), "--option", "further_training=true"],
                                           "further_training is given twice: autotinybert search (which sets "
                                           "further_training=false) and --option further_training=true"),
    "atb-train-supernet-and-option": (lambda p: ["autotinybert", "train", "--supernet", str(p.tmp), "--arch", "fast",
                                                 "--option", f"supernet={p.glue}"], "supernet is given twice: --supernet"),
    "cmow-pretrain-flag-and-option": (lambda p: p.corpus_command("cmow", "pretrain", "--kd-weight", "0.5", "--option",
                                                                 "kd_weight=0.9"),
                                      "kd_weight is given twice: --kd-weight 0.5 and --option kd_weight=0.9"),
    "option-python-tag": (lambda p: p.compress("--option", 'x=!!python/object/apply:os.system ["true"]'), "--option x"),
    "option-binary-tag": (lambda p: p.compress("--option", "x=!!binary abc"), "--option x"),
    "option-malformed-yaml": (lambda p: p.compress("--option", "alpha=[1, 2"), "--option alpha"),
    # moebert options
    "moebert-experts-0": (lambda p: p.compress("--method", "moebert", "--experts", "0"), "experts"),
    "moebert-experts-text": (lambda p: p.compress("--method", "moebert", "--option", "experts=abc"), "experts"),
    "moebert-expert-size-negative": (lambda p: p.compress("--method", "moebert", "--expert-size", "-3"), "expert_size"),
    "moebert-shared-float": (lambda p: p.compress("--method", "moebert", "--option", "shared=1.5"), "shared"),
    "moebert-split": (lambda p: p.compress("--method", "moebert", "--split", "sorted"), "split"),
    "moebert-routing": (lambda p: p.compress("--method", "moebert", "--routing", "hash"), "routing"),
    "moebert-shared-mode": (lambda p: p.compress("--method", "moebert", "--shared-mode", "copied"), "shared_mode"),
    "moebert-distill-layers": (lambda p: p.compress("--method", "moebert", "--distill-layers", "odd"), "distill_layers"),
    "moebert-lambda-negative": (lambda p: p.compress("--method", "moebert", "--lambda", "-1"), "lambda"),
    "moebert-balance-nan": (lambda p: p.compress("--method", "moebert", "--balance-weight", "nan"), "balance_weight"),
    "moebert-importance-0": (lambda p: p.compress("--method", "moebert", "--importance-examples", "0"), "importance_examples"),
    "moebert-refit-number": (lambda p: p.compress("--method", "moebert", "--option", "refit=3"), "refit"),
    "moebert-unknown": (lambda p: p.compress("--method", "moebert", "--option", "expert=4"), "expert"),
    # cmow options
    "cmow-matrix-dim-0": (lambda p: p.compress("--method", "cmow", "--option", "matrix_dim=0"), "matrix_dim"),
    "cmow-kd-weight-2": (lambda p: p.compress("--method", "cmow", "--option", "kd_weight=2"), "kd_weight"),
    "cmow-temperature-0": (lambda p: p.compress("--method", "cmow", "--option", "temperature=0"), "temperature"),
    "cmow-bidirectional": (lambda p: p.compress("--method", "cmow", "--option", "bidirectional=maybe"), "bidirectional"),
    "cmow-head": (lambda p: p.compress("--method", "cmow", "--option", "head=rnn"), "head"),
    # autotinybert options
    "atb-speedup": (lambda p: p.compress("--method", "autotinybert", "--speedup", "0.5"), "speedup"),
    "atb-latency-archs": (lambda p: p.compress("--method", "autotinybert", "--option", "latency_archs=3"), "latency_archs"),
    "atb-p-mutation": (lambda p: p.compress("--method", "autotinybert", "--option", "p_mutation=2"), "p_mutation"),
    "atb-samples-float": (lambda p: p.compress("--method", "autotinybert", "--option", "samples=1.5"), "samples"),
    "atb-further-training": (lambda p: p.compress("--method", "autotinybert", "--option", "further_training=3"), "further_training"),
    # teachers the methods cannot distil, lengths they cannot read
    "gpt2-distill": (lambda p: p.compress(teacher=p.gpt2), "'gpt2'"),
    "gpt2-moebert": (lambda p: p.compress("--method", "moebert", teacher=p.gpt2), "'gpt2'"),
    "gpt2-cmow": (lambda p: p.compress("--method", "cmow", teacher=p.gpt2), "'gpt2'"),
    "gpt2-autotinybert": (lambda p: p.compress("--method", "autotinybert", teacher=p.gpt2), "'gpt2'"),
    "max-length-over-bert-positions": (lambda p: p.compress("--max-length", "600"), "max_length 600"),
    "max-length-over-roberta-positions": (lambda p: p.compress("--max-length", "519", teacher=p.roberta), "518 positions"),
    # each family's position scheme: MPNet numbers positions after its padding index 1, DistilBERT from 0
    "max-length-over-mpnet-positions": (lambda p: p.compress("--max-length", "511", teacher=p.family("mpnet")),
                                        "510 positions"),
    "max-length-over-distilbert-positions": (lambda p: p.compress("--max-length", "513", teacher=p.family("distilbert")),
                                             "512 positions"),
    "gpt2-teacher-command": (lambda p: ["teacher", "--teacher", p.gpt2, "--data-dir", str(p.glue)], "'gpt2'"),
    # a run folder's config.yaml read by --resume
    "resume-epochs-text": (lambda p: saved_run(p, GOOD_CONFIG.format(bert=p.bert, glue=p.glue) + "student: {epochs: abc}\n"),
                           "student.epochs"),
    "resume-max-length-list": (lambda p: saved_run(p, GOOD_CONFIG.format(bert=p.bert, glue=p.glue).replace(
                                   "data: {", "data: {max_length: [1], ")), "data.max_length"),
    "resume-method-options-number": (lambda p: saved_run(p, GOOD_CONFIG.format(bert=p.bert, glue=p.glue) + "method_options: 3\n"),
                                     "method_options"),
    "resume-unknown-field": (lambda p: saved_run(p, GOOD_CONFIG.format(bert=p.bert, glue=p.glue) + "colour: blue\n"), "colour"),
    "resume-unknown-nested-field": (lambda p: saved_run(p, "teacher: {train: {speed: 3}}\n"), "teacher.train.speed"),
    "resume-not-a-mapping": (lambda p: saved_run(p, "- 1\n- 2\n"), "config.yaml"),
    # damaged saved models, heads that do not match the task
    "eval-truncated-weights": (lambda p: evaluate(p, "truncated"), "model.safetensors"),
    "eval-garbage-weights": (lambda p: evaluate(p, "garbage"), "model.safetensors"),
    "eval-bad-config": (lambda p: evaluate(p, "bad-config"), "config.json"),
    "export-truncated-weights": (lambda p: ["export", str(p.models / "truncated"), "--format", "onnx",
                                            "--out", str(p.tmp / "x")], "model.safetensors"),
    "export-bad-config": (lambda p: ["export", str(p.models / "bad-config"), "--out", str(p.tmp / "x")], "config.json"),
    "bench-garbage-weights": (lambda p: ["bench", str(p.models / "garbage")], "model.safetensors"),
    "bench-bad-config": (lambda p: ["bench", str(p.models / "bad-config")], "config.json"),
    "eval-2-class-on-stsb": (lambda p: evaluate(p, "two", "--task", "stsb"), "head does not match"),
    "eval-3-class-on-sst2": (lambda p: evaluate(p, "three"), "3 outputs"),
    "eval-regression-on-sst2": (lambda p: evaluate(p, "regression"), "head does not match"),
    # hostile teachers and saved models (issue 31): weights that do not match config.json, heads that do
    # not fit the task, pickles, broken tokenizer files, non-finite weights (see hostile() below)
    "teacher-renamed-keys": (lambda p: p.compress(teacher=hostile(p, "renamed")), "encoderx."),
    "teacher-renamed-keys-teacher-command": (lambda p: ["teacher", "--teacher", hostile(p, "renamed"),
                                                        "--data-dir", str(p.glue)], "encoderx."),
    "teacher-config-8-layers": (lambda p: p.compress(teacher=hostile(p, "layers-8")), "num_hidden_layers=8"),
    "teacher-config-100000-layers": (lambda p: p.compress(teacher=hostile(p, "layers-100000")), "num_hidden_layers=100000"),
    "teacher-config-hidden-size": (lambda p: p.compress(teacher=hostile(p, "hidden-64")), "hidden_size=64"),
    "teacher-1-label-finetuned-on-sst2": (lambda p: p.compress("--teacher-finetuned", teacher=str(p.models / "regression")),
                                          "needs a 2-class classification head; drop --teacher-finetuned"),
    "teacher-3-label-finetuned-on-sst2": (lambda p: p.compress("--teacher-finetuned", teacher=str(p.models / "three")),
                                          "has a 3-class classification head but task sst2 needs a 2-class"),
    "teacher-2-label-finetuned-on-stsb": (lambda p: p.compress("--task", "stsb", "--teacher-finetuned",
                                                               teacher=str(p.models / "two")), "needs a regression head"),
    "teacher-2-label-finetuned-on-3-classes": (lambda p: [*custom(p, ["good,1", "bad,0", "meh,2"]), "--teacher",
                                                          str(p.models / "two"), "--teacher-finetuned"],
                                               "needs a 3-class classification head"),
    "teacher-pickled-compress": (lambda p: p.compress(teacher=hostile(p, "pickled")), "pytorch_model.bin"),
    "teacher-pickled-teacher-command": (lambda p: ["teacher", "--teacher", hostile(p, "pickled"), "--data-dir", str(p.glue)],
                                        "pytorch_model.bin"),
    "teacher-pickled-moebert-importance": (lambda p: ["moebert", "importance", "--teacher", hostile(p, "pickled"),
                                                      "--data-dir", str(p.glue), "--out", str(p.tmp / "i.safetensors")],
                                           "pytorch_model.bin"),
    "eval-pickled": (lambda p: ["eval", hostile(p, "pickled-two"), "--data-dir", str(p.glue)], "pytorch_model.bin"),
    "export-pickled": (lambda p: ["export", hostile(p, "pickled-two"), "--format", "torch-int8", "--out", str(p.tmp / "x")],
                       "pytorch_model.bin"),
    "bench-pickled": (lambda p: ["bench", hostile(p, "pickled-two")], "pytorch_model.bin"),
    "teacher-tokenizer-json-not-json": (lambda p: p.compress(teacher=hostile(p, "tokenizer-not-json")), "tokenizer.json"),
    "teacher-tokenizer-json-not-a-tokenizer": (lambda p: p.compress(teacher=hostile(p, "tokenizer-not-a-tokenizer")),
                                               "tokenizer.json"),
    "teacher-tokenizer-config-a-list": (lambda p: p.compress(teacher=hostile(p, "tokenizer-config-a-list")),
                                        "tokenizer_config.json"),
    "eval-tokenizer-config-not-json": (lambda p: ["eval", hostile(p, "tokenizer-config-not-json-two"), "--data-dir",
                                                  str(p.glue)], "tokenizer_config.json"),
    "export-tokenizer-json-not-json": (lambda p: ["export", hostile(p, "tokenizer-not-json-two"), "--format", "torch-int8",
                                                  "--out", str(p.tmp / "x")], "tokenizer.json"),
    # a model that is its own code (issue 52): refused from config.json before anything is loaded, on every
    # command that loads a folder; test_hostile_models.py shows no prompt appears and nothing of it runs
    "teacher-auto-map": (lambda p: p.compress(teacher=hostile(p, "auto-map")), "maps the model to its own Python code"),
    "teacher-unknown-type": (lambda p: p.compress(teacher=hostile(p, "unknown-type")),
                             "names model_type 'evilbert', which neither transformers nor distillery defines"),
    "teacher-no-model-type": (lambda p: p.compress(teacher=hostile(p, "no-type")), "names no model_type"),
    "teacher-command-auto-map": (lambda p: ["teacher", "--teacher", hostile(p, "auto-map"), "--data-dir", str(p.glue)],
                                 "auto_map"),
    "student-auto-map": (lambda p: p.compress("--student", hostile(p, "auto-map")), "auto_map"),
    "moebert-importance-auto-map": (lambda p: ["moebert", "importance", "--teacher", hostile(p, "auto-map"), "--data-dir",
                                               str(p.glue), "--out", str(p.tmp / "i.safetensors")], "auto_map"),
    "cmow-pretrain-auto-map": (lambda p: ["cmow", "pretrain", "--out", str(p.tmp / "c"), "--corpus", str(p.file),
                                          "--teacher", hostile(p, "auto-map")], "auto_map"),
    "atb-pretrain-auto-map": (lambda p: ["autotinybert", "pretrain", "--out", str(p.tmp / "c"), "--corpus", str(p.file),
                                         "--teacher", hostile(p, "auto-map")], "auto_map"),
    "eval-auto-map": (lambda p: ["eval", hostile(p, "auto-map-two"), "--data-dir", str(p.glue)], "auto_map"),
    "export-auto-map": (lambda p: ["export", hostile(p, "auto-map-two"), "--format", "torch-int8", "--out",
                                   str(p.tmp / "x")], "auto_map"),
    "bench-auto-map": (lambda p: ["bench", hostile(p, "auto-map-two")], "auto_map"),
    "teacher-tokenizer-auto-map": (lambda p: p.compress(teacher=hostile(p, "tokenizer-auto-map")),
                                   "tokenizer_config.json maps the tokenizer to its own Python code"),
    "cmow-init-a-bert-folder": (lambda p: p.compress("--method", "cmow", "--option", f"init={p.bert}"), "not a CMOW encoder"),
    "eval-saved-model-without-weights-record": (lambda p: ["eval", p.saved_without_record(), "--data-dir", str(p.glue)],
                                                "has no weights record"),
    "eval-nan-weights": (lambda p: ["eval", hostile(p, "nan-two"), "--data-dir", str(p.glue)], "model.safetensors holds non-finite"),
    "eval-renamed-keys": (lambda p: ["eval", hostile(p, "renamed-two"), "--data-dir", str(p.glue)], "encoderx."),
    "eval-config-8-layers": (lambda p: ["eval", hostile(p, "layers-8-two"), "--data-dir", str(p.glue)], "num_hidden_layers=8"),
    "bench-config-hidden-size": (lambda p: ["bench", hostile(p, "hidden-64-two")], "hidden_size=64"),
    "eval-config-intermediate-size": (lambda p: ["eval", hostile(p, "intermediate-50-two"), "--data-dir", str(p.glue)],
                                      "(37,) saved, (50,)"),
    "teacher-config-intermediate-size": (lambda p: p.compress(teacher=hostile(p, "intermediate-50")), "another shape"),
    # custom data: missing labels must not become a class
    "custom-empty-label": (lambda p: custom(p, ["good movie,1", "bad movie,0", "fun plot,"]), "train.csv, line 4"),
    "custom-nan-label": (lambda p: custom(p, ["good movie,1", "bad movie,NaN", "fun plot,0"]), "train.csv, line 3"),
    "custom-none-label": (lambda p: custom(p, ["good movie,None", "bad movie,0", "fun plot,1"]), "train.csv, line 2"),
    "custom-json-null-label": (lambda p: custom_jsonl(p, ['{"text": "good", "label": 1}', '{"text": "bad", "label": null}']),
                               "train.jsonl, line 2"),
    "custom-regression-text": (lambda p: custom(p, ["good movie,1.5", "bad movie,abc"], "--regression"), "train.csv, line 3"),
    "custom-regression-nan": (lambda p: custom(p, ["good movie,1.5", "bad movie,nan"], "--regression"), "train.csv, line 3"),
    "custom-regression-inf": (lambda p: custom(p, ["good movie,inf", "bad movie,2"], "--regression"), "train.csv, line 2"),
    # hostile data and configs (issue 31); their helpers are at the end of this file, the YAML bombs in test_hostile_data.py
    "custom-duplicate-header": (lambda p: custom_table(p, "train.csv", "text,label,text\ngood,1,fun\nbad,0,dull\n"),
                                "train.csv: the header names column 'text' twice"),
    "custom-unquoted-comma": (lambda p: custom(p, ["good movie, really,1", "bad movie,0"]), "train.csv, line 2"),
    "custom-tsv-extra-tab": (lambda p: custom_table(p, "train.tsv", "text\tlabel\ngood\t1\nbad\tmovie\t0\n"),
                             "train.tsv, line 3"),
    "custom-json-text-object": (lambda p: custom_jsonl(p, ['{"text": "good", "label": 1}', '{"text": {"a": 1}, "label": 0}']),
                                "train.jsonl, line 2: field 'text' holds an object"),
    "custom-json-text-list": (lambda p: custom_jsonl(p, ['{"text": ["good"], "label": 1}', '{"text": "bad", "label": 0}']),
                              "train.jsonl, line 1: field 'text' holds a list"),
    "custom-many-empty-texts": (lambda p: custom(p, [",1", "good movie,1", " ,0", "bad movie,0"]),
                                "2 of 4 rows have an empty text"),
    "custom-pair-column-is-text": (lambda p: custom(p, ["good,1", "bad,0"], "--text-pair-column", "text"),
                                   "--text-column and --text-pair-column both name column 'text'"),
    "custom-label-column-is-text": (lambda p: custom(p, ["good,1", "bad,0"], "--label-column", "text"),
                                    "--text-column and --label-column both name column 'text'"),
    "glue-tsv-extra-fields": (lambda p: glue_with_row(p, "a fine movie\t1\textra\tfields"),
                              "train.tsv, line 18: expected 2 tab-separated fields as its header has, found 4"),
    "custom-train-file-a-device": (lambda p: p.compress("--task", "custom", "--train-file", "/dev/zero"),
                                   "/dev/zero is not a regular file"),
    "squad-data-an-object": (lambda p: squad(p, '{"data": {"title": "x"}}'), '"data" is an object, not a list'),
    "squad-top-level-list": (lambda p: squad(p, '[{"title": "x"}]'), "the whole file is a list, not an object"),
    "squad-article-a-string": (lambda p: squad(p, '{"data": ["x"]}'), "data[0] is a string"),
    "config-section-a-number-with-a-flag": (lambda p: settings_file(p, "student: 3", "--lr", "0.1"), "student must be a mapping"),
    "config-option-section-a-number": (lambda p: settings_file(p, "method_options: 3", "--option", "kd_weight=0.5"),
                                       "method_options must be a mapping"),
    "config-yaml-self-reference": (lambda p: settings_file(p, "data: &a {task: [*a]}\n"), "refers to a value that contains it"),
    "batch-size-1e26": (lambda p: p.compress("--batch-size", str(10**26)), "student.batch_size must be from 1 to"),
    "max-steps-1e23": (lambda p: settings_file(p, f"student: {{max_steps: {10**23}}}"), "student.max_steps must be from 1 to"),
    "epochs-1e23": (lambda p: p.compress("--epochs", "1e23"), "student.epochs must be more than 0 and at most"),
    "teacher-eval-batch-huge": (lambda p: settings_file(p, f"teacher: {{train: {{eval_batch_size: {2**40}}}}}"),
                                "teacher.train.eval_batch_size"),
    "max-length-huge": (lambda p: p.compress("--max-length", str(10**9)), "data.max_length must be from 8 to"),
    "n-best-huge": (lambda p: settings_file(p, "data: {n_best: 100000000}"), "data.n_best"),
    "cmow-matrix-dim-petabytes": (lambda p: p.compress("--method", "cmow", "--option", "matrix_dim=100000"),
                                  "matrix_dim=100000"),
    "pretrain-matrix-dim-petabytes": (lambda p: p.corpus_command("cmow", "pretrain", "--option", "matrix_dim=100000"),
                                      "matrix_dim=100000"),
    "pretrain-corpus-a-device": (lambda p: ["cmow", "pretrain", "--out", str(p.tmp / "c"), "--corpus", "/dev/zero",
                                            "--teacher", p.bert], "/dev/zero is not a regular file"),
    "glue-with-regression": (lambda p: p.compress("--regression"), "(--regression) is only for task custom"),
    "glue-with-train-file": (lambda p: p.compress("--train-file", str(p.file)), "(--train-file) is only for task custom"),
    "glue-with-dev-file": (lambda p: p.compress("--dev-file", str(p.file)), "(--dev-file) is only for task custom"),
    "glue-with-text-column": (lambda p: p.compress("--text-column", "review"), "(--text-column) is only for task custom"),
    "glue-with-text-pair-column": (lambda p: p.compress("--text-pair-column", "b"), "(--text-pair-column) is only for"),
    "glue-with-label-column": (lambda p: p.compress("--label-column", "stars"), "(--label-column) is only for task custom"),
    "squad-with-train-file": (lambda p: p.compress("--task", "squad", "--train-file", str(p.file)), "(--train-file)"),
    "teacher-glue-with-train-file": (lambda p: ["teacher", "--teacher", p.bert, "--data-dir", str(p.glue), "--train-file",
                                                str(p.file)], "(--train-file) is only for task custom"),
    "eval-glue-with-dev-file": (lambda p: evaluate(p, "two", "--dev-file", str(p.file)), "(--dev-file) is only for"),
    "eval-custom-without-dev-file": (lambda p: evaluate(p, "two", "--task", "custom"), "give --dev-file"),
    "teacher-custom-without-files": (lambda p: ["teacher", "--teacher", p.bert, "--task", "custom"], "give --dev-file"),
    # files where folders are expected, and other paths
    "teacher-is-a-file": (lambda p: p.compress(teacher=str(p.file)), "a-file"),
    # issue 52: a model's config.json given for its folder said the folder "has no config.json"
    "student-is-its-config-json": (lambda p: p.compress("--student", f"{p.bert}/config.json"),
                                   "--student takes a saved model's folder (or a name or a Hub id); give "),
    "teacher-is-its-config-json": (lambda p: p.compress(teacher=f"{p.bert}/config.json"),
                                   "the folder that holds this config.json"),
    "data-dir-is-a-file": (lambda p: ["compress", "--teacher", p.bert, "--data-dir", str(p.file), "--out", str(p.tmp / "run")],
                           "a-file"),
    "moebert-init-is-a-file": (lambda p: p.compress("--method", "moebert", "--option", f"init={p.file}"), "a-file"),
    "cmow-init-is-a-file": (lambda p: p.compress("--method", "cmow", "--option", f"init={p.file}"), "a-file"),
    "atb-supernet-is-a-file": (lambda p: ["autotinybert", "latency", "--supernet", str(p.file)], "a-file"),
    "corpus-is-a-folder": (lambda p: ["cmow", "pretrain", "--out", str(p.tmp / "c"), "--corpus", str(p.glue),
                                      "--teacher", p.bert], "Corpus file"),
    "supernet-strategy": (lambda p: p.corpus_command("autotinybert", "pretrain", "--strategy", "rows"), "strategy"),
    "supernet-samples-0": (lambda p: p.corpus_command("autotinybert", "pretrain", "--samples", "0"), "samples"),
    "pretrain-temperature-0": (lambda p: p.corpus_command("cmow", "pretrain", "--temperature", "0"), "temperature"),
    "pretrain-matrix-dim-0": (lambda p: p.corpus_command("cmow", "pretrain", "--option", "matrix_dim=0"), "matrix_dim"),
    # issue 52: a --max-lines below 1 read one line and blamed the corpus for it
    "cmow-pretrain-max-lines-0": (lambda p: p.corpus_command("cmow", "pretrain", "--max-lines", "0"),
                                  "--max-lines must be at least 1"),
    "atb-pretrain-max-lines-negative": (lambda p: p.corpus_command("autotinybert", "pretrain", "--max-lines", "-1"),
                                        "--max-lines must be at least 1"),
    "transfer-set-max-lines-0": (lambda p: ["transfer-set", "--corpus", p.corpus(), "--out", str(p.tmp / "t.jsonl"),
                                            "--max-lines", "0"], "--max-lines must be at least 1"),
    "bench-not-a-model": (lambda p: ["bench", str(p.glue)], "not a saved model"),
    "bench-latency-runs-0": (lambda p: ["bench", str(p.models / "two"), "--latency-runs", "0"], "latency_runs"),
    "compress-latency-runs-0": (lambda p: p.compress("--latency-runs", "0"), "latency_runs"),
    "export-format-bogus": (lambda p: ["export", str(p.models / "two"), "--format", "bogus"], "bogus"),
    "export-dev-limit-0": (lambda p: ["export", str(p.models / "two"), "--task", "sst2", "--dev-limit", "0"], "dev_limit"),
    "eval-max-length-2": (lambda p: evaluate(p, "two", "--max-length", "2"), "max_length"),
    "budget-unknown": (lambda p: p.compress("--budget", "huge"), "huge"),
    "cmow-on-squad": (lambda p: p.compress("--method", "cmow", "--task", "squad"), "SQuAD"),
    "seed-negative": (lambda p: p.compress("--seed", "-1"), "seed"),
    "seed-too-large": (lambda p: p.compress("--seed", str(2**32)), "seed"),
    "eval-encoder-without-head": (lambda p: ["eval", p.bert, "--data-dir", str(p.glue)], "no task head"),
    "eval-a-teacher-name": (lambda p: ["eval", "mpnet-base", "--data-dir", str(p.glue)],
                            "mpnet-base names a built-in teacher, a pretrained encoder without a task head"),
    "bench-threads-over-the-cpus": (lambda p: ["bench", str(p.models / "two"), "--threads", "10000"],
                                    "bench threads 10000 is more than the"),
    "compress-threads-over-the-cpus": (lambda p: p.compress("--threads", "1,10000"), "bench threads 10000 is more than"),
    "moebert-convert-importance-another-file": (lambda p: moebert_convert(p, {"scores": [[1.0]]}),
                                                "holds no 'importance' tensor (it holds scores)"),
    "moebert-convert-importance-another-shape": (lambda p: moebert_convert(p, {"importance": [[1.0, 2.0]]}),
                                                 "holds importance scores of shape (1, 2), but the teacher has 2 layers"),
    "moebert-convert-importance-not-safetensors": (lambda p: ["moebert", "convert", "--teacher", p.bert, "--data-dir",
                                                              str(p.glue), "--importance", str(p.file), "--out",
                                                              str(p.tmp / "conv")], "is not a readable safetensors file"),
    "report-a-string-score": (lambda p: ["report", str(p.finished_run("s", student={"accuracy": "0.85"}))],
                              "metrics.json: student.accuracy holds the string '0.85', where a report reads a number"),
    "report-accuracy-5": (lambda p: ["report", str(p.finished_run("s", student={"accuracy": 5.0}))],
                          "metrics.json: student.accuracy holds 5.0, but accuracy lies in [0, 1]"),
    "report-a-run-twice": (lambda p: ["report", str(p.finished_run("a")), str(p.tmp / "a"), "--out", str(p.tmp / "m")],
                           "/a is given twice; give each run once."),
    "report-a-run-twice-by-another-path": (lambda p: ["report", str(p.finished_run("a")), str(p.link(p.tmp / "a")),
                                                      "--out", str(p.tmp / "m")],
                                           "/link are one run folder ("),
    "report-hardware-a-string": (lambda p: ["report", str(p.finished_run("h", hardware="my laptop"))],
                                 "bench.json: hardware holds the string 'my laptop', where a report reads a mapping"),
    "eval-split-train": (lambda p: evaluate(p, "two", "--split", "train"),
                         "--split train: eval scores one of the dev splits of task sst2 (dev)"),
    "report-not-a-run-among-several": (lambda p: ["report", str(p.models / "two"), str(p.glue)], "config.yaml"),
    "moebert-importance-step-0": (lambda p: ["moebert", "importance", "--teacher", p.bert, "--data-dir", str(p.glue),
                                             "--importance-examples", "0", "--out", str(p.tmp / "i")],
                                  "importance_examples"),
    # output folders (see test_folders.py for what survives), teachers that are not what they claim
    "out-is-a-file": (lambda p: [*p.compress(), "--out", str(p.file)], "is a file"),
    "out-is-the-teacher": (lambda p: [*p.compress(), "--out", p.bert, "--overwrite"], "input of this command"),
    "out-is-a-user-folder": (lambda p: [*p.compress(), "--out", str(p.models), "--overwrite"], "not written by distillery"),
    "teacher-out-is-a-file": (lambda p: ["teacher", "--teacher", p.bert, "--data-dir", str(p.glue), "--out", str(p.file)],
                              "is a file"),
    "export-out-is-the-model": (lambda p: ["export", str(p.models / "two"), "--format", "torch-int8",
                                           "--out", str(p.models / "two"), "--overwrite"], "input of this command"),
    "teacher-without-tokenizer-files": (lambda p: p.compress(teacher=str(p.bare_teacher())), "tokenizer files"),
    "teacher-finetuned-without-head": (lambda p: p.compress("--teacher-finetuned"), "no trained sst2 head"),
    "resume-with-other-epochs": (lambda p: [*saved_run(p, GOOD_CONFIG.format(bert=p.bert, glue=p.glue)), "--epochs", "9"],
                                 "student.epochs (saved"),
    # hostile outputs (issue 31); what survives is in test_hostile_outputs.py
    "eval-out-is-a-folder": (lambda p: evaluate(p, "two", "--out", str(p.tmp)), "is a folder"),
    "moebert-importance-out-is-a-folder": (lambda p: ["moebert", "importance", "--teacher", p.bert, "--data-dir",
                                                      str(p.glue), "--out", str(p.tmp)], "is a folder"),
    "bench-out-is-a-folder": (lambda p: ["bench", str(p.models / "two"), "--out", str(p.tmp)], "is a folder"),
    "eval-out-exists": (lambda p: evaluate(p, "two", "--out", str(p.file)), "--overwrite"),
    "eval-out-under-a-file": (lambda p: evaluate(p, "two", "--out", str(p.file / "m.json")), "which is a file"),
    "eval-out-in-the-model": (lambda p: evaluate(p, "two", "--out", str(p.models / "two" / "config.json"), "--overwrite"),
                              "input of this command"),
    "eval-out-in-the-data": (lambda p: evaluate(p, "two", "--out", str(p.glue / "glue" / "SST-2" / "dev.tsv"),
                                                "--overwrite"), "input of this command"),
    "atb-latency-out-in-the-supernet": (lambda p: ["autotinybert", "latency", "--supernet", str(p.models / "two"),
                                                   "--out", str(p.models / "two" / "config.json")], "input of this command"),
    "out-name-too-long": (lambda p: [*p.compress(), "--out", str(p.tmp / ("r" * 300))], "too long"),
    "eval-out-name-too-long": (lambda p: evaluate(p, "two", "--out", str(p.tmp / ("m" * 300 + ".json"))), "too long"),
    "out-symlink-to-its-run-overwrite": (lambda p: [*p.compress(), "--out", str(p.linked_run()), "--overwrite"],
                                         "symbolic link"),
    "out-dangling-symlink": (lambda p: [*p.compress(), "--out", str(p.link(p.tmp / "gone"))], "symbolic link"),
    "resume-a-user-folder": (lambda p: ["compress", "--out", str(p.user_run()), "--resume"], "not written by distillery"),
    "overwrite-with-a-fake-marker": (lambda p: [*p.compress(), "--out", str(p.user_run(marker="editor=vim\n")),
                                                "--overwrite"], "not written by distillery"),
    "report-out-a-user-folder": (lambda p: ["report", str(p.finished_run("a")), str(p.finished_run("b")),
                                            "--out", str(p.user_run())], "not written by distillery"),
}


def hostile(p: Paths, kind: str) -> str:
    """A copy of the tiny BERT teacher (or, for a ``-two`` kind, of the saved 2-class model) damaged
    as ``kind`` says (issue 31's hostile teachers and saved models); returns its folder."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    base = kind.removesuffix("-two")
    folder = p.tmp / kind
    shutil.copytree(p.models / "two" if kind.endswith("-two") else p.bert, folder)
    weights, config = folder / "model.safetensors", folder / "config.json"
    if base == "renamed":  # every encoder weight under another name
        state = load_file(weights)
        save_file({f"encoderx.{k.removeprefix('bert.')}": v for k, v in state.items()}, weights, metadata={"format": "pt"})
    elif base.startswith(("layers-", "hidden-", "intermediate-")):
        field = {"layers": "num_hidden_layers", "hidden": "hidden_size", "intermediate": "intermediate_size"}[base.split("-")[0]]
        config.write_text(json.dumps({**json.loads(config.read_text()), field: int(base.split("-")[1])}))
    elif base == "pickled":  # a pickle holding an object besides the tensors: torch's weights-only reader refuses it
        state = load_file(weights)
        weights.unlink()
        torch.save({**state, "extra": Paths}, folder / "pytorch_model.bin")
    elif base in ("auto-map", "unknown-type", "no-type"):  # the model is the folder's own code, or of no known type
        content = {**json.loads(config.read_text()), "model_type": "evilbert"}
        if base == "auto-map":
            content = {**content, "model_type": "bert", "auto_map": {"AutoConfig": "evil.EvilConfig"}}
        if base == "no-type":
            del content["model_type"]
        config.write_text(json.dumps(content))
    elif base == "tokenizer-auto-map":
        tokenizer_config = folder / "tokenizer_config.json"
        tokenizer_config.write_text(json.dumps({**json.loads(tokenizer_config.read_text()),
                                                "auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}}))
    elif base == "nan":
        save_file({k: v * float("nan") for k, v in load_file(weights).items()}, weights, metadata={"format": "pt"})
    else:
        name, text = {"tokenizer-not-json": ("tokenizer.json", "{not json"),
                      "tokenizer-not-a-tokenizer": ("tokenizer.json", '{"a": 1}'),
                      "tokenizer-config-a-list": ("tokenizer_config.json", "[1]"),
                      "tokenizer-config-not-json": ("tokenizer_config.json", "{oops")}[base]
        (folder / name).write_text(text)
    return str(folder)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input(case, monkeypatch, capsys, tmp_path, glue, tiny_bert, tiny_roberta, tiny_gpt2, models, tiny_family):
    build, fragment = CASES[case]
    args = build(Paths(tmp_path, glue, tiny_bert, tiny_roberta, tiny_gpt2, models, tiny_family))
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, fragment)
    assert not list(tmp_path.glob("*/checkpoints")), "no training may start"


def test_ctrl_c_exits_130_with_the_resume_hint(monkeypatch, capsys):
    """typer turns KeyboardInterrupt into an exit code that it returns when not standalone."""
    import distillery.pipeline

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(distillery.pipeline, "resolve_settings", interrupted)
    code, _, err = run_cli(monkeypatch, capsys, "compress")
    assert code == 130
    assert "--resume" in err and "Traceback" not in err


# helpers of the rows "hostile data and configs (issue 31)"


def custom_table(p: Paths, name: str, train_text: str) -> list[str]:
    """compress on a custom train file ``name`` holding ``train_text`` (dev: a good CSV)."""
    train, dev = p.tmp / name, p.tmp / "dev.csv"
    train.write_text(train_text)
    dev.write_text("text,label\ngood movie,1\nbad movie,0\n")
    return p.compress("--task", "custom", "--train-file", str(train), "--dev-file", str(dev))


def moebert_convert(p: Paths, tensors: dict) -> list[str]:
    """moebert convert with --importance a safetensors file holding ``tensors`` (name: nested lists)."""
    import torch
    from safetensors.torch import save_file

    path = p.tmp / "scores.safetensors"
    save_file({k: torch.tensor(v) for k, v in tensors.items()}, str(path))
    return ["moebert", "convert", "--teacher", p.bert, "--data-dir", str(p.glue), "--importance", str(path),
            "--out", str(p.tmp / "conv")]


def glue_with_row(p: Paths, row: str) -> list[str]:
    """compress on a copy of the GLUE data whose SST-2 train.tsv ends with ``row``."""
    data = p.tmp / "glue-copy"
    shutil.copytree(p.glue, data)
    train = data / "glue" / "SST-2" / "train.tsv"
    train.write_text(train.read_text() + row + "\n")
    return ["compress", "--teacher", p.bert, "--data-dir", str(data), "--out", str(p.tmp / "run")]


def squad(p: Paths, text: str) -> list[str]:
    """compress on SQuAD whose train and dev files hold ``text``."""
    folder = p.tmp / "squad-data" / "squad"
    folder.mkdir(parents=True)
    for name in ("train-v1.1.json", "dev-v1.1.json"):
        (folder / name).write_text(text)
    return ["compress", "--teacher", p.bert, "--task", "squad", "--data-dir", str(folder.parent),
            "--out", str(p.tmp / "run")]

