#!/usr/bin/env python3
"""How long the replay screen takes to draw its first frame on a big
snapshot: `gpumem-top replay TRACE` under a pseudo-terminal of 200x60,
timed from the start to the first 2,000 bytes drawn on the alternate
screen; then `q`, and whether the terminal was restored.

    python3 measurements/ten_million/first_frame.py GPUMEM_TOP TRACE

Prints one line: the first frame's seconds, the exit status, the screen's
peak RSS then (VmHWM). FF_DUMP=PATH keeps the bytes the screen wrote.
docs/measurements/benchmarks.md, "The screen's first frame", has what it
was made for.
"""
import os, pty, sys, time, fcntl, termios, struct, select
bin_, trace = sys.argv[1], sys.argv[2]
t0 = time.time()
pid, fd = pty.fork()
if pid == 0:
    os.environ['TERM'] = 'xterm-256color'
    os.execv(bin_, [bin_, 'replay', trace])
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack('HHHH', 60, 200, 0, 0))
out = b''; first = None; quit_at = None
while True:
    r, _, _ = select.select([fd], [], [], 0.05)
    if r:
        try: d = os.read(fd, 1 << 16)
        except OSError: break
        if not d: break
        out += d
        if first is None and b'\x1b[?1049h' in out and len(out.split(b'\x1b[?1049h', 1)[1]) > 2000:
            first = time.time() - t0
            hwm = next((l.split()[1] for l in open(f'/proc/{pid}/status') if l.startswith('VmHWM')), '?')
            time.sleep(0.3); os.write(fd, b'q'); quit_at = time.time()
    if time.time() - t0 > 120: break
_, status = os.waitpid(pid, 0)
txt = out.decode('utf-8', 'replace')
left = '\x1b[?1049l' in txt
code = os.waitstatus_to_exitcode(status)
if first:
    print(f"first frame {first:.2f} s; exit {code} {time.time() - quit_at:.2f} s after q; left the alternate screen {left}; bytes {len(out)}; peak RSS {hwm} KB")
else:
    print(f"no frame; exit {code}; {txt[-300:]!r}")
open(os.environ.get('FF_DUMP', '/dev/null'), 'wb').write(out)
