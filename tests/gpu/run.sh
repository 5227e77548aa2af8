#!/usr/bin/env bash
# Every check that needs an NVIDIA GPU, in one run that ends within an
# overall deadline (HS_GPU_DEADLINE, 480 s by default) on a machine with
# CUDA 13 and no package registry, most telling first, so that a lease cut
# short still says the most:
#   0. diagnostics: the OS, nvidia-smi, ldd of the binary and its modules,
#      the torch, NCCL and cuDNN found (diagnostics.txt);
#   1. conformance: every entry of the cuda table against reference,
#      op x dtype x shape;
#   2. bf16 speed of a 1.1B Llama (TinyLlama's shape, seq 2048): tokens/s,
#      MFU against the run's own measured bf16 GEMM peak and against the
#      nominal datasheet peak, peak device memory;
#   3. PyTorch FSDP2 (fully_shard, bf16 MixedPrecisionPolicy, fused AdamW,
#      SDPA; bench/peer/gpu_peer.py) on the same shape, when python3 has
#      torch and transformers, with the two ratios;
#   4. parity (tests/gpu/test_cuda_parity.sh): one GPU against the cpu
#      device, ranks sharing the GPU against one GPU rank, checkpoints
#      crossing between the devices;
#   5. the same speed pair on a GPT-2-small-sized Llama (seq 1024).
# Each step's own limit is cut to the time left before the deadline; a step
# with under 20 s left is reported as skipped. Every line of summary.txt is
# written as its step ends, so a run stopped from outside still leaves what
# it measured.
# It uses .gpu-bundle (scripts/gpu-bundle.sh, run where the Debian packages
# are; .gpu-bundle.tar.xz carried along and unpacked here) or a build with
# the cuda backend in $HS_BUILD. The Python steps run in the machine's own
# environment (its LD_LIBRARY_PATH and PATH), not the bundle's.
# Logs and summary.txt go to $OUT (or ./gpu-out). Exit 0 when every check
# that ran passed.
#
#   bash tests/gpu/run.sh [conformance] [bench] [peer] [parity] [small]  # default: all
set -uo pipefail
t_start=$(date +%s)
deadline=$((t_start + ${HS_GPU_DEADLINE:-480}))
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
summary=$out/summary.txt
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(conformance bench peer parity small)
want() { [[ " ${parts[*]} " == *" $1 "* ]]; }
failed=0
trap 'say "done after $(( $(date +%s) - t_start )) s: $([ "$failed" -eq 0 ] && echo "every check that ran passed" || echo "some checks FAILED")"' EXIT

# The machine's own environment, for python3 and nvidia-smi.
machine_ld=${LD_LIBRARY_PATH:-}
machine_path=$PATH
on_machine() {
    env -u OPAL_PREFIX -u OPAL_SYSCONFDIR -u OPAL_LIBDIR -u PMIX_PREFIX \
        -u PMIX_MCA_mca_base_component_path LD_LIBRARY_PATH="$machine_ld" PATH="$machine_path" "$@"
}

# --- the binaries and their libraries -----------------------------------
bundle=$root/.gpu-bundle
if [ ! -d "$bundle" ] && [ -f "$bundle.tar.xz" ]; then
    if ! tar -C "$root" -xJf "$bundle.tar.xz" 2> "$out/unpack.log"; then
        say "unpacking $bundle.tar.xz failed: $(head -c 400 "$out/unpack.log")"
        failed=1
        exit 1
    fi
