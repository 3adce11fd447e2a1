"""Small models of well-known architectures, built from PyTorch's own modules.

Each is the published architecture at toy size (so a capture takes seconds on a
CPU), written the way its reference implementation is, so that its operator
stream is the one users' programs produce:

- `GPT2`: Hugging Face's GPT2LMHeadModel layout (`transformer.wte/wpe/h.<i>.
  {ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}/ln_f`, Conv1D
  projections as `addmm` over [in, out] weights, gelu_new, tied LM head) with
  HF's `past_key_values` cache grown by `torch.cat` at every decode step.
- `Llama`: the LLaMA decoder of model.py (RMSNorm, RoPE, GQA, SwiGLU) with its
  preallocated KV cache.
- `Seq2Seq`: `torch.nn.Transformer` (encoder-decoder) with embeddings and a
  generator head, greedy decoding that re-runs the decoder over the prefix (as
  `nn.Transformer`'s tutorial does: it has no KV cache).
- `BertMLM`: a BERT-style encoder, `nn.TransformerEncoder` (post-norm, GELU),
  with a masked-LM head and 15% masking.
- `LstmLM`: `nn.LSTM` language model (embedding, 2-layer LSTM, tied decoder),
  generation carries the (h, c) state.
- `ConvNet`: a ResNet-style CNN of `nn.Conv2d` / `nn.BatchNorm2d` / ReLU
  residual blocks, global pooling and a linear classifier.
- `MoeLM`: a decoder whose MLP is a mixture of experts with top-2 routing
  (Switch/Mixtral style): a router, softmax, `topk`, and per expert the tokens
  routed to it gathered by `index_select` and scattered back by `index_add_`,
  so which expert runs on how many tokens depends on the data.

Every LM-shaped model has `loss(tokens)` (next-token cross entropy, or masked
LM for BERT) and `generate(prompts, new_tokens, step)`, where `step(kind)` is a
context manager wrapped around each model call ("prefill" or "decode") so a
recorder can attribute the work.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable, ContextManager, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .model import Decoder, KVCache, ModelConfig

StepFn = Callable[[str], ContextManager]


def _no_step(kind: str) -> ContextManager:
    return contextlib.nullcontext()


def _sample(logits: torch.Tensor, gen: Optional[torch.Generator]) -> torch.Tensor:
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=gen)


class _StatefulLM:
    """A language model whose forward(tokens, state) returns (logits, state): trained on
    next-token cross entropy, generating the prompt first, then one token a step with the
    carried state (a KV cache, an LSTM's (h, c))."""

    lm = True

    def loss(self, tokens):
        logits, _ = self(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, self.vocab), tokens[:, 1:].reshape(-1))

    @torch.no_grad()
    def generate(self, prompts, new_tokens, step: StepFn = _no_step, gen=None):
        seq, state = prompts, None
        for i in range(new_tokens):
            with step("prefill" if i == 0 else "decode"):
                logits, state = self(seq if state is None else seq[:, -1:], state)
                seq = torch.cat([seq, _sample(logits[:, -1], gen)], dim=1)
        return seq

class _Ckpt(nn.Module):
    """Runs `inner` under activation checkpointing when `enabled` (training only)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.enabled = False

    def forward(self, *args):
        if self.enabled and self.training and torch.is_grad_enabled():
            return checkpoint(self.inner, *args)
        return self.inner(*args)


# ----------------------------------------------------------------------------- GPT-2 (HF layout)

class Conv1D(nn.Module):
    """HF's Conv1D: a linear layer with its weight stored [in, out] (addmm(bias, x, W))."""

    def __init__(self, nf: int, nx: int):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.c_attn = Conv1D(3 * d, d)
        self.c_proj = Conv1D(d, d)

    def _split(self, x):
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.hd).permute(0, 2, 1, 3)

    def forward(self, x, past=None):
        q, k, v = self.c_attn(x).split(self.heads * self.hd, dim=2)
        q, k, v = self._split(q), self._split(k), self._split(v)
        if past is not None:
            k = torch.cat((past[0], k), dim=-2)
            v = torch.cat((past[1], v), dim=-2)
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.hd)
        t, s = q.shape[-2], k.shape[-2]
        causal = torch.ones(s, s, dtype=torch.bool).tril()[s - t : s, :s]
        w = torch.where(causal, w, torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype))
        w = F.softmax(w, dim=-1)
        a = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous()
        a = a.view(a.shape[0], a.shape[1], -1)
        return self.c_proj(a), (k, v)


