"""A second KV tier in host memory: vLLM's native CPU offloading, bookkeeping only.

vLLM 0.32 turns it on with `--kv-offloading-size GiB` (`--kv-offloading-backend
native`, the default): `VllmConfig._post_init_kv_transfer_config`
(`vllm/config/vllm.py`) installs the `OffloadingConnector` with
`cpu_bytes_to_use = GiB * 2**30`. Each rule below is that connector's, read from
its source (paths under `vllm/distributed/kv_transfer/kv_connector/v1/offloading/`
and `vllm/v1/kv_offload/`):

- **Capacity.** `CPUOffloadingSpec.__init__` (`cpu/spec.py`): the tier holds
  `cpu_bytes_to_use // bytes_per_chunk` chunks, a chunk being `blocks_per_chunk`
  GPU blocks (1 by default, `offloading/config.py`), so here: whole GPU
  blocks, `bytes // (block_size * kv_bytes_per_token)`.
- **What is stored, and when.** `OffloadingConnectorScheduler._build_store_jobs`
  (`scheduler.py`) runs at every step: for each scheduled request it offers the
  full blocks it will have computed by the end of that step
  (`num_computed_tokens + num_scheduled_tokens`), from the first one not yet
  offered (`next_stored_chunk_idx`), and only blocks of the prompt:
  `offload_prompt_only` is on by default (`OffloadingSpec.__init__`,
  `base.py`; `_calc_num_offloadable_tokens`). So the tier is written through as
  prompts are computed, never on eviction; a turn's generated tokens reach it
  as part of the next turn's prompt. A request's GPU prefix hits are offered too
  (they count as computed): those already stored are not stored again.
- **Eviction.** `CPUOffloadingManager.prepare_store` (`cpu/manager.py`): the
  blocks not yet stored need free chunks; missing ones are taken from the
  evictable chunks in the policy's order, never from the blocks of the same
  offer (`protected`). When fewer are evictable the whole offer fails
  (`vllm:kv_offload_allocation_failure`) and nothing of it is stored; it is
  offered again at the request's next step.
- **LRU order.** `LRUCachePolicy` (`cpu/policies/lru.py`, the default
  `eviction_policy`): a block is most recently used when it is stored
  (`insert`), and when a request that offered or loaded it finishes
  (`on_request_finished`: every block the request saw gets a new rank, tail
  first, so within one request the tail is evicted before the head).
- **Lookup.** `get_num_new_matched_tokens` -> `_lookup_complete_chunks`, called
  by `Scheduler.schedule` for a waiting request with no computed tokens, after
  the GPU prefix-cache lookup: the longest run of stored blocks that starts
  right after the GPU hit, over the request's full blocks (up to all its
  tokens, not `num_tokens - 1` as on the GPU). A load of less than one block is
  none.
- **Load.** The hit is loaded instead of computed (`update_state_after_alloc`,
  then `_update_waiting_for_remote_kv` caches the loaded blocks on the GPU).
  When the hit covers every token, the last one is computed again
  (`num_computed_tokens = num_tokens - 1`).

Deliberate simplifications: transfers are instant in the bookkeeping (no
pending store or load pins a block), and the engine charges a load's time to
the step that admits the request (vLLM loads asynchronously and schedules the
request a step later). `store_threshold`, the ARC policy, sliding windows and
partial-block boundaries are not modelled.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from langgraph_batch.emulator.kv_cache import KVCache
from langgraph_batch.emulator.request import Request

__all__ = ("GIB", "OffloadCounters", "OffloadTier")

GIB = 1 << 30
"""Bytes in the GiB of `--kv-offloading-size` (`_post_init_kv_transfer_config`)."""


@dataclass(slots=True)
class OffloadCounters:
    """What the tier did, as vLLM's connector and scheduler metrics count it."""

    stored_blocks: int = 0
    store_bytes: int = 0
    """`vllm:kv_offload_store_bytes`."""
    loaded_tokens: int = 0
    load_bytes: int = 0
    """`vllm:kv_offload_load_bytes`."""
    load_time_s: float = 0.0
    """`vllm:kv_offload_load_time` (the modelled transfer time)."""
    evicted_blocks: int = 0
    allocation_failures: int = 0
    """`vllm:kv_offload_allocation_failure`."""
    external_queries: int = 0
    """`vllm:external_prefix_cache_queries`: tokens past the GPU hit, at first admission."""
    external_hits: int = 0
    """`vllm:external_prefix_cache_hits`: of those, tokens loaded from the tier."""


