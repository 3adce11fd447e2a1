"""Training cases for measuring u3m.torch.offload: models built from PyTorch's own modules and
the repo's LLaMA example, each with its optimizer, batches and loss, sized so their matmuls and
convolutions take 100 us or more on one core of a 2-core VM (elementwise and norm ops are
shorter). bench/torch_offload_cost.py (offload cost) and u3m_capture.simcheck (the sim-versus-real
check) both train these; tests/python/test_torch_models.py uses LoRALinear.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import u3m.torch as ut
from u3m_capture.model import Decoder, ModelConfig, lm_loss


class LoRALinear(nn.Module):
    """A frozen base nn.Linear plus a trainable low-rank update (B starts at zero)."""

    def __init__(self, base: nn.Linear, rank=4):
        super().__init__()
        self.base = base
        base.weight.requires_grad_(False)
        self.a = nn.Parameter(torch.randn(rank, base.in_features) * 0.1)
        self.b = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x):
        return self.base(x) + F.linear(F.linear(x, self.a), self.b)


def llama():
    cfg = ModelConfig(vocab_size=512, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2,
                      ffn_hidden=344, max_seq_len=64)
    model = Decoder(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    gen = torch.Generator().manual_seed(1)
    data = [torch.randint(512, (4, 65), generator=gen) for _ in range(64)]
    return model, opt, data, lm_loss


class EncoderLM(nn.Module):
    def __init__(self, vocab=512, d=128, layers=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0,
                                                                    batch_first=True), layers)
        self.head = nn.Linear(d, vocab)

    def forward(self, x):
        return self.head(self.enc(self.emb(x)))


def encoder():
    model = EncoderLM()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    data = [torch.randint(512, (4, 65), generator=gen) for _ in range(64)]

    def loss(m, d):
        return nn.functional.cross_entropy(m(d[:, :-1]).flatten(0, 1), d[:, 1:].flatten())
    return model, opt, data, loss


class LSTMLM(nn.Module):
    def __init__(self, vocab=512, d=256):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, d, num_layers=2, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, x):
        return self.head(self.rnn(self.emb(x))[0])


def lstm():
    model = LSTMLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    data = [torch.randint(512, (8, 17), generator=gen) for _ in range(64)]

    def loss(m, d):
        return nn.functional.cross_entropy(m(d[:, :-1]).flatten(0, 1), d[:, 1:].flatten())
    return model, opt, data, loss


def cnn():
    chans = [3, 64, 64, 64, 64]
    layers = []
    for a, b in zip(chans, chans[1:]):
        layers += [nn.Conv2d(a, b, 3, padding=1), nn.BatchNorm2d(b), nn.ReLU()]
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(chans[-1], 10))
    opt = torch.optim.Adagrad(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 3, 8, 8, generator=gen), torch.randint(10, (8,), generator=gen))
            for _ in range(64)]

    def loss(m, d):
        return nn.functional.cross_entropy(m(d[0]), d[1])
    return model, opt, data, loss


def llama_lora():
    """The LLaMA example with LoRA (rank 8) on every attention and MLP projection: the base is
    frozen (not in the optimizer) and stays in the tiers; the adapters train under AdamW."""
    model, _, data, loss = llama()
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in model.layers:
        for parent, names in ((layer.attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
                              (layer.mlp, ("gate_proj", "up_proj", "down_proj"))):
            for n in names:
                setattr(parent, n, LoRALinear(getattr(parent, n), rank=8))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    return model, opt, data, loss


MODELS = {"llama": llama, "llama-lora": llama_lora, "encoder": encoder, "lstm": lstm, "cnn": cnn}


def one_run(make, steps, budget, policy):
    """Median step time (s) of one run, its median process CPU time per step (s: every thread's,
    the engine's copy threads too; unlike the wall clock it does not count time this process
    waited for a core), its losses, and the offload's stats (None untiered)."""
    torch.manual_seed(0)
    model, opt, data, loss_fn = make()
    off = ut.offload(model, opt, budget_fraction=budget, policy=policy) if policy else None
    times, cpus, losses = [], [], []
    try:
        for d in data[:steps]:
            t, c = time.perf_counter(), time.process_time()
            loss = loss_fn(model, d)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
            losses.append(loss.item())
        st = off.stats() if off else None
    finally:
        if off:
            off.close()
    return statistics.median(times[2:]), statistics.median(cpus[2:]), losses, st


