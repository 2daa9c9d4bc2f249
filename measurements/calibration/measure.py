"""Real PyTorch runs the synthetic workloads are calibrated against.

Run on a CUDA machine: `python3 measurements/calibration/measure.py OUTDIR [NAME...]`.
Each configuration runs in a fresh process (the allocator starts empty, as in
the shared traces), trains a few iterations the way the shared traces were
recorded (zero_grad(set_to_none) after step, foreach optimizers), and prints
one JSON line with torch.cuda.memory_stats()'s peaks. With SNAP=1 it also
dumps the memory snapshot to OUTDIR/NAME.pickle.

EXTRA adds what `synth` flags add (and two loops it does not model:
`hf_loss`, the loss computed by the model from `labels`; `weight_decay`,
Adam's L2 decay): `accum` K (K micro-batches per optimizer
step, each `loss / K` then backward, the loop's `out`/`loss` rebound by the
next micro-batch), `ckpt` (Hugging Face's `gradient_checkpointing_enable()`:
every layer checkpointed), and a Llama shape (`synth --layers --hidden
--heads --kv-heads --ffn --vocab`).
"""
import json, os, subprocess, sys

CONFIGS = {
    # name: (model, batch, seq, amp, optimizer)
    "resnet50_b64": ("resnet50", 64, 0, False, "sgd"),
    "resnet50_b32": ("resnet50", 32, 0, False, "sgd"),
    "resnet50_b128": ("resnet50", 128, 0, False, "sgd"),
    "resnet50_b64_amp": ("resnet50", 64, 0, True, "sgd"),
    "gpt2_b8": ("gpt2", 8, 1024, False, "adamw"),
    "gpt2_b4": ("gpt2", 4, 1024, False, "adamw"),
    "gpt2_b8_amp": ("gpt2", 8, 1024, True, "adamw"),
    "gpt2_b4_s512_amp": ("gpt2", 4, 512, True, "adamw"),
    "gpt2_b8_sgd": ("gpt2", 8, 1024, False, "sgd"),
    "bert_b16_s512": ("bert", 16, 512, False, "adamw"),
    "bert_b32_s128_amp": ("bert", 32, 128, True, "adamw"),
    "llama_b4_s1024": ("llama", 4, 1024, False, "adamw"),
    "llama_b4_s1024_amp": ("llama", 4, 1024, True, "adamw"),
    "mlp_b1024": ("mlp", 1024, 0, False, "adamw"),
    "resnet50_b64_inference": ("resnet50", 64, 0, False, "none"),
    "gpt2_b8_inference": ("gpt2", 8, 1024, False, "none"),
    # The second set (2026-12-01), configurations the first did not have.
    "resnet50_b24": ("resnet50", 24, 0, False, "sgd"),
    "resnet50_b48": ("resnet50", 48, 0, False, "sgd"),
    "resnet50_b96_amp": ("resnet50", 96, 0, True, "sgd"),
    "resnet50_b192_amp": ("resnet50", 192, 0, True, "sgd"),
    "gpt2_b2_s1024_amp_ckpt": ("gpt2", 2, 1024, True, "adamw"),
    "gpt2_b8_s512_ckpt": ("gpt2", 8, 512, False, "adamw"),
    "gpt2_b2_s1024_amp_accum4": ("gpt2", 2, 1024, True, "adamw"),
    "gpt2_b4_s512_accum2": ("gpt2", 4, 512, False, "adamw"),
    "bert_b8_s512_amp_accum2": ("bert", 8, 512, True, "adamw"),
    "mlp_b2048": ("mlp", 2048, 0, False, "adamw"),
    "mlp_b8192": ("mlp", 8192, 0, False, "adamw"),
    "llama_l4_h1024_b4_s1024_amp": ("llama", 4, 1024, True, "adamw"),
    # The nine (#20), to check against; not in the calibration table.
    "i_gpt2_b16_s256": ("gpt2", 16, 256, False, "adamw"),
    "i_gpt2_b4_s1024_amp_ckpt": ("gpt2", 4, 1024, True, "adamw"),
    "i_gpt2_b4_s1024_amp_accum4": ("gpt2", 4, 1024, True, "adamw"),
    "i_bert_b8_s512_amp": ("bert", 8, 512, True, "adamw"),
    "i_resnet50_b16": ("resnet50", 16, 0, False, "sgd"),
    "i_resnet50_b256_amp": ("resnet50", 256, 0, True, "sgd"),
    "i_llama_l8_b8_s512": ("llama", 8, 512, False, "adamw"),
    "i_gpt2_b32_s512_inference": ("gpt2", 32, 512, False, "none"),
    "i_mlp_b4096": ("mlp", 4096, 0, False, "adamw"),
    # Batches between those of cudnn_workspaces.py's table.
    "resnet50_b40": ("resnet50", 40, 0, False, "sgd"),
    "resnet50_b80_amp": ("resnet50", 80, 0, True, "sgd"),
    "resnet50_b160": ("resnet50", 160, 0, False, "sgd"),
    "resnet50_b320_amp": ("resnet50", 320, 0, True, "sgd"),
    "mlp_b3072": ("mlp", 3072, 0, False, "adamw"),
    "mlp_b12288": ("mlp", 12288, 0, False, "adamw"),
    # Field round 4 (#31 item 7): inference under AMP, Adam with accumulation.
    "bert_b64_s512_amp_inference": ("bert", 64, 512, True, "none"),
    "bert_b32_s256_amp_inference": ("bert", 32, 256, True, "none"),
    "bert_b64_s512_inference": ("bert", 64, 512, False, "none"),
    "gpt2_b4_s512_adam": ("gpt2", 4, 512, False, "adam"),
    "gpt2_b4_s512_adam_accum3": ("gpt2", 4, 512, False, "adam"),
    "gpt2_b2_s1024_adam_accum3": ("gpt2", 2, 1024, False, "adam"),
    "gpt2_b8_s512_adamw_accum3": ("gpt2", 8, 512, False, "adamw"),
    # Adam (not AdamW) under accumulation at short sequences (2026-12-02).
    "gpt2_b16_s128_adam_accum3": ("gpt2", 16, 128, False, "adam"),
    "gpt2_b32_s128_adam_accum3": ("gpt2", 32, 128, False, "adam"),
    "gpt2_b8_s256_adam_accum3": ("gpt2", 8, 256, False, "adam"),
    "gpt2_b16_s128_adam_accum2": ("gpt2", 16, 128, False, "adam"),
    "gpt2_b16_s128_adam": ("gpt2", 16, 128, False, "adam"),
    "gpt2_b16_s128_adamw_accum3": ("gpt2", 16, 128, False, "adamw"),
    "gpt2_b64_s64_adam_accum4": ("gpt2", 64, 64, False, "adam"),
    # The same under other loops: the loss computed by the model from
    # `labels` (Hugging Face's way), and Adam with L2 weight decay.
    "gpt2_b16_s128_adam_accum3_hfloss": ("gpt2", 16, 128, False, "adam"),
    "gpt2_b16_s128_adam_accum3_wd": ("gpt2", 16, 128, False, "adam"),
    "gpt2_b16_s128_adamw_accum3_hfloss": ("gpt2", 16, 128, False, "adamw"),
}