class OffloadTier:
    """The CPU tier of one engine: stored block hashes in LRU order.

    Args:
        num_blocks: Capacity in GPU blocks (`CPUOffloadingSpec.num_chunks`).
        block_size: Tokens per block (the GPU's; one block per chunk).
        kv_bytes_per_token: The model's KV bytes per token (for the byte counters).
        prompt_only: Store prompt blocks only (vLLM's `offload_prompt_only`, on
            by default).

    Raises:
        ValueError: fewer than one block.
    """

    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int,
        kv_bytes_per_token: int,
        prompt_only: bool = True,
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"the offload tier must hold at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.block_bytes = block_size * kv_bytes_per_token
        self.prompt_only = prompt_only
        # Stored hash -> None, least recently used first (LRUCachePolicy's ranks).
        self._lru: OrderedDict[int, None] = OrderedDict()
        # id(request) -> blocks offered so far (next_stored_chunk_idx), and the
        # hashes it offered or loaded, head first (_RequestCacheAccess).
        self._offered: dict[int, int] = {}
        self._seen: dict[int, dict[int, None]] = {}
        self.counters = OffloadCounters()

    @classmethod
    def from_bytes(cls, nbytes: float, *, block_size: int, kv_bytes_per_token: int) -> OffloadTier:
        """The tier `--kv-offloading-size` gives: `nbytes // block bytes` blocks."""
        return cls(
            num_blocks=int(nbytes) // (block_size * kv_bytes_per_token),
            block_size=block_size,
            kv_bytes_per_token=kv_bytes_per_token,
        )

    @property
    def num_stored(self) -> int:
        """Blocks the tier holds now."""
        return len(self._lru)

    @property
    def capacity_tokens(self) -> int:
        """Tokens the tier can hold."""
        return self.num_blocks * self.block_size

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._lru

    def lru_order(self) -> list[int]:
        """The stored hashes, next to be evicted first."""
        return list(self._lru)

    def store(self, kv: KVCache, req: Request, computed_tokens: int) -> None:
        """Offer the request's full blocks up to `computed_tokens` (`_build_store_jobs`)."""
        limit = min(computed_tokens, req.num_known_tokens)
        if self.prompt_only:
            limit = min(limit, req.prompt_len)
        full = limit // self.block_size
        key = id(req)
        start = self._offered.get(key, 0)
        if full <= start:
            return
        offer = kv.block_hashes(req, full)[start:full]
        seen = self._seen.setdefault(key, {})
        for h in offer:
            seen[h] = None
        lru = self._lru
        new = [h for h in dict.fromkeys(offer) if h not in lru]
        short = len(new) - (self.num_blocks - len(lru))
        if short > 0:
            protected = set(offer)
            victims: list[int] = []
            for h in lru:  # least recently used first; stop once enough are found
                if h not in protected:
                    victims.append(h)
                    if len(victims) == short:
                        break
            if len(victims) < short:
                self.counters.allocation_failures += 1
                return  # offered again at its next step
            for h in victims:
                del lru[h]
            self.counters.evicted_blocks += short
        for h in new:
            lru[h] = None
        self._offered[key] = full
        self.counters.stored_blocks += len(new)
        self.counters.store_bytes += len(new) * self.block_bytes

    def lookup(self, kv: KVCache, req: Request, gpu_blocks: int) -> int:
        """Blocks loadable right after a GPU hit of `gpu_blocks` (`_lookup_complete_chunks`)."""
        full = req.num_known_tokens // self.block_size
        if full <= gpu_blocks:
            return 0
        lru = self._lru
        n = 0
        for h in kv.block_hashes(req, full)[gpu_blocks:full]:
            if h not in lru:
                break
            n += 1
        return n

    def load(self, kv: KVCache, req: Request, gpu_blocks: int, blocks: int, seconds: float) -> None:
        """Count a load of `blocks` blocks after `gpu_blocks` (`prepare_load`)."""
        seen = self._seen.setdefault(id(req), {})
        for h in kv.block_hashes(req, gpu_blocks + blocks)[gpu_blocks : gpu_blocks + blocks]:
            seen[h] = None
        c = self.counters
        c.loaded_tokens += blocks * self.block_size
        c.load_bytes += blocks * self.block_bytes
        c.load_time_s += seconds

    def finish(self, kv: KVCache, req: Request) -> None:
        """The request finished or was aborted: a last offer, then its blocks are used.

        `_build_store_jobs` offers a finished request's blocks once more (what a
        failed offer left out), then `on_request_finished` ranks every block it
        offered or loaded as just used, head last.
        """
        self.store(kv, req, req.num_computed)
        key = id(req)
        self._offered.pop(key, None)
        seen = self._seen.pop(key, None)
        if not seen:
            return
        lru = self._lru
        for h in reversed(list(seen)):
            if h in lru:
                lru.move_to_end(h)

    def reset(self) -> None:
        """Drop everything stored (`OffloadingConnectorScheduler.reset_cache`)."""
        self._lru.clear()
