"""What fsdp_config.param_gather buys on a slow link, and what it costs on
a fast one.

Two "hosts" on this machine: network namespaces joined by a veth pair
whose both ends are rate-limited by tc's token bucket (--rate, 1 Gbit/s by
default; this kernel has no netem, so no added delay), Open MPI over TCP
between them, 2 ranks per host: FSDP 4 with its shard ring across the
link. Each round runs the same shape once per wire format, side by side:
null (the parameters' dtype) and each entry of --formats (GATHER, or
GATHER/REDUCE for fsdp_config.param_gather and grad_reduce, then +hpzS for
a secondary shard over S ranks, fsdp_config.secondary_shard_size). Then
the same formats on one host at W = 2 (the shared-memory path, no link;
where no secondary shard fits, its entries are not run there). A
run's figure is the median step_time_s of steps --warmup + 1 to the last;
the table prints the medians over rounds and each format's speed-up over
null in the same place (> 1: faster). The shape is bench/peer's 512-wide
model at 4 layers unless --set overrides it. Needs root (namespaces, tc),
iproute2 and unshare; the Open MPI environment as for
bench/peer/compare.py.

    python3 bench/gather_link.py --rounds 3
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
    """The keys of a --formats entry: GATHER, or GATHER/REDUCE, then +hpzS
    for fsdp_config.secondary_shard_size=S."""
    fmt, _, hpz = fmt.partition("+hpz")
    gather, _, reduce = fmt.partition("/")
    return [f"fsdp_config.param_gather={gather}", f"fsdp_config.grad_reduce={reduce or 'null'}"] + (
        [f"fsdp_config.secondary_shard_size={hpz}"] if hpz else [])

SHAPE = ["model.dim=512", "model.n_layers=4", "model.n_heads=8", "model.n_kv_heads=4",
         "model.ffn_dim=1408", "model.vocab_size=4096", "train.seq_len=256",
         "train.micro_batch_size=1", "train.eval_every=0", "train.log_every=1"]


def sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


class Hosts:
    """Two namespaces with a rate-limited veth between them."""

    def __init__(self, rate, work):
        self.a, self.b = f"hsg{os.getpid()}a", f"hsg{os.getpid()}b"
        self.work = work
        sh("ip", "netns", "add", self.a)
        sh("ip", "netns", "add", self.b)
        sh("ip", "link", "add", self.a + "v", "type", "veth", "peer", "name", self.b + "v")
        for n, addr in ((self.a, "10.78.0.1/24"), (self.b, "10.78.0.2/24")):
            sh("ip", "link", "set", n + "v", "netns", n)
            sh("ip", "netns", "exec", n, "ip", "addr", "add", addr, "dev", n + "v")
            sh("ip", "netns", "exec", n, "ip", "link", "set", "lo", "up")
            sh("ip", "netns", "exec", n, "ip", "link", "set", n + "v", "up")
            if rate:
                sh("ip", "netns", "exec", n, "tc", "qdisc", "add", "dev", n + "v", "root", "tbf",
                   "rate", rate, "burst", "256kb", "latency", "50ms")
        self.agent = os.path.join(work, "agent.sh")
        with open(self.agent, "w") as f:
            f.write("#!/bin/sh\nhost=$1; shift\ncase \"$host\" in\n"
                    f"  10.78.0.1) n={self.a}; name=hostA ;;\n"
                    f"  10.78.0.2) n={self.b}; name=hostB ;;\n"
                    "  *) echo \"agent: unknown host $host\" >&2; exit 1 ;;\nesac\n"
                    "exec ip netns exec \"$n\" unshare --uts sh -c \"hostname $name; exec $*\"\n")
        os.chmod(self.agent, 0o755)
        self.hostfile = os.path.join(work, "hosts")
        with open(self.hostfile, "w") as f:
            f.write("10.78.0.1 slots=2\n10.78.0.2 slots=2\n")

    def launch(self, argv):
        return ["ip", "netns", "exec", self.a, "unshare", "--uts", "sh", "-c",
                'hostname hostA; exec "$@"', "sh", "mpiexec", "--hostfile", self.hostfile, "-n", "4",
                "--mca", "plm_rsh_agent", self.agent, "--mca", "btl", "self,vader,tcp",
                "--mca", "btl_tcp_if_include", "10.78.0.0/24", "--mca", "oob_tcp_if_include",
                "10.78.0.0/24", "-x", "PATH", "-x", "OMP_NUM_THREADS"] + argv

    def close(self):
        for n in (self.a, self.b):
            sh("ip", "netns", "del", n, check=False)


def step_time(out_dir, warmup):
    rows = [json.loads(l) for l in open(os.path.join(out_dir, "metrics.jsonl"))]
    t = [r["step_time_s"] for r in rows if r["step"] > warmup]
    if not t:
        sys.exit(f"{out_dir}: no step after the warm-up")
    return statistics.median(t)


def run(cmd, out_dir, log):
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=900)
    if r.returncode:
        sys.exit(f"exit {r.returncode}: {' '.join(cmd)}\n{open(log).read()[-2000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/hypershard")
    ap.add_argument("--rate", default="1gbit", help="tc rate of each direction; '' for none")
    ap.add_argument("--formats", nargs="+", default=["int8", "fp8_e4m3", "int8/int8"],
                    help="GATHER or GATHER/REDUCE, then +hpzS: fsdp_config.param_gather, "
                    "grad_reduce and secondary_shard_size")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--set", nargs="*", default=[], help="extra a.b.c=v overrides")
    ap.add_argument("--no-local", action="store_true", help="skip the one-host runs")
    ap.add_argument("--no-link", action="store_true", help="only the one-host runs")
    a = ap.parse_args()
    binary = os.path.abspath(a.bin)
    work = tempfile.mkdtemp(prefix="hs_gather_link_")
    hosts = None if a.no_link else Hosts(a.rate, work)
    env_threads = os.environ.setdefault("OMP_NUM_THREADS", "1")
    base = SHAPE + [f"train.steps={a.steps}"] + a.set
    formats = ["null"] + a.formats
    places = ([] if a.no_link else [("link", 4)]) + ([] if a.no_local else [("shm", 2)])
    runs = {p: [f for f in formats if "+hpz" not in f or w > 2] for p, w in places}
    times = {(p, f): [] for p, _ in places for f in runs[p]}
    try:
        for rnd in range(a.rounds):
            for place, world in places:
                mine = runs[place]
                for fmt in mine[rnd % len(mine):] + mine[:rnd % len(mine)]:
                    out = os.path.join(work, f"{place}-{fmt.replace('/', '-')}-{rnd}")
                    argv = [binary, "train"] + base + [
                        f"fsdp_config.dp_shard_size={world}", f"train.global_batch_size={world}",
                        f"train.out_dir={out}"] + wire(fmt)
                    cmd = hosts.launch(argv) if place == "link" else ["mpiexec", "-n", "2"] + argv
                    run(cmd, out, out + ".log")
                    times[(place, fmt)].append(step_time(out, a.warmup))
                    shutil.rmtree(out, ignore_errors=True)
                print(f"round {rnd + 1} {place}: " + ", ".join(
                    f"{f} {times[(place, f)][-1] * 1e3:.1f} ms" for f in runs[place]), flush=True)
    finally:
        if hosts:
            hosts.close()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nmedian step time over {a.rounds} rounds (steps {a.warmup + 1}..{a.steps}; "
          f"OMP_NUM_THREADS={env_threads}; link: FSDP 4 over 2 hosts, tc rate {a.rate or 'none'}; "
          f"shm: FSDP 2 on one host; formats in rotating order)")
    print(f"{'place':6} {'format':15} {'step ms':>9} {'vs null':>8}  (format: gather/reduce+hpz)")
    for place, _ in places:
        ref = statistics.median(times[(place, "null")])
        for fmt in runs[place]:
            m = statistics.median(times[(place, fmt)])
            print(f"{place:6} {fmt:15} {m * 1e3:9.1f} {ref / m:7.2f}x")


if __name__ == "__main__":
    main()
