"""What the test modules share: the tiny model config, tiny encoders with their own tokenizers, tiny data
files, tiny run settings, synthetic run folders and the in-process CLI runner. Test modules import from
here (and from conftest's fixtures), never from one another.

Sizes follow the transformers test convention (hidden 32, 2 layers, 4 heads, intermediate 37, vocab 99).
The vocabularies are written here so that no test needs the Hub or the packaged teacher.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import string
import sys
from contextlib import contextmanager
from pathlib import Path

import torch


@contextmanager
def benchmark_script(name: str):
    """``benchmarks/<name>.py`` imported as a module, its sibling ``common.py`` importable while it is in use."""
    folder = Path(__file__).resolve().parent.parent / "benchmarks"
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(f"{name}_benchmark", folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(folder))


# -- the tiny config -------------------------------------------------------------------------------

TINY_BERT = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)


def tiny_bert_config(**kw):
    """A ``BertConfig`` of the tiny sizes; ``kw`` overrides or adds fields."""
    from transformers import BertConfig

    return BertConfig(**{**TINY_BERT, **kw})


def tiny_teacher(cls=None, seed=0, **kw):
    """A tiny random BERT with a task head (``cls``, sequence classification by default; 3 labels unless
    ``num_labels`` says otherwise), in eval mode, with non-zero biases so that a bias that went astray
    would show."""
    from transformers import BertForSequenceClassification

    torch.manual_seed(seed)
    config = tiny_bert_config(num_labels=kw.pop("num_labels", 3), **kw)
    model = (cls or BertForSequenceClassification)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    return model


# -- tiny encoders saved with their tokenizers -----------------------------------------------------

WORDS = (
    "the a an is was good bad great awful movie film plot actor not very really fun boring "
    "what who where when why how many paris france london city river born year first name"
).split()


def bert_vocab() -> list[str]:
    letters = list(string.ascii_lowercase) + list(string.digits) + list(".,!?'-()")
    return (
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        + WORDS
        + letters
        + ["##" + c for c in string.ascii_lowercase + string.digits]
    )


def make_tiny_bert(path, num_layers: int = 2, seed: int = 0, dropout: float = 0.1):
    """Save a tiny random ``BertModel`` and its WordPiece tokenizer in ``path``; return the path.
    ``dropout`` 0 makes training a function of the data alone (several processes draw other masks)."""
    from transformers import BertModel, BertTokenizer

    path = str(path)
    os.makedirs(path, exist_ok=True)
    vocab = bert_vocab()
    with open(os.path.join(path, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    tok = BertTokenizer(os.path.join(path, "vocab.txt"), do_lower_case=True, model_max_length=512)
    tok.save_pretrained(path)
    torch.manual_seed(seed)
    config = tiny_bert_config(vocab_size=len(vocab), num_hidden_layers=num_layers, max_position_embeddings=512,
                              type_vocab_size=2, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    BertModel(config).save_pretrained(path)
    return path


def write_byte_bpe(path: str) -> dict:
    """vocab.json and merges.txt of a byte-level BPE with no merges in ``path``; returns the vocab."""
    os.makedirs(path, exist_ok=True)
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    # GPT-2's byte-to-printable-character table: every byte has a token, so any text encodes.
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    byte_chars = [chr(b) for b in printable] + [chr(256 + i) for i in range(256 - len(printable))]
    vocab = {t: i for i, t in enumerate(specials + byte_chars)}
    with open(os.path.join(path, "vocab.json"), "w") as f:
        json.dump(vocab, f)
    with open(os.path.join(path, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
    return vocab


def make_tiny_roberta(path, num_layers: int = 2, seed: int = 0):
    """Save a tiny random ``RobertaModel`` with a byte-level BPE tokenizer (no merges) in ``path``."""
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizer

    path = str(path)
    vocab = write_byte_bpe(path)
    tok = RobertaTokenizer(os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt"), model_max_length=512)
    tok.save_pretrained(path)
    torch.manual_seed(seed)
    sizes = {**TINY_BERT, "vocab_size": len(vocab), "num_hidden_layers": num_layers}
    config = RobertaConfig(**sizes, max_position_embeddings=520, type_vocab_size=1, pad_token_id=1, bos_token_id=0,
                           eos_token_id=2)
    RobertaModel(config).save_pretrained(path)
    return path


# -- tiny token batches (already tokenized) --------------------------------------------------------


class Examples(torch.utils.data.Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(items):
    """Pad ``input_ids`` lists into a batch with its attention mask and the task's targets."""
    longest = max(len(x["input_ids"]) for x in items)
    out = {"input_ids": torch.zeros(len(items), longest, dtype=torch.long),
           "attention_mask": torch.zeros(len(items), longest, dtype=torch.long)}
    for i, x in enumerate(items):
        n = len(x["input_ids"])
        out["input_ids"][i, :n] = torch.tensor(x["input_ids"])
        out["attention_mask"][i, :n] = 1
    for key in ("labels", "start_positions", "end_positions"):
        if key in items[0]:
            out[key] = torch.tensor([x[key] for x in items])
    return out


