"""hypershard next to PyTorch FSDP2 on the same machine, in one run.

For each requested case (shape x dtype x world size) this alternates the
PyTorch peer (peer_fsdp.py under torchrun) and `hypershard train` with the
same model, batch, optimizer (AdamW, betas 0.9/0.95, eps 1e-8, weight decay
0.1, clipping at 1.0, constant lr) and threads per rank, --rounds times, and
prints per case the median step time of each (median over rounds of the
median after warm-up), tokens/s, the largest peak RSS of any rank and the
speed ratio (PyTorch step / hypershard step: > 1 means hypershard is
faster). Next to them, the model FLOP utilisation: hypershard's MFU as its
trainer reports it (model FLOPs over the GEMM peak of the compute dtype,
measured by every rank at start-up, docs/training.md), PyTorch's on the same
FLOPs and the same peak (hypershard's MFU x hypershard step / PyTorch step),
and the MFU a 2x speed ratio would take (twice PyTorch's).

With --breakdown it instead puts, per shape, dtype and world size, the
step of `hypershard bench step --breakdown` next to the PyTorch peer's
under torch.profiler, both split by the same op classes (ms per step and
share): hypershard's by its device profile, PyTorch's by the self CPU time
of its ops, labelled by module hooks (peer_fsdp.py --profile); over W ranks
both are rank 0's. "other" is each step's wall time outside its named
classes.

It installs nothing. Give it a Python with torch and transformers:
    python3 -m venv /tmp/peer && /tmp/peer/bin/pip install torch transformers
    python3 bench/peer/compare.py --python /tmp/peer/bin/python --world 2
MPI runs need the usual Open MPI environment (as root on 2 cores:
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OMPI_MCA_rmaps_base_oversubscribe=1).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

SHAPES = {  # dim, layers, heads, kv heads, ffn, vocab, seq, sequences per rank
    "512": (512, 8, 8, 4, 1408, 4096, 256, 4),
    "demo": (128, 4, 4, 2, 384, 256, 64, 8),
}


def run(cmd, env):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-4000:]}")
    return p.stdout


def peer(a, shape, dtype, world, env):
    d, L, h, kv, f, v, t, b = SHAPES[shape]
    torchrun = os.path.join(os.path.dirname(a.python), "torchrun")
    cmd = [torchrun, "--standalone", f"--nproc_per_node={world}",
           os.path.join(HERE, "peer_fsdp.py"), f"--dim={d}", f"--layers={L}", f"--heads={h}",
           f"--kv-heads={kv}", f"--ffn={f}", f"--vocab={v}", f"--seq={t}", f"--batch={b}",
           f"--steps={a.steps}", f"--warmup={a.warmup}", f"--threads={a.threads}",
           f"--dtype={dtype}"]
    out = run(cmd, env)
    r = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    return r["median_step_s"], r["max_rss_kib"]


def model_args(shape, dtype):
    """The config keys of one case's model and mixed precision (the peer's
    bf16: bf16 parameters, fp32 reductions)."""
    d, L, h, kv, f, v, t, b = SHAPES[shape]
    args = [f"model.dim={d}", f"model.n_layers={L}", f"model.n_heads={h}",
            f"model.n_kv_heads={kv}", f"model.ffn_dim={f}", f"model.vocab_size={v}"]
    if dtype == "bf16":
        args += ["fsdp_config.mix_precision.param_dtype=bfloat16",
                 "fsdp_config.mix_precision.reduce_dtype=float32"]
    return args


def train_args(shape, dtype, world, steps, out_dir):
    """`hypershard train` overrides for one case: the peer's model, batch
    (SHAPES' sequences per rank), optimizer and schedule."""
    d, L, h, kv, f, v, t, b = SHAPES[shape]
    return model_args(shape, dtype) + [
            f"train.seq_len={t}", f"train.micro_batch_size={b}",
            f"train.global_batch_size={b * world}", f"train.steps={steps}",
            "train.eval_every=0", "optimizer._target_=adamw", "optimizer.lr=3e-4",
            "optimizer.betas=[0.9,0.95]", "optimizer.eps=1e-8", "optimizer.weight_decay=0.1",
            "optimizer.clip_grad_norm=1.0", "optimizer.schedule.warmup_steps=0",
            "optimizer.schedule.decay=constant", f"fsdp_config.dp_shard_size={world}",
            "checkpoint.dir=null", "trace.enabled=false", f"train.out_dir={out_dir}"]


def ours(a, shape, dtype, world, env, out_dir):
    args = train_args(shape, dtype, world, a.warmup + a.steps, out_dir) + getattr(a, "set", [])
    launch = [] if world == 1 else [a.mpiexec, "-n", str(world)]
    # each rank's peak RSS (KiB) into its own file: rss.<rank>
    timed = ['/usr/bin/time -f %M -o "$0/rss.${OMPI_COMM_WORLD_RANK:-0}" "$@"', out_dir]
    os.makedirs(out_dir, exist_ok=True)
    run(launch + ["sh", "-c"] + timed + [a.hypershard, "train"] + args, env)
    rss = max(int(open(os.path.join(out_dir, f"rss.{r}")).read().split()[-1])
              for r in range(world))
    steps = [json.loads(l) for l in open(os.path.join(out_dir, "metrics.jsonl"))]
    timed_steps = [s for s in steps if s["step"] > a.warmup]
    return (statistics.median(s["step_time_s"] for s in timed_steps), rss,
            statistics.median(s["mfu"] for s in timed_steps))


def bench_breakdown(a, shape, dtype, world, env, tmp):
    """`hypershard bench step --breakdown` on one case: (classes ms, step ms)."""
    d, L, h, kv, f, v, t, b = SHAPES[shape]
    out = os.path.join(tmp, f"hs_{shape}_{dtype}_{world}.json")
    launch = [] if world == 1 else [a.mpiexec, "-n", str(world)]
    cmd = launch + [a.hypershard, "bench", "step", "--quick", "--threads", str(a.threads),
                    "--steps", str(a.steps), "--batch", str(b), "--seq", str(t), "--breakdown",
                    "--json", out]
    for key in model_args(shape, dtype):
        cmd += ["--set", key]
    run(cmd, env)
    bd = json.load(open(out))["models"][0]["breakdown"]
    classes = {c["class"]: c["ms"] for c in bd["classes"]}
    classes["other"] = bd["other_ms"]
    return classes, bd["profiled_step_ms"]


def peer_breakdown(a, shape, dtype, world, env, tmp):
    """The PyTorch peer's step under torch.profiler: (classes ms, step ms)."""
    d, L, h, kv, f, v, t, b = SHAPES[shape]
    out = os.path.join(tmp, f"pt_{shape}_{dtype}_{world}.json")
    torchrun = os.path.join(os.path.dirname(a.python), "torchrun")
    run([torchrun, "--standalone", f"--nproc_per_node={world}", os.path.join(HERE, "peer_fsdp.py"),
         f"--dim={d}", f"--layers={L}", f"--heads={h}", f"--kv-heads={kv}", f"--ffn={f}",
         f"--vocab={v}", f"--seq={t}", f"--batch={b}", f"--steps={a.steps}",
         f"--warmup={a.warmup}", f"--threads={a.threads}", f"--dtype={dtype}",
         f"--profile={out}"], env)
    r = json.load(open(out))
    classes = dict(r["classes"])
    named = sum(ms for c, ms in classes.items() if c != "other")
    classes["other"] = r["step_ms"] - named
    return classes, r["step_ms"]


def print_breakdown(a, shape, dtype, world, env, tmp):
    hs, hs_step = bench_breakdown(a, shape, dtype, world, env, tmp)
    pt, pt_step = peer_breakdown(a, shape, dtype, world, env, tmp)
    print(f"\n{shape} {dtype} W = {world}: hypershard {hs_step:.1f} ms, PyTorch {pt_step:.1f} ms")
    print("| class | hypershard ms | share | PyTorch ms | share |")
    print("|---|---|---|---|---|")
    names = [c for c in hs if c != "other"]
    names += [c for c in pt if c not in hs and c != "other"] + ["other"]
    for c in names:
        x, y = hs.get(c, 0.0), pt.get(c, 0.0)
        print(f"| {c} | {x:.1f} | {100 * x / hs_step:.1f}% | {y:.1f} | {100 * y / pt_step:.1f}% |")


def print_breakdowns(a, env):
    print(f"threads {a.threads} per rank; rank 0's means of {a.steps} steps after "
          f"{a.warmup} warm-up steps")
    with tempfile.TemporaryDirectory(prefix="hs_peer_bd_") as tmp:
        for shape in a.shape:
            for dtype in a.dtype:
                for world in a.world:
                    print_breakdown(a, shape, dtype, world, env, tmp)


def case_args(p, shapes):
    """The arguments naming the cases and how each is run (ab_builds.py
    shares them)."""
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--world", type=int, nargs="+", default=[2])
    p.add_argument("--shape", nargs="+", default=shapes, choices=sorted(SHAPES))
    p.add_argument("--dtype", nargs="+", default=["fp32", "bf16"], choices=("fp32", "bf16"))
    p.add_argument("--threads", type=int, default=1, help="threads per rank")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=2)


