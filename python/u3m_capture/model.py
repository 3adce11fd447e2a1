"""A small LLaMA-shaped decoder in plain PyTorch (works with torch 1.13).

Pieces: token embedding, N x [RMSNorm -> causal self-attention with rotary
position embeddings (RoPE) and optional grouped-query attention (GQA) ->
residual -> RMSNorm -> SwiGLU MLP -> residual], final RMSNorm, untied LM head.

Generation uses a preallocated KV cache (`KVCache`): prefill writes the
prompt's keys/values, each decode step appends one position and attends over
the cached prefix. `generate` and the training losses at the bottom are what
the capture workloads drive; they are written to be reusable by anything that
needs real training and generation traffic from a LLaMA-like model.

The module tree is deliberately regular so module paths name the same thing in
every step: `embed`, `layers.<i>.{attn_norm,attn.{q,k,v,o}_proj,attn.core,
mlp_norm,mlp.{gate,up,down}_proj}`, `norm`, `lm_head`.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass
from typing import Callable, ContextManager, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class ModelConfig:
    vocab_size: int = 512
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2  # < n_heads means grouped-query attention
    ffn_hidden: int = 344  # ~ 8/3 * d_model rounded up to a multiple of 8, as in LLaMA
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for field in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden", "max_seq_len"):
            if getattr(self, field) <= 0:
                raise ValueError(f"ModelConfig.{field} must be positive, got {getattr(self, field)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"ModelConfig: d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"ModelConfig: n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig: head_dim {self.head_dim} must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 whatever the activation dtype, as LLaMA does.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


def rope_tables(cfg: ModelConfig) -> tuple:
    """cos/sin tables [max_seq_len, head_dim] in the rotate-half layout."""
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
    t = torch.arange(cfg.max_seq_len, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, H, D]; cos/sin: [T, D] for the positions of x."""
    cos = cos[None, :, None, :]
    sin = sin[None, :, None, :]
    return x * cos + rotate_half(x) * sin


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, S, Hkv, D] -> [B, S, Hkv * n_rep, D]: shares each KV head among n_rep query heads (GQA)."""
    if n_rep == 1:
        return x
    b, s, h, d = x.shape
    return x[:, :, :, None, :].expand(b, s, h, n_rep, d).reshape(b, s, h * n_rep, d)


class AttentionCore(nn.Module):
    """softmax(Q K^T / sqrt(d) + causal mask) V, with GQA head sharing.

    A module of its own (no parameters) so tools that watch module boundaries,
    like the trace capture, can tell attention arithmetic from projections:
    `trace_op_class` is that hint.
    """

    trace_op_class = "attention"

    def __init__(self, n_rep: int, head_dim: int):
        super().__init__()
        self.n_rep = n_rep
        self.scale = 1.0 / math.sqrt(head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start_pos: int) -> torch.Tensor:
        # q: [B, T, H, D] at positions start_pos..start_pos+T-1; k, v: [B, S, Hkv, D] at 0..S-1.
        b, t, h, d = q.shape
        s = k.shape[1]
        k = repeat_kv(k, self.n_rep)
        v = repeat_kv(v, self.n_rep)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        if t > 1:
            # Query i sits at position start_pos + i and may see keys 0..start_pos + i.
            mask = torch.ones(t, s, dtype=torch.bool, device=q.device).triu(start_pos + 1)
            scores = scores.masked_fill(mask, float("-inf"))
        probs = F.softmax(scores.float(), dim=-1).type_as(q)
        out = torch.matmul(probs, v)  # [B, H, T, D]
        return out.transpose(1, 2).reshape(b, t, h * d)


class KVCache:
    """Preallocated per-layer key/value buffers, [batch, max_len, n_kv_heads, head_dim] each.

    The sequence axis comes right after the batch axis so that one request's
    block of positions is one contiguous range of memory (what a paged cache
    would hold as a block).
    """

    def __init__(self, cfg: ModelConfig, batch: int, max_len: int, dtype=torch.float32, device=None):
        if max_len > cfg.max_seq_len:
            raise ValueError(f"KVCache: max_len {max_len} exceeds the model's max_seq_len {cfg.max_seq_len}")
        shape = (batch, max_len, cfg.n_kv_heads, cfg.head_dim)
        self.batch, self.max_len = batch, max_len
        # Positions 0..cached_prefix-1 of every row already hold their KV (a cache that found
        # them stored, e.g. u3m.kv_cache.TieredKVCache(skip_prefix=True)): prefill starts there.
        self.cached_prefix = 0
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]

    def update(self, layer: int, start_pos: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple:
        """Writes positions start_pos.. of `layer`; returns views of positions 0..end."""
        end = start_pos + k_new.shape[1]
        if end > self.max_len:
            raise ValueError(f"KVCache: position {end} is past the cache length {self.max_len}")
        self.k[layer][:, start_pos:end] = k_new
        self.v[layer][:, start_pos:end] = v_new
        return self.k[layer][:, :end], self.v[layer][:, :end]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        self.core = AttentionCore(cfg.n_heads // cfg.n_kv_heads, cfg.head_dim)

    def forward(self, x, cos, sin, start_pos: int, cache: Optional[KVCache]):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(self.layer_idx, start_pos, k, v)
        return self.o_proj(self.core(q, k, v, start_pos))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, layer_idx)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x, cos, sin, start_pos: int, cache: Optional[KVCache]):
        h = x + self.attn(self.attn_norm(x), cos, sin, start_pos, cache)
        return h + self.mlp(self.mlp_norm(h))


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, tokens: torch.Tensor, start_pos: int = 0, cache: Optional[KVCache] = None) -> torch.Tensor:
        """tokens [B, T] at positions start_pos..start_pos+T-1 -> logits [B, T, vocab]."""
        t = tokens.shape[1]
        if start_pos + t > self.cfg.max_seq_len:
            raise ValueError(f"Decoder: position {start_pos + t} exceeds max_seq_len {self.cfg.max_seq_len}")
        cos = self.rope_cos[start_pos : start_pos + t]
        sin = self.rope_sin[start_pos : start_pos + t]
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin, start_pos, cache)
        return self.lm_head(self.norm(x))


# ---------------------------------------------------------------------------
# Losses and generation

def lm_loss(model: Decoder, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy over a batch of sequences [B, T]."""
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def policy_gradient_loss(model: Decoder, sequences: torch.Tensor, prompt_len: int,
                         advantages: torch.Tensor) -> torch.Tensor:
    """REINFORCE loss on the generated part of `sequences` [B, P+N]:
    -mean(advantage * log p(completion token)). advantages: [B]."""
    logits = model(sequences[:, :-1])
    logp = F.log_softmax(logits.float(), dim=-1)
    taken = logp.gather(-1, sequences[:, 1:, None]).squeeze(-1)  # [B, P+N-1]
    completion = taken[:, prompt_len - 1 :]
    return -(advantages[:, None] * completion).mean()