def pair_batch():
    """Three tiny-vocabulary rows of 11 tokens, a pair each (token types 0 then 1), the last padded after 7."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 99, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[2, 7:] = 0
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types)


def examples(kind, n=10, fixed_length=None):
    """``n`` random token sequences over the tiny vocabulary with targets of task ``kind``
    (classification, regression, or otherwise question answering)."""
    g = torch.Generator().manual_seed(0)
    items = []
    for i in range(n):
        length = fixed_length or int(torch.randint(4, 12, (1,), generator=g))
        item = {"input_ids": torch.randint(5, TINY_BERT["vocab_size"], (length,), generator=g).tolist()}
        if kind == "classification":
            item["labels"] = i % 3
        elif kind == "regression":
            item["labels"] = float(i) / 3
        else:
            item["start_positions"], item["end_positions"] = i % length, min(i % length + 1, length - 1)
        items.append(item)
    return Examples(items)


# -- tiny data files -------------------------------------------------------------------------------

POS = ["good", "great", "fun"]
NEG = ["bad", "awful", "boring"]
FILL = ["the", "movie", "film", "plot", "was", "very", "really", "actor"]
MNLI_HEADER = "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tlabel1\tgold_label\n"


def sentence(rng, label):
    words = rng.sample(FILL, 3) + [rng.choice(POS if label else NEG)]
    rng.shuffle(words)
    return " ".join(words)


def write_glue(root, n_train=96, n_dev=24, seed=0):
    """SST-2 and STS-B in GLUE's layout under ``root/glue``; returns ``root``."""
    rng = random.Random(seed)
    sst = root / "glue" / "SST-2"
    sst.mkdir(parents=True)
    for name, n in (("train.tsv", n_train), ("dev.tsv", n_dev)):
        rows = ["sentence\tlabel"]
        for i in range(n):
            label = i % 2
            rows.append(f"{sentence(rng, label)}\t{label}")
        (sst / name).write_text("\n".join(rows) + "\n")
    sts = root / "glue" / "STS-B"
    sts.mkdir(parents=True)
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    for name, n in (("train.tsv", n_train), ("dev.tsv", n_dev)):
        rows = [header]
        for i in range(n):
            score = round(rng.uniform(0, 5), 2)
            rows.append(f"{i}\tmain\tf\t2012\t{i}\ts\ts\t{sentence(rng, 1)}\t{sentence(rng, score > 2.5)}\t{score}")
        (sts / name).write_text("\n".join(rows) + "\n")
    return root


def write_squad(root, n_articles=12):
    """A SQuAD v1.1 dev file under ``root/squad``; returns ``root``."""
    contexts = ["paris is a city in france . it was first named lutetia .",
                "london is a city on a river . the river is the thames ."]
    data = []
    for i in range(n_articles):
        context = contexts[i % 2]
        answer = "france" if i % 2 == 0 else "the thames"
        data.append({"title": f"Article {i}", "paragraphs": [{"context": context, "qas": [
            {"question": "where is it ?", "id": f"q{i}a",
             "answers": [{"text": answer, "answer_start": context.index(answer)}]},
            {"question": "what city ?", "id": f"q{i}b",
             "answers": [{"text": "a city", "answer_start": context.index("a city")}]},
        ]}]})
    (root / "squad").mkdir(parents=True, exist_ok=True)
    (root / "squad" / "dev-v1.1.json").write_text(json.dumps({"version": "1.1", "data": data}))
    return root


