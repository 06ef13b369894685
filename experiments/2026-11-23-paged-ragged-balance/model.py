"""A host model of the ragged plan's tail (no GPU): each (sequence, head, split) block is a job of its keys plus a
fixed cost, handed in launch order (splits of one sequence and head together) to whichever of the block slots
(132 SMs x 2) frees first; the time is when the last job ends. The twin: every sequence at the mean length.

    python3 experiments/2026-11-23-paged-ragged-balance/model.py

Prints, for fixed costs of 50 to 500 keys' worth, the twin's time over the plan's for the current splits
(4 of 1024 keys) and for balanced splits at 3 to 8 splits. A model of waves, not of memory: blocks that run
alone in the tail get more bandwidth on a GPU than a slot's share, so it overstates the tail."""
import heapq
import math

LENS = [3674, 1712, 974, 2975, 3575, 1242, 1581, 456]  # PRESETS["paged-ragged"][0].seqlens(): B8 KV <= 4k
HEADS, SLOTS, KV_LEN = 32, 264, 4096


def makespan(jobs, slots=SLOTS):
    free = [0.0] * slots
    for job in jobs:
        heapq.heappush(free, heapq.heappop(free) + job)
    return max(free)


def plan(splits, cost, balance, empty_cost=20):
    chunk = math.ceil(KV_LEN / splits / 8) * 8
    jobs = []
    for n_keys in LENS:
        n = max(1, math.ceil(n_keys / chunk))
        size = math.ceil(math.ceil(n_keys / n) / 8) * 8 if balance else chunk
        for _ in range(HEADS):
            for s in range(splits):
                keys = max(0, min(n_keys, (s + 1) * size) - s * size)
                jobs.append(keys + cost if keys else empty_cost)
    return makespan(jobs)


def twin(cost, splits=2):
    mean = round(sum(LENS) / len(LENS))
    return makespan([mean / splits + cost] * (len(LENS) * HEADS * splits))


if __name__ == "__main__":
    for cost in (50, 150, 300, 500):
        row = [f"current {twin(cost) / plan(4, cost, False):.2f}"]
        row += [f"bal S{s} {twin(cost) / plan(s, cost, True):.2f}" for s in (3, 4, 5, 6, 8)]
        print(f"fixed cost {cost:3d} keys: twin/plan  " + "  ".join(row))
