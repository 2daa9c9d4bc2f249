"""A GPT-2 small training loop on the GPU (the shared traces' workload).

    python3 gpu_load.py cost              # publisher overhead: step times with and without it
    python3 gpu_load.py run SECONDS       # train for SECONDS with the publisher on (monitor-cost runs)

Needs torch and transformers, and assets/python on PYTHONPATH.
"""
import json, statistics, sys, time

import torch
import torch.nn.functional as F
import transformers as T

import gpumem_top_publish as pub


def setup(batch=8, seq=1024):
    torch.manual_seed(0)
    cfg = T.GPT2Config()
    model = T.GPT2LMHeadModel(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")

    def step():
        out = model(x)
        loss = F.cross_entropy(out.logits.view(-1, cfg.vocab_size), x.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()

    return step


def timed(step, n):
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t)
    return ts


def cost():
    step = setup()
    for _ in range(5):
        step()
    off, on = [], []
    # Alternate blocks so drift in clocks or temperature hits both alike.
    for block in range(6):
        if block % 2 == 0:
            pub.stop_publishing()
            off += timed(step, 40)
        else:
            pub.start(interval=0.5)
            on += timed(step, 40)
    pub.stop_publishing()
    m_off, m_on = statistics.median(off), statistics.median(on)
    mean_off, mean_on = statistics.fmean(off), statistics.fmean(on)
    print(json.dumps({
        "steps_each": len(off),
        "median_step_ms_without": round(m_off * 1e3, 3), "median_step_ms_with": round(m_on * 1e3, 3),
        "mean_step_ms_without": round(mean_off * 1e3, 3), "mean_step_ms_with": round(mean_on * 1e3, 3),
        "overhead_percent_median": round((m_on / m_off - 1) * 100, 3),
        "overhead_percent_mean": round((mean_on / mean_off - 1) * 100, 3),
        "publish_interval_s": 0.5,
    }), flush=True)


def run(seconds):
    step = setup()
    pub.start(interval=0.5)
    print("training", flush=True)
    end = time.time() + seconds
    n = 0
    while time.time() < end:
        step()
        n += 1
    print(json.dumps({"steps": n}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "cost":
        cost()
    else:
        run(float(sys.argv[2]))
