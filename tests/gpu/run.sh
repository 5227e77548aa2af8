#!/usr/bin/env bash
# Every check that needs an NVIDIA GPU, in one run of under 8 minutes, on a
# machine with CUDA 13 and no package registry:
#   1. the conformance suite: every entry of the cuda table against
#      reference, op x dtype x shape;
#   2. parity (tests/gpu/test_cuda_parity.sh): one GPU against the cpu
#      device, ranks sharing the GPU against one GPU rank, checkpoints
#      crossing between the devices;
#   3. bf16 speed on one GPU: a GPT-2-small-sized Llama and a 1.1B Llama
#      (seq 2048): tokens/s, MFU against the run's own measured bf16 GEMM
#      peak and the device's peak bytes, beside PyTorch FSDP2 (fully_shard,
#      bf16 MixedPrecisionPolicy; bench/peer/gpu_peer.py) on the same shape
#      when python3 has torch and transformers.
# It uses .gpu-bundle (scripts/gpu-bundle.sh, run where the Debian packages
# are; .gpu-bundle.tar.xz carried along and unpacked here) or a build with the cuda backend in $HS_BUILD.
# Logs and summary.txt go to $OUT (or ./gpu-out). Exit 0 when every check
# that ran passed.
#
#   bash tests/gpu/run.sh [conformance] [parity] [bench]   # default: all three
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
summary=$out/summary.txt
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(conformance parity bench)
want() { [[ " ${parts[*]} " == *" $1 "* ]]; }

# --- the binaries and their libraries -----------------------------------
bundle=$root/.gpu-bundle
[ -d "$bundle" ] || [ ! -f "$bundle.tar.xz" ] || tar -C "$root" -xJf "$bundle.tar.xz"
cuda_libs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia, os; p = nvidia.__path__[0]; print(" ".join(os.path.join(p, x, "lib") for x in os.listdir(p)))' 2>/dev/null); do
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
    say "no .gpu-bundle and no HS_BUILD: run scripts/gpu-bundle.sh where the Debian packages are and carry .gpu-bundle"
    exit 2
fi
export HS_SRC=$root OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
export OMPI_MCA_hwloc_base_binding_policy=none

say "# hypershard on $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
say "binary: $HS_BIN"
ldd "$HS_BIN" > "$out/ldd.txt" 2>&1
if grep -q "not found" "$out/ldd.txt"; then
    say "missing libraries: $(grep 'not found' "$out/ldd.txt" | awk '{print $1}' | tr '\n' ' ')"
    exit 1
fi
failed=0
check() { # NAME COMMAND...: runs it with a log, says how it ended
    local name=$1 t0 rc=0
    shift
    t0=$(date +%s)
    "$@" > "$out/$name.log" 2>&1 || rc=$?
    local verdict=passed
    [ "$rc" -eq 0 ] || verdict="FAILED (exit $rc)"
    [ "$rc" -eq 77 ] && verdict="skipped: $(grep -m1 -i skip "$out/$name.log")"
    [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || failed=1
    say "$name: $verdict in $(( $(date +%s) - t0 )) s (log: $name.log)"
}

# --- 1. conformance -----------------------------------------------------
if want conformance; then
    check conformance timeout 180 "$CONFORMANCE" cuda
    grep -E "^cuda: |FAIL" "$out/conformance.log" | head -40 | tee -a "$summary"
fi

# --- 2. parity ------------------------------------------------------------
if want parity; then
    check parity timeout 240 bash "$root/tests/gpu/test_cuda_parity.sh"
    grep -E "worst relative|FAIL" "$out/parity.log" | tee -a "$summary"
fi

# --- 3. bf16 speed --------------------------------------------------------
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
bench_shape() { # NAME
    shape "$1"
    local dir=$out/bench-$1 steps=12 warm=4
    rm -rf "$dir"
    check "bench-$1" timeout 150 "$HS_BIN" train "${hs[@]}" accelerator.device=cuda \
        fsdp_config.mix_precision.param_dtype=bfloat16 fsdp_config.mix_precision.reduce_dtype=float32 \
        train.steps=$steps train.eval_every=0 train.log_every=1 train.out_dir="$dir"
    python3 - "$dir/metrics.jsonl" "$warm" "$1" <<'PY' | tee -a "$summary"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][int(sys.argv[2]):]
tps = statistics.median(r["tokens_per_s"] for r in rows)
mfu = statistics.median(r["mfu"] for r in rows)
peak = max(r["peak_device_bytes"] for r in rows)
print(f"hypershard {sys.argv[3]}: {tps:,.0f} tokens/s, MFU {100 * mfu:.1f}% of the measured "
      f"bf16 GEMM peak, peak device memory {peak / 2**30:.2f} GiB")
json.dump({"tokens_per_s": tps, "mfu": mfu, "peak_bytes": peak},
          open(sys.argv[1] + ".summary.json", "w"))
PY
    if python3 -c 'import torch, transformers' 2>/dev/null; then
        check "peer-$1" timeout 180 python3 "$root/bench/peer/gpu_peer.py" "${peer[@]}" \
            --steps $((steps - warm)) --warmup $warm --json "$out/peer-$1.json"
        python3 - "$dir/metrics.jsonl.summary.json" "$out/peer-$1.json" "$1" <<'PY' | tee -a "$summary"
import json, sys
h, p = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
print(f"PyTorch {p['torch']} FSDP2 {sys.argv[3]}: {p['tokens_per_s']:,.0f} tokens/s, peak memory "
      f"{p['peak_bytes'] / 2**30:.2f} GiB; hypershard / PyTorch: speed "
      f"{h['tokens_per_s'] / p['tokens_per_s']:.2f}x, memory {h['peak_bytes'] / p['peak_bytes']:.2f}x")
PY
    else
        say "peer-$1: skipped: python3 has no torch and transformers"
    fi
}
if want bench; then
    bench_shape gpt2-small
    bench_shape llama-1b
fi
say "done: $([ "$failed" -eq 0 ] && echo 'every check that ran passed' || echo 'some checks FAILED')"
exit "$failed"
