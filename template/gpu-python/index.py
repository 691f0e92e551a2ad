#!/usr/bin/env python3
"""gpu-python entrypoint: serves function/handler.py over HTTP with the Python standard library.

It has the shape of OpenFaaS's python3-http template (handle(event, context), a dict or str/bytes result) but
needs no Flask or waitress, so faas-gpu's local backend can run it as a plain process and of-watchdog (http mode)
can forward to it in a cluster.

Environment:
  PORT                  port to listen on (default 5000), on 127.0.0.1 unless HOST says otherwise
  FAAS_GPU=1            the function is a GPU function: each request is wrapped in acquire/release against the
                        gpuserver, and context.gpu holds the binding (id, gpu, gpu_name, swap)
  FAAS_GPU_FUNCTION     the function's name as registered with the gpuserver (required when FAAS_GPU=1)
  FAAS_GPU_SOCKET       the gpuserver's Unix socket (default /var/run/faas-gpu/gpuserver.sock)
  FAAS_GPU_INSTANCE     this process's instance (default: HOSTNAME, the replica's name); each instance has GPU
                        memory of its own and is bound on a GPU of its own, one request at a time
  FAAS_GPU_TOKEN        the function's credential: acquire and release are authenticated with it (and the shim's
                        remoting hello); each binding is held on its own connection from acquire to release
  FAAS_GPU_REGISTRATION_TICKET  with FAAS_GPU_SELF_REGISTER=1: the provider's ticket for this function's spec
  FAAS_GPU_ACQUIRE_TIMEOUT_MS  how long a request waits for a GPU (default 30000)
  FAAS_GPU_SELF_REGISTER=1     register with the node's gpuserver at start, before the handler is imported (in a
                        cluster the provider cannot reach the node's gpuserver): the requirements come from
                        FAAS_GPU_MEMORY_BYTES, FAAS_GPU_SLO (e.g. 80ms), FAAS_GPU_SLO_PERCENTILE,
                        FAAS_GPU_ISOLATION, FAAS_GPU_SCRATCH and FAAS_GPU_MODEL, and the token the gpuserver answers becomes FAAS_GPU_TOKEN for the shim
  OPENFAAS_SECRETS_DIR  where the function's secrets are files (default /var/openfaas/secrets)
  FAAS_GPU_MAX_BODY_BYTES  the largest request body accepted (default 67108864, 64 MiB); larger gets 413
  FAAS_GPU_LISTEN_BACKLOG  connections the kernel queues before index.py accepts them (default 1024; the
                        standard library's default of 5 drops connections under a burst of concurrent requests)
  FAAS_GPU_STREAM_BUFFER_BYTES  the most of a streamed response that waits for a slow client once generated
                        (default 16777216, 16 MiB); beyond it the stream ends incomplete (see Streaming)
  FAAS_GPU_CONCURRENCY  requests in flight at once in this process under one GPU binding (default: the handler
                        module's CONCURRENCY, else 1: each request acquires and releases a binding of its own, one
                        at a time per instance); see Several requests in flight

GET /_/health answers 200 once the handler is imported, as of-watchdog's health endpoint does.

Streaming: a handler may return a generator (or any iterator), alone or as the body of its dict or tuple result.
Its items (bytes, str, or a dict/list sent as a JSON line) are written as they come, each flushed in a chunk of
its own (HTTP/1.1 chunked transfer encoding; server-sent events when the handler sets Content-Type
text/event-stream). A GPU function's binding is held while the generator runs, and released as soon as it is
exhausted, not when the client has read everything: what the client has not taken yet waits in the template (a
writer thread sends it at the client's pace), at most FAAS_GPU_STREAM_BUFFER_BYTES per request (default 16 MiB).
A client so slow that more would wait ends its stream: the generator is closed, the binding released and the
connection closed without the final chunk. A client that goes away ends it the same way (the generator's finally
blocks run). A stream that cannot be vouched for (the generator raised, or the GPU failed while the binding was
held) ends without the final chunk, so the client sees an incomplete response, never a complete wrong one.

Several requests in flight (opt-in): a handler that serves concurrent requests together (the llm function batches
their sequences into one decode step) sets CONCURRENCY = N in its module, or its deployment sets
FAAS_GPU_CONCURRENCY=N. Then up to N requests run in this process at once and share one binding (SharedBinding):
the first acquires it, the others join it, and the last to end releases it, so the GPU is bound while any of them
runs and the gpuserver sees one request from acquire to release. More wait for a slot. Each request is answered
when its own work is done; a GPU failure that the gpuserver reports only at the release reaches the requests still
running then (their streams end incomplete), not the ones already answered, whose own CUDA calls all succeeded.
Without it (the default) nothing changes: one binding per request.
"""

import collections
import ctypes
import http.client
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

handler = None  # function.handler, imported by main() once the GPU function is registered

