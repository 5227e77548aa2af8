#!/bin/bash
# `hypershard config`: exit codes (0 valid, 2 config/usage error incl. a missing
# file), every example in configs/ valid at the world size its comment names,
# the resolved dump usable as a config, and docs/config.md's key table equal
# to the schema.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch config

expect() { # expect CODE DESCRIPTION -- ARGS...
    local want=$1 what=$2
    shift 3
    "$HS_BIN" config "$@" >"$work/out" 2>"$work/err"
    local got=$?
    if [ "$got" != "$want" ]; then
        fail "$what: exit $got, want $want"; cat "$work/err"
    fi
}
expect_in() { # expect_in FILE TEXT DESCRIPTION
    if ! grep -qF -- "$2" "$work/$1"; then
        fail "$3: '$2' not in $1:"; cat "$work/$1"
    fi
}

expect 0 "built-in default" -- 
expect_in out "fsdp_manager: skipped" "default on one rank skips FSDP"
expect_in out "dp_shard_size: 1" "default lists fsdp_config keys"

expect 0 "fsdp example on 2 ranks" -- "$HS_SRC/configs/fsdp.yaml" --world 2
expect_in out "fsdp_manager: created" "fsdp example creates FSDP2Manager"

expect 0 "tp example on 4 ranks" -- "$HS_SRC/configs/tp.yaml" --world 4
expect_in out "tp_groups: [[0, 1], [2, 3]]" "TP groups are the fastest rank dim"
expect_in out "fsdp_shard_groups: [[0, 2], [1, 3]]" "FSDP shards over ranks of one TP slice"

expect 0 "the minimal config at 8 ranks" -- model.arch=llama fsdp_config.dp_shard_size=2 --world 8
expect_in out "global_batch_size: 64   # micro_batch_size x dp_size" "null global batch is micro x dp"
expect 2 "an integer beyond int32" -- train.micro_batch_size=99999999999
expect_in err "99999999999 is beyond the integer range" "out-of-range integers name the range"

expect 2 "an empty override value" -- train.steps=
expect_in err "train.steps: expected an integer, got ''" "an empty value is a type error"
if grep -q "more than one YAML document" "$work/err"; then fail "empty value: a false second-document error"; fi
# The dump's group lists are linear in the world size (they were quadratic:
# over a minute at 65536 ranks).
timeout 10 "$HS_BIN" config accelerator.tp_size=2 --world 65536 >"$work/out" 2>"$work/err"
rc=$?
[ "$rc" = 0 ] || fail "config --world 65536: exit $rc (124: over 10 s)"
expect_in out "tp_groups: [[0, 1], [2, 3], " "world 65536 lists the tp groups"
expect 2 "a vocabulary below the byte tokens" -- model.vocab_size=100
expect_in err "model.vocab_size: 100 is too small for data.source builtin, which uses byte tokens" \
    "config refuses the vocabulary train would refuse"
expect 2 "sizes whose product overflows int64" -- model.dim=2097152 model.n_heads=64 \
    model.ffn_dim=2000000000 model.n_layers=100000
expect_in err "model.dim x model.ffn_dim x model.n_layers = 2097152 x 2000000000 x 100000" \
    "the overflowing product is named"
expect 2 "a pipeline schedule beyond its bound" -- accelerator.pp_size=2 train.micro_batch_size=1 \
    train.global_batch_size=2000000000 --world 2
expect_in err "2 x 2000000000 x 1 = 4000000000 actions per stage" "the schedule's size is named"
expect 2 "a world beyond the limit" -- --world 1000000000
expect_in err "--world 1000000000: expected a rank count from 1 to 1048576" "world limit named"

