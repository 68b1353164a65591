"""Model check of the wgmma ping-pong schedules (knob `wg_schedule`: pingpong, producer,
producer_tma), on the CPU.

The schedule in tasks/attention/templates-cuda/device.cuh.j2 (attn_body, the `pingpong` branch)
replaces __syncthreads with per-stage mbarriers and orders the two warpgroups with two named
barriers; the producer schedule moves every copy to a third warpgroup, which refills a stage
once the computing warpgroups release it; producer_tma has one thread of it issue TMA copies
whose bytes complete the stage's barrier. No GPU runs here, so two things are replayed in
Python:

- the barrier protocol (also across the tiles of a persistent block, producer_tma with
  `persistent`: the stage counters carry over, and Q has a full and an empty barrier of its own): eight computing warps (and four producer warps), each running the
  kernel's sequence of waits, arrivals, copies and GEMM issues, under many random interleavings, with copies landing and GEMMs
  reading shared memory at random later times. Every interleaving must finish (no deadlock, no
  parity aliasing), every GEMM must read the tile it means to, no copy may overwrite a stage a
  GEMM still reads, and every barrier must end balanced;
- the arithmetic of the deferred P V: S(i) and P V(i-1) in one turn, the softmax of tile i
  while P V(i-1) runs, O rescaled after it. Replayed in numpy against softmax attention, with
  causal masks, partial tiles and warpgroups whose rows lie past L or above a tile.

A change to the kernel's protocol has to be mirrored in `warp_program` below.
"""

import random

import numpy as np
import pytest

WARPS = 8  # two computing warpgroups of four warps: 256 threads
PRODUCER_WARPS = range(WARPS, WARPS + 4)  # the producer schedule's loading warpgroup


class MBarrier:
    """mbarrier.init / arrive / try_wait.parity: a phase completes after `count` arrivals."""

    def __init__(self, count):
        self.count = count
        self.pending = count
        self.phase = 0

    def arrive(self, k=1):
        assert 0 < k <= self.pending, "more arrivals than the phase expects"
        self.pending -= k
        if self.pending == 0:
            self.phase += 1
            self.pending = self.count

    def done(self, parity):
        # try_wait.parity P succeeds once the phase with parity P has completed, i.e. while the
        # current (incomplete) phase has the other parity. Two phases ahead looks incomplete.
        return (self.phase & 1) != parity


