"""A stand-in for a language model that answers after a delay, for `ksearch run --proposer
command`: how busy a search keeps the device while its proposer takes seconds per call (issue:
evaluation at search speed; gpu/slow_proposer_check.sh runs it).

    ksearch run --task attention --backend cuda --proposer command \
        --command "python3 gpu/scripted_proposer.py" --samples 4

ksearch gives each call's role in KSEARCH_ROLE and the prompt on stdin. Code roles
(`code-*`) get the next kernel file of KSEARCH_AGENT_KERNELS (a directory, files in name order,
taken in turn across calls: a counter file beside them, under a lock); the world-model roles
get small valid edits in the shape the prompts ask for (the plan of `wm-init`, one idea per
`wm-propose`, a note on the node a `wm-refine` or `wm-too-hard` names). Every answer waits
KSEARCH_AGENT_DELAY seconds first (default 10), as a model endpoint's latency would.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
import time
from pathlib import Path


def next_kernel(directory: Path) -> str:
    files = sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise SystemExit(f"no kernel files in {directory}")
    with open(directory / ".counter", "a+") as counter:
        fcntl.flock(counter, fcntl.LOCK_EX)
        counter.seek(0)
        text = counter.read().strip()
        n = int(text) if text.isdigit() else 0
        counter.seek(0)
        counter.truncate()
        counter.write(str(n + 1))
    return files[n % len(files)].read_text()


def node_after(prompt: str, marker: str) -> str:
    m = re.search(re.escape(marker) + r"\s+([A-Za-z0-9_-]+)", prompt)
    return m.group(1) if m else "root"


def action(label: str, title: str, factor: float) -> dict:
    return {"label": label, "decision": "kernel structure", "choice": label,
            "overall_rating": 6, "confidence": 0.4,
            "action": {"title": title, "difficulty": 2, "score": 0.7,
                       "expected_vs_baseline_factor": factor}}


def answer(role: str, prompt: str, kernels: Path) -> str:
    if role.startswith("code"):
        fence = "cuda" if "__global__" in (src := next_kernel(kernels)) else "c"
        return f"Here is the kernel.\n```{fence}\n{src}\n```\n"
    if role == "wm-init":
        plan = {"kernel_summary": "Scripted: the kernels of a fixed list, one per request.",
                "open_questions": ["How busy does the device stay?"],
                "ops": [{"op": "insert", "parent_id": "root",
                         "node": action(f"idea-{i}", f"Scripted idea {i}", 1.2 + i / 10)}
                        for i in range(3)]}
        return f"Plan below.\n```json\n{json.dumps(plan, indent=1)}\n```\n"
    if role == "wm-propose":
        n = int(time.time() * 1000) % 100000
        return json.dumps({"ops": [{"op": "insert", "parent_id": "root",
                                    "node": action(f"more-{n}", f"Scripted idea {n}", 1.1)}]})
    if role == "wm-refine":
        node = node_after(prompt, "now attached to node")
        return json.dumps({"ops": [{"op": "update", "node_id": node, "set": {
            "notes": "CURRENT: scripted. FOLLOW_THROUGH: no. UPDATE_BELIEF: none.",
            "confidence": 0.5}}]})
    if role == "wm-too-hard":
        node = node_after(prompt, "closed node")
        return json.dumps({"ops": [{"op": "update", "node_id": node,
                                    "set": {"notes": "failed: scripted", "overall_rating": 2}}]})
    raise SystemExit(f"scripted proposer: no answer for role {role!r}")


def main() -> int:
    role = os.environ.get("KSEARCH_ROLE", "")
    kernels = Path(os.environ.get("KSEARCH_AGENT_KERNELS", "."))
    delay = float(os.environ.get("KSEARCH_AGENT_DELAY", "10"))
    prompt = sys.stdin.read()
    time.sleep(delay)
    sys.stdout.write(answer(role, prompt, kernels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
