"""The order in which the attention kernels take their work items, checked on the CPU with the
template's own code.

The functions that map a launch (block_coords) or a persistent block's k-th turn (tile_index,
tile_coords) to a query block and head are cut out of a rendered kernel
(tasks/attention/templates-cuda/device.cuh.j2) and compiled for the host with the C++ compiler,
with gridDim and blockIdx as plain variables. A small driver prints every block's work items;
the checks here hold for what it prints:

- every (query block, head) is done exactly once, by one block per work item or by the
  persistent blocks' turns together;
- under heavy_first the longest query blocks of every head go first, in both launch orders;
- persistent turns snake under causal masking and are dealt round robin otherwise;
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
constexpr bool HEAVY_FIRST = %(heavy)s;
%(code)s
}
// Prints "block turn item qblk head" for every work item.
static void run(bool causal, bool persistent, int nq, int nbh, int grid) {
  if (persistent) {
    gridDim = {static_cast<unsigned>(grid), 1, 1};
    for (int b = 0; b < grid; ++b) {
      blockIdx = {static_cast<unsigned>(b), 0, 0};
      for (int k = 0, tile; (tile = causal ? ksa::tile_index<true>(k, nq * nbh)
                                           : ksa::tile_index<false>(k, nq * nbh)) >= 0; ++k) {
        int qblk, bh;
        if (causal) ksa::tile_coords<true>(tile, nq, nbh, qblk, bh);
        else ksa::tile_coords<false>(tile, nq, nbh, qblk, bh);
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
      if (causal) ksa::block_coords<true>(qblk, bh);
      else ksa::block_coords<false>(qblk, bh);
      std::printf("%%d 0 %%d %%d %%d\n", x + nq * h, x + nq * h, qblk, bh);
    }
}
int main(int argc, char** argv) {
  if (argc != 6) return 2;
  run(std::atoi(argv[1]), std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]),
      std::atoi(argv[5]));
  return 0;
}
"""


def scheduling_code(source: str) -> str:
    """The template's scheduling functions as rendered: block_coords through tile_coords (a
    persistent variant's source)."""
    start = source.index("template <bool CAUSAL>\n__device__ __forceinline__ void block_coords")
    end = source.index("__device__ __forceinline__ u32 smem_u32")
    code = source[start:end]
    assert "tile_coords" in code and "block_coords" in code, "a persistent variant's source"
    return code


@pytest.fixture(scope="module")
def drivers(tmp_path_factory):
    if CXX is None:
        pytest.skip("no C++ compiler on PATH")
    variants = family.load_variants()
    out = {}
    for schedule in ("heavy_first", "natural"):
        knobs = dict(variants["wg_m128n128s3_prodtma_pers"], schedule=schedule)
        source = family.cuda().render(knobs)
        heavy = re.search(r"constexpr bool HEAVY_FIRST = (true|false);", source).group(1)
        assert heavy == ("true" if schedule == "heavy_first" else "false")
        d = tmp_path_factory.mktemp(schedule)
        (d / "driver.cpp").write_text(DRIVER % {"heavy": heavy, "code": scheduling_code(source)})
        subprocess.run([CXX, "-std=c++17", "-O1", "-o", str(d / "driver"), str(d / "driver.cpp")],
                       check=True, capture_output=True, text=True)
        out[schedule] = d / "driver"
    return out


def order(driver: Path, causal: bool, persistent: bool, nq: int, nbh: int,
          grid: int = 0) -> list[tuple[int, ...]]:
    """(block, turn, work item in launch order, query block, head) of every work item."""
    args = [str(a) for a in (int(causal), int(persistent), nq, nbh, grid)]
    text = subprocess.run([str(driver), *args], check=True, capture_output=True, text=True).stdout
    return [tuple(int(x) for x in line.split()) for line in text.splitlines()]


def by_item(items: list[tuple[int, ...]], nq: int, nbh: int) -> list[tuple[int, int]]:
    """(query block, head) of each work item in launch order, once every item is seen to be
    done exactly once."""
    assert len(items) == nq * nbh
    assert sorted((q, h) for *_, q, h in items) == [(q, h) for q in range(nq) for h in range(nbh)]
    ordered = sorted(items, key=lambda it: it[2])
    assert [it[2] for it in ordered] == list(range(nq * nbh))
    return [(q, h) for *_, q, h in ordered]


def longest_first(nq: int, nbh: int) -> list[tuple[int, int]]:
    return [(nq - 1 - lin // nbh, lin % nbh) for lin in range(nq * nbh)]


# (query blocks, heads, persistent blocks): more tiles than blocks in several shapes of rounds,
# more query blocks than a round takes, fewer tiles than blocks.
SHAPES = [(8, 128, 132), (32, 32, 132), (2, 512, 132), (64, 8, 132), (9, 50, 20), (200, 3, 132),
          (4, 5, 64)]


@pytest.mark.parametrize("nq,nbh,grid", SHAPES)
@pytest.mark.parametrize("persistent", [False, True])
def test_heavy_first_takes_the_longest_query_blocks_of_every_head_first(drivers, nq, nbh, grid,
                                                                        persistent):
    blocks = min(grid, nq * nbh)  # the entry point launches no more blocks than tiles
    got = by_item(order(drivers["heavy_first"], True, persistent, nq, nbh, blocks), nq, nbh)
    assert got == longest_first(nq, nbh)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("persistent", [False, True])
def test_the_natural_order_takes_the_query_block_fastest(drivers, causal, persistent):
    nq, nbh = 9, 13
    got = by_item(order(drivers["natural"], causal, persistent, nq, nbh, grid=20), nq, nbh)
    assert got == [(lin % nq, lin // nq) for lin in range(nq * nbh)]


@pytest.mark.parametrize("schedule", ["heavy_first", "natural"])
def test_persistent_turns_snake_under_causal_masking(drivers, schedule):
    """Block b takes items b, 2G - 1 - b, 2G + b, ... (G blocks), so the block that took one of
    a round's longest tiles takes one of the next round's shortest; dealt round robin
    without causal masking."""
    G, nq, nbh = 7, 5, 6
    for b, k, lin, *_ in order(drivers[schedule], True, True, nq, nbh, G):
        assert lin == k * G + (G - 1 - b if k % 2 else b)
    for b, k, lin, *_ in order(drivers[schedule], False, True, nq, nbh, G):
        assert lin == k * G + b


def test_heavy_first_evens_the_persistent_blocks_work(drivers):
    """With a query block's cost its key tiles (qblk + 1), no persistent block's total exceeds
    the mean by more than the longest tile."""
    for nq, nbh in [(8, 128), (32, 32), (64, 8), (8, 64)]:
        work = [0] * 132
        for b, _, _, q, _ in order(drivers["heavy_first"], True, True, nq, nbh, 132):
            work[b] += q + 1
        mean = sum(work) / len(work)
        assert max(work) <= mean + nq, (nq, nbh, max(work), mean)
