"""Capture and restore of every random number generator a training job draws from.

The states are converted to tensors and plain values so that checkpoints load with
``torch.load(weights_only=True)`` -- no unpickling of arbitrary objects. An accelerator's
generators (CUDA's, XPU's: the device module's ``get_rng_state_all``) are saved under its device
type once the process has started it.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from cadence.engine.runtime import accelerator_started, device_module


def capture_rng_state() -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's global generators (and the accelerator's, if
    in use: under its device type, ``cuda``)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    accelerator, device_type = accelerator_started(), _accelerator_type()
    if accelerator is not None and device_type is not None and hasattr(accelerator,
                                                                       "get_rng_state_all"):
        state[device_type] = accelerator.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restores what `capture_rng_state` returned."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["kind"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    kind = _accelerator_type()
    if kind is not None and kind in state:
        accelerator = device_module(torch.device(kind))
        if accelerator is not None and hasattr(accelerator, "set_rng_state_all"):
            accelerator.set_rng_state_all(state[kind])


def _accelerator_type() -> str | None:
    """The machine's accelerator's device type (``cuda``, ``xpu``), None without one."""
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    return accelerator.type if accelerator is not None else None
