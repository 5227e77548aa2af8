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

# hs_skip REASON: the test cannot run here; exit 77, which ctest counts as
# skipped (SKIP_RETURN_CODE in cmake/tests.cmake), not as passed.
hs_skip() { echo "skip: $*"; exit 77; }

# hs_expect_exit CODE NAME PATTERN ARGS...: `hypershard ARGS` exits CODE
# and its output (in $work/NAME.log) holds PATTERN (grep).
hs_expect_exit() {
    local code=$1 name=$2 pat=$3 rc=0
    shift 3
    "$HS_BIN" "$@" > "$work/$name.log" 2>&1 || rc=$?
    [ "$rc" -eq "$code" ] || fail "$name: exit $rc, want $code"
    grep -q -- "$pat" "$work/$name.log" || fail "$name: '$pat' not in $(head -3 "$work/$name.log")"
}

# hs_refused RANKS MESSAGE ARGS...: `hypershard train` of the tiny model
# with ARGS on RANKS ranks is a configuration error (exit 2) whose output
# holds MESSAGE (a fixed string), and it writes nothing; the test ends if not.
hs_refused() {
    local n=$1 msg=$2 rc=0 launch=()
    shift 2
    [ "$n" = 1 ] || launch=("$MPIEXEC" -n "$n")
    "${launch[@]}" "$HS_BIN" train "${tiny[@]}" "$@" train.out_dir="$work/refused" \
        > "$work/refused.txt" 2>&1 || rc=$?
    [ "$rc" = 2 ] || die "$*: exit $rc, want 2: $(tail -3 "$work/refused.txt")"
    grep -qF -- "$msg" "$work/refused.txt" || die "$*: no '$msg' in $(tail -3 "$work/refused.txt")"
    [ ! -e "$work/refused" ] || die "$*: wrote $work/refused"
}

# hs_signal_grace: for a test that sends SIGTERM to mpiexec. The suite's
# environment has mpiexec end ranks at once when one exits non-zero
# (OMPI_MCA_odls_base_sigkill_timeout=0, cmake/tests.cmake); a signalled job
# gets Open MPI's default grace back, in which its ranks save and stop.
hs_signal_grace() { unset OMPI_MCA_odls_base_sigkill_timeout; }

# until_log NAME PATTERN: wait (up to 60 s) until $work/NAME.log holds
# PATTERN (grep); the test ends if it never does.
until_log() {
    for _ in $(seq 1200); do
        grep -q -- "$2" "$work/$1.log" && return 0
        sleep 0.05
    done
    die "$1: '$2' never in its output: $(tail -5 "$work/$1.log")"
}

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

# The model the FSDP comparison tests run for 3 steps without warm-up, as
# tests/mpi/test_fsdp_parity.c builds it (40-row FFN matrices: uneven over
# 3 ranks); eps 1e-6 keeps Adam's weight update as well conditioned as the
# gradient, so weights compare at the gradients' tolerance.
HS_FSDP_TINY=(model.dim=32 model.n_layers=2 model.n_heads=4 model.n_kv_heads=1 model.ffn_dim=40
              train.seq_len=16 train.micro_batch_size=2 train.steps=3 train.eval_every=0
              optimizer.eps=1e-6 optimizer.schedule.warmup_steps=0)

# hs_train NAME RANKS ARGS...: `hypershard train` with the test's base
# arguments ${tiny[@]} and ARGS into $work/NAME, on one process when RANKS
# is 1 (no launcher) and under mpiexec otherwise; its output goes to
# $work/NAME.txt and is shown, ending the test, when the run fails.
# shellcheck disable=SC2154 # tiny is the sourcing test's
hs_train() {
    local name=$1 n=$2
    shift 2
    local launch=()
    [ "$n" = 1 ] || launch=("$MPIEXEC" -n "$n")
    "${launch[@]}" "$HS_BIN" train "${tiny[@]}" "$@" train.out_dir="$work/$name" \
        > "$work/$name.txt" 2>&1 || { cat "$work/$name.txt"; exit 1; }
}

# hs_train_dump NAME RANKS ARGS...: hs_train, dumping the per-step tensors
# into $work/NAME/dump.
hs_train_dump() { hs_train "$@" --dump "$work/$1/dump"; }

