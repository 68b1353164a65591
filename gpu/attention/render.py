"""Render the attention task's GPU template families with jinja2, outside ksearch.

The families live with the task: tasks/attention/templates-cuda/ (family.toml, attention.cu.j2,
device.cuh.j2) and tasks/attention/templates-mlx/ (the candidate module; it includes the cuda
family's device code). ksearch renders them in Rust (minijinja); this module is for the tools
here (build.py, bench.py, mlx_attention.py) and reads gpu.toml beside it for the launch formulas.

Library:
    fam = Family.load()                       # the cuda family's knobs, gpu.toml
    knobs = fam.resolve({"algo": "mma", "block_n": 64})   # defaults filled, domains and constraints checked
    src = fam.render("cuda", knobs)           # extern "C" attention_f16 / attention_bf16
    hdr, body = fam.render_mlx(knobs)         # header and body for mx.fast.cuda_kernel
    module = fam.render_module(knobs)         # the mlx backend's candidate module (target mlx-cuda)
CLI:
    python render.py --backend cuda --set algo=mma --set cp_async=true --set stages=2 -o attn.cu
    python render.py --variants variants.toml --list

Only jinja2 is needed; the templates and expressions stay inside the subset that minijinja (the
Rust side) evaluates the same way, which tests/test_render.py checks when the minijinja Python
binding is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

HERE = Path(__file__).resolve().parent
TASK = HERE.parents[1] / "tasks" / "attention"
TEMPLATES = TASK / "templates-cuda"
MLX_TEMPLATES = TASK / "templates-mlx"
GPU_TOML = HERE / "gpu.toml"


_EXPR_CACHE: dict[str, Any] = {}


class FamilyError(ValueError):
    """A knob value outside its domain, an unknown knob, or a violated constraint."""


def _env(*loader_dirs: Path) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(d) for d in loader_dirs]) if loader_dirs else None,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def variant_id(knobs: dict[str, Any]) -> str:
    """Stable id of a knob assignment: the first 10 hex digits of sha256 of its sorted JSON."""
    blob = json.dumps(knobs, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


def _fmt_value(v: Any) -> str:
    # Same text as the Rust side's knob_summary: bools lower-case, strings quoted.
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    return str(v)


def knob_summary(knobs: dict[str, Any]) -> str:
    return " ".join(f"{k}={_fmt_value(knobs[k])}" for k in sorted(knobs))


@dataclass
class Family:
    spec: dict[str, Any]  # templates-cuda/family.toml (the shared format of docs/offline-proposer.md)
    gpu: dict[str, Any]   # gpu.toml (launch formulas and backend metadata)
    directory: Path
    mlx_directory: Path = MLX_TEMPLATES

    @classmethod
    def load(cls, directory: Path = TEMPLATES) -> "Family":
        with open(directory / "family.toml", "rb") as f:
            spec = tomllib.load(f)
        with open(GPU_TOML, "rb") as f:
            gpu = tomllib.load(f)
        return cls(spec, gpu, directory)

    def mlx_spec(self) -> dict[str, Any]:
        with open(self.mlx_directory / "family.toml", "rb") as f:
            return tomllib.load(f)

    @property
    def knob_names(self) -> list[str]:
        return [k["name"] for k in self.spec["knob"]]

    @property
    def head_dims(self) -> list[int]:
        return list(self.gpu["backends"]["head_dims"])

    def domain(self, name: str) -> list[Any]:
        knob = next(k for k in self.spec["knob"] if k["name"] == name)
        return [False, True] if knob.get("type") == "bool" else list(knob["values"])

    def defaults(self) -> dict[str, Any]:
        return {k["name"]: k["default"] for k in self.spec["knob"]}

    def eval_expr(self, expr: str, ctx: dict[str, Any]) -> Any:
        # Compiling a Jinja expression costs about a millisecond; callers on a hot path (the mlx
        # wrapper computes its grid per call) must not pay that each time.
        fn = _EXPR_CACHE.get(expr)
        if fn is None:
            fn = _EXPR_CACHE[expr] = _env().compile_expression(expr)
        return fn(**ctx)

    def launch(self, knobs: dict[str, Any], head_dim: int) -> dict[str, int]:
        """Threads per block and dynamic shared-memory bytes for one head dim."""
        ctx = dict(knobs, head_dim=head_dim)
        return {
            "threads": int(self.eval_expr(self.gpu["launch"]["threads"], ctx)),
            "smem_bytes": int(self.eval_expr(self.gpu["launch"]["smem_bytes"], ctx)),
        }

    def grid(self, knobs: dict[str, Any], B: int, H: int, L: int) -> tuple[int, int, int]:
        ctx = dict(knobs, B=B, H=H, L=L)
        gx, gy, gz = (int(self.eval_expr(e, ctx)) for e in self.gpu["launch"]["grid"])
        return gx, gy, gz

    def violations(self, knobs: dict[str, Any]) -> list[str]:
        out = [f"{c['expr']} ({c.get('message', '')})" for c in self.spec.get("constraint", [])
               if not self.eval_expr(c["expr"], knobs)]
        for f in self.spec.get("forbid", []):
            if all(knobs.get(k) == v for k, v in f["knobs"].items()):
                out.append(f"forbidden {f['knobs']} ({f.get('message', '')})")
        return out

    def resolve(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """Defaults plus overrides, after domain and constraint checks."""
        unknown = sorted(set(overrides) - set(self.knob_names))
        if unknown:
            raise FamilyError(f"unknown knob(s): {', '.join(unknown)}")
        knobs = self.defaults()
        knobs.update(overrides)
        for name, value in knobs.items():
            domain = self.domain(name)
            # bool is an int in Python; keep true/false and 0/1 apart.
            if not any(value == d and type(value) is type(d) for d in domain):
                raise FamilyError(f"knob {name}={value!r} not in domain {domain}")
        bad = self.violations(knobs)
        if bad:
            raise FamilyError("constraint(s) violated: " + "; ".join(bad))
        return knobs

    def _context(self, backend: str, knobs: dict[str, Any], target: str | None = None
                 ) -> dict[str, Any]:
        """What ksearch's renderer gives a template: the knobs, `knobs`, `knob_summary` and
        `family` (plus `target` for the mlx family). The mlx family has no min_blocks."""
        if backend == "mlx":
            knobs = {k: v for k, v in knobs.items() if k != "min_blocks"}
            name = self.mlx_spec()["family"]["name"]
        else:
            name = self.spec["family"]["name"]
        ctx = dict(knobs, knobs=dict(knobs), knob_summary=knob_summary(knobs), family=name)
        if backend == "mlx":
            ctx["target"] = target or "mlx-cuda"
        return ctx

    def _env(self) -> jinja2.Environment:
        return _env(self.directory, self.mlx_directory)

    def render(self, backend: str, knobs: dict[str, Any]) -> str:
        """cuda: the candidate .cu file; mlx: the candidate module (see render_module)."""
        if backend not in self.gpu["backends"]["names"]:
            raise FamilyError(f"backend {backend!r} not in {self.gpu['backends']['names']}")
        if backend == "mlx":
            return self.render_module(knobs)
        tmpl = self._env().get_template(self.spec["family"]["entry"])
        return tmpl.render(**self._context(backend, knobs))

    def render_module(self, knobs: dict[str, Any], target: str = "mlx-cuda") -> str:
        """The mlx backend's candidate module, as ksearch renders it."""
        tmpl = self._env().get_template(self.mlx_spec()["family"]["entry"])
        return tmpl.render(**self._context("mlx", knobs, target))

    def render_mlx(self, knobs: dict[str, Any]) -> tuple[str, str]:
        """The device code (the `header` of mx.fast.cuda_kernel) and the body MLX wraps."""
        env = self._env()
        ctx = self._context("mlx", knobs)
        header = env.get_template(self.gpu["backends"]["mlx_header"]).render(**ctx)
        body = env.get_template(self.gpu["backends"]["mlx_body"]).render(**ctx)
        return header, body


