"""Issue 16: models built from PyTorch's own modules train under u3m.torch.offload exactly as
untiered (docs/pytorch.md).

Each case trains a few steps untiered, then under budgets 0.5 and 0.3 of the footprint
(params + grads + full-size optimizer state), from the same seed and batches. The offload
runs the same ops on the same bytes (parameters are gathered into their own storage, the
optimizer steps each parameter on its leased bytes, torch 1.13 CPU optimizers and foreach
ops update each tensor on its own), so losses, final parameters and buffers are asserted
equal BITWISE, and the engine's peak device-tier use within the budget.

Run (after building u3m_python): PYTHONPATH=build/release/python /usr/bin/python3 -m unittest \
    discover -s tests/python -p test_torch_models.py -v
"""
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import u3m.torch as ut
from u3m_capture.model import Decoder, ModelConfig, lm_loss
from u3m_capture.train_cases import LoRALinear

BUDGETS = (0.5, 0.3)
D, V, T, B = 32, 48, 12, 3  # model width, vocabulary, sequence, batch: tiny, so the test is fast


def tokens(gen, n):
    return [torch.randint(V, (B, T + 1), generator=gen) for _ in range(n)]


# --------------------------------------------------------------------------------- the models
class Seq2Seq(nn.Module):
    """nn.Transformer; the encoder runs under non-reentrant checkpointing."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.tf = nn.Transformer(D, 4, 2, 2, 64, dropout=0.0, batch_first=True)
        self.out = nn.Linear(D, V)

    def forward(self, src, tgt):
        mem = checkpoint(self.tf.encoder, self.emb(src), use_reentrant=False)
        mask = self.tf.generate_square_subsequent_mask(tgt.shape[1])
        return self.out(self.tf.decoder(self.emb(tgt), mem, tgt_mask=mask))


class TiedLM(nn.Module):
    """nn.TransformerEncoder LM whose head is the embedding (the same Parameter)."""

    def __init__(self, lora_rank=0):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, 4, 64, dropout=0.0,
                                                                    batch_first=True), 2)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.head(self.enc(self.emb(x), mask=mask))


class RNNLM(nn.Module):
    def __init__(self, cell, reentrant_checkpoint=False):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        # Two one-layer RNNs, not one of two layers: an RNN module owns all its weights, and
        # they are gathered together, with room for the activations, even at budget 0.3.
        self.rnns = nn.ModuleList([cell(D, D, batch_first=True) for _ in range(2)])
        self.out = nn.Linear(D, V)
        self.reentrant = reentrant_checkpoint

    def forward(self, x):
        h = self.emb(x)
        for rnn in self.rnns:
            h = checkpoint(rnn, h, use_reentrant=True)[0] if self.reentrant else rnn(h)[0]
        return self.out(h)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        conv = [nn.Conv2d(3, 16, 3, padding=1)] + [nn.Conv2d(16, 16, 3, padding=1) for _ in range(4)]
        self.body = nn.Sequential(*[m for c in conv for m in (c, nn.BatchNorm2d(16), nn.ReLU())],
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(self.body(x))


def lm_step_loss(model, batch):
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


# --------------------------------------------------------------------------------- the cases
def case_transformer(gen):
    model = Seq2Seq()
    fast = [p for n, p in model.named_parameters() if n.startswith("out.")]
    slow = [p for n, p in model.named_parameters() if not n.startswith("out.")]
    opt = torch.optim.Adam([{"params": slow}, {"params": fast, "lr": 3e-2}], lr=1e-2)
    data = [(torch.randint(V, (B, T), generator=gen), torch.randint(V, (B, T + 1), generator=gen))
            for _ in range(4)]

    def loss(m, d):
        src, tgt = d
        logits = m(src, tgt[:, :-1])
        return F.cross_entropy(logits.reshape(-1, V), tgt[:, 1:].reshape(-1))
    return model, opt, data, loss


def case_tied(gen):
    model = TiedLM()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1), tokens(gen, 4), \
        lm_step_loss


def case_tied_foreach(gen):
    model = TiedLM()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True), tokens(gen, 4), lm_step_loss


class SharedBlock(nn.Module):
    """One encoder layer applied three times (ALBERT-style sharing): a unit entered again
    while it is still held."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.layer = nn.TransformerEncoderLayer(D, 4, 64, dropout=0.0, batch_first=True)
        self.out = nn.Linear(D, V)

    def forward(self, x):
        h = self.emb(x)
        for _ in range(3):
            h = self.layer(h)
        return self.out(h)


