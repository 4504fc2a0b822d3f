"""dlprof's startup hook for `dlprof --backend=torch`: profile a Python program with torch.profiler
without changing its code.

dlprof puts this folder first on PYTHONPATH and describes the capture in the DLPROF_TORCH_CAPTURE
environment variable (JSON). Python imports `sitecustomize` at start-up; this one then

- runs any other `sitecustomize` further down sys.path (the user's or the distribution's), so nothing
  the environment relied on is lost;
- waits for the program to import torch (a one-shot import hook: programs and child processes that
  never import torch are left alone and pay nothing) and then creates a `torch.profiler.profile`
  (CPU, plus CUDA/ROCm/XPU activities when this torch supports them; shapes and Python stacks recorded);
- marks iterations at optimizer steps (a global `torch.optim` step post-hook calls `profile.step()`, so
  the trace holds `ProfilerStep#N` ranges and `torch.profiler.schedule` selects the iterations to keep);
- honours the delay and duration at module calls and optimizer steps (torch.profiler must be started
  and stopped on the thread that runs the model, never from a timer thread);
- writes `<pid>.pt.trace.json.gz` into the capture folder when collection ends: when the iteration
  window is complete, when the duration is over (then, as nsys does, the program is ended with
  SIGTERM), at interpreter exit, or on SIGTERM.

It uses only the standard library and torch: the profiled interpreter need not have dlprof installed.
Any failure is reported in one line on stderr and leaves the program running unprofiled.
"""

import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_PREFIX = "[DLProf torch capture]"


def _warn(text):
    try:
        sys.stderr.write("%s %s\n" % (_PREFIX, text))
        sys.stderr.flush()
    except Exception:  # a closed stderr must not break the program
        pass


class _Capture:
    """One process's torch.profiler session, driven by the program's own module calls and optimizer steps."""

    def __init__(self, config):
        import time

        self.time = time.time
        self.config = config
        self.folder = config["dir"]
        self.start_at = float(config.get("t0") or self.time()) + float(config.get("delay") or 0)
        self.duration = config.get("duration")
        self.stop_at = None
        self.state = "waiting"  # waiting -> recording -> written
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
            self.prof.stop()  # while recording, stopping calls on_trace_ready (_write)
        except Exception as exc:
            self._fail(exc)
            return
        if self.state == "recording":  # the iteration window was never reached: nothing to write
            self.state = "stopped"
            _warn("the program ended before the iteration window: no trace written")

    def _on_sigterm(self, signum, frame):
        self.finish()
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def _fail(self, exc):
        self.state = "failed"
        _warn("torch.profiler capture stopped: %s: %s" % (type(exc).__name__, exc))


class _TorchImportWatcher:
    """A one-shot import hook: when `torch` has been imported, attach the capture."""

    def __init__(self, capture):
        self.capture = capture

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
        capture = self.capture

        def exec_module(module):
            run_module(module)
            try:
                capture.attach(module)
            except Exception as exc:
                capture._fail(exc)

        loader.exec_module = exec_module
        return spec

    def find_module(self, name, path=None):  # Python < 3.4 protocol: unused
        return None


def _install():
    text = os.environ.get("DLPROF_TORCH_CAPTURE")
    if not text or "torch" in sys.modules:
        return
    config = json.loads(text)
    sys.meta_path.insert(0, _TorchImportWatcher(_Capture(config)))


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
    _warn("capture hook not installed: %s: %s" % (type(exc).__name__, exc))
try:
    _chain()
except Exception as exc:
    _warn("the next sitecustomize failed: %s: %s" % (type(exc).__name__, exc))
