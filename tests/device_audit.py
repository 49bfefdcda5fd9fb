"""A stand-in accelerator on the CPU, for tests that check every tensor a stage makes lands on its device.

:class:`FakeAccelerator` is a ``TorchFunctionMode``. Inside it, the device ``privateuseone`` (:data:`FAKE`;
``cuda`` is read the same) is a second device whose tensors are ordinary CPU tensors tagged "on the
accelerator": a factory or ``.to`` naming it returns a tagged tensor, ``.cpu()`` / ``.to("cpu")`` an untagged
copy, every other op returns tensors tagged when one of its tensor inputs is, and ``t.device`` reports
:data:`FAKE` for a tagged ``t``. An op that mixes tagged tensors with untagged ones raises
:class:`DeviceMismatch` where CUDA raises "Expected all tensors to be on the same device" (the same rule: a
0-dim host tensor may join a device op as a scalar; a device tensor may be indexed with host index tensors;
``copy_``, ``.to`` and ``.data =`` cross devices), and ``.numpy()`` of a tagged tensor raises as CUDA's
does. So code that works here, with its stage on :data:`FAKE`, makes no host tensor meet a device one on a
GPU; data-dependent code (``.item()``, sampling, numpy on the host) runs for real.

Limits: a tensor made with an explicit host device (``device="cpu"``, ``torch.from_numpy``, safetensors) is
a host tensor, as it would be on a GPU, so the check is exact there; code that tests ``device.type ==
"cuda"`` takes its non-CUDA branch (the fake device is not CUDA), so CUDA-only branches are not covered.
The mode is thread-local: enter it in the thread that runs the workers.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

import omniduplex

FAKE = torch.device("privateuseone", 0)
"""What a tagged tensor reports as its device; give stages ``device: privateuseone``."""
HOST = torch.device("cpu")
ACCELERATOR_TYPES = ("privateuseone", "cuda")

_T = torch.Tensor
_DEVICE_GET = _T.device.__get__
_IS_CPU_GET = _T.is_cpu.__get__
_IS_CUDA_GET = _T.is_cuda.__get__
_DATA_SET = _T.data.__set__
_NUMPY = (_T.numpy, _T.__array__)
_INDEXING = (_T.__getitem__, _T.__setitem__, _T.index_put_, _T.index_put, torch.index_put)
_CROSSING = (_T.copy_, _T.new_tensor, torch.tensor, torch.as_tensor, torch.asarray,
             torch._has_compatible_shallow_copy_type)
"""Ops whose tensor inputs may sit on another device than their result (data read, then placed), or that
compare metadata only."""
_ROOT = str(Path(list(omniduplex.__path__)[0]))


class DeviceMismatch(RuntimeError):
    """A host tensor met a tensor on the accelerator in one op (CUDA would raise here too)."""


def _device_of(arg) -> torch.device | None:
    if isinstance(arg, torch.device):
        return arg
    if isinstance(arg, str):
        return torch.device(arg)
    if isinstance(arg, int) and not isinstance(arg, bool):
        return torch.device("cuda", arg)  # an ordinal means the accelerator
    return None


def _caller() -> str:
    """The innermost frame of the project (not this module, not torch) that made the call."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if frame.filename.startswith(_ROOT):
            return f"{frame.filename[len(_ROOT) + 1 :]}:{frame.lineno} {frame.line}"
    return "?"


class FakeAccelerator(TorchFunctionMode):
    """See the module docstring. ``violations`` keeps every mismatch raised (a worker may catch the
    exception and fail only its turn, as the stages do)."""

    def __init__(self) -> None:
        super().__init__()
        self.tagged = WeakTensorKeyDictionary()
        self.violations: list[str] = []

    def on_device(self, t: torch.Tensor) -> bool:
        return t in self.tagged

    def _tag(self, t: torch.Tensor, on: bool) -> None:
        if on:
            self.tagged[t] = True
        else:
            self.tagged.pop(t, None)

    def _fail(self, msg: str) -> None:
        msg = f"{msg} (at {_caller()})"
        self.violations.append(msg)
        raise DeviceMismatch(msg)

    def _target(self, func, args: tuple, kwargs: dict) -> tuple[tuple, dict, bool | None]:
        """The device the call names, translated to the real CPU: ``(args, kwargs, True = accelerator /
        False = host / None = none named)``."""
        target = None
        if "device" in kwargs and kwargs["device"] is not None:
            d = _device_of(kwargs["device"])
            if d is not None:
                target = d.type in ACCELERATOR_TYPES
                kwargs = {**kwargs, "device": HOST}
        kwargs.pop("pin_memory", None)  # no pinned memory without a CUDA runtime
        if func is _T.to:
            rest = []
            for a in args[1:]:
                d = _device_of(a)
                if d is not None:
                    target = d.type in ACCELERATOR_TYPES
                    a = HOST
                elif isinstance(a, torch.Tensor):  # .to(other): its device and dtype
                    target = self.on_device(a)
                    a = a.dtype
                rest.append(a)
            args = (args[0], *rest)
            if target is not None and target != self.on_device(args[0]):
                kwargs["copy"] = True  # a move makes a new tensor, as a real one does
        return args, kwargs, target

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch._C._nn._parse_to:  # Module.to parses its device, then moves each tensor
            return func(*args, **kwargs)
        if func == _DEVICE_GET:
            return FAKE if self.on_device(args[0]) else func(*args)
        if func == _IS_CPU_GET:
            return not self.on_device(args[0])
        if func == _IS_CUDA_GET:
            return False
        if func == _DATA_SET:
            out = func(*args, **kwargs)
            self._tag(args[0], self.on_device(args[1]))
            return out
        if func in _NUMPY and self.on_device(args[0]):
            self._fail(f"{func.__name__}() of a tensor on the accelerator (move it to the host first)")
        if func is _T.cpu:
            return args[0].clone() if self.on_device(args[0]) else args[0]
        if func is _T.cuda:
            out = args[0] if self.on_device(args[0]) else args[0].clone()
            self._tag(out, True)
            return out
        args, kwargs, target = self._target(func, args, kwargs)
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if func is not _T.to and func not in _CROSSING:
            self._check(func, args, inputs)
        out = func(*args, **kwargs)
        on = target if target is not None else any(self.on_device(t) for t in inputs)
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            if any(t is i for i in inputs):  # in place or a no-op: keeps its own place
                continue
            self._tag(t, on)
        return out

    def _check(self, func, args: tuple, inputs: list[torch.Tensor]) -> None:
        dev = [t for t in inputs if self.on_device(t)]
        if not dev:
            return
        host = [t for t in inputs if not self.on_device(t) and t.dim() > 0]
        if func in _INDEXING:
            if not self.on_device(args[0]):
                self._fail(f"{_name(func)}: a host tensor indexed by accelerator tensors")
            if func is _T.__getitem__:
                return
            value = args[2] if len(args) > 2 else None
            if isinstance(value, torch.Tensor) and not self.on_device(value) and value.dim() > 0:
                key = args[1] if len(args) > 1 else None
                basic = not any(isinstance(k, torch.Tensor) for k in tree_flatten(key)[0])
                if basic and func is _T.__setitem__:
                    return  # a slice assignment is a copy_, which crosses devices
                host = [value]
            else:
                return
        if host:
            shapes = ", ".join(f"{list(t.shape)} {t.dtype}" for t in host[:3])
            self._fail(
                f"Expected all tensors to be on the same device: {_name(func)} got host tensor(s) "
                f"{shapes} beside {len(dev)} on the accelerator"
            )


def _name(func) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or str(func)
