#!/usr/bin/env python3
"""plan --time against measurement on this machine.

Runs each layout of LAYOUTS with `hypershard train` (under $MPIEXEC for
W > 1), takes the median step_time_s of metrics.jsonl past the first
steps, asks `hypershard plan --time --json` for the same config on the
cluster file, and prints both with the error. Beside them, the exposed
communication (FSDP's waits; TP, CP and EP collectives) and the pipeline
bubble as metrics.jsonl measures them on rank 0, medians of the same
steps, and as the plan predicts them. The model is small enough for a
layout to take seconds on two cores.

usage: bench/plan_check.py --bin build/hypershard --cluster FILE
                           [--steps N] [--only NAME,...] [--markdown]
Exit 1 when the median error is above --median-limit or the worst above
--worst-limit (fractions; default 0.10 and 0.25, as docs/performance.md
states them)."""
import argparse, json, os, statistics, subprocess, sys, tempfile

MODEL = ["model.dim=256", "model.n_layers=4", "model.n_heads=4", "model.n_kv_heads=4",
         "model.ffn_dim=768", "train.seq_len=256", "train.micro_batch_size=4",
         "train.eval_every=0"]
MOE = ["model.arch=moe", "model.moe.num_experts=4", "model.moe.top_k=2",
       "model.moe.expert_ffn_dim=384"]

# name, world, overrides
LAYOUTS = [
    ("one process", 1, []),
    ("FSDP 2", 2, ["fsdp_config.dp_shard_size=2"]),
    ("FSDP 4", 4, ["fsdp_config.dp_shard_size=4"]),
    ("FSDP 8", 8, ["fsdp_config.dp_shard_size=8"]),
    ("HSDP 2x2", 4, ["fsdp_config.dp_shard_size=2"]),
    ("FSDP 2, bf16", 2, ["fsdp_config.dp_shard_size=2",
                         "fsdp_config.mix_precision.param_dtype=bfloat16",
                         "fsdp_config.mix_precision.reduce_dtype=float32"]),
    ("FSDP 2, 4 micro-batches", 2, ["fsdp_config.dp_shard_size=2", "train.global_batch_size=32"]),
    ("FSDP 2, full AC", 2, ["fsdp_config.dp_shard_size=2", "train.activation_checkpointing=true"]),
    ("TP 2 + SP", 2, ["accelerator.tp_size=2", "accelerator.sequence_parallel=true"]),
    ("TP 2 x FSDP 2", 4, ["accelerator.tp_size=2", "fsdp_config.dp_shard_size=2"]),
    ("CP 2 allgather", 2, ["accelerator.cp_size=2", "accelerator.cp_rotate_method=allgather"]),
    ("CP 2 ring", 2, ["accelerator.cp_size=2", "accelerator.cp_rotate_method=ring"]),
    ("CP 4 alltoall", 4, ["accelerator.cp_size=4", "accelerator.cp_rotate_method=alltoall"]),
    ("EP 2 (MoE)", 2, MOE + ["accelerator.ep_size=2", "fsdp_config.dp_shard_size=2"]),
    ("PP 2 gpipe", 2, ["accelerator.pp_size=2", "accelerator.pp_schedule=gpipe",
                       "train.global_batch_size=16"]),
    ("PP 2 1f1b", 2, ["accelerator.pp_size=2", "accelerator.pp_schedule=1f1b",
                      "train.global_batch_size=16"]),
    ("PP 2 interleaved x2", 2, ["accelerator.pp_size=2", "accelerator.pp_schedule=interleaved_1f1b",
                                "accelerator.pp_virtual_stages=2", "train.global_batch_size=16"]),
    ("PP 2 zb1p", 2, ["accelerator.pp_size=2", "accelerator.pp_schedule=zb1p",
                      "train.global_batch_size=16"]),
    ("PP 2 zbv", 2, ["accelerator.pp_size=2", "accelerator.pp_schedule=zbv",
                     "accelerator.pp_virtual_stages=2", "train.global_batch_size=16"]),
    ("PP 2 x FSDP 2", 4, ["accelerator.pp_size=2", "fsdp_config.dp_shard_size=2",
                          "train.global_batch_size=16"]),
]


