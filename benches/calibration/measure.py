"""Real PyTorch runs the synthetic workloads are calibrated against.

Run on a CUDA machine: `python3 benches/calibration/measure.py OUTDIR [NAME...]`.
Each configuration runs in a fresh process (the allocator starts empty, as in
the shared traces), trains a few iterations the way the shared traces were
recorded (zero_grad(set_to_none) after step, foreach optimizers), and prints
one JSON line with torch.cuda.memory_stats()'s peaks. With SNAP=1 it also
dumps the memory snapshot to OUTDIR/NAME.pickle.
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
}


def child(name):
    import torch
    import torch.nn.functional as F

    model_name, batch, seq, amp, optim = CONFIGS[name]
    torch.manual_seed(0)
    dev = "cuda"
    if os.environ.get("SNAP"):
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
            cfg = T.LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                tie_word_embeddings=True, max_position_embeddings=4096)
            model = T.LlamaForCausalLM(cfg)
        model = model.to(dev)
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
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for _ in range(3):
            x, y = mb()
            # As the shared traces' loop: the output stays referenced
            # through backward (`out = model(x); loss = lf(out, y)`).
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                out = model(x)
                loss = lf(out, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            del loss, out, x, y
    torch.cuda.synchronize()
    s = torch.cuda.memory_stats()
    keep = ["allocated_bytes.all.peak", "reserved_bytes.all.peak", "requested_bytes.all.peak",
            "num_device_alloc", "allocation.all.peak", "allocated_bytes.all.current"]
    print(json.dumps({"name": name, "config": CONFIGS[name], **{k: s.get(k) for k in keep}}), flush=True)
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
