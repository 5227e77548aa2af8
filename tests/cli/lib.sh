# Helpers the cli tests source: a scratch directory removed on exit, the two
# ways a check fails (at once, or counted so one run reports every broken
# check), logged commands whose output shows only when they fail, and the
# tiny model the training tests run.
# shellcheck shell=bash

# hs_scratch NAME: $work becomes a fresh /tmp/hs_cli_NAME_XXXXXX, removed
# when the script exits, however it exits.
hs_scratch() {
    work=$(mktemp -d "/tmp/hs_cli_$1_XXXXXX")
    trap 'rm -rf "$work"' EXIT
}

# die MESSAGE: the test fails here.
die() { echo "FAIL: $*" >&2; exit 1; }

# fail MESSAGE: the test fails, but goes on to its other checks;
# hs_finish then exits 1.
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
hs_finish() { [ "$failures" -eq 0 ] || exit 1; echo "ok"; exit 0; }

# run_logged LOG COMMAND...: COMMAND's output goes to LOG; when it fails,
# the command and its log are shown and the test ends.
run_logged() {
    local log=$1
    shift
    "$@" >"$log" 2>&1 || { echo "FAILED: $*"; cat "$log"; exit 1; }
}

# The model and sequence length every training test starts from; each test
# adds its own batch sizes and steps.
HS_TINY=(model.dim=32 model.n_layers=2 model.n_heads=2 model.n_kv_heads=1 model.ffn_dim=64
         train.seq_len=16)
