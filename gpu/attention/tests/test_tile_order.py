"""The order in which the attention kernels take their work items, checked on the CPU with the
template's own code.

The functions that map a launch (block_coords) or a persistent block's k-th turn (tile_index,
tile_coords) to a query block and head are cut out of a rendered kernel
(tasks/attention/templates-cuda/device.cuh.j2) and compiled for the host with the C++ compiler,
with gridDim and blockIdx as plain variables. A small driver prints every block's work items;
the checks here hold for what it prints:

- every (query block, head) is done exactly once, by one block per work item or by the
  persistent blocks' turns together;
- under heavy_first, the heads go in sections whose K and V fit the L2 budget together (at
  least one head each), one section after the other, longest query blocks first within each;
  where every head fits, the order is the plain longest-first one over all heads;
- the natural order takes the query block fastest.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import family  # noqa: E402

CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")

DRIVER = r"""
#include <cstdio>
#include <cstdlib>
struct ksa_dim3 { unsigned x, y, z; };
static ksa_dim3 gridDim, blockIdx;
#define __device__
#define __forceinline__ inline
namespace ksa {
using i64 = long long;
constexpr bool HEAVY_FIRST = %(heavy)s;
%(code)s
}
template <int D> static void run(bool causal, bool persistent, int nq, int nbh, int L, int grid) {
  if (persistent) {
    gridDim = {static_cast<unsigned>(grid), 1, 1};
    for (int b = 0; b < grid; ++b) {
      blockIdx = {static_cast<unsigned>(b), 0, 0};
      for (int k = 0, tile; (tile = causal ? ksa::tile_index<true>(k, nq * nbh)
                                           : ksa::tile_index<false>(k, nq * nbh)) >= 0; ++k) {
        int qblk, bh;
        if (causal) ksa::tile_coords<true, D>(tile, nq, nbh, L, qblk, bh);
        else ksa::tile_coords<false, D>(tile, nq, nbh, L, qblk, bh);
        std::printf("%%d %%d %%d %%d %%d\n", b, k, tile, qblk, bh);
      }
    }
    return;
  }
  // One block per work item: launch order x fastest, then y (heads), z (batch: one here).
  gridDim = {static_cast<unsigned>(nq), static_cast<unsigned>(nbh), 1};
  for (int h = 0; h < nbh; ++h)
    for (int x = 0; x < nq; ++x) {
      blockIdx = {static_cast<unsigned>(x), static_cast<unsigned>(h), 0};
      int qblk, bh;
      if (causal) ksa::block_coords<true, D>(L, qblk, bh);
      else ksa::block_coords<false, D>(L, qblk, bh);
      std::printf("%%d 0 %%d %%d %%d\n", x + nq * h, x + nq * h, qblk, bh);
    }
}
int main(int argc, char** argv) {
  const int D = std::atoi(argv[1]), causal = std::atoi(argv[2]), persistent = std::atoi(argv[3]);
  const int nq = std::atoi(argv[4]), nbh = std::atoi(argv[5]), L = std::atoi(argv[6]);
  const int grid = std::atoi(argv[7]);
  if (D == 64) run<64>(causal, persistent, nq, nbh, L, grid);
  else run<128>(causal, persistent, nq, nbh, L, grid);
  return 0;
}
"""

BUDGET = 32 << 20  # L2_SECTION_BYTES of device.cuh.j2


def scheduling_code(source: str) -> str:
    """The template's scheduling functions, as rendered: from the L2 budget through
    tile_coords (the persistent kernels') or block_coords."""
    start = source.index("constexpr i64 L2_SECTION_BYTES")
    end = source.index("__device__ __forceinline__ u32 smem_u32")
    code = source[start:end]
    assert "tile_coords" in code and "block_coords" in code, "a persistent variant's source"
    return code


@pytest.fixture(scope="module")
def drivers(tmp_path_factory):
    if CXX is None:
        pytest.skip("no C++ compiler on PATH")
    variants = family.load_variants()
    name = "wg_m128n128s3_prodtma_pers"
    out = {}
    for schedule in ("heavy_first", "natural"):
        knobs = dict(variants[name], schedule=schedule)
        source = family.cuda().render(knobs)
        heavy = re.search(r"constexpr bool HEAVY_FIRST = (true|false);", source).group(1)
        assert heavy == ("true" if schedule == "heavy_first" else "false")
        d = tmp_path_factory.mktemp(schedule)
        (d / "driver.cpp").write_text(DRIVER % {"heavy": heavy, "code": scheduling_code(source)})
        subprocess.run([CXX, "-std=c++17", "-O1", "-o", str(d / "driver"), str(d / "driver.cpp")],
                       check=True, capture_output=True, text=True)
        out[schedule] = d / "driver"
    return out


def order(driver: Path, D: int, causal: bool, persistent: bool, nq: int, nbh: int, L: int,
          grid: int = 0) -> list[tuple[int, int, int, int, int]]:
    """(block, turn, work item in launch order, query block, head) of every work item."""
    args = [str(a) for a in (D, int(causal), int(persistent), nq, nbh, L, grid)]
    text = subprocess.run([str(driver), *args], check=True, capture_output=True, text=True).stdout
    return [tuple(int(x) for x in line.split()) for line in text.splitlines()]


def heads_per_section(L: int, D: int, nbh: int) -> int:
    return max(1, min(nbh, BUDGET // (L * D * 4)))


# (D, L, heads): every head fits, two full sections, a last section that is partial, one head
# per section (a head's K and V alone exceed the budget).
SHAPES = [(128, 1024, 8), (128, 1024, 128), (64, 1000, 300), (128, 2048, 40), (128, 1 << 17, 3),
          (64, 4096, 70)]


@pytest.mark.parametrize("D,L,nbh", SHAPES)
@pytest.mark.parametrize("persistent", [False, True])
def test_heavy_first_goes_longest_first_within_sections_that_fit_l2(drivers, D, L, nbh,
                                                                     persistent):
    nq = -(-L // 128)
    if nq * nbh > 200_000:
        nq = 8  # L only sets the section size; keep the listing short
    items = order(drivers["heavy_first"], D, True, persistent, nq, nbh, L, grid=132)
    assert len(items) == nq * nbh
    assert sorted((q, h) for *_, q, h in items) == [(q, h) for q in range(nq) for h in range(nbh)]
    by_item = sorted(items, key=lambda it: it[2])
    assert [it[2] for it in by_item] == list(range(nq * nbh))
    hs = heads_per_section(L, D, nbh)
    for lin, (*_, q, h) in enumerate(x[2:] for x in by_item):
        section = h // hs
        first, heads = section * hs, min(hs, nbh - section * hs)
        assert first * nq <= lin < (first + heads) * nq, "sections one after the other"
        w = lin - first * nq
        assert (q, h) == (nq - 1 - w // heads, first + w % heads), "longest first in a section"
    if hs == nbh:  # the plain longest-first order over every head
        assert [(q, h) for *_, q, h in by_item] == [(nq - 1 - lin // nbh, lin % nbh)
                                                    for lin in range(nq * nbh)]
    if L * D * 4 <= BUDGET:
        assert hs * L * D * 4 <= BUDGET


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("persistent", [False, True])
def test_the_natural_order_takes_the_query_block_fastest(drivers, causal, persistent):
    nq, nbh = 9, 13
    items = order(drivers["natural"], 128, causal, persistent, nq, nbh, 1100, grid=20)
    by_item = sorted(items, key=lambda it: it[2])
    assert [(q, h) for *_, q, h in by_item] == [(lin % nq, lin // nq) for lin in range(nq * nbh)]


def test_persistent_turns_snake_under_causal_masking(drivers):
    """Block b takes items b, 2G - 1 - b, 2G + b, ... (G blocks), so the block that took one of
    a round's longest tiles takes one of the next round's shortest."""
    G, nq, nbh = 7, 5, 6
    items = order(drivers["heavy_first"], 128, True, True, nq, nbh, 640, grid=G)
    for b, k, lin, *_ in items:
        assert lin == k * G + (G - 1 - b if k % 2 else b)
    turns = order(drivers["heavy_first"], 128, False, True, nq, nbh, 640, grid=G)
    assert all(lin == k * G + b for b, k, lin, *_ in turns)  # dealt round robin otherwise
