"""gpu/scripted_proposer.py, the delayed stand-in for a model that gpu/slow_proposer_check.sh
runs: kernels in turn for code roles, valid world-model edits for the others."""

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import scripted_proposer as sp  # noqa: E402


def fenced(text):
    return re.search(r"```(\w+)\n(.*)```", text, re.S)


def test_code_roles_take_the_kernels_in_turn(tmp_path):
    (tmp_path / "a.cu").write_text("__global__ void a() {}")
    (tmp_path / "b.c").write_text("void b(void) {}")
    got = [fenced(sp.answer(role, "", tmp_path)) for role in
           ("code-spec-action", "code-improve", "code-debug")]
    assert [(m.group(1), m.group(2).strip()) for m in got] == [
        ("cuda", "__global__ void a() {}"), ("c", "void b(void) {}"),
        ("cuda", "__global__ void a() {}")]


def test_world_model_roles_get_edits_on_the_nodes_their_prompts_name(tmp_path):
    plan = json.loads(fenced(sp.answer("wm-init", "", tmp_path)).group(2))
    assert [op["op"] for op in plan["ops"]] == ["insert"] * 3
    assert all(op["node"]["action"]["title"] for op in plan["ops"])
    proposed = json.loads(sp.answer("wm-propose", "", tmp_path))
    assert proposed["ops"][0]["parent_id"] == "root"
    refined = json.loads(sp.answer("wm-refine", "... now attached to node n7. More.", tmp_path))
    assert refined["ops"][0]["node_id"] == "n7"
    closed = json.loads(sp.answer("wm-too-hard", "the closed node n12: why", tmp_path))
    assert closed["ops"][0]["node_id"] == "n12"
    with pytest.raises(SystemExit):
        sp.answer("something-else", "", tmp_path)