# The tensors a dumped 3-step run is compared by: the exported model, step
# 1's gradients, the weights after steps 1 and 2, the logits step 2 starts
# from.
HS_DUMP_FILES=(model.safetensors dump/grads-step1.safetensors dump/weights-step1.safetensors
               dump/weights-step2.safetensors dump/logits-step2.safetensors)

# hs_compare_moe_runs REF RUN TOL: hs_compare_runs over HS_DUMP_FILES and
# hs_compare_moe_stats.
hs_compare_moe_runs() {
    hs_compare_runs "$1" "$2" "$3" "${HS_DUMP_FILES[@]}"
    hs_compare_moe_stats "$1" "$2"
}

# hs_compare_moe_stats REF RUN: the MoE runs $work/REF and $work/RUN logged
# the same aux loss (within 1e-6 relative) and the same expert row counts
# at every step.
hs_compare_moe_stats() {
    python3 - "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
for x, y in zip(a, b):
    assert abs(x["aux_loss"] - y["aux_loss"]) <= 1e-6 * abs(x["aux_loss"]), (x["aux_loss"], y["aux_loss"])
    assert x["expert_tokens"] == y["expert_tokens"], (x["expert_tokens"], y["expert_tokens"])
print(f"  aux loss and expert_tokens of {len(a)} steps equal")
PY
}

# hs_run N LOG ARGS...: `hypershard train` with ${tiny[@]} and ARGS on N
# ranks, stopped after 120 s so a hung collective fails the check instead
# of the whole test; sets rc, output in $work/LOG.log.
# shellcheck disable=SC2154 # tiny is the sourcing test's
hs_run() {
    local n=$1 log=$2
    shift 2
    timeout 120 "$MPIEXEC" -n "$n" "$HS_BIN" train "${tiny[@]}" "$@" > "$work/$log.log" 2>&1
    rc=$?
}

# hs_must_run N LOG ARGS...: hs_run; a non-zero exit is a counted failure.
hs_must_run() {
    hs_run "$@"
    [ "$rc" -eq 0 ] || fail "$2: exit $rc: $(tail -5 "$work/$2.log")"
}

# hs_compare_runs REF RUN TOL [FILE...]: runs $work/REF and $work/RUN (3
# steps each) agree: every loss finite, loss and grad norm of every step
# within TOL relative, and every tensor of each FILE (fp32 safetensors
# under the run directory; model.safetensors when none is named) within
# TOL of the reference tensor's largest |value|. "Within" is strict, and
# TOL 0 means bit for bit.
hs_compare_runs() {
    local ref=$1 run=$2 tol=$3
    shift 3
    [ $# -gt 0 ] || set -- model.safetensors
    python3 - "$work/$ref" "$work/$run" "$tol" "$@" <<'PY'
import json, math, struct, sys

def metrics(d):
    return [json.loads(l) for l in open(d + "/metrics.jsonl")]

def tensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", (path, k, v["dtype"])
        a, b = v["data_offsets"]
        out[k] = struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b])
    return out

def within(err, tol):
    return err == 0 if tol == 0 else err < tol

ref, run, tol, files = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
a, b = metrics(ref), metrics(run)
assert len(a) == len(b) == 3, (len(a), len(b))
worst, n = 0.0, 0
for x, y in zip(a, b):
    assert math.isfinite(x["loss"]) and math.isfinite(y["loss"]), (x["loss"], y["loss"])
    for k in ("loss", "grad_norm"):
        rel = abs(x[k] - y[k]) / abs(x[k])
        assert within(rel, tol), \
            f"{run}: step {x['step']} {k} {y[k]} vs {ref} {x[k]} (rel {rel:.2e})"
        worst = max(worst, rel)
for f in files:
    ta, tb = tensors(ref + "/" + f), tensors(run + "/" + f)
    assert ta.keys() == tb.keys(), (f, set(ta) ^ set(tb))
    for k in ta:
        scale = max(abs(v) for v in ta[k]) or 1.0
        err = max(abs(p - q) for p, q in zip(ta[k], tb[k])) / scale
        assert within(err, tol), f"{run}: {f} {k} differs by {err:.2e} relative"
        worst = max(worst, err)
        n += 1
print(f"{run.split('/')[-1]} vs {ref.split('/')[-1]}: 3 steps, {n} tensors, "
      f"worst relative error {worst:.2e} (tol {tol})")
