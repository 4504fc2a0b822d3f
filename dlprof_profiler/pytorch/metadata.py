"""Run metadata for the expert systems: the config marker ``{'model_config': {...}}``.

The marker is a Python dict literal like the other markers (``{'model_config': {'amp_enabled': True, ...}}``;
DLProf wrote JSON, the engine reads both; JSON's double quotes cannot go through torch.profiler), sent as a
zero-length push/pop range in the default domain (eventType 59 in an nsys export): push/pop is recorded by
every NVTX tool and version, and ``nvtx.mark`` of the Python package is not. It is sent once at ``init()`` with
everything known then, and again, complete, each time a value changes (a value becomes known, or a switch was
seen on): the last config marker of a process holds the final values.

Keys:

``torch_version``, ``cuda_version`` (``torch.version.cuda``, null on CPU builds), ``cudnn_version`` (int or
null), ``cudnn_enabled``, ``cudnn_benchmark`` (``torch.backends.cudnn.benchmark``, read at init and at every
optimizer step), ``cudnn_benchmark_disabled`` (its negation), ``amp_enabled`` (an autocast region was
entered or an enabled ``GradScaler`` created), ``autocast`` (an enabled autocast region was entered),
``detect_anomaly`` (anomaly detection was switched on), ``autograd_set_detect_anomaly``
(``torch.autograd.set_detect_anomaly(True)`` was used), ``gradcheck``, ``gradgradcheck`` (called),
``autograd_profile`` (``torch.autograd.profiler.profile`` or ``torch.profiler.profile`` started),
``emit_nvtx`` (an enabled ``emit_nvtx()`` was entered), ``num_workers``, ``pin_memory`` (of the first
DataLoader iterated), ``batch_size`` (leading dimension of the first tensor of the first DataLoader batch or
of the first top-level module call, whichever comes first), ``gpu_total_memory`` (bytes, null without CUDA
or until CUDA is initialised), ``gpu_name``, ``num_gpus``, ``python_version``, ``dlprof_version``.
Switches are sticky: once true they stay true.
"""

from __future__ import annotations

import platform
import sys
import threading
from typing import Any, Dict, List, Optional

import torch

from .. import __version__ as dlprof_version
from .markers import config_marker
from .runtime import STATE

__all__ = ["ModelConfig", "install_metadata_patches"]

_STICKY = (
    "amp_enabled",
    "autocast",
    "detect_anomaly",
    "autograd_set_detect_anomaly",
    "gradcheck",
    "gradgradcheck",
    "autograd_profile",
    "emit_nvtx",
)


def _cudnn_version() -> Optional[int]:
    try:
        return torch.backends.cudnn.version()
    except Exception:
        return None


def _first_tensor(value: Any, depth: int = 0):
    if isinstance(value, torch.Tensor):
        return value
    if depth < 4:
        if isinstance(value, (list, tuple)):
            for v in value[:32]:
                t = _first_tensor(v, depth + 1)
                if t is not None:
                    return t
        elif isinstance(value, dict):
            for v in list(value.values())[:32]:
                t = _first_tensor(v, depth + 1)
                if t is not None:
                    return t
    return None


