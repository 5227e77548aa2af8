#!/usr/bin/env bash
# Document masking (data.document_masking, documents ended by data.eos_id;
# here the builtin corpus's sentences, ended by '.') through `hypershard
# train` matches the one-process run on the same global batch in every
# layout whose attention it changes: loss and grad norm of every step,
# every gradient of step 1, every weight after steps 1 and 2, the logits
# and the exported model, within 1e-5 relative (fp32). Layouts: FSDP 2,
# TP 2 with sequence parallel, CP 2 with allgather, ring and alltoall, CP
# 4 with alltoall_ring over pairs, PP 2 (1f1b and zbv). The masked run
# differs from the unmasked one, so the comparisons can fail; masking
# without an EOS id is refused with exit 2. (A token's logits equal its
# document's run alone: tests/unit/test_model_documents.c.)
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 300
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch docmask
tiny=("${HS_FSDP_TINY[@]}" model.n_layers=4 model.n_kv_heads=2 optimizer.eps=1e-3
      train.global_batch_size=8 train.seq_len=32 data.eos_id=46 data.document_masking=true)
files=(model.safetensors dump/grads-step1.safetensors dump/weights-step1.safetensors
       dump/weights-step2.safetensors dump/logits-step2.safetensors)
compare() { hs_compare_runs "$1" "$2" 1e-5 "${files[@]}"; }

hs_train_dump one 1
hs_train_dump unmasked 1 data.document_masking=false
if (compare one unmasked) > "$work/unmasked.cmp" 2>&1; then
    fail "masked and unmasked runs agree: the sentences' masks change nothing"
fi
hs_train_dump fsdp2 2 fsdp_config.dp_shard_size=2
compare one fsdp2
hs_train_dump tp2_sp 2 accelerator.tp_size=2 accelerator.sequence_parallel=true
compare one tp2_sp
for method in allgather ring alltoall; do
    hs_train_dump cp2_$method 2 accelerator.cp_size=2 accelerator.cp_rotate_method=$method
    compare one cp2_$method
done
hs_train_dump cp4_hybrid 4 accelerator.cp_size=4 accelerator.cp_rotate_method=alltoall_ring \
    accelerator.cp_a2a_size=2
compare one cp4_hybrid
hs_train_dump pp2 2 accelerator.pp_size=2
compare one pp2
hs_train_dump pp2_zbv 2 accelerator.pp_size=2 accelerator.pp_schedule=zbv \
    accelerator.pp_virtual_stages=2
compare one pp2_zbv

hs_expect_exit 2 no_eos "data.document_masking = true needs data.eos_id" train "${tiny[@]}" \
    data.eos_id=null train.out_dir="$work/no_eos"
[ ! -e "$work/no_eos" ] || fail "a refused config wrote $work/no_eos"
hs_finish
