"""dlprof's startup hook: instrument a Python program's PyTorch, and with `dlprof --backend=torch` profile it
with torch.profiler, without changing its code.

dlprof puts this folder first on PYTHONPATH and describes what to do in environment variables (JSON; see
`__init__.py` beside this file): DLPROF_PYTORCH_INIT (annotate torch with `dlprof_profiler.pytorch.init()`,
both backends) and DLPROF_TORCH_CAPTURE (torch.profiler capture). Python imports `sitecustomize` at
start-up; this one then

- runs any other `sitecustomize` further down sys.path (the user's or the distribution's), so nothing
  the environment relied on is lost;
- waits for the program to import torch (a one-shot import hook: programs and child processes that
  never import torch are left alone and pay nothing), then
- calls `dlprof_profiler.pytorch.init()` (unless the program has done so: nothing is patched twice), with
  dlprof_profiler loaded from dlprof's own installation by its path alone, so the program's sys.path
  stays its own (the profiled interpreter may be another Python than dlprof's). Under Nsight Systems the
  markers go to NVTX (the NVTX library through ctypes: no Python package needed); under torch.profiler
  they are `record_function` ranges, switched on only while collection runs;
- with DLPROF_TORCH_CAPTURE, creates a `torch.profiler.profile` (CPU, plus CUDA/ROCm/XPU activities when
  this torch supports them; shapes recorded; Python stacks when asked, i.e. without the annotation), marks
  iterations at optimizer steps (right after each `Optimizer.step`, so the trace holds `ProfilerStep#N`
  ranges and `torch.profiler.schedule` selects the iterations to keep), honours the delay and duration at
  module calls and optimizer steps (torch.profiler must be started and stopped on the thread that runs the
  model, never from a timer thread), and writes `<pid>.pt.trace.json.gz` into the capture folder when
  collection ends: when the iteration window is complete, when the duration is over (then, as nsys does,
  the program is ended with SIGTERM), at interpreter exit, or on SIGTERM.

It imports only the standard library until torch is imported. Any failure is reported in one line on
stderr and leaves the program running (unprofiled or unannotated).
"""

import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _warn(text):
    """One line on stderr in dlprof's format (`log.py`, which this file cannot import)."""
    import time

    try:
        sys.stderr.write("%s WARNING: startup hook: %s\n" % (time.strftime("[DLProf-%H:%M:%S]"), text))
        sys.stderr.flush()
    except Exception:  # a closed stderr must not break the program
        pass


