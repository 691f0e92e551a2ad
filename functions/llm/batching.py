"""batching.py: continuous batching of the llm function's sequences, without PyTorch (handler.py's BatchEngine does
the GPU work; test_batching.py drives this file with a model of its own in plain Python).

Concurrent requests to one process each submit a Sequence to the one Batcher. Its scheduler thread loops over
steps: at a step boundary it drops the sequences whose client went away, admits waiting ones (first come, first
served, up to max_batch at once: prefilled together, at most prefill_tokens padded prompt tokens per pass, and
joined), then decodes one token for every active
sequence in one engine call, hands each its token, and lets the finished ones leave (their KV blocks go back).
Fairness: every active sequence gets one token per step, and no sequence is admitted before one that came earlier.

The KV cache is Blocks: fixed-size blocks of block_tokens tokens handed to sequences as they grow and taken back
when they end; the engine's device pool grows on demand (doubling, at most max_blocks) and is given back whole when
no sequence is active. With max_blocks each admitted sequence reserves the blocks its prompt and max_tokens can
need, so that a running sequence never finds the cache full: a request that can never fit is refused
(KVExhausted: the function answers 429), one that does not fit now waits for blocks to come back.

The engine (duck-typed): prefill(seqs) -> each one's first token (their prompts' keys and values written into
their blocks),
decode(seqs) -> one token per sequence (each one's last token at position seq.length written first), grow(capacity)
(the device pool holds capacity blocks; 0: give it back), and optionally block_bytes. Its calls run on the
scheduler thread only, and only while some sequence is submitted and not done: the requests that submitted them
hold the process's GPU binding until their sequences are done (the gpu-python template's FAAS_GPU_CONCURRENCY).
"""

import collections
import sys
import threading
import traceback


class KVExhausted(Exception):
    """No KV block could be had: max_blocks are reserved or in use, or the quota has no memory left for one."""