DEFAULT_SOCKET = "/var/run/faas-gpu/gpuserver.sock"
DEFAULT_BACKLOG = 1024
DEFAULT_MAX_BODY = 64 << 20
DEFAULT_STREAM_BUFFER = 16 << 20
DEFAULT_SECRETS_DIR = "/var/openfaas/secrets"
HEALTH_PATH = "/_/health"


class BodyTooLarge(Exception):
    """The request body is larger than the server accepts."""


class Query(dict):
    """Query parameters: q["name"] or q.get("name") is the first value, q.getlist("name") every value."""

    def __init__(self, raw):
        self._lists = parse_qs(raw, keep_blank_values=True)
        super().__init__({k: v[0] for k, v in self._lists.items()})

    def getlist(self, name):
        return list(self._lists.get(name, []))


class Event:
    """The request as the handler sees it (python3-http's Event)."""

    def __init__(self, body, headers, method, query, path):
        self.body = body
        self.headers = headers
        self.method = method
        self.query = query
        self.path = path


class Context:
    """python3-http's Context, plus gpu: the request's GPU binding (None for a CPU function)."""

    def __init__(self, gpu=None):
        self.hostname = os.getenv("HOSTNAME", "localhost")
        self.gpu = gpu
        self.secrets_dir = os.getenv("OPENFAAS_SECRETS_DIR", DEFAULT_SECRETS_DIR)


class GPUError(Exception):
    """The gpuserver refused or failed a call; status is the HTTP status the function answers with."""

    def __init__(self, status, message, restart=False, retry_after=None):
        super().__init__(message)
        self.status = status
        self.message = message
        # restart: this process cannot serve again (its CUDA session died with the gpuserver); it exits after
        # answering so that its supervisor (the kubelet, or faas-gpu's local backend) starts it afresh.
        self.restart = restart
        # retry_after: the gpuserver's Retry-After (its overload control refused the request: 429; or the function
        # is backed off after repeated kernel faults: 503), passed on to the caller with the status so that a router
        # or the queue worker can retry later or elsewhere.
        self.retry_after = retry_after


def cuda_loaded():
    """Whether this process has loaded the CUDA driver, i.e. the shim: its CUDA session lives in the gpuserver."""
    try:
        with open("/proc/self/maps") as f:
            return any(line.rstrip().endswith("/libcuda.so.1") for line in f)
    except OSError:
        return False


_shim = []  # the loaded shim, once this process loaded it


def shim_library():
    """The shim this process loaded as libcuda.so.1, or None while it has loaded none."""
    if not _shim:
        if not cuda_loaded():
            return None
        try:
            _shim.append(ctypes.CDLL("libcuda.so.1"))
        except OSError:
            return None
    return _shim[0]


def session_lost():
    """Whether this process's CUDA session ended for good: the executor process that ran it (its tenant's, or the
    gpuserver) went away, and every CUDA call of this process fails from now on. Its model is still in the node's
    repository: a new process gets it back (docs/tenants.md)."""
    lib = shim_library()
    try:
        return lib is not None and bool(lib.faas_gpu_session_lost())
    except AttributeError:  # a driver that is not the shim
        return False


def process_phase(name):
    """Tells the gpuserver, through the shim, that this process's initialisation (the handler's import) begins or
    has ended: a replica that starts while others serve requests is then told apart from them, and what its
    initialisation allocates stays the function's (docs/operations.md, scratch). Without the shim, nothing."""
    try:
        if not _shim:  # loaded here even before the handler loads CUDA: the phase starts before its import
            _shim.append(ctypes.CDLL("libcuda.so.1"))
        r = getattr(_shim[0], name)()
    except (OSError, AttributeError):  # no driver, or a driver that is not the shim
        return
    if r != 0:
        log("gpu-python: %s answered CUDA error %d; the first request ends the initialisation" % (name, r))


def kernels_not_simulated():
    """How many of this process's CUDA calls failed because the simulated node cannot compute a kernel it launched
    (PyTorch's, cuBLAS's: the simulated node computes only its reference kernels unless the gpuserver runs with
    --sim-kernels=dry); 0 with a real GPU or without the shim."""
    lib = shim_library()
    if lib is None:
        return 0
    try:
        f = lib.faas_gpu_kernels_not_simulated
    except AttributeError:  # a driver that is not the shim
        return 0
    f.restype = ctypes.c_ulonglong
    return int(f())


# NOT_SIMULATED is the answer of a request whose kernels the simulated node could not compute: never the handler's
# result (computed without its kernels) nor its exception (CUDA_ERROR_NOT_SUPPORTED says nothing of the cause).
NOT_SIMULATED = ("function %s launched kernels the simulated node cannot compute (it computes only its reference "
                 "kernels, not PyTorch's or cuBLAS's): run faas-gpu up (or the gpuserver) with --sim-kernels=dry to "
                 "accept them without computing them (answers are then meaningless), or on a machine with a GPU")


class UnixHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection over a Unix socket."""

    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class GPUClient:
    """acquire/release against the gpuserver's HTTP API on its Unix socket."""

    def __init__(self, function, socket_path, acquire_timeout_ms, instance=""):
        self.function = function
        self.instance = instance  # this process's instance (FAAS_GPU_INSTANCE): its acquires and its shim's hello
        self.spec = None  # set when the function registers itself (FAAS_GPU_SELF_REGISTER=1)
        self.socket_path = socket_path
        self.acquire_timeout_ms = acquire_timeout_ms

    def _call(self, method, path, body, timeout, conn=None, credential=None, headers_out=None):
        """One API call: on conn when given (it stays open), else on a connection of its own. The credential is
        the function's token (FAAS_GPU_TOKEN) unless another is given."""
        own = conn is None
        if own:
            conn = UnixHTTPConnection(self.socket_path, timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            credential = credential or os.getenv("FAAS_GPU_TOKEN", "")
            if credential:
                headers["Authorization"] = "Bearer " + credential
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            if headers_out is not None:
                headers_out["Retry-After"] = resp.getheader("Retry-After")
            return resp.status, resp.read()
        finally:
            if own:
                conn.close()

    @staticmethod
    def _error_text(raw):
        try:
            return json.loads(raw).get("error") or raw.decode(errors="replace")
        except (ValueError, AttributeError):
            return raw.decode(errors="replace")

    @staticmethod
    def _restart(raw):
        """Whether an error answer says that this process must start again (its GPU memory is gone)."""
        try:
            return json.loads(raw).get("restart") is True
        except (ValueError, AttributeError):
            return False

    def acquire(self):
        """Returns (binding, lease): the binding and the connection that holds it until release."""
        try:
            return self._acquire()
        except GPUError as e:
            # A gpuserver that restarted has forgotten the functions that registered themselves: register again.
            if e.status != 404 or self.spec is None:
                raise
            log("gpu-python: the gpuserver does not know %s (restarted?): registering again" % self.function)
            if cuda_loaded():
                # The contexts, modules and allocations of this process lived in the gpuserver that restarted, and
                # the shim cannot resume them. The model image is still in the repository: a new process gets it
                # back at the same addresses.
                raise GPUError(503, "the gpuserver restarted under this function's CUDA session; the function "
                               "restarts", restart=True)
            token = self.register(self.spec)
            if token:
                os.environ["FAAS_GPU_TOKEN"] = token
            return self._acquire()

    def _acquire(self):
        # The binding is a lease of this connection: it stays open until release, so that the gpuserver releases
        # the binding should this process die. Leave the socket a little longer than the gpuserver's own timeout
        # so that its 504 arrives first.
        timeout = self.acquire_timeout_ms / 1000.0 + 5
        path = "/v1/functions/%s/acquire" % self.function
        conn = UnixHTTPConnection(self.socket_path, timeout)
        try:
            got = {}
            body = {"timeout_ms": self.acquire_timeout_ms}
            if self.instance:
                body["instance"] = self.instance
            status, raw = self._call("POST", path, body, timeout, conn=conn, headers_out=got)
        except OSError as e:
            conn.close()
            raise GPUError(503, "gpuserver at %s unreachable: %s" % (self.socket_path, e))
        if status != 200:
            conn.close()
            # restart: the function's GPU memory was lost before its initialisation ended (a fault or a GPU
            # failure); a new process initialises afresh.
            # Retry-After: the overload control sheds the function (429), or it is backed off after repeated
            # kernel faults (503).
            retry = got.get("Retry-After") if status in (429, 503) else None
            raise GPUError(status, "gpuserver refused to acquire a GPU for function %s (HTTP %d): %s"
                           % (self.function, status, self._error_text(raw)), restart=self._restart(raw),
                           retry_after=retry)
        try:
            binding = json.loads(raw)
        except ValueError:
            conn.close()
            raise GPUError(502, "gpuserver answered acquire with invalid JSON")
        return binding, conn

    def register(self, spec):
        """Registers (or updates) the function with the gpuserver; returns the token for the remoting socket."""
        # Registering takes a ticket the provider issued for exactly this spec (FAAS_GPU_REGISTRATION_TICKET).
        try:
            status, raw = self._call("POST", "/v1/functions", spec, 30,
                                     credential=os.getenv("FAAS_GPU_REGISTRATION_TICKET", ""))
        except OSError as e:
            raise GPUError(503, "gpuserver at %s unreachable: %s" % (self.socket_path, e))
        if status != 200:
            raise GPUError(status, "gpuserver refused to register function %s (HTTP %d): %s"
                           % (self.function, status, self._error_text(raw)))
        try:
            return json.loads(raw).get("token", "")
        except (ValueError, AttributeError):
            raise GPUError(502, "gpuserver answered register with invalid JSON")

    def release(self, binding_id, lease):
        """Ends a binding on the connection that acquired it. Returns a GPUError when the binding broke (HTTP
        503: its GPU failed while it was held, so the handler's GPU work may be wrong), else None."""
        try:
            if lease.sock is not None:
                lease.sock.settimeout(30)
            status, raw = self._call("POST", "/v1/bindings/%s/release" % binding_id, None, 30, conn=lease)
        except OSError as e:
            log("faas-gpu: releasing binding %s failed: %s" % (binding_id, e))
            return None
        finally:
            lease.close()
        if status not in (200, 204):
            log("faas-gpu: releasing binding %s failed (HTTP %d): %s" % (binding_id, status, self._error_text(raw)))
            if status == 503:
                # restart: the executor that ran this process's CUDA session ended under the request.
                return GPUError(503, "the GPU of function %s failed during the request: %s"
                                % (self.function, self._error_text(raw)), restart=self._restart(raw))
        return None


class SharedBinding:
    """One GPU binding shared by the requests in flight in this process (FAAS_GPU_CONCURRENCY > 1): acquire() and
    release() have GPUClient's shape; the first acquire acquires the binding, later ones join it while it is held,
    and the release of the last one holding it releases it. At most limit requests hold it at once; more wait for a
    slot before they join."""

    def __init__(self, gpu, limit):
        self.gpu = gpu
        self.function = gpu.function
        self.limit = limit
        self.cond = threading.Condition()
        self.slots = threading.Semaphore(limit)
        self.users = 0  # requests holding the binding
        self.binding = self.lease = None
        self.busy = False  # an acquire or a release of the binding is under way
        self.acquired_total = 0  # bindings acquired (for tests: several requests, one binding)

    def acquire(self):
        self.slots.acquire()
        try:
            with self.cond:
                while self.busy:
                    self.cond.wait()
                if self.binding is not None:
                    self.users += 1
                    return self.binding, None
                self.busy = True
            try:
                binding, lease = self.gpu.acquire()
            except BaseException:
                with self.cond:
                    self.busy = False
                    self.cond.notify_all()
                raise
            with self.cond:
                self.binding, self.lease, self.users, self.busy = binding, lease, 1, False
                self.acquired_total += 1
                self.cond.notify_all()
            return binding, None
        except BaseException:
            self.slots.release()
            raise

    def release(self, binding_id, _lease):
        """Ends this request's share; the last one releases the binding. Returns the release's GPUError (the
        last request only), else None."""
        try:
            with self.cond:
                self.users -= 1
                if self.users > 0:
                    return None
                binding, lease = self.binding, self.lease
                self.binding = self.lease = None
                self.busy = True
            try:
                return self.gpu.release(binding.get("id", ""), lease)
            finally:
                with self.cond:
                    self.busy = False
                    self.cond.notify_all()
        finally:
            self.slots.release()


def concurrency(module):
    """Requests in flight at once under one binding: FAAS_GPU_CONCURRENCY, else the handler module's CONCURRENCY,
    else 1."""
    raw = os.getenv("FAAS_GPU_CONCURRENCY", "")
    try:
        n = int(raw) if raw else int(getattr(module, "CONCURRENCY", 1))
        if n < 1:
            raise ValueError
    except (TypeError, ValueError):
        sys.exit("gpu-python: FAAS_GPU_CONCURRENCY (or the handler's CONCURRENCY) must be a positive number of "
                 "requests")
    return n


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def format_body(body):
    if body is None:
        return b""
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    if isinstance(body, (dict, list)):
        return json.dumps(body).encode()
    return str(body).encode()


def is_stream(body):
    """Whether a handler's body is a stream: an iterator that is not one of the values format_body turns into
    bytes (a generator, above all)."""
    return (body is not None and not isinstance(body, (bytes, bytearray, str, dict, list, tuple))
            and hasattr(body, "__next__"))


def format_response(res):
    """Turns a handler's result into (status, headers, body) the way python3-http does; body is bytes, or the
    handler's iterator when it streams (is_stream)."""
    if res is None:
        return 200, {}, b""
    if is_stream(res):
        return 200, {}, res
    if isinstance(res, dict):
        status = int(res.get("statusCode", 200))
        headers = {str(k): str(v) for k, v in (res.get("headers") or {}).items()}
        body = res.get("body")
        if isinstance(body, (dict, list)) and not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
        return status, headers, body if is_stream(body) else format_body(body)
    if isinstance(res, tuple):
        body = res[0]
        status = int(res[1]) if len(res) > 1 else 200
        headers = dict(res[2]) if len(res) > 2 else {}
        return status, headers, body if is_stream(body) else format_body(body)
    return 200, {}, format_body(res)


def format_item(item):
    """One item of a streamed body as bytes: a dict or list is a JSON line."""
    if isinstance(item, (dict, list)):
        return json.dumps(item).encode() + b"\n"
    return format_body(item)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # listen(2) backlog: socketserver's default of 5 makes the kernel drop the SYNs of a burst of concurrent
    # connections (the provider's proxy opens one per request in flight), which then wait for a SYN retransmit or
    # fail. The kernel caps it at net.core.somaxconn.
    request_queue_size = DEFAULT_BACKLOG

    def __init__(self, addr, gpu_client, backlog=DEFAULT_BACKLOG, max_body=DEFAULT_MAX_BODY,
                 stream_buffer=DEFAULT_STREAM_BUFFER):
        self.request_queue_size = backlog
        self.max_body = max_body
        self.stream_buffer = stream_buffer
        super().__init__(addr, RequestHandler)
        self.gpu_client = gpu_client
        self.shed_logged = False  # a refusal of the overload control was logged; reset when a request is served
        self.not_simulated_logged = False  # a request whose kernels the simulated node cannot compute was logged
        self.lock = threading.Lock()
        self.inflight = 0
        self.stopping = False
        self.shared = None  # a SharedBinding when requests share one binding (FAAS_GPU_CONCURRENCY > 1)

    def enter(self):
        with self.lock:
            self.inflight += 1

    def leave(self):
        with self.lock:
            self.inflight -= 1


class StreamBuffer:
    """The bytes of one streamed response between the handler's generator and its client: the request's thread
    puts what the generator yields (holding the GPU binding), a writer thread of its own sends it at the client's
    pace (holding nothing), so that the binding ends with the generation, never with the client's reading. At most
    limit bytes wait (beyond the item being sent): a put that would exceed it aborts the stream."""

    def __init__(self, handler, limit):
        self.handler = handler
        self.limit = limit
        self.cond = threading.Condition()
        self.items = collections.deque()
        self.size = 0  # bytes queued, not yet handed to the socket
        self.ended = False  # the generator ended: nothing more comes
        self.failed = None  # why the client takes no more (it went away, or it was too slow)
        self.thread = threading.Thread(target=self._send, name="stream-writer", daemon=True)
        self.thread.start()

    def put(self, data):
        """Queues data for the client; False when the stream must stop: the client went away, or more than limit
        bytes would wait for it (the stream is aborted)."""
        if not data:
            return self.failed is None  # an empty chunk would end the body
        with self.cond:
            if self.failed is not None:
                return False
            if self.items and self.size + len(data) > self.limit:
                overflow = True
            else:
                overflow = False
                self.items.append(data)
                self.size += len(data)
                self.cond.notify_all()
        if overflow:
            self.abort("the client reads the stream more slowly than it is generated: more than %d bytes "
                       "(FAAS_GPU_STREAM_BUFFER_BYTES) would wait for it" % self.limit)
            return False
        return True

    def _send(self):
        while True:
            with self.cond:
                while not self.items and not self.ended and self.failed is None:
                    self.cond.wait()
                if self.failed is not None or not self.items:
                    return
                data = self.items.popleft()
            try:
                self.handler.write_chunk(data)
            except (OSError, ValueError):
                with self.cond:
                    if self.failed is None:
                        self.failed = "the client went away"
                    self.items.clear()
                    self.cond.notify_all()
                return
            with self.cond:
                self.size -= len(data)

    def abort(self, why):
        """Ends the stream at once: what waits is dropped, and a send blocked on the client returns."""
        with self.cond:
            if self.failed is not None:
                return
            self.failed = why
            self.items.clear()
            self.size = 0
            self.cond.notify_all()
        try:
            self.handler.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def finish(self):
        """No more items: waits (without the GPU) until the writer sent everything or failed; True when all was
        sent."""
        with self.cond:
            self.ended = True
            self.cond.notify_all()
        self.thread.join()
        return self.failed is None


class RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gpu-python"

    def log_message(self, fmt, *args):
        pass  # stdout/stderr carry the handler's own output and one line per request (log_request)

    def log_request(self, code="-", size="-"):
        """One line per request in the function's log (faas-cli logs): method, path (without its query), status and
        the time from the request's start to its answer's status line (a stream's first byte). Health checks are
        not logged."""
        path = urlsplit(self.path).path
        if path == HEALTH_PATH:
            return
        start = getattr(self, "request_start", None)
        took = "" if start is None else " %.1fms" % ((time.monotonic() - start) * 1000)
        log("%s %s %s%s" % (self.command, path, getattr(code, "value", code), took))

    def read_body(self):
        """Reads the request body; raises BodyTooLarge beyond server.max_body (checked before reading) and
        ValueError for a malformed length or chunk."""
        limit = self.server.max_body
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks, total = [], 0
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size < 0:
                    raise ValueError("negative chunk size")
                if size == 0:
                    # Trailers end with an empty line.
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                total += size
                if total > limit:
                    raise BodyTooLarge()
                chunks.append(self.rfile.read(size))
                self.rfile.readline(65537)
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        if length < 0:
            raise ValueError("negative Content-Length")
        if length > limit:
            raise BodyTooLarge()
        return self.rfile.read(length) if length > 0 else b""

    def send(self, status, headers, body):
        self.send_response(status)
        has_type = False
        for k, v in headers.items():
            if k.lower() in ("content-length", "transfer-encoding", "connection"):
                continue
            has_type = has_type or k.lower() == "content-type"
            self.send_header(k, v)
        if not has_type:
            self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        if self.server.stopping or self.close_connection:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def client_gone(self):
        """Whether the client closed its connection (a readable socket with nothing to read). A client that sent
        more (pipelined requests) counts as present."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def start_stream(self, status, headers):
        """Sends the status line and headers of a streamed response (chunked on HTTP/1.1, else ended by closing
        the connection)."""
        self.send_response(status)
        has_type = False
        for k, v in headers.items():
            if k.lower() in ("content-length", "transfer-encoding", "connection"):
                continue
            has_type = has_type or k.lower() == "content-type"
            self.send_header(k, v)
        if not has_type:
            self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.chunked = self.request_version == "HTTP/1.1"
        if self.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.close_connection = True
        if self.server.stopping or self.close_connection:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.flush()

    def write_chunk(self, data):
        if not data:
            return  # an empty chunk would end the body
        if self.chunked:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        else:
            self.wfile.write(data)
        self.wfile.flush()

    def stream(self, status, headers, body, finish):
        """Writes the handler's iterator as it yields, through a StreamBuffer, then finish() (which releases the GPU
        binding and returns a GPUError when it broke) as soon as the iterator ends, before the client has read
        what waits for it. The stream ends with its final chunk only when the iterator ended normally, the binding
        held and the client took every byte; otherwise the connection is closed without it. Returns nothing; the
        iterator is closed and finish() called exactly once, also when the client goes away or is too slow."""
        complete = False
        buf = None
        try:
            self.start_stream(status, headers)
            if self.command == "HEAD":
                complete = True
                return
            buf = StreamBuffer(self, self.server.stream_buffer)
            for item in body:
                if self.client_gone():
                    log("gpu-python: the client went away during a streamed response; stopping it")
                    break
                if not buf.put(format_item(item)):
                    log("gpu-python: %s; the streamed response ends incomplete" % buf.failed)
                    break
            else:
                complete = True
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError):
            log("gpu-python: the client went away during a streamed response; stopping it")
        except Exception:
            traceback.print_exc()
            log("gpu-python: the handler's stream raised; the response ends incomplete")
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                try:
                    close()  # GeneratorExit in the handler: its finally blocks run
                except Exception:
                    traceback.print_exc()
            broke = finish()  # the generation ended: the GPU is released before the client has read it all
        if broke is not None:
            log("faas-gpu: %s; the streamed response ends incomplete" % broke.message)
            complete = False
            if buf is not None:
                buf.abort(broke.message)
        if buf is not None and not buf.finish():
            complete = False
        if complete and self.chunked:
            try:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                pass
        if not complete:
            self.close_connection = True

    def send_json_error(self, status, message):
        self.send(status, {"Content-Type": "application/json"}, json.dumps({"error": message}).encode())

    def handle_any(self):
        self.request_start = time.monotonic()
        url = urlsplit(self.path)
        try:
            body = self.read_body()
        except BodyTooLarge:
            self.close_connection = True  # the rest of the body is never read
            self.send_json_error(413, "request body is larger than %d bytes (FAAS_GPU_MAX_BODY_BYTES)"
                                 % self.server.max_body)
            return
        except (ValueError, OSError) as e:
            self.close_connection = True
            self.send_json_error(400, "cannot read request body: %s" % e)
            return
        if url.path == HEALTH_PATH and self.command in ("GET", "HEAD"):
            self.send(200, {}, b"OK")
            return
        self.server.enter()
        try:
            self.invoke(url, body)
        finally:
            self.server.leave()

    def invoke(self, url, body):
        event = Event(body, self.headers, self.command, Query(url.query), url.path or "/")
        gpu = self.server.gpu_client
        binder = self.server.shared or gpu  # acquire and release: a binding of its own, or the shared one
        binding = lease = None
        if gpu is not None and session_lost():
            self.exit_for_new_session(GPUError(503, "the CUDA session of function %s ended (its executor process "
                                                    "went away); the function restarts" % gpu.function, restart=True))
            return
        if gpu is not None:
            try:
                binding, lease = binder.acquire()
                self.server.shed_logged = False
            except GPUError as e:
                if e.retry_after is None:
                    log("faas-gpu: %s" % e.message)
                elif not self.server.shed_logged:
                    # Refusals of the overload control come in episodes: logged once until a request is served.
                    self.server.shed_logged = True
                    log("faas-gpu: %s (logged once until a request is served again)" % e.message)
                headers = {"Content-Type": "application/json"}
                if e.retry_after is not None:
                    headers["Retry-After"] = e.retry_after
                self.send(e.status, headers, json.dumps({"error": e.message}).encode())
                if e.restart:
                    self.wfile.flush()
                    log("gpu-python: exiting so that the function starts again with a new CUDA session")
                    os._exit(75)
                return
        released = False

        def release():
            nonlocal released
            if released or binding is None:
                return None
            released = True
            return binder.release(binding.get("id", ""), lease)

        not_simulated = kernels_not_simulated() if gpu is not None else 0
        try:
            context = Context(gpu=binding)
            try:
                res = handler.handle(event, context)
                status, headers, out = format_response(res)
            except Exception:
                traceback.print_exc()
                if gpu is not None and session_lost():  # the exception is the lost session's: answered below
                    status, headers, out = 500, {}, b""
                elif gpu is not None and kernels_not_simulated() > not_simulated:
                    self.answer_not_simulated(gpu.function)
                    return
                else:
                    self.send_json_error(500, "the function's handler raised an exception; see its logs")
                    return
            if gpu is not None and kernels_not_simulated() > not_simulated:  # a result without its kernels
                self.answer_not_simulated(gpu.function)
                return
            if is_stream(out):
                # The binding is held while the generator runs: it does the GPU work as it yields.
                self.stream(status, headers, out, release)
                return
        finally:
            broke = release()
        if broke is None and gpu is not None and session_lost():  # its CUDA calls failed: never a result
            broke = GPUError(503, "the CUDA session of function %s ended during the request (its executor process "
                                  "went away); the function restarts" % gpu.function, restart=True)
        if broke is not None:  # the handler's result may be wrong: its GPU died under it
            if broke.restart:
                self.exit_for_new_session(broke)
                return
            self.send_json_error(broke.status, broke.message)
            return
        self.send(status, headers, out)

    def answer_not_simulated(self, function):
        """Answers 501: the simulated node could not compute the request's kernels (logged once per process)."""
        message = NOT_SIMULATED % function
        if not self.server.not_simulated_logged:
            self.server.not_simulated_logged = True
            log("faas-gpu: %s (logged once)" % message)
        self.send_json_error(501, message)

    def exit_for_new_session(self, e):
        """Answers e and exits, so that the supervisor starts this function again with a new CUDA session."""
        log("faas-gpu: %s" % e.message)
        self.send_json_error(e.status, e.message)
        self.wfile.flush()
        log("gpu-python: exiting so that the function starts again with a new CUDA session")
        os._exit(75)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = handle_any