class GPT2MLP(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.c_fc = Conv1D(4 * d, d)
        self.c_proj = Conv1D(d, 4 * d)

    def forward(self, x):
        return self.c_proj(gelu_new(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = GPT2Attention(d, heads)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = GPT2MLP(d)

    def forward(self, x, past=None):
        a, present = self.attn(self.ln_1(x), past)
        x = x + a
        return x + self.mlp(self.ln_2(x)), present


class _GPT2Body(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, ctx: int):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.h = nn.ModuleList([GPT2Block(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)


class GPT2(_StatefulLM, nn.Module):
    def __init__(self, vocab=256, d=64, layers=2, heads=4, ctx=128):
        super().__init__()
        self.transformer = _GPT2Body(vocab, d, layers, heads, ctx)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as in GPT-2
        self.vocab = vocab

    def forward(self, tokens, past=None):
        start = past[0][0].shape[-2] if past else 0
        pos = torch.arange(start, start + tokens.shape[1], dtype=torch.long).unsqueeze(0)
        x = self.transformer.wte(tokens) + self.transformer.wpe(pos)
        presents = []
        for i, block in enumerate(self.transformer.h):
            x, p = block(x, past[i] if past else None)
            presents.append(p)
        return self.lm_head(self.transformer.ln_f(x)), presents


# ----------------------------------------------------------------------------- LLaMA

class Llama(nn.Module):
    lm = True

    def __init__(self, vocab=256, d=64, layers=2, heads=4, kv_heads=2, ffn=96, ctx=128):
        super().__init__()
        self.cfg = ModelConfig(vocab_size=vocab, d_model=d, n_layers=layers, n_heads=heads,
                               n_kv_heads=kv_heads, ffn_hidden=ffn, max_seq_len=ctx)
        self.model = Decoder(self.cfg)

    def forward(self, tokens, start=0, cache=None):
        return self.model(tokens, start, cache)

    def loss(self, tokens):
        logits = self(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, self.cfg.vocab_size), tokens[:, 1:].reshape(-1))

    @torch.no_grad()
    def generate(self, prompts, new_tokens, step: StepFn = _no_step, gen=None):
        b, p = prompts.shape
        cache = KVCache(self.cfg, b, p + new_tokens)
        seq = prompts
        for i in range(new_tokens):
            with step("prefill" if i == 0 else "decode"):
                start = 0 if i == 0 else seq.shape[1] - 1
                logits = self(seq[:, start:], start, cache)
                seq = torch.cat([seq, _sample(logits[:, -1], gen)], dim=1)
        return seq


# ----------------------------------------------------------------------------- nn.Transformer seq2seq

class Seq2Seq(nn.Module):
    lm = True

    def __init__(self, vocab=256, d=64, heads=4, layers=2, ffn=128, ctx=128):
        super().__init__()
        self.vocab = vocab
        self.src_emb = nn.Embedding(vocab, d)
        self.tgt_emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(ctx, d) * 0.02)
        self.transformer = nn.Transformer(d, heads, layers, layers, ffn, dropout=0.0, batch_first=True)
        self.generator = nn.Linear(d, vocab)

    def forward(self, src, tgt):
        mask = self.transformer.generate_square_subsequent_mask(tgt.shape[1])
        s = self.src_emb(src) + self.pos[: src.shape[1]]
        t = self.tgt_emb(tgt) + self.pos[: tgt.shape[1]]
        return self.generator(self.transformer(s, t, tgt_mask=mask))

    def loss(self, tokens):
        # The first half of each row is the source, the second its target (shifted by one).
        half = tokens.shape[1] // 2
        src, tgt = tokens[:, :half], tokens[:, half:]
        logits = self(src, tgt[:, :-1])
        return F.cross_entropy(logits.reshape(-1, self.vocab), tgt[:, 1:].reshape(-1))

    @torch.no_grad()
    def generate(self, prompts, new_tokens, step: StepFn = _no_step, gen=None):
        with step("prefill"):
            s = self.src_emb(prompts) + self.pos[: prompts.shape[1]]
            memory = self.transformer.encoder(s)
            out = prompts[:, :1]
        for i in range(new_tokens):
            with step("decode"):
                mask = self.transformer.generate_square_subsequent_mask(out.shape[1])
                t = self.tgt_emb(out) + self.pos[: out.shape[1]]
                h = self.transformer.decoder(t, memory, tgt_mask=mask)
                out = torch.cat([out, _sample(self.generator(h[:, -1]), gen)], dim=1)
        return out


# ----------------------------------------------------------------------------- BERT-style MLM

class BertMLM(nn.Module):
    lm = False

    def __init__(self, vocab=256, d=64, heads=4, layers=2, ffn=128, ctx=128):
        super().__init__()
        self.vocab, self.mask_id = vocab, vocab - 1
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.ln = nn.LayerNorm(d)
        layer = nn.TransformerEncoderLayer(d, heads, ffn, dropout=0.0, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d), nn.Linear(d, vocab))

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1]).unsqueeze(0)
        return self.head(self.encoder(self.ln(self.tok(tokens) + self.pos(pos))))

    def loss(self, tokens, gen=None):
        chosen = torch.rand(tokens.shape, generator=gen) < 0.15
        inputs = tokens.masked_fill(chosen, self.mask_id)
        labels = tokens.masked_fill(~chosen, -100)
        logits = self(inputs)
        return F.cross_entropy(logits.reshape(-1, self.vocab), labels.reshape(-1), ignore_index=-100)

    @torch.no_grad()
    def infer(self, tokens, step: StepFn = _no_step):
        with step("prefill"):
            return self(tokens).argmax(-1)