def write_corpus(path, lines=60, seed=0):
    """A WikiExtractor-style corpus file of tiny sentences; returns ``path``."""
    rng = random.Random(seed)
    path.write_text("<doc id=1>\nTitle\n" + "\n".join(sentence(rng, i % 2) for i in range(lines)) + "\n</doc>\n")
    return path


# -- a learnable synthetic CoNLL-2003 (the tiny vocabulary's words; one type a word) ------------------------------

ENTITIES = {"LOC": [["paris"], ["london"], ["france"]], "ORG": [["first", "name"]], "PER": [["actor"]]}
FILLERS = "the a is was good bad movie film plot very really fun what who where when how many born year".split()


def synthetic_sentences(n: int, seed: int) -> list[list[tuple[str, str]]]:
    """``n`` sentences of (word, tag): 3 to 6 filler words and one or two entities, drawn with ``seed``."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(n):
        words = [(w, "O") for w in rng.sample(FILLERS, rng.randint(3, 6))]
        for _ in range(rng.randint(1, 2)):
            kind = rng.choice(sorted(ENTITIES))
            entity = rng.choice(ENTITIES[kind])
            at = rng.randint(0, len(words))
            words[at:at] = [(w, ("B-" if i == 0 else "I-") + kind) for i, w in enumerate(entity)]
        sentences.append(words)
    return sentences


def conll_text(sentences) -> str:
    """CoNLL-2003's layout: word POS chunk NER, a blank line between sentences, a -DOCSTART- line first."""
    blocks = ["\n".join(f"{w} NN I-NP {t}" for w, t in s) for s in sentences]
    return "-DOCSTART- -X- -X- O\n\n" + "\n\n".join(blocks) + "\n"


def write_conll_dir(root, n_train=160, n_dev=32, n_test=24):
    """CoNLL-2003's folder layout (ner/conll2003/{train,dev,test}.txt) of synthetic sentences under ``root``."""
    from pathlib import Path

    folder = Path(root) / "ner" / "conll2003"
    folder.mkdir(parents=True)
    for split, n, seed in (("train", n_train, 0), ("dev", n_dev, 1), ("test", n_test, 2)):
        (folder / f"{split}.txt").write_text(conll_text(synthetic_sentences(n, seed)))
    return root


# -- tiny runs -------------------------------------------------------------------------------------

TINY_RUN = {  # dotted overrides that make a run of any method take seconds
    "data.train_limit": None, "data.max_length": 32,
    "teacher.train.epochs": 2.0, "teacher.train.lr": 1e-3, "teacher.train.batch_size": 16,
    "teacher.train.eval_every": None,
    "student.epochs": 2.0, "student.lr": 1e-3, "student.batch_size": 16, "student.eval_every": 3,
    "bench.latency_shape": [1, 16], "bench.throughput_shape": [4, 16],
    "bench.latency_runs": 3, "bench.throughput_runs": 1, "bench.warmup": 1,
    # the free baselines and the student's int8 export are most of a tiny run's time (~2 s of ~2.7 s, and the
    # export a few seconds more): a test that is about them turns them on (LIVE_EXTRAS)
    "baselines": False, "int8": False,
}
LIVE_EXTRAS = {"baselines": True, "int8": True}
NO_EXTRAS = ["--no-baselines", "--no-int8"]  # TINY_RUN's baselines and int8 on a command line


def write_unlabeled_sentences(path, n: int, seed: int = 5) -> str:
    """``n`` synthetic sentences of words without tags, as an unlabeled token file (JSON lines of ``tokens``)."""
    path.write_text("".join(json.dumps({"tokens": [w for w, _ in s]}) + "\n" for s in synthetic_sentences(n, seed)))
    return str(path)