def gpu_client_from_env():
    if os.getenv("FAAS_GPU", "") not in ("1", "true"):
        return None
    function = os.getenv("FAAS_GPU_FUNCTION", "")
    if not function:
        sys.exit("gpu-python: FAAS_GPU=1 but FAAS_GPU_FUNCTION (the function's name) is not set")
    try:
        timeout_ms = int(os.getenv("FAAS_GPU_ACQUIRE_TIMEOUT_MS", "30000"))
    except ValueError:
        sys.exit("gpu-python: FAAS_GPU_ACQUIRE_TIMEOUT_MS must be an integer number of milliseconds")
    instance = instance_from_env()
    os.environ["FAAS_GPU_INSTANCE"] = instance  # the shim's hello names the same instance (before CUDA loads)
    return GPUClient(function, os.getenv("FAAS_GPU_SOCKET", DEFAULT_SOCKET), timeout_ms, instance)


_INSTANCE_MAX = 63
_INSTANCE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def instance_from_env():
    """This process's instance of the function: FAAS_GPU_INSTANCE, else its replica's host name (HOSTNAME: the
    provider's replica id, a pod's name). Each instance has GPU memory of its own, so a function's instances are
    bound on several GPUs at once. A name the gpuserver would refuse (too long, odd bytes) is replaced by a digest
    of it; "" (neither set) is the function itself, one request at a time across its processes."""
    name = os.getenv("FAAS_GPU_INSTANCE") or os.getenv("HOSTNAME", "")
    if not name:
        return ""
    if len(name) <= _INSTANCE_MAX and name[0].isalnum() and set(name) <= _INSTANCE_CHARS:
        return name
    import hashlib
    return "h" + hashlib.sha256(name.encode()).hexdigest()[:32]