expect 0 "moe_ep example on 4 ranks" -- "$HS_SRC/configs/moe_ep.yaml" --world 4
expect_in out "ep_groups: [[0, 1], [2, 3]]" "EP groups are the fastest expert-domain dim"
expect_in out "edp_shard_groups: [[0, 2], [1, 3]]" "experts shard over ranks of one EP index"
expect 2 "ep with a dense model" -- accelerator.ep_size=2 --world 2
expect_in err "accelerator.ep_size = 2 needs routed experts" "ep without experts is refused"
expect 2 "ep x tp without sequence parallel" -- model.arch=moe accelerator.ep_size=2 accelerator.tp_size=2 --world 4
expect_in err "set accelerator.sequence_parallel: true" "ep x tp needs sequence parallel"

expect 2 "tp that does not divide the kv heads" -- accelerator.tp_size=2 model.n_kv_heads=1 --world 2
expect_in err "model.n_kv_heads = 1 is not divisible by accelerator.tp_size = 2" "tp rule names the key"
expect_in err "valid tp_size: 1" "tp rule gives a valid choice"

expect 0 "cp 2 on 4 ranks" -- accelerator.cp_size=2 fsdp_config.dp_shard_size=2 --world 4
expect_in out "dp_replicate_size: 2" "CP never enlarges the shard degree (spec 004 §2.1)"
expect 0 "rotate method without cp" -- accelerator.cp_rotate_method=ring
expect_in err "accelerator.cp_rotate_method = ring has no effect: it needs accelerator.cp_size > 1" \
    "rotate method with cp_size 1 warns"
expect 2 "cp that does not split the sequence in 2 x cp chunks" -- accelerator.cp_size=2 \
    train.seq_len=66 --world 2
expect_in err "train.seq_len = 66 is not divisible by 2 x accelerator.cp_size" "cp seq_len rule"

# Pipeline parallelism: the stages in the derived block, and each PP rule
# failing with exit 2 and a message naming the path.
expect 0 "pp 2 on 4 ranks" -- accelerator.pp_size=2 train.global_batch_size=32 --world 4
expect_in out "  pp_schedule: 1f1b" "derived block names the schedule"
expect_in out "  pp_stages:" "derived block lists the stages"
expect_in out '    - {stage: 0, layers: "[0, 2)", ranks: [0, 1]}' "stage 0: blocks 0-1 on ranks 0, 1"
expect_in out '    - {stage: 1, layers: "[2, 4)", ranks: [2, 3]}' "stage 1: blocks 2-3 on ranks 2, 3"
expect_in out "  pp_groups: [[0, 2], [1, 3]]" "pp groups join the ranks of one (dp, cp, tp)"
"$HS_BIN" config accelerator.pp_size=2 train.global_batch_size=32 'accelerator.pp_layers=[3,1]' \
    --world 4 >"$work/pp1.yaml" 2>/dev/null || fail "pp_layers [3, 1] does not validate"
grep -qF "  pp_layers: [3, 1]" "$work/pp1.yaml" || fail "pp_layers override not dumped as [3, 1]"
grep -qF '    - {stage: 0, layers: "[0, 3)", ranks: [0, 1]}' "$work/pp1.yaml" \
    || fail "pp_layers [3, 1] does not give stage 0 three blocks"
# The dump with its stages loads back as a config.
"$HS_BIN" config "$work/pp1.yaml" --world 4 >"$work/pp2.yaml" 2>"$work/err" \
    || { fail "pp dump does not load back"; cat "$work/err"; }
diff <(tail -n +2 "$work/pp1.yaml") <(tail -n +2 "$work/pp2.yaml") >/dev/null \
    || fail "pp dump -> load -> dump differs"
printf 'accelerator:\n  pp_size: 2\n  pp_layers:\n    - 1\n    - 3\n' >"$work/pp_block.yaml"
expect 0 "pp_layers as a block sequence" -- "$work/pp_block.yaml" train.global_batch_size=32 --world 4
expect_in out "  pp_layers: [1, 3]" "block sequence read as [1, 3]"
expect 2 "pp_layers of the wrong length" -- accelerator.pp_size=2 'accelerator.pp_layers=[1,1,2]' \
    train.global_batch_size=32 --world 4
