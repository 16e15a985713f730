#!/usr/bin/env python3
"""Starts graphd-executor on a device with each sandbox variant and asks it for a pool there:
which layer (Landlock, seccomp) a device's driver does not get past. GPU machine only."""
import os, socket, struct, subprocess, sys

GX_MAGIC, READY, POOL_CREATE = 0x47584543, 1, 4
HDR = struct.Struct("=IIQQiI")


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError
        b += c
    return b


def probe(exe, device, extra):
    ch, ch_x = socket.socketpair()
    ur, ur_x = socket.socketpair()
    a, b = ch_x.fileno(), ur_x.fileno()

    def child():
        a2, b2 = os.dup(a), os.dup(b)
        os.dup2(a2, 3)
        os.dup2(b2, 4)

    p = subprocess.Popen([exe, "--device", device] + extra, pass_fds=(a, b, 3, 4), preexec_fn=child,
                         stderr=subprocess.PIPE)
    ch_x.close()
    ur_x.close()
    try:
        h = HDR.unpack(recv_exact(ch, HDR.size))
        ready = recv_exact(ch, h[3])
        dev = device.encode()
        ch.sendall(HDR.pack(GX_MAGIC, POOL_CREATE, 1, 4 + len(dev), 0, 0) + struct.pack("=I", len(dev)) + dev)
        h = HDR.unpack(recv_exact(ch, HDR.size))
        body = recv_exact(ch, h[3])
        what = "ok" if h[4] == 0 else "rc %d: %s" % (h[4], body.decode(errors="replace"))
    except EOFError:
        what = "executor exited"
    ch.close()
    ur.close()
    p.wait(timeout=30)
    err = p.stderr.read().decode(errors="replace").strip().splitlines()
    print("%-30s %s%s" % (" ".join(extra) or "(full sandbox)", what,
                          (" | stderr: " + err[-1]) if err else ""))


exe = sys.argv[1] if len(sys.argv) > 1 else "build/graphd-executor"
device = sys.argv[2] if len(sys.argv) > 2 else "cuda:0"
for extra in ([], ["--no-landlock"], ["--no-seccomp"], ["--no-landlock", "--no-seccomp"],
              ["--no-sandbox"]):
    probe(exe, device, extra)
