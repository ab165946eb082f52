"""A paged KV cache with prefix caching: vLLM V1's block pool, bookkeeping only.

Each rule below is vLLM's, written from its source (0.33.0, and re-read in
0.32.0's, where the same functions hold); the file and function it comes
from are named (paths under `vllm/v1/core/`). The rules a client can observe
(full-block hits, eviction order, sharing at scheduling, the null block)
are checked against a running vLLM 0.32 by `tests/engine/test_rules_*.py`.

- Blocks hold `block_size` tokens (16 by default, vLLM's GPU default; the
  CPU engine takes multiples of 32). A block can be shared once it is full:
  its hash chains the parent block's hash with its token ids, and the first block
  also mixes in the request's `cache_salt` (`kv_cache_utils.py`,
  `hash_block_tokens`; `vllm/v1/request.py`, `Request.block_hashes`).
- A request's full blocks join the cache when the step that fills them is
  *scheduled* (`kv_cache_manager.py`, `KVCacheManager.allocate_slots` ->
  `cache_blocks`), so a request scheduled later in the same step finds them.
- Identical blocks are not de-duplicated (`block_pool.py`,
  `BlockHashToBlockMap` note #1 and `BlockPool.cache_full_blocks`): a block
  whose hash is already cached is cached too. A lookup gets the earliest
  cached copy still present (`BlockHashToBlockMap.get_one_block`), and
  evicting one copy leaves the others findable.
- A lookup (`single_type_kv_cache_manager.py`,
  `FullAttentionManager.find_longest_cache_hit`, called by
  `KVCacheManager.get_computed_blocks`) returns the longest run of cached
  blocks from the first one, covering at most `num_tokens - 1` tokens, so the
  last known token is always computed.
- The free queue (`kv_cache_utils.py`, `FreeKVCacheBlockQueue`) holds every
  block that no request holds, in eviction order. New blocks come from its
  front (`BlockPool.get_new_blocks`), and taking a block that carries a hash
  evicts that hash (`BlockPool._maybe_evict_cached_block`). A hit on a cached
  block in the queue takes the block out of the queue (`BlockPool.touch`).
- Freeing (`SingleTypeKVCacheManager.free` -> `BlockPool.free_blocks`) walks
  a request's blocks tail first. A block that no request holds any more goes
  to the back of the queue if it carries a hash: LRU, evicted after every
  block freed before it, and within one request the tail before the head.
  A block without a hash (the partial last block; every block when prefix
  caching is off) goes to the front, tail first, and is reused first. The
  same happens when a request finishes, is aborted or is preempted.
- Admission (`SingleTypeKVCacheManager.get_num_blocks_to_allocate`): a new
  request needs its missing blocks plus those of its hits that sit in the
  free queue (touching them takes them out of it). With
  `scheduler_reserve_full_isl` (on by default, `vllm/config/scheduler.py`)
  the missing blocks are counted for all its known tokens, not only the
  first chunk (`KVCacheManager.allocate_slots(full_sequence_must_fit=True)`).

- Block 0 is the null block: vLLM sets it aside (`BlockPool.__init__` pops
  it off the free queue), so of `num_blocks` (vLLM's `num_gpu_blocks`,
  KV memory / block bytes) `num_blocks - 1` can be used, and the KV usage
  is the held share of those (`BlockPool.get_usage`). `null_block=False`
  (the SGLang flavour) uses them all.

Deliberate simplifications:

- There is no watermark. vLLM's `SchedulerConfig.watermark` is 0.0 by
  default.
- There is one KV cache group, of full attention, and the hash block size is
  the block size, so there are no partial-block hits and no copy-on-write.
- Python's `hash` stands in for sha256.

Only the bookkeeping is modelled (no tensors), so every operation is
O(blocks touched).
"""

from __future__ import annotations

from collections import OrderedDict

from langgraph_batch.emulator.request import Request

__all__ = ("BLOCK_SIZE", "KVCache")

BLOCK_SIZE = 16
"""The default block size in tokens (vLLM's default on GPUs)."""
_ROOT_HASH = 0x5EED


