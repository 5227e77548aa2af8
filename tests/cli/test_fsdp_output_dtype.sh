#!/usr/bin/env bash
# mix_precision.output_dtype and cast_forward_inputs through `hypershard
# train` (spec 004 §2.2, §5.7; docs/fsdp-policies.md "Unit boundaries"):
# - bf16 params with output_dtype float32 (fp32 hand-over between blocks),
#   with and without cast_forward_inputs (the latter keeps an fp32 residual
#   stream), and fp32 params with output_dtype bfloat16: FSDP W=2 matches the
#   one-process run of the same config (the FSDP engine with groups of size
#   1) in loss, grad norm and exported weights within the bf16 tolerances of
#   tests/mpi/test_fsdp_policy.c; every loss is finite;
# - each knob changes exactly what it names: cast_forward_inputs=false alone
#   gives the bf16 run bit for bit (every input already is in param_dtype);
#   output_dtype=float32 with the input cast leaves the first forward bit
#   for bit (bf16 values widened and narrowed back) while its gradients
#   pass the casts; without the input cast the first loss moves.
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 180
# - bf16 runs with both 16-bit GEMM engines (ctest's .gemm16_native and
#   .gemm16_widened runs: oneDNN's bf16 matmul, or operands widened to fp32
#   sgemms where that is the faster engine); an unknown HS_CPU_GEMM16 is
#   exit 2 naming it, before anything is written.
# HS_TEST_TIERS: avx2 gemm16_native gemm16_widened
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch outdt
tiny=("${HS_FSDP_TINY[@]}" train.global_batch_size=8)
mp=fsdp_config.mix_precision
bf16=($mp.param_dtype=bfloat16 $mp.reduce_dtype=float32)
out32=("${bf16[@]}" $mp.output_dtype=float32)
stream32=("${out32[@]}" $mp.cast_forward_inputs=false)
nocast=("${bf16[@]}" $mp.cast_forward_inputs=false)
out16=($mp.output_dtype=bfloat16 $mp.reduce_dtype=float32)

first_loss() { # run
    python3 -c "import json; print(repr(json.loads(open('$work/$1/metrics.jsonl').readline())['loss']))"
}

# W=2 against one process, same dtypes
hs_train out32_1 1 "${out32[@]}"
grep -q "FSDP engine holds the parameters with every group of size 1" "$work/out32_1.txt"
hs_train out32_2 2 fsdp_config.dp_shard_size=2 "${out32[@]}"
hs_compare_runs out32_1 out32_2 1.5e-2
hs_train stream32_1 1 "${stream32[@]}"
hs_train stream32_2 2 fsdp_config.dp_shard_size=2 "${stream32[@]}"
hs_compare_runs stream32_1 stream32_2 1.5e-2
hs_train out16_1 1 "${out16[@]}"
grep -q "FSDP engine holds the parameters with every group of size 1" "$work/out16_1.txt"
hs_train out16_2 2 fsdp_config.dp_shard_size=2 "${out16[@]}"
hs_compare_runs out16_1 out16_2 2e-2

# each knob changes exactly what it names
hs_train bf16_2 2 fsdp_config.dp_shard_size=2 "${bf16[@]}"
hs_train nocast_2 2 fsdp_config.dp_shard_size=2 "${nocast[@]}"
hs_compare_runs bf16_2 nocast_2 0
cmp "$work/bf16_2/model.safetensors" "$work/nocast_2/model.safetensors"
plain=$(first_loss bf16_2) widened=$(first_loss out32_2) stream=$(first_loss stream32_2)
[ "$widened" = "$plain" ] || { echo "output_dtype=float32 moved the first loss: $widened vs $plain"; exit 1; }
[ "$stream" != "$plain" ] || { echo "an fp32 residual stream left the first loss at $plain"; exit 1; }
if cmp -s "$work/bf16_2/model.safetensors" "$work/out32_2/model.safetensors"; then
    echo "output_dtype=float32 left the gradients untouched"
    exit 1
fi
echo "first loss: bf16 $plain, output_dtype float32 $widened, fp32 stream $stream"

rc=0
HS_CPU_GEMM16=fast "$HS_BIN" train "${tiny[@]}" "${bf16[@]}" train.out_dir="$work/refused" \
    > "$work/refused.txt" 2>&1 || rc=$?
[ "$rc" = 2 ] || die "HS_CPU_GEMM16=fast: exit $rc, want 2"
grep -q "HS_CPU_GEMM16 = 'fast': want native" "$work/refused.txt" ||
    die "HS_CPU_GEMM16=fast: $(tail -2 "$work/refused.txt")"
[ ! -e "$work/refused" ] || die "HS_CPU_GEMM16=fast wrote $work/refused"
echo ok