expect_in err "accelerator.pp_layers = [1, 1, 2] has 3 entries but accelerator.pp_size = 2" \
    "pp_layers length rule"
expect_in err "set accelerator.pp_layers: [2, 2]" "pp_layers length rule gives the even split"
expect 2 "pp_layers with an empty stage" -- accelerator.pp_size=2 'accelerator.pp_layers=[4,0]' \
    train.global_batch_size=32 --world 4
expect_in err "accelerator.pp_layers[1] = 0 must be >= 1" "pp_layers entries are >= 1"
expect 2 "pp_layers that miss blocks" -- accelerator.pp_size=2 'accelerator.pp_layers=[1,1]' \
    train.global_batch_size=32 --world 4
expect_in err "accelerator.pp_layers = [1, 1] sums to 2 blocks but model.n_layers = 4" \
    "pp_layers sum rule"
expect 2 "pp_layers with one stage" -- 'accelerator.pp_layers=[3,1]'
expect_in err "accelerator.pp_layers = [3, 1] is set but accelerator.pp_size = 1" "pp_layers needs pp"
expect 2 "pp_layers item beyond int32" -- 'accelerator.pp_layers=[1,99999999999]'
expect_in err "accelerator.pp_layers: item 1: 99999999999 is beyond the integer range" \
    "pp_layers items name the int range"
expect 2 "1f1b with fewer micro-batches than stages" -- accelerator.pp_size=2 \
    train.global_batch_size=16 --world 4
expect_in err "accelerator.pp_schedule = 1f1b needs at least accelerator.pp_size = 2 micro-batches" \
    "1f1b micro-batch rule"
expect_in err "set train.global_batch_size: 32 (or null for that), or accelerator.pp_schedule: gpipe" \
    "1f1b fix"
expect 0 "gpipe with one micro-batch" -- accelerator.pp_size=2 accelerator.pp_schedule=gpipe --world 4
expect_in out "  pp_schedule: gpipe" "gpipe in the derived block"
expect 0 "pp with moe" -- accelerator.pp_size=2 model.arch=moe --world 4
il=(accelerator.pp_schedule=interleaved_1f1b accelerator.pp_virtual_stages=2)
expect 0 "interleaved 1f1b" -- accelerator.pp_size=2 "${il[@]}" --world 4
expect_in out '    - {stage: 0, layers: "[0, 1) [2, 3)", ranks: [0, 1]}' "stage 0 holds chunks 0 and 2"
expect_in out "  pp_virtual_stages: 2" "derived block names the virtual stages"
expect 2 "interleaved without virtual stages" -- accelerator.pp_size=2 \
    accelerator.pp_schedule=interleaved_1f1b --world 4
expect_in err "accelerator.pp_schedule = interleaved_1f1b needs accelerator.pp_virtual_stages >= 2" \
    "interleaved needs V >= 2"
expect 2 "virtual stages without interleaving" -- accelerator.pp_size=2 \
    accelerator.pp_virtual_stages=2 --world 4
expect_in err "accelerator.pp_virtual_stages = 2 needs accelerator.pp_schedule: interleaved_1f1b" \
    "V > 1 needs interleaved"
expect 2 "more chunks than blocks" -- accelerator.pp_size=2 accelerator.pp_schedule=interleaved_1f1b \
    accelerator.pp_virtual_stages=4 model.n_layers=6 --world 4
expect_in err "accelerator.pp_size x pp_virtual_stages = 2 x 4 = 8 chunks exceed model.n_layers = 6" \
    "chunks need a block each"
expect 2 "interleaved micro-batches not a multiple of pp" -- accelerator.pp_size=2 "${il[@]}" \
    train.global_batch_size=48 --world 4
expect_in err "needs the micro-batches per step to be a multiple of accelerator.pp_size = 2" \
    "interleaved M % pp"
