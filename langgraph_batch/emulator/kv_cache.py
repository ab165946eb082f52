"""A paged KV cache with prefix caching, modelled on vLLM V1's block pool.

Fixed 16-token blocks; a block of a request becomes shareable once it is full:
its hash chains the parent block's hash with the 16 token ids (the first
block also mixes in the request's `cache_salt`). Freed blocks keep their hash
and stay reusable until their memory is taken: the free queue is LRU, the
least recently freed block is evicted first.

Only the bookkeeping is modelled (no tensors), so every operation is O(blocks
touched).
"""

from __future__ import annotations

from collections import OrderedDict

from langgraph_batch.emulator.request import Request

__all__ = ("BLOCK_SIZE", "KVCache")

BLOCK_SIZE = 16
_ROOT_HASH = 0x5EED


class KVCache:
    """Block bookkeeping for one engine.

    Args:
        num_blocks: Capacity in blocks.
        enable_prefix_caching: Share full blocks by hash.
    """

    def __init__(self, *, num_blocks: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._cached: dict[int, int] = {}
        self.evictions = 0

    @property
    def num_free(self) -> int:
        """Blocks not held by any request (cached ones included)."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests, 0..1."""
        return 1.0 - len(self._free) / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that currently carry a prefix hash."""
        return len(self._cached)

    def reset_prefix_cache(self) -> None:
        """Forget every hash (blocks held by requests stay held)."""
        for b in list(self._cached.values()):
            self._hash[b] = None
        self._cached.clear()

    # -- hashing -------------------------------------------------------------

    @staticmethod
    def block_hashes(req: Request, num_full_blocks: int) -> list[int]:
        """The request's block hashes up to `num_full_blocks`, computed once and kept."""
        hashes = req.block_hashes
        ids = req.all_ids
        parent = hashes[-1] if hashes else hash((_ROOT_HASH, req.cache_salt))
        for i in range(len(hashes), num_full_blocks):
            start = i * BLOCK_SIZE
            parent = hash((parent, tuple(ids[start : start + BLOCK_SIZE])))
            hashes.append(parent)
        return hashes

    # -- lookup and allocation ----------------------------------------------

    def find_cached(self, req: Request) -> list[int]:
        """Blocks holding the longest cached prefix of the request's known tokens.

        At least one token is always left to compute, as in vLLM.
        """
        if not self.enable_prefix_caching:
            return []
        max_blocks = (req.num_known_tokens - 1) // BLOCK_SIZE
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

    def allocate(self, req: Request, num_new: int, hits: list[int] | None = None) -> bool:
        """Give the request blocks for `num_new` more tokens; False when memory is short.

        `hits` (only for a request with no blocks yet) are cached blocks it
        takes as its prefix; they are touched only when the allocation succeeds.
        """
        have = len(req.blocks)
        if hits:
            have = len(hits)
            start_tokens = have * BLOCK_SIZE
        else:
            start_tokens = req.num_computed
        need = -(-(start_tokens + num_new) // BLOCK_SIZE) - have
        reclaim = sum(1 for b in hits if self._ref[b] == 0) if hits else 0
        if need + reclaim > len(self._free):
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
        h = self._hash[b]
        if h is not None:
            self._hash[b] = None
            if self._cached.get(h) == b:
                del self._cached[h]
            self.evictions += 1
        self._ref[b] = 1
        return b

    def register_full_blocks(self, req: Request, num_tokens: int) -> None:
        """Make the request's full blocks covering `num_tokens` tokens shareable."""
        if not self.enable_prefix_caching:
            return
        full = min(num_tokens // BLOCK_SIZE, len(req.blocks))
        if full <= req.num_registered:
            return
        hashes = self.block_hashes(req, full)
        cached = self._cached
        for i in range(req.num_registered, full):
            h = hashes[i]
            b = req.blocks[i]
            if h not in cached and self._hash[b] is None:
                cached[h] = b
                self._hash[b] = h
        req.num_registered = full

    def free(self, req: Request) -> None:
        """Release the request's blocks; hashed ones stay cached (LRU), tail first."""
        ref = self._ref
        free = self._free
        for b in reversed(req.blocks):
            ref[b] -= 1
            if ref[b] == 0:
                free[b] = None
                if self._hash[b] is None:
                    # Nothing to reuse in it: hand it out before any cached block.
                    free.move_to_end(b, last=False)
        req.blocks = []
        req.num_registered = 0
