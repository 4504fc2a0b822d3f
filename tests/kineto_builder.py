"""Write Kineto (torch.profiler) Chrome-trace JSON files from code, in the layout PyTorch 2.x writes:
times in integer ns here, written as microsecond decimals with 3 places (`"ts": 1000000000.123`),
`baseTimeNanoseconds`, `process_name`/`thread_name` metadata, `ac2g` flow arrows, the profiler span."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def us(ns: int) -> str:
    """Integer ns as Kineto's microsecond text (exact, no binary float on the way)."""
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


class KinetoTrace:
    """Events added in any order; `write` emits them as Kineto does (one JSON object per event)."""

    def __init__(self, pid: int = 4242, base_ns: int = 1_700_000_000_000_000_000, dialect: str = "2.x"):
        self.pid = pid
        self.base_ns = base_ns
        self.dialect = dialect  # "2.x" (cpu_op, cuda_runtime, kernel ...) or "2021" (Operator, Runtime ...)
        self.events: list[str] = []  # JSON texts, so times stay exact decimals
        self.top: dict = {"schemaVersion": 1, "deviceProperties": []}
        self.next_correlation = 1000
        self.next_external = 1

    def cat(self, name: str) -> str:
        if self.dialect == "2021":
            return {
                "cpu_op": "Operator",
                "cuda_runtime": "Runtime",
                "kernel": "Kernel",
                "gpu_memcpy": "Memcpy",
                "gpu_memset": "Memset",
            }.get(name, name)
        return name

    def _event(
        self,
        ph: str,
        cat: str | None,
        name: str,
        pid,
        tid,
        ts: int,
        dur: int | None = None,
        args: dict | None = None,
        extra: dict | None = None,
    ) -> None:
        parts = [f'"ph": "{ph}"']
        if cat is not None:
            parts.append(f'"cat": {json.dumps(cat)}')
        parts += [
            f'"name": {json.dumps(name)}',
            f'"pid": {json.dumps(pid)}',
            f'"tid": {json.dumps(tid)}',
            f'"ts": {us(ts)}',
        ]
        if dur is not None:
            parts.append(f'"dur": {us(dur)}')
        for key, value in (extra or {}).items():
            parts.append(f'"{key}": {json.dumps(value)}')
        if args is not None:
            parts.append(f'"args": {json.dumps(args)}')
        self.events.append("{" + ", ".join(parts) + "}")

    def tid_value(self, tid: int):
        return str(tid) if self.dialect == "2021" else tid

    # -------------------------------------------------------------- CPU side

    def cpu_op(
        self,
        tid: int,
        ts: int,
        dur: int,
        name: str,
        seq: int | None = None,
        fwd_tid: int | None = None,
        dims=None,
        types=None,
        stack: str | None = None,
        extra_args: dict | None = None,
    ) -> int:
        ext = self.next_external
        self.next_external += 1
        args = {"External id": ext, "Record function id": 0}
        if seq is not None:
            args["Sequence number"] = seq
            args["Fwd thread id"] = 0 if fwd_tid is None else fwd_tid
        if dims is not None:
            args["Input Dims"] = dims
        if types is not None:
            args["Input type"] = types
        if stack is not None:
            args["Call stack"] = stack
        args.update(extra_args or {})
        self._event("X", self.cat("cpu_op"), name, self.pid, self.tid_value(tid), ts, dur, args)
        return ext

    def annotation(self, tid: int, ts: int, dur: int, name: str) -> None:
        # 2021 traces had no user_annotation category: record_function labels were Operator events
        self._event(
            "X",
            self.cat("cpu_op") if self.dialect == "2021" else "user_annotation",
            name,
            self.pid,
            self.tid_value(tid),
            ts,
            dur,
            {"External id": self.next_external},
        )
        self.next_external += 1

    def python(self, tid: int, ts: int, dur: int, name: str) -> None:
        self._event("X", "python_function", name, self.pid, tid, ts, dur, {"Python id": len(self.events)})

    def runtime(
        self,
        tid: int,
        ts: int,
        dur: int,
        name: str = "cudaLaunchKernel",
        correlation: int | None = None,
        flow: bool = True,
        args_correlation: bool = True,
    ) -> int:
        corr = correlation if correlation is not None else self.next_correlation
        self.next_correlation = max(self.next_correlation, corr) + 1
        args = {"cbid": 211}
        if args_correlation:
            args["correlation"] = corr
        self._event("X", self.cat("cuda_runtime"), name, self.pid, self.tid_value(tid), ts, dur, args)
        if flow:
            self._event("s", "ac2g", "ac2g", self.pid, self.tid_value(tid), ts, extra={"id": corr})
        return corr

    # -------------------------------------------------------------- GPU side

    def _gpu(
        self,
        cat: str,
        name: str,
        device: int,
        stream: int,
        ts: int,
        dur: int,
        correlation: int,
        args: dict,
        flow: bool = True,
        args_correlation: bool = True,
    ) -> None:
        args = {"device": device, "context": 1, "stream": stream, **args}
        if args_correlation:
            args["correlation"] = correlation
        tid = f"stream {stream}" if self.dialect == "2021" else stream
        self._event("X", self.cat(cat), name, device, tid, ts, dur, args)
        if flow:
            self._event("f", "ac2g", "ac2g", device, tid, ts, extra={"id": correlation, "bp": "e"})

    def kernel(
        self,
        name: str,
        ts: int,
        dur: int,
        correlation: int,
        device: int = 0,
        stream: int = 7,
        grid=(1, 1, 1),
        block=(128, 1, 1),
        **kw,
    ) -> None:
        self._gpu(
            "kernel",
            name,
            device,
            stream,
            ts,
            dur,
            correlation,
            {"registers per thread": 32, "shared memory": 0, "grid": list(grid), "block": list(block)},
            **kw,
        )

    def memcpy(
        self,
        ts: int,
        dur: int,
        correlation: int,
        direction: str = "HtoD",
        nbytes: int = 4096,
        device: int = 0,
        stream: int = 7,
    ) -> None:
        label = {
            "HtoD": "Memcpy HtoD (Pageable -> Device)",
            "DtoH": "Memcpy DtoH (Device -> Pageable)",
            "DtoD": "Memcpy DtoD (Device -> Device)",
        }[direction]
        self._gpu("gpu_memcpy", label, device, stream, ts, dur, correlation, {"bytes": nbytes})

    def memset(self, ts: int, dur: int, correlation: int, nbytes: int = 64, device: int = 0, stream: int = 7) -> None:
        self._gpu("gpu_memset", "Memset (Device)", device, stream, ts, dur, correlation, {"bytes": nbytes})

    def memory(
        self,
        tid: int,
        ts: int,
        nbytes: int,
        total_allocated: int | None = None,
        total_reserved: int | None = None,
        device_type: int = 1,
        device_id: int = 0,
        addr: int | None = None,
    ) -> None:
        """A `[memory]` instant event (profile_memory=True): 2.x traces write Total Allocated/Reserved and Addr,
        2021 traces only Bytes and the device."""
        args = {"Device Type": device_type, "Device Id": device_id, "Bytes": nbytes}
        if addr is not None:
            args["Addr"] = addr
        if total_allocated is not None:
            args["Total Allocated"] = total_allocated
        if total_reserved is not None:
            args["Total Reserved"] = total_reserved
        cat = None if self.dialect == "2021" else "cpu_instant_event"
        self._event("i", cat, "[memory]", self.pid, self.tid_value(tid), ts, args=args, extra={"s": "t"})

    # -------------------------------------------------------------- the rest

    def raw(self, text: str) -> None:
        """An event given as JSON text (for malformed events)."""
        self.events.append(text)

    def metadata(self, threads: dict[int, str], process_name: str = "python") -> None:
        self._event("M", None, "process_name", self.pid, 0, 0, args={"name": process_name})
        self._event("M", None, "process_labels", self.pid, 0, 0, args={"labels": "CPU"})
        for tid, name in threads.items():
            self._event("M", None, "thread_name", self.pid, tid, 0, args={"name": f"thread {tid} ({name})"})

    def span(self, ts: int, dur: int) -> None:
        self._event("X", "Trace", "PyTorch Profiler (0)", "Spans", "PyTorch Profiler", ts, dur, {"Op count": 0})

    def device(self, device_id: int, name: str = "NVIDIA A100-SXM4-40GB", sms: int = 108) -> None:
        self.top["deviceProperties"].append(
            {
                "id": device_id,
                "name": name,
                "totalGlobalMem": 42505273344,
                "computeMajor": 8,
                "computeMinor": 0,
                "numSms": sms,
            }
        )

    def text(self) -> str:
        head = {k: v for k, v in self.top.items()}
        if self.dialect != "2021":
            head["displayTimeUnit"] = "ms"
            head["baseTimeNanoseconds"] = self.base_ns
        body = ",\n  ".join(self.events)
        return json.dumps(head)[:-1] + ', "traceEvents": [\n  ' + body + "\n]}\n"

    def write(self, path: Path, gz: bool = False) -> Path:
        path = Path(path)
        data = self.text().encode()
        path.write_bytes(gzip.compress(data) if gz else data)
        return path