# the dotted overrides of a tiny token-classification run that learns the synthetic CoNLL fixture (its entities take
# the teacher more epochs); every method's test runs with them, so the session fine-tunes one teacher (cached)
NER_RUN = {**TINY_RUN, "data.max_length": 48, "teacher.train.epochs": 8.0, "student.epochs": 4.0,
           "teacher.train.batch_size": 8, "student.batch_size": 8, "student.eval_every": None}


def tiny_ner_settings(path, **more):
    """A settings file (--config) of a tiny token-classification run that learns the synthetic CoNLL fixture."""
    import yaml

    from distillery.config import nested_settings

    path.write_text(yaml.safe_dump(nested_settings({**NER_RUN, **more})))
    return path


def tiny_config(teacher, data_dir, out, task="sst2", method="distill", **more):
    """The run config of ``method`` on the tiny settings; ``more`` adds dotted overrides."""
    from distillery.pipeline import build_run_config

    return build_run_config(method=method, task=task, budget="quick", teacher=str(teacher),
                            data_dir=str(data_dir), out=str(out), overrides={**TINY_RUN, **more})


def _bench_model(params, effective, median, sps):
    return {
        "params": params,
        "effective_params": effective,
        "flops_per_token": 2.0 * effective,
        "latency_ms": {"batch": 1, "seq": 128, "median": median, "p90": median * 1.1, "runs": 30},
        "throughput": {"batch": 256, "seq": 64, "sentences_per_s": sps},
    }


def make_run(path, task="sst2", method="moebert", student_acc=0.835, student_ms=10.0, extra=True, train=True):
    """A synthetic run folder (config.yaml, metrics.json, bench.json, train.json) with made-up numbers."""
    import yaml

    path.mkdir(parents=True, exist_ok=True)
    config = {
        "method": method,
        "budget": "quick",
        "data": {"task": task, "dev_limit": 200},
        "teacher": {"name": "minilm", "finetuned": False},
        "method_options": {"experts": 4},
    }
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    metrics = {
        "task": task,
        "split": "validation",
        "main_metric": "accuracy",
        "teacher": {"accuracy": 0.873, "f1": 0.880},
        "student": {"accuracy": student_acc, "f1": 0.840},
        "retention": student_acc / 0.873,
    }
    models = {"teacher": _bench_model(22_713_216, 11_000_000, 19.0, 120.0),
              "student": _bench_model(11_000_000, 5_500_000, student_ms, 250.0)}
    if extra:
        metrics["others"] = {"int8": {"accuracy": 0.849}}
        models["int8"] = _bench_model(22_713_216, 11_000_000, 6.7, 359.0)
    bench = {
        "hardware": {"cpu": "Test CPU 9000", "cores": 2, "threads": 2, "torch": "2.13.0", "gpu": None},
        "models": models,
        "speedup": {"latency": 19.0 / student_ms, "throughput": 250.0 / 120.0},
    }
    (path / "metrics.json").write_text(json.dumps(metrics))
    (path / "bench.json").write_text(json.dumps(bench))
    if train:
        (path / "train.json").write_text(json.dumps({"teacher_seconds": 600, "student_seconds": 95, "notes": ["smoke run"]}))
    return path


def flop_timed(monkeypatch):
    """AutoTinyBERT's timings of sub-networks made proportional to their FLOPs, for tests of what a run does
    with its timings: the search ships only a candidate measured within the budget, and a tiny model's
    sub-millisecond wall-clock timings on a busy CI machine have put every candidate over it (the timing itself
    is tested in test_autotinybert.py on a stub super-net)."""
    from distillery.autotinybert import latency
    # imported before the patch: a module first imported while it is on (a run importing the method's recipe) would
    # bind the stand-in for good, and a later test's patch of the real function would not reach it
    import distillery.autotinybert.recipe  # noqa: F401

    def measure(supernet, archs, reference_ms=None, **_):
        full = latency.arch_flops(supernet.space.full())
        return [float(reference_ms or 1.0) * latency.arch_flops(a) / full for a in archs]

    patch_everywhere(monkeypatch, latency, "measure", measure)


