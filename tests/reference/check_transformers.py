#!/usr/bin/env python3
"""Checks that Hugging Face transformers loads what `hypershard export`
writes and computes the same logits as hypershard (tests/reference/README.md).

For each case (a tiny Llama with tied embeddings, GQA, rope_theta 5e5 and
rms_norm_eps 1e-6; a tiny untied Llama; tiny Llamas with Llama 3.1's
scaled RoPE and with YaRN, and a Qwen3 with YaRN's mscale pair; a tiny Mixtral-style MoE; a tiny
Qwen3 tied, with head_dim 16 on dim 32, and untied; a tiny Qwen3-MoE with
norm_topk_prob false and one with it true) it trains
a few steps with `hypershard train --dump DIR` and a checkpoint after every
step, then

  * exports every checkpoint (`hypershard export --ckpt`) and the finished run
    (`hypershard export --run`), and requires each exported
    model.safetensors to equal the dumped weights of that step bit for bit;
  * for every step N, loads the weights step N started from with
    `AutoModelForCausalLM.from_pretrained(dir, torch_dtype=float32)` (no
    missing or unexpected tensors allowed), runs the sequence whose logits
    hypershard dumped (`logits-stepN`, metadata `sequence`) and requires
    max |hf - hypershard| / max |hypershard| < --tol (1e-4);
  * negative control: the same with rope_theta divided by 100 in config.json
    must fail by at least 10x the tolerance, or the check proves nothing;
    for the cases with a scaled RoPE (llama3, yarn), so must the same
    without config.json's rope_scaling.

Step 1 starts from the initial weights, which no checkpoint holds: their
directory is the dumped weights-step0 next to the exported config.json.

With --run RUN --dump DUMP [--ckpt CKPT_DIR] it checks an existing run
instead (trained with `--dump`, data.source tokens).

Needs transformers with torch (CI has neither; this is a developer check):

  /usr/bin/python3 -m venv --system-site-packages /tmp/hfenv
  /tmp/hfenv/bin/pip install transformers==4.44.2
  /tmp/hfenv/bin/python tests/reference/check_transformers.py --bin build/hypershard

Exit 0 when every case passes, 1 otherwise.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import torch
import transformers
import yaml
from safetensors import safe_open
from safetensors.torch import load_file

STEPS = 3
SEQ_LEN = 32
VOCAB = 320

COMMON = {
    "optimizer": {"_target_": "adamw", "lr": 0.01,
                  "schedule": {"warmup_steps": 0, "decay": "constant"}},
    "train": {"steps": STEPS, "global_batch_size": 4, "micro_batch_size": 4,
              "seq_len": SEQ_LEN, "seed": 7, "eval_every": 0, "log_every": 1},
    "data": {"source": "tokens", "val_fraction": 0.0},
    "checkpoint": {"save_every": 1, "keep_last": STEPS},
}

CASES = {
    "llama_tied": {"arch": "llama", "vocab_size": VOCAB, "dim": 64, "n_layers": 2,
                   "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 96, "norm_eps": 1e-6,
                   "rope_theta": 500000.0, "tie_embeddings": True, "init_std": 0.1},
    "llama_untied": {"arch": "llama", "vocab_size": VOCAB, "dim": 48, "n_layers": 3,
                     "n_heads": 6, "n_kv_heads": 6, "ffn_dim": 80, "tie_embeddings": False,
                     "init_std": 0.1},
    # Qwen3: per-head q_norm / k_norm, a head size apart from dim / n_heads
    # (4 x 16 on dim 32), tied; and untied with the derived head size.
    "qwen3_tied": {"arch": "qwen3", "vocab_size": VOCAB, "dim": 32, "n_layers": 2,
                   "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "ffn_dim": 64,
                   "norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_embeddings": True,
                   "init_std": 0.1},
    "qwen3_untied": {"arch": "qwen3", "vocab_size": VOCAB, "dim": 48, "n_layers": 2,
                     "n_heads": 6, "n_kv_heads": 3, "ffn_dim": 80, "tie_embeddings": False,
                     "init_std": 0.1},
    # Scaled RoPE over a context past the "original" one (SEQ_LEN 32):
    # Llama 3.1's bands (with 16 positions all three bands hold dims of
    # HD 16) and YaRN with its attention factor from factor and from the
    # mscale pair.
    "llama_rope_llama3": {"arch": "llama", "vocab_size": VOCAB, "dim": 64, "n_layers": 2,
                          "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 96, "rope_theta": 500000.0,
                          "tie_embeddings": False, "init_std": 0.1,
                          "rope_scaling": {"type": "llama3", "factor": 4.0,
                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 16}},
    "llama_rope_yarn": {"arch": "llama", "vocab_size": VOCAB, "dim": 64, "n_layers": 2,
                        "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 96, "rope_theta": 10000.0,
                        "tie_embeddings": False, "init_std": 0.1,
                        "rope_scaling": {"type": "yarn", "factor": 4.0,
                                         "original_max_position_embeddings": 8,
                                         "beta_fast": 8.0, "beta_slow": 1.0}},
    "qwen3_rope_yarn_mscale": {"arch": "qwen3", "vocab_size": VOCAB, "dim": 32, "n_layers": 2,
                               "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "ffn_dim": 64,
                               "rope_theta": 1000000.0, "tie_embeddings": True,
                               "init_std": 0.1,
                               "rope_scaling": {"type": "yarn", "factor": 8.0,
                                                "original_max_position_embeddings": 4,
                                                "mscale": 0.7, "mscale_all_dim": 1.0}},
    # No shared expert: Mixtral has none, so transformers would ignore it.
    "moe": {"arch": "moe", "vocab_size": VOCAB, "dim": 32, "n_layers": 2, "n_heads": 4,
            "n_kv_heads": 2, "ffn_dim": 64, "init_std": 0.1,
            "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_dim": 48,
                    "shared_expert_ffn_dim": 0, "aux_loss_coef": 0.02}},
    # Qwen3-MoE: Qwen3's attention, 8 fine-grained experts, the top-k
    # weights as the softmax gives them (norm_topk_prob false) and
    # renormalised.
    "qwen3_moe": {"arch": "qwen3_moe", "vocab_size": VOCAB, "dim": 32, "n_layers": 2,
                  "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "ffn_dim": 64,
                  "norm_eps": 1e-6, "rope_theta": 1000000.0, "init_std": 0.1,
                  "moe": {"num_experts": 8, "top_k": 2, "expert_ffn_dim": 24,
                          "norm_topk_prob": False, "aux_loss_coef": 0.01}},
    "qwen3_moe_norm": {"arch": "qwen3_moe", "vocab_size": VOCAB, "dim": 48, "n_layers": 2,
                       "n_heads": 6, "n_kv_heads": 3, "ffn_dim": 80, "init_std": 0.1,
                       "moe": {"num_experts": 8, "top_k": 3, "expert_ffn_dim": 16,
                               "norm_topk_prob": True, "aux_loss_coef": 0.01}},
}


def write_tokens(path, n):
    """n pseudo-random tokens below VOCAB (64-bit LCG, Knuth's MMIX
    constants) as an HSTK file (docs/data.md)."""
    x, ids = 20261129, []
    for _ in range(n):
        x = (6364136223846793005 * x + 1442695040888963407) % 2**64
        ids.append((x >> 33) % VOCAB)
    with open(path, "wb") as f:
        f.write(b"HSTK" + struct.pack("<IQ", 1, n) + struct.pack(f"<{n}H", *ids))


def read_tokens(path):
    with open(path, "rb") as f:
        raw = f.read()
    magic, version, count = struct.unpack("<4sIQ", raw[:16])
    if magic != b"HSTK" or version != 1:
        sys.exit(f"{path}: not an HSTK version 1 token file")
    return torch.tensor(struct.unpack(f"<{count}H", raw[16:16 + 2 * count]), dtype=torch.long)


def run(cmd, log):
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        sys.stdout.write(open(log).read())
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}")


def train(binary, name, work):
    """A STEPS-step run of case `name`; returns (run, dump, ckpt) dirs."""
    d = os.path.join(work, name)
    os.makedirs(d)
    tokens = os.path.join(work, "tokens.hstk")
    if not os.path.exists(tokens):
        write_tokens(tokens, 24 * (SEQ_LEN + 1))
    cfg = json.loads(json.dumps(COMMON))
    cfg["model"] = CASES[name]
    cfg["data"]["path"] = tokens
    cfg["checkpoint"]["dir"] = os.path.join(d, "ckpt")
    cfg["train"]["out_dir"] = os.path.join(d, "run")
    with open(os.path.join(d, "config.yaml"), "w") as f:
        yaml.safe_dump(cfg, f)
    run([binary, "train", os.path.join(d, "config.yaml"), "--dump", os.path.join(d, "dump")],
        os.path.join(d, "train.log"))
    return cfg["train"]["out_dir"], os.path.join(d, "dump"), cfg["checkpoint"]["dir"]


def same_tensors(path_a, path_b):
    """'' when both files hold the same names, shapes and fp32 values."""
    a, b = load_file(path_a), load_file(path_b)
    if set(a) != set(b):
        return f"names differ: only in {path_a}: {sorted(set(a) - set(b))[:4]}, " \
               f"only in {path_b}: {sorted(set(b) - set(a))[:4]}"
    for k in sorted(a):
        if a[k].shape != b[k].shape or a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k]):
            return f"{k}: {path_a} and {path_b} differ"
    return ""


def export_dirs(binary, run_dir, dump, ckpt, out):
    """{step s: HF dir with the weights after step s} for every step the
    dump covers; each exported file is checked against the dump."""
    dirs, errors = {}, []
    final = os.path.join(out, "export-run")
    run([binary, "export", "--safetensors", final, "--run", run_dir], final + ".log")
    weights = {int(f[len("weights-step"):-len(".safetensors")])
               for f in os.listdir(dump) if f.startswith("weights-step")}
    last = max(weights)
    dirs[last] = final
    for s in sorted(weights):
        step_dir = os.path.join(ckpt, f"step-{s}") if ckpt else ""
        if s != last and step_dir and os.path.isdir(step_dir):
            dirs[s] = os.path.join(out, f"export-ckpt-{s}")
            run([binary, "export", "--safetensors", dirs[s], "--ckpt", step_dir], dirs[s] + ".log")
        elif s != last:  # no checkpoint of these weights: dumped weights + exported config
            dirs[s] = os.path.join(out, f"dump-weights-{s}")
            os.makedirs(dirs[s])
            shutil.copy(os.path.join(final, "config.json"), dirs[s])
            shutil.copy(os.path.join(dump, f"weights-step{s}.safetensors"),
                        os.path.join(dirs[s], "model.safetensors"))
        diff = same_tensors(os.path.join(dirs[s], "model.safetensors"),
                            os.path.join(dump, f"weights-step{s}.safetensors"))
        if diff:
            errors.append(f"export of step {s}: {diff}")
    return dirs, errors


def hf_logits(hf_dir, tokens):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, torch_dtype=torch.float32, attn_implementation="eager",
        output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise ValueError(f"{hf_dir}: transformers reports {bad}")
    model.eval()
    with torch.no_grad():
        return model(input_ids=tokens[None, :]).logits[0]


def rel_max(ours, ref):
    return ((ours - ref).abs().max() / ref.abs().max()).item()


def check_logits(dirs, dump, tokens, tol, name):
    """One line per step; returns the worst error."""
    worst = 0.0
    for f in sorted(os.listdir(dump)):
        if not f.startswith("logits-step"):
            continue
        step = int(f[len("logits-step"):-len(".safetensors")])
        path = os.path.join(dump, f)
        with safe_open(path, "pt") as g:
            seq = int(g.metadata()["sequence"])
            ref = g.get_tensor("logits")
        T = ref.shape[0]
        x = tokens[seq * (T + 1): seq * (T + 1) + T]
        err = rel_max(hf_logits(dirs[step - 1], x), ref)
        worst = max(worst, err)
        print(f"  {name} step {step} (weights of step {step - 1}, sequence {seq}): "
              f"max|hf - hs| / max|hs| = {err:.2e} (max|hs| = {ref.abs().max().item():.3f})")
    return worst


def negative_control(hf_dir, dump, tokens, work, spoil="theta"):
    """The last step's check with a wrong rope_theta (spoil "theta") or
    without the RoPE scaling ("scaling"): its error."""
    bad = os.path.join(work, "negative-control-" + spoil)
    shutil.copytree(hf_dir, bad)
    cfg_path = os.path.join(bad, "config.json")
    cfg = json.load(open(cfg_path))
    if spoil == "theta":
        cfg["rope_theta"] = cfg["rope_theta"] / 100
    else:
        del cfg["rope_scaling"]
    json.dump(cfg, open(cfg_path, "w"))
    last = max(int(f[len("logits-step"):-len(".safetensors")])
               for f in os.listdir(dump) if f.startswith("logits-step"))
    with safe_open(os.path.join(dump, f"logits-step{last}.safetensors"), "pt") as g:
        seq = int(g.metadata()["sequence"])
        ref = g.get_tensor("logits")
    T = ref.shape[0]
    return rel_max(hf_logits(bad, tokens[seq * (T + 1): seq * (T + 1) + T]), ref)


def check_case(binary, name, run_dir, dump, ckpt, work, tol):
    out = os.path.join(work, name + "-hf")
    os.makedirs(out)
    dirs, errors = export_dirs(binary, run_dir, dump, ckpt, out)
    data = yaml.safe_load(open(os.path.join(run_dir, "config.yaml")))["data"]
    if data["source"] != "tokens":
        sys.exit(f"{run_dir}: data.source is {data['source']}; this check reads token files only")
    tokens = read_tokens(data["path"])
    worst = check_logits(dirs, dump, tokens, tol, name)
    if worst >= tol:
        errors.append(f"logits: worst {worst:.2e} >= tolerance {tol:.0e}")
    control = negative_control(dirs[max(dirs) - 1], dump, tokens, out)
    print(f"  {name} negative control (rope_theta / 100): {control:.2e}")
    if control < 10 * tol:
        errors.append(f"negative control: {control:.2e} < {10 * tol:.0e}; the check cannot fail")
    if "rope_scaling" in CASES.get(name, {}):
        control = negative_control(dirs[max(dirs) - 1], dump, tokens, out, "scaling")
        print(f"  {name} negative control (rope_scaling left out): {control:.2e}")
        if control < 10 * tol:
            errors.append(f"without rope_scaling: {control:.2e} < {10 * tol:.0e}; the scaling "
                          "is not checked")
    for e in errors:
        print(f"FAIL {name}: {e}")
    print(f"{name}: {'PASS' if not errors else 'FAIL'} (worst {worst:.2e})")
    return not errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="the hypershard binary")
    ap.add_argument("--case", action="append", choices=sorted(CASES),
                    help="train and check only these cases (default: all)")
    ap.add_argument("--run", help="check this finished run (train.out_dir) instead of training")
    ap.add_argument("--dump", help="with --run: its --dump DIR")
    ap.add_argument("--ckpt", help="with --run: its checkpoint.dir, to export checkpoints")
    ap.add_argument("--work", help="keep the runs and exports here (default: a temporary dir)")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    if bool(args.run) != bool(args.dump):
        ap.error("--run and --dump go together")
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    binary = os.path.realpath(args.bin)
    work = args.work or tempfile.mkdtemp(prefix="hs_transformers_")
    os.makedirs(work, exist_ok=True)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; work dir {work}")
    ok = True
    try:
        if args.run:
            ok = check_case(binary, "run", args.run, args.dump, args.ckpt, work, args.tol)
        else:
            for name in args.case or CASES:
                run_dir, dump, ckpt = train(binary, name, work)
                ok &= check_case(binary, name, run_dir, dump, ckpt, work, args.tol)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print("transformers parity: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
