#!/usr/bin/env python3
"""First-reuse study for docs/eviction-policy.md: how much of a trace's
prefix hit ratio comes from a block's first reuse, and what keeping
first-seen blocks costs when nothing tells the returning ones apart.

 - "second+ reuses only": the hit ratio of an unbounded cache that can only
   hit a block from its second reuse on (it learns from the first that the
   block comes back). Every online policy that cannot predict a first reuse
   is capped by it, whatever its capacity.
 - per holding time A (requests): the hit ratio first reuses within A
   requests add, and the blocks that holding every first-seen block for A
   requests keeps resident on average (compare with the cache's capacity in
   blocks: capacity tokens / 512).

Usage: python3 first_reuse_bound.py [TRACE]   (standard library only; seconds)
"""
import collections
import json
import sys

TRACE = sys.argv[1] if len(sys.argv) > 1 else '../shared/data/traces/conversation_trace.jsonl'
B = 512
reqs = [json.loads(line) for line in open(TRACE)]
total_in = sum(r['input_length'] for r in reqs)


def tokens(r, j):
    """Tokens block j of request r covers (the last one up to input_length)."""
    return min(B, r['input_length'] - B * j) if j == len(r['hash_ids']) - 1 else B


uses = collections.Counter()
hit_any = hit_second = 0
first_use = {}
first_reuse = {}  # block -> (distance in requests, tokens of that use)
for i, r in enumerate(reqs):
    hs = r['hash_ids']
    for j, h in enumerate(hs):  # the leading run already seen
        if uses[h] == 0:
            break
        hit_any += tokens(r, j)
        if uses[h] >= 2:
            hit_second += tokens(r, j)
    for j, h in enumerate(hs):
        if uses[h] == 0:
            first_use[h] = i
        elif uses[h] == 1 and h not in first_reuse:
            first_reuse[h] = (i - first_use[h], tokens(r, j))
        uses[h] += 1

print(f'unbounded cache: {hit_any / total_in:.4f}; second+ reuses only: {hit_second / total_in:.4f}')
print(f'{len(first_use):,} first-seen blocks, {len(first_reuse) / len(first_use):.0%} reused')
print('hold every first-seen block A requests: first-reuse hit ratio gained, blocks resident')
for A in [100, 244, 500, 1000, 2000, 4000]:
    gained = sum(t for d, t in first_reuse.values() if d <= A)
    held = sum(min(first_reuse[h][0], A) if h in first_reuse else A for h in first_use)
    print(f'  A={A:>5}: +{gained / total_in:.4f}  {held / len(reqs):>8,.0f} blocks')