class ModelConfig:
    def __init__(self) -> None:
        cudnn = torch.backends.cudnn
        benchmark = bool(getattr(cudnn, "benchmark", False))
        self._lock = threading.RLock()
        self._cuda_available: Optional[bool] = None
        self.values: Dict[str, Any] = {
            "torch_version": str(torch.__version__),
            "cuda_version": torch.version.cuda,
            "cudnn_version": _cudnn_version(),
            "cudnn_enabled": bool(getattr(cudnn, "enabled", False)),
            "cudnn_benchmark": benchmark,
            "cudnn_benchmark_disabled": not benchmark,
            "amp_enabled": False,
            "autocast": False,
            "detect_anomaly": bool(torch.is_anomaly_enabled()),
            "autograd_set_detect_anomaly": False,
            "gradcheck": False,
            "gradgradcheck": False,
            "autograd_profile": False,
            "emit_nvtx": False,
            "num_workers": None,
            "pin_memory": None,
            "batch_size": None,
            "gpu_total_memory": None,
            "gpu_name": None,
            "num_gpus": 0,
            "python_version": platform.python_version(),
            "dlprof_version": dlprof_version,
        }
        self._emitted: Optional[str] = None
        self.wants_loader = True  # DataLoader facts still unknown
        self.batch_hook: Any = None  # global forward pre-hook handle while batch_size is unknown
        self._gpu_known = False
        self._refresh_gpu()

    # -- updates --------------------------------------------------------------------------------------
    def set(self, **values: Any) -> bool:
        with self._lock:
            changed = False
            for key, value in values.items():
                if key in _STICKY:
                    value = bool(value) or bool(self.values.get(key))
                if self.values.get(key) != value:
                    self.values[key] = value
                    changed = True
            if changed:
                self.emit()
            return changed

    def set_once(self, **values: Any) -> bool:
        """Set keys that are still unknown (None)."""
        with self._lock:
            fresh = {k: v for k, v in values.items() if self.values.get(k) is None and v is not None}
            return self.set(**fresh) if fresh else False

    def emit(self, force: bool = False) -> None:
        """Send the whole config as a zero-length range when it changed since the last one sent."""
        state = STATE
        if not state.active:
            return
        with self._lock:
            text = config_marker(self.values)
            if not force and text == self._emitted:
                return
            backend = state.backend
            backend.push(text)
            backend.pop()
            self._emitted = text

    def refresh(self) -> None:
        """Re-read values that can change while the program runs (called at optimizer steps)."""
        try:
            benchmark = bool(torch.backends.cudnn.benchmark)
            updates = {"cudnn_benchmark": benchmark, "cudnn_benchmark_disabled": not benchmark}
            if torch.is_anomaly_enabled():
                updates["detect_anomaly"] = True
            if not self._gpu_known:
                self._refresh_gpu(emit=False)
                updates["gpu_total_memory"] = self.values["gpu_total_memory"]
                updates["gpu_name"] = self.values["gpu_name"]
                updates["num_gpus"] = self.values["num_gpus"]
            if self._cuda_available and torch.cuda.is_initialized():
                # peaks only grow: after the first steps no new marker is emitted (batch size detector)
                updates["max_memory_reserved"] = int(torch.cuda.max_memory_reserved())
                updates["max_memory_allocated"] = int(torch.cuda.max_memory_allocated())
            self.set(**updates)
        except Exception:  # pragma: no cover
            pass

    def _refresh_gpu(self, emit: bool = False) -> None:
        """GPU facts, read only once CUDA is initialised (reading them would initialise CUDA)."""
        try:
            if self._cuda_available is None:
                self._cuda_available = bool(torch.cuda.is_available())
            if not self._cuda_available:
                self._gpu_known = True
                return
            if not torch.cuda.is_initialized():
                return
            index = torch.cuda.current_device()
            props = torch.cuda.get_device_properties(index)
            self.values["gpu_total_memory"] = int(props.total_memory)
            self.values["gpu_name"] = str(props.name)
            self.values["num_gpus"] = int(torch.cuda.device_count())
            self._gpu_known = True
            if emit:
                self.emit()
        except Exception:
            self._gpu_known = True

    def on_batch(self, loader_iter: Any, batch: Any) -> None:
        """First DataLoader batch: workers, pinned memory, batch size."""
        if not self.wants_loader:
            return
        self.wants_loader = False
        updates = {}
        workers = getattr(loader_iter, "_num_workers", None)
        if workers is not None:
            updates["num_workers"] = int(workers)
        pin = getattr(loader_iter, "_pin_memory", None)
        if pin is not None:
            updates["pin_memory"] = bool(pin)
        tensor = _first_tensor(batch)
        if tensor is not None and tensor.dim() > 0:
            updates["batch_size"] = int(tensor.shape[0])
        self.set_once(**updates)
        if self.values.get("batch_size") is not None:
            self.drop_batch_hook()
        self.refresh()

    def on_module_call(self, module: Any, args: Any) -> None:
        if getattr(torch._C, "_get_tracing_state", lambda: None)() is not None:
            return
        tensor = _first_tensor(args)
        if tensor is None or tensor.dim() == 0:
            return
        self.drop_batch_hook()
        self.set_once(batch_size=int(tensor.shape[0]))
        if not self._gpu_known:
            self._refresh_gpu(emit=True)

    def drop_batch_hook(self) -> None:
        handle, self.batch_hook = self.batch_hook, None
        if handle is not None:
            try:
                handle.remove()
            except Exception:  # pragma: no cover
                pass