def measure(args, world, over, tmp):
    out = os.path.join(tmp, "run")
    cmd = [args.bin, "train", *MODEL, *over, f"train.steps={args.steps}", f"train.out_dir={out}"]
    if world > 1:
        cmd = [os.environ.get("MPIEXEC", "mpiexec"), "-n", str(world), *cmd]
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode:
        sys.exit(f"plan_check: {' '.join(cmd)}: exit {r.returncode}\n{r.stderr[-2000:]}")
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"step_time_s"' in l]
    rows = [r for r in rows if r["step"] > 2]
    subprocess.run(["rm", "-rf", out])
    bubbles = [r["bubble"] for r in rows if "bubble" in r]  # pipeline runs only
    return (statistics.median(r["step_time_s"] for r in rows),
            statistics.median(exposed(r) for r in rows),
            statistics.median(bubbles) if bubbles else None)


def exposed(r):
    """FSDP's exposed waits and the TP/CP/EP collectives of a metrics row
    or of plan --time's JSON (whose hand-overs sit inside the bubble)."""
    return r["exposed_fsdp_s"] + sum(v for k, v in r["exposed_s"].items() if k != "pp")


def predict(args, world, over):
    cmd = [args.bin, "plan", "--time", "--json", "--cluster", args.cluster, "--world", str(world),
           *MODEL, *over]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def search(args):
    """Runs the --search's first K layouts of W ranks and the plain FSDP
    layout; the search's first should be within 10% of the fastest run."""
    cmd = [args.bin, "plan", "--search", "--top", str(args.top), "--cluster", args.cluster,
           "--world", str(args.search), *MODEL]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()
    ranked = []
    for line in out:
        f = line.split()
        if f and f[0].isdigit():
            ranked.append((float(f[1]), f[6:]))
    rows = ranked + [(None, [f"fsdp_config.dp_shard_size={args.search}"])]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for pred, over in rows:
            m = measure(args, args.search, over, tmp)[0]
            if pred is None:
                pred = predict(args, args.search, over)["step_time_s"]
            runs.append((m, pred, over))
            print(f"measured {m:.4f} s  predicted {pred:.4f} s  {' '.join(over)}", flush=True)
    fastest = min(r[0] for r in runs)
    first = runs[0][0]
    print(f"W {args.search}: the search's first runs in {first:.4f} s, the fastest of "
          f"{len(runs)} run in {fastest:.4f} s: {100 * (first / fastest - 1):+.1f}%")
    return 0 if first <= 1.10 * fastest else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--only", default="")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--median-limit", type=float, default=0.10)
    ap.add_argument("--worst-limit", type=float, default=0.25)
    ap.add_argument("--search", type=int, default=0, help="check plan --search at W ranks")
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args()
    if args.search:
        return search(args)
    only = [s for s in args.only.split(",") if s]
    errs = []
    if args.markdown:
        print("| layout | W | measured s | predicted s | error | exposed comm s, measured / "
              "predicted | bubble, measured / predicted |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for name, world, over in LAYOUTS:
            if only and name not in only:
                continue
            m, m_exp, m_bub = measure(args, world, over, tmp)
            p = predict(args, world, over)
            err = p["step_time_s"] / m - 1
            errs.append(abs(err))
            p_exp = exposed(p)
            bubble = f"{100 * m_bub:.0f}% / {100 * p['bubble']:.0f}%" if m_bub is not None else "-"
            if args.markdown:
                print(f"| {name} | {world} | {m:.4f} | {p['step_time_s']:.4f} | {100 * err:+.1f}% "
                      f"| {m_exp:.4f} / {p_exp:.4f} | {bubble} |")
            else:
                print(f"{name:26s} W {world}  measured {m:.4f} s  predicted {p['step_time_s']:.4f} s"
                      f"  {100 * err:+6.1f}%  exposed {m_exp:.4f} / {p_exp:.4f} s  bubble {bubble}",
                      flush=True)
    med, worst = statistics.median(errs), max(errs)
    print(f"{len(errs)} layouts: median error {100 * med:.1f}%, worst {100 * worst:.1f}%")
    return 0 if med <= args.median_limit and worst <= args.worst_limit else 1


if __name__ == "__main__":
    sys.exit(main())
