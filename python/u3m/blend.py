"""KV fusion for RAG (CacheBlend, EuroSys'25) on the repo's LLaMA-shaped decoder
(python/u3m_capture/model.py): reuse each retrieved passage's KV cache at any position,
fix its positions, recompute a small fraction of its tokens, keep the rest.

    seg = [segment_kv(model, t) for t in segments]          # each prefilled alone, from 0
    res = blend_prefill(model, segments, 0.15, query=question, cached=seg)
    res.logits, res.cache, res.stats                        # next-token logits, fused KV, work done

Pure torch plus u3m_capture.model: no import of the compiled u3m._core, so the file can be
loaded as a standalone module where the extension is not built (see `load_standalone` in
tests/python/test_blend.py and examples/rag_quality.py). Measured quality: docs/blend-quality.md.

Note [Blend]
~~~~~~~~~~~~
A RAG prompt is [system][passage 1]...[passage k][question]. A cache holds each passage's
KV as it was computed when the passage was prefilled on its own, from position 0. Reusing it
inside another prompt is wrong in two ways:

  1. Position. The cached keys carry RoPE for positions 0..T-1, the passage now sits at
     p..p+T-1. RoPE rotates every (i, i + D/2) pair of a key by angle pos * f_i, and
     rotations of one plane compose, R(a + b) = R(b) R(a), so rotating the cached key by the
     delta p (`rerotate_keys`) gives the key at its new position exactly, up to float
     rounding; values carry no position. Layer 0's K/V depend on the token and position
     only, so after re-rotation layer 0 is what a full prefill computes (tested).
  2. Cross-attention. From layer 1 on, a token's K/V depend on the tokens it attended to in
     lower layers; in the cache those were only its own passage's, in the prompt they are
     the system prompt and the earlier passages too. Re-rotation cannot repair that; only
     recomputation can.

CacheBlend recomputes a small set of tokens, the ones whose KV deviates most from what a
full prefill would hold, and keeps the cached KV of the rest. It finds them without
computing the full prefill: it runs layer 0 for every reused token (cheap, one layer), then
layer 1's K/V projection, and compares those with the cached layer-1 K/V; the tokens with
the largest deviation (here: squared L2 of K and V together) are the selection, and only they
(with the question) go through layers 1..L-1, attending over the fused cache in which
their own K/V are replaced by the recomputed ones at every layer they pass. So
`recompute_fraction` 1.0 is a full prefill (every token recomputed: same logits up to
rounding), 0 is pure reuse (only re-rotation).

The first segment starts at position 0 in both places, and its tokens attend only to
themselves, so its cached KV is exactly a full prefill's: it is reused as is, never
re-rotated, never a candidate for recomputation ("exact mode"); the fraction counts the
other segments' tokens only: round(fraction * non-first tokens) tokens are recomputed.
The question's tokens are new, so they are computed in every layer (as any prefill of the
uncached suffix would).

`BlendStats` counts the work in token-layers (one token through one decoder layer) and,
separately, the layer-1 K/V projections made only to select, so a cost model's charge for
blending (layers 0 and 1 for the reused tokens, the selected ones in layers 2..) can be
compared with what was computed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F

from u3m_capture.model import Decoder, KVCache, ModelConfig, apply_rope, repeat_kv

__all__ = ["SegmentKV", "BlendStats", "BlendResult", "rope_cos_sin", "rerotate_keys",
           "segment_kv", "n_recompute", "full_prefill", "blend_prefill"]


@dataclass
class SegmentKV:
    """A segment's KV as a cache holds it: prefilled alone from position 0.
    k[l], v[l]: [T, n_kv_heads, head_dim]; keys carry RoPE for positions 0..T-1."""
    tokens: torch.Tensor
    k: List[torch.Tensor]
    v: List[torch.Tensor]

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


@dataclass
class BlendStats:
    """The work one blend_prefill did.

    prompt_tokens      all tokens of the prompt (segments + question)
    reused_tokens      tokens of the non-first segments (candidates for recomputation)
    recomputed_tokens  of those, recomputed in layers 1..L-1 (= n_recompute(fraction, reused))
    token_layers       token-layer computations done (a full prefill does prompt_tokens * L)
    selection_kv       layer-1 K/V projections made only to select (not followed by attention)
    per_layer          tokens computed in each layer
    selected           prompt positions of the recomputed tokens, ascending
    """
    prompt_tokens: int
    reused_tokens: int
    recomputed_tokens: int
    token_layers: int
    selection_kv: int
    per_layer: List[int] = field(default_factory=list)
    selected: List[int] = field(default_factory=list)


@dataclass
class BlendResult:
    cache: KVCache  # batch 1; positions 0..prompt_tokens-1 hold the fused KV of every layer
    logits: torch.Tensor  # [vocab] next-token logits after the last question token
    stats: BlendStats


def rope_cos_sin(cfg: ModelConfig, positions: torch.Tensor) -> tuple:
    """cos/sin [T, head_dim] (rotate-half layout, as rope_tables) for arbitrary positions,
    including deltas and positions past max_seq_len."""
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rerotate_keys(cfg: ModelConfig, k: torch.Tensor, delta: int) -> torch.Tensor:
    """Keys [T, Hkv, D] RoPE'd at positions j -> the same keys at j + delta (Note [Blend], 1).
    delta 0 is the identity, exactly (cos 0 = 1, sin 0 = 0)."""
    cos, sin = rope_cos_sin(cfg, torch.full((k.shape[0],), float(delta)))
    return apply_rope(k[None], cos, sin)[0]


@torch.no_grad()
def segment_kv(model: Decoder, tokens: torch.Tensor) -> SegmentKV:
    """Prefills `tokens` [T] alone from position 0 and returns its KV (what a cache stores)."""
    t = int(tokens.shape[0])
    cache = KVCache(model.cfg, 1, t)
    model(tokens[None], 0, cache)
    return SegmentKV(tokens.clone(), [k[0].clone() for k in cache.k], [v[0].clone() for v in cache.v])


def n_recompute(fraction: float, reused_tokens: int) -> int:
    """How many reused tokens blend_prefill recomputes: round(fraction * reused_tokens)."""
    if not 0.0 <= fraction <= 1.0 or math.isnan(fraction):
        raise ValueError(f"blend: recompute_fraction must be in [0, 1], got {fraction}")
    return int(round(fraction * reused_tokens))


@torch.no_grad()
def full_prefill(model: Decoder, tokens: torch.Tensor) -> tuple:
    """The reference: one prefill of the whole prompt [P]. Returns (KVCache, last logits [vocab])."""
    cache = KVCache(model.cfg, 1, int(tokens.shape[0]))
    logits = model(tokens[None], 0, cache)[0, -1]
    return cache, logits


def _attend(model: Decoder, layer_idx: int, x: torch.Tensor, pos: torch.Tensor, cache: KVCache,
            end: int) -> torch.Tensor:
    """One decoder layer for the tokens at positions `pos` [N] (ascending) with inputs x [N, d];
    their K/V are written into `cache` first, then they attend over cache positions 0..end-1
    with a causal mask by position. Returns the layer's output [N, d]."""
    layer = model.layers[layer_idx]
    attn, cfg = layer.attn, model.cfg
    n = x.shape[0]
    h = layer.attn_norm(x)[None]
    cos, sin = model.rope_cos[pos], model.rope_sin[pos]
    q = apply_rope(attn.q_proj(h).view(1, n, cfg.n_heads, cfg.head_dim), cos, sin)
    k = apply_rope(attn.k_proj(h).view(1, n, cfg.n_kv_heads, cfg.head_dim), cos, sin)
    v = attn.v_proj(h).view(1, n, cfg.n_kv_heads, cfg.head_dim)
    cache.k[layer_idx][0, pos] = k[0]
    cache.v[layer_idx][0, pos] = v[0]
    keys = repeat_kv(cache.k[layer_idx][:, :end], attn.core.n_rep).transpose(1, 2)  # [1, H, S, D]
    vals = repeat_kv(cache.v[layer_idx][:, :end], attn.core.n_rep).transpose(1, 2)
    scores = torch.matmul(q.transpose(1, 2), keys.transpose(-2, -1)) * attn.core.scale  # [1, H, N, S]
    mask = torch.arange(end)[None, :] > pos[:, None]  # key after query: hidden
    scores = scores.masked_fill(mask, float("-inf"))
    out = torch.matmul(F.softmax(scores.float(), dim=-1).type_as(q), vals)  # [1, H, N, D]
    hid = x + attn.o_proj(out.transpose(1, 2).reshape(1, n, cfg.n_heads * cfg.head_dim))[0]
    return hid + layer.mlp(layer.mlp_norm(hid))


