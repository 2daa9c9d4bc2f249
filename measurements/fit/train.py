"""A small training script for `gpumem-top fit --batches … -- python3
measurements/fit/train.py --model M --batch-size {batch}`: a few steps of a real
model on the GPU (no download: random weights), as users' scripts run.

    --model resnet50   torchvision ResNet-50, 224x224, bf16 autocast, SGD momentum
    --model gpt2       Hugging Face GPT2LMHeadModel (default config), seq 512, fp32, AdamW
    --model bert       Hugging Face BertForMaskedLM (default config), seq 512, fp32, AdamW

    --checkpoint       (gpt2, bert) gradient_checkpointing_enable(), non-reentrant
    --reset-peaks      (gpt2, bert) print max_memory_allocated() per step and reset
                       the peaks, as per-step logging does
    --model efficientnet  torchvision EfficientNet-B0, 224x224, fp16 autocast + GradScaler, AdamW
    --model vit        torchvision ViT-B/16, 224x224, bf16 autocast, AdamW
    --model resnet18   torchvision ResNet-18, 224x224, fp32, SGD momentum
    --model swin_t     torchvision Swin-T (windowed attention), 224x224, bf16 autocast, AdamW
    --model convnext_t torchvision ConvNeXt-Tiny (depthwise 7x7), 224x224, bf16 autocast, AdamW
    --model mobilenet  torchvision MobileNetV3-Large, 224x224, bf16 autocast, SGD momentum
    --model densenet   torchvision DenseNet-121, 224x224, fp32, AdamW

    --dtype fp32|fp16|bf16, --optim sgd|adamw|adam  (vision models) override
                       the model's precision (fp16 with GradScaler) and optimizer
    --cudnn-benchmark  torch.backends.cudnn.benchmark = True, as many vision
                       training scripts set it
"""

import argparse

import torch

p = argparse.ArgumentParser()
p.add_argument("--model", default="resnet50")
p.add_argument("--batch-size", type=int, required=True)
p.add_argument("--steps", type=int, default=3)
p.add_argument("--checkpoint", action="store_true",
               help="Hugging Face models: gradient_checkpointing_enable() (non-reentrant, the default)")
p.add_argument("--reset-peaks", action="store_true",
               help="log max_memory_allocated() per step and reset the peaks, as per-step logging does")
p.add_argument("--snapshot", help="record memory history (stacks at allocations) and dump a snapshot here at the end")
p.add_argument("--memory-limit", type=int,
               help="bytes: set_per_process_memory_fraction to this; an OOM prints 'fits no' (else 'fits yes')")
p.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], help="vision models: precision instead of the model's own")
p.add_argument("--optim", choices=["sgd", "adamw", "adam"], help="vision models: optimizer instead of the model's own")
p.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")
a = p.parse_args()
dev = "cuda"
torch.backends.cudnn.benchmark = a.cudnn_benchmark
if a.memory_limit:
    torch.cuda.set_per_process_memory_fraction(a.memory_limit / torch.cuda.get_device_properties(0).total_memory)
if a.memory_limit:
    import sys

    def _oom(kind, value, tb):
        if isinstance(value, torch.OutOfMemoryError):
            print("fits no", a.model, a.batch_size, flush=True)
            sys.exit(0)
        sys.__excepthook__(kind, value, tb)

    sys.excepthook = _oom
if a.snapshot:
    torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=2_000_000)

if a.model == "resnet50":
    import torchvision

    model = torchvision.models.resnet50().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(a.steps):
        x = torch.randn(a.batch_size, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (a.batch_size,), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
elif a.model in ("efficientnet", "vit", "resnet18", "swin_t", "convnext_t", "mobilenet", "densenet"):
    import torchvision

    ctor = {"efficientnet": torchvision.models.efficientnet_b0, "vit": torchvision.models.vit_b_16,
            "resnet18": torchvision.models.resnet18, "swin_t": torchvision.models.swin_t,
            "convnext_t": torchvision.models.convnext_tiny, "mobilenet": torchvision.models.mobilenet_v3_large,
            "densenet": torchvision.models.densenet121}[a.model]
    model = ctor().to(dev)
    optim = a.optim or ("sgd" if a.model in ("resnet18", "mobilenet") else "adamw")
    opt = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
           "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-4),
           "adam": lambda ps: torch.optim.Adam(ps, lr=1e-4)}[optim](model.parameters())
    dtype = {"efficientnet": torch.float16, "vit": torch.bfloat16, "swin_t": torch.bfloat16,
             "convnext_t": torch.bfloat16, "mobilenet": torch.bfloat16}.get(a.model)
    if a.dtype:
        dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(a.steps):
        x = torch.randn(a.batch_size, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (a.batch_size,), device=dev)
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
elif a.model in ("gpt2", "bert"):
    import transformers

    if a.model == "gpt2":
        model, vocab = transformers.GPT2LMHeadModel(transformers.GPT2Config()), 50257
    else:
        model, vocab = transformers.BertForMaskedLM(transformers.BertConfig()), 30522
    model = model.to(dev)
    if a.checkpoint:
        model.gradient_checkpointing_enable()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(a.steps):
        ids = torch.randint(0, vocab, (a.batch_size, 512), device=dev)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if a.reset_peaks:
            print("step", step + 1, "max_memory_allocated", torch.cuda.max_memory_allocated(),
                  "max_memory_reserved", torch.cuda.max_memory_reserved(), flush=True)
            torch.cuda.reset_peak_memory_stats()
else:
    raise SystemExit("unknown model " + a.model)
torch.cuda.synchronize()
if a.snapshot:
    torch.cuda.memory._dump_snapshot(a.snapshot)
s = torch.cuda.memory_stats()
print("peaks", a.model, a.batch_size, s["allocated_bytes.all.peak"], s["reserved_bytes.all.peak"], flush=True)
if a.memory_limit:
    print("fits yes", a.model, a.batch_size, flush=True)