class TxBarrier(MBarrier):
    """An mbarrier that also counts transaction bytes (TMA): a phase completes once its
    arrivals are in and every byte announced with `arrive.expect_tx` has landed."""

    def __init__(self, count):
        super().__init__(count)
        self.tx = 0

    def _complete_if_due(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive_expect_tx(self, units):
        assert self.pending > 0, "more arrivals than the phase expects"
        self.tx += units
        self.pending -= 1
        self._complete_if_due()

    def complete_tx(self, units):
        assert self.tx >= units, "bytes landed that no arrival announced"
        self.tx -= units
        self._complete_if_due()


class NamedBarrier:
    """bar.sync / bar.arrive id, 256: completes when 256 threads have arrived."""

    def __init__(self):
        self.arrived = 0
        self.generation = 0

    def arrive(self, threads=32):
        self.arrived += threads
        assert self.arrived <= 256
        if self.arrived == 256:
            self.arrived = 0
            self.generation += 1


class Machine:
    def __init__(self, n, stages, rng, producer=False, tma=False, tiles=None, q_bufs=1):
        self.S, self.rng, self.tma = stages, rng, tma
        # The key tiles of each query block the block walks: one block (n), or with persistent
        # tiles several, whose iterations are numbered on (gi) across the block's tiles.
        self.persistent = tiles is not None
        self.tiles = list(tiles) if self.persistent else [n]
        # The warps that copy: all computing warps, or the producer's (with TMA, one thread of
        # its first warp).
        self.loaders = ([PRODUCER_WARPS[0]] if tma else
                        list(PRODUCER_WARPS if producer else range(WARPS)))
        self.full = ([TxBarrier(1) for _ in range(stages)] if tma else
                     [MBarrier(32 * len(self.loaders)) for _ in range(stages)])
        self.empty = [MBarrier(WARPS) for _ in range(stages)]
        self.turn = {1: NamedBarrier(), 2: NamedBarrier()}
        # tag[st][w]: which iteration's data loader w's share of stage st holds (-1: nothing yet)
        self.tag = [{w: -1 for w in self.loaders} for _ in range(stages)]
        self.copies = []       # in flight: (warp, seq, stage, iteration)
        every = WARPS + len(PRODUCER_WARPS)
        self.landed = [set() for _ in range(every)]
        self.arrivals = []     # cp.async.mbarrier.arrive in flight: (warp, seq, stage)
        self.seq = [0] * every
        self.reads = {}        # (warp, iteration, kind) -> stage, GEMM reads not yet done
        self.read_tile = {}    # (warp, iteration, "qk") -> the tile whose Q the GEMM reads
        # Persistent tiles: Q tiles (tile t uses Q tile t % q_bufs), each with its barriers,
        # the tile it holds, and Q copies in flight (tiles).
        self.QB = q_bufs
        # Persistent tiles: Q's barriers, the tile Q holds, and Q copies in flight (tiles).
        self.q_full = [TxBarrier(1) for _ in range(q_bufs)]
        self.q_empty = [MBarrier(WARPS) for _ in range(q_bufs)]
        self.q_tag = [-1] * q_bufs
        self.q_copies = []
        self.errors = []

    # --- what the kernel's threads do (per warp: its 32 threads act alike) ---
    def load_iter(self, w, it, st):
        seq = self.seq[w]
        self.seq[w] += 1
        if self.tma:
            # arrive.expect_tx first (the stage's one arrival, with its bytes), then the copies.
            self.full[st].arrive_expect_tx(1)
            self.copies.append((w, seq, st, it))
            return
        self.copies.append((w, seq, st, it))
        self.arrivals.append((w, seq, st))

    # --- the asynchronous side: copies landing, arrivals firing, GEMMs reading ---
    def load_q(self, tc):
        self.q_full[tc % self.QB].arrive_expect_tx(1)
        self.q_copies.append(tc)

    def async_events(self):
        ev = []
        for c in self.copies:
            ev.append(("land", c))
        for tc in self.q_copies:
            ev.append(("qland", tc))
        for a in self.arrivals:
            w, seq, _ = a
            if all(s in self.landed[w] for s in range(seq + 1)):
                ev.append(("arrive", a))
        for key in self.reads:
            ev.append(("read", key))
        return ev

    def fire(self, kind, item):
        if kind == "land":
            w, seq, st, it = item
            self.copies.remove(item)
            older = [k for k, s in self.reads.items() if s == st and k[1] != it]
            if older:
                self.errors.append(f"copy of iteration {it} into stage {st} while {older} still read it")
            self.tag[st][w] = it
            self.landed[w].add(seq)
            if self.tma:
                self.full[st].complete_tx(1)
        elif kind == "qland":
            tc = item
            self.q_copies.remove(tc)
            b = tc % self.QB
            older = [k for k, t in self.read_tile.items() if t != tc and t % self.QB == b]
            if older:
                self.errors.append(f"Q of tile {tc} landed while {older} still read its Q tile")
            self.q_tag[b] = tc
            self.q_full[b].complete_tx(1)
        elif kind == "arrive":
            w, seq, st = item
            self.arrivals.remove(item)
            self.full[st].arrive(32)
        else:  # a GEMM of warp w reads stage st for iteration i: K(i) for S, V(i - 1) for P V
            w, i, what = item
            st = self.reads.pop(item)
            want = i  # stage of iteration i holds K(i) and V(i - 1), loaded together
            if any(t != want for t in self.tag[st].values()):
                self.errors.append(f"warp {w} {what}({i}) read stage {st} holding {self.tag[st]}")
            tile = self.read_tile.pop(item, None)
            if self.persistent and tile is not None and self.q_tag[tile % self.QB] != tile:
                self.errors.append(f"warp {w} S({i}) of tile {tile} read Q of tile "
                                   f"{self.q_tag[tile % self.QB]}")


def warp_program(m, w, wait_empty=True, flip_parity=True, producer=False):
    """One computing warp of attn_body's ping-pong branch; yields a predicate whenever it
    blocks. With `producer` it copies nothing (the producer warps do). The two flags break the
    protocol on purpose (test_the_model_catches_broken_protocols). Iterations are numbered
    over the block's tiles (gi), as the stage counters run on from tile to tile."""
    S = m.S
    wg = w // 4
    for st in range(S if not producer else 0):  # prologue (Q rides with stage 0)
        if st <= m.tiles[0]:
            m.load_iter(w, st, st)
    st = pst = 0
    ph = pph = 0
    gi = 0
    for tc, n in enumerate(m.tiles):
        if wg == 1:
            m.turn[1].arrive()
        for i in range(n + 1):
            qk, pv = i < n, i > 0
            if m.persistent and i == n:
                m.q_empty[tc % m.QB].arrive(1)  # S(n - 1), Q's last reader, was waited for
            yield (lambda st=st, ph=ph: m.full[st].done(ph))
            if m.persistent and i == 0:
                yield (lambda tc=tc: m.q_full[tc % m.QB].done((tc // m.QB) & 1))
            gen = m.turn[1 + wg].generation
            m.turn[1 + wg].arrive()  # bar.sync: arrive, then wait for the barrier to complete
            yield (lambda gen=gen: m.turn[1 + wg].generation != gen)
            if qk:
                m.reads[(w, gi, "qk")] = st
                m.read_tile[(w, gi, "qk")] = tc
            if pv:
                m.reads[(w, gi, "pv")] = st
            if qk or wg == 0:
                m.turn[2 - wg].arrive()
            if not producer and i >= 1 and i - 1 + S <= n:
                if wait_empty:
                    yield (lambda pst=pst, pph=pph: m.empty[pst].done(pph))
                m.load_iter(w, i - 1 + S, pst)
            if qk:  # wgmma.wait_group 1 (or 0 without a P V): S(i) is done
                yield (lambda gi=gi: (w, gi, "qk") not in m.reads)
            yield (lambda gi=gi: (w, gi, "pv") not in m.reads and (w, gi, "qk") not in m.reads)
            m.empty[st].arrive(1)
            pst, pph = st, ph
            st += 1
            if st == S:
                st = 0
                if flip_parity:
                    ph ^= 1
            gi += 1


def producer_program(m, w, wait_empty=True, flip_parity=True, wait_q=True):
    """One warp of the producer warpgroup: Q with stage 0, then every iteration into its stage,
    once the computing warps released the stage's previous use (iteration gi - S, the
    (gi / S - 1)-th completion of empty[st]). With persistent tiles the iterations run on
    over the block's tiles, and each tile's Q follows its first K, once the computing warps
    released the last tile's Q (q_empty); `wait_q` False breaks that on purpose."""
    S = m.S
    gi = 0
    for tc, n in enumerate(m.tiles):
        for it in range(n + 1):
            st = gi % S
            if gi >= S and wait_empty:
                parity = (gi // S - 1) & 1 if flip_parity else 0
                yield (lambda st=st, parity=parity: m.empty[st].done(parity))
            m.load_iter(w, gi, st)
            if m.persistent and it == 0:
                if tc >= m.QB and wait_q:
                    yield (lambda tc=tc: m.q_empty[tc % m.QB].done((tc // m.QB - 1) & 1))
                m.load_q(tc)
            gi += 1


def run_schedule(n, stages, seed, producer=False, tma=False, tiles=None, q_bufs=1,
                 **program_flags):
    rng = random.Random(seed)
    m = Machine(n, stages, rng, producer=producer or tma, tma=tma, tiles=tiles, q_bufs=q_bufs)
    if producer or tma:
        progs = {w: warp_program(m, w, producer=True) for w in range(WARPS)}
        progs.update({w: producer_program(m, w, **program_flags) for w in m.loaders})
    else:
        progs = {w: warp_program(m, w, **program_flags) for w in range(WARPS)}
    waiting = {w: None for w in progs}
    finished = set()
    for _ in range(1_000_000):
        runnable = [w for w in progs if w not in finished and (waiting[w] is None or waiting[w]())]
        events = m.async_events()
        if not runnable and not events:
            break
        # Asynchronous work goes at random moments, sometimes long after it could.
        if events and (not runnable or rng.random() < 0.3):
            kind, item = rng.choice(events)
            m.fire(kind, item)
            continue
        w = rng.choice(runnable)
        try:
            waiting[w] = next(progs[w])
        except StopIteration:
            finished.add(w)
    assert not m.errors, m.errors[:3]
    stuck = sorted(set(progs) - finished)
    assert not stuck, f"deadlock: warps {stuck} blocked (n={n}, stages={stages}, seed={seed})"
    assert all(b.arrived == 0 for b in m.turn.values()), "a named barrier ends with stray arrivals"
    assert all(b.pending == b.count for b in m.full), "a full barrier ends mid-phase"
    assert not m.copies and not m.arrivals and not m.reads and not m.q_copies
    # Each stage was filled once per iteration that uses it.
    total = sum(t + 1 for t in m.tiles)
    assert [b.phase for b in m.full] == [len(range(s, total, stages)) for s in range(stages)]
    if m.persistent:
        for b in range(m.QB):
            uses = len(range(b, len(m.tiles), m.QB))
            assert m.q_full[b].phase == m.q_empty[b].phase == uses


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_protocol_never_deadlocks_or_reads_a_wrong_tile(n, stages):
    for seed in range(60):
        run_schedule(n, stages, seed)


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_the_producer_schedule_never_deadlocks_or_reads_a_wrong_tile(n, stages):
    for seed in range(60):
        run_schedule(n, stages, seed, producer=True)


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_the_tma_producer_schedule_never_deadlocks_or_reads_a_wrong_tile(n, stages):
    for seed in range(60):
        run_schedule(n, stages, seed, tma=True)


@pytest.mark.parametrize("q_bufs", [1, 2])
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("tiles", [[1], [2, 1], [3, 1, 2], [1, 1, 1, 1], [4, 2, 7]])
def test_persistent_tiles_never_deadlock_or_read_a_wrong_tile_or_q(tiles, stages, q_bufs):
    for seed in range(40):
        run_schedule(0, stages, seed, tma=True, tiles=tiles, q_bufs=q_bufs)


@pytest.mark.parametrize("flags", [{"wait_q": False}, {"wait_empty": False}, {"flip_parity": False}])
def test_the_model_catches_broken_persistent_protocols(flags):
    # Q reloaded before the computing warps released it (three stages let the producer reach
    # the next tile while S of this one is still running), and the stage breaks as above.
    failures = 0
    for seed in range(40):
        try:
            run_schedule(0, 3, seed, tma=True, tiles=[3, 3, 2], **flags)
        except AssertionError:
            failures += 1
    assert failures > 0


@pytest.mark.parametrize("schedule", ["pingpong", "producer", "producer_tma"])
@pytest.mark.parametrize("flags", [{"wait_empty": False}, {"flip_parity": False}])
def test_the_model_catches_broken_protocols(flags, schedule):
    # A refill that does not wait for the stage's release, or a wait that never flips its
    # parity, must fail under some interleaving, or the check above proves nothing.
    failures = 0
    for seed in range(40):
        try:
            run_schedule(5, 2, seed, producer=schedule == "producer",
                         tma=schedule == "producer_tma", **flags)
        except AssertionError:
            failures += 1
    assert failures > 0


# ------------------------------------------------------------------------------ the arithmetic
def pingpong_attention(q, k, v, causal, block_m=128, block_n=64, causal_skip=True):
    """One head, the schedule's order of operations per 64-row warpgroup, in float64."""
    L, D = q.shape
    sc = 1.0 / np.sqrt(D)
    out = np.full((L, D), np.nan)
    for m0 in range(0, L, block_m):
        n_stop = min(L, m0 + block_m) if (causal and causal_skip) else L
        n = -(-n_stop // block_n)
        for wg in range(block_m // 64):
            rows = np.arange(m0 + 64 * wg, m0 + 64 * wg + 64)
            qz = np.zeros((64, D))
            ok = rows < L
            qz[ok] = q[rows[ok]]
            o = np.zeros((64, D))
            mrow = np.full(64, -np.inf)
            lrow = np.zeros(64)
            p = None
            for i in range(n + 1):
                s = None
                if i < n:  # turn: S(i) ...
                    keys = np.arange(i * block_n, (i + 1) * block_n)
                    kz = np.zeros((block_n, D))
                    kz[keys < L] = k[keys[keys < L]]
                    s = qz @ kz.T
                if i > 0:  # ... and P V(i - 1), on O as the previous iteration left it
                    keys = np.arange((i - 1) * block_n, i * block_n)
                    vz = np.zeros((block_n, D))
                    vz[keys < L] = v[keys[keys < L]]
                    o = o + p @ vz
                if s is None:
                    continue
                keys = np.arange(i * block_n, (i + 1) * block_n)
                mask = (keys[None, :] >= L) | (causal & (keys[None, :] > rows[:, None]))
                s = np.where(mask, -np.inf, s)
                m_new = np.maximum(mrow, s.max(axis=1))
                m_use = np.where(m_new == -np.inf, 0.0, m_new * sc)
                corr = np.exp(mrow * sc - m_use)
                p = np.exp(s * sc - m_use[:, None])
                lrow = lrow * corr + p.sum(axis=1)
                mrow = m_new
                o = o * corr[:, None]  # after the wait for P V(i - 1)
            out[rows[ok]] = (o / lrow[:, None])[ok]
    return out


def reference(q, k, v, causal):
    L, D = q.shape
    s = q @ k.T / np.sqrt(D)
    if causal:
        s = np.where(np.arange(L)[None, :] > np.arange(L)[:, None], -np.inf, s)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


@pytest.mark.parametrize("L", [1, 33, 64, 65, 127, 128, 129, 200, 300])
@pytest.mark.parametrize("block_n", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_deferred_pv_matches_softmax_attention(L, block_n, causal):
    rng = np.random.default_rng(L * 7 + block_n + causal)
    q, k, v = (rng.standard_normal((L, 64)) for _ in range(3))
    want = reference(q, k, v, causal)
    for skip in (True, False):
        got = pingpong_attention(q, k, v, causal, block_n=block_n, causal_skip=skip)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
