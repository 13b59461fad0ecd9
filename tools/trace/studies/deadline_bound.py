#!/usr/bin/env python3
"""Bound study for docs/eviction-policy.md: how well can per-class holding
times do on a Mooncake-format trace when the classes' reuse statistics are
known perfectly (offline)?

For each class of block use (earlier uses, last block of the prompt, prompt
length, how much of the prompt was already seen, time since the previous
use), the holding time A_c is chosen as a knapsack: maximise expected hits
subject to the expected occupancy, sum of min(reuse distance, A_c), fitting
the capacity. "knapsack" is what the cutoffs promise; "simulated" replays
them through a prefix-safe cache that evicts the leaf with the earliest
deadline (last use + A_c).

Usage: python3 deadline_bound.py [TRACE]   (needs python3-numpy; ~1 minute)
"""
import json, collections, bisect, heapq, sys
import numpy as np
TRACE = sys.argv[1] if len(sys.argv) > 1 else '../shared/data/traces/conversation_trace.jsonl'
reqs=[json.loads(l) for l in open(TRACE)]
B=512
total_in=sum(r['input_length'] for r in reqs)
uses=collections.defaultdict(list)
for i,r in enumerate(reqs):
    for h in r['hash_ids']: uses[h].append(i)
def tok(r,j): return min(B, r['input_length']-B*j) if j==len(r['hash_ids'])-1 else B
def leading_run(hs, present):
    """How many of hs, from the first, are in `present`."""
    run=0
    for h in hs:
        if h not in present: break
        run+=1
    return run
def features(r, j, earlier_uses, seen_run, gap):
    """The classes a block use can be put in, all known online."""
    n=len(r['hash_ids'])
    return dict(occ=min(earlier_uses,4), last=(j==n-1),
                lb=(0 if n<8 else 1 if n<16 else 2 if n<32 else 3),
                hb=(0 if seen_run<=1 else 1 if seen_run<n-1 else 2),
                gap=(None if gap is None else min(int(np.log2(max(gap,1))),12)))
cnt=collections.Counter()
lastuse={}
rows=[]  # (class, d, tokens_of_next_use)
for i,r in enumerate(reqs):
    hs=r['hash_ids']
    run=leading_run(hs, cnt)
    for j,h in enumerate(hs):
        c=cnt[h]; cnt[h]+=1
        u=uses[h]; k=bisect.bisect_right(u,i)
        if k<len(u):
            i2=u[k]; r2=reqs[i2]; j2=r2['hash_ids'].index(h); d=i2-i; t=tok(r2,j2)
        else: d=None; t=0
        gap = (i-lastuse[h]) if h in lastuse else None
        lastuse[h]=i
        rows.append((features(r,j,c,run,gap),d,t))
cap_req = {1_000_000:1953, 3_000_000:5859, 10_000_000:19531}
def bound(keyf, cap):
    groups=collections.defaultdict(list)
    for f,d,t in rows: groups[keyf(f)].append((d,t))
    # per group: candidate cutoffs
    A_grid=[0,25,50,100,150,200,250,300,400,500,600,800,1000,1300,1600,2000,2500,3000,4000,6000,12031]
    G={}
    for g,L in groups.items():
        ds=np.array([d if d is not None else 10**9 for d,t in L]); ts=np.array([t for d,t in L])
        res=[]
        for A in A_grid:
            h=ts[ds<=A].sum(); c=np.minimum(ds,A).sum()
            res.append((A,h,c))
        G[g]=res
    def solve(lam):
        H=C=0; ch={}
        for g,res in G.items():
            best=max(res,key=lambda x:x[1]-lam*x[2]); H+=best[1]; C+=best[2]; ch[g]=best[0]
        return H,C,ch
    lo,hi=0.0,1e4
    for _ in range(60):
        lam=(lo+hi)/2; H,C,ch=solve(lam)
        if C/len(reqs)>cap: lo=lam
        else: hi=lam
    H,C,ch=solve(hi)
    return H/total_in, C/len(reqs), ch
def simulate(cap_tokens, keyf, A):
    cap=cap_tokens//B
    parent={}; children=collections.defaultdict(int)
    prio={}; heap=[]; cnt=collections.Counter(); lastuse={}
    hit=0
    for i,r in enumerate(reqs):
        hs=r['hash_ids']; n=len(hs)
        run_=leading_run(hs, prio)
        for j in range(run_): hit+=tok(r,j)
        srun=leading_run(hs, cnt)
        for j in range(n-1,-1,-1):
            h=hs[j]
            c=cnt[h]; gap=(i-lastuse[h]) if h in lastuse else None
            a=A.get(keyf(features(r,j,c,srun,gap)),0)
            new = h not in prio
            if new:
                while len(prio)>=cap:
                    while True:
                        p,hh=heapq.heappop(heap)
                        if hh in prio and prio[hh]==p and children[hh]==0: break
                    del prio[hh]
                    pa=parent.pop(hh,None)
                    if pa is not None:
                        children[pa]-=1
                        if children[pa]==0 and pa in prio: heapq.heappush(heap,(prio[pa],pa))
                if j>0:
                    parent[h]=hs[j-1]; children[hs[j-1]]+=1
            p=i+a+ (n-j)*1e-3  # ancestors later
            if not new: p=max(p,prio[h])
            prio[h]=p; heapq.heappush(heap,(p,h))
        for h in hs: cnt[h]+=1; lastuse[h]=i
    return hit/total_in

CLASSES = [
    ('earlier uses', lambda f: f['occ']),
    ('+ last block, prompt length, prompt hit', lambda f: (f['occ'], f['last'], f['lb'], f['hb'])),
    ('+ time since previous use', lambda f: (f['occ'], f['last'], f['lb'], f['hb'], f['gap'])),
]
if __name__ == '__main__':
    for name, kf in CLASSES:
        for cap in [1_000_000, 3_000_000, 10_000_000]:
            h, c, ch = bound(kf, cap_req[cap])
            print(f'{name:45s} {cap:>10,} tokens  knapsack {h:.4f}  simulated {simulate(cap, kf, ch):.4f}',
                  flush=True)