# -- patches that switch keys on ------------------------------------------------------------------------


def _flagging(orig, keys: Dict[str, Any], when=None):
    """Wrap ``orig`` to set config ``keys`` (then call it) when ``when(*args, **kwargs)`` is true."""

    def wrapper(*args, **kwargs):
        config = STATE.config
        if config is not None:
            try:
                if when is None or when(*args, **kwargs):
                    config.set(**keys)
            except Exception:  # pragma: no cover
                pass
        return orig(*args, **kwargs)

    wrapper.__dlprof_original__ = orig
    wrapper.__wrapped__ = orig
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        try:
            setattr(wrapper, attr, getattr(orig, attr))
        except Exception:
            pass
    return wrapper


def _enabled_self(self, *args, **kwargs) -> bool:
    return bool(getattr(self, "enabled", True))


def install_metadata_patches(patcher, config: ModelConfig, handles: List[Any]) -> None:
    import torch.autograd.profiler as _prof

    def patch(owner, name, keys, when=None):
        orig = getattr(owner, name, None)
        if orig is None or getattr(orig, "__dlprof_original__", None) is not None:
            return
        patcher.patch(owner, name, _flagging(orig, keys, when))

    # emit_nvtx / autograd profiler
    patch(_prof.emit_nvtx, "__enter__", {"emit_nvtx": True}, _enabled_self)
    patch(_prof.profile, "__enter__", {"autograd_profile": True}, _enabled_self)
    try:
        from torch.profiler import profiler as _kineto

        patch(_kineto._KinetoProfile, "start", {"autograd_profile": True})
    except Exception:  # pragma: no cover
        pass

    # autocast / AMP
    try:
        from torch.amp import autocast_mode

        patch(
            autocast_mode.autocast,
            "__enter__",
            {"autocast": True, "amp_enabled": True},
            lambda self, *a, **k: bool(getattr(self, "_enabled", True)),
        )
    except Exception:  # pragma: no cover
        pass
    scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler is not None:
        patch(
            scaler,
            "__init__",
            {"amp_enabled": True},
            lambda self, *a, **k: bool(k.get("enabled", a[5] if len(a) > 5 else True)),
        )

    # anomaly detection, gradcheck
    patch(torch, "set_anomaly_enabled", {"detect_anomaly": True}, lambda mode, *a, **k: bool(mode))
    try:
        from torch.autograd import anomaly_mode

        patch(
            anomaly_mode.set_detect_anomaly,
            "__init__",
            {"autograd_set_detect_anomaly": True},
            lambda self, mode, *a, **k: bool(mode),
        )
    except Exception:  # pragma: no cover
        pass
    gc_module = sys.modules.get("torch.autograd.gradcheck")
    for owner in (torch.autograd, gc_module):
        if owner is None or not hasattr(owner, "gradcheck"):
            continue
        patch(owner, "gradcheck", {"gradcheck": True})
        patch(owner, "gradgradcheck", {"gradgradcheck": True})

    # batch size from the first top-level module call (until a DataLoader batch gave it)
    register = getattr(torch.nn.modules.module, "register_module_forward_pre_hook", None)
    if register is not None and config.values.get("batch_size") is None:

        def _batch_hook(module, args):
            cfg = STATE.config
            if cfg is not None:
                cfg.on_module_call(module, args)
            return None

        config.batch_hook = register(_batch_hook)
        handles.append(config.batch_hook)
