#!/usr/bin/env bash
# metrics.tensorboard: true writes one events.out.tfevents.* file in
# train.out_dir whose TFRecord framing (both masked CRC32C of every record)
# and Event / Summary protobufs read back, by the decoder below and, where
# the `tensorboard` package is installed (HS_TB_PYTHON, or python3 with it;
# .ci/run installs one), by its EventAccumulator, to the values of
# metrics.jsonl: loss, grad norm, lr, tokens/s, MFU, memory of every step
# and the val loss of the evaluated ones (within 1e-5: fp32 in the events,
# 6 digits of the perf fields in metrics.jsonl). Off (the
# default), no events file is written. When the files stop taking writes
# (here past a file size limit) each failure is said once, both files keep
# their whole records up to it, and the run finishes with its weights.
# HS_TEST_TIMEOUT: 120
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch tensorboard
tiny=("${HS_TINY[@]}" train.steps=12 train.eval_every=6)
hs_must_run 1 on metrics.tensorboard=true train.out_dir="$work/on"
hs_must_run 1 off train.out_dir="$work/off"
ls "$work/off" | grep -q tfevents && fail "metrics.tensorboard: false wrote an events file"
n=$(ls "$work/on" | grep -c '^events\.out\.tfevents\.')
[ "$n" -eq 1 ] || fail "expected one events file in the run directory, found $n"

# decode_events RUN STEPS: RUN's events hold whole records of steps 1..K,
# equal to metrics.jsonl's (K = STEPS unless STEPS is 0), and every line
# of metrics.jsonl is whole.
decode_events() {
python3 - "$@" <<'PY'
import glob, json, struct, sys

def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 & -(c & 1))
    return c ^ 0xFFFFFFFF

def masked(c):
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

def varint(b, i):
    v = s = 0
    while True:
        x = b[i]; i += 1
        v |= (x & 0x7F) << s; s += 7
        if x < 0x80:
            return v, i

def fields(b):
    i = 0
    while i < len(b):
        k, i = varint(b, i)
        f, w = k >> 3, k & 7
        if w == 0:
            v, i = varint(b, i)
        elif w == 1:
            v = b[i:i + 8]; i += 8
        elif w == 5:
            v = b[i:i + 4]; i += 4
        elif w == 2:
            n, i = varint(b, i); v = b[i:i + n]; i += n
        else:
            raise ValueError(f"wire type {w}")
        yield f, v

run, want = sys.argv[1], int(sys.argv[2])
raw = open(glob.glob(f"{run}/events.out.tfevents.*")[0], "rb").read()
i, events = 0, []
while i < len(raw):
    head = raw[i:i + 8]
    (n,) = struct.unpack("<Q", head)
    assert struct.unpack("<I", raw[i + 8:i + 12])[0] == masked(crc32c(head)), "length CRC"
    data = raw[i + 12:i + 12 + n]
    assert struct.unpack("<I", raw[i + 12 + n:i + 16 + n])[0] == masked(crc32c(data)), "data CRC"
    events.append(data)
    i += 16 + n
first = dict(fields(events[0]))
assert first[3] == b"brain.Event:2", first
got = {}
for ev in events[1:]:
    e = dict(fields(ev))
    for f, val in fields(e[5]):
        v = dict(fields(val))
        got[(v[1].decode(), e[2])] = struct.unpack("<f", v[2])[0]
steps = sorted({s for _, s in got})
assert steps == list(range(1, len(steps) + 1)) and steps, steps
assert want in (0, steps[-1]), (want, steps[-1])
names = {"train/loss": "loss", "train/grad_norm": "grad_norm", "train/lr": "lr",
         "perf/tokens_per_s": "tokens_per_s", "perf/mfu": "mfu",
         "memory/peak_device_bytes": "peak_device_bytes", "val/loss": "val_loss"}
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)), "metrics.jsonl steps"
rows = [r for r in rows if r["step"] <= steps[-1]]
checked = 0
for r in rows:
    for tag, key in names.items():
        if key not in r:
            assert (tag, r["step"]) not in got, (tag, r["step"])
            continue
        v = got[(tag, r["step"])]
        # fp32 in the events; metrics.jsonl keeps 6 digits of the perf fields
        assert abs(v - r[key]) <= 1e-5 * max(1.0, abs(r[key])), (tag, r["step"], v, r[key])
        checked += 1
print(f"{len(events)} records, {checked} scalars equal to metrics.jsonl")
print(f"events to step {steps[-1]}")
PY
}
decode_events "$work/on" 12 || fail "the events do not read back to metrics.jsonl"

tb_python=${HS_TB_PYTHON:-python3}
if "$tb_python" -c "import tensorboard" 2>/dev/null; then
    "$tb_python" - "$work/on" <<'PY' || fail "EventAccumulator does not read the events back"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
run = sys.argv[1]
ea = EventAccumulator(run)
ea.Reload()
rows = {r["step"]: r for r in map(json.loads, open(f"{run}/metrics.jsonl"))}
for tag, key in (("train/loss", "loss"), ("train/lr", "lr"), ("val/loss", "val_loss")):
    s = ea.Scalars(tag)
    want = [st for st, r in sorted(rows.items()) if key in r]
    assert [x.step for x in s] == want, (tag, [x.step for x in s], want)
    for x in s:
        assert abs(x.value - rows[x.step][key]) <= 1e-6 * max(1, abs(rows[x.step][key])), tag
print(f"EventAccumulator: {sorted(ea.Tags()['scalars'])}")
PY
else
    echo "skip EventAccumulator: no tensorboard package for $tb_python (set HS_TB_PYTHON)"
fi

# Files that stop taking writes: a 48 KiB size limit (SIGXFSZ ignored, so
# a write past it fails with EFBIG) stops metrics.jsonl near step 200 and
# the events file, which goes on without it, near step 370 of 400, while
# the 43 KiB weights of this smaller model still fit. One process without
# shared-memory transports, whose files the limit would stop too.
small=(model.dim=16 model.n_layers=1 model.n_heads=2 model.n_kv_heads=1 model.ffn_dim=32
       train.seq_len=16 train.global_batch_size=2 train.micro_batch_size=2 train.eval_every=0)
(trap '' XFSZ; ulimit -f 48; PMIX_MCA_gds=hash OMPI_MCA_btl=self exec "$HS_BIN" train \
    "${small[@]}" train.steps=400 metrics.tensorboard=true train.out_dir="$work/limit") \
    > "$work/limit.log" 2>&1 || fail "files past a size limit ended the run: $(tail -3 "$work/limit.log")"
for f in metrics.jsonl events.out.tfevents; do
    n=$(grep -c "warning: cannot write $work/limit/$f.* at step [0-9]*: File too large" "$work/limit.log")
    [ "$n" -eq 1 ] || fail "$f: the failure was said $n times, want once: $(head -8 "$work/limit.log")"
done
grep -q "done: 400 steps" "$work/limit.log" || fail "the run did not finish: $(tail -3 "$work/limit.log")"
[ -s "$work/limit/model.safetensors" ] || fail "no weights after the metrics failed"
out=$(decode_events "$work/limit" 0) || fail "the files past the limit do not hold whole records"
echo "$out"
last=$(echo "$out" | sed -n 's/^events to step \([0-9]*\)$/\1/p')
rows=$(wc -l < "$work/limit/metrics.jsonl")
# each file on its own: the events go on after metrics.jsonl stopped
[ "$last" -gt "$rows" ] || fail "the events stopped at step $last with metrics.jsonl's $rows lines"
hs_finish