def size_timed(monkeypatch):
    """Method prune's timings (the shapes with the teacher, :func:`distillery.bench.checked_latency_ms`) made
    proportional to the square root of each model's parameter count outside its embeddings (a tiny model's
    embeddings hold most of its parameters and none of its time), steady: two runs fit one latency model."""
    from distillery.prune import latency
    import distillery.prune.recipe  # noqa: F401  (see flop_timed)

    def timing(models, **_):
        return ({name: 0.01 * (1 + sum(p.numel() for n, p in m.named_parameters() if "embeddings" not in n)) ** 0.5
                 for name, m in models.items()}, {"stable": True, "reasons": []})

    patch_everywhere(monkeypatch, latency, "checked_latency_ms", timing)


def prune_twice(teacher, tmp_path, monkeypatch, **options) -> list:
    """``compress --method prune`` with ``options`` on a tiny SST-2, twice with one seed (timed by
    :func:`size_timed`): the two run folders."""
    from distillery.pipeline import build_run_config, compress

    monkeypatch.setenv("DISTILLERY_CACHE", str(tmp_path / "cache"))
    size_timed(monkeypatch)
    data = write_glue(tmp_path / "data")
    return [compress(build_run_config(method="prune", task="sst2", budget="quick", teacher=str(teacher),
                                      data_dir=str(data), out=str(tmp_path / name),
                                      overrides={**TINY_RUN, "student.epochs": 1.0,
                                                 **{f"method_options.{k}": v for k, v in options.items()}}))
            for name in ("run", "again")]


def patch_everywhere(monkeypatch, module, name: str, value) -> None:
    """Replace ``module.name``, and the same object wherever a loaded distillery module bound it (a module imports
    what it uses at its top, so replacing the source alone would not reach it)."""
    import sys

    original = getattr(module, name)
    monkeypatch.setattr(module, name, value)
    for loaded in list(sys.modules.values()):
        if getattr(loaded, "__name__", "").startswith("distillery") and getattr(loaded, name, None) is original:
            monkeypatch.setattr(loaded, name, value)


# -- the CLI in-process ----------------------------------------------------------------------------


def run_cli(monkeypatch, capsys, *args):
    """Run ``distillery ARGS`` in this process; return (exit code, stdout, stderr), code 0 when it returned."""
    from distillery import cli

    monkeypatch.setattr(sys, "argv", ["distillery", *args])
    try:
        cli.main()
        code = 0
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_ok(monkeypatch, capsys, *args) -> str:
    """Run the CLI and require success; return stdout."""
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code in (0, None), err
    return out


def assert_one_line_error(code, err, fragment):
    assert code not in (0, None)
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if line.strip() and "distillery: error" in line]
    assert len(lines) == 1, err
    assert fragment in lines[0], err


# -- transformers' own common model tests ----------------------------------------------------------

# The source distribution ships tests/test_modeling_common.py and tests/test_configuration_common.py but not
# the three modules they import beside them (they live in transformers' repository only). Stand-ins, written
# next to the fetched files: no student generates, and the export mixin's tests are not in the sdist to run
# (test_cmow.py exports CMOW at an odd length through torch.export itself).
_COMMON_SHIMS = {
    "__init__.py": "",
    "exporters/__init__.py": "",
    "exporters/test_export.py": "class ExportTesterMixin:\n    pass\n",
    "generation/__init__.py": "",
    "generation/test_utils.py": "class GenerationTesterMixin:\n    pass\n",
    "utils/__init__.py": "",
    # PreTrainedConfig's common arguments, each given a value other than its default, as transformers' own
    # tests/utils/test_configuration_utils.py gives them
    "utils/test_configuration_utils.py": (
        "config_common_kwargs = {\n"
        "    'return_dict': False, 'output_hidden_states': True, 'output_attentions': True, 'dtype': 'float16',\n"
        "    'chunk_size_feed_forward': 5, 'architectures': ['BertModel'], 'id2label': {0: 'label'},\n"
        "    'label2id': {'label': '0'}, 'problem_type': 'regression', 'pad_token_id': 3,\n"
        "    'bos_token_id': 4, 'eos_token_id': 5, 'sep_token_id': 6, 'decoder_start_token_id': 7,\n"
        "    'is_encoder_decoder': True, 'tie_word_embeddings': False,\n"
        "}\n"),
}
COMMON_TESTS_PACKAGE = "transformers_common_tests"
COMMON_TEST_FILES = ("test_modeling_common.py", "test_configuration_common.py")