class _Capture:
    """One process's torch.profiler session, driven by the program's own module calls and optimizer steps."""

    def __init__(self, config, annotations=None):
        import time

        self.annotations = annotations  # _Annotations: markers recorded only while collection runs
        self.time = time.time
        self.config = config
        self.folder = config["dir"]
        self.start_at = float(config.get("t0") or self.time()) + float(config.get("delay") or 0)
        self.duration = config.get("duration")
        self.stop_at = None
        self.state = "waiting"  # waiting -> recording -> written
        self.partial = []  # ProfilerStep numbers that are not whole iterations
        self.prof = None
        self.module_hook = None
        self.path = os.path.join(self.folder, "%d.pt.trace.json.gz" % os.getpid())

    def attach(self, torch):
        from torch.profiler import ProfilerAction, profile, schedule

        window = self.config.get("iterations")
        if window:
            first, last = int(window[0]), int(window[1])
            plan = schedule(wait=max(first - 1, 0), warmup=1 if first > 0 else 0, active=last - first + 1, repeat=1)
        else:

            def plan(step):
                return ProfilerAction.RECORD

        self.prof = profile(
            schedule=plan,
            on_trace_ready=self._write,
            record_shapes=True,
            with_stack=bool(self.config.get("with_stack", True)),
            profile_memory=bool(self.config.get("profile_memory", False)),
        )
        self._hook_optimizer_steps(torch)
        if self.time() >= self.start_at and not self.duration:
            self._start()
        else:
            from torch.nn.modules.module import register_module_forward_pre_hook

            self.module_hook = register_module_forward_pre_hook(self._on_module)
            self._tick()
        import atexit

        atexit.register(self.finish)
        import signal

        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _hook_optimizer_steps(self, torch):
        """Call `_on_step` right after each optimizer step, outside its `Optimizer.step#...` range, where
        users call `prof.step()`: torch wraps every optimizer class's step with the static method
        `Optimizer.profile_hook_step` when the first instance is created, so wrapping that method puts
        our call after the range closes. Nested steps (an optimizer stepping another) count once.
        Without that method (other torch versions), a global step post-hook is used instead."""
        import functools

        optimizer = torch.optim.Optimizer
        original = getattr(optimizer, "profile_hook_step", None)
        if original is None:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            register_optimizer_step_post_hook(self._on_step)
            return
        capture = self
        depth = [0]

        def profile_hook_step(func):
            hooked = original(func)

            @functools.wraps(hooked)
            def step(*args, **kwargs):
                depth[0] += 1
                try:
                    return hooked(*args, **kwargs)
                finally:
                    depth[0] -= 1
                    if depth[0] == 0:
                        capture._on_step()

            return step

        optimizer.profile_hook_step = staticmethod(profile_hook_step)

    def _start(self):
        self.prof.start()
        self.state = "recording"
        window = self.config.get("iterations")
        if not window or int(window[0]) == 0:
            # this step opened when profiling started, not at an optimizer step: the run up to the first step
            self._mark_partial(self.prof.step_num)
        if self.annotations is not None:
            self.annotations.recording(True)
        if self.duration:
            self.stop_at = self.time() + float(self.duration)
        elif self.module_hook is not None:
            self.module_hook.remove()
            self.module_hook = None

    def _tick(self):
        if self.state == "waiting" and self.time() >= self.start_at:
            self._start()
        elif self.state == "recording" and self.stop_at is not None and self.time() >= self.stop_at:
            self.finish()
            _warn("--duration elapsed: trace written, ending the program with SIGTERM (as nsys does)")
            import signal

            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    def _on_module(self, *args):
        try:
            self._tick()
        except Exception as exc:
            self._fail(exc)

    def _on_step(self, *args):
        try:
            if self.state == "recording":
                self.prof.step()
            self._tick()
        except Exception as exc:
            self._fail(exc)

    def _write(self, prof):
        """on_trace_ready: the trace goes to a temporary name first, so dlprof never reads half a file."""
        if self.annotations is not None:
            self.annotations.recording(False)
        partial = self.path + ".partial.json.gz"
        prof.export_chrome_trace(partial)
        os.replace(partial, self.path)
        self.state = "written"
        if self.module_hook is not None:
            self.module_hook.remove()
            self.module_hook = None

    def finish(self):
        """End collection and write the trace (interpreter exit, SIGTERM, end of the duration)."""
        if self.state != "recording":
            return
        try:
            # the step the last optimizer step opened ends here, not at an optimizer step: the run after it
            self._mark_partial(self.prof.step_num)
            self.prof.stop()  # while recording, stopping calls on_trace_ready (_write)
        except Exception as exc:
            self._fail(exc)
            return
        if self.state == "recording":  # the iteration window was never reached: nothing to write
            self.state = "stopped"
            _warn("the program ended before the iteration window: no trace written")

    def _mark_partial(self, step):
        """Name a `ProfilerStep#N` that is not a whole iteration in the trace's metadata (`dlprof_partial_steps`,
        read by dlprof's ingest: such steps are left out of the steady figures, as the first and last key-node
        intervals of an nsys capture are)."""
        self.partial.append(int(step))
        try:
            self.prof.add_metadata_json("dlprof_partial_steps", json.dumps(sorted(set(self.partial))))
        except Exception as exc:  # the figures then count the step as whole; the capture goes on
            _warn("step %d not marked partial in the trace: %s: %s" % (step, type(exc).__name__, exc))

    def _on_sigterm(self, signum, frame):
        self.finish()
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def _fail(self, exc):
        self.state = "failed"
        if self.annotations is not None:
            self.annotations.recording(False)
        _warn("torch.profiler capture stopped: %s: %s" % (type(exc).__name__, exc))