@torch.no_grad()
def blend_prefill(model: Decoder, segments: Sequence[torch.Tensor], recompute_fraction: float, *,
                  query: torch.Tensor, cached: Optional[Sequence[SegmentKV]] = None,
                  max_len: Optional[int] = None, selection: str = "deviation",
                  generator: Optional[torch.Generator] = None) -> BlendResult:
    """Prefill of [segments..., query] from the segments' own cached KV (Note [Blend]).

    segments: 1-D token tensors; the first is reused exactly, the others re-rotated to their
    positions and `recompute_fraction` of their tokens recomputed (selected by layer-1 KV
    deviation). query: the new tokens (>= 1), computed in full; the logits are the last one's.
    cached: the segments' SegmentKV (default: computed here with segment_kv). max_len: the
    returned cache's length (default: the prompt's), room for decoding after it.
    selection: "deviation" (CacheBlend's) or "random" (as many tokens drawn with `generator`:
    the baseline that shows what the selection is worth).
    """
    cfg = model.cfg
    if selection not in ("deviation", "random"):
        raise ValueError(f"blend_prefill: selection must be 'deviation' or 'random', got {selection!r}")
    if len(segments) < 1:
        raise ValueError("blend_prefill: needs at least one segment")
    if query is None or query.dim() != 1 or query.shape[0] < 1:
        raise ValueError("blend_prefill: query must be a non-empty 1-D token tensor")
    if cached is None:
        cached = [segment_kv(model, s) for s in segments]
    if len(cached) != len(segments):
        raise ValueError(f"blend_prefill: {len(cached)} cached segments for {len(segments)} segments")
    for s, c in zip(segments, cached):
        if not torch.equal(s, c.tokens):
            raise ValueError("blend_prefill: a cached segment's tokens differ from its segment's")
    lengths = [len(c) for c in cached]
    first, reused, nq = lengths[0], sum(lengths[1:]), int(query.shape[0])
    total = first + reused + nq
    cache = KVCache(cfg, 1, max_len or total)
    if total > cache.max_len:
        raise ValueError(f"blend_prefill: prompt of {total} tokens exceeds max_len {cache.max_len}")
    n_sel = n_recompute(recompute_fraction, reused)

    # Fuse: first segment as is, the others re-rotated from 0.. to their offsets.
    offset = 0
    for c in cached:
        t = len(c)
        for layer in range(cfg.n_layers):
            k = c.k[layer] if offset == 0 else rerotate_keys(cfg, c.k[layer], offset)
            cache.k[layer][0, offset : offset + t] = k
            cache.v[layer][0, offset : offset + t] = c.v[layer]
        offset += t
    tokens = torch.cat([*segments, query])
    q_pos = torch.arange(first + reused, total)
    per_layer: List[int] = []
    selection_kv = 0
    selected = torch.empty(0, dtype=torch.long)
    if n_sel == 0:
        # Pure reuse: only the question goes through the layers.
        pos = q_pos
        x = model.embed(tokens[pos])
        for layer in range(cfg.n_layers):
            x = _attend(model, layer, x, pos, cache, total)
            per_layer.append(int(pos.shape[0]))
    else:
        # Layer 0 for every reused token and the question.
        pos = torch.arange(first, total)
        x = model.embed(tokens[pos])
        x = _attend(model, 0, x, pos, cache, total)
        per_layer.append(int(pos.shape[0]))
        if cfg.n_layers > 1:
            # Selection at layer 1: K/V of the reused tokens from their recomputed layer-0
            # output, against the fused cache's (cached, re-rotated) layer-1 K/V.
            attn = model.layers[1].attn
            h = model.layers[1].attn_norm(x[:reused])[None]
            r_pos = pos[:reused]
            cos, sin = model.rope_cos[r_pos], model.rope_sin[r_pos]
            k_new = apply_rope(attn.k_proj(h).view(1, reused, cfg.n_kv_heads, cfg.head_dim), cos, sin)[0]
            v_new = attn.v_proj(h).view(reused, cfg.n_kv_heads, cfg.head_dim)
            dev = ((k_new - cache.k[1][0, r_pos]) ** 2).sum((1, 2)) + ((v_new - cache.v[1][0, r_pos]) ** 2).sum((1, 2))
            if selection == "random":
                top = torch.randperm(reused, generator=generator)[:n_sel].sort().values
            else:
                top = torch.topk(dev, n_sel).indices.sort().values
            selection_kv = reused - n_sel
            keep = torch.cat([top, torch.arange(reused, reused + nq)])
            pos, x = pos[keep], x[keep]
            for layer in range(1, cfg.n_layers):
                x = _attend(model, layer, x, pos, cache, total)
                per_layer.append(int(pos.shape[0]))
            selected = r_pos[top]
        else:
            # One layer: no layer 1 to select at; layer 0 (just recomputed for every reused
            # token, with their cached KV exact after re-rotation anyway) is the whole blend.
            selected = pos[:reused][:n_sel]
    logits = model.lm_head(model.norm(x[-1:]))[0]
    stats = BlendStats(prompt_tokens=total, reused_tokens=reused, recomputed_tokens=n_sel,
                       token_layers=sum(per_layer), selection_kv=selection_kv, per_layer=per_layer,
                       selected=[int(p) for p in selected])
    return BlendResult(cache=cache, logits=logits, stats=stats)
