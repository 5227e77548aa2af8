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