PY
}

# same_curve A B FIRST LAST: steps FIRST..LAST appear once each in B and their
# loss, grad_norm and lr strings equal A's.
same_curve() {
    python3 - "$@" <<'PY' || fail "curves differ: $*"
import re, sys
def rows(path):
    out = {}
    for line in open(path):
        step = int(re.search(r'"step":(\d+)', line).group(1))
        vals = tuple(re.search(r'"%s":([^,}]+)' % k, line).group(1) for k in ("loss", "grad_norm", "lr"))
        out.setdefault(step, []).append(vals)
    return out
a, b = rows(sys.argv[1]), rows(sys.argv[2])
first, last = int(sys.argv[3]), int(sys.argv[4])
bad = []
for s in range(first, last + 1):
    if len(b.get(s, [])) != 1:
        bad.append(f"step {s} appears {len(b.get(s, []))} times in {sys.argv[2]}")
    elif a[s][0] != b[s][0]:
        bad.append(f"step {s}: uninterrupted {a[s][0]} vs resumed {b[s][0]}")
extra = sorted(s for s in b if s > last)
if extra:
    bad.append(f"steps past {last}: {extra}")
if bad:
    sys.exit("\n".join(bad))
PY
}
# close_curve A B FIRST LAST: B holds exactly steps FIRST..LAST, each loss
# and grad norm within 1e-5 relative of A's.
close_curve() {
    python3 - "$@" <<'PY' || fail "curves differ: $*"
import json, sys
a = {r["step"]: r for r in map(json.loads, open(sys.argv[1]))}
b = [json.loads(l) for l in open(sys.argv[2])]
first, last = int(sys.argv[3]), int(sys.argv[4])
steps = [r["step"] for r in b]
if steps != list(range(first, last + 1)):
    sys.exit(f"{sys.argv[2]} holds steps {steps}, want {first}..{last}")
for r in b:
    for k in ("loss", "grad_norm"):
        ref = a[r["step"]][k]
        rel = abs(r[k] - ref) / abs(ref)
        if rel > 1e-5:
            sys.exit(f"step {r['step']} {k}: uninterrupted {ref} vs resumed {r[k]} (rel {rel:.1e})")
PY
}

# same_global A B...: checkpoint steps A, B, ... hold the same global
# tensors: every tensor assembled from its chunks (any box) has the same
# dtype, shape and bytes, and so do the trainer states.
same_global() {
    python3 - "$@" <<'PY' || fail "checkpoints differ: $*"
import json, os, sys
def load(d):
    m = json.load(open(os.path.join(d, "metadata.json")))
    es = {"float32": 4, "bfloat16": 2, "float16": 2}
    out = {}
    for t in m["tensors"]:
        shape, e = t["shape"], es[t["dtype"]]
        strides = [e] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * shape[i + 1]
        buf, covered = bytearray(strides[0] * shape[0]), 0
        for c in t["chunks"]:
            with open(os.path.join(d, c["file"]), "rb") as f:
                f.seek(c["byte_offset"])
                data = f.read(c["length"])
            sz, off = c["sizes"], c["offsets"]
            inner = sz[-1] * e
            n = len(data) // inner
            for k in range(n):  # each contiguous run of the chunk's last dim
                idx, rem = [], k
                for s in reversed(sz[:-1]):
                    idx.append(rem % s)
                    rem //= s
                idx = list(reversed(idx))
                pos = sum((off[i] + idx[i]) * strides[i] for i in range(len(shape) - 1))
                pos += off[-1] * e
                buf[pos:pos + inner] = data[k * inner:(k + 1) * inner]
            covered += len(data)
        assert covered == len(buf), (d, t["name"], covered, len(buf))
        out[t["name"]] = (t["dtype"], tuple(shape), bytes(buf))
    st = {k: m["state"][k] for k in ("step", "data_position", "optim_step")}
    return out, st
a, sa = load(sys.argv[1])
for d in sys.argv[2:]:
    b, sb = load(d)
    if sa != sb: sys.exit(f"{d}: state {sb} vs {sa}")
    if sorted(a) != sorted(b): sys.exit(f"{d}: tensors {sorted(set(a) ^ set(b))} not in both")
    for k in a:
        if a[k] != b[k]: sys.exit(f"{d}: {k} differs from {sys.argv[1]}")
print(f"{len(a)} tensors equal")
PY
}

