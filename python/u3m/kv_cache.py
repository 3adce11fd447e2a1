"""A KV cache for generation whose blocks live in u3m's tiered KV manager (issue 7).

`TieredKVManager` owns one `u3m._core.TieredKvStore`: the C++ block manager (prefix sharing
by chained block keys, tiers HBM / DRAM / SSD, eviction, admission) whose actions are carried
out on the real engine (HBM: device-emu, or the GPU with device="cuda"; pinned host DRAM;
an SSD store), with real bytes
(docs/kv.md, "The data path"). It outlives single `generate()` calls, so a later batch finds
the prompt blocks an earlier one stored.

`TieredKVCache` has the interface of `u3m_capture.model.KVCache` (`batch`, `max_len`,
`update(layer, start_pos, k_new, v_new) -> (k[:, :end], v[:, :end])`), so the model's
`generate(..., make_cache=...)` uses it unchanged. Each batch row is one request; its
keys/values are written into its blocks and gathered back from them at every step, through
engine leases, so compute never reads a block in flight.

Layout of one physical block (slot) of layer group g, as float bytes:
    [layer in group][k or v][token in block][kv_heads * head_dim]
so a run of positions of one layer's K (or V) is one contiguous byte range.
"""
from __future__ import annotations

import hashlib
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from u3m_capture.model import KVCache, ModelConfig

from . import _core

# Submits of a row whose admission was rolled back after a failed action (SSD faults).
_SUBMIT_ATTEMPTS = 4


