"""Method ``static``: model2vec's recipe from the teacher, then fine-tuned on its sentence vectors.

1. Every vocabulary token through the teacher as a one-token sentence (:func:`~distillery.static.vectors.token_vectors`),
   PCA to ``pca_dims`` (:func:`~distillery.static.vectors.pca_basis`), each row weighted by SIF on the run's text
   (model2vec folds the same weights into its vectors, estimated from a Zipf law where it has no text).
2. Beyond model2vec: the table is trained on the teacher's sentence vectors of the run's text (the embedding kind's
   cached vectors), with the kind's distance (cosine + MSE on unit vectors). The student's vectors have ``pca_dims``
   numbers and the teacher's more, so the teacher's vectors are projected on the PCA's basis (without its centring:
   a unit vector's projection on the kept directions keeps its cosines with others up to the variance left out).

The student (:class:`~distillery.static.modeling_static.StaticEmbedder`) is saved as sentence-transformers'
``StaticEmbedding`` (the embedding kind's ``write_files``). Only the embedding kind is handled: another task would
need a head, which the static-embedding baseline has (:mod:`distillery.live_baselines`)."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from distillery.data.encode import model_inputs
from distillery.errors import DistilleryError
from distillery.evaluation import score
from distillery.kinds import KINDS
from distillery.kinds.embedding import embedding_distance, sentence_vectors
from distillery.method import Method
from distillery.method_context import MethodContext
from distillery.static.modeling_static import StaticEmbedder
from distillery.static.vectors import model2vec_embedder


def static_loss(basis: torch.Tensor | None):
    """loss_fn for the trainer: the kind's distance between the student's unit vector and the teacher's, projected
    on ``basis`` (pca_dims, H) where the widths differ."""
    def loss_fn(model, batch):
        student = sentence_vectors(model(**model_inputs(batch, model)), batch)
        teacher = batch["teacher_logits"].float().to(student.device)
        if basis is not None:
            teacher = teacher @ basis.T.to(student.device)
        return embedding_distance(student, teacher)

    return loss_fn


def build_student(ctx: MethodContext, train, pca_dims: int | None, sif: float | None) -> tuple[StaticEmbedder, torch.Tensor | None]:
    """The model2vec-style static embedder of ``ctx.teacher`` (SIF counted on ``train``) and the PCA's basis."""
    return model2vec_embedder(ctx.teacher, ctx.tokenizer, train, pca_dims, sif, ctx.config.student.seed,
                              batch_size=max(ctx.config.student.eval_batch_size, 256))


class Static(Method):
    name = "static"
    unhandled_kinds = tuple(kind for kind in KINDS if kind != "embedding")  # a head on its vectors is the baseline's

    def check_kind(self, task, config) -> None:
        if task.kind in self.unhandled_kinds:
            raise DistilleryError(f"static makes a sentence embedder (--task embedding); task {task.name} needs a "
                                  f"head on its vectors, which static does not train: use --method distill (the "
                                  f"report's static-embedding baseline is one with a fitted head).")

    def run(self, ctx: MethodContext) -> PreTrainedModel:
        opts = self.options(ctx.config)
        ctx.teacher.eval()
        train = ctx.distillation_train(False)  # the run's texts, each with the teacher's (cached) vector
        student, basis = build_student(ctx, train, opts.pca_dims, opts.sif)
        main = ctx.task_data.task.main_metric
        ctx.notes.append(f"Student: static token vectors of the teacher ({student.config.vocab_size} tokens × "
                         f"{student.config.hidden_size} dims; PCA {opts.pca_dims or 'none'}, SIF a = {opts.sif}).")
        if not opts.fine_tune:
            return student
        before = score(student, ctx.task_data, batch_size=ctx.config.student.eval_batch_size)[main]
        ctx.notes.append(f"Static vectors before fine-tuning (model2vec's recipe): {main} {before:.4f}; then trained on "
                         f"the teacher's vectors of {len(train)} texts (1 − cos + MSE"
                         f"{', teacher projected on the PCA basis' if basis is not None else ''}).")
        return ctx.train(student, static_loss(basis), desc="static", train_dataset=train)
