"""Checks the installed wheel (tools/check-wheel.sh runs this with the
fresh environment's python and its bin/ first on PATH): the command, `python
-m gpumem_top`, one version for both, a replay of a fixture, and the
package against the stand-in torch (tests/fake_torch) and trainers
(tests/fake_trainers): publish, step, snapshot, a snapshot at an OOM, and
both callbacks driven as their trainers drive them. Each scenario runs in a
process of its own (publishing is per process). Prints one line per check;
exits 1 at the first that fails."""

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STANDINS = os.pathsep.join([os.path.join(ROOT, "tests", "fake_torch"), os.path.join(ROOT, "tests", "fake_trainers")])


def check(cond, what):
    if not cond:
        print("FAIL", what)
        sys.exit(1)
    print("ok  ", what)


def run(*args, env=None):
    return subprocess.run(list(args), capture_output=True, text=True, env=env, timeout=120)


def published(directory):
    """The final files a process published, by device."""
    out = {}
    for f in sorted(os.listdir(directory)):
        if f.endswith(".json") and not f.startswith("."):
            with open(os.path.join(directory, f)) as fh:
                out[f] = json.load(fh)
    return out


def scenario(name, directory):
    """Runs in a child: the scenario `name`, publishing into `directory`."""
    import torch
    from torch.optim.optimizer import step as optimizer_step

    import gpumem_top

    if name == "api":
        assert gpumem_top.publish(interval=0.05, step_peaks=True) is True
        assert gpumem_top.publish() is True  # idempotent
        torch._C._alloc(3 << 20)
        assert gpumem_top.step() is True  # no optimizer: marked
        optimizer_step()  # the optimizer's own hook marks this one
        assert gpumem_top.step() is False
        assert gpumem_top.step() is True
        snap = os.path.join(directory, "now.pickle")
        assert gpumem_top.snapshot(snap) == snap
        with open(snap, "rb") as f:
            s = pickle.load(f)
        assert s["torch_version"] == torch.__version__, s
        # An existing file is refused, not overwritten.
        assert gpumem_top.snapshot(snap) is None
        with open(snap, "rb") as f:
            assert pickle.load(f) == s
        assert gpumem_top.snapshot(os.path.join(directory, "no", "such", "dir.pickle")) is None
        oom = os.path.join(directory, "oom-{n}.pickle")
        assert gpumem_top.snapshot_on_oom(oom) is True
        try:
            torch._C._oom(1 << 40)
            raise AssertionError("no OOM")
        except torch.OutOfMemoryError:
            pass
        assert os.path.exists(oom.format(n=1))
        time.sleep(0.2)
        gpumem_top.stop()
    elif name == "huggingface":
        import transformers

        from gpumem_top.integrations.huggingface import GpumemTopCallback

        end = os.path.join(directory, "end.pickle")
        cb = GpumemTopCallback(interval=0.05, history=1000, snapshot_at_end=end)
        assert torch._C._history.get("context", "unset") == "unset"
        transformers.Trainer(callbacks=[cb], steps=4, accumulation=2).train()
        # History as asked, with the stacks the release allows.
        assert torch._C._history.get("max_entries") == 1000, torch._C._history
        assert torch._C._history.get("stacks") == "python", torch._C._history
        assert os.path.exists(end)
        gpumem_top.stop()
    elif name == "lightning":
        import lightning.pytorch as pl

        from gpumem_top.integrations.lightning import GpumemTopCallback

        cb = GpumemTopCallback(interval=0.05, oom_snapshot=None)  # no history by default
        pl.Trainer(callbacks=[cb], batches=6, accumulate_grad_batches=3).fit()
        assert torch._C._history == {}, torch._C._history
        gpumem_top.stop()
    elif name == "no-trainers":
        for mod in ("huggingface", "lightning"):
            m = __import__("gpumem_top.integrations." + mod, fromlist=["GpumemTopCallback"])
            try:
                m.GpumemTopCallback()
                raise AssertionError(mod + " built without its trainer")
            except ImportError as e:
                print(e)


def child(name, standins=True):
    d = tempfile.mkdtemp(prefix="gpumem-top-wheel-")
    os.chmod(d, 0o700)
    env = dict(os.environ, GPUMEM_TOP_DIR=d, PYTHONPATH=STANDINS if standins else "")
    r = run(sys.executable, __file__, "--scenario", name, d, env=env)
    return r, d


def main():
    version = run("gpumem-top", "--version")
    check(version.returncode == 0 and version.stdout.startswith("gpumem-top "), "gpumem-top --version: " + version.stdout.strip())
    via_python = run(sys.executable, "-m", "gpumem_top", "--version")
    check(via_python.stdout == version.stdout, "python -m gpumem_top --version: " + via_python.stdout.strip())
    import gpumem_top

    check(version.stdout.split()[1] == gpumem_top.__version__, "gpumem_top.__version__ " + gpumem_top.__version__)
    fixture = os.path.join(ROOT, "tests", "fixtures", "diff", "base.pickle.gz")
    truth = json.load(open(os.path.join(ROOT, "tests", "fixtures", "diff", "base.truth.json")))
    rep = run("gpumem-top", "replay", fixture, "--json")
    peak = json.loads(rep.stdout)["peak"]["allocated_bytes"] if rep.returncode == 0 else None
    check(peak == truth["allocated_peak_bytes"], "replay of a fixture: peak allocated %s" % peak)
    bad = run("gpumem-top", "replay", "/no/such/file.pickle")
    check(bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, "a missing file: exit 2, one line")

    r, d = child("api")
    check(r.returncode == 0, "publish, step, snapshot, snapshot_on_oom: " + (r.stderr.strip() or "ran"))
    files = published(d)
    check(len(files) == 1, "one published file: %s" % sorted(files))
    f = next(iter(files.values()))
    log = f.get("step_log", [])
    check([s[0] for s in log] == [1, 2, 3], "steps marked: %s" % [s[0] for s in log])
    check(all(s[5] is not None for s in log), "each step's true peak allocated")
    check(oct(os.stat(d).st_mode & 0o777) == "0o700", "the directory stays private")

    r, d = child("huggingface")
    check(r.returncode == 0, "Hugging Face callback: " + (r.stderr.strip() or "ran"))
    log = next(iter(published(d).values())).get("step_log", [])
    check([s[0] for s in log] == [1, 2, 3, 4], "one step per optimizer step under accumulation: %s" % [s[0] for s in log])

    r, d = child("lightning")
    check(r.returncode == 0, "Lightning callback: " + (r.stderr.strip() or "ran"))
    log = next(iter(published(d).values())).get("step_log", [])
    check([s[0] for s in log] == [1, 2], "one step per optimizer step under accumulation: %s" % [s[0] for s in log])

    # Without the trainers (only the stand-in torch on the path).
    d = tempfile.mkdtemp(prefix="gpumem-top-wheel-")
    env = dict(os.environ, GPUMEM_TOP_DIR=d, PYTHONPATH=os.path.join(ROOT, "tests", "fake_torch"))
    r = run(sys.executable, __file__, "--scenario", "no-trainers", d, env=env)
    check(r.returncode == 0 and r.stdout.count("needs ") == 2, "callbacks without their trainers: " + r.stdout.strip().replace("\n", " | "))
    print("wheel ok")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--scenario":
        scenario(sys.argv[2], sys.argv[3])
    else:
        main()
