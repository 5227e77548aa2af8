#!/usr/bin/env bash
# Every command that writes checks its output directories before any work:
# an empty path (which would put model.safetensors, config.json and the
# tokenizer into /), a file where the directory goes, a directory where one
# of its files goes, a directory no file can be created in. Each exits 2
# naming the flag or config key and the path, and writes nothing: export
# --run / --ckpt, ckpt export, import --out, and train's train.out_dir,
# trace directory and --dump on one and two ranks (the refusal is agreed,
# so no rank waits). `train --init-from ""` says that the path is empty.
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 180
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch output_paths
tiny=("${HS_TINY[@]}" train.global_batch_size=2 train.micro_batch_size=1 train.eval_every=0
      train.steps=2)
hs_train run 1 checkpoint.dir="$work/ck"
touch "$work/a_file"
mkdir -p "$work/taken/model.safetensors"
root_before=$(ls -A /)

# hs_refused NAME PATTERN ARGS...: exit 2 naming PATTERN
hs_refused() { hs_expect_exit 2 "$@"; }

for out in "" "$work/a_file" "$work/a_file/sub"; do
    hs_refused "export_run_${out##*/}" "--safetensors" export --safetensors "$out" --run "$work/run"
    hs_refused "export_ckpt_${out##*/}" "--safetensors" export --safetensors "$out" --ckpt "$work/ck"
    hs_refused "ckpt_export_${out##*/}" "--safetensors" ckpt export "$work/ck" --safetensors "$out"
    hs_refused "import_${out##*/}" "--out" import "$work/run" --out "$out"
done
grep -q -- "--safetensors: empty path; give the directory to write into" "$work/export_run_.log" ||
    fail "export --safetensors '': $(cat "$work/export_run_.log")"
grep -q -- "--out: empty path" "$work/import_.log" || fail "import --out '': $(cat "$work/import_.log")"
grep -q -- "--safetensors $work/a_file/sub: $work/a_file is not a directory" \
    "$work/ckpt_export_sub.log" || fail "a file in the way: $(cat "$work/ckpt_export_sub.log")"
grep -q "matches" "$work/import_.log" && fail "import --out '' read the weights before refusing"
hs_refused export_taken "$work/taken/model.safetensors is a directory, where this writes the file model.safetensors" \
    export --safetensors "$work/taken" --run "$work/run"
hs_refused export_proc "cannot create files in /proc" export --safetensors /proc/hs_out --run "$work/run"
[ "$root_before" = "$(ls -A /)" ] || fail "a refused command wrote into /: $(ls -A /)"

# train: refused before the model is built, on every rank, writing nothing
printf 'train:\n  out_dir: ""\n' > "$work/empty_out.yaml"
for n in 1 2; do
    hs_run "$n" "out_file_$n" train.out_dir="$work/a_file"
    [ "$rc" -eq 2 ] || fail "train.out_dir a file on $n rank(s): exit $rc, want 2"
    grep -q "train.out_dir = $work/a_file: $work/a_file is not a directory" \
        "$work/out_file_$n.log" || fail "out_dir a file, $n rank(s): $(cat "$work/out_file_$n.log")"
    grep -q "model .* params" "$work/out_file_$n.log" && fail "the model was built before refusing"
    hs_run "$n" "out_taken_$n" train.out_dir="$work/taken"
    [ "$rc" -eq 2 ] || fail "out_dir/model.safetensors a directory on $n rank(s): exit $rc, want 2"
    grep -q "train.out_dir = $work/taken: $work/taken/model.safetensors is a directory" \
        "$work/out_taken_$n.log" || fail "taken, $n rank(s): $(cat "$work/out_taken_$n.log")"
    [ ! -e "$work/taken/metrics.jsonl" ] || fail "a refused run wrote metrics.jsonl"
    hs_run "$n" "trace_file_$n" trace.enabled=true trace.dir="$work/a_file" train.out_dir="$work/t$n"
    [ "$rc" -eq 2 ] || fail "trace.dir a file on $n rank(s): exit $rc, want 2"
    grep -q "trace.dir = $work/a_file: $work/a_file is not a directory" "$work/trace_file_$n.log" ||
        fail "trace.dir a file, $n rank(s): $(cat "$work/trace_file_$n.log")"
    [ ! -e "$work/t$n" ] || fail "a refused trace.dir left train.out_dir behind"
    hs_run "$n" "dump_file_$n" train.out_dir="$work/d$n" --dump "$work/a_file/dump"
    [ "$rc" -eq 2 ] || fail "--dump under a file on $n rank(s): exit $rc, want 2"
    grep -q -- "--dump $work/a_file/dump: $work/a_file is not a directory" "$work/dump_file_$n.log" ||
        fail "--dump under a file, $n rank(s): $(cat "$work/dump_file_$n.log")"
    [ ! -e "$work/d$n" ] || fail "a refused --dump left train.out_dir behind"
    hs_run "$n" "empty_out_$n" "$work/empty_out.yaml"
    [ "$rc" -eq 2 ] || fail "train.out_dir '' on $n rank(s): exit $rc, want 2"
    grep -q "train.out_dir: empty path" "$work/empty_out_$n.log" ||
        fail "out_dir '' on $n rank(s): $(cat "$work/empty_out_$n.log")"
done
[ "$(cat "$work/a_file")" = "" ] || fail "a_file was written"
[ "$root_before" = "$(ls -A /)" ] || fail "a refused run wrote into /: $(ls -A /)"

hs_refused init_empty "--init-from: empty path given; give the directory of the model.safetensors" \
    train --init-from "" train.out_dir="$work/never"
hs_refused dump_empty "--dump: empty path given" train --dump= train.out_dir="$work/never"
[ ! -e "$work/never" ] || fail "a refused --init-from or --dump left train.out_dir behind"
hs_finish