def thread_env(a):
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = str(a.threads)
    return env


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--python", required=True, help="a Python with torch and transformers")
    p.add_argument("--hypershard", default=os.path.join(ROOT, "build", "hypershard"))
    p.add_argument("--breakdown", action="store_true",
                   help="per shape, dtype and world size: both steps by op class")
    case_args(p, ["512", "demo"])
    a = p.parse_args()
    env = thread_env(a)
    if a.breakdown:
        print_breakdowns(a, env)
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="hs_peer_") as tmp:
        for shape in a.shape:
            for dtype in a.dtype:
                for world in a.world:
                    pt, hs = [], []
                    for r in range(a.rounds):  # alternating, so load drifts hit both
                        pt.append(peer(a, shape, dtype, world, env))
                        hs.append(ours(a, shape, dtype, world, env, f"{tmp}/{shape}{dtype}{world}{r}"))
                    d, L, h, kv, f, v, t, b = SHAPES[shape]
                    tokens = b * t * world
                    ps = statistics.median(x[0] for x in pt)
                    hss = statistics.median(x[0] for x in hs)
                    mfu = statistics.median(x[2] for x in hs)
                    rows.append((shape, dtype, world, ps, hss, tokens / ps, tokens / hss,
                                 max(x[1] for x in pt) / 1024, max(x[1] for x in hs) / 1024,
                                 mfu, mfu * hss / ps))
                    print(f"{shape} {dtype} W={world}: PyTorch {ps:.3f} s, hypershard {hss:.3f} s",
                          file=sys.stderr)
    print(f"threads per rank {a.threads}; medians over {a.rounds} alternating rounds of the "
          f"median of {a.steps} steps after {a.warmup} warm-up steps")
    print("| shape | dtype | W | PyTorch step s | hypershard step s | speed ratio | PyTorch tok/s "
          "| hypershard tok/s | PyTorch peak RSS MiB | hypershard peak RSS MiB "
          "| hypershard MFU | PyTorch MFU | MFU for 2x |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s, dt, w, ps, hss, pt_tok, hs_tok, prss, hrss, mfu, pt_mfu in rows:
        print(f"| {s} | {dt} | {w} | {ps:.3f} | {hss:.3f} | {ps / hss:.2f}x | {pt_tok:.0f} | "
              f"{hs_tok:.0f} | {prss:.0f} | {hrss:.0f} | {100 * mfu:.1f}% | "
              f"{100 * pt_mfu:.1f}% | {200 * pt_mfu:.1f}% |")


if __name__ == "__main__":
    main()
