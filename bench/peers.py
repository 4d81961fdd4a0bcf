#!/usr/bin/env python3
"""Times dmattn's PyTorch peers on the case grid that `dmattn-bench --out DIR` writes.

    python3 bench/peers.py --cases DIR/cases.json --out DIR/peers.json
        [--impls sdpa-flash,flex,...] [--groups llm,...] [--max-seconds N]

Peers, all on GPU 0:
- sdpa-flash, sdpa-cudnn, sdpa-efficient, sdpa-math: F.scaled_dot_product_attention pinned to
  one backend by sdpa_kernel; the mask and bias go in as one attn_mask (a float mask, bias with
  -inf where hidden; with causal it is materialized [b, mask_heads, sq, sk], and per query head
  where 1 < mask_heads < heads: a mask that does not fit in the free memory is reported "oom").
- flex: flex_attention under torch.compile; the mask is a BlockMask whose mask_mod reads the
  mask tensor, the bias is a score_mod. The sparse group's masks are what a flex user would
  write: windows and compressed causal as a mask_mod of the indices (create_block_mask),
  BCSR and bitset block masks as a BlockMask of the same kept 128-blocks (from_kv_blocks, all
  full blocks). Such a BlockMask is built once per case, outside the timed calls, and its build
  time (a second build, after a warm-up one) and bytes are reported as pass "prep"; so is the
  gather group's (key_topk: mask_mod kept[b, h_kv, kv_idx] & causal, create_block_mask), whose
  mask is data that changes every step in use (dmattn's timed forward includes its compaction).
- fa2-kept-keys, fa2-dense-causal (key_topk cases only): FlashAttention-2 references that do not
  do the case's work, reported for scale and never counted as the best peer. fa2-kept-keys is
  the floor of gather attention: K and V gathered along each plane's kept keys (outside the
  timed calls) into [b, keep, kv_heads, d], then attention over them alone, without bias and
  without causal. fa2-dense-causal is dense causal attention over all the keys, mask and bias
  ignored. Both use flash_attn.flash_attn_func where the flash_attn package is installed, else
  PyTorch's own FlashAttention-2 kernel (SDPA pinned to its flash backend, [b, h, s, d]); the
  note says which.
- torch-topk, torch-create-mask (select cases only, which time key selection, no attention; the
  attention peers skip them): torch.topk(bias, keep, dim=-1, sorted=False), and Flash-DMA's
  create_mask (flash_dmattn.utils.mask.topk_mask): that top-k scattered into a bool tensor. With
  a causal mask (built once, untimed), both first fill the hidden scores with the dtype's
  minimum (bias.masked_fill(~mask, min)), and create_mask keeps a selected key only where its
  value is not that minimum. Where the whole tensor does not fit (oom), the same calls run over
  row chunks, which the note says.
- Packed variable-length batches (the varlen group's cases with `seqlens`: each sequence's query
  and key lengths, read from cases.json; q, k, v are made as [1, heads, total, d]), causal within
  each sequence aligned to its own bottom-right corner. A case whose `seqlens` has a `page_size`
  (dmattn's K/V in a paged KV cache) is the same attention: no peer here takes a block table, so
  they run it as the contiguous packed batch, exactly as its contiguous twin:
  - flex: the packed tensors as they are, with a document mask: mask_mod doc_q[q_idx] ==
    doc_k[kv_idx] & kv_idx <= last[q_idx] (the last key of its own sequence the query sees), a
    BlockMask built once by create_block_mask (eager, B = H = 1), its build reported as "prep".
  - sdpa-*: every sequence padded to the longest, [b, heads, max, d] (padding untimed, padded
    query rows and dout zero): is_causal where each sequence has as many queries as keys (causal
    then already hides the padded keys from every real query), else a bool attn_mask [b, 1,
    max_q, max_k] of causal within each sequence's keys.
  - fa2-varlen (these cases only): flash_attn.flash_attn_varlen_func(causal=True) on q [total_q,
    heads, d] and k, v [total_k, kv_heads, d] with int32 cu_seqlens, where the flash_attn package
    is installed, else PyTorch's torch.nn.attention.varlen.varlen_attn (its FA2 kernel), else
    "unsupported"; the note says which. It takes no mask or bias: "unsupported" on key_fraction.
  With a key-side mask and bias (key_fraction: [total_k, mask_heads] each, every (sequence, mask
  head) keeping its share of keys of largest bias, drawn as dmattn-bench draws them):
  - flex: the document mask's blocks, all partial, with a mask_mod that also reads the kept keys
    of the query head's mask head, and a score_mod adding its bias (document_block_mask).
  - sdpa-*: a float attn_mask [b, heads, max_q, max_k] of each sequence's bias, -inf where hidden
    (padded_key_side), per query head.
  - fa2-varlen-kept (these cases only): a reference that skips part of the work (never the best
    peer), the floor of attention over the kept keys: FA2's varlen kernel as fa2-varlen over the
    kept keys alone (gathered untimed), each (kv head, sequence) as a sequence of one kv head,
    without bias and without causal (Fa2VarlenKept).

Inputs, masks, causal alignment, timing (CUDA events, warm-up, median, rotated operand sets) and
both file formats are those of bench/SCHEMA.md. A backward is timed alone: the forward it needs
runs before the timed calls, each of which is one torch.autograd.grad over q, k, v and, when the
case has a bias, the bias (dmattn computes dbias, so its peers must too). Every
(case, impl, pass) tried is reported, failures included, and the output is rewritten after each
case so that a killed run still leaves its results.
"""

import argparse
import functools
import gc
import inspect
import json
import math
import os
import struct
import time
import warnings
import zlib
from contextlib import nullcontext
from dataclasses import dataclass, fields
from datetime import UTC, datetime

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

try:  # the FlashAttention-2 package, where installed (else fa2-* run PyTorch's copy of its kernel)
    import flash_attn
    from flash_attn import flash_attn_func, flash_attn_varlen_func
except ImportError:
    flash_attn = flash_attn_func = flash_attn_varlen_func = None

try:  # PyTorch's own varlen FlashAttention-2 (torch 2.10+), fa2-varlen's fallback
    from torch.nn.attention.varlen import varlen_attn as torch_varlen_attn
except ImportError:
    torch_varlen_attn = None

SDPA_BACKENDS = {
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa-math": SDPBackend.MATH,
}
# References for key_topk cases only (see the docstring): they skip part of the case's work.
FA2_IMPLS = ("fa2-kept-keys", "fa2-dense-causal")
# Key selection (select cases only, see the docstring): torch.topk, and Flash-DMA's create_mask.
SELECT_IMPLS = ("torch-topk", "torch-create-mask")
# Packed variable-length batches only (varlen group, see the docstring); fa2-varlen-kept only on
# those with a key_fraction mask, a reference that skips part of the work.
VARLEN_IMPLS = ("fa2-varlen", "fa2-varlen-kept")
IMPLS = [*SDPA_BACKENDS, "flex", *FA2_IMPLS, *SELECT_IMPLS, *VARLEN_IMPLS]
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}

# flex recompiles for every shape and every new mask_mod/score_mod. Past dynamo's recompile limit
# it would silently fall back to eager flex_attention, which materializes the scores: a wrong
# peer. So lift the limits and make hitting one an error rather than a fallback (fullgraph does
# the same for a graph break). dynamic=False compiles each shape specialized, as a user with fixed
# shapes gets.
torch._dynamo.config.recompile_limit = 1 << 16
torch._dynamo.config.accumulated_recompile_limit = 1 << 16
torch._dynamo.config.fail_on_recompile_limit_hit = True
compiled_flex = torch.compile(flex_attention, dynamic=False, fullgraph=True)

ROTATION_BYTES = 256 << 20  # operand sets rotate until they span this much (SCHEMA.md)
DECODE_ROWS = 16  # cases.rs's DECODE_ROWS: the most queries a decoding batch's sequences have
TOPK_CHUNK_ELEMS = 1 << 27  # scores per torch.topk call: bounds topk's scratch on 32K x 32K rows
NOTE_CHARS = 300


