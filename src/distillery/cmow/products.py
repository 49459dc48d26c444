"""CMOW's matrix products: the ordered product of a sequence's matrices as a batched tree reduction
(⌈log2 T⌉ batched matmuls), the per-token prefix / suffix products as a Hillis–Steele scan (⌈log2 T⌉
steps), and the fixed-depth form an exported graph runs. No loop over positions."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# An exported (ONNX) graph has a dynamic sequence axis, and tree_product's loop runs ⌈log2 T⌉ times, which
# a tracer would freeze at the example's T. The exported graph instead pads T with identities (which
# change nothing) to a multiple of EXPORT_CHUNK: a static tree inside each chunk, then a fixed number of
# doubling steps over the chunk products (steps past ⌈log2 n⌉ multiply by identities). The padding is in
# the graph, so an exporter tracing at any length works (transformers' trace at 7); distillery's ONNX
# export declares the length a multiple of EXPORT_CHUNK (its runtime pads the inputs), which keeps the
# graph's length axis dynamic: the in-graph padding is then zero.
EXPORT_CHUNK = 16
EXPORT_MAX_LENGTH = 2 ** 12


def identity_like(x: Tensor) -> Tensor:
    return torch.eye(x.shape[-1], dtype=x.dtype, device=x.device).expand_as(x)


def tree_product(x: Tensor, reverse: bool = False) -> Tensor:
    """Ordered product over dim -3 by pairs, ⌈log2 T⌉ batched matmuls: (..., T, d, d) -> (..., d, d).

    ``x_1 ⋯ x_T``, or with ``reverse`` ``x_T ⋯ x_1`` (each pair multiplied the other way round, so the
    backward direction needs no flipped copy of the sequence)."""
    if torch.compiler.is_exporting():
        return _tree_product_fixed_depth(x, reverse)
    while x.shape[-3] > 1:
        if x.shape[-3] % 2:  # an odd count: the last matrix waits a level (times the identity)
            x = torch.cat([x, identity_like(x[..., :1, :, :])], dim=-3)
        first, second = x[..., 0::2, :, :], x[..., 1::2, :, :]
        x = second @ first if reverse else first @ second
    return x[..., 0, :, :]


def _tree_product_fixed_depth(x: Tensor, reverse: bool) -> Tensor:
    """:func:`tree_product` of (B, T, d, d) with T ≤ EXPORT_MAX_LENGTH, in shape-independent steps."""
    batch, length, d, _ = x.shape
    pad = (-length) % EXPORT_CHUNK
    x = torch.cat([x, identity_like(x[:, :1]).expand(batch, pad, d, d)], dim=1)
    x = x.reshape(batch, (length + pad) // EXPORT_CHUNK, EXPORT_CHUNK, d, d)
    while x.shape[-3] > 1:  # static: EXPORT_CHUNK halves down to 1
        first, second = x[..., 0::2, :, :], x[..., 1::2, :, :]
        x = second @ first if reverse else first @ second
    x = x[..., 0, :, :]  # (B, n, d, d) chunk products
    eye = torch.eye(d, dtype=x.dtype, device=x.device)
    for step in range((EXPORT_MAX_LENGTH // EXPORT_CHUNK).bit_length() - 1):
        k = 2 ** step  # position i takes the product of its block with the one k further; past the end: I
        later = F.pad(x - eye, (0, 0, 0, 0, 0, k))[:, k:] + eye
        x = later @ x if reverse else x @ later
    return x[:, 0]


def prefix_products(x: Tensor) -> Tensor:
    """Inclusive prefix products P_i = x_1 ⋯ x_i along dim 1 (Hillis–Steele: ⌈log2 T⌉ batched steps)."""
    if torch.compiler.is_exporting():
        return _scan_fixed_depth(x, reverse=False)
    k, length = 1, x.shape[1]
    while k < length:
        x = torch.cat([x[:, :k], x[:, :-k] @ x[:, k:]], dim=1)  # P_i ← P_{i−k} · P_i
        k *= 2
    return x


def suffix_products(x: Tensor) -> Tensor:
    """Inclusive suffix products S_i = x_T ⋯ x_i along dim 1 (the backward direction, aligned at i)."""
    if torch.compiler.is_exporting():
        return _scan_fixed_depth(x, reverse=True)
    k, length = 1, x.shape[1]
    while k < length:
        x = torch.cat([x[:, k:] @ x[:, :-k], x[:, -k:]], dim=1)  # S_i ← S_{i+k} · S_i
        k *= 2
    return x


def _shifted(x: Tensor, k: int, eye: Tensor, later: bool) -> Tensor:
    """x moved k places along dim 1 (``later``: position i holds x_{i+k}, else x_{i−k}), identities
    shifted in: a pad and a slice, whatever the (symbolic) length."""
    deviation = x - eye
    if later:
        return F.pad(deviation, (0, 0, 0, 0, 0, k))[:, k:] + eye
    return F.pad(deviation, (0, 0, 0, 0, k, 0))[:, : x.shape[1]] + eye


def _scan_fixed_depth(x: Tensor, reverse: bool) -> Tensor:
    """:func:`prefix_products` (or with ``reverse`` :func:`suffix_products`) of (B, T, d, d) with T ≤
    EXPORT_MAX_LENGTH in shape-independent steps, as :func:`_tree_product_fixed_depth` does for the whole
    product: a static scan inside each EXPORT_CHUNK block, a fixed number of doubling steps over the block
    products (the products of the blocks before, or after, each block), then one product a position."""
    batch, length, d, _ = x.shape
    pad = (-length) % EXPORT_CHUNK
    # identities at the end change no prefix; a suffix then starts with them, which changes nothing either
    x = torch.cat([x, identity_like(x[:, :1]).expand(batch, pad, d, d)], dim=1)
    blocks = x.reshape(batch, (length + pad) // EXPORT_CHUNK, EXPORT_CHUNK, d, d)
    local = blocks.flatten(0, 1)  # (B·n, C, d, d): each block's own inclusive scan, static
    eye = torch.eye(d, dtype=x.dtype, device=x.device)
    k = 1
    while k < EXPORT_CHUNK:
        local = _shifted(local, k, eye, later=reverse) @ local  # P_i ← P_{i−k} · P_i; S_i ← S_{i+k} · S_i
        k *= 2
    local = local.reshape(blocks.shape)
    whole = local[:, :, 0] if reverse else local[:, :, -1]  # (B, n, d, d): each block's own product
    for step in range((EXPORT_MAX_LENGTH // EXPORT_CHUNK).bit_length() - 1):  # the same scan over the blocks
        whole = _shifted(whole, 2 ** step, eye, later=reverse) @ whole
    before = _shifted(whole, 1, eye, later=reverse)  # the blocks strictly before (after) each block
    out = before[:, :, None] @ local
    return out.reshape(batch, length + pad, d, d)[:, :length]
