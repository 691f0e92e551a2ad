# llm_batching.py: functions/llm/batching.py (the llm function's continuous batching) driven by a model of its own
# in plain Python, no PyTorch (TestLLMBatchingScheduler runs it in make test with any python3). The model's next
# token is a hash of the sequence so far, read from the engine's KV blocks (so a sequence whose blocks were mixed up
# with another's, or overwritten, decodes other tokens). Prints one JSON object of checks; each is true when it
# holds.
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "functions", "llm"))
import batching  # noqa: E402

BLOCK = 4
VOCAB = 997


class Engine:
    """A toy model with a KV pool: each slot holds BLOCK tokens; the next token is a hash of the sequence's tokens,
    read back from its blocks."""

    def __init__(self, fail_at=None):
        self.pool = []  # slots of BLOCK tokens (None: never written)
        self.steps = []  # batch sizes of the decode steps
        self.prefills = []  # sequences per prefill pass
        self.gpu_calls_outside = 0  # engine calls while no sequence was submitted and not done
        self.open = 0  # sequences submitted, not done (kept by the test)
        self.lock = threading.Lock()
        self.fail_at = fail_at
        self.grows = []
        self.delay = 0.0

    def grow(self, capacity):
        self.grows.append(capacity)
        self._check()
        if capacity == 0:
            self.pool = []
        else:
            self.pool = self.pool + [[None] * BLOCK for _ in range(capacity - len(self.pool))]

    def _check(self):
        with self.lock:
            if self.open == 0:
                self.gpu_calls_outside += 1

    def _write(self, seq, pos, tok):
        b, off = divmod(pos, BLOCK)
        self.pool[seq.blocks[b]][off] = tok

    def _next(self, seq, n):
        h = 7
        for p in range(n):
            b, off = divmod(p, BLOCK)
            h = (h * 31 + self.pool[seq.blocks[b]][off]) % 1000003
        return h % VOCAB

    def prefill(self, seqs):
        self._check()
        self.prefills.append(len(seqs))
        for seq in seqs:
            for p, t in enumerate(seq.prompt):
                self._write(seq, p, t)
        return [self._next(seq, len(seq.prompt)) for seq in seqs]

    def decode(self, seqs):
        self._check()
        time.sleep(self.delay)
        self.steps.append(len(seqs))
        if self.fail_at is not None and len(self.steps) == self.fail_at:
            raise RuntimeError("the device failed")
        out = []
        for s in seqs:
            self._write(s, s.length, s.last())
            out.append(self._next(s, s.length + 1))
        return out


def alone(prompt, max_tokens, stop=()):
    """The reference: the same toy model, decoded alone without blocks."""
    seq, out = list(prompt), []
    while len(out) < max_tokens:
        h = 7
        for t in seq:
            h = (h * 31 + t) % 1000003
        tok = h % VOCAB
        if tok in stop:
            break
        out.append(tok)
        seq.append(tok)
    return out


def make(max_batch, max_blocks=0, fail_at=None, prefill_tokens=2048):
    e = Engine(fail_at)
    return e, batching.Batcher(e, batching.Blocks(BLOCK, max_blocks, e.grow), max_batch, prefill_tokens)


def run_concurrent(e, b, reqs, cancel_after=None):
    """Submits every request at once from threads of their own; answers each one's tokens (or its error)."""
    out = [None] * len(reqs)
    start = threading.Barrier(len(reqs))

    def one(i):
        p, n, stop = reqs[i]
        seq = batching.Sequence(p, n, stop)
        start.wait()
        with e.lock:
            e.open += 1
        try:
            b.submit(seq)
            toks = []
            gen = b.tokens(seq)
            for t in gen:
                toks.append(t)
                if cancel_after is not None and i in cancel_after and len(toks) == cancel_after[i]:
                    gen.close()
                    break
            out[i] = toks
        except Exception as ex:  # noqa: BLE001
            out[i] = "%s: %s" % (type(ex).__name__, ex)
        finally:
            with e.lock:
                e.open -= 1

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    return out


