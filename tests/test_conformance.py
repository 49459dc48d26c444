"""transformers' own common model tests (``ModelTesterMixin``, ``ConfigTester``) on distillery's students.

Every model transformers ships passes these; a student that loads through ``AutoModel`` is held to the
same. The two test files come from the installed transformers' source distribution, fetched once into
``$DISTILLERY_CACHE/transformers-tests/<version>`` (tests/helpers.py's ``transformers_common_tests``),
never copied here. The testers follow transformers' ``BertModelTester`` (batch 13, length 7) with the
tiny sizes of tests/test_students.py, and cover each head distillery saves: the base model, sequence
classification (classification and regression: CMOW's regression student bins its scores, a config of
its own), question answering and CMOW's sentence embedder.

A test that cannot apply to a student type is declared the way transformers' own testers declare it,
by overriding it with ``self.skipTest(reason)``.
"""

from __future__ import annotations

import importlib
import sys
import unittest
import unittest.mock

import pytest

from tests.helpers import COMMON_TESTS_PACKAGE, transformers_common_tests

pytest.importorskip("parameterized", reason="transformers' common tests need parameterized: pip install -e '.[dev]'")
try:
    _ROOT = transformers_common_tests()
except RuntimeError as e:  # offline
    pytest.skip(str(e), allow_module_level=True)
sys.path.insert(0, str(_ROOT))
_common = importlib.import_module(f"{COMMON_TESTS_PACKAGE}.test_modeling_common")
_config_common = importlib.import_module(f"{COMMON_TESTS_PACKAGE}.test_configuration_common")
ModelTesterMixin, ids_tensor, random_attention_mask = (_common.ModelTesterMixin, _common.ids_tensor,
                                                       _common.random_attention_mask)
ConfigTester = _config_common.ConfigTester

from transformers import BertConfig  # noqa: E402
from transformers.utils import logging as transformers_logging  # noqa: E402
from transformers.models.auto.modeling_auto import (  # noqa: E402
    MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES,
    MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
    MODEL_MAPPING_NAMES,
)

from distillery.autotinybert.modeling_autotinybert import (  # noqa: E402
    AutoTinyBertConfig,
    AutoTinyBertForQuestionAnswering,
    AutoTinyBertForSequenceClassification,
    AutoTinyBertForTokenClassification,
    AutoTinyBertModel,
)
from distillery.prune.modeling_prune import (  # noqa: E402
    PrunedBertConfig,
    PrunedBertForQuestionAnswering,
    PrunedBertForSequenceClassification,
    PrunedBertForTokenClassification,
    PrunedBertModel,
)
from distillery.cmow.modeling_cmow import (  # noqa: E402
    CMOWConfig,
    CMOWForSequenceClassification,
    CMOWForTokenClassification,
    CMOWModel,
)
from distillery.cmow.modeling_embedder import CMOWEmbedderConfig, CMOWForSentenceEmbedding  # noqa: E402
from distillery.moebert.modeling_moebert import (  # noqa: E402
    MoEBertConfig,
    MoEBertForQuestionAnswering,
    MoEBertForSequenceClassification,
    MoEBertForTokenClassification,
    MoEBertModel,
)

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=512,
            type_vocab_size=16, initializer_range=0.02)