@dataclass(frozen=True)
class Case:
    id: str
    group: str
    batch: int
    heads: int
    kv_heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool
    mask: dict | None
    bias: bool
    mask_heads: int
    backward: bool
    # A packed batch (varlen group): {"lens_q": [...], "lens_k": [...]} and, where dmattn pages
    # K/V, "page_size" (ignored: the peers run the contiguous packed layout, the same attention);
    # batch is 1 and seqlen_q, seqlen_k the totals. Absent from the other cases.
    seqlens: dict | None = None

    @classmethod
    def parse(cls, raw):
        return cls(**{f.name: raw[f.name] for f in fields(cls) if f.name != "seqlens"}, seqlens=raw.get("seqlens"))

    @property
    def causal_applies(self):
        """Whether causal hides anything: with one query row, bottom-right causal shows every
        key, so dropping it gives the same attention and spares peers an explicit mask."""
        return self.causal and self.seqlen_q > 1

    def passes(self):
        return ["fwd", "bwd"] if self.backward else ["fwd"]


@dataclass
class Inputs:
    sets: list  # rotated operand sets: (q, k, v, dout)
    # [b or 1, mask_heads or 1, sq, sk] bool, the case's mask without causal (a window's or a
    # compressed causal's band includes its causal edge); key_topk: [b, mask_heads, 1, sk]
    # key_fraction (a packed batch's key-side mask): [total_k, mask_heads]
    visible: torch.Tensor | None
    # [b, mask_heads, sq, sk]; key_topk: [b, mask_heads, 1, sk]; key_fraction: [total_k, mask_heads]
    bias: torch.Tensor | None
    kept: torch.Tensor | None = None  # bcsr / bitset: [b, mask_heads, sq / block, sk / block] bool
    # key_topk: [b, mask_heads, keep] int64, ascending; key_fraction: [mask_heads, kept rows] int64,
    # each mask head's kept packed keys, sequence by sequence, ascending (key_fraction_inputs)
    kept_keys: torch.Tensor | None = None


# ---------------------------------------------------------------------------------------------
# Inputs


