"""Two hypershard builds side by side, in one run: compare.py's hypershard
side (same shapes, batch, optimizer and launch) for build A and build B,
alternating A, B, A, B, ... --rounds times per case, so both see the same
machine. Prints per case each build's median step time (median over rounds
of the median after warm-up), the ratio B / A (< 1: B is faster) and each
round's pair, for checking that a change costs no speed.

    python3 bench/peer/ab_builds.py --a /tmp/before/build/hypershard \
        --b build/hypershard --world 1 2 --dtype fp32 bf16

--set adds `train` overrides to both sides (e.g. optimizer.fp32_main_params=true).

It needs no PyTorch. MPI runs need the usual Open MPI environment.
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import case_args, ours, thread_env  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--a", required=True, help="the hypershard binary of build A (before)")
    p.add_argument("--b", required=True, help="the hypershard binary of build B (after)")
    case_args(p, ["512"])
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="more `train` overrides, the same for both builds")
    a = p.parse_args()
    env = thread_env(a)
    print("| shape | dtype | W | A step s | B step s | B / A | rounds (A/B) |")
    print("|---|---|---|---|---|---|---|")
    for shape in a.shape:
        for dtype in a.dtype:
            for world in a.world:
                times = {"a": [], "b": []}
                with tempfile.TemporaryDirectory() as tmp:
                    for r in range(a.rounds):
                        for side in ("a", "b"):
                            a.hypershard = getattr(a, side)
                            out = os.path.join(tmp, f"{side}{r}")
                            times[side].append(ours(a, shape, dtype, world, env, out)[0])
                ma, mb = statistics.median(times["a"]), statistics.median(times["b"])
                pairs = ", ".join(f"{x:.3f}/{y:.3f}" for x, y in zip(times["a"], times["b"]))
                print(f"| {shape} | {dtype} | {world} | {ma:.3f} | {mb:.3f} | {mb / ma:.3f} | "
                      f"{pairs} |", flush=True)


if __name__ == "__main__":
    main()
