"""A teacher of any encoder family as a full-size AutoTinyBERT model: the super-net's starting point.

Everything about where a family keeps its weights is read through :mod:`distillery.encoders`; what the
AutoTinyBERT layer must do differently (positions, relative attention, norm placement, GLU, head) is
recorded in its config (:class:`~distillery.autotinybert.modeling_autotinybert.AutoTinyBertConfig`).
A fused [q; k; v] projection is split into three, a GLU's input rows over gate rows into
``intermediate.dense`` and ``intermediate.gate``; ALBERT's one shared layer is untied into
``num_hidden_layers`` copies (the sub-networks then choose and slice each repeat on its own, as the
search space assumes of every layer); MPNet's bias table, shared by all layers, is copied into each layer
(so that each layer's heads can be reordered, and sliced, with their own columns).

:func:`check_family` refuses, in one sentence, a configuration the student cannot express.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from distillery.autotinybert.modeling_autotinybert import AutoTinyBertConfig, AutoTinyBertModel
from distillery.encoders import (
    EncoderLayout,
    encoder_layers,
    ffn_linears,
    layout_of,
    optional_submodule,
    submodule,
)
from distillery.errors import DistilleryError
from distillery.kinds import TaskKind, kind_for_head
from distillery.modeling import QUESTION_ANSWERING_HEAD, SEQUENCE_HEAD, TOKEN_HEAD, head_of_class


def check_family(config) -> EncoderLayout:
    """The teacher's layout; a sentence naming what the AutoTinyBERT student lacks for it, if anything."""
    layout = layout_of(config)
    name = f"autotinybert cannot cut a super-net from this {layout.family} teacher"
    if layout.student:
        raise DistilleryError(f"{name}: a distillery student's attention and positions are its own, not a family's; "
                              f"give autotinybert the student's original teacher, or use moebert, distill or cmow on it.")
    if layout.family == "deberta-v2" and getattr(config, "conv_kernel_size", 0) > 0:
        raise DistilleryError(f"{name}: its first layer adds a convolution (conv_kernel_size "
                              f"{config.conv_kernel_size}) that the student's layer does not have.")
    if layout.family == "deberta-v2" and (getattr(config, "embedding_size", None) or config.hidden_size) != config.hidden_size:
        raise DistilleryError(f"{name}: it projects its embeddings before their LayerNorm, the student after it.")
    if layout.shared_layers and (config.num_hidden_groups != 1 or config.inner_group_num != 1):
        raise DistilleryError(f"{name}: it has {config.num_hidden_groups} layer groups of {config.inner_group_num} "
                              f"layers; the super-net unties one shared layer only.")
    return layout


