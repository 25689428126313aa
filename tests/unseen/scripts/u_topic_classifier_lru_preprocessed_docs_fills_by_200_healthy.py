"""Topic classifier over a 12,000-document corpus whose (expensive) preprocessing is memoised
in an LRU cache of 8,000 entries: the cache grows while it fills (until about step 200 of 400)
and from then on evicts the least recently used document for each new one, so its size stays
at 8,000 entries (about 78 MiB). HEALTHY (a bounded cache that fills, not a leak).

What it does: documents are generated from their id (a per-id torch.Generator): 8 topics,
each with its own Zipf(1.1) unigram distribution over a permutation of a 2,000-token
vocabulary, mixed 15/85 with a shared background Zipf distribution; 256 tokens a document;
12% of the documents carry a wrong topic label (annotation noise, fixed per document).
"Preprocessing" a document = regenerating its tokens (int64, 2 KiB) plus 2,048 hashed-bigram
counts, log1p-scaled (float32, 8 KiB): 10 KiB per cache entry. Batches of 64 document ids
drawn uniformly from the corpus. Model: EmbeddingBag(2000, 64, mean) over the tokens,
Linear(2048 -> 128) over the bigram counts, concatenated -> LayerNorm -> Linear 192->128 ->
GELU -> Linear 128->8. AdamW(1e-3), 400 steps. The cache: an OrderedDict, move-to-end on a
hit, popitem(last=False) once it holds more than 8,000 entries. Its expected fill is
12000 * (1 - exp(-64 t / 12000)), which reaches 8,000 at t = 206.

What is TRUE of the run (measured; heap = glibc mallinfo2 uordblks + hblkhd, RSS from psutil,
both right after rec.step):
- The cache holds 2,847 entries at step 50, 4,973 at 100, 6,592 at 150, 7,858 at 200 and is
  full (8,000) from step 207; by the end 13,438 hits and 12,162 misses.
- The heap grows while the cache fills, then holds: 133.7 MiB at step 0, 163.7 at 50, 185.5
  at 100, 202.6 at 150, 215.9 at 200, 217.4 at 207 (+83.7 MiB for the 8,000 entries); then
  217.4-217.5 over steps 207-349 and 217.9 from ~350 to 399 (one +0.4 MiB move; slopes 0.517
  MiB/step over 0-99, 0.303 over 100-199, 0.004 over 200-399). That residue is bounded: the
  same script run for 1,200 steps has the heap at 217.9-218.3 MiB from step 350 to 1,199
  (slope 0.000 MiB/step over 800-1199).
- RSS: 402.6 MiB at step 0, 514.9 at 200, and it keeps creeping after the cache is full while
  the heap does not: 528.7 at 250, 539.7 at 300, 550.8 at 350, 556.8 at 399 (0.2 MiB/step
  over 200-399). It levels off later: in the 1,200-step run it reaches ~630 MiB by step 800
  and stays at 631.7-637.8 for steps 840-1199 (slope 0.002 MiB/step over 800-1199). The cache
  alone (the same sampling and preprocessing loop without the model, training or recorder,
  800 steps) holds RSS flat at 384-386 MiB once it is full, so the creep is the rest of the
  process's allocator use, not the cache.
- Training is fine: loss 2.13 at step 0 (ln 8 = 2.08), then 1.38, 0.69, 0.58, 0.52, 0.50,
  0.43, 0.40, 0.41, 0.39, 0.33 per 40-step window (the 12% noisy labels keep it there);
  batch accuracy ~0.9 at the end; finite throughout. About 12 s.
"""

import argparse
import ctypes
from collections import OrderedDict

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, CORPUS, CAPACITY = 400, 64, 12_000, 8_000
VOCAB, DOC_LEN, TOPICS, HASH, NOISY = 2000, 256, 8, 2048, 0.12

class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo2():
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _mallinfo2()
_PROC = psutil.Process()


def memory_mib():
    """(RSS, live malloc heap) in MiB: psutil's RSS and glibc's mallinfo2 uordblks + hblkhd."""
    heap = float("nan")
    if _MALLINFO2 is not None:
        mi = _MALLINFO2()
        heap = (mi.uordblks + mi.hblkhd) / 2 ** 20
    return _PROC.memory_info().rss / 2 ** 20, heap


def slope(part, i):
    """Least-squares slope of column i of part (MiB per step)."""
    if len(part) < 2:
        return 0.0
    xm = (len(part) - 1) / 2
    den = sum((x - xm) ** 2 for x in range(len(part)))
    return sum((x - xm) * p[i] for x, p in enumerate(part)) / den


