"""What FSDP costs a step: W = 2 against two ranks' worth of work without it.

Each round runs `hypershard train` on 2 ranks with FSDP (dp_shard_size 2,
SHAPES' sequences per rank, one thread per rank), then, on the same cores
at the same time, two independent one-process runs of the same model with
one rank's half of the global batch and one thread each: the same compute
per core with no collective, no comm thread and no wait for a peer. It
prints each round's median step (after warm-up) of both, their ratio
(FSDP step / the mean of the two independent runs' steps; <= 1.05 is the
target of docs/performance.md) and the median ratio over the rounds. The
rounds alternate the two, so load drifts hit both. Needs no Python
packages; the Open MPI environment as for compare.py.

    python3 bench/peer/overhead.py --dtype fp32 bf16 --rounds 6
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from compare import ROOT, SHAPES, train_args


def median_step(out_dir, warmup):
    steps = [json.loads(l) for l in open(os.path.join(out_dir, "metrics.jsonl"))]
    return statistics.median(s["step_time_s"] for s in steps if s["step"] > warmup)


def start(cmd, env):
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def finish(p, cmd):
    out = p.communicate()[0]
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{out[-4000:]}")


def round_once(a, shape, dtype, env, tmp, r):
    steps = a.warmup + a.steps
    fsdp_dir = f"{tmp}/fsdp{r}"
    cmd = [a.mpiexec, "-n", "2", a.hypershard, "train"] + \
        train_args(shape, dtype, 2, steps, fsdp_dir)
    finish(start(cmd, env), cmd)
    alone = []
    for i in range(2):  # one rank's half of the batch each, side by side
        d = f"{tmp}/alone{r}{i}"
        c = [a.hypershard, "train"] + train_args(shape, dtype, 1, steps, d) + ["train.threads=1"]
        alone.append((start(c, env), c, d))
    for p, c, _ in alone:
        finish(p, c)
    return median_step(fsdp_dir, a.warmup), [median_step(d, a.warmup) for _, _, d in alone]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hypershard", default=os.path.join(ROOT, "build", "hypershard"))
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--shape", nargs="+", default=["512"], choices=sorted(SHAPES))
    p.add_argument("--dtype", nargs="+", default=["fp32", "bf16"], choices=("fp32", "bf16"))
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=10, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=2)
    a = p.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rows = []
    with tempfile.TemporaryDirectory(prefix="hs_overhead_") as tmp:
        for shape in a.shape:
            for dtype in a.dtype:
                ratios = []
                for r in range(a.rounds):
                    w2, alone = round_once(a, shape, dtype, env, tmp, r)
                    ratios.append(w2 / statistics.mean(alone))
                    print(f"{shape} {dtype} round {r + 1}: FSDP W=2 {w2:.3f} s, alone "
                          f"{alone[0]:.3f} / {alone[1]:.3f} s, ratio {ratios[-1]:.3f}", flush=True)
                rows.append((shape, dtype, ratios))
    print(f"medians of {a.steps} steps after {a.warmup} warm-up steps, {a.rounds} alternating rounds")
    print("| shape | dtype | ratio per round | median ratio |")
    print("|---|---|---|---|")
    for shape, dtype, ratios in rows:
        print(f"| {shape} | {dtype} | {', '.join(f'{x:.3f}' for x in ratios)} | "
              f"{statistics.median(ratios):.3f} |")


if __name__ == "__main__":
    main()