def load_variants(path: Path, fam: Family) -> dict[str, dict[str, Any]]:
    """Named variants: [[variant]] tables with `name` and knob overrides."""
    with open(path, "rb") as f:
        spec = tomllib.load(f)
    out: dict[str, dict[str, Any]] = {}
    for v in spec.get("variant", []):
        v = dict(v)
        name = v.pop("name")
        v.pop("note", None)
        if name in out:
            raise FamilyError(f"variant {name!r} defined twice")
        out[name] = fam.resolve(v)
    return out


def _parse_value(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text)
    except ValueError:
        return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["cuda", "mlx"], default="cuda")
    ap.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE")
    ap.add_argument("--variants", type=Path, help="variants.toml; with --list prints them")
    ap.add_argument("--name", help="render this named variant from --variants")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args(argv)
    fam = Family.load()
    try:
        if args.variants:
            variants = load_variants(args.variants, fam)
            if args.list:
                for name, k in variants.items():
                    print(name, variant_id(k), json.dumps(k, sort_keys=True))
                return 0
            if not args.name or args.name not in variants:
                print(f"--name must be one of: {', '.join(variants)}", file=sys.stderr)
                return 2
            knobs = variants[args.name]
        else:
            overrides = {}
            for item in args.set:
                key, _, val = item.partition("=")
                overrides[key] = _parse_value(val)
            knobs = fam.resolve(overrides)
        text = fam.render(args.backend, knobs)
    except FamilyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