# hs_chunk_in INSPECT_LOG TENSOR BOX FILE: `ckpt inspect` (its output in
# INSPECT_LOG) lists a chunk [BOX] of TENSOR stored in FILE.
hs_chunk_in() {
    grep -A5 "^  $2 " "$1" | grep -q "\[$3\] *$4" || fail "inspect: no chunk [$3] of $2 in $4"
}

# hs_resume_layouts STEP_DIR REF_RUN LAYOUT...: each LAYOUT, "N NAME ARGS...",
# resumes checkpoint STEP_DIR on N ranks with ARGS and trains to step 5 in
# $work/r_NAME; its steps 3-5 must follow REF_RUN's curve (close_curve).
hs_resume_layouts() {
    local step_dir=$1 ref=$2 layout n name
    shift 2
    for layout in "$@"; do
        set -- $layout
        n=$1 name=$2
        shift 2
        hs_must_run "$n" "resume_$name" "$@" train.steps=5 train.out_dir="$work/r_$name" \
            checkpoint.dir="$work/ck_$name" checkpoint.resume="$step_dir"
        close_curve "$ref/metrics.jsonl" "$work/r_$name/metrics.jsonl" 3 5
    done
}

# hs_two_hosts: two "hosts" on one machine for the multi-host tests: network
# namespaces $a (10.77.0.1, hostname hostA) and $b (10.77.0.2, hostB) joined
# by a veth pair, removed on exit with $work; $work/agent.sh, the rsh agent
# Open MPI starts the other host's daemon with (it refuses a host while the
# file $work/gone-<address> exists: a host taken away); $work/hosts, a
# hostfile of both with 2 slots each. Skips (exit 77), saying why, where
# namespaces cannot be made (not root, no iproute2 or unshare).
hs_two_hosts() {
    command -v ip > /dev/null || hs_skip "no ip (iproute2) to make network namespaces"
    command -v unshare > /dev/null || hs_skip "no unshare to give each host its hostname"
    local ns="hs$$" n
    a="${ns}a" b="${ns}b"
    trap 'ip netns del "$a" 2> /dev/null; ip netns del "$b" 2> /dev/null; rm -rf "$work"' EXIT
    ip netns add "$a" 2> /dev/null || hs_skip "cannot create a network namespace (needs root)"
    ip netns add "$b" || hs_skip "cannot create a second network namespace"
    ip link add "${a}v" type veth peer name "${b}v" || hs_skip "cannot create a veth pair"
    ip link set "${a}v" netns "$a" && ip link set "${b}v" netns "$b" || hs_skip "cannot move the veth ends"
    ip netns exec "$a" ip addr add 10.77.0.1/24 dev "${a}v"
    ip netns exec "$b" ip addr add 10.77.0.2/24 dev "${b}v"
    for n in "$a" "$b"; do
        ip netns exec "$n" ip link set lo up
        ip netns exec "$n" ip link set "${n}v" up
    done
    cat > "$work/agent.sh" <<AGENT
#!/bin/sh
host=\$1; shift
[ -e "$work/gone-\$host" ] && { echo "agent: \$host is gone" >&2; exit 1; }
case "\$host" in
  10.77.0.1) n=$a; name=hostA ;;
  10.77.0.2) n=$b; name=hostB ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$n" unshare --uts sh -c "hostname \$name; exec \$*"
AGENT
    chmod +x "$work/agent.sh"
    printf "10.77.0.1 slots=2\n10.77.0.2 slots=2\n" > "$work/hosts"
}

# A tier run (HS_CPU_ISA set by cmake/tests.cmake for HS_TEST_TIERS) on a
# CPU whose own tier is no higher is its native run again: skipped there.
[ -z "${HS_CPU_GEMM16:-}" ] || echo "16-bit GEMM engine: HS_CPU_GEMM16=$HS_CPU_GEMM16"
if [ -n "${HS_CPU_ISA:-}" ]; then
    if [ "$HS_CPU_ISA" = avx2 ] && ! grep -q -m1 -w avx512f /proc/cpuinfo; then
        hs_skip "this CPU's own tier is avx2: the test's native run covers it"
    fi
    echo "cpu tier: HS_CPU_ISA=$HS_CPU_ISA ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-}"
fi
