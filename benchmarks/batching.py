"""Time the broker's form_batch on a 20k-group queue across 8 envs (CPU time, 60 calls).

Usage: python benchmarks/batching.py   (from the repo root)
"""

import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from atroposlib.api.batching import EnvShare, FairShareState, QueuedGroupRef, form_batch


def queue(sizes, n=20000, seed=0):
    rng = random.Random(seed)
    return [QueuedGroupRef(i, rng.randrange(8), rng.choice(sizes)) for i in range(n)]


def bench(name, q, batch, shares, reps=60):
    times = []
    for _ in range(reps):
        state = FairShareState({e: float(e) for e in range(8)})
        t = time.thread_time()
        b = form_batch(q, batch, shares, state)
        times.append(time.thread_time() - t)
        assert b is not None
    print(
        f"{name:48s} median {statistics.median(times) * 1e3:6.2f} ms"
        f"  min {min(times) * 1e3:6.2f} ms"
    )


weights = {e: EnvShare(weight=1.0 + e) for e in range(8)}
mins = {**weights, 3: EnvShare(weight=1.0, min_allocation=0.25), 5: EnvShare(min_allocation=0.1)}
for batch in (256, 1024):
    bench(f"uniform 8, batch {batch}", queue([8]), batch, weights)
    bench(f"mixed 4/8/16, batch {batch}", queue([4, 8, 16]), batch, weights)
    bench(f"mixed 3/5/7/16, batch {batch}", queue([3, 5, 7, 16]), batch, weights)
    bench(f"mixed 4/8/16 + 2 minimums, batch {batch}", queue([4, 8, 16]), batch, mins)
    bench(f"mixed 3/5/7/16 + 2 minimums, batch {batch}", queue([3, 5, 7, 16]), batch, mins)

# adversarial: the batch ends on sizes only one sender has, so every env walks past dead sizes
rng = random.Random(1)
q = [QueuedGroupRef(i, rng.randrange(8), 16) for i in range(19990)]
q += [QueuedGroupRef(19990 + i, None, 1) for i in range(10)]
bench("adversarial: 8 envs of 16s + ten 1s, batch 1000", q, 1000, weights)
q = [QueuedGroupRef(i, i % 8, 16 if i % 8 else 15) for i in range(20000)]
bench("adversarial: 15s only in env 0, batch 1023", q, 1023, weights)
