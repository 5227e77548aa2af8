#!/usr/bin/env python3
"""Developer check: `hypershard generate` continues a prompt exactly as
Hugging Face transformers does on the exported weights (greedy).

Trains a small byte-level Llama with `hypershard train`, exports it with
`hypershard export --run`, loads the export with
`AutoModelForCausalLM.from_pretrained` and runs `generate(do_sample=False)`
on the prompt's bytes, then compares the new tokens with those of
`hypershard generate --run` (one process) and `--ckpt` under `mpiexec -n 2`
with PP 2. Prompt plus continuation stay within train.seq_len, where
hypershard's window does not slide.

Needs torch and transformers (a venv outside the repository, e.g.
/tmp/peer/bin/python tests/reference/check_generate.py --bin build/hypershard).
Exit 0 when every continuation matches.
"""
import argparse
import os
import subprocess
import sys
import tempfile


def run(cmd, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return out.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/hypershard")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--new", type=int, default=40)
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    work = tempfile.mkdtemp(prefix="hs_generate_check_")
    model = ["model.dim=128", "model.n_layers=4", "model.n_heads=4", "model.n_kv_heads=2",
             "model.ffn_dim=256", "train.seq_len=64", f"train.steps={args.steps}",
             "train.eval_every=0"]
    run([args.bin, "train", *model, f"train.out_dir={work}/run", f"checkpoint.dir={work}/ck"])
    run([args.bin, "export", "--safetensors", f"{work}/hf", "--run", f"{work}/run"])
    prompt = "The old bird "
    hf = AutoModelForCausalLM.from_pretrained(f"{work}/hf", torch_dtype=torch.float32)
    ids = torch.tensor([[b for b in prompt.encode()]])
    with torch.no_grad():
        want = hf.generate(ids, max_new_tokens=args.new, do_sample=False)[0, ids.shape[1]:].tolist()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    ok = True
    for name, cmd in (("one process, --run", [args.bin, "generate", "--run", f"{work}/run"]),
                      ("mpiexec -n 2, --ckpt, PP 2",
                       ["mpiexec", "-n", "2", args.bin, "generate", "--ckpt", f"{work}/ck",
                        "accelerator.pp_size=2"])):
        text = run(cmd + ["--prompt", prompt, "--max-new-tokens", str(args.new)], env=env)
        got = list(text.rstrip("\n").encode("latin-1"))[len(prompt):]
        same = got == want
        ok &= same
        print(f"{name}: {'same' if same else 'DIFFERENT'} {args.new} tokens: "
              f"{bytes(got)!r}" + ("" if same else f" vs transformers {bytes(want)!r}"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
