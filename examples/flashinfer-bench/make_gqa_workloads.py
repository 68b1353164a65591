"""Writes the workloads of the example definition gqa_paged_decode_h32_kv4_d128_ps1: one
workload trace line each (workloads/gqa_paged/...jsonl) and the safetensors file holding its
kv_indptr and kv_indices (blob/workloads/gqa_paged/...). Deterministic (numpy seed 2026);
needs only numpy. Run from this directory: `python make_gqa_workloads.py`.

Each request's tokens sit on distinct, scattered pages of a cache with a quarter more pages
than tokens, as a serving system's page allocator leaves them.
"""

import json
import uuid
from pathlib import Path

import numpy as np

NAME = "gqa_paged_decode_h32_kv4_d128_ps1"
HERE = Path(__file__).resolve().parent
# (batch sizes, token counts per request): a long single request, mixed lengths, many short
# ones, an odd batch with odd and tiny lengths (held out by the import: every fourth), and a
# uniform batch.
SHAPES = [
    [4096],
    "16:256-1024",
    "64:128-512",
    [1, 33, 777, 1001, 5, 250, 3],
    [512] * 32,
]


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        data = np.ascontiguousarray(a.astype("<i4")).tobytes()
        header[name] = {"dtype": "I32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    head = json.dumps(header).encode()
    path.write_bytes(len(head).to_bytes(8, "little") + head + b"".join(blobs))


def main() -> None:
    rng = np.random.default_rng(2026)
    blob_dir = HERE / "blob" / "workloads" / "gqa_paged" / NAME
    blob_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, shape in enumerate(SHAPES):
        if isinstance(shape, str):
            batch, span = shape.split(":")
            lo, hi = map(int, span.split("-"))
            lengths = rng.integers(lo, hi + 1, size=int(batch)).tolist()
        else:
            lengths = list(shape)
        total = sum(lengths)
        num_pages = total + total // 4
        indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        indices = rng.permutation(num_pages)[:total].astype(np.int32)
        uid = str(uuid.UUID(int=int(rng.integers(0, 2**63)) << 64 | i))
        rel = Path("blob") / "workloads" / "gqa_paged" / NAME / f"{NAME}_{uid}.safetensors"
        write_safetensors(HERE / rel, {"kv_indptr": indptr, "kv_indices": indices})
        blob = lambda key: {"type": "safetensors", "path": rel.as_posix(), "tensor_key": key}
        lines.append(json.dumps({
            "definition": NAME, "solution": None, "evaluation": None,
            "workload": {
                "uuid": uid,
                "axes": {"batch_size": len(lengths), "num_pages": num_pages,
                         "len_indptr": len(lengths) + 1, "num_kv_indices": total},
                "inputs": {"q": {"type": "random"}, "k_cache": {"type": "random"},
                           "v_cache": {"type": "random"}, "kv_indptr": blob("kv_indptr"),
                           "kv_indices": blob("kv_indices"),
                           "sm_scale": {"type": "scalar", "value": 1 / np.sqrt(128.0)}},
            },
        }))
    out = HERE / "workloads" / "gqa_paged" / f"{NAME}.jsonl"
    out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