LLAMA_SMALL = dict(hidden_size=1024, intermediate_size=2816, num_attention_heads=16, num_key_value_heads=4,
                   vocab_size=32000)
EXTRA = {
    "gpt2_b2_s1024_amp_ckpt": {"ckpt": True},
    "gpt2_b8_s512_ckpt": {"ckpt": True},
    "gpt2_b2_s1024_amp_accum4": {"accum": 4},
    "gpt2_b4_s512_accum2": {"accum": 2},
    "bert_b8_s512_amp_accum2": {"accum": 2},
    "llama_l4_h1024_b4_s1024_amp": {"llama": dict(LLAMA_SMALL, num_hidden_layers=4)},
    "i_gpt2_b4_s1024_amp_ckpt": {"ckpt": True},
    "i_gpt2_b4_s1024_amp_accum4": {"accum": 4},
    "i_llama_l8_b8_s512": {"llama": dict(LLAMA_SMALL, num_hidden_layers=8)},
    "gpt2_b4_s512_adam_accum3": {"accum": 3},
    "gpt2_b2_s1024_adam_accum3": {"accum": 3},
    "gpt2_b8_s512_adamw_accum3": {"accum": 3},
    "gpt2_b16_s128_adam_accum3": {"accum": 3},
    "gpt2_b32_s128_adam_accum3": {"accum": 3},
    "gpt2_b8_s256_adam_accum3": {"accum": 3},
    "gpt2_b16_s128_adam_accum2": {"accum": 2},
    "gpt2_b16_s128_adamw_accum3": {"accum": 3},
    "gpt2_b64_s64_adam_accum4": {"accum": 4},
    "gpt2_b16_s128_adam_accum3_hfloss": {"accum": 3, "hf_loss": True},
    "gpt2_b16_s128_adam_accum3_wd": {"accum": 3, "weight_decay": 0.01},
    "gpt2_b16_s128_adamw_accum3_hfloss": {"accum": 3, "hf_loss": True},
}


