#!/usr/bin/env python3
"""Starts graphd-executor on a device with each sandbox variant and asks it for a pool there:
which layer (Landlock, seccomp) a device's driver does not get past, and with
`--preload build/bench/eacces_log.so` (bench/eacces_log.c) which calls each variant was refused.
GPU machine only.

  bench/exec_probe.py [--preload SO] [EXECUTOR [DEVICE]]
"""
import os
import socket
import struct
import subprocess
import sys

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


def get_str(b, at):
    n, = struct.unpack_from("=I", b, at)
    return b[at + 4:at + 4 + n].decode(errors="replace"), at + 4 + n


def probe(exe, device, extra, preload):
    ch, ch_x = socket.socketpair()
    ur, ur_x = socket.socketpair()
    a, b = ch_x.fileno(), ur_x.fileno()

    def child():
        a2, b2 = os.dup(a), os.dup(b)
        os.dup2(a2, 3)
        os.dup2(b2, 4)

    env = dict(os.environ)
    if preload:
        env["LD_PRELOAD"] = preload
    p = subprocess.Popen([exe, "--device", device] + extra, pass_fds=(a, b, 3, 4), preexec_fn=child,
                         stderr=subprocess.PIPE, env=env)
    ch_x.close()
    ur_x.close()
    sandbox = ""
    try:
        h = HDR.unpack(recv_exact(ch, HDR.size))
        ready = recv_exact(ch, h[3])
        _, at = get_str(ready, 0)
        nnp, abi, sc = struct.unpack_from("=III", ready, at)
        off, _ = get_str(ready, at + 12)
        sandbox = "[nnp %d landlock %d seccomp %d%s]" % (nnp, abi, sc,
                                                         ("; off: " + off) if off else "")
        dev = device.encode()
        ch.sendall(HDR.pack(GX_MAGIC, POOL_CREATE, 1, 4 + len(dev), 0, 0)
                   + struct.pack("=I", len(dev)) + dev)
        h = HDR.unpack(recv_exact(ch, HDR.size))
        body = recv_exact(ch, h[3])
        what = "ok" if h[4] == 0 else "rc %d: %s" % (h[4], body.decode(errors="replace"))
    except EOFError:
        what = "executor exited"
    ch.close()
    ur.close()
    p.wait(timeout=60)
    err = p.stderr.read().decode(errors="replace").strip().splitlines()
    print("== %s: %s %s" % (" ".join(extra) or "(full sandbox)", what, sandbox), flush=True)
    seen = set()
    for line in err:
        key = line.split(", 0x")[0]
        if key in seen:
            continue
        seen.add(key)
        print("   " + line)
        if len(seen) >= 40:
            print("   ... (more)")
            break


args = sys.argv[1:]
preload = None
if args[:1] == ["--preload"]:
    preload = os.path.abspath(args[1])
    args = args[2:]
exe = args[0] if args else "build/graphd-executor"
device = args[1] if len(args) > 1 else "cuda:0"
variants = [[], ["--no-landlock"], ["--no-seccomp"], ["--no-sandbox"]]
if device.startswith("cuda"):
    # Wider path lists: when the full sandbox fails, which kind of path is missing.
    variants += [["--read", "/"], ["--read", "/", "--rw", "/dev", "--rw", "/proc/self"],
                 ["--read", "/", "--rw", "/", "--tmp", "/tmp", "--tmp", "/dev/shm"]]
for extra in variants:
    probe(exe, device, extra, preload)
