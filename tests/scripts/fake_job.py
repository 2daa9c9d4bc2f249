"""A distributed job over the stand-in torch (tests/fake_torch), launched
as torchrun launches one: this launcher starts WORLD ranks of itself with
RANK, LOCAL_RANK, WORLD_SIZE and TORCHELASTIC_RUN_ID set. Rank r's step
peak is (r + 1) x 100 MiB; the last rank dies (os._exit, as a crashed rank
does) after the others were asked for a snapshot of the whole job through
`gpumem-top snapshot PID --job`, and the others go on for a second more. Prints one JSON line: what each rank's
torch.cuda.max_memory_allocated() said, the exit codes, and the snapshot
command's output."""

import json
import os
import subprocess
import sys
import time

MIB = 1 << 20
WORLD = int(os.environ.get("FAKE_WORLD", "3"))


def rank_main(rank):
    import torch
    import torch.optim.optimizer as opt

    torch.cuda.init()
    torch._C._alloc(10 * MIB)  # the "model", kept
    dying = rank == WORLD - 1
    out = os.environ["JOB_OUT"]
    last = os.path.join(out, "rank%d.json" % (WORLD - 1))
    t0 = time.time()

    asked = os.path.join(out, "snapshot.done")

    def done():
        if dying:
            # After the job's snapshot was answered (or given up on).
            return (os.path.exists(asked) and time.time() > t0 + 1.6) or time.time() > t0 + 30
        # The others outlive the dying rank by a second, however late it
        # started (a loaded machine): samples see it gone, them not.
        return (os.path.exists(last) and time.time() > os.path.getmtime(last) + 1.0) or time.time() > t0 + 30

    while not done():
        torch._C._alloc((rank + 1) * 100 * MIB)
        torch._C._free((rank + 1) * 100 * MIB)
        opt.step()
        time.sleep(0.05)
    peak = torch.cuda.max_memory_allocated()
    tmp = os.path.join(out, ".rank%d.json" % rank)
    with open(tmp, "w") as f:
        json.dump({"rank": rank, "max_memory_allocated": peak, "pid": os.getpid()}, f)
    os.replace(tmp, os.path.join(out, "rank%d.json" % rank))
    if dying:
        os._exit(7)  # no atexit, no final file: as a rank that crashes


def launcher():
    out_dir = os.environ["JOB_OUT"]
    procs = []
    for r in range(WORLD):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(WORLD), TORCHELASTIC_RUN_ID="fakejob42")
        procs.append(subprocess.Popen([sys.executable, "-u", __file__, "--rank", str(r)], env=env))
    # Once every rank publishes, one request for the whole job.
    d = os.environ["GPUMEM_TOP_DIR"]
    deadline = time.time() + 10
    while time.time() < deadline:
        names = [f for f in os.listdir(d) if f.endswith("-0.json") and not f.startswith(".")]
        if len(names) >= WORLD:
            break
        time.sleep(0.05)
    r = subprocess.run(
        [os.environ["GPUMEM_TOP_BIN"], "snapshot", str(procs[0].pid), "--job", "-o",
         os.path.join(out_dir, "job"), "--publish-dir", d, "--timeout", "10"],
        capture_output=True,
        text=True,
    )
    open(os.path.join(out_dir, "snapshot.done"), "w").close()
    codes = [p.wait() for p in procs]
    ranks = []
    for k in range(WORLD):
        with open(os.path.join(out_dir, "rank%d.json" % k)) as f:
            ranks.append(json.load(f))
    print(json.dumps({"codes": codes, "ranks": ranks, "snapshot_rc": r.returncode,
                      "snapshot_out": r.stdout, "snapshot_err": r.stderr}))


if __name__ == "__main__":
    if "--rank" in sys.argv:
        rank_main(int(sys.argv[sys.argv.index("--rank") + 1]))
    else:
        launcher()