def case_shared(gen):
    model = SharedBlock()
    return model, torch.optim.Adam(model.parameters(), lr=1e-2), tokens(gen, 4), lm_step_loss


def case_lstm(gen):
    model = RNNLM(nn.LSTM, reentrant_checkpoint=True)
    return model, torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), tokens(gen, 4), lm_step_loss


def case_gru(gen):
    model = RNNLM(nn.GRU)
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-2, momentum=0.5, centered=True, foreach=True)
    return model, opt, tokens(gen, 4), lm_step_loss


def case_cnn(gen):
    model = CNN()
    data = [(torch.randn(4, 3, 4, 4, generator=gen), torch.randint(10, (4,), generator=gen))
            for _ in range(4)]
    return model, torch.optim.Adagrad(model.parameters(), lr=0.1), data, \
        lambda m, d: F.cross_entropy(m(d[0]), d[1])


LLAMA = dict(vocab_size=V, d_model=D, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=48, max_seq_len=T + 1)


def case_llama_lora(gen):
    """The repo's LLaMA example with LoRA on q/v: the base is frozen (not in the optimizer)
    and stays in the tiers; forward and backward under CPU autocast bf16."""
    model = Decoder(ModelConfig(**LLAMA))
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in model.layers:
        layer.attn.q_proj = LoRALinear(layer.attn.q_proj)
        layer.attn.v_proj = LoRALinear(layer.attn.v_proj)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)

    def loss(m, batch):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return lm_loss(m, batch)
    return model, opt, tokens(gen, 4), loss


# --------------------------------------------------------------------------------- the loops
def plain_loop(model, opt, data, loss_fn, off):
    out = []
    for d in data:
        loss = loss_fn(model, d)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def clip_accumulate_loop(model, opt, data, loss_fn, off):
    """Two micro-batches a step into zeroed (not freed) gradients, clip_grad_norm_ over all."""
    out = []
    opt.zero_grad(set_to_none=False)
    for i, d in enumerate(data):
        loss = loss_fn(model, d) / 2
        loss.backward()
        out.append(loss.item())
        if i % 2:
            out.append(float(nn.utils.clip_grad_norm_(model.parameters(), 0.5)))
            opt.step()
            opt.zero_grad(set_to_none=False)
    return out


def checkpoint_loop(model, opt, data, loss_fn, off):
    """state_dict() of model and optimizer mid-run without closing, loaded back, then on."""
    out = plain_loop(model, opt, data[:2], loss_fn, off)
    msd = {k: v.clone() for k, v in model.state_dict().items()}
    osd = opt.state_dict()
    out.append(sum(float(v.double().sum()) for v in msd.values()))
    model.load_state_dict(msd)
    opt.load_state_dict(osd)
    return out + plain_loop(model, opt, data[2:], loss_fn, off)


def run(case, budget=None, loop=plain_loop):
    torch.manual_seed(0)
    model, opt, data, loss_fn = case(torch.Generator().manual_seed(1))
    off = ut.offload(model, opt, budget_fraction=budget) if budget else None
    try:
        losses = loop(model, opt, data, loss_fn, off)
        st = off.stats() if off else None
    finally:
        if off:
            off.close()
    final = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for n, p in model.named_parameters():
        final[f"{n}.grad"] = None if p.grad is None else p.grad.clone()
    return losses, final, st, off