class KVCache:
    """Block bookkeeping for one engine.

    Args:
        num_blocks: Capacity in blocks (vLLM's `num_gpu_blocks`), the null
            block included when `null_block`.
        block_size: Tokens per block.
        enable_prefix_caching: Share full blocks by hash.
        cache_duplicates: Cache a full block even when a block with the same
            hash is already cached, as vLLM does. False keeps only the first
            copy in the cache, and the others are freed like blocks without a
            hash (the SGLang flavour: its radix tree keeps one copy of a prefix).
        null_block: Set block 0 aside, as vLLM does.

    Raises:
        ValueError: fewer than one usable block, or a block size below 1.
    """

    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int = BLOCK_SIZE,
        enable_prefix_caching: bool = True,
        cache_duplicates: bool = True,
        null_block: bool = False,
    ) -> None:
        first = 1 if null_block else 0
        if num_blocks - first < 1:
            raise ValueError(f"num_blocks must leave a usable block, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.num_usable_blocks = num_blocks - first
        """Blocks requests can hold (the null block excluded)."""
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.cache_duplicates = cache_duplicates
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        # Block id -> None, in eviction order (front first): FreeKVCacheBlockQueue.
        self._free: OrderedDict[int, None] = OrderedDict(
            (b, None) for b in range(first, num_blocks)
        )
        # Hash -> the earliest cached block with it that is still cached, and
        # the later copies in the order they were cached (BlockHashToBlockMap).
        self._cached: dict[int, int] = {}
        self._copies: dict[int, dict[int, None]] = {}
        self._num_hashed = 0
        self.evictions = 0
        """Cached blocks whose hash was dropped to reuse their memory."""

    @property
    def num_free(self) -> int:
        """Blocks that no request holds, cached ones included."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of the usable blocks held by requests, 0..1 (`BlockPool.get_usage`)."""
        return 1.0 - len(self._free) / self.num_usable_blocks

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold `tokens` tokens."""
        return -(-tokens // self.block_size)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that carry a prefix hash, held or free."""
        return self._num_hashed

    def reset_prefix_cache(self) -> None:
        """Forget every hash. Blocks held by requests stay held.

        vLLM's `Scheduler.reset_prefix_cache` refuses while any block is held
        (unless told to preempt every running request first). Here the hashes
        are dropped at once and the requests keep their blocks.
        """
        hashed = self._hash
        for b in self._cached.values():
            hashed[b] = None
        for copies in self._copies.values():
            for b in copies:
                hashed[b] = None
        self._cached.clear()
        self._copies.clear()
        self._num_hashed = 0

    # -- hashing -------------------------------------------------------------

    def block_hashes(self, req: Request, num_full_blocks: int) -> list[int]:
        """The request's block hashes up to `num_full_blocks`, computed once and kept."""
        hashes = req.block_hashes
        ids = req.all_ids
        size = self.block_size
        parent = hashes[-1] if hashes else hash((_ROOT_HASH, req.cache_salt))
        for i in range(len(hashes), num_full_blocks):
            start = i * size
            parent = hash((parent, tuple(ids[start : start + size])))
            hashes.append(parent)
        return hashes

    # -- lookup and allocation ----------------------------------------------

    def find_cached(self, req: Request) -> list[int]:
        """Blocks holding the longest cached prefix of the request's known tokens.

        At most `num_known_tokens - 1` tokens are covered, as in vLLM's
        `KVCacheManager.get_computed_blocks`: the last token is always computed.
        """
        if not self.enable_prefix_caching:
            return []
        max_blocks = (req.num_known_tokens - 1) // self.block_size
        if max_blocks <= 0:
            return []
        hits: list[int] = []
        cached = self._cached
        for h in self.block_hashes(req, max_blocks):
            b = cached.get(h)
            if b is None:
                break
            hits.append(b)
        return hits

    def allocate(
        self,
        req: Request,
        num_new: int,
        hits: list[int] | None = None,
        *,
        full_sequence: bool = False,
    ) -> bool:
        """Give the request blocks for `num_new` more tokens; False when memory is short.

        `hits` (only for a request with no blocks yet) are cached blocks it
        takes as its prefix; they are touched only when the allocation
        succeeds. Those of them in the free queue count against the free
        blocks. `full_sequence`: also require room for every known token of
        the request, not only for the next `num_new`.
        """
        if hits:
            have = len(hits)
            start_tokens = have * self.block_size
        else:
            have = len(req.blocks)
            start_tokens = req.num_computed
        need = self.blocks_for(start_tokens + num_new) - have
        required = (
            max(need, self.blocks_for(req.num_known_tokens) - have) if full_sequence else need
        )
        reclaim = sum(1 for b in hits if self._ref[b] == 0) if hits else 0
        if required + reclaim > len(self._free):
            return False
        if hits:
            ref = self._ref
            free = self._free
            for b in hits:
                if ref[b] == 0:
                    del free[b]
                ref[b] += 1
            req.blocks = list(hits)
            req.num_registered = len(hits)
        for _ in range(max(need, 0)):
            req.blocks.append(self._take_free())
        return True

    def _take_free(self) -> int:
        b, _ = self._free.popitem(last=False)
        if self._hash[b] is not None:
            self._uncache(b)
            self.evictions += 1
        self._ref[b] = 1
        return b

    def _uncache(self, b: int) -> None:
        h = self._hash[b]
        assert h is not None
        self._hash[b] = None
        self._num_hashed -= 1
        copies = self._copies.get(h)
        if self._cached.get(h) == b:
            if copies:
                nxt = next(iter(copies))
                del copies[nxt]
                self._cached[h] = nxt
            else:
                del self._cached[h]
        elif copies is not None:
            del copies[b]
        if copies is not None and not copies:
            del self._copies[h]

    def register_full_blocks(self, req: Request, num_tokens: int) -> None:
        """Put the request's full blocks covering `num_tokens` tokens into the cache."""
        if not self.enable_prefix_caching:
            return
        full = min(num_tokens // self.block_size, len(req.blocks))
        if full <= req.num_registered:
            return
        hashes = self.block_hashes(req, full)
        cached = self._cached
        hashed = self._hash
        for i in range(req.num_registered, full):
            b = req.blocks[i]
            if hashed[b] is not None:
                continue
            h = hashes[i]
            if h not in cached:
                cached[h] = b
            elif self.cache_duplicates:
                self._copies.setdefault(h, {})[b] = None
            else:
                continue
            hashed[b] = h
            self._num_hashed += 1
        req.num_registered = full

    def free(self, req: Request) -> None:
        """Release the request's blocks, tail first (`BlockPool.free_blocks`).

        A block no request holds any more goes to the back of the free queue
        if it carries a hash (it stays cached, LRU), to the front if not.
        """
        ref = self._ref
        hashed = self._hash
        free = self._free
        front: list[int] = []
        for b in reversed(req.blocks):
            ref[b] -= 1
            if ref[b] == 0:
                if hashed[b] is None:
                    front.append(b)
                else:
                    free[b] = None
        # FreeKVCacheBlockQueue.prepend_n: the first of `front` ends up first.
        for b in reversed(front):
            free[b] = None
            free.move_to_end(b, last=False)
        req.blocks = []
        req.num_registered = 0
