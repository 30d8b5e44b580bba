#!/usr/bin/env python3
"""Parity fixtures between transformers' Qwen2ForCausalLM and kevin's burn Qwen2.

Each model directory this script writes holds what `from_pretrained` reads (config.json,
model.safetensors) plus `expected.safetensors`: `input_ids` (i64 [batch, seq]) and `logits`
(f32 [batch, seq, vocab]) computed by transformers. The Rust tests load the directory with
kevin's loader, run the same ids and compare (policy/tests/qwen2_checkpoint.rs).

Modes:
  --fixture DIR            tiny models (untied and tied, f32, CPU) for the committed fixture
                           tests/data/qwen2-tiny/{untied,tied}
  --device cuda --out DIR  a larger model on the GPU, written in f32 (DIR/f32) and bf16
                           (DIR/bf16, logits computed by transformers in bf16, plus the f32
                           model's logits as `logits_f32`); the Rust GPU test reads it through
                           KEVIN_PARITY_DIR=DIR (--device cpu works too, slowly)
  --check-kevin DIR        DIR was written by kevin (`cargo run -p kevin-policy --example
                           qwen2_resave`): open it with from_pretrained, run its input_ids and
                           compare with the logits kevin wrote there

Weights are drawn with a fixed seed and larger than transformers' 0.02 initialisation (norm
scales around 1, nonzero biases), so that every weight moves the logits and a wrong transpose
or a swapped rotation cannot hide under the tolerance.
"""

import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen2Config, Qwen2ForCausalLM

TINY = dict(
    vocab_size=256,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    bos_token_id=1,
    eos_token_id=2,
)

LARGER = dict(
    vocab_size=2048,
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    bos_token_id=1,
    eos_token_id=2,
)


def build(params, tied, seed):
    """A Qwen2 model with seeded weights of a size that makes every parameter matter."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(**params, tie_word_embeddings=tied, attn_implementation="eager")
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn_like(p) / fan_in**0.5)
    return model


def token_ids(vocab, batch, seq, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g, dtype=torch.int64)


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=ids.to(model.device)).logits.float().cpu()


def write(model, ids, out, dtype):
    """Saves `model` in `dtype` to `out` with the logits transformers computes in that dtype.

    Below f32 it also stores `logits_f32`, the f32 model's logits, so that a test can tell how
    far this dtype's rounding alone moves the logits."""
    os.makedirs(out, exist_ok=True)
    tensors = {"input_ids": ids.contiguous()}
    if dtype != torch.float32:
        tensors["logits_f32"] = logits_of(model.float(), ids).contiguous()
    model = model.to(dtype)
    logits = logits_of(model, ids)
    tensors["logits"] = logits.contiguous()
    model.save_pretrained(out, safe_serialization=True)
    save_file(tensors, os.path.join(out, "expected.safetensors"))
    note = ""
    if "logits_f32" in tensors:
        note = f", max |{dtype} - f32| {(logits - tensors['logits_f32']).abs().max():.3e}"
    print(f"{out}: logits {tuple(logits.shape)}, max |logit| {logits.abs().max():.3f}{note}")


def fixture(out):
    ids = token_ids(TINY["vocab_size"], 2, 12, seed=1)
    for tied in (False, True):
        model = build(TINY, tied, seed=0)
        write(model, ids, os.path.join(out, "tied" if tied else "untied"), torch.float32)


def device_mode(device, out):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ids = token_ids(LARGER["vocab_size"], 3, 64, seed=1)
    model = build(LARGER, False, seed=0).to(device)
    write(model, ids, os.path.join(out, "f32"), torch.float32)
    write(model, ids, os.path.join(out, "bf16"), torch.bfloat16)


def check_kevin(path):
    """transformers opens kevin's checkpoint and reproduces the logits kevin computed."""
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    stored = config.get("dtype") or config.get("torch_dtype")
    # Computed in f32 either way: kevin computed its logits in f32 from the stored weights.
    model = Qwen2ForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    expected = load_file(os.path.join(path, "expected.safetensors"))
    got = logits_of(model, expected["input_ids"])
    diff = (got - expected["logits"]).abs().max().item()
    ok = diff <= 1e-4
    print(f"{path}: stored as {stored}, max |transformers - kevin| = {diff:.3e} ({'ok' if ok else 'FAIL'})")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixture", metavar="DIR")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", metavar="DIR")
    ap.add_argument("--check-kevin", metavar="DIR", nargs="+")
    args = ap.parse_args()
    if args.fixture:
        fixture(args.fixture)
    elif args.out:
        device_mode(args.device, args.out)
    elif args.check_kevin:
        sys.exit(0 if all([check_kevin(p) for p in args.check_kevin]) else 1)
    else:
        ap.error("one of --fixture, --out or --check-kevin is required")


if __name__ == "__main__":
    main()