def transformers_common_tests(timeout: float = 300.0):
    """The folder holding the package ``transformers_common_tests`` (test_modeling_common.py and
    test_configuration_common.py of the installed transformers' source distribution), extracted from the
    sdist in ``$DISTILLERY_CACHE/transformers-tests/<version>``, which pip downloads there the first time;
    a file lock keeps parallel test workers from fetching it twice. Raises RuntimeError with the command
    to run by hand when pip cannot fetch it (offline)."""
    import fcntl
    import subprocess
    import tarfile
    import tempfile
    from pathlib import Path

    import transformers

    from distillery.config import cache_root

    version = transformers.__version__
    root = cache_root() / "transformers-tests" / version
    package = root / COMMON_TESTS_PACKAGE
    if all((package / f).is_file() for f in COMMON_TEST_FILES):
        return root
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if all((package / f).is_file() for f in COMMON_TEST_FILES):  # another worker fetched it meanwhile
            return root
        sdist = root / f"transformers-{version}.tar.gz"
        if not sdist.is_file():
            _pip_download_sdist(f"transformers=={version}", root, timeout)
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            staged = Path(tmp) / COMMON_TESTS_PACKAGE
            with tarfile.open(sdist) as tar:
                for name in COMMON_TEST_FILES:
                    member = tar.getmember(f"transformers-{version}/tests/{name}")
                    (staged / name).parent.mkdir(parents=True, exist_ok=True)
                    (staged / name).write_bytes(tar.extractfile(member).read())
            for name, text in _COMMON_SHIMS.items():
                (staged / name).parent.mkdir(parents=True, exist_ok=True)
                (staged / name).write_text(text)
            if package.exists():  # a half-written folder of an interrupted extraction
                import shutil

                shutil.rmtree(package)
            staged.rename(package)
    return root


def _pip_download_sdist(requirement: str, folder, timeout: float) -> None:
    """``pip download`` the source distribution of ``requirement`` into ``folder``; RuntimeError, with the
    command to run where the package index is reachable, when it cannot."""
    import subprocess

    command = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
               "-d", str(folder), requirement]
    by_hand = f"fetch it where the package index is reachable: {' '.join(command)}"
    try:  # one retry, a short timeout: offline, the module is skipped in seconds rather than minutes
        done = subprocess.run(command + ["--retries", "1", "--timeout", "20", "-q"], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"pip did not fetch {requirement}'s source in {timeout:.0f} s; {by_hand}") from None
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"pip could not fetch {requirement}'s source ({last}); {by_hand}")


# -- embedders (issue 55) -----------------------------------------------------------------------------

def write_sentence_transformer(source: str, folder, max_length: int = 64, pooling: str = "mean") -> str:
    """``source`` (an encoder folder) as a sentence-transformers embedder: ``pooling`` (mean), normalised."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    encoder = Transformer(source, max_seq_length=max_length)
    SentenceTransformer(modules=[encoder, Pooling(encoder.get_embedding_dimension(), pooling), Normalize()],
                        device="cpu").save(str(folder), create_model_card=False)
    return str(folder)


def write_embedding_data(root):
    """A data folder with STS-B dev and SQuAD dev, and an unlabeled file of 64 texts: (data folder, texts file)."""
    write_squad(write_glue(root / "data", n_train=8, n_dev=24))
    rng = random.Random(3)
    (root / "texts.csv").write_text("text\n" + "\n".join(sentence(rng, i % 2) for i in range(64)) + "\n")
    return root / "data", str(root / "texts.csv")


def dev_vectors(folder, config):
    """The student's dev vectors as distillery scores them (N, d), and the dev texts."""
    from distillery.data.encode import prepare_task_data
    from distillery.data.loading import task_for
    from distillery.evaluation import predict
    from distillery.modeling import load_tokenizer
    from distillery.runtime import load_model

    task = task_for(config.data)
    data = prepare_task_data(task, load_tokenizer(str(folder)), config.data, splits=("dev",))
    return predict(load_model(folder), data), list(data.dev_examples["text"])