_DURATION_UNITS = {"ns": 1, "us": 1e3, "\u00b5s": 1e3, "ms": 1e6, "s": 1e9, "m": 60e9, "h": 3600e9}


def parse_duration_ns(text):
    """Parses a Go duration ("80ms", "1.5s", "1m30s") into nanoseconds; raises ValueError naming the text."""
    rest, total = text.strip(), 0.0
    if not rest:
        raise ValueError("empty duration")
    while rest:
        i = 0
        while i < len(rest) and (rest[i].isdigit() or rest[i] == "."):
            i += 1
        j = i
        while j < len(rest) and not (rest[j].isdigit() or rest[j] == "."):
            j += 1
        number, unit = rest[:i], rest[i:j]
        if not number or unit not in _DURATION_UNITS:
            raise ValueError("%r is not a duration like 80ms" % text)
        total += float(number) * _DURATION_UNITS[unit]
        rest = rest[j:]
    return int(total)


def self_register(gpu):
    """Registers the function from its FAAS_GPU_* requirements and hands the shim its token."""
    try:
        spec = {"name": gpu.function, "memory_bytes": int(os.environ["FAAS_GPU_MEMORY_BYTES"])}
        if os.getenv("FAAS_GPU_SLO"):
            spec["slo_ns"] = parse_duration_ns(os.environ["FAAS_GPU_SLO"])
        if os.getenv("FAAS_GPU_SLO_PERCENTILE"):
            spec["percentile"] = float(os.environ["FAAS_GPU_SLO_PERCENTILE"])
        if os.getenv("FAAS_GPU_ISOLATION"):
            spec["isolation"] = os.environ["FAAS_GPU_ISOLATION"]
        if os.getenv("FAAS_GPU_SCRATCH"):
            spec["scratch"] = os.environ["FAAS_GPU_SCRATCH"]
        if os.getenv("FAAS_GPU_MODEL"):
            spec["model"] = os.environ["FAAS_GPU_MODEL"]
    except KeyError:
        sys.exit("gpu-python: FAAS_GPU_SELF_REGISTER=1 needs FAAS_GPU_MEMORY_BYTES")
    except ValueError as e:
        sys.exit("gpu-python: bad GPU requirement in FAAS_GPU_*: %s" % e)
    gpu.spec = spec
    deadline = time.monotonic() + 60
    while True:  # the node's gpuserver may still be starting
        try:
            token = gpu.register(spec)
            break
        except GPUError as e:
            if e.status < 500 or time.monotonic() > deadline:
                sys.exit("gpu-python: %s" % e)
            log("gpu-python: %s; retrying" % e)
            time.sleep(1)
    if token:
        os.environ["FAAS_GPU_TOKEN"] = token
    log("gpu-python: registered %s with the gpuserver" % gpu.function)