# ----------------------------------------------------------------------------- LSTM LM

class LstmLM(_StatefulLM, nn.Module):
    def __init__(self, vocab=256, d=64, layers=2):
        super().__init__()
        self.vocab = vocab
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, d, layers, batch_first=True)
        self.decoder = nn.Linear(d, vocab)
        self.decoder.weight = self.emb.weight  # tied, as in the PyTorch word_language_model example

    def forward(self, tokens, state=None):
        out, state = self.rnn(self.emb(tokens), state)
        return self.decoder(out), state


# ----------------------------------------------------------------------------- ResNet-style CNN

class _Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ConvNet(nn.Module):
    lm = False

    def __init__(self, classes=10, width=8):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.layers = nn.Sequential(_Block(width, width, 1), _Block(width, 2 * width, 2),
                                    _Block(2 * width, 2 * width, 1))
        self.fc = nn.Linear(2 * width, classes)
        self.classes = classes

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))

    def loss(self, batch, gen=None):
        images, labels = batch
        return F.cross_entropy(self(images), labels)

    @torch.no_grad()
    def infer(self, batch, step: StepFn = _no_step):
        with step("prefill"):
            return self(batch[0]).argmax(-1)


# ----------------------------------------------------------------------------- MoE (top-2 routing)

class MoeMLP(nn.Module):
    def __init__(self, d, hidden, experts=4, k=2):
        super().__init__()
        self.k = k
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList([nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))
                                      for _ in range(experts)])

    def forward(self, x):
        b, t, d = x.shape
        flat = x.reshape(-1, d)
        gates = F.softmax(self.router(flat), dim=-1)
        weights, chosen = gates.topk(self.k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            if token.numel() == 0:  # data-dependent: an expert nobody chose does not run
                continue
            y = expert(flat.index_select(0, token)) * weights[token, slot].unsqueeze(-1)
            out = out.index_add(0, token, y)
        return out.view(b, t, d)


class MoeBlock(nn.Module):
    def __init__(self, d, heads, hidden, experts):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(d)
        self.moe = MoeMLP(d, hidden, experts)

    def forward(self, x):
        t = x.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.moe(self.ln_2(x))


class MoeLM(nn.Module):
    lm = True

    def __init__(self, vocab=256, d=64, heads=4, layers=2, hidden=96, experts=4, ctx=128):
        super().__init__()
        self.vocab = vocab
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList([MoeBlock(d, heads, hidden, experts) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1]).unsqueeze(0)
        x = self.tok(tokens) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))

    def loss(self, tokens):
        logits = self(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, self.vocab), tokens[:, 1:].reshape(-1))

    @torch.no_grad()
    def generate(self, prompts, new_tokens, step: StepFn = _no_step, gen=None):
        seq = prompts  # no KV cache: each step re-runs the prefix (data-dependent routing throughout)
        for i in range(new_tokens):
            with step("prefill" if i == 0 else "decode"):
                seq = torch.cat([seq, _sample(self(seq)[:, -1], gen)], dim=1)
        return seq


def enable_checkpointing(model: nn.Module) -> int:
    """Wraps each repeated block in activation checkpointing; returns how many."""
    n = 0
    for holder in (getattr(model, "transformer", None), getattr(model, "model", None), model,
                   getattr(model, "encoder", None)):
        if holder is None:
            continue
        for name in ("h", "layers", "blocks"):
            blocks = getattr(holder, name, None)
            if isinstance(blocks, nn.ModuleList) and blocks and not isinstance(blocks[0], _Ckpt):
                for i, b in enumerate(blocks):
                    w = _Ckpt(b)
                    w.enabled = True
                    blocks[i] = w
                    n += 1
                return n
    return n


ZOO = {"gpt2": GPT2, "llama": Llama, "seq2seq": Seq2Seq, "bert": BertMLM, "lstm": LstmLM,
       "cnn": ConvNet, "moe": MoeLM}
