"""gpumem-top's own cost without a GPU: the live TUI in a 200x50 pty, beside a
process that publishes recorded training states every 0.5 s, over a stand-in
NVML (fake_nvml.c: one H200 listing that process). The GPU machine's figures
come from monitor_cost.py; this one is for trying changes here first.

    python3 measurements/live/local_cost.py [--seconds S] [--callgrind OUT] BINARY [BINARY_B ...]

Prints one JSON line per binary (run one after the other, same publisher):
CPU share of one core by thread, VmRSS, resident kB by mapping. With
--callgrind OUT the first binary runs under valgrind's callgrind instead
(to see where a frame spends its instructions) and nothing is measured.
Needs cc and python3; --callgrind needs valgrind.
"""
import argparse, fcntl, json, os, select, signal, struct, subprocess, sys, tempfile, termios, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from monitor_cost import cpu_seconds, mem, per_thread, rss_by_mapping, spawn_pty, threads  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def publisher(work, binary):
    """Records the demo's training loop with BINARY, then replays its
    published states from a child process as gpumem_top_publish would."""
    rec = os.path.join(work, "demo.jsonl")
    subprocess.run([binary, "record", "--source", "demo", "--interval", "100", "--count", "60", "-o", rec],
                   check=True, stdout=subprocess.DEVNULL)
    pub = os.path.join(work, "pub")
    return subprocess.Popen([sys.executable, os.path.join(HERE, "fake_publisher.py"), rec, pub]), pub


def faults(pid):
    """Minor page faults per thread name."""
    return per_thread(pid, lambda _, f: int(f[7]))


def drain(fd, seconds):
    t0 = time.time()
    while time.time() - t0 < seconds:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                os.read(fd, 65536)
            except OSError:
                return


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--callgrind")
    ap.add_argument("binaries", nargs="+")
    a = ap.parse_args()
    binaries = [os.path.abspath(b) for b in a.binaries]
    with tempfile.TemporaryDirectory() as work:
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", os.path.join(work, "libnvidia-ml.so.1"),
                        os.path.join(HERE, "fake_nvml.c")], check=True)
        pub, pubdir = publisher(work, binaries[0])
        os.environ["FAKE_NVML_PID"] = str(pub.pid)
        os.environ["LD_LIBRARY_PATH"] = work
        try:
            time.sleep(1)
            if a.callgrind:
                argv = ["valgrind", "-q", "--tool=callgrind", "--dump-instr=no", "--compress-strings=no",
                        "--compress-pos=no", "--demangle=no", "--callgrind-out-file=" + os.path.abspath(a.callgrind),
                        binaries[0], "--interval", "500", "--publish-dir", pubdir]
                pid, fd = spawn_pty(argv)
                drain(fd, a.seconds / 2)
                # A resize halfway, so that its path is in the profile too.
                fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 45, 160, 0, 0))
                os.kill(pid, signal.SIGWINCH)
                drain(fd, a.seconds / 2)
                os.write(fd, b"q")  # a clean exit: callgrind writes its file then
                drain(fd, 10)
                os.waitpid(pid, 0)
                return
            for b in binaries:
                pid, fd = spawn_pty([b, "--interval", "500", "--publish-dir", pubdir])
                drain(fd, 5)  # start-up is not the steady cost
                c0, t0s, f0, w0 = cpu_seconds(pid), threads(pid), faults(pid), time.time()
                drain(fd, a.seconds)
                wall = time.time() - w0
                used = cpu_seconds(pid) - c0
                print(json.dumps({"binary": b, "seconds": round(wall, 1), "core_percent": round(100 * used / wall, 3),
                                  "threads_cpu_seconds": {t: round(v - t0s.get(t, 0.0), 4)
                                                          for t, v in threads(pid).items()},
                                  "minor_faults": {t: v - f0.get(t, 0) for t, v in faults(pid).items()},
                                  **mem(pid), "rss_kb_by_mapping": rss_by_mapping(pid, top=10)}), flush=True)
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
        finally:
            pub.kill()


if __name__ == "__main__":
    main()