# ------------------------------------------------ a parameter whose step exceeds the budget
class EmbeddingHead(nn.Module):
    """A large embedding (12.8 MB of float32) and a small head: the embedding fits the budgets
    below, its optimizer step (with its gradient and full-size state) does not."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50000, 64)
        self.head = nn.Linear(64, 8)

    def forward(self, x):
        return self.head(self.emb(x).mean(1))


# (optimizer, budget fraction): 0.3 where the footprint is 5 x the embedding (Adam, AdamW with
# amsgrad, centered RMSprop with momentum), 0.5 where it is 3 x (SGD momentum, Adagrad), so that
# the embedding fits and its step does not (asserted in the test).
OVERSIZED_STEPS = (
    (lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.01), 0.3),
    (lambda ps: torch.optim.AdamW(ps, lr=1e-2, amsgrad=True, foreach=True), 0.3),
    (lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.9, nesterov=True, weight_decay=1e-4), 0.5),
    (lambda ps: torch.optim.Adagrad(ps, lr=0.1, lr_decay=0.01), 0.5),
    (lambda ps: torch.optim.RMSprop(ps, lr=1e-3, momentum=0.5, centered=True, foreach=True), 0.3),
)


def run_embedding(make_opt, budget=None, steps=3):
    """Trains EmbeddingHead (same seeds = same bytes): losses, parameters and optimizer state
    at the end, the stats and the Offload (None untiered)."""
    torch.manual_seed(0)
    model = EmbeddingHead()
    opt = make_opt(model.parameters())
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randint(50000, (32, 4), generator=gen), torch.randn(32, 8, generator=gen))
            for _ in range(steps)]
    off = ut.offload(model, opt, budget_fraction=budget) if budget else None
    try:
        losses = plain_loop(model, opt, data, lambda m, d: F.mse_loss(m(d[0]), d[1]), off)
        st = off.stats() if off else None
    finally:
        if off:
            off.close()
    final = {n: p.detach().clone() for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        for k, v in opt.state[p].items():
            final[f"{n}.{k}"] = v.clone() if isinstance(v, torch.Tensor) else v
    return losses, final, st, off


class ModelsTest(unittest.TestCase):
    def check(self, case, loop=plain_loop):
        ref_losses, ref_final, _, _ = run(case, loop=loop)
        for budget in BUDGETS:
            with self.subTest(budget=budget):
                losses, final, st, off = run(case, budget, loop)
                self.assertEqual(losses, ref_losses)  # bitwise: the same ops on the same bytes
                self.assertEqual(final.keys(), ref_final.keys())
                for k, v in ref_final.items():
                    if v is None:
                        self.assertIsNone(final[k], k)
                    else:
                        self.assertTrue(torch.equal(final[k], v), k)
                self.assertLessEqual(st["peak_device_bytes"], off.budget_bytes)
                self.assertGreater(st["peak_device_bytes"], 0)
                self.assertGreater(st["evictions"], 0)  # the budget bound: data moved out
                self.assertGreater(off.steps, 0)
        return st

    def test_transformer_adam_param_groups_checkpoint(self):
        self.check(case_transformer)

    def test_tied_head_adamw(self):
        st = self.check(case_tied)
        self.assertGreater(st["faults"], 0)  # the head's use of the embedding was faulted in

    def test_tied_head_clip_grad_norm_and_accumulation_into_zeroed_grads(self):
        self.check(case_tied, clip_accumulate_loop)

    def test_tied_head_adamw_foreach(self):
        self.check(case_tied_foreach)

    def test_a_block_shared_across_depth(self):
        self.check(case_shared)

    def test_lstm_sgd_momentum_reentrant_checkpoint(self):
        self.check(case_lstm)

    def test_gru_rmsprop_foreach(self):
        self.check(case_gru)

    def test_cnn_batchnorm_adagrad(self):
        self.check(case_cnn)  # the BatchNorm running stats are compared too (state_dict)

    def test_llama_lora_autocast_bf16(self):
        self.check(case_llama_lora)

    def test_an_embedding_whose_step_exceeds_the_budget_steps_on_the_host(self):
        for make_opt, budget in OVERSIZED_STEPS:
            name = type(make_opt([torch.zeros(1, requires_grad=True)])).__name__
            with self.subTest(optimizer=name, budget=budget):
                ref_losses, ref_final, _, _ = run_embedding(make_opt)
                losses, final, st, off = run_embedding(make_opt, budget)
                self.assertEqual(losses, ref_losses)  # bitwise: the same ops on the same bytes
                self.assertEqual(final.keys(), ref_final.keys())
                for k, v in ref_final.items():
                    if isinstance(v, torch.Tensor):
                        self.assertTrue(torch.equal(final[k], v), k)
                    else:
                        self.assertEqual(final[k], v, k)
                emb = 50000 * 64 * 4
                per_step = emb * (off.footprint_bytes // emb)  # the embedding, its grad and state
                self.assertLessEqual(emb, off.budget_bytes)  # the embedding fits ...
                self.assertGreater(per_step, off.budget_bytes)  # ... its step does not
                self.assertLessEqual(st["peak_device_bytes"], off.budget_bytes)
                self.assertGreater(st["peak_device_bytes"], 0)
                # Each of the 3 steps ran the embedding's step on the host, the head's on the device.
                self.assertEqual(st["host_steps"], 3)
                self.assertEqual(off.steps, 3)
                self.assertEqual(st["policy"]["diverged"], 0)

    def test_an_oversized_step_of_an_unsupported_optimizer_is_refused_naming_it(self):
        model = EmbeddingHead()
        with self.assertRaisesRegex(ValueError, "optimizer LBFGS is not supported"):
            ut.offload(model, torch.optim.LBFGS(model.parameters()), budget_fraction=0.3)

    def test_state_dict_and_load_mid_run_without_closing(self):
        self.check(case_tied, checkpoint_loop)

    def test_gathered_outside_forward_reads_and_writes_through(self):
        torch.manual_seed(0)
        model, opt, data, loss_fn = case_tied(torch.Generator().manual_seed(1))
        want = model.emb.weight.detach().clone()
        off = ut.offload(model, opt, budget_fraction=0.3)
        with off.gathered([model.emb.weight], write=True):
            self.assertTrue(torch.equal(model.emb.weight, want))
            with torch.no_grad():
                model.emb.weight.mul_(2)
        # Freed again: zero bytes of storage, the shape kept; a later use is served from the engine.
        self.assertEqual(model.emb.weight.shape, want.shape)
        self.assertEqual(model.emb.weight.as_subclass(torch.Tensor).storage().size(), 0)
        self.assertTrue(torch.equal(model.emb.weight * 1, want * 2))
        off.close()
        self.assertTrue(torch.equal(model.emb.weight, want * 2))
        with self.assertRaisesRegex(ValueError, "manages"):
            off2 = ut.offload(model, opt, budget_fraction=0.5)
            try:
                with off2.gathered([torch.zeros(2)]):
                    pass
            finally:
                off2.close()

    def test_a_use_that_cannot_be_served_names_the_parameter(self):
        torch.manual_seed(0)
        model, opt, data, loss_fn = case_tied(torch.Generator().manual_seed(1))
        largest = max(p.numel() * p.element_size() for p in model.parameters())
        off = ut.offload(model, opt, budget_bytes=4 * largest)  # the least a step needs
        # Hold every parameter at once: more than the device budget can take.
        with self.assertRaisesRegex(ut.OffloadError, r"cannot bring the parameter '[\w.]+'"):
            with off.gathered(list(model.parameters())):
                pass
        off.close()


if __name__ == "__main__":
    unittest.main()
