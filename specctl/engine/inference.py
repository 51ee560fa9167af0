"""torch.inference_mode, entered once for a run rather than at every forward.

The decoding entry points (Model.run, Model.forward, the head's argmax and logits,
CudaGraphs.run) must hold inference mode when called alone (a test, a probe, a step table), but
inside a run they nest: `@torch.inference_mode()` entered and left it 3-4 times a step, each
~2-4 us of host warm (more in a run, after a forward has left the host's caches cold): a
share of `ar`'s own host step on a GPU. `inference` enters it only where it is not on; the
runner holds it over its whole loop (Runner.run).
"""

from __future__ import annotations

import functools

import torch


def inference(fn):
    """fn under torch.inference_mode, entered only where it is not on already."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if torch.is_inference_mode_enabled():
            return fn(*args, **kwargs)
        with torch.inference_mode():
            return fn(*args, **kwargs)
    return wrapper