def kv_bytes_per_token_layer(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> int:
    """K and V of one token in one layer."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.n_kv_heads * cfg.head_dim * itemsize


def kv_footprint_bytes(cfg: ModelConfig, batch: int, max_len: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of an untiered KVCache(cfg, batch, max_len): every layer, every position."""
    return batch * max_len * cfg.n_layers * kv_bytes_per_token_layer(cfg, dtype)


class TieredKVManager:
    """The tiered store behind one or more TieredKVCache objects.

    device_budget_bytes bounds the HBM tier: it gets floor(budget / slot_bytes) slots
    (at least 1), so the engine's device tier never holds more than kv_budget_bytes <=
    device_budget_bytes (the engine's capacity is the manager's, Note [Capacities agree] in
    src/kv/tiered_store.cpp). host_bytes sizes the DRAM tier and ssd_bytes the SSD tier
    (0: none). overcommit is 0 (no cap): a fixed batch runs all its rows at once, so they must
    all be admitted; the serving admission policy (1.5x HBM) is for a request stream.
    """

    def __init__(self, cfg: ModelConfig, *, device_budget_bytes: int, host_bytes: int,
                 ssd_bytes: int = 0, block_tokens: int = 16, layers_per_group: int = 1,
                 policy: str = "lru", dtype: torch.dtype = torch.float32, ssd_dir: str = "",
                 model_id: str = "", ssd_faults: str = "", device="cpu", remote: str = "",
                 remote_ttl_s: int = 3600, remote_timeout_ms: int = 250):
        if device_budget_bytes <= 0 or host_bytes <= 0 or ssd_bytes < 0:
            raise ValueError("TieredKVManager: device_budget_bytes and host_bytes must be > 0, "
                             f"ssd_bytes >= 0; got {device_budget_bytes}, {host_bytes}, {ssd_bytes}")
        self.cfg, self.dtype = cfg, dtype
        # Cached KV is only valid for the weights that computed it: block keys carry the
        # caller's model_id (e.g. a checkpoint's name or hash) and the dtype, so a manager
        # reused across models or checkpoints never serves one's KV to another.
        self.salt = f"{model_id}|{dtype}|"
        self.itemsize = torch.empty((), dtype=dtype).element_size()
        self.row_bytes = cfg.n_kv_heads * cfg.head_dim * self.itemsize  # one token of K (or V)
        self.geometry = _core.KvGeometry(block_tokens=block_tokens, layers=cfg.n_layers,
                                         layers_per_group=layers_per_group,
                                         bytes_per_token_layer=2 * self.row_bytes)
        slot = self.geometry.slot_bytes()
        if device_budget_bytes < slot:
            raise ValueError(f"TieredKVManager: device budget {device_budget_bytes} B is below one "
                             f"KV block ({slot} B = {block_tokens} tokens x {layers_per_group} layers)")
        slots = (device_budget_bytes // slot, max(1, host_bytes // slot), ssd_bytes // slot)
        config = _core.KvConfig(self.geometry, capacity_slots=slots, policy=policy, overcommit=0)
        # device: where the model runs; its type picks the HBM tier's backend as u3m.torch.offload
        # does (Note [Offload on CUDA] in torch.py): cpu -> device-emu, cuda:N -> cuda (real HBM,
        # pinned DRAM). The registry's reason is the error when that backend cannot open.
        from .torch import _BACKEND_OF_DEVICE
        self.device = torch.device(device)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"TieredKVManager: device {self.device}: the KV cache runs on cpu or cuda")
        self.backend = _BACKEND_OF_DEVICE[self.device.type]
        # ssd_faults (tests): faults injected under the SSD tier, e.g. "lost_write=0.05,seed=1".
        self.store = _core.TieredKvStore(config, ssd_dir=ssd_dir, ssd_faults=ssd_faults,
                                         backend=self.backend, device=self.device.index or 0)
        self.kv_budget_bytes = slots[0] * slot
        self._next_id = 1
        # remote="redis://HOST:PORT": a tier below DRAM shared with other processes (docs/kv.md,
        # "Remote tier on Redis"). Its values are named by content, so they are only right for
        # the weights that computed them: model_id must name those weights.
        self.model_id = model_id
        self.remote = None
        if remote:
            if not model_id:
                raise ValueError("TieredKVManager: remote= needs model_id= naming the weights "
                                 "(other processes read the KV stored under it)")
            self.remote = _core.RemoteKv(remote, geometry=self.geometry, ttl_s=remote_ttl_s,
                                         timeout_ms=remote_timeout_ms)

    def new_request_id(self) -> int:
        rid = self._next_id
        self._next_id += 1
        return rid

    def stats(self) -> dict:
        """The store's counters; with a remote, its own under "remote" (hits, misses, puts,
        errors, corrupt, ...)."""
        d = self.store.stats()
        if self.remote is not None:
            d["remote"] = self.remote.stats()
        return d

    @property
    def peak_device_bytes(self) -> int:
        """The engine's measured peak of device-tier KV bytes, over the manager's lifetime."""
        return self.store.stats()["engine_peak_bytes"][0]


def prompt_segments(tokens: Sequence[int], block_tokens: int, salt: str = "") -> List[Tuple[str, int]]:
    """A prompt as block-sized segments named by their content, so two prompts that start with
    the same tokens share those blocks (the manager chains each block's key to its parent's).
    `salt` names what else the KV depends on (the model's weights and dtype): prompts hashed
    with different salts never share blocks."""
    segs = []
    for s in range(0, len(tokens), block_tokens):
        chunk = [int(t) for t in tokens[s : s + block_tokens]]
        digest = hashlib.blake2b((salt + repr(chunk)).encode(), digest_size=12).hexdigest()
        segs.append((digest, len(chunk)))
    return segs


class TieredKVCache(KVCache):
    """Drop-in for model.KVCache whose blocks live in a TieredKVManager.

    prompts: the [B, P] prompt tokens generate() will run (block keys come from token ids, which
    the cache does not otherwise see). Each row is admitted at construction; a prefix hit's
    blocks were written by an earlier request and are read, never rewritten. close() finishes
    the requests: private blocks are freed, prompt blocks stay cached for later requests.
    The dense buffers of KVCache (`k`, `v`) do not exist here.

    With the manager's remote, the blocks after a row's local hits that the remote holds are
    fetched into the row's blocks (promoted: later requests hit them locally) and count as hits;
    once prefill has written the last layer, each row's full prompt blocks are put to the remote
    in one batch (synchronous, bounded by its timeout). A remote that fails is skipped.
    skip_prefix: prefill starts after the hit blocks every row shares (`cached_prefix`), so
    their KV is read, not recomputed; False recomputes them and compares (`hit_max_abs_diff`).
    """

    def __init__(self, manager: TieredKVManager, batch: int, max_len: int, prompts: torch.Tensor,
                 model_id: Optional[str] = None, skip_prefix: bool = False):
        cfg = manager.cfg
        if max_len > cfg.max_seq_len:
            raise ValueError(f"TieredKVCache: max_len {max_len} exceeds the model's max_seq_len {cfg.max_seq_len}")
        if prompts.dim() != 2 or prompts.shape[0] != batch:
            raise ValueError(f"TieredKVCache: prompts must be [batch={batch}, P], got {list(prompts.shape)}")
        self.m, self.batch, self.max_len = manager, batch, max_len
        self.bt = manager.geometry.block_tokens
        self.lpg = manager.geometry.layers_per_group
        p = prompts.shape[1]
        # model_id: the weights this cache's KV comes from, if not the manager's (Note above).
        salt = manager.salt if model_id is None else f"{model_id}|{manager.dtype}|"
        if manager.remote is not None and model_id == "":
            raise ValueError("TieredKVCache: a manager with a remote needs a model_id")
        self.ids: List[int] = []
        self.hit_blocks: List[int] = []
        self.remote_blocks: List[int] = []  # of hit_blocks, fetched from the remote
        self._segments: List[List[Tuple[str, int]]] = []
        self._published = manager.remote is None
        self.computed_positions = 0  # positions of layer 0 written by update(): what was computed
        self.hit_max_abs_diff = 0.0  # stored vs recomputed KV of prefix hits
        self._closed = False
        self._queued: List[int] = []  # a row the manager queued (only on the error path)
        for row in prompts.tolist():
            rid = manager.new_request_id()
            segments = prompt_segments(row, self.bt, salt)
            # "aborted": an action failed (an SSD fault) and the store rolled the admission
            # back, leaving nothing of it; the faults are transient, so submit again.
            for _ in range(_SUBMIT_ATTEMPTS):
                result, adm = manager.store.submit(rid, segments, max_len - p)
                if result != "aborted":
                    break
            if result == "aborted":
                self.close()
                raise RuntimeError(f"TieredKVCache: request for batch row {len(self.ids)} was aborted "
                                   f"{_SUBMIT_ATTEMPTS} times: an action of its admission kept failing")
            if result != "admitted":
                self._queued = [rid] if result == "queued" else []
                self.close()
                raise RuntimeError(f"TieredKVCache: request for batch row {len(self.ids)} was {result}: "
                                   "the DRAM tier is too small for the batch")
            self.ids.append(rid)
            hits = adm.hit_blocks
            if manager.remote is not None:
                hits = manager.store.fetch_remote(manager.remote, rid, segments, adm.hit_blocks)
            self.hit_blocks.append(hits)
            self.remote_blocks.append(hits - adm.hit_blocks)
            self._segments.append(segments)
        # KVCache's contract with generate(): positions before this hold every row's KV.
        self.cached_prefix = min(min(self.hit_blocks) * self.bt, p - 1) if skip_prefix and p else 0

    def _ranges(self, start: int, end: int):
        """(block, first position, end position) of each block overlapping [start, end)."""
        b = start // self.bt
        while b * self.bt < end:
            yield b, max(start, b * self.bt), min(end, (b + 1) * self.bt)
            b += 1

    def _offset(self, layer: int, kv: int, pos: int) -> int:
        lig = layer % self.lpg
        return ((lig * 2 + kv) * self.bt + pos % self.bt) * self.m.row_bytes

    def update(self, layer: int, start_pos: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple:
        """Writes positions start_pos.. of `layer`; returns [B, end, Hkv, D] K and V gathered
        from the blocks (the same values the dense cache would return)."""
        if self._closed:
            raise RuntimeError("TieredKVCache: update after close()")
        end = start_pos + k_new.shape[1]
        if end > self.max_len:
            raise ValueError(f"TieredKVCache: position {end} is past the cache length {self.max_len}")
        store, group = self.m.store, layer // self.lpg
        # The store copies between its blocks and host memory (on cuda: the backend's h2d/d2h
        # into HBM blocks), so CUDA K/V stage through host tensors here; on CPU .cpu() is a no-op.
        news = [k_new.detach().to(self.m.dtype).contiguous().cpu(),
                v_new.detach().to(self.m.dtype).contiguous().cpu()]
        for r, rid in enumerate(self.ids):
            for b, s, e in self._ranges(start_pos, end):
                for kv in (0, 1):
                    src = news[kv][r, s - start_pos : e - start_pos]
                    if b < self.hit_blocks[r]:  # shared: written by an earlier request
                        stored = torch.empty_like(src)
                        store.read_into(rid, b, group, self._offset(layer, kv, s), stored.numpy())
                        diff = (stored - src).abs().max().item()
                        self.hit_max_abs_diff = max(self.hit_max_abs_diff, diff)
                    else:
                        store.write(rid, b, group, self._offset(layer, kv, s), src.numpy())
        if layer == 0:
            self.computed_positions += end - start_pos
        if not self._published and layer == self.m.cfg.n_layers - 1:
            # Prefill has written every layer of the prompt: share its full blocks.
            self._published = True
            store.publish_remote(self.m.remote, list(zip(self.ids, self._segments)))
        k, v = self.gather(layer, end)
        return (k.to(device=k_new.device, dtype=k_new.dtype),
                v.to(device=v_new.device, dtype=v_new.dtype))

    def gather(self, layer: int, end: int) -> tuple:
        """[B, end, Hkv, D] K and V of `layer`, positions 0..end-1, read from the blocks."""
        cfg, store, group = self.m.cfg, self.m.store, layer // self.lpg
        shape = (self.batch, end, cfg.n_kv_heads, cfg.head_dim)
        outs = [torch.empty(shape, dtype=self.m.dtype), torch.empty(shape, dtype=self.m.dtype)]
        for r, rid in enumerate(self.ids):
            for b, s, e in self._ranges(0, end):
                for kv in (0, 1):
                    store.read_into(rid, b, group, self._offset(layer, kv, s), outs[kv][r, s:e].numpy())
        return outs[0], outs[1]

    def close(self) -> None:
        """Finishes the rows' requests (idempotent)."""
        if self._closed:
            return
        self._closed = True
        admitted = []
        for rid in self.ids:
            admitted += self.m.store.finish(rid)
        # A queued row is admitted once rows before it finish; it must not stay in the manager.
        for a in admitted:
            if a.id in self._queued:
                self.m.store.finish(a.id)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
