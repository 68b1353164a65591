"""`import torch` in a process whose PYTHONPATH holds harness/tests/fake_torch: the fake, with
the settings the test put in $KSEARCH_FAKE_TORCH (fake_torch_impl.py)."""

import sys

from fake_torch_impl import FakeTorch

_fake = FakeTorch.from_env()
sys.modules["torch.cuda"] = _fake.cuda
sys.modules[__name__] = _fake