def report(trace, marks, segments):
    """Print the measured truths from trace, a list of (loss, RSS MiB, heap MiB) per step."""
    n = len(trace)
    for s in marks:
        loss, rss, heap = trace[s]
        print(f"[mem] step {s}: loss {loss:.4f} rss {rss:.1f} MiB heap {heap:.1f} MiB")
    w = max(n // 10, 1)
    for a in range(0, n, w):
        part = trace[a:a + w]
        print(f"[win] steps {a}-{a + len(part) - 1}: loss mean "
              f"{sum(p[0] for p in part) / len(part):.4f}"
              f" rss {min(p[1] for p in part):.1f}-{max(p[1] for p in part):.1f}"
              f" heap {min(p[2] for p in part):.1f}-{max(p[2] for p in part):.1f}")
    for a, b in segments:
        part = trace[a:b + 1]
        print(f"[slope] steps {a}-{b}: rss {slope(part, 1):+.3f} MiB/step, "
              f"heap {slope(part, 2):+.3f} MiB/step")
    jumps = [(s, trace[s][1] - trace[s - 1][1], trace[s][2] - trace[s - 1][2])
             for s in range(1, n) if abs(trace[s][1] - trace[s - 1][1]) >= 8
             or abs(trace[s][2] - trace[s - 1][2]) >= 4]
    print("[jumps] RSS moves of 8 MiB or heap moves of 4 MiB or more (step:rss/heap): "
          + ", ".join(f"{s}:{d:+.0f}/{h:+.1f}" for s, d, h in jumps[:40]))


def zipf(n, s):
    w = 1.0 / torch.arange(1, n + 1, dtype=torch.float64) ** s
    return w / w.sum()


def topic_tables(g):
    """Per topic, the token distribution: its own Zipf over a permuted vocabulary (15%) plus
    the shared background Zipf (85%)."""
    base = zipf(VOCAB, 1.1)
    background = base[torch.randperm(VOCAB, generator=g)]
    tables = torch.stack([0.15 * base[torch.randperm(VOCAB, generator=g)] + 0.85 * background
                          for _ in range(TOPICS)])
    return tables.float()


def preprocess(doc_id, tables):
    """Regenerate document doc_id and compute its features: (tokens, bigram counts, topic)."""
    g = torch.Generator().manual_seed(10_007 * doc_id + 17)
    topic = doc_id % TOPICS
    tokens = torch.multinomial(tables[topic], DOC_LEN, replacement=True, generator=g)
    bigram = (tokens[:-1] * 7919 + tokens[1:] * 104_729) % HASH
    counts = torch.bincount(bigram, minlength=HASH).float().log1p()
    if float(torch.rand((), generator=g)) < NOISY:
        topic = int(torch.randint(0, TOPICS, (), generator=g))
    return tokens, counts, topic


class LRUCache:
    def __init__(self, capacity):
        self.capacity, self.data = capacity, OrderedDict()
        self.hits = self.misses = 0

    def get(self, key, make):
        if key in self.data:
            self.hits += 1
            self.data.move_to_end(key)
            return self.data[key]
        self.misses += 1
        value = self.data[key] = make(key)
        if len(self.data) > self.capacity:
            self.data.popitem(last=False)
        return value


class TopicNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(VOCAB, 64, mode="mean")
        self.bigrams = nn.Linear(HASH, 128)
        self.norm = nn.LayerNorm(192)
        self.head = nn.Sequential(nn.Linear(192, 128), nn.GELU(), nn.Linear(128, TOPICS))

    def forward(self, tokens, counts):
        return self.head(self.norm(torch.cat([self.bag(tokens), self.bigrams(counts)], 1)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(2)
    tables = topic_tables(g)
    cache = LRUCache(CAPACITY)
    model = TopicNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trace, full_at = [], None
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            ids = torch.randint(0, CORPUS, (BATCH,), generator=g).tolist()
            items = [cache.get(i, lambda k: preprocess(k, tables)) for i in ids]
            tokens = torch.stack([it[0] for it in items])
            counts = torch.stack([it[1] for it in items])
            y = torch.tensor([it[2] for it in items])
            logits = model(tokens, counts)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            acc = (logits.argmax(1) == y).float().mean()
            rec.step(loss=loss, acc=acc, cache_entries=len(cache.data),
                     hit_rate=cache.hits / max(cache.hits + cache.misses, 1))
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            if full_at is None and len(cache.data) >= CAPACITY:
                full_at = step
            if step % 25 == 0 or step == STEPS - 1 or step == full_at:
                print(f"step {step} loss {loss.item():.4f} acc {acc.item():.3f} "
                      f"cache {len(cache.data)} hits {cache.hits} misses {cache.misses} "
                      f"rss {rss:.1f} MiB heap {heap:.1f} MiB", flush=True)
    report(trace, marks=(0, 50, 100, 150, 200, 250, 300, 350, 399),
           segments=((0, 99), (100, 199), (200, 399), (250, 399), (300, 399)))
    print(f"[cache] full (8,000 entries) at step {full_at}; hits {cache.hits}, "
          f"misses {cache.misses}")


if __name__ == "__main__":
    main()
