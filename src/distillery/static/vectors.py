"""Static token vectors from a teacher, model2vec's recipe (Tulkens & van Dongen, 2024): every vocabulary token run
through the teacher as a one-token sentence (:func:`token_vectors`), reduced by PCA (:func:`pca_basis`;
both: :func:`reduced_token_vectors`) and weighted by SIF (:func:`sif_weights`). The one home of these steps: the
static-embedding baselines (:mod:`distillery.live_baselines`), method ``static`` (:func:`model2vec_embedder`) and a
CMOW embedder's start all use them."""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from distillery.data.encode import model_inputs
from distillery.errors import DistilleryError
from distillery.static.modeling_static import StaticEmbedder, StaticEmbedderConfig

PROBE_TEXT = "a"  # one ordinary word: where its ids sit between the special tokens gives the template




def special_template(tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a single sentence ([CLS] … [SEP], <s> … </s>)."""
    with_specials = list(tokenizer(PROBE_TEXT)["input_ids"])
    plain = list(tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"])
    n = len(plain)
    for start in range(len(with_specials) - n + 1):
        if n and with_specials[start:start + n] == plain:
            return with_specials[:start], with_specials[start + n:]
    raise DistilleryError(f"Cannot tell which special tokens {type(tokenizer).__name__} adds around a sentence, "
                          "so the teacher's token vectors cannot be computed.")


def _encoder_output(model: nn.Module, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """(B, H): each one-token sentence's mean output over its positions (model2vec's default pooling).

    The model is called whole, as it runs on a task (a MoEBERT student routes tokens in its own
    forward; calling its base model alone would skip that), and its last hidden state is read: the
    ``last_hidden_state`` of a bare encoder, else the last entry of ``hidden_states`` (a model with a
    head); for a model that exposes no per-token states (a cmow student) its logits: the vector is then
    the teacher's own prediction for the token."""
    given = model_inputs(dict(inputs), model)
    try:
        out = model(**given, output_hidden_states=True)
    except TypeError:  # a forward without the flag (a cmow student): its logits are read below
        out = model(**given)
    hidden = getattr(out, "last_hidden_state", None)
    if hidden is None:
        states = getattr(out, "hidden_states", None)
        hidden = states[-1] if states else None
    if hidden is None:
        logits = getattr(out, "logits", None)
        if logits is None:
            raise DistilleryError(f"The teacher ({type(model).__name__}) returns neither hidden states nor logits, "
                                  "so no static embeddings can be distilled from it.")
        return logits.float().reshape(len(logits), -1)
    return hidden.float().mean(1)  # every position is real: one token and its specials


def token_vectors(model: nn.Module, tokenizer, batch_size: int = 1024) -> torch.Tensor:
    """(V, H) float32 on the CPU: the teacher's output for every vocabulary id as a one-token sentence.

    All ids go through in batches of ``batch_size`` sentences of the same length (no padding)."""
    vocab = int(model.get_input_embeddings().num_embeddings) if hasattr(model, "get_input_embeddings") \
        else int(model.config.vocab_size)
    before, after = special_template(tokenizer)
    device = next(model.parameters()).device
    ids = torch.arange(vocab)[:, None]  # (V, 1)
    side = lambda t: torch.tensor(t, dtype=torch.long).expand(vocab, len(t))  # noqa: E731
    sentences = torch.cat([side(before), ids, side(after)], dim=1)  # (V, L)
    was_training = model.training
    model.eval()
    chunks = []
    try:
        with torch.inference_mode():
            for start in range(0, vocab, batch_size):
                batch = sentences[start:start + batch_size].to(device)  # (b, L)
                inputs = {"input_ids": batch, "attention_mask": torch.ones_like(batch),
                          "token_type_ids": torch.zeros_like(batch)}
                chunks.append(_encoder_output(model, inputs).cpu())
    finally:
        model.train(was_training)
    vectors = torch.cat(chunks)
    if not torch.isfinite(vectors).all():
        raise DistilleryError("The teacher's outputs for its vocabulary are not finite (NaN or inf): its weights "
                              "are damaged, so no static embeddings can be distilled from it.")
    return vectors


