"""The three captured programs: training, generation, and RLHF-style rollouts + training.

Each driver runs the real model (model.py) under a Recorder and tells it the
job, iteration and phase. Every step runs inside its own function so that its
tensors die when it returns: nothing from step k is still alive when step k+1
produces the same logical tensor (see Note [Stable names] in tracer.py).
"""
from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from .model import Decoder, KVCache, ModelConfig, generate, lm_loss, policy_gradient_loss
from .tracer import Recorder


@dataclass
class Progress:
    quiet: bool = False
    t0: float = field(default_factory=time.perf_counter)

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(f"[u3m_capture {time.perf_counter() - self.t0:6.1f}s] {msg}", file=sys.stderr, flush=True)


class Session:
    """A model, its optimizer and a recorder with the jobs of one capture."""

    def __init__(self, cfg: ModelConfig, rec: Recorder, *, seed: int, lr: float = 3e-3,
                 weight_decay: float = 0.1, progress: Optional[Callable[[str], None]] = None):
        torch.manual_seed(seed)
        self.cfg, self.rec = cfg, rec
        self.model = Decoder(cfg)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)
        self.gen = torch.Generator().manual_seed(seed + 1)  # data and sampling
        self.progress = progress or (lambda msg: None)
        self.train_job: Optional[int] = None
        self.infer_job: Optional[int] = None
        self.param_owner: Optional[int] = None
        self.train_iter = 0
        self.infer_iter = 0
        self._hooks = rec.attach(self.model)

    def add_jobs(self, train: bool, infer: bool) -> None:
        # Note [Parameter ownership]: with a training job, train-0 owns the
        # parameters (it is the job that writes them); a generation job reads
        # train-0's tensors. A generation-only capture owns them as infer-0.
        if train:
            self.train_job = self.rec.add_job("train-0")
        if infer:
            self.infer_job = self.rec.add_job("infer-0")
        self.param_owner = self.train_job if train else self.infer_job
        self.rec.register_model(self.model, self.param_owner)

    def close(self) -> None:
        for h in self._hooks:
            h.remove()

    # ------------------------------------------------------------------ training
    def train_step(self, loss_fn: Callable[[], torch.Tensor]) -> float:
        """One optimizer step on the loss `loss_fn()` builds (called in the forward phase)."""
        rec, job = self.rec, self.train_job
        with rec.iteration(job, self.train_iter):
            with rec.phase("forward"):
                loss = loss_fn()
            with rec.phase("backward"):
                loss.backward()
            rec.bind_grads(self.model, job)
            with rec.phase("optimizer"):
                self.opt.step()
                rec.bind_optimizer(self.opt, self.model, job)
                self.opt.zero_grad(set_to_none=True)
                value = loss.item()  # the driver's logging read, counted with the step
            del loss
        self.train_iter += 1
        return value

    def random_tokens(self, batch: int, length: int) -> torch.Tensor:
        return torch.randint(self.cfg.vocab_size, (batch, length), generator=self.gen)

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: torch.Tensor, new_tokens: int, temperature: float) -> torch.Tensor:
        rec, job = self.rec, self.infer_job

        @contextlib.contextmanager
        def step_context(phase: str, index: int):
            with rec.iteration(job, self.infer_iter), rec.phase(phase):
                yield
            self.infer_iter += 1

        def make_cache(batch: int, max_len: int) -> KVCache:
            with rec.paused():  # the cache's zero-fill is setup; its blocks appear as they are written
                cache = KVCache(self.cfg, batch, max_len)
            for layer in range(self.cfg.n_layers):
                rec.register_kv(cache.k[layer], job, layer, "k")
                rec.register_kv(cache.v[layer], job, layer, "v")
            return cache

        self.model.eval()
        try:
            return generate(self.model, prompts, new_tokens, temperature=temperature, generator=self.gen,
                            step_context=step_context, make_cache=make_cache)
        finally:
            self.model.train()


def max_len_needed(args) -> int:
    if args.workload == "train":
        return args.seq_len
    return args.prompt_len + args.new_tokens


def run_train(s: Session, args) -> None:
    s.add_jobs(train=True, infer=False)

    def loss_fn():
        # The batch is drawn inside the step, so its storage is a per-step activation.
        return lm_loss(s.model, s.random_tokens(args.batch, args.seq_len + 1))

    for step in range(args.steps):
        loss = s.train_step(loss_fn)
        s.progress(f"train step {step + 1}/{args.steps}: loss {loss:.4f}, {_sizes(s.rec)}")


def run_generate(s: Session, args) -> None:
    s.add_jobs(train=False, infer=True)
    for r in range(args.rounds):
        with s.rec.paused():  # prompts arrive from outside the program
            prompts = s.random_tokens(args.batch, args.prompt_len)
        seq = s.generate(prompts, args.new_tokens, args.temperature)
        s.progress(f"generate batch {r + 1}/{args.rounds}: {seq.shape[0]} x {seq.shape[1]} tokens, "
                   f"{_sizes(s.rec)}")
        del prompts, seq


def toy_reward(completions: torch.Tensor, vocab: int) -> torch.Tensor:
    """A stand-in reward model: the fraction of completion tokens in the lower half of the vocabulary."""
    return (completions < vocab // 2).float().mean(dim=1)


def run_rlhf(s: Session, args) -> None:
    s.add_jobs(train=True, infer=True)
    for r in range(args.rounds):
        reward, first, last = _rlhf_round(s, args)
        s.progress(f"rlhf round {r + 1}/{args.rounds}: mean reward {reward:.3f}, "
                   f"policy loss {first:+.4f} -> {last:+.4f}, {_sizes(s.rec)}")


def _rlhf_round(s: Session, args) -> tuple:
    """Rollouts, then training on them; the rollouts die when this returns."""
    p = args.prompt_len
    with s.rec.paused():
        prompts = s.random_tokens(args.batch, p)
    seq = s.generate(prompts, args.new_tokens, args.temperature)
    rewards = []

    def loss_fn():
        reward = toy_reward(seq[:, p:], s.cfg.vocab_size)
        rewards.append(reward.mean().item())
        return policy_gradient_loss(s.model, seq, p, reward - reward.mean())

    losses = [s.train_step(loss_fn) for _ in range(args.train_steps)]
    return rewards[0], losses[0], losses[-1]


WORKLOADS = {"train": run_train, "generate": run_generate, "rlhf": run_rlhf}


def _sizes(rec: Recorder) -> str:
    return f"{len(rec.ops)} ops, {len(rec.events)} events so far"