def make_inputs(case, dtype, device):
    """The case's operands, N(0, 1), made on the device (the masks are too big for the host)."""
    mask_shape = (case.batch, case.mask_heads, case.seqlen_q, case.seqlen_k)
    kept_keys = None
    if case.mask is not None and case.mask["kind"] == "key_topk":
        kept_keys, visible, bias = key_topk_inputs(case, dtype, device)
    elif case.mask is not None and case.mask["kind"] == "key_fraction":
        kept_keys, visible, bias = key_fraction_inputs(case, dtype, device)
    else:
        bias = torch.randn(mask_shape, dtype=dtype, device=device) if case.bias else None
        visible = make_mask(case, bias, device)
    kept = None
    if case.mask is not None and case.mask["kind"] in BLOCK_LIST_KINDS:
        kept = block_pattern(case, case.mask["block"], case.mask["density"], device)
    q_shape = (case.batch, case.heads, case.seqlen_q, case.head_dim)
    kv_shape = (case.batch, case.kv_heads, case.seqlen_k, case.head_dim)
    set_bytes = dtype.itemsize * (math.prod(q_shape) + 2 * math.prod(kv_shape))
    n_sets = min(max(-(-ROTATION_BYTES // set_bytes), 1), 4)
    # Only q, k, v (and dout) rotate: mask and bias are shared by all sets, as they are the big
    # tensors and rotating them could not fit the largest cases.
    sets = [
        tuple(torch.randn(s, dtype=dtype, device=device) for s in (q_shape, kv_shape, kv_shape, q_shape))
        for _ in range(n_sets)
    ]
    return Inputs(sets, visible, bias, kept, kept_keys)


# Mask kinds (SCHEMA.md): the parametric bands, and block masks given as lists of kept blocks.
BAND_KINDS = ("window", "compress", "compress_dense")
BLOCK_LIST_KINDS = ("bcsr", "bitset")
MASK64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def block_pattern(case, block, density, device):
    """[b, mask_heads, ceil(sq / block), ceil(sk / block)] bool: the kept blocks of a random
    block mask, drawn as dmattn-bench draws them (cases.rs's block_pattern): block n is kept iff
    (splitmix64(seed + n) >> 11) * 2^-53 < density, seed folding batch, mask_heads, seqlen_q,
    seqlen_k, block and density's bits through splitmix64. So both sides, and every kind of one
    shape (blocks, bcsr, bitset), hide the same blocks."""
    nq, nk = -(-case.seqlen_q // block), -(-case.seqlen_k // block)
    seed = 0
    bits = struct.unpack("<Q", struct.pack("<d", float(density)))[0]
    for word in (case.batch, case.mask_heads, case.seqlen_q, case.seqlen_k, block, bits):
        seed = splitmix64(seed ^ word)
    unit, count = 2.0**-53, case.batch * case.mask_heads * nq * nk
    keep = [(splitmix64((seed + n) & MASK64) >> 11) * unit < density for n in range(count)]
    return torch.tensor(keep, dtype=torch.bool).view(case.batch, case.mask_heads, nq, nk).to(device)


KEY_TOPK_TAG = int.from_bytes(b"key_topk", "big")  # cases.rs's KEY_TOPK_TAG


def key_topk_scores(case):
    """[b, mask_heads, sk] float64 in (0, 1), on the host: cases.rs's key_scores, the same values
    (exact integer arithmetic): u_n = (2 (splitmix64(seed + n) >> 12) + 1) 2^-53, seed folding
    the tag, batch, mask_heads, seqlen_k and keep through splitmix64."""
    seed = 0
    for word in (KEY_TOPK_TAG, case.batch, case.mask_heads, case.seqlen_k, case.mask["keep"]):
        seed = splitmix64(seed ^ word)
    count = case.batch * case.mask_heads * case.seqlen_k
    u = [((splitmix64((seed + n) & MASK64) >> 12) * 2 + 1) * 2.0**-53 for n in range(count)]
    return torch.tensor(u, dtype=torch.float64).view(case.batch, case.mask_heads, case.seqlen_k)


def top_keys(scores, keep):
    """[..., keep] int64: the keep keys of largest score of each plane (ties to the lower key, a
    stable sort), ascending: cases.rs's top_keys."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    return order[..., : min(keep, scores.size(-1))].sort(dim=-1).values


def key_topk_inputs(case, dtype, device):
    """(kept_keys [b, mask_heads, keep], visible [b, mask_heads, 1, sk] bool, bias [b, mask_heads,
    1, sk] or None) of a key_topk case, as dmattn-bench draws them: the bias is Phi^-1 of
    key_topk_scores (N(0, 1), ranked as the scores are), the mask keeps the keep keys of largest
    score, so both sides keep the same keys of the same bias."""
    scores = key_topk_scores(case)
    kept_keys = top_keys(scores, case.mask["keep"])
    visible = torch.zeros(scores.shape, dtype=torch.bool).scatter_(-1, kept_keys, True)
    bias = torch.special.ndtri(scores)[:, :, None].to(device=device, dtype=dtype) if case.bias else None
    return kept_keys.to(device), visible[:, :, None].to(device), bias


KEY_FRACTION_TAG = int.from_bytes(b"key_frac", "big")  # cases.rs's KEY_FRACTION_TAG


def fraction_kept(len_k, percent):
    """cases.rs's fraction_kept: ceil(len_k * percent / 100) keys of a sequence, at most len_k."""
    return min(-(-len_k * percent // 100), len_k)


def key_fraction_scores(case):
    """[total_k, mask_heads] float64 in (0, 1), on the host: cases.rs's key_fraction_scores, the
    same values (exact integer arithmetic, as key_topk_scores), seed folding the tag, the number
    of sequences, mask_heads, total_k and percent through splitmix64."""
    seed = 0
    words = (KEY_FRACTION_TAG, len(case.seqlens["lens_k"]), case.mask_heads, case.seqlen_k, case.mask["percent"])
    for word in words:
        seed = splitmix64(seed ^ word)
    count = case.seqlen_k * case.mask_heads
    u = [((splitmix64((seed + n) & MASK64) >> 12) * 2 + 1) * 2.0**-53 for n in range(count)]
    return torch.tensor(u, dtype=torch.float64).view(case.seqlen_k, case.mask_heads)


def key_fraction_inputs(case, dtype, device):
    """(kept_keys [mask_heads, kept rows], visible [total_k, mask_heads] bool, bias [total_k,
    mask_heads] or None) of a packed key_fraction case, as dmattn-bench draws them (cases.rs's
    top_fraction_keys): each (sequence, mask head) keeps the fraction_kept keys of largest score
    among the sequence's, and the bias is Phi^-1 of the scores. kept_keys lists each mask head's
    kept packed keys, sequence by sequence (every head keeps as many of each sequence's keys)."""
    scores = key_fraction_scores(case)
    kept, start = [], 0
    for n in case.seqlens["lens_k"]:
        keys = top_keys(scores[start : start + n].T, fraction_kept(n, case.mask["percent"]))
        kept.append(keys + start)  # [mask_heads, this sequence's kept keys], packed positions
        start += n
    kept_keys = torch.cat(kept, dim=1)
    visible = torch.zeros(scores.T.shape, dtype=torch.bool).scatter_(1, kept_keys, True).T.contiguous()
    bias = torch.special.ndtri(scores).to(device=device, dtype=dtype) if case.bias else None
    return kept_keys.to(device), visible.to(device), bias


def band_visible(case, device):
    """[1, 1, sq, sk] bool of a band kind (cases.rs's Case::row_keys): the diagonal is
    i + sk - sq, or i // cf under compression; causal and compression end a row there, a window
    starts it `left` keys before."""
    i = torch.arange(case.seqlen_q, device=device)[:, None]
    j = torch.arange(case.seqlen_k, device=device)[None, :]
    kind = case.mask["kind"]
    if kind in ("compress", "compress_dense"):
        return (j * case.mask["cf"] <= i)[None, None]
    diagonal = i + (case.seqlen_k - case.seqlen_q)
    visible = j >= diagonal - case.mask["left"]
    if case.causal:
        visible &= j <= diagonal
    return visible[None, None]


def make_mask(case, bias, device):
    """The case's mask as [b, mask_heads, sq, sk] bool (True = visible; a window's or a
    compression's [1, 1, sq, sk], as it is the same for every plane), or None."""
    if case.mask is None:
        return None
    shape = (case.batch, case.mask_heads, case.seqlen_q, case.seqlen_k)
    kind = case.mask["kind"]
    if kind in ("blocks", *BLOCK_LIST_KINDS):
        block = case.mask["block"]
        tiles = block_pattern(case, block, case.mask["density"], device)
        full = tiles.repeat_interleave(block, 2).repeat_interleave(block, 3)
        return full[:, :, : shape[2], : shape[3]].contiguous()
    if kind == "compress_dense":  # a dense mask like dmattn's, one per (batch, mask head)
        return band_visible(case, device).expand(shape).contiguous()
    if kind in BAND_KINDS:
        return band_visible(case, device)
    if kind == "topk":
        return topk_mask(shape, case.mask["keep"], bias, device)
    if kind == "key_topk":
        return key_topk_inputs(case, torch.float32, device)[1]
    if kind == "key_fraction":
        return key_fraction_inputs(case, torch.float32, device)[1]
    if kind == "index_lists":
        return index_lists_visible(case, device)
    raise ValueError(f"unknown mask kind {kind!r}")


def list_hash(plane, row, slot):
    """cases.rs's list_hash: 32-bit mixing of (plane, row, slot), in int64 (every product stays
    below 2^63, every value non-negative)."""
    m = 0xFFFFFFFF
    h = (plane * 0x9E37 + row * 0x2C1B3C6D + slot * 0x297A2D39 + 0x12345678) & m
    h = h ^ (h >> 16)
    h = (h * 0x7FEB352D) & m
    h = h ^ (h >> 15)
    h = (h * 0x2C1B3C6D) & m
    return h ^ (h >> 16)


def index_lists_visible(case, device, chunk=4096):
    """[b, mask_heads, sq, sk] bool: the keys an index_lists case's rows list, as dmattn-bench
    draws them (cases.rs's index_lists): row i sees keys 0..hi (hi = i + sk - sq + 1 under causal,
    clamped to 0..sk) and lists at slot k list_hash(plane, i, k) % hi (random) or hi - 1 - k
    (window), none where that is below 0."""
    keep, layout = case.mask["keep"], case.mask["layout"]
    sq, sk, planes = case.seqlen_q, case.seqlen_k, case.batch * case.mask_heads
    visible = torch.zeros((planes, sq, sk), dtype=torch.bool, device=device)
    slots = torch.arange(keep, device=device, dtype=torch.int64)[None, :]
    for p in range(planes):
        for r0 in range(0, sq, chunk):
            rows = torch.arange(r0, min(r0 + chunk, sq), device=device, dtype=torch.int64)[:, None]
            hi = (rows + (sk - sq) + 1).clamp(0, sk) if case.causal else torch.full_like(rows, sk)
            if layout == "random":
                keys = torch.where(hi > 0, list_hash(p, rows, slots) % hi.clamp(min=1), -1)
            else:
                keys = hi - 1 - slots
            at = (keys >= 0).nonzero(as_tuple=True)
            visible[p, rows.expand_as(keys)[at], keys[at]] = True
    return visible.view(case.batch, case.mask_heads, sq, sk)


def topk_mask(shape, keep, bias, device):
    """Each row keeps the `keep` keys of largest bias, or of an independent N(0, 1) score when
    there is no bias; in row chunks, as topk's scratch on a whole 32K x 32K bias may not fit."""
    if keep >= shape[3]:
        return torch.ones(shape, dtype=torch.bool, device=device)
    visible = torch.zeros(shape, dtype=torch.bool, device=device)
    rows = max(1, TOPK_CHUNK_ELEMS // (shape[0] * shape[1] * shape[3]))
    for r0 in range(0, shape[2], rows):
        r1 = min(r0 + rows, shape[2])
        if bias is None:
            score = torch.randn(*shape[:2], r1 - r0, shape[3], device=device)
        else:
            score = bias[:, :, r0:r1]
        idx = score.topk(keep, dim=-1, sorted=False).indices
        visible[:, :, r0:r1].scatter_(-1, idx, True)
    return visible


def causal_visible(case, device):
    """[sq, sk] bool: key j visible to query i iff j <= i + sk - sq (bottom-right aligned)."""
    i = torch.arange(case.seqlen_q, device=device)[:, None]
    j = torch.arange(case.seqlen_k, device=device)[None, :]
    return j <= i + (case.seqlen_k - case.seqlen_q)


# ---------------------------------------------------------------------------------------------
# Peers. Each is built once per case (masks converted, untimed); call() gives the attention on
# (q, k, v) for one try and the extra tensors whose gradients a backward must produce.


class Sdpa:
    def __init__(self, case, inputs, device):
        self.gqa = case.heads != case.kv_heads
        self.attn_mask, self.is_causal = sdpa_mask(case, inputs, device)
        self.note = ""
        if (
            self.attn_mask is not None
            and self.attn_mask.dim() == 4
            and 1 < self.attn_mask.size(1) < case.heads
        ):
            # attn_mask broadcasts over heads but cannot map query head h to mask head
            # h // group, so it is materialized per query head (and so is its dbias).
            group = case.heads // self.attn_mask.size(1)
            check_fits(self.attn_mask.numel() * group * self.attn_mask.element_size(), "attn_mask per query head", device)
            self.attn_mask = self.attn_mask.repeat_interleave(group, dim=1)
            self.note = "mask per query head"

    def call(self, repeat_kv, bias_grad):
        attn_mask, extra = self.attn_mask, []
        if bias_grad:
            attn_mask = attn_mask.detach().requires_grad_()
            extra = [attn_mask]
        gqa = self.gqa and not repeat_kv

        def attend(q, k, v):
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=self.is_causal, enable_gqa=gqa
            )

        return attend, extra


def sdpa_mask(case, inputs, device):
    """(attn_mask, is_causal) for SDPA: no mask and is_causal where SDPA's top-left causal is the
    case's bottom-right one; else the bool visibility, or with a bias
    bias.masked_fill(~visible, -inf)."""
    visible = inputs.visible
    if case.causal_applies:
        if visible is None and inputs.bias is None and case.seqlen_q == case.seqlen_k:
            return None, True
        causal = causal_visible(case, device)
        if visible is not None and visible.shape[-2] < causal.shape[0]:
            # A query-broadcast mask (key_topk) becomes [b, mask_heads, sq, sk] with causal:
            # bool visible and its complement, and the float mask with a bias.
            shape = torch.broadcast_shapes(visible.shape, causal.shape)
            per = 2 + (inputs.bias.element_size() if inputs.bias is not None else 0)
            check_fits(math.prod(shape) * per, f"attn_mask {list(shape)} with causal", device)
        visible = causal if visible is None else visible & causal
    if inputs.bias is None:
        return visible, False
    if visible is None:
        return inputs.bias, False
    return inputs.bias.masked_fill(~visible, -math.inf), False


def check_fits(nbytes, what, device):
    """Raises OutOfMemoryError (reported "oom", with this reason) where `nbytes` exceed the free
    device memory (free in the driver's count plus PyTorch's cached, unused blocks)."""
    if device.type != "cuda":
        return
    free = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if nbytes > free:
        raise torch.OutOfMemoryError(f"{what}: {nbytes / 2**30:.1f} GiB does not fit in the {free / 2**30:.1f} GiB free")


class PaddedSdpa:
    """SDPA on a packed case's sequences padded to the longest, [b, heads, max, d] (prepare pads
    the operand sets, untimed; padded rows are zero, dout's too, so they add nothing to the
    gradients): is_causal where every sequence has as many queries as keys (with the padding on
    the right, top-left causal is each sequence's own and hides the padded keys from every real
    query), else a bool attn_mask [b, 1, max_q, max_k] (padded_visible). With a key-side mask
    (key_fraction), a float attn_mask [b, heads, max_q, max_k] instead (padded_key_side): each
    sequence's key-side bias, -inf where its mask head's mask, causal or the padding hides a key."""

    def __init__(self, case, inputs, device):
        self.lens_q, self.lens_k = case.seqlens["lens_q"], case.seqlens["lens_k"]
        self.max_q, self.max_k = max(self.lens_q), max(self.lens_k)
        self.gqa = case.heads != case.kv_heads
        key_side = inputs.visible is not None
        self.is_causal = case.causal and self.lens_q == self.lens_k and not key_side
        self.attn_mask = None
        if not self.is_causal:
            check_fits(len(self.lens_q) * self.max_q * self.max_k, "padded attn_mask", device)
            self.attn_mask = padded_visible(case, device)
        how = "is_causal" if self.is_causal else "bool mask of causal and lengths"
        if key_side:
            self.attn_mask = padded_key_side(case, inputs, self.attn_mask, device)
            how = "float mask of the key-side bias, kept keys, causal and lengths, per query head"
        self.note = f"{len(self.lens_q)} sequences padded to {self.max_q} queries, {self.max_k} keys (untimed), {how}"

    def prepare(self, sets):
        def rows(t, queries):
            return pad(t, self.lens_q, self.max_q) if queries else pad(t, self.lens_k, self.max_k)

        return [(rows(q, True), rows(k, False), rows(v, False), rows(do, True)) for q, k, v, do in sets]

    def call(self, repeat_kv, bias_grad):  # no bias: bias_grad asks for nothing
        attn_mask, is_causal, gqa = self.attn_mask, self.is_causal, self.gqa and not repeat_kv

        def attend(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=gqa)

        return attend, []


def pad(t, lens, max_len):
    """A packed [1, heads, total, d] as [len(lens), heads, max_len, d], zeros past each sequence."""
    out = t.new_zeros((len(lens), t.size(1), max_len, t.size(3)))
    start = 0
    for b, n in enumerate(lens):
        out[b, :, :n] = t[0, :, start : start + n]
        start += n
    return out


def padded_key_side(case, inputs, visible, device):
    """[b, heads, max_q, max_k] float attn_mask of a packed case with a key-side mask (key_fraction:
    inputs.visible and inputs.bias [total_k, mask_heads]) padded: each sequence's bias (zero
    without one), -inf where its mask head does not keep a key or `visible` [b, 1, max_q, max_k]
    (causal and lengths, padded_visible) hides it; per query head, as attn_mask cannot map query
    head h to mask head h // group."""
    lens_k, max_k = case.seqlens["lens_k"], max(case.seqlens["lens_k"])
    b, max_q, heads, mask_heads = len(lens_k), visible.size(2), case.heads, inputs.visible.size(1)
    dtype = inputs.sets[0][0].dtype
    check_fits(b * (heads + 2 * mask_heads) * max_q * max_k * dtype.itemsize, "padded key-side attn_mask per query head", device)

    def keys(t):  # [total_k, mask_heads] -> [b, mask_heads, 1, max_k], zero past each sequence
        return pad(t.T[None, :, :, None], lens_k, max_k)[:, :, None, :, 0]

    bias = keys(inputs.bias) if inputs.bias is not None else torch.zeros((), dtype=dtype, device=device)
    attn_mask = bias.masked_fill(~(keys(inputs.visible) & visible), -math.inf)
    return attn_mask.repeat_interleave(heads // mask_heads, dim=1)


def padded_visible(case, device):
    """[b, 1, max_q, max_k] bool of a packed case padded: key j of sequence b visible to its
    query i iff j < len_k and, with causal, j <= i + len_k - len_q (bottom-right). Padded query
    rows see keys too (no empty rows); their outputs are dropped."""
    lq = torch.tensor(case.seqlens["lens_q"], device=device)[:, None, None]
    lk = torch.tensor(case.seqlens["lens_k"], device=device)[:, None, None]
    i = torch.arange(max(case.seqlens["lens_q"]), device=device)[None, :, None]
    j = torch.arange(max(case.seqlens["lens_k"]), device=device)[None, None, :]
    visible = j < lk
    if case.causal:
        visible = visible & (j <= i + (lk - lq))
    return visible[:, None]


def packed_rows(case, device):
    """(doc_q [total_q], doc_k [total_k], last [total_q]) of a packed case: each query's and key's
    sequence, and the last packed key a query sees (its sequence's keys start + its row + len_k -
    len_q: causal aligned to the sequence's bottom-right corner; len_k - 1 past it without causal)."""
    lens_q = torch.tensor(case.seqlens["lens_q"], device=device)
    lens_k = torch.tensor(case.seqlens["lens_k"], device=device)
    docs = torch.arange(lens_q.numel(), device=device, dtype=torch.int32)
    doc_q, doc_k = torch.repeat_interleave(docs, lens_q), torch.repeat_interleave(docs, lens_k)
    start_q, start_k = lens_q.cumsum(0) - lens_q, lens_k.cumsum(0) - lens_k
    row = torch.arange(case.seqlen_q, device=device) - start_q[doc_q]
    last = (start_k + lens_k - lens_q)[doc_q] + row if case.causal else (start_k + lens_k - 1)[doc_q]
    return doc_q, doc_k, last


def document_block_mask(case, device, kept=None):
    """(BlockMask, how) of a packed case, as a flex user writes a document mask: the same
    document (sequence ids) and causal within it (packed_rows), over [1, heads, total, d], made by
    create_block_mask (eager, B = H = 1), once per case. With a key-side mask (key_fraction: kept
    [total_k, mask_heads] bool), its mask_mod also reads kept[kv_idx, h // (heads / mask_heads)],
    on the same blocks, all made partial (so that the mask_mod runs on every one): per-head block
    lists from create_block_mask would materialize [1, mask_heads, total_q, total_k] and its int64
    block sums (~60 GiB for the decode batch), and would drop almost nothing, as a 128-key block
    holds none of a head's 10 % kept keys with probability 0.9^128 ~ 1e-6."""
    doc_q, doc_k, last = packed_rows(case, device)

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc_q[q_idx] == doc_k[kv_idx]) & (kv_idx <= last[q_idx])

    mask = create_block_mask(mask_mod, 1, 1, case.seqlen_q, case.seqlen_k, device=device)
    if kept is None:
        return mask, "create_block_mask of document ids & causal"
    per = case.heads // kept.size(1)

    def kept_mod(b, h, q_idx, kv_idx):
        return mask_mod(b, h, q_idx, kv_idx) & kept[kv_idx, h // per]

    blocks = mask.to_dense().bool()  # [1, 1, q blocks, kv blocks]: partial and full ones
    num = blocks.sum(-1, dtype=torch.int32)
    # The blocks' indices first, in order (a stable sort of "not a block"), as block_list_mask.
    idx = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32).contiguous()
    mask = BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=mask.BLOCK_SIZE, mask_mod=kept_mod, seq_lengths=(case.seqlen_q, case.seqlen_k))
    return mask, "create_block_mask of document ids & causal, all blocks partial; mask_mod & kept keys of the mask head"


class Fa2Varlen:
    """FlashAttention-2's varlen kernel on a packed case: q [total_q, heads, d], k and v
    [total_k, kv_heads, d] (prepare transposes the [1, heads, total, d] sets, untimed), int32
    cu_seqlens made once, causal (bottom-right in flash_attn 2.1+, as in the case).
    flash_attn.flash_attn_varlen_func where installed, else torch.nn.attention.varlen.varlen_attn
    (whose causal argument differs by release: is_causal, or window_size=(-1, 0); its GQA needs
    enable_gqa, else k/v are repeated, the next try). It takes no mask or bias: "unsupported" on
    a case with one (key_fraction's floor is fa2-varlen-kept)."""

    def __init__(self, case, inputs, device):
        if case.seqlens is None:
            raise NotImplementedError("fa2-varlen is for packed cases only")
        if case.mask is not None or case.bias:
            raise NotImplementedError("fa2-varlen takes no mask or bias (fa2-varlen-kept: the kept keys alone)")
        self.sequences(case.seqlens["lens_q"], case.seqlens["lens_k"], case.causal, device)

    def sequences(self, lens_q, lens_k, causal, device):
        """The sequences the kernel runs (int32 cu_seqlens made once) and which kernel."""
        if flash_attn_varlen_func is None and torch_varlen_attn is None:
            raise NotImplementedError("fa2-varlen needs the flash_attn package or torch.nn.attention.varlen")

        def cu(lens):
            return F.pad(torch.tensor(lens, device=device).cumsum(0), (1, 0)).to(torch.int32)

        self.cu_q, self.cu_k = cu(lens_q), cu(lens_k)
        self.max_q, self.max_k = max(lens_q), max(lens_k)
        self.causal = causal
        self.native = flash_attn_varlen_func is not None
        if self.native:
            self.note = f"flash_attn {flash_attn.__version__} flash_attn_varlen_func"
        else:
            self.note = "PyTorch's varlen_attn (FA2), no flash_attn package"

    def prepare(self, sets):
        return [tuple(t[0].transpose(0, 1).contiguous() for t in s) for s in sets]

    def call(self, repeat_kv, bias_grad):  # no bias: bias_grad asks for nothing
        cu_q, cu_k, max_q, max_k, causal = self.cu_q, self.cu_k, self.max_q, self.max_k, self.causal
        if self.native:

            def attend(q, k, v):
                return flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal)

            return attend, []
        params = inspect.signature(torch_varlen_attn).parameters
        options = {}
        if causal and "is_causal" in params:
            options["is_causal"] = True
        elif causal and "window_size" in params:
            options["window_size"] = (-1, 0)
        elif causal:
            raise NotImplementedError("this torch's varlen_attn has no causal option")

        def attend(q, k, v):
            gqa = {"enable_gqa": True} if q.size(1) != k.size(1) else {}
            if gqa and "enable_gqa" not in params:
                raise NotImplementedError("this torch's varlen_attn does not support GQA")
            return torch_varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **options, **gqa)

        return attend, []


class Fa2VarlenKept(Fa2Varlen):
    """fa2-varlen-kept (key_fraction cases only): the floor of a forward over a key-side mask, a
    reference that does not do the case's work (never the best peer). FA2's varlen kernel (as
    fa2-varlen) over only the kept keys: each kv head keeps its own keys, so the packed batch
    runs as kv_heads x sequences of one kv head each, the kv group's heads / kv_heads query heads
    as its heads; prepare (untimed) lays q out as [kv_heads * total_q, group, d] and gathers k and
    v to each (kv head, sequence)'s kept rows, [kv_heads * kept rows, 1, d] (with kv repeated,
    group heads). The bias is not applied (FA2 takes none), and neither is causal: decoding, with
    at most DECODE_ROWS queries at the end of a sequence (1 to 8 in the grid), causal hides at
    most DECODE_ROWS - 1 of its keys from a query (and only the kept ones among them), a
    negligible share of the keys it keeps (103 or more of the grid's 1024 or more)."""

    def __init__(self, case, inputs, device):
        if case.seqlens is None or case.mask is None or case.mask["kind"] != "key_fraction":
            raise NotImplementedError("fa2-varlen-kept is for packed key_fraction cases only")
        if max(case.seqlens["lens_q"]) > DECODE_ROWS:
            raise NotImplementedError(f"fa2-varlen-kept ignores causal: decoding only (at most {DECODE_ROWS} queries a sequence)")
        hk = case.kv_heads
        if case.mask_heads not in (1, hk):
            raise NotImplementedError(f"fa2-varlen-kept takes one mask head per kv head, or one; not {case.mask_heads}")
        self.kept = inputs.kept_keys.expand(hk, -1)  # [kv_heads, kept rows]: each kv head's keys
        percent = case.mask["percent"]
        lens_q = case.seqlens["lens_q"] * hk  # kv head major: kv head 0's sequences, then 1's, ..
        lens_k = [fraction_kept(n, percent) for n in case.seqlens["lens_k"]] * hk
        self.sequences(lens_q, lens_k, False, device)
        self.note = f"floor, not the same work: {self.note} over the kept keys only, {hk} x {len(case.seqlens['lens_q'])} sequences of one kv head, gathered untimed; bias and causal ignored"

    def prepare(self, sets):
        hk = self.kept.size(0)

        def queries(t):  # [1, heads, total_q, d] -> [hk * total_q, heads / hk, d], kv head major
            _, h, n, d = t.shape
            return t[0].view(hk, h // hk, n, d).transpose(1, 2).reshape(hk * n, h // hk, d)

        def keys(t):  # [1, hk * r, total_k, d] -> [hk * kept rows, r, d]: kv head g's kept rows
            _, h, n, d = t.shape
            t = t[0].view(hk, h // hk, n, d)
            return torch.cat([t[g][:, self.kept[g]].transpose(0, 1) for g in range(hk)]).contiguous()

        return [(queries(q), keys(k), keys(v), queries(do)) for q, k, v, do in sets]


class Flex:
    def __init__(self, case, inputs, device):
        self.bias, self.per = inputs.bias, case.heads // case.mask_heads
        self.note = ""
        self.prep = None  # (ms, bytes, note) of the BlockMask build, for the sparse group's masks
        kind = case.mask["kind"] if case.mask is not None else None
        if case.seqlens is not None or kind in ("window", "compress", "key_topk", *BLOCK_LIST_KINDS):

            def build():
                if case.seqlens is not None:
                    return document_block_mask(case, device, inputs.visible)
                if kind in BLOCK_LIST_KINDS:
                    return block_list_mask(case, inputs.kept, device), "from_kv_blocks, full blocks"
                if kind == "key_topk":
                    return flex_block_mask(case, inputs.visible, device), "create_block_mask of kept keys & causal"
                return band_block_mask(case, device)

            # The first build warms up (allocator, kernels); the second is timed.
            first_ms, _ = wall_ms(build, device)
            ms, (self.block_mask, how) = wall_ms(build, device)
            self.prep = (ms, block_mask_bytes(self.block_mask), f"{how}; first build {first_ms:.1f} ms")
        else:
            self.block_mask = flex_block_mask(case, inputs.visible, device)

    def call(self, repeat_kv, bias_grad):  # repeat_kv is always False: flex takes GQA natively
        score_mod, extra = None, []
        if self.bias is not None:
            bias, per = self.bias.detach().requires_grad_(bias_grad), self.per
            extra = [bias] if bias_grad else []
            if bias.dim() == 2:  # a packed batch's key-side bias, [total_k, mask_heads] (key_fraction)

                def score_mod(score, b, h, q_idx, kv_idx):
                    return score + bias[kv_idx, h // per]

            elif bias.size(2) == 1:  # one row for every query (key_topk's key-side bias)

                def score_mod(score, b, h, q_idx, kv_idx):
                    return score + bias[b, h // per, 0, kv_idx]

            else:

                def score_mod(score, b, h, q_idx, kv_idx):
                    return score + bias[b, h // per, q_idx, kv_idx]

        def attend(q, k, v):
            return compiled_flex(q, k, v, score_mod=score_mod, block_mask=self.block_mask, enable_gqa=True)

        return attend, extra


def mask_mod_for(visible, per, causal_offset):
    """mask_mod reading `visible` at mask head h // per (its one row for every query where it has
    one row: key_topk's kept keys), ANDed with bottom-right causal (kv_idx <= q_idx +
    causal_offset) unless causal_offset is None."""
    one_row = visible is not None and visible.size(2) == 1

    def mask_mod(b, h, q_idx, kv_idx):
        causal = None if causal_offset is None else kv_idx <= q_idx + causal_offset
        if visible is None:
            return causal
        keep = visible[b, h // per, 0, kv_idx] if one_row else visible[b, h // per, q_idx, kv_idx]
        return keep if causal is None else keep & causal

    return mask_mod


def wall_ms(fn, device):
    """(ms, fn()) timed on the wall clock, the device synchronized before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) * 1e3, out


def block_mask_bytes(block_mask):
    """Bytes of a BlockMask's index tensors (kv and q, partial and full)."""
    names = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
             "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")  # fmt: skip
    tensors = [getattr(block_mask, n, None) for n in names]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def band_mask_mod(case):
    """The band kinds' mask_mod, of the indices only (SCHEMA.md; the same rule as
    band_visible): sliding window q_idx + offset - kv_idx <= left with bottom-right causal
    kv_idx <= q_idx + offset, or compressed causal kv_idx * cf <= q_idx."""
    if case.mask["kind"] == "compress":
        cf = case.mask["cf"]

        def compress(b, h, q_idx, kv_idx):
            return kv_idx * cf <= q_idx

        return compress
    left, offset, causal = case.mask["left"], case.seqlen_k - case.seqlen_q, case.causal

    def window(b, h, q_idx, kv_idx):
        inside = q_idx + offset - kv_idx <= left
        return inside & (kv_idx <= q_idx + offset) if causal else inside

    return window


def band_block_mask(case, device):
    """(BlockMask, how) of a window or compressed causal, one for every batch and head, as a flex
    user builds it by default: create_block_mask, eager (it materializes the sq x sk mask for a
    moment; compiling it instead took minutes per shape on an H100 with torch 2.11)."""
    mask_mod, sq, sk = band_mask_mod(case), case.seqlen_q, case.seqlen_k
    return create_block_mask(mask_mod, 1, 1, sq, sk, device=device), "create_block_mask"


def block_list_mask(case, kept, device):
    """The BlockMask of kept blocks [b, mask_heads, nq, nk] (BCSR / bitset: every kept block is
    entirely visible, so all are full blocks and no mask_mod runs), broadcast over the heads of
    a mask head. The block size is the case's (flex's BLOCK_SIZE)."""
    block = case.mask["block"]
    kept = kept.to(device)
    if 1 < kept.size(1) < case.heads:  # one mask head per kv head: repeat to the query heads
        kept = kept.repeat_interleave(case.heads // kept.size(1), dim=1)
    full_num = kept.sum(-1, dtype=torch.int32)
    # Kept block indices first, in order (a stable sort of "not kept").
    full_idx = torch.argsort((~kept).to(torch.int8), dim=-1, stable=True).to(torch.int32).contiguous()
    no_partial = torch.zeros_like(full_num)
    return BlockMask.from_kv_blocks(
        no_partial,
        torch.zeros_like(full_idx),
        full_num,
        full_idx,
        BLOCK_SIZE=block,
        seq_lengths=(case.seqlen_q, case.seqlen_k),
    )


def flex_block_mask(case, visible, device):
    """The BlockMask for the case's mask and causal, or None when nothing is hidden."""
    offset = case.seqlen_k - case.seqlen_q if case.causal_applies else None
    if visible is None and offset is None:
        return None
    sq, sk = case.seqlen_q, case.seqlen_k
    b, h = (case.batch, case.mask_heads) if visible is not None else (1, 1)
    mask_mod = mask_mod_for(visible, case.heads // h, offset)
    if h in (1, case.heads):  # a block mask of 1 head broadcasts over the query heads
        return create_block_mask(mask_mod, b, h, sq, sk, device=device)
    # create_block_mask materializes the whole [B, H, sq, sk] mask, so make it over the mask
    # heads (group times smaller) and repeat its block lists to the query heads.
    per_mask_head = create_block_mask(mask_mod_for(visible, 1, offset), b, h, sq, sk, device=device)

    def expand(t):
        return t.repeat_interleave(case.heads // h, dim=1)

    return BlockMask.from_kv_blocks(
        expand(per_mask_head.kv_num_blocks),
        expand(per_mask_head.kv_indices),
        expand(per_mask_head.full_kv_num_blocks),
        expand(per_mask_head.full_kv_indices),
        BLOCK_SIZE=per_mask_head.BLOCK_SIZE,
        mask_mod=mask_mod,
        seq_lengths=(sq, sk),
    )


class Fa2:
    """FlashAttention-2 references of a key_topk case (not its work; see the docstring): over the
    kept keys alone (kept_keys, K and V gathered by prepare, untimed), or dense causal over every
    key; no bias either way, so bias_grad asks for nothing."""

    def __init__(self, case, inputs, device, kept_keys):
        if case.mask is None or case.mask["kind"] != "key_topk":
            raise NotImplementedError("fa2 references are for key_topk cases only")
        self.kept = inputs.kept_keys if kept_keys else None
        self.causal = False if kept_keys else case.causal_applies
        self.native = flash_attn_func is not None
        if not self.native and self.causal and case.seqlen_q != case.seqlen_k:
            raise NotImplementedError("SDPA's is_causal is top-left, the case's causal bottom-right")
        how = f"flash_attn {flash_attn.__version__}" if self.native else "PyTorch's FA2 (SDPA flash backend)"
        if kept_keys:
            self.note = f"floor, not the same work: {how} over the {self.kept.size(-1)} kept keys only, gathered untimed; bias and causal ignored"
        else:
            self.note = f"mask ignored, not the same work: {how} dense causal over all keys, no bias"

    def prepare(self, sets):
        """The operand sets as this reference takes them (outside the timed calls): K and V
        gathered along the kept keys; [b, s, h, d] for flash_attn_func."""
        out = []
        for q, k, v, dout in sets:
            if self.kept is not None:
                k, v = gather_keys(k, self.kept), gather_keys(v, self.kept)
            if self.native:
                q, k, v, dout = (t.transpose(1, 2).contiguous() for t in (q, k, v, dout))
            out.append((q, k, v, dout))
        return out

    def call(self, repeat_kv, bias_grad):
        causal = self.causal
        if self.native:

            def attend(q, k, v):
                return flash_attn_func(q, k, v, causal=causal)

        else:
            gqa = not repeat_kv

            def attend(q, k, v):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa and q.size(1) != k.size(1))

        return attend, []


def gather_keys(t, kept_keys):
    """t [b, heads, sk, d] at each plane's kept keys [b, mask_heads, keep] -> [b, heads, keep, d];
    mask head h // (heads / mask_heads) serves head h (one mask head serves all)."""
    heads, planes = t.size(1), kept_keys.size(1)
    if planes == 1:
        idx = kept_keys.expand(-1, heads, -1)
    else:
        idx = kept_keys.repeat_interleave(heads // planes, dim=1)
    return torch.gather(t, 2, idx[..., None].expand(-1, -1, -1, t.size(3)))


def make_peer(impl, case, inputs, device):
    if impl == "flex":
        return Flex(case, inputs, device)
    if impl in FA2_IMPLS:
        return Fa2(case, inputs, device, kept_keys=impl == "fa2-kept-keys")
    if impl == "fa2-varlen-kept":
        return Fa2VarlenKept(case, inputs, device)
    if impl in VARLEN_IMPLS:
        return Fa2Varlen(case, inputs, device)
    if case.seqlens is not None:
        return PaddedSdpa(case, inputs, device)
    return Sdpa(case, inputs, device)


def backend(impl):
    """The SDPA backend context an implementation runs in (none for flex and flash_attn)."""
    if impl in SDPA_BACKENDS:
        return sdpa_kernel(SDPA_BACKENDS[impl])
    if impl in FA2_IMPLS and flash_attn_func is None:
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    return nullcontext()


def applies(impl, case):
    """Whether `impl` runs on `case`: the fa2 references on key_topk cases only, fa2-varlen on
    packed cases only and fa2-varlen-kept on packed key_fraction ones; on select cases only their
    output's peer (torch-topk for index lists, torch-create-mask for a bool mask)."""
    if is_select(case):
        return impl == ("torch-topk" if case.mask["output"] == "indices" else "torch-create-mask")
    if impl in SELECT_IMPLS:
        return False
    if impl == "fa2-varlen-kept":
        return case.seqlens is not None and case.mask is not None and case.mask["kind"] == "key_fraction"
    if impl in VARLEN_IMPLS:
        return case.seqlens is not None
    return impl not in FA2_IMPLS or (case.mask is not None and case.mask["kind"] == "key_topk")


# ---------------------------------------------------------------------------------------------
# Key selection (select cases: no attention)


def is_select(case):
    return case.mask is not None and case.mask["kind"] == "select"


@dataclass
class SelectInputs:
    biases: list  # rotated bias sets, [b, mask_heads, 1 or sq, sk] N(0, 1)
    causal: torch.Tensor | None  # within_causal: [1, 1, sq, sk] bool, built once


def select_bias_shape(case):
    """cases.rs's Case::select_bias_shape: one bias row per query, or one for every query."""
    rows = case.seqlen_q if case.mask["rows"] == "per_query" else 1
    return (case.batch, case.mask_heads, rows, case.seqlen_k)


# On the hidden --device cpu (which tests this script), larger select cases are skipped.
CPU_SELECT_BYTES = 64 << 20


def select_read_bytes(case, dtype):
    """Bytes of the bias and of within_causal's bool mask (cases.rs's Case::select_bytes)."""
    causal = case.seqlen_q * case.seqlen_k if case.mask["within_causal"] else 0
    return math.prod(select_bias_shape(case)) * dtype.itemsize + causal


def select_inputs(case, dtype, device):
    """A select case's operands as dmattn-bench makes them (not the same values: N(0, 1) on each
    side): the bias, rotated over sets spanning 256 MiB (one for a bias that large), and the
    causal mask of within_causal, shared by the sets."""
    shape = select_bias_shape(case)
    bias_bytes = math.prod(shape) * dtype.itemsize
    n_sets = min(max(-(-ROTATION_BYTES // bias_bytes), 1), 4)
    biases = [torch.randn(shape, dtype=dtype, device=device) for _ in range(n_sets)]
    causal = causal_visible(case, device)[None, None] if case.mask["within_causal"] else None
    return SelectInputs(biases, causal)


def select_step(impl, keep, causal, chunk_rows=None):
    """step(bias) of a select peer: torch-topk's (values, indices), or torch-create-mask's bool
    mask, as Flash-DMA's create_mask computes them (within causal: the hidden scores filled with
    the dtype's minimum first, a key kept where selected and not at that minimum). chunk_rows:
    the same over row chunks (the fallback where the whole tensor does not fit)."""

    def step(bias):
        low = torch.finfo(bias.dtype).min
        shape = bias.shape if causal is None else torch.broadcast_shapes(bias.shape, causal.shape)
        n = shape[2]
        spans = [slice(None)] if chunk_rows is None else [slice(r, min(r + chunk_rows, n)) for r in range(0, n, chunk_rows)]
        mask, lists = None, []
        for rows in spans:
            scores = bias[:, :, rows] if causal is None else bias.masked_fill(~causal[:, :, rows], low)
            values, indices = torch.topk(scores, keep, dim=-1, sorted=False)
            if impl == "torch-topk":
                lists.append((values, indices))
                continue
            if mask is None:
                mask = torch.zeros(shape, dtype=torch.bool, device=bias.device)
            mask[:, :, rows].scatter_(-1, indices, True if causal is None else values != low)
        return lists if impl == "torch-topk" else mask

    return step


def run_select(impl, case, inputs, timer, report, over_budget):
    """Times and reports one select peer on one case (pass fwd): the whole tensor at once, and
    where that is oom, in row chunks of TOPK_CHUNK_ELEMS scores."""
    if over_budget():
        report.add(case, impl, "fwd", "skipped", note="time budget")
        return
    keep, biases = case.mask["keep"], inputs.biases
    shape = biases[0].shape if inputs.causal is None else torch.broadcast_shapes(biases[0].shape, inputs.causal.shape)
    chunk_rows = max(1, TOPK_CHUNK_ELEMS // (shape[0] * shape[1] * shape[3]))

    def measure(chunked):
        step = select_step(impl, keep, inputs.causal, chunk_rows if chunked else None)
        ms = timer.median_ms(lambda i: step(biases[i % len(biases)]))
        return ms, f"in chunks of {chunk_rows} rows" if chunked else ""

    result, failure = attempt(lambda: measure(False))
    if failure is not None and failure[0] == "oom" and chunk_rows < shape[2]:
        whole = failure[1]
        result, failure = attempt(lambda: measure(True))
        if failure is None:
            result = (result[0], join(result[1], f"whole tensor: {whole}"[:NOTE_CHARS]))
    if failure is None:
        report.add(case, impl, "fwd", "ok", result[0], result[1])
    else:
        report.add(case, impl, "fwd", failure[0], note=failure[1])


# ---------------------------------------------------------------------------------------------
# Timing


@dataclass
class Timer:
    warmup: int
    reps: int
    device: torch.device

    def median_ms(self, step):
        """Median ms of step(i) over `reps` calls after `warmup` untimed ones; i rotates sets."""
        for i in range(self.warmup):
            step(i)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        times = sorted(self.once_ms(step, self.warmup + i) for i in range(self.reps))
        return times[len(times) // 2]

    def once_ms(self, step, i):
        if self.device.type != "cuda":  # the hidden --device cpu, to test this script
            t0 = time.perf_counter()
            step(i)
            return (time.perf_counter() - t0) * 1e3
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(i)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)


def forward_ms(attend, sets, timer):
    return timer.median_ms(lambda i: attend(*sets[i % len(sets)][:3]))


def backward_ms(attend, extra, sets, timer):
    graphs = []
    for q, k, v, dout in sets:
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        graphs.append((attend(q, k, v), (q, k, v, *extra), dout))

    def step(i):
        out, wrt, dout = graphs[i % len(graphs)]
        torch.autograd.grad(out, wrt, dout, retain_graph=True)

    return timer.median_ms(step)


# ---------------------------------------------------------------------------------------------
# Failures


UNSUPPORTED_MARKERS = (
    "no available kernel",
    "no viable backend",
    "not supported",
    "does not support",
    "unsupported",
    "only supports",
)


def attempt(fn):
    """(fn(), None), or (None, (status, note)) if it fails."""
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            return fn(), None
        except Exception as exc:  # every failure is a result
            failure = classify(exc, warned)
    free_memory()  # outside the except block, once the traceback no longer holds the tensors
    return None, failure


def classify(exc, warned):
    """(status, note) of a failure; `warned` are the warnings raised meanwhile, in which SDPA
    gives its reasons for 'No available kernel'."""
    chain = [exc]
    while chain[-1].__cause__ is not None:  # compile errors wrap the one that counts
        chain.append(chain[-1].__cause__)
    text = "\n".join(str(e) for e in chain).lower()
    what = summary(chain)
    if any(isinstance(e, torch.OutOfMemoryError) for e in chain) or "out of memory" in text:
        return "oom", what
    if any(isinstance(e, NotImplementedError) for e in chain) or any(m in text for m in UNSUPPORTED_MARKERS):
        reasons = dict.fromkeys(r for r in map(sdpa_reason, warned) if r)  # dedup, in order
        return "unsupported", "; ".join([what, *reasons])[:NOTE_CHARS]
    return "error", f"{type(chain[-1]).__name__}: {what}"


def summary(chain):
    """The line saying what went wrong: where dynamo wraps an error raised while tracing, its
    'Developer debug context' (its first line is only 'Observed exception'); else the first
    line of the innermost error."""
    for exc in chain:
        for line in str(exc).splitlines():
            if line.strip().startswith("Developer debug context:"):
                return line.split(":", 1)[1].strip()[:NOTE_CHARS]
    return first_line(chain[-1])


def sdpa_reason(warning):
    """A reason SDPA gives for rejecting the pinned backend (a warning from its C++ checks), or
    None. It also says that every other backend is disabled: those lines are dropped."""
    text = str(warning.message)
    if "Triggered internally" not in text:
        return None
    text = text.split("(Triggered internally", 1)[0].strip()
    return None if text.endswith("because:") or "runtime disabled" in text else text


def first_line(exc):
    line = next((s.strip() for s in str(exc).splitlines() if s.strip()), type(exc).__name__)
    return line[:NOTE_CHARS]


def free_memory():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def join(*notes):
    return "; ".join(n for n in notes if n)


# ---------------------------------------------------------------------------------------------
# The run


@dataclass(frozen=True)
class Try:
    """One way of running a pass; the later ones are fallbacks for an 'unsupported' earlier one."""

    repeat_kv: bool
    dbias: bool | None  # None where there is no bias gradient to ask for

    @property
    def note(self):
        return join("kv repeated" if self.repeat_kv else "", "no dbias" if self.dbias is False else "")


def first_supported(tries, measure):
    """(status, ms, note, try) of the first try whose measure(try) -> (ms, note) is not
    'unsupported', or of the last try; a fallback's note keeps why the first try was rejected."""
    first_reason = None
    for t in tries:
        result, failure = attempt(functools.partial(measure, t))
        if failure is None:
            ms, note = result
            return "ok", ms, join(t.note, note, first_reason and f"first try: {first_reason}"), t
        if failure[0] != "unsupported":
            break
        first_reason = first_reason or failure[1]
    status, reason = failure
    earlier = first_reason if first_reason != reason else None
    return status, None, join(t.note, reason, earlier and f"first try: {earlier}"), t


def run_impl(impl, case, inputs, timer, report, over_budget, device):
    """Times and reports every pass of one peer on one case."""
    if over_budget():
        for p in case.passes():
            report.add(case, impl, p, "skipped", note="time budget")
        return
    peer = functools.cache(lambda: make_peer(impl, case, inputs, device))
    group = case.heads // case.kv_heads
    # flex takes GQA natively; an SDPA backend that rejects enable_gqa gets k/v repeated.
    layouts = [False, True] if impl != "flex" and group > 1 else [False]
    dbias = [True, False] if inputs.bias is not None else [None]

    def sets_for(t):
        sets = inputs.sets
        if t.repeat_kv:
            sets = [
                (q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), do)
                for q, k, v, do in sets
            ]
        prepare = getattr(peer(), "prepare", None)  # untimed per-peer layout (fa2 references)
        return prepare(sets) if prepare is not None else sets

    def forward(t):
        attend, _ = peer().call(t.repeat_kv, bias_grad=False)
        return forward_ms(attend, sets_for(t), timer), peer().note

    def backward(t):
        attend, extra = peer().call(t.repeat_kv, bias_grad=bool(t.dbias))
        return backward_ms(attend, extra, sets_for(t), timer), peer().note

    with backend(impl):
        fwd_tries = [Try(rep, None) for rep in layouts]
        status, ms, note, used = first_supported(fwd_tries, forward)
        report.add(case, impl, "fwd", status, ms, note)
        if peer.cache_info().currsize and getattr(peer(), "prep", None) is not None:
            prep_ms, nbytes, prep_note = peer().prep
            report.add(case, impl, "prep", "ok", prep_ms, prep_note, nbytes)
        if not case.backward:
            return
        if status != "ok":
            report.add(case, impl, "bwd", "skipped", note="forward failed")
            return
        if over_budget():
            report.add(case, impl, "bwd", "skipped", note="time budget")
            return
        # dbias before native GQA: dropping dbias changes the work, repeating k/v does not.
        bwd_tries = [Try(rep, grad) for grad in dbias for rep in layouts[layouts.index(used.repeat_kv) :]]
        status, ms, note, _ = first_supported(bwd_tries, backward)
        report.add(case, impl, "bwd", status, ms, note)


def run_case(case, impls, dtype, timer, report, over_budget, device):
    impls = [i for i in impls if applies(i, case)]
    if over_budget():
        for impl in impls:
            for p in case.passes():
                report.add(case, impl, p, "skipped", note="time budget")
        return
    select = is_select(case)
    if select and device.type != "cuda" and select_read_bytes(case, dtype) > CPU_SELECT_BYTES:
        for impl in impls:
            report.add(case, impl, "fwd", "skipped", note="too large for the CPU self-test")
        return
    # Seeded by the case, so that its data does not depend on which other cases run.
    torch.manual_seed(zlib.crc32(case.id.encode()))
    inputs, failure = attempt(lambda: (select_inputs if select else make_inputs)(case, dtype, device))
    for impl in impls:
        if failure is not None:
            report.add(case, impl, "fwd", failure[0], note=join("making inputs", failure[1]))
            if case.backward:
                report.add(case, impl, "bwd", "skipped", note="forward failed")
        elif select:
            run_select(impl, case, inputs, timer, report, over_budget)
        else:
            run_impl(impl, case, inputs, timer, report, over_budget, device)
        free_memory()


class Report:
    """peers.json as it grows; rewritten after each case."""

    def __init__(self, path, device, start):
        self.path, self.start = path, start
        self.doc = {
            "tool": "peers",
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
            "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "versions": versions(),
            "results": [],
        }

    def add(self, case, impl, pass_, status, ms=None, note="", nbytes=None):
        record = {"case": case.id, "impl": impl, "pass": pass_, "status": status, "ms": ms, "note": note}
        if nbytes is not None:
            record["bytes"] = nbytes
        self.doc["results"].append(record)
        shown = f"{ms:.4f} ms" if ms is not None else status
        elapsed = time.monotonic() - self.start
        print(
            f"[{elapsed:7.0f}s] {case.id} {impl} {pass_}: {shown}" + (f" ({note})" if note else ""),
            flush=True,
        )

    def write(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.doc, f, indent=1)
            f.write("\n")
        os.replace(tmp, self.path)  # a killed run leaves the last whole file, never half of one


def versions():
    found = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if flash_attn is not None:
        found["flash_attn"] = flash_attn.__version__
    try:
        import triton

        found["triton"] = triton.__version__
    except ImportError:
        pass
    return {k: v for k, v in found.items() if v}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", required=True, help="cases.json written by dmattn-bench --out DIR")
    ap.add_argument("--out", required=True, help="peers.json to write")
    ap.add_argument(
        "--impls",
        type=csv(IMPLS),
        default=IMPLS,
        help=f"comma-separated, of {','.join(IMPLS)} (default: all)",
    )
    ap.add_argument("--groups", type=csv(), help="comma-separated case groups to run (default: all)")
    ap.add_argument(
        "--max-seconds", type=float, default=math.inf, help="past this, the rest is reported skipped"
    )
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: tests this script
    return ap.parse_args()


def csv(allowed=None):
    def parse(text):
        items = [s for s in text.split(",") if s]
        bad = [s for s in items if allowed is not None and s not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(bad)} (choose from {', '.join(allowed)})")
        return items

    return parse


def main():
    args = parse_args()
    start = time.monotonic()
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    with open(args.cases) as f:
        grid = json.load(f)
    cases = [Case.parse(c) for c in grid["cases"]]
    if args.groups is not None:
        cases = [c for c in cases if c.group in args.groups]
    timer = Timer(grid["warmup"], grid["reps"], device)
    report = Report(args.out, device, start)
    print(
        f"{report.doc['gpu']}, {report.doc['versions']}: {len(cases)} cases x {','.join(args.impls)}",
        flush=True,
    )

    def over_budget():
        return time.monotonic() - start > args.max_seconds

    report.write()
    for case in cases:
        run_case(case, args.impls, DTYPES[grid["dtype"]], timer, report, over_budget, device)
        report.write()
        free_memory()


if __name__ == "__main__":
    main()