StepContext = Callable[[str, int], ContextManager]


def _no_context(phase: str, index: int) -> ContextManager:
    return contextlib.nullcontext()


def _sample(logits: torch.Tensor, temperature: float, generator: Optional[torch.Generator]) -> torch.Tensor:
    if temperature == 0:
        return logits.argmax(-1)
    probs = F.softmax(logits / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


@torch.no_grad()
def generate(model: Decoder, prompts: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
             generator: Optional[torch.Generator] = None, step_context: StepContext = _no_context,
             make_cache: Optional[Callable[[int, int], KVCache]] = None,
             return_logits: bool = False):
    """Autoregressive generation with a KV cache for a batch of equal-length prompts [B, P].

    One prefill call over the prompts, then one decode call per further token.
    The output sequences live in one preallocated [B, P+N] buffer and each step
    reads its input tokens from it, so no step's tensors outlive the step.
    `step_context(phase, index)` wraps each model call together with the
    sampling that follows it (phase "prefill" or "decode"), so callers can
    attribute the work; `make_cache(batch, max_len)` lets them see the cache
    being built. temperature 0 means greedy. Returns the sequences [B, P+N]
    and, with return_logits, the list of next-token logits [B, vocab] per step.
    """
    if max_new_tokens < 1:
        raise ValueError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}")
    b, p = prompts.shape
    total = p + max_new_tokens
    cache = make_cache(b, total) if make_cache else KVCache(model.cfg, b, total, device=prompts.device)
    step_logits: List[torch.Tensor] = []
    seq = None
    for i in range(max_new_tokens):
        with step_context("prefill" if i == 0 else "decode", i):
            if seq is None:
                seq = prompts.new_empty((b, total))
                seq[:, :p] = prompts
            # Prefill reads positions cached_prefix..p-1 (the cache holds the KV before them;
            # at least the last prompt token is computed, for its logits); decode step i reads
            # the token at p+i-1.
            start = min(getattr(cache, "cached_prefix", 0), p - 1) if i == 0 else p + i - 1
            logits = model(seq[:, start : p + i], start, cache)[:, -1]
            seq[:, p + i] = _sample(logits, temperature, generator)
            if return_logits:
                step_logits.append(logits)
            del logits
    return (seq, step_logits) if return_logits else seq