def card_snippet(folder) -> str | None:
    """The Python of the usage snippet of ``folder``'s model card (README.md), loading ``folder`` itself (its
    placeholder repository replaced by the folder's path); None where the folder has no card."""
    import re
    from pathlib import Path

    from distillery.card import PLACEHOLDER_REPO

    card = Path(folder) / "README.md"
    if not card.is_file():
        return None
    snippet = re.search(r"```python\n(.*?)```", card.read_text(), re.DOTALL).group(1)
    assert repr(PLACEHOLDER_REPO) in snippet, snippet
    return snippet.replace(repr(PLACEHOLDER_REPO), repr(str(folder)))


def assert_sentence_transformers_gives_what_was_scored(folder, config, metrics, tmp_path, first_module=None,
                                                       register_models=False):
    """``SentenceTransformer(folder)`` in a fresh process with no distillery import (``register_models``: after
    ``distillery.register_models()`` only, a distillery student type) gives the dev vectors distillery scores (and,
    given, loads ``first_module`` first), and the recorded STS-B Spearman is that of those vectors. Where the
    folder has a model card, the model is loaded by the card's own usage snippet, run as it is written."""
    import subprocess

    import numpy as np
    import pytest

    from distillery.data.encode import prepare_task_data
    from distillery.data.loading import task_for
    from distillery.kinds import kind_of
    from distillery.modeling import load_tokenizer

    ours, texts = dev_vectors(folder, config)
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    check = f"assert type(model[0]).__name__ == {first_module!r}, type(model[0])\n" if first_module else ""
    load = card_snippet(folder)
    if load is None:
        load = (("import distillery\ndistillery.register_models()\n" if register_models else "") +
                "from sentence_transformers import SentenceTransformer\n"
                f"model = SentenceTransformer({str(folder)!r}, device='cpu')\n")
    else:  # the card's snippet registers distillery's model types exactly where the student needs them
        assert ("distillery.register_models()" in load) == register_models, load
        assert "SentenceTransformer(" in load and "model.encode(" in load, load
    script = ("import json, sys, numpy as np\n" + load + check +
              f"texts = json.load(open({str(tmp_path / 'texts.json')!r}))\n"
              f"np.save({str(tmp_path / 'st.npy')!r}, model.encode(texts, batch_size=7))\n"
              + ("" if register_models else "assert 'distillery' not in sys.modules\n"))
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)
    theirs = np.load(tmp_path / "st.npy")
    torch.testing.assert_close(torch.from_numpy(theirs), torch.from_numpy(ours), atol=1e-5, rtol=1e-4)
    data = prepare_task_data(task_for(config.data), load_tokenizer(str(folder)), config.data, splits=("dev",))
    assert kind_of("embedding").scores(data, theirs)["sts_spearman"] == pytest.approx(
        metrics["student"]["sts_spearman"], abs=1e-4)


def random_masks(model, seed=0, prune_hidden=True):
    """Method prune's masks of ``model``'s sizes with random log α (spread enough that some gates close)."""
    from distillery.prune.masks import Masks

    c = model.config
    masks = Masks(c.num_hidden_layers, c.num_attention_heads, c.intermediate_size, c.hidden_size, prune_hidden=prune_hidden)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in masks.names():
            p = getattr(masks, name)
            p.copy_(torch.randn(p.shape, generator=g) * 4.0 / 200.0)
    return masks