def counted_tokens(tokenizer, vocab: int) -> torch.Tensor:
    """(V,) 1.0 for ids that enter a sentence's mean, 0.0 for the special tokens (the unknown token counts:
    it stands for a real word)."""
    counted = torch.ones(vocab)
    special = [i for i in tokenizer.all_special_ids if i is not None and 0 <= i < vocab and i != tokenizer.unk_token_id]
    counted[torch.tensor(special, dtype=torch.long)] = 0.0
    return counted


def pca_basis(vectors: torch.Tensor, pca_dims: int | None, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """PCA of the token vectors to ``pca_dims``: the reduced vectors (V, pca_dims) and the basis (pca_dims, H), whose
    rows span the kept directions; the vectors unchanged and None where ``pca_dims`` is None or not below the
    teacher's width."""
    if pca_dims is None or pca_dims >= min(vectors.shape):
        return vectors, None
    from sklearn.decomposition import PCA

    pca = PCA(n_components=int(pca_dims), random_state=seed)
    reduced = pca.fit_transform(vectors.double().numpy())
    return torch.from_numpy(reduced).float(), torch.from_numpy(pca.components_).float()


def reduced_token_vectors(model: nn.Module, tokenizer, pca_dims: int | None, seed: int, batch_size: int
                          ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Every vocabulary token through the teacher (:func:`token_vectors`), PCA-reduced to ``pca_dims``
    (:func:`pca_basis`): the vectors (V, d), the PCA's basis (None: unreduced) and the tokens a sentence's mean
    counts (:func:`counted_tokens`): the first steps of method static's table and of a CMOW embedder's start, which
    then weight them (SIF) each in its own order."""
    vectors = token_vectors(model, tokenizer, batch_size=batch_size)
    reduced, basis = pca_basis(vectors, pca_dims, seed=seed)
    return reduced, basis, counted_tokens(tokenizer, len(vectors))


def model2vec_embedder(teacher: nn.Module, tokenizer, train, pca_dims: int | None, sif: float | None, seed: int,
                       batch_size: int = 1024):
    """The model2vec-style static embedder of ``teacher`` (:class:`~distillery.static.modeling_static.StaticEmbedder`:
    each token's vector through the teacher, PCA to ``pca_dims``, SIF weights counted on ``train``'s ``input_ids``
    unless ``sif`` is None; special tokens have no vector) and the PCA's basis (None without PCA): method static's
    start, and an embedder run's static-embedding baseline."""
    reduced, basis, counted = reduced_token_vectors(teacher, tokenizer, pca_dims, seed, batch_size=batch_size)
    teacher_dim = reduced.shape[1] if basis is None else basis.shape[1]
    if sif is not None:
        reduced = reduced * sif_weights(train, counted, sif)[:, None]
    config = StaticEmbedderConfig(vocab_size=len(reduced), hidden_size=reduced.shape[1],
                                  special_ids=torch.nonzero(counted == 0).flatten().tolist(),
                                  pca_dims=reduced.shape[1] if basis is not None else None, sif=sif,
                                  teacher_dim=teacher_dim)
    model = StaticEmbedder(config)
    with torch.no_grad():
        model.embedding.weight.copy_(reduced * counted[:, None])
    return model, basis


def sif_weights(train, counted: torch.Tensor, a: float) -> torch.Tensor:
    """(V,) SIF weights a / (a + p(token)) (Arora et al., 2017), p counted on the run's train split:
    frequent tokens ("the", "a") weigh little in a sentence's mean."""
    import pyarrow.compute as pc

    column = train.select_columns(["input_ids"]).with_format("arrow")[:]["input_ids"]
    ids = torch.from_numpy(pc.list_flatten(column).to_numpy(zero_copy_only=False).astype("int64"))
    counts = torch.bincount(ids, minlength=len(counted))[: len(counted)].double() * counted.double()
    p = counts / counts.sum().clamp_min(1.0)
    return (a / (a + p)).float()
