"""Tiny random encoders of every family distillery knows (``distillery.encoders.FAMILIES``), each saved
with its family's tokenizer kind: WordPiece (BERT-style) or a byte-level BPE trained here with
``tokenizers`` (RoBERTa-style: roberta, xlm-roberta, modernbert). Sizes: tests/helpers.py's tiny config with
4 layers and an FFN of 48, so that every method runs on them in seconds. Also the
contract's cell (``compress``): each method's smallest sensible student on such a teacher."""

from __future__ import annotations

import os

import torch

import distillery
from tests.helpers import TINY_BERT, WORDS, bert_vocab

# family -> (model_type, tokenizer kind, config fields beyond the shared ones)
FAMILY_CONFIGS = {
    "bert": ("bert", "wordpiece", {}),
    "roberta": ("roberta", "bpe", {"max_position_embeddings": 520, "type_vocab_size": 1}),
    "xlm-roberta": ("xlm-roberta", "bpe", {"max_position_embeddings": 520, "type_vocab_size": 1}),
    "electra": ("electra", "wordpiece", {"embedding_size": 16}),
    "distilbert": ("distilbert", "wordpiece", {}),
    "albert": ("albert", "wordpiece", {"embedding_size": 16}),
    "deberta-v2": ("deberta-v2", "wordpiece", {"relative_attention": True, "position_buckets": 16,
                                               "pos_att_type": ["p2c", "c2p"], "position_biased_input": False,
                                               "type_vocab_size": 0}),
    "mpnet": ("mpnet", "wordpiece", {}),
    "modernbert": ("modernbert", "bpe", {"global_attn_every_n_layers": 2, "local_attention": 8,
                                         "max_position_embeddings": 512}),
}
FAMILY_NAMES = tuple(FAMILY_CONFIGS)
# Families whose tokenizer gives no token_type_ids (their embeddings have no token types).
NO_TOKEN_TYPES = {"roberta", "xlm-roberta", "distilbert", "mpnet", "modernbert"}


def _wordpiece(no_token_types: bool):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(bert_vocab())}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tok.decoder = decoders.WordPiece()
    names = ["input_ids", "attention_mask"] + ([] if no_token_types else ["token_type_ids"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=512,
                                   model_input_names=names)


def _byte_bpe():
    """A byte-level BPE trained on the test vocabulary's words (a few hundred merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" ".join(WORDS)] * 20, trainer)
    ids = tok.get_vocab()
    tok.post_processor = processors.RobertaProcessing(("</s>", ids["</s>"]), ("<s>", ids["<s>"]), add_prefix_space=True)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", cls_token="<s>", sep_token="</s>", mask_token="<mask>",
                                   model_max_length=512, model_input_names=["input_ids", "attention_mask"])


def family_config(family: str, vocab_size: int, tokenizer, num_layers: int = 4):
    from transformers import AutoConfig

    model_type, _, extra = FAMILY_CONFIGS[family]
    shared = dict(TINY_BERT, vocab_size=vocab_size, num_hidden_layers=num_layers, intermediate_size=48,
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                  max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id)
    if family == "distilbert":
        shared = dict(vocab_size=vocab_size, dim=TINY_BERT["hidden_size"], n_layers=num_layers,
                      n_heads=TINY_BERT["num_attention_heads"], hidden_dim=48, dropout=0.0,
                      attention_dropout=0.0, max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id)
    if family == "modernbert":
        shared.update(bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
                      cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id)
    if family in ("roberta", "xlm-roberta"):
        shared.update(bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)
    return AutoConfig.for_model(model_type, **{**shared, **extra})


def make_tiny_family(family: str, path, num_layers: int = 4, seed: int = 0) -> str:
    """Save a tiny random encoder of ``family`` (no task head) and its tokenizer in ``path``."""
    from transformers import AutoModel

    path = str(path)
    os.makedirs(path, exist_ok=True)
    tokenizer = _byte_bpe() if FAMILY_CONFIGS[family][1] == "bpe" else _wordpiece(family in NO_TOKEN_TYPES)
    tokenizer.save_pretrained(path)
    torch.manual_seed(seed)
    AutoModel.from_config(family_config(family, len(tokenizer), tokenizer, num_layers)).save_pretrained(path)
    return path


# -- one cell of the contract: a method on a family, end to end --------------------------------------

# Small enough that a cell takes seconds: the teacher's fine-tuning is cached per family across methods.
CELL = {
    "data.train_limit": 32, "data.max_length": 24,
    "teacher.train.epochs": 1.0, "teacher.train.lr": 1e-3, "teacher.train.batch_size": 16,
    "teacher.train.eval_every": None,
    "student.epochs": 1.0, "student.lr": 1e-3, "student.batch_size": 16, "student.eval_every": None,
    "bench.latency_shape": [1, 8], "bench.throughput_shape": [2, 8],
    "bench.latency_runs": 1, "bench.throughput_runs": 1, "bench.warmup": 0,
    "baselines": False, "int8": False,  # as TINY_RUN: the cell's own ONNX export is checked by the test
}
METHOD_OPTIONS = {  # each method's smallest sensible student
    "distill": {},
    # one direction: the CMOW graph is the same class for every family (what differs is the vocabulary, the
    # padding and separator ids and the tokenizer's inputs), and its bidirectional ONNX trace costs 1.5 s more
    "cmow": {"method_options.matrix_dim": 4, "method_options.vector_dim": 16, "method_options.bidirectional": False,
             "method_options.train_examples": "budget"},
    "moebert": {"method_options.experts": 2, "method_options.shared": 4, "method_options.importance_examples": 16},
    # a given architecture (2 of 4 layers, half the FFN, every head at half its dimensions) skips the latency
    # predictor and the search, which see a family only through extract() and Arch; the shortest one-shot phase
    "autotinybert": {"method_options.arch": "2,32,24,4,16", "method_options.supernet_steps": 2,
                     "method_options.latency_runs": 1},
}


# A contract cell's teacher has 2 layers: each cell's cost is mostly its ONNX trace, which grows with the layers.
# The distill student keeps teacher layer 1 (renumbered 0, as a deeper pick would be), AutoTinyBERT's 1 layer.
CELL_TEACHER_LAYERS = 2
CELL_STUDENT = {"distill": {"method_options.student_layers": [1]}, "moebert": {}, "cmow": {},
                "autotinybert": {"method_options.arch": "1,32,24,4,16"}}


def compress(method: str, teacher, glue, out, finetuned: bool = False, **more):
    """``distillery.compress`` of one contract cell: ``method`` on ``teacher`` over SST-2 in ``glue``."""
    overrides = {**CELL, **METHOD_OPTIONS[method], **more}
    if finetuned:
        overrides["teacher.finetuned"] = True
    return distillery.compress(method=method, task="sst2", teacher=str(teacher), data_dir=str(glue), out=str(out),
                               overrides=overrides)