def main():
    global handler
    try:
        port = int(os.getenv("PORT", "5000"))
    except ValueError:
        sys.exit("gpu-python: PORT must be a port number")
    try:
        backlog = int(os.getenv("FAAS_GPU_LISTEN_BACKLOG", str(DEFAULT_BACKLOG)))
        if backlog < 1:
            raise ValueError
    except ValueError:
        sys.exit("gpu-python: FAAS_GPU_LISTEN_BACKLOG must be a positive number of connections")
    try:
        max_body = int(os.getenv("FAAS_GPU_MAX_BODY_BYTES", str(DEFAULT_MAX_BODY)))
        if max_body < 0:
            raise ValueError
    except ValueError:
        sys.exit("gpu-python: FAAS_GPU_MAX_BODY_BYTES must be a number of bytes")
    try:
        stream_buffer = int(os.getenv("FAAS_GPU_STREAM_BUFFER_BYTES", str(DEFAULT_STREAM_BUFFER)))
        if stream_buffer < 1:
            raise ValueError
    except ValueError:
        sys.exit("gpu-python: FAAS_GPU_STREAM_BUFFER_BYTES must be a positive number of bytes")
    gpu = gpu_client_from_env()
    if gpu is not None and os.getenv("FAAS_GPU_SELF_REGISTER", "") in ("1", "true"):
        self_register(gpu)
    if gpu is not None:
        process_phase("faas_gpu_initialising")
    from function import handler as imported  # after registration: handlers may call CUDA at import
    handler = imported
    if gpu is not None:
        process_phase("faas_gpu_initialised")
    server = Server((os.getenv("HOST", "127.0.0.1"), port), gpu, backlog, max_body)
    server.stream_buffer = stream_buffer
    n = concurrency(handler)
    if gpu is not None and n > 1:
        server.shared = SharedBinding(gpu, n)
        log("gpu-python: up to %d requests in flight share one GPU binding" % n)

    def on_term(signum, frame):
        # Stop accepting, let requests in flight finish (the provider kills the process after its grace period).
        server.stopping = True
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    log("gpu-python: listening on %s:%d%s" % (server.server_address[0], port,
        " (GPU function %s)" % server.gpu_client.function if server.gpu_client else ""))
    server.serve_forever(poll_interval=0.1)
    while True:
        with server.lock:
            if server.inflight == 0:
                break
        time.sleep(0.02)
    server.server_close()
    sys.stdout.flush()
    sys.stderr.flush()


if __name__ == "__main__":
    main()
