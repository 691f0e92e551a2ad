"""escape: a hostile test function. The request body (JSON) lists what to try; the answer says what happened to
each attempt: "ok" (and what was read) or the error that stopped it."""

import ctypes
import json
import os
import signal
import socket


def attempt(f):
    try:
        r = f()
        return {"ok": True, "value": r}
    except Exception as e:  # every refusal is an answer
        return {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}


def read(path):
    with open(path, "rb") as f:
        return f.read(4096).decode(errors="replace")


def write(path):
    with open(path, "w") as f:
        f.write("written by a function")


def listen(path):
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen(1)
    return "listening"


def replace(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return listen(path)


def handle(event, context):
    todo = json.loads(event.body or b"{}")
    out = {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "groups": os.getgroups(),
        "pid": os.getpid(),
        "procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "env": dict(os.environ),
        "secrets": attempt(lambda: sorted(os.listdir(os.environ["OPENFAAS_SECRETS_DIR"]))),
    }
    out["read"] = {p: attempt(lambda p=p: read(p)) for p in todo.get("read", [])}
    out["list"] = {p: attempt(lambda p=p: sorted(os.listdir(p))) for p in todo.get("list", [])}
    out["write"] = {p: attempt(lambda p=p: write(p)) for p in todo.get("write", [])}
    out["kill"] = {str(p): attempt(lambda p=p: os.kill(int(p), signal.SIGTERM)) for p in todo.get("kill", [])}
    out["unlink"] = {p: attempt(lambda p=p: os.unlink(p)) for p in todo.get("unlink", [])}
    out["rename"] = {p: attempt(lambda p=p: os.rename(p, p + ".moved")) for p in todo.get("rename", [])}
    out["chmod"] = {p: attempt(lambda p=p: os.chmod(p, 0o777)) for p in todo.get("chmod", [])}
    out["listen"] = {p: attempt(lambda p=p: replace(p)) for p in todo.get("listen", [])}
    if todo.get("kill_all"):
        out["kill_all"] = attempt(lambda: os.kill(-1, signal.SIGKILL))
    if todo.get("ptrace_init"):
        libc = ctypes.CDLL(None, use_errno=True)

        def ptrace():
            if libc.ptrace(16, 1, None, None) != 0:  # PTRACE_ATTACH to the sandbox's init
                e = ctypes.get_errno()
                raise OSError(e, os.strerror(e))
        out["ptrace_init"] = attempt(ptrace)
    return {"statusCode": 200, "body": out}
