#!/usr/bin/env bash
# A checkpoint edited by hand or by an attacker is refused the same way by
# `ckpt verify`, `ckpt inspect` and resume, with a message naming the file
# and the field, and never aborts: a chunk offset near INT64_MAX (its end
# used to wrap, pass verify and then abort the load), a [2^32, 2^32] tensor
# whose element count wraps to 0, the metadata of step 2 inside step-3/, and
# a `latest` that links to a system file (refused without printing that
# file). A config.yaml edited after the save to match this run no longer
# gives an empty list of differences: it is named as edited, with both hashes;
# keys only one side has (MoE against dense) are listed. A save past the
# file size limit is a write error naming the file, not a death by SIGXFSZ.
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 120
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch ckpt_hostile
tiny=("${HS_TINY[@]}" train.global_batch_size=4 train.micro_batch_size=2 train.eval_every=0)

hs_must_run 2 save train.steps=2 fsdp_config.dp_shard_size=2 checkpoint.dir="$work/ck" \
    train.out_dir="$work/out"
[ -f "$work/ck/step-2/metadata.json" ] || die "no checkpoint to edit: $(tail -5 "$work/save.log")"

# copy_ckpt NAME PYTHON: $work/NAME/step-2 is a copy of the checkpoint whose
# metadata.json `m` PYTHON has edited.
copy_ckpt() {
    mkdir -p "$work/$1"
    cp -r "$work/ck/step-2" "$work/$1/"
    python3 - "$work/$1/step-2/metadata.json" "$2" <<'PY'
import json, sys
path, edit = sys.argv[1], sys.argv[2]
m = json.load(open(path))
exec(edit)
json.dump(m, open(path, "w"))
PY
}

# refused DIR PATTERN: verify, inspect and a resume of DIR each fail with
# exit 1 (not an abort) and say PATTERN.
refused() {
    local dir=$1 pat=$2 what
    for what in verify inspect; do
        hs_expect_exit 1 "$what" "$pat" ckpt "$what" "$dir"
    done
    hs_run 1 resume train.steps=4 checkpoint.resume="$dir" checkpoint.dir="$work/ck_r" \
        train.out_dir="$work/out_r"
    [ "$rc" -eq 1 ] || fail "resume of $dir: exit $rc, want 1: $(tail -3 "$work/resume.log")"
    grep -q -- "$pat" "$work/resume.log" || fail "resume of $dir: '$pat' not in $(tail -3 "$work/resume.log")"
}

test_chunk_offset_near_int64_max_is_refused_everywhere() {
    copy_ckpt far 'm["tensors"][0]["chunks"][1]["offsets"][0] = 2**63 - 2'
    refused "$work/far/step-2" \
        "far/step-2/metadata.json: tensor 'model.embed_tokens.weight' \[256, 32\]: chunk \[9223372036854775806:+128, 0:32\] is empty or outside the tensor (dim 0: offset 9223372036854775806"
}

test_element_count_that_wraps_to_zero_is_refused_everywhere() {
    copy_ckpt wrap 'm["tensors"].append({"name": "huge", "dtype": "float32", "shape": [2**32, 2**32], "chunks": []})'
    refused "$work/wrap/step-2" "wrap/step-2/metadata.json: tensor 'huge' float32 \[4294967296, 4294967296\] has more elements or bytes than a 64-bit count holds"
}

test_step_2_metadata_inside_step_3_is_refused() {
    mkdir -p "$work/moved"
    cp -r "$work/ck/step-2" "$work/moved/step-3"
    refused "$work/moved/step-3" "moved/step-3/metadata.json: state.step is 2 but the directory is step-3"
}

test_latest_linked_to_a_system_file_is_refused_without_its_content() {
    mkdir -p "$work/linked"
    cp -r "$work/ck/step-2" "$work/linked/"
    ln -s /etc/passwd "$work/linked/latest"
    hs_expect_exit 1 linked "linked/latest is a symbolic link; it should be a small regular file" \
        ckpt verify "$work/linked"
    ! grep -q "root" "$work/linked.log" || fail "the linked file's content was printed: $(cat "$work/linked.log")"
    hs_run 1 linked_auto train.steps=4 checkpoint.dir="$work/linked" checkpoint.resume=auto \
        train.out_dir="$work/out_l"
    [ "$rc" -eq 1 ] || fail "resume auto through a linked latest: exit $rc, want 1"
    grep -q "linked/latest is a symbolic link" "$work/linked_auto.log" \
        || fail "resume auto: $(tail -3 "$work/linked_auto.log")"
    ! grep -q "root" "$work/linked_auto.log" || fail "resume auto printed the linked file's content"
}