class StudentTester:
    """transformers' BertModelTester (its sizes, its inputs), for any student config (``make_config()``)."""

    def __init__(self, parent, make_config, batch_size=13, seq_length=7):
        self.parent, self.make_config = parent, make_config
        self.batch_size, self.seq_length, self.is_training = batch_size, seq_length, True
        for name, value in TINY.items():
            setattr(self, name, value)
        self.type_sequence_label_size, self.num_labels, self.num_choices = 2, 3, 4

    def get_config(self):
        return self.make_config()

    def prepare_config_and_inputs_for_common(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        inputs = {"input_ids": input_ids,
                  "attention_mask": random_attention_mask([self.batch_size, self.seq_length]),
                  "token_type_ids": ids_tensor([self.batch_size, self.seq_length], 2)}
        return self.get_config(), inputs


def moebert_config(**kw):
    encoder = BertConfig(**{**TINY, **kw})
    return MoEBertConfig(encoder_config=encoder, num_experts=4, expert_size=9, shared_size=3)


def autotinybert_config(**kw):
    return AutoTinyBertConfig(**{**TINY, "qkv_size": 16, **kw})


def prunedbert_config(**kw):
    """Per-layer shapes: the second layer's FFN narrower (every layer keeps its heads: the common tests read one head
    count for every layer's attention weights)."""
    return PrunedBertConfig(**{**TINY, "qkv_size": 16, "layer_intermediate_sizes": [37, 20], **kw})


def cmow_config(**kw):
    return CMOWConfig(**{"vocab_size": TINY["vocab_size"], "matrix_dim": 4, "vector_dim": 16, "head_hidden": 8,
                         "lstm_hidden": 8, "sep_token_id": 3, "init_std": 0.1, "num_labels": 3, **kw})


def cmow_embedder_config(**kw):
    return CMOWEmbedderConfig(**{"vocab_size": TINY["vocab_size"], "matrix_dim": 4, "vector_dim": 16, "head_hidden": 8,
                                 "lstm_hidden": 8, "sep_token_id": 3, "init_std": 0.1, "output_dim": 12, **kw})


def cmow_regression_config(**kw):
    return cmow_config(**{"num_labels": 1, "score_bins": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], **kw})


# (class name suffix, the table of model type -> class name of that head; the CMOW embedder is AutoModel's class of
# its model type, with no labels to train on, as a base model)
HEAD_TABLES = (("Model", MODEL_MAPPING_NAMES), ("ForSequenceClassification", MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES),
               ("ForQuestionAnswering", MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES),
               ("ForTokenClassification", MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES),
               ("ForSentenceEmbedding", MODEL_MAPPING_NAMES))


def not_applicable(reason):
    """A test overridden to skip, with the reason it cannot apply to the student type."""
    def skip(self, *args, **kwargs):
        self.skipTest(reason)
    return skip


NO_ATTENTION = "CMOW has no attention: a sentence is a product of per-token matrices"
NO_LAYERS = "CMOW has no layers (no per-layer hidden states, nothing to checkpoint or chunk)"
NO_STATES_ON_PATH = ("CMOW's per-token states are prefix products computed beside the sentence product, not on "
                     "the way to the output: no gradient reaches them")
BINNED = ("a score_bins student is a regression head whose outputs are its bins, not num_labels: re-heading it by "
          "num_labels or a classification problem_type is CMOWConformanceTest's classifier")
HASH_NEEDS_IDS = "MoEBERT's hash routing assigns experts by token id, so it needs input_ids, not inputs_embeds"


class _Common(ModelTesterMixin):
    """What the three testers share: the tester and config tester built from ``make_config``."""

    make_config = None
    # transformers checks _init_weights against every missing weight only for its models of 2023 on (by the
    # copyright year of the config's file, which distillery's files do not carry): the students are checked
    test_can_init_all_missing_weights_before_2023 = True
    config_kwargs: dict = {}
    common_properties = None

    def setUp(self):
        self.model_tester = StudentTester(self, type(self).make_config)
        self.config_tester = ConfigTester(self, config_class=type(self.model_tester.get_config()),
                                          common_properties=self.common_properties, **self.config_kwargs)

    @classmethod
    def setUpClass(cls):
        """The student types in transformers' tables of model types and heads, as a native model is: the
        common tests read them to give each head its labels and to leave base models out of training."""
        model_type = cls.make_config().model_type
        cls._tables = [unittest.mock.patch.dict(table, {model_type: model_class.__name__})
                       for model_class in cls.all_model_classes for suffix, table in HEAD_TABLES
                       if model_class.__name__.endswith(suffix) and "For" not in model_class.__name__.removesuffix(suffix)]
        for patch in cls._tables:
            patch.start()
        # transformers' warnings at their default level: the mismatched-shape tests read them, and a command run in
        # this process before (the CLI's setup_logging) leaves transformers at errors only
        cls._verbosity = transformers_logging.get_verbosity()
        transformers_logging.set_verbosity_warning()

    @classmethod
    def tearDownClass(cls):
        transformers_logging.set_verbosity(cls._verbosity)
        for patch in cls._tables:
            patch.stop()

    def test_config(self):
        self.config_tester.run_common_tests()


