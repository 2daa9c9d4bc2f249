"""CPU and memory of GPU monitors over 60 s, each drawing in its own
pseudo-terminal, beside a GPT-2 training process that publishes its state.

    python3 measurements/live/monitor_cost.py GPUMEM_TOP_BINARY [SECONDS] [NVML_LOOP_BINARY]

Prints one JSON line per monitor: CPU seconds used, share of one core,
peak RSS (VmHWM) and RSS at the end. nvitop runs where it imports.
"""
import fcntl, json, os, pty, select, signal, struct, subprocess, sys, termios, time

HZ = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """CPU time of all its threads, in ns from schedstat (the utime and
    stime of /proc/PID/stat count 10 ms ticks: 0.017% of a core over 60 s)."""
    return sum(threads(pid).values())


def tick_seconds(pid):
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / HZ  # utime + stime


def per_thread(pid, value):
    """value(task directory, the fields of its stat after the name) summed
    per thread name; threads that end meanwhile are left out."""
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        task = "/proc/%d/task/%s" % (pid, tid)
        try:
            stat = open(task + "/stat").read()
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            v = value(task, stat.rsplit(")", 1)[1].split())
        except (OSError, ValueError):
            continue
        out[name] = out.get(name, 0) + v
    return out


def threads(pid):
    """CPU seconds per thread name (summed over threads of one name), from
    each thread's schedstat."""
    return per_thread(pid, lambda task, _: int(open(task + "/schedstat").read().split()[0]) / 1e9)


def mem(pid):
    out = {}
    for line in open("/proc/%d/status" % pid):
        k, _, v = line.partition(":")
        if k in ("VmHWM", "VmRSS"):
            out[k] = int(v.split()[0]) * 1024
    return out


def rss_by_mapping(pid, top=8):
    """Resident kB per mapped file (or [heap], anonymous, ...) and permissions."""
    out, key = {}, None
    try:
        for line in open("/proc/%d/smaps" % pid):
            f = line.split()
            if "-" in f[0] and len(f) >= 5 and not f[0].endswith(":"):
                key = "%s %s" % (os.path.basename(f[5]) if len(f) > 5 else "[anon]", f[1])
            elif f[0] == "Rss:":
                out[key] = out.get(key, 0) + int(f[1])
    except OSError:
        return {}
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:top])


def spawn_pty(argv, cols=200, rows=50):
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["TERM"] = "xterm-256color"
        os.execvp(argv[0], argv)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    os.kill(pid, signal.SIGWINCH)
    return pid, fd