test_config_yaml_edited_to_match_the_run_is_named_as_edited() {
    mkdir -p "$work/edited"
    cp -r "$work/ck/step-2" "$work/edited/"
    sed -i 's/^  dim: 32$/  dim: 48/' "$work/edited/step-2/config.yaml"
    grep -q "^  dim: 48$" "$work/edited/step-2/config.yaml" || die "config.yaml has no '  dim: 32' line to edit"
    hs_run 1 edited train.steps=4 model.dim=48 checkpoint.resume="$work/edited/step-2" \
        checkpoint.dir="$work/ck_e" train.out_dir="$work/out_e"
    [ "$rc" -eq 2 ] || fail "edited config.yaml: exit $rc, want 2"
    grep -q "Differences:" "$work/edited.log" || fail "no hash error: $(tail -3 "$work/edited.log")"
    grep -q "none against $work/edited/step-2/config.yaml, which agrees with this run on every such key: it was edited after the save (its settings hash to 0x[0-9a-f]*, the metadata records 0x" \
        "$work/edited.log" || fail "edited config.yaml not named: $(tail -3 "$work/edited.log")"
    # a real difference is still listed, with the note that the file was edited
    hs_run 1 edited2 train.steps=4 model.dim=64 checkpoint.resume="$work/edited/step-2" \
        checkpoint.dir="$work/ck_e" train.out_dir="$work/out_e"
    grep -q "  model.dim: checkpoint 48, this run 64" "$work/edited2.log" \
        || fail "difference not listed: $(tail -3 "$work/edited2.log")"
    grep -q "which was edited after the save" "$work/edited2.log" || fail "edit not noted"
    # ckpt verify checks config.yaml against the metadata too, not only the tensors
    "$HS_BIN" ckpt verify "$work/edited/step-2" > "$work/edited_verify.log" 2>&1
    [ $? -eq 1 ] || fail "verify of an edited config.yaml: want exit 1"
    grep -q "config.yaml was edited after the save" "$work/edited_verify.log" ||
        fail "verify does not name the edit: $(cat "$work/edited_verify.log")"
    # keys only one side has (a MoE run against a dense checkpoint) are listed too
    hs_run 1 moe train.steps=4 model.arch=moe checkpoint.resume="$work/ck/step-2" \
        checkpoint.dir="$work/ck_m" train.out_dir="$work/out_m"
    [ "$rc" -eq 2 ] || fail "MoE against dense: exit $rc, want 2"
    grep -q "  model.moe.num_experts: checkpoint (not set), this run [0-9]" "$work/moe.log" \
        || fail "MoE-only key not listed: $(tail -4 "$work/moe.log")"
    ! grep -q "edited after the save" "$work/moe.log" || fail "an unedited config.yaml called edited"
}

# A save past the file size limit (ulimit -f, SIGXFSZ's default would kill
# the process) is a reported write error naming the file, exit 1, with no
# checkpoint directory left behind. 20 MB lets MPI start; the checkpoint
# of this 256-wide model is about 36 MB.
test_a_save_past_the_file_size_limit_is_a_write_error() {
    local rc=0
    bash -c 'ulimit -f 20000; exec "$@"' _ "$HS_BIN" train model.dim=256 model.n_layers=4 \
        model.n_heads=4 model.n_kv_heads=2 model.ffn_dim=512 train.seq_len=32 train.steps=1 \
        train.eval_every=0 train.out_dir="$work/fsz" checkpoint.dir="$work/ck_fsz" \
        checkpoint.async=false > "$work/fsz.log" 2>&1 || rc=$?
    [ "$rc" -eq 1 ] || fail "ulimit -f: exit $rc, want 1 (153 is a death by SIGXFSZ)"
    grep -q "cannot write $work/ck_fsz/.tmp-step-1/rank-0.bin: File too large" "$work/fsz.log" ||
        fail "ulimit -f: no write error naming the file: $(grep -v PMIX "$work/fsz.log" | tail -3)"
    [ -z "$(ls -A "$work/ck_fsz" 2> /dev/null)" ] || fail "ulimit -f: a partial checkpoint was left"
}

test_a_save_past_the_file_size_limit_is_a_write_error
test_chunk_offset_near_int64_max_is_refused_everywhere
test_element_count_that_wraps_to_zero_is_refused_everywhere
test_step_2_metadata_inside_step_3_is_refused
test_latest_linked_to_a_system_file_is_refused_without_its_content
test_config_yaml_edited_to_match_the_run_is_named_as_edited
hs_finish