def _dlprof_pytorch(root):
    """dlprof_profiler.pytorch: the one already imported, else dlprof's own package loaded from `root` by its
    path (only `dlprof_profiler` becomes importable; the folder around it is not put on sys.path)."""
    module = sys.modules.get("dlprof_profiler.pytorch")
    if module is not None:
        return module
    if "dlprof_profiler" not in sys.modules:
        import importlib.util

        folder = os.path.join(root, "dlprof_profiler")
        spec = importlib.util.spec_from_file_location(
            "dlprof_profiler", os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
        )
        package = importlib.util.module_from_spec(spec)
        sys.modules["dlprof_profiler"] = package
        try:
            spec.loader.exec_module(package)
        except BaseException:
            del sys.modules["dlprof_profiler"]
            raise
    import importlib

    return importlib.import_module("dlprof_profiler.pytorch")


class _Annotations:
    """`dlprof_profiler.pytorch.init()` once torch is imported; for torch.profiler, markers as
    `record_function` ranges, on only while collection runs (`recording`)."""

    def __init__(self, config):
        self.config = config
        self.module = None
        self.backend = None  # the record_function backend, switched by recording()

    def attach(self, torch):
        module = _dlprof_pytorch(self.config["root"])
        if module.is_installed():
            return  # the program called init() itself (before importing torch): leave its choices alone
        if self.config.get("backend") == "record_function":
            self.backend = module.RecordFunctionBackend(enabled=False)
            module.init(backend=self.backend)
        else:
            module.init()
            if not module.is_active() and module.profiler_attached():
                _warn(
                    "PyTorch not annotated: this Python has no NVTX (libnvToolsExt.so.1, a CUDA build of "
                    "PyTorch or the nvtx package)"
                )
        self.module = module

    def recording(self, on):
        if self.backend is None or self.module is None:
            return
        try:
            self.backend.enabled = bool(on)
            self.module.init(backend=self.backend)  # re-evaluates whether the wrappers annotate
        except Exception as exc:
            _warn("PyTorch annotation not switched %s: %s: %s" % ("on" if on else "off", type(exc).__name__, exc))


class _TorchImportWatcher:
    """A one-shot import hook: when `torch` has been imported, run the actions (annotations first, so the
    capture's first ProfilerStep already holds markers)."""

    def __init__(self, actions):
        self.actions = actions

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        run_module = loader.exec_module
        actions = self.actions

        def exec_module(module):
            run_module(module)
            for attach, fail in actions:
                try:
                    attach(module)
                except Exception as exc:
                    fail(exc)

        loader.exec_module = exec_module
        return spec

    def find_module(self, name, path=None):  # Python < 3.4 protocol: unused
        return None


def _install():
    init_text = os.environ.get("DLPROF_PYTORCH_INIT")
    capture_text = os.environ.get("DLPROF_TORCH_CAPTURE")
    if not (init_text or capture_text) or "torch" in sys.modules:
        return
    actions = []
    annotations = None
    if init_text:
        annotations = _Annotations(json.loads(init_text))

        def init_failed(exc):
            _warn("PyTorch not annotated: %s: %s" % (type(exc).__name__, exc))

        actions.append((annotations.attach, init_failed))
    if capture_text:
        capture = _Capture(json.loads(capture_text), annotations)
        actions.append((capture.attach, capture._fail))
    sys.meta_path.insert(0, _TorchImportWatcher(actions))


def _chain():
    """Run the next `sitecustomize` on sys.path (this one shadows it) under the name sitecustomize."""
    import importlib.machinery
    import importlib.util

    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _install()
except Exception as exc:
    _warn("not installed: %s: %s" % (type(exc).__name__, exc))
try:
    _chain()
except Exception as exc:
    _warn("the next sitecustomize failed: %s: %s" % (type(exc).__name__, exc))