def main():
    checks = {}
    # 16 requests of different prompt lengths and max_tokens, some stopping at a stop token.
    reqs = [([(i * 13 + j) % VOCAB for j in range(1 + 3 * i)], 1 + (i * 7) % 23, ()) for i in range(16)]
    reqs[3] = (reqs[3][0], 30, tuple(alone(reqs[3][0], 30)[5:6]))  # stops at its 6th token
    e, b = make(16)
    e.delay = 0.002
    got = run_concurrent(e, b, reqs)
    want = [alone(p, n, s) for p, n, s in reqs]
    checks["tokens_equal_alone"] = got == want
    checks["stop_token_ends_early"] = len(got[3]) == 5
    checks["batched"] = max(e.steps) >= 8  # they decoded together
    checks["blocks_back"] = b.blocks.in_use == 0 and b.blocks.allocated_total == b.blocks.freed_total > 0
    checks["pool_freed_when_idle"] = b.blocks.capacity == 0 and e.grows[-1] == 0
    checks["no_work_outside_requests"] = e.gpu_calls_outside == 0
    checks["steps_counted"] = b.step_sequences_total == sum(e.steps) and b.peak_batch == max(e.steps)

    checks["prefilled_together"] = max(e.prefills) > 1 and sum(e.prefills) == 16

    # Prefill passes of at most 40 padded prompt tokens (a longer prompt alone); the same tokens.
    e, b = make(16, prefill_tokens=40)
    got = run_concurrent(e, b, reqs)
    checks["prefill_budget_equal"] = got == want and sum(e.prefills) == 16 and max(e.prefills) < 16

    # At most max_batch at once; the others wait and join first come, first served.
    e, b = make(4)
    e.delay = 0.002
    got = run_concurrent(e, b, reqs)
    checks["max_batch_4_equal"] = got == want
    checks["max_batch_4_bounded"] = max(e.steps) == 4

    # Cancellation: three clients go away after 2 tokens; their blocks come back, the others are unchanged.
    long_reqs = [(p, 20, ()) for p, _, _ in reqs[:8]]
    e, b = make(8)
    e.delay = 0.002
    got = run_concurrent(e, b, long_reqs, cancel_after={1: 2, 4: 2, 6: 2})
    lw = [alone(p, n) for p, n, _ in long_reqs]
    checks["cancelled_leave"] = all(got[i] == lw[i][:2] for i in (1, 4, 6)) and b.cancelled_total == 3
    checks["others_unchanged"] = all(got[i] == lw[i] for i in (0, 2, 3, 5, 7))
    checks["cancelled_blocks_back"] = b.blocks.in_use == 0 and b.blocks.capacity == 0
    checks["cancelled_no_work_outside"] = e.gpu_calls_outside == 0

    # LLM_KV_MAX_BLOCKS: a sequence that can never fit is refused; the others wait for blocks (reserved at
    # admission, so no running sequence finds the cache full) and all decode right.
    e, b = make(16, max_blocks=12)
    e.delay = 0.001
    small = [([(i * 5 + j) % VOCAB for j in range(6)], 10, ()) for i in range(8)]  # 4 blocks each
    big = ([1] * 40, 20, ())  # 15 blocks: never
    got = run_concurrent(e, b, small + [big])
    checks["never_fits_refused"] = isinstance(got[8], str) and got[8].startswith("KVExhausted") and \
        "LLM_KV_MAX_BLOCKS" in got[8]
    checks["waiting_for_blocks_equal"] = got[:8] == [alone(p, n) for p, n, _ in small]
    checks["blocks_within_max"] = b.blocks.peak <= 12 and max(e.steps) <= 3 and b.blocks.refused_total == 1

    # A failing device step ends every sequence in the batch with the error, and the next requests are served.
    e, b = make(8, fail_at=3)
    got = run_concurrent(e, b, [(p, 10, ()) for p, _, _ in reqs[:4]])
    checks["failure_ends_batch"] = all(isinstance(g, str) and "the device failed" in g for g in got)
    got = run_concurrent(e, b, [(p, 10, ()) for p, _, _ in reqs[:4]])
    checks["served_after_failure"] = got == [alone(p, 10) for p, _, _ in reqs[:4]]
    checks["failure_blocks_back"] = b.blocks.in_use == 0 and e.gpu_calls_outside == 0
    print(json.dumps(checks))


if __name__ == "__main__":
    main()