class Blocks:
    """The KV cache's blocks: which of the engine's pool slots each sequence holds, and counters for /metrics."""

    def __init__(self, block_tokens, max_blocks, grow, first=4):
        self.block_tokens = block_tokens
        self.max_blocks = max_blocks  # 0: as many as the quota allows (the engine's grow raises KVExhausted)
        self.grow = grow
        self.first = first  # the pool's first capacity
        self.capacity = 0  # blocks the engine's pool holds
        self.free = []  # pool slots not held by a sequence
        self.in_use = 0
        self.reserved = 0  # blocks admitted sequences may still need (with max_blocks)
        self.peak = 0
        self.allocated_total = 0
        self.freed_total = 0
        self.refused_total = 0
        self.grows_total = 0

    def need(self, tokens):
        return -(-tokens // self.block_tokens)

    def ensure(self, seq, tokens):
        """Gives seq blocks until tokens fit; raises KVExhausted."""
        while len(seq.blocks) * self.block_tokens < tokens:
            if not self.free:
                if self.max_blocks and self.capacity >= self.max_blocks:
                    self.refused_total += 1
                    raise KVExhausted("the KV cache is full: %d blocks of %d tokens in use (LLM_KV_MAX_BLOCKS)" %
                                      (self.in_use, self.block_tokens))
                new = max(self.first, 2 * self.capacity)
                if self.max_blocks:
                    new = min(new, self.max_blocks)
                try:
                    self.grow(new)
                except KVExhausted:
                    self.refused_total += 1
                    raise
                self.grows_total += 1
                self.free.extend(range(new - 1, self.capacity - 1, -1))  # the lowest slot is handed out first
                self.capacity = new
            seq.blocks.append(self.free.pop())
            self.in_use += 1
            self.allocated_total += 1
            self.peak = max(self.peak, self.in_use)

    def release(self, seq):
        """Takes seq's blocks back."""
        self.free.extend(seq.blocks)
        self.in_use -= len(seq.blocks)
        self.freed_total += len(seq.blocks)
        seq.blocks = []

    def shrink(self):
        """Gives the engine's pool back when no sequence holds a block."""
        if self.in_use == 0 and self.capacity:
            self.grow(0)
            self.capacity = 0
            self.free = []


class Sequence:
    """One request's sequence: its prompt, how it stops, and the tokens decoded for it. sample is the engine's
    (None: greedy)."""

    def __init__(self, prompt, max_tokens, stop_ids=(), sample=None):
        self.prompt = list(prompt)
        self.max_tokens = max_tokens
        self.stop_ids = frozenset(stop_ids)
        self.sample = sample
        self.tokens = []  # decoded, stop token excluded
        self.blocks = []  # pool slots holding its keys and values, in order
        self.length = 0  # tokens whose keys and values are in its blocks
        self.reserved = 0
        self.finish = None  # "length" or "stop" once done normally
        self.error = None  # why it ended otherwise
        self.done = False
        self.cancelled = False
        self.out = collections.deque()
        self.cond = None  # set by the Batcher (its lock)

    def last(self):
        return self.tokens[-1]


class Batcher:
    """The scheduler of one process's sequences (module docstring)."""

    def __init__(self, engine, blocks, max_batch, prefill_tokens=2048):
        self.engine = engine
        self.blocks = blocks
        self.max_batch = max_batch
        self.prefill_tokens = prefill_tokens  # a prefill pass's rows x its longest prompt, at most (one row always)
        self.prefills_total = 0  # prefill passes
        self.lock = threading.Lock()
        self.work = threading.Condition(self.lock)
        self.waiting = collections.deque()
        self.active = []  # the scheduler thread's: decoded at every step
        self.ended = []  # the scheduler thread's: sequences let go in this step, their requests not told yet
        self.thread = None
        self.steps_total = 0
        self.step_sequences_total = 0  # the sum of the steps' batch sizes
        self.sequences_total = 0
        self.cancelled_total = 0
        self.peak_batch = 0

    # ---- the requests' side

    def check(self, seq):
        """Raises KVExhausted when seq can never fit in max_blocks (its prompt and max_tokens)."""
        if self.blocks.max_blocks:
            need = self.blocks.need(len(seq.prompt) + seq.max_tokens)
            if need > self.blocks.max_blocks:
                with self.lock:
                    self.blocks.refused_total += 1
                raise KVExhausted("the KV cache cannot hold this sequence: its prompt and max_tokens need %d blocks of "
                                  "%d tokens, LLM_KV_MAX_BLOCKS is %d" % (need, self.blocks.block_tokens,
                                                                          self.blocks.max_blocks))
            seq.reserved = need

    def submit(self, seq):
        """Queues seq for admission; raises KVExhausted when it can never fit."""
        self.check(seq)
        with self.lock:
            seq.cond = threading.Condition(self.lock)
            self.waiting.append(seq)
            self.sequences_total += 1
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="llm-batcher", daemon=True)
                self.thread.start()
            self.work.notify()

    def tokens(self, seq):
        """Yields seq's tokens as they are decoded; raises what ended it otherwise. Closing the generator early
        (the client went away, a stop string) cancels seq and returns once the scheduler has let it go."""
        try:
            while True:
                with self.lock:
                    while not seq.out and not seq.done:
                        seq.cond.wait()
                    if seq.out:
                        tok = seq.out.popleft()
                    elif seq.error is not None:
                        raise seq.error
                    else:
                        return
                yield tok
        finally:
            self.cancel(seq)

    def cancel(self, seq):
        """Ends seq at the next step boundary and waits until the scheduler has taken its blocks back."""
        with self.lock:
            if seq.done:
                return
            seq.cancelled = True
            if seq in self.waiting:
                self.waiting.remove(seq)
                seq.done = True
                self.cancelled_total += 1
                return
            self.work.notify()
            while not seq.done:
                seq.cond.wait()

    def batch_size(self):
        return len(self.active)

    # ---- the scheduler thread

    def _end(self, seq, error=None, finish=None):
        """Lets seq go (its blocks back); its request learns it at the end of the step (_notify). Called on the
        scheduler thread, not holding the lock."""
        self.blocks.release(seq)
        with self.lock:
            self.blocks.reserved -= seq.reserved
            seq.reserved = 0
            if error is not None:
                seq.error = error
            elif seq.cancelled and finish is None:
                self.cancelled_total += 1
            seq.finish = finish or seq.finish
        self.ended.append(seq)

    def _notify(self):
        """Tells the requests of the sequences that ended in this step; with none left the pool goes back first, so
        that no GPU work of the batch follows the last request's end (and its binding's release)."""
        with self.lock:
            idle = not self.active and not self.waiting
        if idle:
            try:
                self.blocks.shrink()
            except Exception:  # noqa: BLE001
                traceback.print_exc()
        with self.lock:
            for seq in self.ended:
                seq.done = True
                seq.cond.notify_all()
        self.ended = []

    def _deliver(self, seq, tok):
        """Hands seq its next token; True when seq is finished (a stop token, or max_tokens)."""
        if tok in seq.stop_ids:
            seq.finish = "stop"
            return True
        seq.tokens.append(tok)
        with self.lock:
            seq.out.append(tok)
            seq.cond.notify_all()
        if len(seq.tokens) >= seq.max_tokens:
            seq.finish = "length"
            return True
        return False

    def _admit(self):
        """At a step boundary: the waiting sequences that may join (first come, first served), under the lock."""
        admit = []
        while self.waiting and len(self.active) + len(admit) < self.max_batch:
            seq = self.waiting[0]
            if self.blocks.max_blocks and self.blocks.reserved + seq.reserved > self.blocks.max_blocks:
                break  # it waits for blocks to come back; none behind it overtakes it
            self.waiting.popleft()
            self.blocks.reserved += seq.reserved
            admit.append(seq)
        return admit

    def _run(self):
        while True:
            with self.lock:
                while True:
                    gone = [s for s in self.active if s.cancelled]
                    if gone or self.active or self.waiting:
                        break
                    self.work.wait()
                admit = [] if gone else self._admit()
            for seq in gone:
                self.active.remove(seq)
                self._end(seq)
            try:
                self._step(admit)
            except Exception as e:  # noqa: BLE001 - the engine failed: every sequence in it ends with the error
                traceback.print_exc()
                print("llm: the batch's decode step failed; its %d sequences end" % len(self.active + admit),
                      file=sys.stderr, flush=True)
                ended = set(map(id, self.ended))
                for seq in self.active + [s for s in admit if id(s) not in ended and s not in self.active]:
                    self._end(seq, error=e)
                self.active = []
            self._notify()

    def _groups(self, seqs):
        """seqs in order, cut into prefill passes of at most prefill_tokens (rows x the longest prompt)."""
        group, longest = [], 0
        for seq in seqs:
            n = max(longest, len(seq.prompt))
            if group and n * (len(group) + 1) > self.prefill_tokens:
                yield group
                group, n = [], len(seq.prompt)
            group.append(seq)
            longest = n
        if group:
            yield group

    def _step(self, admit):
        ready = []
        for seq in admit:
            try:
                self.blocks.ensure(seq, len(seq.prompt))
            except KVExhausted as e:
                self._end(seq, error=e)
                continue
            ready.append(seq)
        for group in self._groups(ready):  # prefill, then join
            toks = self.engine.prefill(group)
            self.prefills_total += 1
            for seq, tok in zip(group, toks):
                seq.length = len(seq.prompt)
                if self._deliver(seq, tok):
                    self._end(seq, finish=seq.finish)
                else:
                    self.active.append(seq)
        batch = []
        for seq in self.active:
            if seq.cancelled:
                continue  # leaves at the next boundary
            try:
                self.blocks.ensure(seq, seq.length + 1)
            except KVExhausted as e:  # without max_blocks: the quota has no memory for another block
                self._end(seq, error=e)
                continue
            batch.append(seq)
        self.active = [s for s in self.active if s in batch or s.cancelled and s not in self.ended]
        if not batch:
            return
        toks = self.engine.decode(batch)
        self.steps_total += 1
        self.step_sequences_total += len(batch)
        self.peak_batch = max(self.peak_batch, len(batch))
        for seq, tok in zip(batch, toks):
            seq.length += 1
            if self._deliver(seq, tok):
                self.active.remove(seq)
                self._end(seq, finish=seq.finish)
