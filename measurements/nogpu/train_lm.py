"""A Hugging Face language model's training loop on random tokens, built
from its config (no download): the ground truth `fit --no-gpu` is measured
against on the H200 (docs/user/fit.md "Without a GPU")."""
import argparse

import torch

p = argparse.ArgumentParser()
p.add_argument("--model", default="gpt2", choices=["gpt2", "llama", "bert", "t5"])
p.add_argument("--batch-size", type=int, default=2)
p.add_argument("--seq", type=int, default=512)
p.add_argument("--amp", action="store_true", help="bf16 autocast")
p.add_argument("--optim", default="adamw", choices=["adamw", "adam", "sgd"])
p.add_argument("--steps", type=int, default=3)
p.add_argument("--limit-gib", type=float, default=0, help="set_per_process_memory_fraction to this many GiB")
a = p.parse_args()

import transformers as T  # noqa: E402

torch.manual_seed(0)
if a.limit_gib:
    torch.cuda.set_per_process_memory_fraction(a.limit_gib * 2**30 / torch.cuda.get_device_properties(0).total_memory)
if a.model == "gpt2":
    m = T.GPT2LMHeadModel(T.GPT2Config())
elif a.model == "llama":
    # Llama-family with grouped-query attention (4 key/value heads of 16).
    m = T.LlamaForCausalLM(T.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                         num_attention_heads=16, num_key_value_heads=4, vocab_size=32000))
elif a.model == "bert":
    m = T.BertForMaskedLM(T.BertConfig())
else:
    m = T.T5ForConditionalGeneration(T.T5Config(d_model=512, d_ff=2048, num_layers=6, num_heads=8,
                                                decoder_start_token_id=0, pad_token_id=0))
m.to("cuda").train()
V = m.config.vocab_size
if a.optim == "adamw":
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
elif a.optim == "adam":
    opt = torch.optim.Adam(m.parameters(), lr=1e-4)
else:
    opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
for step in range(a.steps):
    ids = torch.randint(1, V, (a.batch_size, a.seq)).to("cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.amp):
        loss = m(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    print("step", step, float(loss.item()), torch.cuda.max_memory_allocated(), flush=True)
