"""Renders the selective-scan GPU families (tasks/selective-scan/templates-cuda and
templates-mlx) in Python, the way the Rust loader (crates/knowledge, TemplateFamily) does: knobs
filled from their defaults, domains and constraints checked, jinja2 with trim_blocks,
lstrip_blocks, keep_trailing_newline and strict undefined; the context holds the knobs, `knobs`,
`knob_summary` (`name=value` sorted by name), `family` and, for families with targets, `target`.

    python render.py cuda algo=chunked items=8 > scan.cu
    python render.py mlx algo=chunked items=8 exp2=true > scan_mlx.py
    python render.py --list            # every valid setting, one JSON object per line
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# The tasks tree: the checkout's, unless KSEARCH_TASKS_DIR names one (`ksearch bench mamba` sets
# it, since an installed ksearch runs this file from its cache, away from any checkout).
TASK = Path(os.environ.get("KSEARCH_TASKS_DIR") or REPO / "tasks") / "selective-scan"
FAMILY_DIRS = {"cuda": TASK / "templates-cuda", "mlx": TASK / "templates-mlx"}


class FamilyError(ValueError):
    pass


class Family:
    def __init__(self, backend: str):
        if backend not in FAMILY_DIRS:
            raise FamilyError(f"unknown backend {backend!r} (known: {', '.join(FAMILY_DIRS)})")
        self.backend = backend
        self.dir = FAMILY_DIRS[backend]
        spec = tomllib.loads((self.dir / "family.toml").read_text())
        fam = spec["family"]
        self.name: str = fam["name"]
        self.entry: str = fam["entry"]
        self.targets: list[str] = list(fam.get("targets", []))
        self.include_dirs = [(self.dir / d).resolve() for d in fam.get("include_dirs", [])]
        self.knobs: dict[str, dict[str, Any]] = {}
        for k in spec["knob"]:
            values = [False, True] if k.get("type") == "bool" else list(k["values"])
            self.knobs[k["name"]] = {"values": values, "default": k["default"],
                                     "description": k["description"]}
        self.constraints = [(c["expr"], c["message"]) for c in spec.get("constraint", [])]
        self._env = None
        self._rules = None

    def env(self):
        if self._env is None:
            import jinja2

            self._env = jinja2.Environment(
                loader=jinja2.FileSystemLoader([str(self.dir)] + [str(d) for d in self.include_dirs]),
                trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                undefined=jinja2.StrictUndefined, autoescape=False)
        return self._env

    def defaults(self) -> dict[str, Any]:
        return {n: k["default"] for n, k in self.knobs.items()}

    def resolve(self, knobs: dict[str, Any]) -> dict[str, Any]:
        """Defaults filled in; unknown knobs, values outside a domain and broken rules raise."""
        unknown = sorted(set(knobs) - set(self.knobs))
        if unknown:
            raise FamilyError(f"unknown knobs {unknown} (known: {', '.join(self.knobs)})")
        full = self.defaults()
        for name, value in knobs.items():
            domain = self.knobs[name]["values"]
            if value not in domain or type(value) is not type(domain[0]):
                raise FamilyError(f"{name}={value!r} is outside its domain {domain}")
            full[name] = value
        if self._rules is None:
            self._rules = [(self.env().compile_expression(e), e, m) for e, m in self.constraints]
        for rule, expr, message in self._rules:
            if not rule(**full):
                raise FamilyError(f"{message} ({expr})")
        return full

    def valid(self, knobs: dict[str, Any]) -> bool:
        try:
            self.resolve(knobs)
            return True
        except FamilyError:
            return False

    def enumerate(self) -> list[dict[str, Any]]:
        names = list(self.knobs)
        out = []
        for combo in itertools.product(*(self.knobs[n]["values"] for n in names)):
            knobs = dict(zip(names, combo))
            if self.valid(knobs):
                out.append(knobs)
        return out

    def context(self, knobs: dict[str, Any]) -> dict[str, Any]:
        ctx = dict(knobs)
        ctx["knobs"] = dict(sorted(knobs.items()))
        ctx["family"] = self.name
        ctx["knob_summary"] = " ".join(f"{k}={_fmt(v)}" for k, v in sorted(knobs.items()))
        if self.targets:
            ctx["target"] = self.targets[0]
        return ctx

    def render(self, knobs: dict[str, Any] | None = None) -> str:
        full = self.resolve(dict(knobs or {}))
        return self.env().get_template(self.entry).render(**self.context(full))

    def render_device(self, knobs: dict[str, Any] | None = None, target: str | None = None) -> str:
        """Only the shared device code (what the cuda file includes and MLX gets as header)."""
        full = self.resolve(dict(knobs or {}))
        ctx = self.context(full)
        if target is not None:
            ctx["target"] = target
        return self.env().get_template("scan_device.cuh.j2").render(**ctx)


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def parse_knob(text: str) -> tuple[str, Any]:
    name, _, raw = text.partition("=")
    if not raw:
        raise FamilyError(f"expected name=value, got {text!r}")
    if raw in ("true", "false"):
        return name, raw == "true"
    try:
        return name, int(raw)
    except ValueError:
        return name, raw


def load_variants(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """Named knob settings (variants.toml): name -> knobs (only what differs from defaults)."""
    path = path or Path(__file__).resolve().parent / "variants.toml"
    spec = tomllib.loads(path.read_text())
    return {v["name"]: dict(v["knobs"]) for v in spec["variant"]}


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--list":
        for knobs in Family("cuda").enumerate():
            print(json.dumps(knobs))
        return 0
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        fam = Family(argv[0])
        knobs = dict(parse_knob(a) for a in argv[1:])
        sys.stdout.write(fam.render(knobs))
    except FamilyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