class PublisherFiles:
    """What the training process publishes, looked at every 0.5 s as a
    monitor would: the file's size and how often its layout is a new one
    (a monitor parses a layout only when it changed)."""

    def __init__(self):
        x = os.environ.get("XDG_RUNTIME_DIR")
        self.dir = os.environ.get("GPUMEM_TOP_DIR") or (os.path.join(x, "gpumem-top") if x
                                                         else "/tmp/gpumem-top-%d" % os.getuid())
        self.looks, self.sizes, self.new_layouts, self.blocks, self.last = 0, [], 0, [], {}

    def look(self):
        for name in os.listdir(self.dir) if os.path.isdir(self.dir) else []:
            if not name.endswith(".json") or name.startswith("."):
                continue
            try:
                data = open(os.path.join(self.dir, name), "rb").read()
                doc = json.loads(data)
            except (OSError, ValueError):
                continue
            self.looks += 1
            self.sizes.append(len(data))
            key = json.dumps(doc.get("segments"))
            if self.last.get(name) != key:
                self.new_layouts += 1
                self.last[name] = key
            self.blocks.append(sum(len(s.get("blocks", [])) for s in doc.get("segments") or []))

    def summary(self):
        n = max(self.looks, 1)
        return {"publisher_files": {"looks": self.looks, "new_layouts": self.new_layouts,
                                    "mean_bytes": sum(self.sizes) // n, "mean_blocks": sum(self.blocks) // n}}


def main():
    binary = os.path.abspath(sys.argv[1])
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    here = os.path.dirname(os.path.abspath(__file__))
    load = subprocess.Popen([sys.executable, os.path.join(here, "gpu_load.py"), "run", str(seconds + 25)],
                            stdout=subprocess.PIPE, text=True)
    assert load.stdout.readline().strip() == "training"
    time.sleep(3)
    monitors = {
        "gpumem-top (TUI, --interval 500)": [binary, "--interval", "500"],
        "nvitop 1.7.2 (--interval 0.5)": [sys.executable, "-m", "nvitop", "--interval", "0.5"],
        # Diagnostics: the same TUI without NVML, and NVML without a publisher.
        "gpumem-top --source demo (no NVML)": [binary, "--source", "demo"],
        "gpumem-top, no publisher": [binary, "--publish-dir", "/tmp/gpumem-top-empty"],
    }
    # Other builds to compare in the same run (e.g. the previous commit's):
    # GPUMEM_TOP_B=path[:path...].
    for other in filter(None, os.environ.get("GPUMEM_TOP_B", "").split(":")):
        monitors["gpumem-top B: " + other] = [os.path.abspath(other), "--interval", "500"]
    os.makedirs("/tmp/gpumem-top-empty", mode=0o700, exist_ok=True)
    procs = {}
    for name, argv in monitors.items():
        procs[name] = spawn_pty(argv)
    smi = subprocess.Popen(["nvidia-smi", "--loop-ms=500"], stdout=subprocess.DEVNULL)
    bare = None
    if len(sys.argv) > 3:
        bare = subprocess.Popen([sys.argv[3], str(int(seconds + 30))], stdout=subprocess.DEVNULL)
    time.sleep(5)  # start-up (imports, NVML init) is not the steady cost
    pids = {name: p for name, (p, _) in procs.items()}
    pids["nvidia-smi --loop-ms=500"] = smi.pid
    if bare:
        pids["bare Rust loop: NVML memory, utilization, processes every 500 ms"] = bare.pid
    start = {n: cpu_seconds(p) for n, p in pids.items() if os.path.exists("/proc/%d" % p)}
    start_ticks = {n: tick_seconds(p) for n, p in pids.items() if os.path.exists("/proc/%d" % p)}
    start_threads = {n: threads(p) for n, p in pids.items() if os.path.exists("/proc/%d" % p)}
    t0 = time.time()
    fds = [fd for _, fd in procs.values()]
    files = PublisherFiles()
    next_look = t0
    while time.time() - t0 < seconds:
        r, _, _ = select.select(fds, [], [], 0.2)
        for fd in r:
            try:
                os.read(fd, 65536)
            except OSError:
                fds.remove(fd)
        if time.time() >= next_look:
            files.look()
            next_look += 0.5
    wall = time.time() - t0
    print(json.dumps(files.summary()), flush=True)
    for n, p in pids.items():
        if n not in start or not os.path.exists("/proc/%d" % p):
            print(json.dumps({"monitor": n, "error": "not running"}))
            continue
        used = cpu_seconds(p) - start[n]
        per = {t: round(v - start_threads[n].get(t, 0.0), 4) for t, v in threads(p).items()}
        ticks = tick_seconds(p) - start_ticks[n]
        print(json.dumps({"monitor": n, "seconds": round(wall, 1), "cpu_seconds": round(used, 4),
                          "core_percent": round(100 * used / wall, 3),
                          "core_percent_from_ticks": round(100 * ticks / wall, 3), **mem(p),
                          "threads_cpu_seconds": {t: v for t, v in per.items() if v > 0},
                          "rss_kb_by_mapping": rss_by_mapping(p, top=12)}), flush=True)
    for n, p in pids.items():
        try:
            os.kill(p, signal.SIGTERM)
        except OSError:
            pass
    load.wait()


if __name__ == "__main__":
    main()