expect 2 "pp_layers per virtual stage" -- accelerator.pp_size=2 "${il[@]}" \
    'accelerator.pp_layers=[2,2]' --world 4
expect_in err "accelerator.pp_layers = [2, 2] has 2 entries but accelerator.pp_size x pp_virtual_stages = 2 x 2 = 4" \
    "pp_layers lists the virtual stages"
expect 2 "pp with tied embeddings" -- accelerator.pp_size=2 model.tie_embeddings=true \
    train.global_batch_size=32 --world 4
expect_in err "accelerator.pp_size = 2 with model.tie_embeddings = true" "pp refuses tied embeddings"
expect_in err "set model.tie_embeddings: false, or accelerator.pp_size: 1" "tie fix"
expect 0 "pp_schedule without pp" -- accelerator.pp_schedule=gpipe
expect_in err "accelerator.pp_schedule = gpipe has no effect" "pp_schedule with pp 1 warns"
# `train` refuses a PP rule before anything is written.
"$HS_BIN" train accelerator.pp_size=2 model.tie_embeddings=true train.out_dir="$work/pp_run" \
    >"$work/out" 2>"$work/err"
rc=$?
[ "$rc" = 2 ] || { fail "train with pp and tied embeddings: exit $rc, want 2"; cat "$work/err"; }
expect_in err "accelerator.pp_size = 2 with model.tie_embeddings = true" "train names the PP rule"
[ ! -e "$work/pp_run" ] || fail "train wrote $work/pp_run before refusing the config"

expect 0 "override and --world=N" -- fsdp_config.dp_shard_size=2 --world=2
expect_in out "dp_replicate_size: 1" "derived replicate size"

expect 2 "unknown key" -- fsdp_config.dp_shard_sise=2
expect_in err "did you mean fsdp_config.dp_shard_size?" "unknown key suggestion"

expect 2 "removed key" -- fsdp_config.cpu_offload=true
expect_in err "fsdp_config.enable_offload" "removed key names its replacement"

expect 2 "invalid topology" -- fsdp_config.dp_shard_size=3 --world 4
expect_in err "fsdp_config.dp_shard_size" "topology error names the path"

printf 'model:\n  dim: [1\n' >"$work/bad.yaml"
expect 2 "syntax error" -- "$work/bad.yaml"
expect_in err "$work/bad.yaml:3:" "syntax error has file:line"

expect 2 "missing file" -- "$work/none.yaml"
expect 2 "unknown option" -- --wrld 2
expect 2 "bad world" -- --world 0
expect 2 "two config files" -- a.yaml b.yaml

for f in "$HS_SRC"/configs/*.yaml; do
    [ "$(basename "$f")" = demo.yaml ] && continue
    world=$(grep -oE -- '--world [0-9]+' "$f" | head -1 | cut -d' ' -f2)
    expect 0 "example $(basename "$f") at world ${world:-1}" -- "$f" --world "${world:-1}"
done

# The resolved dump (with its derived block) loads back to the same dump.
"$HS_BIN" config "$HS_SRC/configs/moe.yaml" --world 4 >"$work/r1.yaml" 2>/dev/null
"$HS_BIN" config "$work/r1.yaml" --world 4 >"$work/r2.yaml" 2>/dev/null || fail "dump does not load"
if ! diff <(tail -n +2 "$work/r1.yaml") <(tail -n +2 "$work/r2.yaml"); then
    fail "dump -> load -> dump differs"
fi

# docs/config.md carries the schema's table verbatim.
sed -n '/<!-- schema:begin -->/,/<!-- schema:end -->/p' "$HS_SRC/docs/config.md" | sed '1d;$d' >"$work/doc_table"
"$HS_BIN" config --schema-markdown >"$work/schema_table"
if ! diff "$work/schema_table" "$work/doc_table" >"$work/diff"; then
    fail "docs/config.md key table differs from 'hypershard config --schema-markdown':"
    cat "$work/diff"
fi

hs_finish
