#!/usr/bin/env python3
"""Branch-point study for docs/eviction-policy.md: does the shared prefix a
new conversation grows from (its "system prompt", i.e. the last already-seen
block before a request's first new one) tell which first-seen blocks come
back? If the trace mixed applications with different multi-turn habits,
per-branch reuse rates would separate first-seen blocks an online policy
could learn to keep.

Prints, for the first-seen blocks grouped by branch point: how many there
are, the share under the largest branch, and how concentrated first reuses
are when branches are ranked by their (true, whole-trace) reuse rate.

Usage: python3 branch_point_study.py [TRACE]   (standard library only; seconds)
"""
import collections
import json
import sys

TRACE = sys.argv[1] if len(sys.argv) > 1 else '../shared/data/traces/conversation_trace.jsonl'
reqs = [json.loads(line) for line in open(TRACE)]
uses = collections.Counter(b for r in reqs for b in r['hash_ids'])

seen = set()
by_branch = collections.defaultdict(lambda: [0, 0])  # branch -> [first-seen, reused]
for r in reqs:
    h = r['hash_ids']
    k = 0
    while k < len(h) and h[k] in seen:
        k += 1
    branch = h[k - 1] if k > 0 else None
    for b in h[k:]:
        if b not in seen:
            seen.add(b)
            by_branch[branch][0] += 1
            by_branch[branch][1] += uses[b] > 1

total = sum(n for n, _ in by_branch.values())
reused = sum(x for _, x in by_branch.values())
roots = len({r['hash_ids'][0] for r in reqs if r['hash_ids']})
big_branch, (big_n, big_x) = max(by_branch.items(), key=lambda kv: kv[1][0])
print(f'{len(reqs)} requests, {roots} distinct first block(s), {total} first-seen blocks, '
      f'{reused / total:.2f} of them reused')
print(f'{len(by_branch)} branch points; the largest (block {big_branch}) holds '
      f'{big_n / total:.0%} of first-seen blocks, reused {big_x / big_n:.2f}')
print('branches ranked by reuse rate (oracle): share of first-seen blocks -> share of first reuses')
cum_n = cum_x = 0
marks = [0.1, 0.25, 0.5, 0.75]
for n, x in sorted(by_branch.values(), key=lambda v: -v[1] / v[0]):
    cum_n += n
    cum_x += x
    if marks and cum_n >= marks[0] * total:
        print(f'  {cum_n / total:6.1%} -> {cum_x / reused:6.1%} (rate {cum_x / cum_n:.2f})')
        while marks and cum_n >= marks[0] * total:
            marks.pop(0)
