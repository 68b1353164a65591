"""model_kernels.py behind its own API on real MLX arrays, with its CUDA kernels run by the CPU
emulation (emu/fake_mlx.py): what mamba_model calls on a GPU. Arrays cross as numpy copies,
except the grid-barrier state arrays (grid_state()), which the kernels change in place and
which must persist: the model holds an MLX array and the kernels get the emulation's array
registered for it."""

import mlx.core as mx
import numpy as np

import mamba_model as mm


class EmulatedModelKernels:
    def __init__(self, resident_blocks: int = 0, **layer_options):
        from fake_mlx import FakeMx

        self.fake = FakeMx()
        self.fake.resident_blocks = resident_blocks
        self.mod = self.fake.load(mm.HERE / "model_kernels.py", "ksm_fake_model_kernels")
        self.layer_options = layer_options  # e.g. grid_sync=False for the mutation test
        self._grids = {}  # id(MLX array held by the model) -> (that array, the emulation's)

    def _in(self, a):
        kept = self._grids.get(id(a))
        if kept is not None and kept[0] is a:
            return kept[1]
        return self.fake.array(np.array(a))

    def _call(self, fn, *arrays, **kw):
        outs = fn(*[self._in(a) for a in arrays], **kw)
        return tuple(mx.array(o.np) for o in outs)

    def conv_silu(self, *arrays):
        return self._call(self.mod.conv_silu, *arrays)

    def ssm_step(self, *arrays):
        return self._call(self.mod.ssm_step, *arrays)

    def fused_decode(self, *arrays):
        return self._call(self.mod.fused_decode, *arrays)

    def fused_layer_decode(self, *arrays, **kw):
        return self._call(self.mod.fused_layer_decode, *arrays, **kw, **self.layer_options)

    def fused_model_decode(self, *arrays, **kw):
        return self._call(self.mod.fused_model_decode, *arrays, **kw, **self.layer_options)

    def sm_count(self):
        return self.mod.sm_count()

    def grid_state(self):
        state = self.mod.grid_state()
        held = mx.array(state.np)
        self._grids[id(held)] = (held, state)
        return held

    def grid_words(self, held):
        """The state the kernels see for an array the model holds."""
        return self._grids[id(held)][1].np.tolist()

    def grid_failed(self, poison):
        return self.mod.grid_failed(self._in(poison))

    def calls(self):
        """Launches per kernel: {"conv_silu": n, ..., "layer": n, "model": n}."""
        return {k.name.split("_", 1)[1].rsplit("_", 1)[0]: len(k.calls) for k in self.fake.kernels}
