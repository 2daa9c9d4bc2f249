# Runs a TUI in a pty of COLSxROWS, types keys at times, saves the raw output.
import os, pty, sys, time, fcntl, termios, struct, select
cols, rows, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
keys = [(float(t), k) for t, k in (a.split(":", 1) for a in sys.argv[4].split(","))]
argv = sys.argv[5:]
pid, fd = pty.fork()
if pid == 0:
    os.environ["TERM"] = "xterm-256color"
    os.execv(argv[0], argv)
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
buf = bytearray(); t0 = time.time(); ki = 0
while True:
    now = time.time() - t0
    if ki < len(keys) and now >= keys[ki][0]:
        os.write(fd, keys[ki][1].encode()); ki += 1
    r, _, _ = select.select([fd], [], [], 0.05)
    if r:
        try:
            d = os.read(fd, 65536)
        except OSError:
            break
        if not d:
            break
        buf += d
    if ki == len(keys) and now > keys[-1][0] + 1.5:
        break
open(out, "wb").write(bytes(buf))
print("pty: %d bytes" % len(buf), "exit", os.waitpid(pid, 0))
