"""The loss curve under fsdp_config.param_gather against the exact one.

Runs `hypershard train` --steps steps (300 by default) of one shape per
layout (FSDP 4 and HSDP 2 x 2 on 4 ranks) once per wire format: null (the
parameters' dtype) and each of --formats (GATHER, or GATHER/REDUCE for
fsdp_config.param_gather and grad_reduce), from each seed of --seeds (init
and data order). Per layout and format it prints the mean loss of the last
--tail steps relative to the exact run of the same seed: the mean of that
difference over the seeds and its range, and the worst single step's
difference over all of them. The exact runs' own spread over seeds (the
largest last-tail mean over the smallest) is printed beside it: on a
small corpus two trajectories that part by rounding end as far apart as
two seeds do, so a difference inside that spread is not the format's.
The shape defaults to a 128-wide, 4-layer model on the built-in corpus;
--set overrides. Needs the Open MPI environment as for
bench/peer/compare.py.

    python3 bench/gather_curve.py --seeds 1234 1235 1236
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


def wire(fmt):
    """The keys of a --formats entry: GATHER, or GATHER/REDUCE."""
    gather, _, reduce = fmt.partition("/")
    return [f"fsdp_config.param_gather={gather}", f"fsdp_config.grad_reduce={reduce or 'null'}"]

SHAPE = ["model.dim=128", "model.n_layers=4", "model.n_heads=4", "model.n_kv_heads=2",
         "model.ffn_dim=352", "train.seq_len=64", "train.micro_batch_size=2",
         "train.eval_every=0", "train.log_every=1"]
LAYOUTS = {"fsdp4": ["fsdp_config.dp_shard_size=4"], "hsdp2x2": ["fsdp_config.dp_shard_size=2"]}


def curve(a, work, name, args):
    out = os.path.join(work, name)
    cmd = ["mpiexec", "-n", "4", os.path.abspath(a.bin), "train"] + SHAPE + args + [
        f"train.steps={a.steps}", "train.global_batch_size=8", f"train.out_dir={out}"] + a.set
    with open(out + ".log", "w") as f:
        if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode:
            sys.exit(f"{' '.join(cmd)} failed:\n{open(out + '.log').read()[-2000:]}")
    c = [json.loads(l)["loss"] for l in open(os.path.join(out, "metrics.jsonl"))]
    shutil.rmtree(out, ignore_errors=True)
    return c


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/hypershard")
    ap.add_argument("--formats", nargs="+", default=["int8", "fp8_e4m3", "int8/int8"],
                    help="GATHER or GATHER/REDUCE: fsdp_config.param_gather and grad_reduce")
    ap.add_argument("--seeds", nargs="+", type=int, default=[1234])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--tail", type=int, default=50)
    ap.add_argument("--set", nargs="*", default=[])
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="hs_gather_curve_")
    print(f"{a.steps} steps, seeds {' '.join(map(str, a.seeds))}; last-{a.tail} mean loss "
          "relative to the exact run of the same seed")
    print(f"{'layout':8} {'format':9} {'mean diff':>10} {'range':>17} {'worst step':>11} "
          f"{'exact runs spread':>18}")
    try:
        for layout, extra in LAYOUTS.items():
            tails, diffs, worst = [], {f: [] for f in a.formats}, {f: 0.0 for f in a.formats}
            for seed in a.seeds:
                s = extra + [f"train.seed={seed}"]
                ref = curve(a, work, f"{layout}-null-{seed}", s + wire("null"))
                ref_tail = statistics.mean(ref[-a.tail:])
                tails.append(ref_tail)
                for fmt in a.formats:
                    c = curve(a, work, f"{layout}-{fmt.replace('/', '-')}-{seed}", s + wire(fmt))
                    diffs[fmt].append(statistics.mean(c[-a.tail:]) / ref_tail - 1)
                    w = max((x / r - 1 for x, r in zip(c, ref)), key=abs)
                    worst[fmt] = w if abs(w) > abs(worst[fmt]) else worst[fmt]
            spread = max(tails) / min(tails) - 1
            for fmt in a.formats:
                d = diffs[fmt]
                print(f"{layout:8} {fmt:9} {statistics.mean(d):+10.2%} "
                      f"{min(d):+8.2%}..{max(d):+7.2%} {worst[fmt]:+11.2%} {spread:17.2%}",
                      flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
