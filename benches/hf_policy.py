#!/usr/bin/env python3
"""The Hugging Face peer of `kevin bench policy` (issue 7): the same Qwen2 shape, random init,
timed with transformers on the same GPU in the same device call.

- generation: `generate` with sampling (temperature 0.9), a KV cache, 256 prompt tokens and
  exactly 256 new tokens per sequence (EOS suppressed), batch 1 and 64; tokens/s counts new tokens;
- learner: forward + backward + AdamW step on 8 x 1024 tokens (causal LM loss), tokens/s over the
  median step, and the learner's peak GPU memory (torch's allocator: allocated and reserved).
  By default the learner is pure bf16 (weights and AdamW state); with --mixed it is PyTorch's
  mixed precision: f32 weights and AdamW state, the forward and backward under
  torch.autocast(bfloat16), which is what kevin's bf16 learner keeps (f32 masters and moments).

Prints one JSON object (and writes it with --json FILE). Shapes (--shape, as `kevin bench policy
--shape` names them): qwen2-0.5b (the default: hidden 896, 24 layers, 14 heads, 2 KV heads,
intermediate 4864, vocab 151936) and qwen2.5-1.5b (Qwen2.5-1.5B's config.json: hidden 1536, 28
layers, 12 heads, 2 KV heads, intermediate 8960), bf16 by default.
"""
import argparse
import json
import statistics
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


SHAPES = {
    "qwen2-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2),
}


def qwen2_config(shape, vocab):
    return Qwen2Config(
        vocab_size=vocab, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, **SHAPES[shape],
    )


def sync():
    torch.cuda.synchronize()


def gen_tokens_per_s(model, batch, prompt, new, vocab, reps):
    ids = torch.randint(0, vocab, (batch, prompt), device="cuda")
    mask = torch.ones_like(ids)
    kwargs = dict(do_sample=True, temperature=0.9, top_p=1.0, top_k=0, max_new_tokens=new,
                  min_new_tokens=new, attention_mask=mask, pad_token_id=0)
    model.generate(ids[:, :16], **{**kwargs, "max_new_tokens": 8, "min_new_tokens": 8,
                                    "attention_mask": mask[:, :16]})
    times = []
    for _ in range(reps):
        sync(); t = time.perf_counter()
        out = model.generate(ids, **kwargs)
        sync(); times.append(time.perf_counter() - t)
        assert out.shape[1] == prompt + new, out.shape
    return batch * new / statistics.median(times), statistics.median(times)


def learner_tokens_per_s(model, batch, seq, vocab, steps, mixed):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, vocab, (batch, seq), device="cuda")
    times = []
    for i in range(steps + 2):
        sync(); t = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mixed):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step(); opt.zero_grad(set_to_none=True)
        sync()
        if i >= 2:
            times.append(time.perf_counter() - t)
    return batch * seq / statistics.median(times), statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen2-0.5b", choices=sorted(SHAPES))
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--train-batch", type=int, default=8)
    ap.add_argument("--train-seq", type=int, default=1024)
    ap.add_argument("--train-steps", type=int, default=5)
    ap.add_argument("--mixed", action="store_true",
                    help="learner in f32 weights and AdamW state under bf16 autocast")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.manual_seed(0)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    cfg = qwen2_config(a.shape, a.vocab)
    model = Qwen2ForCausalLM(cfg).to("cuda", dtype=dtype).eval()
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "dtype": a.dtype,
           "shape": a.shape,
           "params": sum(p.numel() for p in model.parameters()), "generate": {}}
    with torch.no_grad():
        for b in [int(x) for x in a.batches.split(",")]:
            tps, sec = gen_tokens_per_s(model, b, a.prompt, a.new, a.vocab, a.reps)
            res["generate"][f"bs{b}"] = {"tokens_per_s": tps, "seconds": sec}
            print(f"hf generate bs{b}: {tps:.0f} tok/s ({sec:.2f} s)", flush=True)
    model.train()
    if a.mixed:
        model = model.float()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    tps, sec = learner_tokens_per_s(model, a.train_batch, a.train_seq, a.vocab, a.train_steps,
                                    a.mixed)
    gib = 2.0 ** 30
    res["learner"] = {"tokens_per_s": tps, "step_seconds": sec,
                      "precision": "mixed (f32 weights and state, bf16 autocast)" if a.mixed
                      else a.dtype,
                      "tokens": a.train_batch * a.train_seq,
                      "peak_allocated_gib": torch.cuda.max_memory_allocated() / gib,
                      "peak_reserved_gib": torch.cuda.max_memory_reserved() / gib}
    print(f"hf learner {a.train_batch}x{a.train_seq} ({res['learner']['precision']}): {tps:.0f} tok/s ({sec * 1e3:.0f} ms/step), "
          f"peak {res['learner']['peak_reserved_gib']:.1f} GiB reserved "
          f"({res['learner']['peak_allocated_gib']:.1f} GiB allocated)")
    print(json.dumps(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