def child(name):
    import torch
    import torch.nn.functional as F

    model_name, batch, seq, amp, optim = CONFIGS[name]
    extra = EXTRA.get(name, {})
    accum = extra.get("accum", 1)
    torch.manual_seed(0)
    dev = "cuda"
    if os.environ.get("SNAP"):
        # SNAP=bare: no stacks (recording Python stacks fails under
        # reentrant checkpointing: "run_backward returned NULL").
        if os.environ["SNAP"] == "bare":
            torch.cuda.memory._record_memory_history(context=None, max_entries=2_000_000)
        else:
            torch.cuda.memory._record_memory_history(stacks="python", max_entries=2_000_000)
    if model_name == "resnet50":
        import torchvision

        model = torchvision.models.resnet50().to(dev)
        mb = lambda: (torch.randn(batch, 3, 224, 224, device=dev), torch.randint(0, 1000, (batch,), device=dev))
        lf = lambda out, y: F.cross_entropy(out, y)
    elif model_name == "mlp":
        model = torch.nn.Sequential(
            torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
            torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
            torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
            torch.nn.Linear(4096, 1000)).to(dev)
        mb = lambda: (torch.randn(batch, 1024, device=dev), torch.randint(0, 1000, (batch,), device=dev))
        lf = lambda out, y: F.cross_entropy(out, y)
    else:
        import transformers as T

        if model_name == "gpt2":
            cfg = T.GPT2Config()
            model = T.GPT2LMHeadModel(cfg)
        elif model_name == "bert":
            cfg = T.BertConfig()
            model = T.BertForMaskedLM(cfg)
        else:
            shape = extra.get("llama") or dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                                num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)
            cfg = T.LlamaConfig(tie_word_embeddings=True, max_position_embeddings=4096, **shape)
            model = T.LlamaForCausalLM(cfg)
        model = model.to(dev)
        if extra.get("ckpt"):
            model.gradient_checkpointing_enable()
        V = cfg.vocab_size

        def mb():
            x = torch.randint(0, V, (batch, seq), device=dev)
            return x, x

        def lf(out, y):
            return F.cross_entropy(out.logits.view(-1, V), y.view(-1))

    if optim == "none":
        model.eval()
        with torch.no_grad():
            for _ in range(3):
                x, y = mb()
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                    out = model(x)
                del out, x, y
    else:
        model.train()
        if optim == "sgd":
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        elif optim == "adam":
            opt = torch.optim.Adam(model.parameters(), lr=1e-4, weight_decay=extra.get("weight_decay", 0))
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for _ in range(3):
            for _ in range(accum):
                x, y = mb()
                # As the shared traces' loop: the output stays referenced
                # through backward (`out = model(x); loss = lf(out, y)`),
                # and until the next micro-batch rebinds it.
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                    if extra.get("hf_loss"):
                        out = model(input_ids=x, labels=y)
                        loss = out.loss
                    else:
                        out = model(x)
                        loss = lf(out, y)
                    if accum > 1:
                        loss = loss / accum
                loss.backward()
            opt.step()
            opt.zero_grad()
            del loss, out, x, y
    torch.cuda.synchronize()
    s = torch.cuda.memory_stats()
    keep = ["allocated_bytes.all.peak", "reserved_bytes.all.peak", "requested_bytes.all.peak",
            "num_device_alloc", "allocation.all.peak", "allocated_bytes.all.current"]
    print(json.dumps({"name": name, "config": CONFIGS[name], **({"extra": extra} if extra else {}),
                      **{k: s.get(k) for k in keep}}), flush=True)
    if os.environ.get("SNAP"):
        torch.cuda.memory._dump_snapshot(os.path.join(sys.argv[2], name + ".pickle"))


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(sys.argv[3])
        sys.exit(0)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    names = sys.argv[2:] or list(CONFIGS)
    for n in names:
        r = subprocess.run([sys.executable, __file__, "--child", out, n], capture_output=True, text=True)
        line = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else json.dumps({"name": n, "error": r.stderr[-800:]})
        print(line, flush=True)
        with open(os.path.join(out, "results.jsonl"), "a") as f:
            f.write(line + "\n")