def layer_qk(layout: EncoderLayout, layer: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    """A teacher layer's queries and keys (B, T, d_qkv) of its input ``x`` (after its attention norm, pre-norm)."""
    if layout.pre_norm:
        x = submodule(layer, layout.attention_norm)(x)
    if layout.qkv:
        q, k, _ = submodule(layer, layout.qkv)(x).chunk(3, dim=-1)
        return q, k
    return submodule(layer, layout.query)(x), submodule(layer, layout.key)(x)


def _from_task(teacher: nn.Module, path: str | None) -> nn.Module | None:
    """A head module at a task-model path (``bert.pooler.dense``), also from a bare base model."""
    prefix = f"{getattr(teacher, 'base_model_prefix', '')}."
    if path and teacher.base_model is teacher and path.startswith(prefix):
        path = path[len(prefix):]
    return optional_submodule(teacher, path)


def _dropout(config, *keys: str) -> float:
    return float(next((getattr(config, k) for k in keys if getattr(config, k, None) is not None), 0.1))


def _activation(config, name: str) -> str:
    return getattr(config, name.split(":", 1)[1]) if name.startswith("config:") else name


def student_config(teacher: PreTrainedModel, layout: EncoderLayout, kind: TaskKind | None) -> AutoTinyBertConfig:
    """The AutoTinyBertConfig of ``teacher`` at full size, whose head is of task kind ``kind`` (None: no head)."""
    c, base = teacher.config, teacher.base_model
    layer = encoder_layers(teacher)[0]
    word = submodule(base, layout.word_embeddings)
    positions = optional_submodule(base, layout.position_embeddings)
    types = optional_submodule(base, layout.token_type_embeddings)
    pooler, norm = _from_task(teacher, layout.pooler_dense), submodule(layer, layout.ffn_norm)
    q = submodule(layer, layout.qkv if layout.qkv else layout.query)
    kw = dict(vocab_size=word.num_embeddings, hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
              num_attention_heads=c.num_attention_heads, intermediate_size=ffn_linears(layout, layer)[1].in_features,
              qkv_size=q.out_features // (3 if layout.qkv else 1), hidden_act=getattr(c, layout.activation_key),
              max_position_embeddings=positions.num_embeddings if positions is not None else c.max_position_embeddings,
              type_vocab_size=types.num_embeddings if types is not None else 0, layer_norm_eps=norm.eps,
              pad_token_id=c.pad_token_id, family=layout.family, id2label=dict(c.id2label),
              label2id=dict(c.label2id) if getattr(c, "label2id", None) else None,
              hidden_dropout_prob=_dropout(c, "hidden_dropout_prob", "dropout", "mlp_dropout"),
              attention_probs_dropout_prob=_dropout(c, "attention_probs_dropout_prob", "attention_dropout"),
              embedding_size=word.embedding_dim if optional_submodule(base, layout.embedding_projection) else None,
              position_kind=("none" if positions is None else "after-padding" if layout.offset_positions else "absolute"),
              position_padding_idx=getattr(submodule(base, layout.word_embeddings.rpartition(".")[0]), "padding_idx", None),
              pre_norm=layout.pre_norm, first_attention_norm=not isinstance(submodule(layer, layout.attention_norm), nn.Identity),
              final_norm=layout.final_norm is not None, glu=layout.glu, linear_bias=q.bias is not None,
              norm_bias=norm.bias is not None, pooling=getattr(c, layout.pooling_key) if layout.pooling_key else "cls",
              pooler_activation=_activation(c, layout.pooler_activation), pooler_norm=layout.pooler_norm is not None,
              pooler_bias=pooler is None or pooler.bias is not None,
              token_head=reads_every_token(kind) and layout.qa_token_head, **_relative(c, layout))
    return AutoTinyBertConfig(**kw)


def _relative(c, layout: EncoderLayout) -> dict:
    """The config fields of the family's relative positions."""
    if layout.relative_bias:
        return dict(relative_attention="bias", relative_buckets=c.relative_attention_num_buckets)
    if layout.positions == "disentangled" and getattr(c, "relative_attention", False):
        max_rel = c.max_relative_positions if c.max_relative_positions >= 1 else c.max_position_embeddings
        norm_rel = "layer_norm" in [x.strip() for x in (getattr(c, "norm_rel_ebd", None) or "none").lower().split("|")]
        return dict(relative_attention="disentangled", relative_buckets=getattr(c, "position_buckets", -1) or -1,
                    max_relative_positions=max_rel, pos_att_type=list(c.pos_att_type or []),
                    share_att_key=bool(getattr(c, "share_att_key", False)), norm_rel_embeddings=norm_rel)
    if layout.positions == "rotary":
        thetas = {kind: p["rope_theta"] for kind, p in c.rope_parameters.items()}
        return dict(relative_attention="rotary", rotary_head_size=c.hidden_size // c.num_attention_heads,
                    rope_theta=thetas["full_attention"], local_rope_theta=thetas.get("sliding_attention", thetas["full_attention"]),
                    layer_windows=[c.local_attention // 2 if t == "sliding_attention" else 0 for t in c.layer_types])
    return {}


@torch.no_grad()
def copy_linear(dst: nn.Linear | None, src: nn.Linear | None, rows=slice(None)) -> None:
    """``dst`` ← ``src``'s ``rows`` (weights and bias)."""
    if dst is None or src is None:
        return
    dst.weight.copy_(src.weight[rows])
    if dst.bias is not None:
        dst.bias.copy_(src.bias[rows])


def _copy(dst: nn.Module | None, src: nn.Module | None) -> None:
    if dst is not None and src is not None:
        dst.load_state_dict(src.state_dict())


def _load_layer(dst, src, layout: EncoderLayout, shared_bias: nn.Embedding | None) -> None:
    s = dst.attention.self
    if layout.qkv:
        fused, width = submodule(src, layout.qkv), s.query.out_features
        for i, lin in enumerate((s.query, s.key, s.value)):
            copy_linear(lin, fused, slice(i * width, (i + 1) * width))
    else:
        for lin, path in ((s.query, layout.query), (s.key, layout.key), (s.value, layout.value)):
            copy_linear(lin, submodule(src, path))
    copy_linear(dst.attention.output.dense, submodule(src, layout.attention_out))
    _copy(dst.attention.output.LayerNorm, submodule(src, layout.attention_norm))
    w_in, w_out = ffn_linears(layout, src)
    inner = dst.intermediate.dense.out_features
    copy_linear(dst.intermediate.dense, w_in, slice(0, inner))
    if layout.glu:
        copy_linear(dst.intermediate.gate, w_in, slice(inner, 2 * inner))
    copy_linear(dst.output.dense, w_out)
    _copy(dst.output.LayerNorm, submodule(src, layout.ffn_norm))
    if shared_bias is not None:
        _copy(s.relative_bias, shared_bias)
    for name, path in (("pos_key", layout.position_key), ("pos_query", layout.position_query)):
        copy_linear(getattr(s, name, None), optional_submodule(src, path))


def reads_every_token(kind: TaskKind | None) -> bool:
    """Whether a head of task kind ``kind`` reads every token's state (QA, token classification), not one pooled."""
    return kind is not None and not kind.pooled_output


def task_head(teacher: PreTrainedModel, layout: EncoderLayout) -> tuple[nn.Linear | None, TaskKind | None]:
    """The teacher's last linear layer and the task kind it predicts for (None, None for an encoder without a
    head), by the Hugging Face task class the teacher is and its outputs (one: a regressor)."""
    head = head_of_class(type(teacher).__name__)
    path = {SEQUENCE_HEAD: layout.classifier, QUESTION_ANSWERING_HEAD: layout.qa_outputs,
            TOKEN_HEAD: layout.token_classifier}.get(head)
    linear = _from_task(teacher, path)
    if linear is None:
        return None, None
    return linear, kind_for_head(head, linear.out_features)


def convert_teacher(teacher: PreTrainedModel) -> tuple[AutoTinyBertModel, nn.Linear | None, TaskKind | None]:
    """(the full-size AutoTinyBertModel, the task's last linear layer, the task kind of its head or None)
    computing what ``teacher`` computes."""
    layout = check_family(teacher.config)
    head, kind = task_head(teacher, layout)
    base = teacher.base_model
    pooler = _from_task(teacher, layout.pooler_dense)
    config = student_config(teacher, layout, kind)
    # a per-token head keeps the pooler only as the prediction head it runs on every token (ModernBERT); a bare
    # encoder only where its base model has one (BERT's; RoBERTa's and MPNet's is their classification head's)
    config.pooler = pooler is not None and (not reads_every_token(kind) or config.token_head)
    model = AutoTinyBertModel(config)
    with torch.no_grad():
        emb = model.embeddings
        for dst, path in ((emb.word_embeddings, layout.word_embeddings), (emb.position_embeddings, layout.position_embeddings),
                          (emb.token_type_embeddings, layout.token_type_embeddings), (emb.LayerNorm, layout.embedding_norm),
                          (emb.projection, layout.embedding_projection), (model.final_norm, layout.final_norm)):
            _copy(dst, optional_submodule(base, path))
        if config.relative_attention == "disentangled":
            _copy(model.encoder.rel_embeddings, submodule(base, layout.relative_embeddings))
            _copy(model.encoder.rel_norm, optional_submodule(base, layout.relative_norm) if config.norm_rel_embeddings else None)
        layers, shared_bias = encoder_layers(teacher), optional_submodule(base, layout.relative_bias)
        for i, dst in enumerate(model.encoder.layer):
            _load_layer(dst, layers[0 if layout.shared_layers else i], layout, shared_bias)  # ALBERT: untied copies
        if model.pooler is not None:
            copy_linear(model.pooler.dense, pooler)
            _copy(model.pooler.norm, _from_task(teacher, layout.pooler_norm))
    if head is not None:
        source, head = head, nn.Linear(head.in_features, head.out_features)
        copy_linear(head, source)
    return model.eval(), head, kind
