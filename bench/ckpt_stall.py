"""What a checkpoint save costs training: synchronous against checkpoint.async.

Each round runs `hypershard train` three times on the same shape (default
bench/peer's 512-wide model at W = 2, fp32, one thread per rank): without
checkpoints, with a synchronous save every --every steps and with
asynchronous ones, each with the trace on. The window is rank 0's steps
--warmup + 1 to the last; every periodic save after step --warmup and
before the last step falls in it (the run's own final save comes after).
Per save in the window it prints three figures:

  blocked  the training thread's time inside the save: the trace's
           "checkpoint" spans (a synchronous save; an async snapshot, with
           any wait for the save before it), and with a save in flight the
           polls after each step: "checkpoint poll" (one all-reduce, or the
           agreement that hands rank 0 the publish) and "checkpoint
           publish" (the agreement that ends the save). Each save also logs
           this figure on rank 0 ("cost the training thread"), and of it
           the snapshot's memory copy, printed as "snapshot". (A binary
           from before the polls were traced counts only the poll that
           published; --hypershard runs any build.)
  writer   async only: the writer thread's CPU seconds (its log line): the
           most it can take from training on cores training fills
  stall    (sum of the window's step intervals - their count x the run's
           median interval) / saves: everything a save adds to the
           training thread, the writer's competition for cores included.
           The baseline is the same run's median interval, so load that
           drifts between runs does not enter; the run without checkpoints,
           measured the same way over the same would-be saves, is the
           noise floor of this figure on the machine at that time.

It prints each round and the medians over rounds, and whether every
background save in the window was published inside it. Needs no Python
packages; the Open MPI environment as for bench/peer/compare.py.

    python3 bench/ckpt_stall.py --rounds 3
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "peer"))
from compare import ROOT, SHAPES, thread_env, train_args  # noqa: E402

MODES = ("none", "sync", "async")


def spans(trace_path, names):
    with open(trace_path) as f:
        d = json.load(f)
    ev = d["traceEvents"] if isinstance(d, dict) else d
    return sorted((e["ts"], e.get("dur", 0)) for e in ev
                  if e.get("name") in names and e.get("pid") == 0)


def published_in_window(log, steps, saves):
    """Whether every save in the window was published before the last
    step's line was logged."""
    lines = log.splitlines()
    last = next((i for i, l in enumerate(lines) if l.startswith(f"step {steps}/")), len(lines))
    done = [i for i, l in enumerate(lines) if "checkpoint: saved" in l]
    return sum(1 for i in done if i < last) >= saves


def run(a, mode, tmp, env):
    out = os.path.join(tmp, f"out_{mode}")
    ck = os.path.join(tmp, f"ck_{mode}")
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(ck, ignore_errors=True)
    args = train_args(a.shape, a.dtype, a.world, a.steps, out)
    args = [x for x in args if not x.startswith("checkpoint.") and not x.startswith("trace.")]
    args += ["trace.enabled=true", "train.log_every=1"]
    if mode != "none":
        args += [f"checkpoint.dir={ck}", f"checkpoint.save_every={a.every}",
                 f"checkpoint.async={'true' if mode == 'async' else 'false'}",
                 "checkpoint.keep_last=1"]
    else:
        args += ["checkpoint.dir=null"]
    cmd = [a.mpiexec, "-n", str(a.world), a.hypershard, "train"] + args
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-4000:]}")
    trace = os.path.join(out, "trace", "trace.json")
    starts = [ts for ts, _ in spans(trace, ("step",))]
    if len(starts) != a.steps:
        sys.exit(f"{mode}: {len(starts)} step spans in the trace, want {a.steps}")
    lo, hi = starts[a.warmup], starts[-1]
    iv = [b - a for a, b in zip(starts[a.warmup:], starts[a.warmup + 1:])]
    saves = sum(1 for k in range(a.warmup + 1, a.steps) if k % a.every == 0)
    stall = (sum(iv) - len(iv) * statistics.median(iv)) / 1e6 / saves
    blocked = sum(d for ts, d in spans(trace, ("checkpoint", "checkpoint poll",
                                               "checkpoint publish"))
                  if lo <= ts < hi) / 1e6 / saves
    cpu = [float(m) for m in re.findall(r"written on rank 0 in [0-9.]+ s, ([0-9.]+) s of it CPU",
                                        p.stdout)]
    writer = statistics.median(cpu) if cpu else 0.0
    # rank 0's own account of each async save (snapshot: the copy alone)
    snap = [float(m) for m in re.findall(r"cost the training thread [0-9.]+ s \(snapshot ([0-9.]+) s\)",
                                         p.stdout)]
    snapshot = statistics.median(snap) if snap else 0.0
    shutil.rmtree(ck, ignore_errors=True)
    inside = mode != "async" or published_in_window(p.stdout, a.steps, saves)
    return {"stall": stall, "blocked": blocked, "writer": writer, "snapshot": snapshot,
            "step": statistics.median(iv) / 1e6, "saves": saves, "inside": inside}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hypershard", default=os.path.join(ROOT, "build", "hypershard"))
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--shape", default="512", choices=sorted(SHAPES))
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="threads per rank")
    p.add_argument("--every", type=int, default=5, help="checkpoint.save_every")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", default=None, help="where checkpoints go (default: a temp dir)")
    p.add_argument("--modes", default=",".join(MODES),
                   help="comma-separated subset of none,sync,async (none: the noise floor)")
    a = p.parse_args()
    modes = [m for m in MODES if m in a.modes.split(",")]
    if "sync" not in modes or "async" not in modes:
        p.error("--modes needs sync and async")
    env = thread_env(a)
    tmp = tempfile.mkdtemp(prefix="hs_ckpt_stall_", dir=a.dir)
    res = {m: [] for m in modes}
    try:
        for r in range(a.rounds):
            line = []
            for mode in modes:
                x = run(a, mode, tmp, env)
                res[mode].append(x)
                line.append(f"{mode}: stall {x['stall']:+.3f} blocked {x['blocked']:.3f} "
                            f"(snapshot {x['snapshot']:.3f}) writer {x['writer']:.3f} "
                            f"(step {x['step']:.2f})")
                if not x["inside"]:
                    line.append("(a background save ended past the window: raise --steps)")
            print(f"round {r}, {x['saves']} saves in {a.steps - a.warmup - 1} steps, s per save: "
                  + "; ".join(line), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    keys = ("stall", "blocked", "snapshot", "writer", "step")
    med = {m: {k: statistics.median(x[k] for x in v) for k in keys} for m, v in res.items()}
    for m, v in med.items():
        print(f"median {m:5s}: stall {v['stall']:+.3f} s, blocked {v['blocked']:.3f} s "
              f"(snapshot {v['snapshot']:.3f} s), writer CPU {v['writer']:.3f} s per save; "
              f"step {v['step']:.2f} s")
    for k in ("stall", "blocked"):
        y, s = med["async"][k], med["sync"][k]
        print(f"async / sync {k}: {100 * y / s if s > 0 else float('nan'):.1f}%")

if __name__ == "__main__":
    main()