fi
# CUDA's libraries: the toolkit's, then those of Python's nvidia packages
# (cuDNN and NCCL come from there on a machine with PyTorch).
cuda_libs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(on_machine python3 -c 'import nvidia, os
for p in nvidia.__path__:
    for x in sorted(os.listdir(p)):
        for sub in ("lib", "lib64"):
            print(os.path.join(p, x, sub))' 2>/dev/null); do
    [ -d "$d" ] && cuda_libs=$cuda_libs:$d
done
if [ -d "$bundle" ]; then
    multi=x86_64-linux-gnu
    export HS_BIN=$bundle/bin/hypershard CONFORMANCE=$bundle/bin/test_device_conformance
    export LD_LIBRARY_PATH=$bundle/lib:$bundle/ompi/lib/$multi/openmpi/lib${cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    # Open MPI and PMIx relocated from Debian's /usr into the bundle
    export OPAL_PREFIX=$bundle/ompi OPAL_SYSCONFDIR=$bundle/ompi/etc
    export OPAL_LIBDIR=$bundle/ompi/lib/$multi/openmpi/lib
    export PMIX_PREFIX=$bundle/ompi/lib/$multi/pmix2
    export PMIX_MCA_mca_base_component_path=$bundle/ompi/lib/$multi/pmix2/lib/pmix
    export PATH=$bundle/ompi/bin:$PATH
    export MPIEXEC=$bundle/ompi/bin/mpiexec
elif [ -n "${HS_BUILD:-}" ]; then
    export HS_BIN=$HS_BUILD/hypershard CONFORMANCE=$HS_BUILD/test_device_conformance
    export LD_LIBRARY_PATH=${cuda_libs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export MPIEXEC=${MPIEXEC:-mpiexec}
else
    say "no .gpu-bundle and no HS_BUILD: run scripts/gpu-bundle.sh where the Debian packages are and carry .gpu-bundle.tar.xz"
    failed=1
    exit 2
fi
export HS_SRC=$root OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1
export OMPI_MCA_hwloc_base_binding_policy=none
# No CMA or XPMEM between ranks: a sandboxed kernel may refuse the
# process_vm_readv that vader's single copy uses.
export OMPI_MCA_btl_vader_single_copy_mechanism=none

# --- 0. diagnostics -----------------------------------------------------
bindir=$(dirname "$HS_BIN")
{
    echo "## os"; grep -E '^(PRETTY_NAME|VERSION_ID)=' /etc/os-release 2>/dev/null; uname -r
    echo "## nvidia-smi"; on_machine nvidia-smi 2>&1 | head -25
    for f in "$HS_BIN" "$bindir"/hypershard-*.so; do
        [ -e "$f" ] && { echo "## ldd $(basename "$f")"; ldd "$f" 2>&1; }
    done
    echo "## python3"
    on_machine python3 - <<'PY' 2>&1
import importlib
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda)
    print("nccl", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-")
    print("cudnn", torch.backends.cudnn.version())
except Exception as exc:
    print("torch: not importable:", exc)
for name in ("transformers", "nvidia.cudnn", "nvidia.nccl"):
    try:
        m = importlib.import_module(name)
        print(name, getattr(m, "__version__", ""), list(getattr(m, "__path__", [])))
    except Exception as exc:
        print(name, "missing:", exc)
PY
    echo "## libraries the run will load"
    for lib in libcudart.so.13 libcublasLt.so.13 libnccl.so.2 libcudnn.so.9; do
        found=""
        for d in ${LD_LIBRARY_PATH//:/ }; do
            [ -e "$d/$lib" ] && { found=$(readlink -f "$d/$lib"); break; }
        done
        echo "$lib: ${found:-not on LD_LIBRARY_PATH}"
    done
} > "$out/diagnostics.txt" 2>&1
say "# hypershard on $(on_machine nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
say "os: $(grep -m1 PRETTY_NAME /etc/os-release 2>/dev/null | cut -d= -f2); binary: $HS_BIN"
say "python3: $(grep -E '^(torch|nccl|cudnn)' "$out/diagnostics.txt" | tr '\n' ';')"
say "$(grep -E '^lib(cudnn|nccl)' "$out/diagnostics.txt" | tr '\n' ';')"
missing=$(awk '/^## ldd/ {f=$3} /not found/ {print f": "$1}' "$out/diagnostics.txt" | sort -u | tr '\n' ' ')
[ -z "$missing" ] || say "missing libraries: $missing"
# hypershard-cudnn.so may lack cuDNN (attention then stays on the CUDA
# cores, and the run's log says so); the binary and the cuda module may not.
if { ldd "$HS_BIN"; ldd "$bindir/hypershard-cuda.so"; } 2>&1 | grep -q "not found"; then
    failed=1
    exit 1
fi

left() { echo $((deadline - $(date +%s))); }
check() { # NAME LIMIT COMMAND...: runs it with a log under min(LIMIT, time left)
    local name=$1 limit=$2 t0 rc=0
    shift 2
    local budget
    budget=$(left)
    budget=$((budget - 5))
    [ "$budget" -lt "$limit" ] && limit=$budget
    if [ "$limit" -lt 20 ]; then
        say "$name: skipped: ${limit} s left before the ${HS_GPU_DEADLINE:-480} s deadline"
        return 77
    fi
    t0=$(date +%s)
    timeout "$limit" "$@" > "$out/$name.log" 2>&1 || rc=$?
    local verdict=passed
    [ "$rc" -eq 0 ] || verdict="FAILED (exit $rc)"
    [ "$rc" -eq 124 ] && verdict="FAILED (timed out at $limit s)"
    [ "$rc" -eq 77 ] && verdict="skipped: $(grep -m1 -i skip "$out/$name.log")"
    [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || failed=1
    say "$name: $verdict in $(( $(date +%s) - t0 )) s (log: $name.log)"
    return "$rc"
}

# shape NAME: the model keys and the peer's flags of one benchmark shape.
shape() {
    case $1 in
    gpt2-small) hs=(model.dim=768 model.n_layers=12 model.n_heads=12 model.n_kv_heads=12
                    model.ffn_dim=2048 model.vocab_size=50304 train.seq_len=1024
                    train.micro_batch_size=8)
                peer=(--dim 768 --layers 12 --heads 12 --kv-heads 12 --ffn 2048 --vocab 50304
                      --seq 1024 --batch 8) ;;
    llama-1b)   hs=(model.dim=2048 model.n_layers=22 model.n_heads=32 model.n_kv_heads=4
                    model.ffn_dim=5632 model.vocab_size=32000 train.seq_len=2048
                    train.micro_batch_size=4)
                peer=(--dim 2048 --layers 22 --heads 32 --kv-heads 4 --ffn 5632 --vocab 32000
                      --seq 2048 --batch 4) ;;
    esac
}
steps=12 warm=4
bench_hs() { # NAME LIMIT
    shape "$1"
    local dir=$out/bench-$1
    rm -rf "$dir"
    # fp32 main params: the model reads its own bf16 shard (one rank: no
    # cast per unshard) and AdamW writes it (bench/gpu_projection.py)
    local run=("${hs[@]}" accelerator.device=cuda fsdp_config.mix_precision.param_dtype=bfloat16
               fsdp_config.mix_precision.reduce_dtype=float32 optimizer.fp32_main_params=true
               fsdp_config.mix_precision.fp32_main_grad=true)
    "$HS_BIN" plan --json "${run[@]}" > "$out/plan-$1.json" 2> /dev/null || rm -f "$out/plan-$1.json"
    check "bench-$1" "$2" "$HS_BIN" train "${run[@]}" train.steps=$steps train.eval_every=0 \
        train.log_every=1 train.out_dir="$dir" || return
    grep -m1 -i "attention runs" "$out/bench-$1.log" | sed "s/^/bench-$1: /" | tee -a "$summary"
    on_machine python3 - "$dir/metrics.jsonl" "$warm" "$1" "$out/bench-$1.log" "$out/plan-$1.json" <<'PY' | tee -a "$summary"
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][int(sys.argv[2]):]
tps = statistics.median(r["tokens_per_s"] for r in rows)
step = statistics.median(r["step_time_s"] for r in rows)
mfu = statistics.median(r["mfu"] for r in rows)
peak = max(r["peak_device_bytes"] for r in rows)
# "mfu against P GFLOP/s ... GEMM measured G GFLOP/s": mfu is against P
# (the datasheet's dense figure where the table has the GPU).
m = re.search(r"mfu against ([0-9.]+) GFLOP/s.*?; rank 0's (.*?) \| .*?GEMM measured ([0-9.]+) GFLOP/s",
              open(sys.argv[4]).read())
nominal, what, measured = (float(m.group(1)), m.group(2), float(m.group(3))) if m else (0, "?", 0)
vs = f"{100 * mfu * nominal / measured:.1f}% of the measured {measured / 1e3:.1f} TFLOP/s GEMM" if measured else "no measured GEMM"
print(f"hypershard {sys.argv[3]}: {tps:,.0f} tokens/s, step {step:.3f} s, MFU {100 * mfu:.1f}% of "
      f"{nominal / 1e3:.1f} TFLOP/s ({what}), {vs}, peak device memory {peak / 2**30:.2f} GiB")
try:  # the plan's peak beside the measured one, kernel scratch bound included
    p = json.load(open(sys.argv[5]))
    print(f"hypershard {sys.argv[3]}: plan peak {p['max_peak_device_bytes'] / 2**30:.2f} GiB "
          f"({p['max_peak_device_bytes'] / peak - 1:+.1%} of measured), kernel_scratch bound "
          f"{p['ranks'][0]['device']['kernel_scratch'] / 2**20:.1f} MiB")
except (OSError, ValueError, KeyError):
    print(f"hypershard {sys.argv[3]}: no plan to compare")
json.dump({"tokens_per_s": tps, "mfu": mfu, "peak_bytes": peak},
          open(sys.argv[1] + ".summary.json", "w"))
PY
}
bench_peer() { # NAME LIMIT
    shape "$1"
    if ! on_machine python3 -c 'import torch, transformers' 2>/dev/null; then
        say "peer-$1: skipped: python3 has no torch and transformers"
        return
    fi
    check "peer-$1" "$2" on_machine python3 "$root/bench/peer/gpu_peer.py" "${peer[@]}" \
        --steps $((steps - warm)) --warmup $warm --json "$out/peer-$1.json" || return
    [ -f "$out/bench-$1/metrics.jsonl.summary.json" ] || return
    on_machine python3 - "$out/bench-$1/metrics.jsonl.summary.json" "$out/peer-$1.json" "$1" <<'PY' | tee -a "$summary"
import json, sys
h, p = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
print(f"PyTorch {p['torch']} FSDP2 {sys.argv[3]}: {p['tokens_per_s']:,.0f} tokens/s, peak memory "
      f"{p['peak_bytes'] / 2**30:.2f} GiB; hypershard / PyTorch: speed "
      f"{h['tokens_per_s'] / p['tokens_per_s']:.2f}x, memory {h['peak_bytes'] / p['peak_bytes']:.2f}x")
PY
}

# --- 1. conformance -----------------------------------------------------
if want conformance; then
    check conformance 120 "$CONFORMANCE" cuda
    grep -E "^cuda: |FAIL" "$out/conformance.log" 2>/dev/null | head -40 | tee -a "$summary"
fi
# --- 2, 3. the 1.1B step and its peer ------------------------------------
want bench && bench_hs llama-1b 150
want peer && bench_peer llama-1b 120
# --- 4. parity ------------------------------------------------------------
if want parity; then
    check parity 180 bash "$root/tests/gpu/test_cuda_parity.sh"
    grep -E "worst relative|FAIL" "$out/parity.log" 2>/dev/null | tee -a "$summary"
fi
# --- 5. the small model ---------------------------------------------------
if want small; then
    want bench && bench_hs gpt2-small 90
    want peer && bench_peer gpt2-small 90
fi
exit "$failed"