class MoEBertConformanceTest(_Common, unittest.TestCase):
    all_model_classes = (MoEBertModel, MoEBertForSequenceClassification, MoEBertForQuestionAnswering,
                         MoEBertForTokenClassification)
    make_config = staticmethod(moebert_config)
    config_kwargs = {"num_experts": 4, "expert_size": 9, "shared_size": 3}
    common_properties = ["hidden_size", "num_attention_heads", "num_hidden_layers"]

    test_inputs_embeds = not_applicable(HASH_NEEDS_IDS)
    test_inputs_embeds_matches_input_ids = not_applicable(HASH_NEEDS_IDS)


class AutoTinyBertConformanceTest(_Common, unittest.TestCase):
    all_model_classes = (AutoTinyBertModel, AutoTinyBertForSequenceClassification, AutoTinyBertForQuestionAnswering,
                         AutoTinyBertForTokenClassification)
    make_config = staticmethod(autotinybert_config)
    config_kwargs = {"vocab_size": 99, "hidden_size": 32, "num_attention_heads": 4, "qkv_size": 16}


class PrunedBertConformanceTest(_Common, unittest.TestCase):
    all_model_classes = (PrunedBertModel, PrunedBertForSequenceClassification, PrunedBertForQuestionAnswering,
                         PrunedBertForTokenClassification)
    make_config = staticmethod(prunedbert_config)
    config_kwargs = {"vocab_size": 99, "hidden_size": 32, "num_attention_heads": 4, "qkv_size": 16,
                     "num_hidden_layers": 2, "layer_intermediate_sizes": [37, 20]}


class CMOWConformanceTest(_Common, unittest.TestCase):
    all_model_classes = (CMOWModel, CMOWForSequenceClassification)
    make_config = staticmethod(cmow_config)
    config_kwargs = {"vocab_size": 99, "matrix_dim": 4, "vector_dim": 16, "sep_token_id": 3}
    common_properties = []
    has_attentions = False

    test_attention_outputs = not_applicable(NO_ATTENTION)
    test_hidden_states_output = not_applicable(NO_LAYERS)
    test_retain_grad_hidden_states_attentions = not_applicable(NO_STATES_ON_PATH)


class CMOWRegressionConformanceTest(CMOWConformanceTest):
    """The STS-B student: regression as classification over ``score_bins``."""

    all_model_classes = (CMOWForSequenceClassification,)
    make_config = staticmethod(cmow_regression_config)

    test_problem_types = not_applicable(BINNED)
    test_load_with_mismatched_shapes = not_applicable(BINNED)
    test_can_load_ignoring_mismatched_shapes = not_applicable(BINNED)


class CMOWTaggerConformanceTest(CMOWConformanceTest):
    """The token-classification student: a tag head on each position's per-token state."""

    all_model_classes = (CMOWForTokenClassification,)
    make_config = staticmethod(lambda **kw: cmow_config(**{"head": "linear", **kw}))
    # its per-token states are on the way to the tags: transformers' own test of their gradients applies
    test_retain_grad_hidden_states_attentions = ModelTesterMixin.test_retain_grad_hidden_states_attentions


class CMOWEmbedderConformanceTest(CMOWConformanceTest):
    """The sentence embedder (--task embedding): the sentence head onto ``output_dim``, giving ``sentence_embedding``
    (AutoModel's class of its model type, as a base model is)."""

    all_model_classes = (CMOWForSentenceEmbedding,)
    make_config = staticmethod(cmow_embedder_config)
