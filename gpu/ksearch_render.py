"""Template families rendered by ksearch itself, for the tools under gpu/.

ksearch owns the template families (tasks/*/templates-*/: family.toml and minijinja templates):
it fills defaults, checks domains and constraints, and renders. This module is a client of
`ksearch tasks --render` (docs/cli.md); it renders nothing and checks nothing on its own, so a
tool measures exactly the code a search would render, and an invalid setting fails with
ksearch's message (RenderError).

    fam = Family("attention", "cuda")
    knobs = fam.resolve({"algo": "mma"})          # complete setting, or RenderError
    src = fam.render({"algo": "mma"})             # the entry template's source
    dev = fam.render(knobs, template="device.cuh.j2")
    replies = fam.batch([{"knobs": k} for k in settings])   # one process for many settings
    named = fam.variants(path)                    # {name: complete knobs} of a variants file
    every = fam.enumerate()                       # every valid setting

The binary: $KSEARCH_BIN, else `ksearch` on PATH, else this checkout's target/debug/ksearch or
target/release/ksearch (the newer). `ksearch bench mamba` sets KSEARCH_BIN to itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


class RenderError(ValueError):
    """ksearch rejected a setting or could not render (the message is ksearch's)."""


def binary() -> str:
    """The ksearch binary to ask (see the module docstring for the order)."""
    explicit = os.environ.get("KSEARCH_BIN")
    if explicit:
        if not Path(explicit).is_file():
            raise RenderError(f"KSEARCH_BIN={explicit} is not a file")
        return explicit
    on_path = shutil.which("ksearch")
    if on_path:
        return on_path
    built = [p for p in (REPO / "target" / "debug" / "ksearch", REPO / "target" / "release" / "ksearch")
             if p.is_file()]
    if built:
        return str(max(built, key=lambda p: p.stat().st_mtime))
    raise RenderError("no ksearch binary: set KSEARCH_BIN, put ksearch on PATH, or build this "
                      "checkout (cargo build -p ksearch-cli)")


def _task_arg(task: str) -> str:
    # In a checkout, its own task directory, so an installed ksearch renders these templates;
    # elsewhere (the bench's extracted copy) the name, which ksearch resolves itself.
    local = REPO / "tasks" / task
    return str(local) if (local / "task.toml").is_file() else task


def _key(knobs: dict[str, Any]) -> str:
    return json.dumps(knobs, sort_keys=True)


class Family:
    """The template family of `task` for `backend` (rendering for `target`, else its first)."""

    def __init__(self, task: str, backend: str, target: str | None = None):
        self.task, self.backend, self.target = task, backend, target
        self._description: dict[str, Any] | None = None
        self._resolved: dict[str, dict[str, Any]] = {}

    def _run(self, *args: str, stdin: str | None = None) -> str:
        cmd = [binary(), "tasks", "--render", _task_arg(self.task), "--backend", self.backend]
        if self.target:
            cmd += ["--target", self.target]
        proc = subprocess.run(cmd + list(args), input=stdin, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RenderError(proc.stderr.strip().removeprefix("error: "))
        return proc.stdout

    def batch(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """ksearch's replies to `requests` (see ksearch_knowledge::render::Request), in order:
        {"name", "knobs", "variant_id", "knob_summary", "source"} or {"name", "error"}."""
        if not requests:
            return []
        text = "".join(json.dumps(r) + "\n" for r in requests)
        replies = [json.loads(line) for line in self._run("--batch", stdin=text).splitlines()]
        if len(replies) != len(requests):
            raise RenderError(f"ksearch answered {len(replies)} of {len(requests)} requests")
        return replies

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """ksearch's reply to one request; an error reply raises RenderError."""
        (reply,) = self.batch([request])
        if "error" in reply:
            raise RenderError(reply["error"])
        return reply

    def describe(self) -> dict[str, Any]:
        """The family: name, entry, targets, knobs (name, values, default, description), rules."""
        if self._description is None:
            self._description = self.ask({"describe": True})["family"]
        return self._description

    @property
    def name(self) -> str:
        return self.describe()["name"]

    @property
    def knob_names(self) -> list[str]:
        return [k["name"] for k in self.describe()["knobs"]]

    def defaults(self) -> dict[str, Any]:
        return {k["name"]: k["default"] for k in self.describe()["knobs"]}

    def setting(self, knobs: dict[str, Any] | None = None) -> dict[str, Any]:
        """The complete setting with its labels: knobs, variant_id, knob_summary."""
        return self.ask({"knobs": dict(knobs or {}), "source": False})

    def resolve(self, knobs: dict[str, Any] | None = None) -> dict[str, Any]:
        """Defaults filled in; unknown knobs, values outside a domain, broken rules raise."""
        key = _key(dict(knobs or {}))
        if key not in self._resolved:
            self._resolved[key] = self.setting(knobs)["knobs"]
        return dict(self._resolved[key])

    def render(self, knobs: dict[str, Any] | None = None, template: str | None = None,
               target: str | None = None) -> str:
        """The entry template's source (or `template`'s) for `knobs`, defaults filled in."""
        request: dict[str, Any] = {"knobs": dict(knobs or {})}
        if template:
            request["template"] = template
        if target:
            request["target"] = target
        return self.ask(request)["source"]

    def render_many(self, settings: list[dict[str, Any]], template: str | None = None) -> list[str]:
        """The sources of many settings in one call; the first invalid one raises."""
        extra = {"template": template} if template else {}
        out = []
        for reply in self.batch([{"knobs": dict(k), **extra} for k in settings]):
            if "error" in reply:
                raise RenderError(reply["error"])
            out.append(reply["source"])
        return out

    def enumerate(self) -> list[dict[str, Any]]:
        """Every valid setting, in ksearch's order (the last knob varies fastest)."""
        return [json.loads(line)["knobs"] for line in self._run("--list").splitlines()]

    def variants(self, path: Path) -> dict[str, dict[str, Any]]:
        """The named settings of a variants file, completed and checked by ksearch."""
        lines = self._run("--list", str(path)).splitlines()
        return {s["name"]: s["knobs"] for s in map(json.loads, lines)}

    def restrict(self, knobs: dict[str, Any]) -> dict[str, Any]:
        """`knobs` less those this family does not declare: a setting of a sibling family with
        more knobs (attention's cuda family has min_blocks, which MLX kernels cannot use)."""
        names = set(self.knob_names)
        return {k: v for k, v in knobs.items() if k in names}


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    ap = argparse.ArgumentParser(description="Render a named variant or a setting with ksearch.")
    ap.add_argument("task")
    ap.add_argument("backend")
    ap.add_argument("knobs", nargs="*", metavar="KNOB=VALUE", help="passed on as --set")
    ap.add_argument("--variants", type=Path, help="variants file; with --name renders that one")
    ap.add_argument("--name")
    ap.add_argument("--variants-backend", help="the backend whose family the variants file "
                    "names (default: BACKEND); knobs the rendered family lacks are left out")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args(argv)
    fam = Family(args.task, args.backend)
    try:
        if args.variants:
            named = Family(args.task, args.variants_backend or args.backend).variants(args.variants)
            if args.name not in named:
                ap.error(f"--name must be one of: {', '.join(named)}")
            text = fam.render(fam.restrict(named[args.name]))
        else:
            text = fam._run(*(a for k in args.knobs for a in ("--set", k)))
    except RenderError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
