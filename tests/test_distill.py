import pytest
import torch
from transformers import AutoModelForSequenceClassification

from distillery.distill.recipe import build_student, select_layers
from distillery.modeling import find_encoder_layers
from distillery.errors import DistilleryError


def test_select_layers_every_other_by_default():
    assert select_layers(6, None) == [0, 2, 4]
    assert select_layers(4, None) == [0, 2]
    assert select_layers(6, 3) == [0, 2, 4]
    assert select_layers(6, 2) == [2, 5] and select_layers(6, 1) == [5] and select_layers(12, 4) == [2, 5, 8, 11]
    assert select_layers(12, 6) == [0, 2, 4, 6, 8, 10]  # half the layers or more: spread from the bottom
    assert select_layers(6, 6) == list(range(6))
    assert select_layers(6, [1, 5]) == [1, 5]


@pytest.mark.parametrize("bad", [7, 0, [5, 1], [0, 6], []])
def test_select_layers_rejects_impossible(bad):
    with pytest.raises(DistilleryError):
        select_layers(6, bad)


def test_too_many_student_layers_names_the_teacher_depth():
    with pytest.raises(DistilleryError, match="teacher has 6 layers"):
        select_layers(6, 8)


@pytest.mark.parametrize("fixture", ["tiny_bert4", "tiny_roberta"])
def test_student_with_every_layer_equals_teacher(fixture, request):
    path = request.getfixturevalue(fixture)
    teacher = AutoModelForSequenceClassification.from_pretrained(path, num_labels=3).eval()
    n = teacher.config.num_hidden_layers
    student = build_student(teacher, list(range(n))).eval()
    ids = torch.randint(5, 60, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    torch.testing.assert_close(student(input_ids=ids, attention_mask=mask).logits,
                               teacher(input_ids=ids, attention_mask=mask).logits)


def test_student_layers_are_copies_of_the_chosen_teacher_layers(tiny_bert4):
    teacher = AutoModelForSequenceClassification.from_pretrained(tiny_bert4, num_labels=2)
    student = build_student(teacher, [1, 3])
    assert student.config.num_hidden_layers == 2
    _, t_layers = find_encoder_layers(teacher)
    _, s_layers = find_encoder_layers(student)
    for s, t in ((0, 1), (1, 3)):
        for (name, p_s), (_, p_t) in zip(s_layers[s].named_parameters(), t_layers[t].named_parameters()):
            torch.testing.assert_close(p_s, p_t, msg=name)
    torch.testing.assert_close(student.classifier.weight, teacher.classifier.weight)
    # a copy, not a view: training the student must not move the teacher
    with torch.no_grad():
        s_layers[0].output.dense.weight.add_(1.0)
    assert not torch.equal(s_layers[0].output.dense.weight, t_layers[1].output.dense.weight)
