"""Named synthetic profiles with hand-computable figures, shared by engine, plugin and browser tests.

`training_profile` is a small PyTorch emit_nvtx-style training run on one A100; its layout per iteration
is documented next to the code so tests can derive every expected number by hand.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.nsys_builder import NsysExport

PID = 100
TC_CONV = "volta_fp16_s884cudnn_fp16_128x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1"  # uses Tensor Cores
RELU = "vectorized_elementwise_kernel"  # no TC
SGEMM = "volta_sgemm_32x32_sliced1x4_tn"  # no TC (fp32 SIMT)
TC_WGRAD = "volta_fp16_s884cudnn_fp16_256x64_ldg8_dgrad_f2f_exp_small_nhwc_tn_v1"  # uses Tensor Cores
ADD = "multi_tensor_apply_kernel"  # no TC

ITERATION_SPAN = 100_000  # ns between iteration bases
BASE = 1_000_000  # first iteration base


def training_profile(path: Path, iterations: int = 3, schema: str = "2022.4") -> Path:
    """A PyTorch training loop: per iteration (base T = BASE + i * ITERATION_SPAN, all times in ns):

    main thread (tid 100)
      [T+0,     T+5000)   enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__   (scope, dataloader)
      [T+6000,  T+9000)   aten::to, seq        -> cudaMemcpyAsync [T+6500,T+7500) -> memcpy HtoD [T+7000,T+8000)
      [T+10000, T+20000)  aten::conv2d, seq=S           -> nested aten::convolution [T+11000,T+19000)
                              cudaLaunchKernel [T+12000,T+13000) -> TC_CONV [T+14000,T+24000)
      [T+21000, T+25000)  aten::relu, seq=S+1           -> cudaLaunchKernel [T+22000,T+23000) -> RELU [T+25000,T+27000)
      [T+26000, T+36000)  aten::linear, seq=S+2         -> nested aten::t, seq=S+2 [T+26500,T+27500)
                                                           nested aten::addmm, seq=S+3 [T+28000,T+35000)
                              cudaLaunchKernel [T+29000,T+30000) -> SGEMM [T+37000,T+45000)
      [T+70000, T+80000)  Optimizer.step#SGD.step       (scope; the default key node)
                              nested aten::add_, seq  [T+71000,T+79000)
                              cudaLaunchKernel [T+72000,T+73000) -> ADD [T+74000,T+76000)
      [T+85000, T+90000)  cudaDeviceSynchronize outside every range (unassociated)
    autograd thread (tid 101)
      [T+50000, T+56000)  AddmmBackward0, seq=S+3       -> cudaLaunchKernel [T+51000,T+52000)
                                                          -> SGEMM [T+53000,T+61000)
      [T+57000, T+65000)  ConvolutionBackward0, seq=S   -> cudaLaunchKernel [T+58000,T+59000)
                                                          -> TC_WGRAD [T+62000,T+68000)
    """
    exp = NsysExport(schema=schema)
    exp.add_gpu(device_id=0, name="NVIDIA A100-SXM4-40GB", total_memory=42505273344, sm_count=108, compute=(8, 0))
    exp.system_env("CpuDescription", "Test CPU @ 2.00GHz")
    exp.system_env("NvDriverVersion", "535.104.05")
    exp.system_env("CudaDriverVersion", "12020")
    main = exp.add_thread(pid=PID, tid=PID, name="python", process_name="python")
    grad = exp.add_thread(pid=PID, tid=PID + 1, name="pt_autograd_0", process_name="python")
    op_id = 1
    for i in range(iterations):
        t = BASE + i * ITERATION_SPAN
        s = 10 * i + 1  # autograd sequence numbers of this iteration

        def rng(tid, a, b, label, seq=None):
            nonlocal op_id
            text = label + (f", seq = {seq}" if seq is not None else "") + f", op_id = {op_id}"
            op_id += 1
            exp.push_pop(tid, t + a, t + b, text)

        rng(main, 0, 5000, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__")
        rng(main, 6000, 9000, "aten::to", s + 5)
        corr = exp.runtime(main, t + 6500, t + 7500, name="cudaMemcpyAsync_v3020")
        exp.memcpy(PID, corr, t + 7000, t + 8000, bytes=1 << 20, copy_kind=1)
        rng(main, 10000, 20000, "aten::conv2d", s)
        rng(main, 11000, 19000, "aten::convolution", s)
        exp.launch(main, t + 12000, t + 13000, t + 14000, t + 24000, kernel=TC_CONV)
        rng(main, 21000, 25000, "aten::relu", s + 1)
        exp.launch(main, t + 22000, t + 23000, t + 25000, t + 27000, kernel=RELU)
        rng(main, 26000, 36000, "aten::linear", s + 2)
        rng(main, 26500, 27500, "aten::t", s + 2)
        rng(main, 28000, 35000, "aten::addmm", s + 3)
        exp.launch(main, t + 29000, t + 30000, t + 37000, t + 45000, kernel=SGEMM)
        rng(grad, 50000, 56000, "AddmmBackward0", s + 3)
        exp.launch(grad, t + 51000, t + 52000, t + 53000, t + 61000, kernel=SGEMM)
        rng(grad, 57000, 65000, "ConvolutionBackward0", s)
        exp.launch(grad, t + 58000, t + 59000, t + 62000, t + 68000, kernel=TC_WGRAD)
        rng(main, 70000, 80000, "Optimizer.step#SGD.step")
        rng(main, 71000, 79000, "aten::add_", s + 6)
        exp.launch(main, t + 72000, t + 73000, t + 74000, t + 76000, kernel=ADD)
        exp.runtime(main, t + 85000, t + 90000, name="cudaDeviceSynchronize_v3020")
    exp.set_session(start_time=0)
    return exp.write(path)


def run_dlprof(*args: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run the dlprof CLI in a subprocess (as users do); returns the completed process."""
    proc = subprocess.run(
        [sys.executable, "-m", "dlprof_profiler", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"dlprof {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def make_logdir(root: Path, runs: dict[str, Path] | None = None) -> Path:
    """A TensorBoard logdir with one dlprof run per {run name: nsys export, or a run folder analysed already
    (conftest's `training_run`), copied}; default: the training profile as run `training` (3 iterations, key
    node the optimizer step)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    if runs is None:
        runs = {"training": training_profile(root.parent / f"{root.name}_training.sqlite")}
    for name, source in runs.items():
        if Path(source).is_dir():
            shutil.copytree(source, root / name)
        else:
            run_dlprof(f"--database={source}", f"--output_path={root / name}", "--reports=summary", "-v", "quiet")
    return root


def backward_calls_profile(path: Path, iterations: int = 3) -> Path:
    """dlprof_profiler.pytorch markers: per iteration (base T = BASE + i * ITERATION_SPAN) a forward
    `linear` call [T+0, T+10000) launching SGEMM, then on the autograd thread its two backward nodes
    (AddmmBackward0 [T+20000, T+26000), TBackward0 [T+27000, T+31000)) carrying one backward callid: one
    bprop call of 2 kernels; an optimizer step [T+40000, T+45000) ends the iteration."""
    exp = NsysExport(schema="2022.4")
    exp.add_gpu(device_id=0, name="NVIDIA A100-SXM4-40GB", total_memory=42505273344, sm_count=108, compute=(8, 0))
    main = exp.add_thread(pid=PID, tid=PID, name="python", process_name="python")
    grad = exp.add_thread(pid=PID, tid=PID + 1, name="pt_autograd_0", process_name="python")
    stack = "{'traceMarker': ['train.py:20'], 'funcStack': '/<module>/Net::forward/Linear::forward/linear'}"
    for i in range(iterations):
        t = BASE + i * ITERATION_SPAN
        fwd, bwd = 10 + 2 * i, 11 + 2 * i
        exp.push_pop(main, t, t + 10000, stack)
        exp.push_pop(
            main,
            t + 100,
            t + 9900,
            "{'mod': 'torch.nn.functional', 'op': 'linear', 'callid': %d, "
            "'args': [{'name': '', 'type': 'tensor', 'shape': (4, 3), "
            "'dtype': 'float32'}]}" % fwd,
        )
        exp.launch(main, t + 1000, t + 2000, t + 3000, t + 8000, kernel=SGEMM)
        for node, (a, b) in (("AddmmBackward0", (20000, 26000)), ("TBackward0", (27000, 31000))):
            exp.push_pop(grad, t + a, t + b, stack)
            exp.push_pop(
                grad,
                t + a + 100,
                t + b - 100,
                "{'mod': 'torch.nn.functional', 'op': 'linear', 'dir': 'bprop', 'node': '%s', "
                "'fwdCallid': %d, 'callid': %d, 'args': []}" % (node, fwd, bwd),
            )
            exp.launch(grad, t + a + 1000, t + a + 2000, t + a + 2500, t + a + 4500, kernel=SGEMM)
        exp.push_pop(main, t + 40000, t + 45000, "Optimizer.step#SGD.step")
    exp.set_session(start_time=0)
    return exp.write(path)


FLOPS_GPU = "NVIDIA A100-SXM4-80GB"  # peaks (gpu_peaks.py): fp16 Tensor Cores 312, fp32 19.5 TFLOP/s
HGEMM = "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn"  # Tensor Cores; its name shows float16
FLOPS_SPAN = 600_000  # ns between iteration bases
# (op, emit_nvtx sizes, FLOPs per call by hand, kernel, kernel ns) of the forward ops of flops_profile
FLOPS_OPS = {
    "aten::mm": ([[1024, 2048], [2048, 4096]], 2 * 1024 * 2048 * 4096, HGEMM, 100_000),
    "aten::linear": ([[512, 4096], [1024, 4096], [1024]], 2 * 512 * 4096 * 1024, HGEMM, 50_000),
    "aten::bmm": ([[8, 256, 512], [8, 512, 256]], 2 * 8 * 256 * 512 * 256, "volta_sgemm_128x64_nn", 100_000),
    "aten::relu": ([[512, 1024]], None, RELU, 10_000),
}
FLOPS_BACKWARD = {"aten::linear": ("AddmmBackward0", 100_000), "aten::mm": ("MmBackward0", 200_000)}


def flops_profile(path: Path, iterations: int = 3) -> Path:
    """emit_nvtx ranges with sizes on an A100-SXM4-80GB, for FLOPs, achieved TFLOP/s and MFU by hand. Per
    iteration (T = BASE + i * FLOPS_SPAN, ns), kernels back to back on one stream from T+10000:

    main thread (tid 100), each range launching its kernel 1000 ns after it starts (FLOPS_OPS):
      [T+0, T+5000)       aten::mm, seq = S,       sizes [[1024, 2048], [2048, 4096]] -> HGEMM 100 us
      [T+5000, T+9000)    aten::linear, seq = S+1, sizes [[512, 4096], [1024, 4096], [1024]] -> HGEMM 50 us
      [T+9000, T+12000)   aten::bmm (no seq),      sizes [[8, 256, 512], [8, 512, 256]] -> FP32 sgemm 100 us
      [T+12000, T+14000)  aten::relu, seq = S+2,   sizes [[512, 1024]] -> elementwise 10 us
    autograd thread (tid 101):
      [T+20000, T+25000)  AddmmBackward0, seq = S+1 -> HGEMM 100 us   (bprop of aten::linear)
      [T+25000, T+30000)  MmBackward0, seq = S      -> HGEMM 200 us   (bprop of aten::mm)
    main thread, every iteration but the last:
      [T+580000, T+590000) Optimizer.step#SGD.step with aten::add_ -> ADD [T+585000, T+586000)

    The HGEMMs end at T+570000; the wall clock is (iterations - 1) * FLOPS_SPAN + 570000."""
    exp = NsysExport(schema="2022.4")
    exp.add_gpu(device_id=0, name=FLOPS_GPU, total_memory=85899345920, sm_count=108, compute=(8, 0))
    main = exp.add_thread(pid=PID, tid=PID, name="python", process_name="python")
    grad = exp.add_thread(pid=PID, tid=PID + 1, name="pt_autograd_0", process_name="python")
    op_id = 1
    for i in range(iterations):
        t = BASE + i * FLOPS_SPAN
        s = 10 * i + 1
        gpu = t + 10_000
        seqs = {"aten::mm": s, "aten::linear": s + 1, "aten::bmm": None, "aten::relu": s + 2}
        calls = [
            (main, a, b, op) for (a, b), op in zip(((0, 5000), (5000, 9000), (9000, 12000), (12000, 14000)), FLOPS_OPS)
        ]
        calls += [(grad, 20000, 25000, "aten::linear"), (grad, 25000, 30000, "aten::mm")]
        for tid, a, b, op in calls:
            if tid == main:
                sizes, _, kernel, dur = FLOPS_OPS[op]
                seq = seqs[op]
                text = op + (f", seq = {seq}" if seq is not None else "") + f", op_id = {op_id}, sizes = {sizes}"
            else:
                node, dur = FLOPS_BACKWARD[op]
                kernel, text = HGEMM, f"{node}, seq = {seqs[op]}, op_id = {op_id}"
            op_id += 1
            exp.push_pop(tid, t + a, t + b, text)
            exp.launch(tid, t + a + 1000, t + a + 2000, gpu, gpu + dur, kernel=kernel)
            gpu += dur
        if i < iterations - 1:
            exp.push_pop(main, t + 580000, t + 590000, "Optimizer.step#SGD.step")
            exp.push_pop(main, t + 581000, t + 589000, f"aten::add_, seq = {s + 6}, op_id = {op_id}")
            op_id += 1
            exp.launch(main, t + 582000, t + 583000, t + 585000, t + 586000, kernel=ADD)
    exp.set_session(start_time=0)
    return exp.write(path)


RANK_BASE = 1_000_000  # first iteration base of every rank
RANK_ITERATION = 50_000  # iteration length of a rank at normal speed (ns)
SLOW_ITERATION = 80_000  # ... and of the slow rank
RANK_STEPS = 3  # optimizer steps: iterations 0..2 full, iteration 3 the 1000 ns tail
COMPUTE = "volta_sgemm_32x32_sliced1x4_tn"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def rank_profile(
    path: Path,
    rank: int,
    slow: bool = False,
    host: str = "node0",
    env_rank: bool = False,
    epoch_ns: int | None = None,
    steps: int = RANK_STEPS,
) -> Path:
    """One rank of a data-parallel job on one GPU (process 1000 + rank). Per iteration (base T = RANK_BASE + i * L,
    L = RANK_ITERATION, or SLOW_ITERATION for the slow rank; all times ns):

      [T+0, T+10000)        aten::conv2d, seq   -> cudaLaunchKernel [T+1000, T+2000) -> COMPUTE [T+3000, T+23000)
                                                   (slow rank: [T+3000, T+43000))
      [T+12000, T+14000)    c10d::allreduce_    -> cudaLaunchKernel [T+12500, T+13500) -> NCCL [T+15000, T+25000)
                                                   on stream 13 (8000 ns of it overlapped by COMPUTE; slow: all)
      [T+L-2000, T+L)       Optimizer.step#SGD.step (the key node: iteration i ends at T+L)
    then one cudaDeviceSynchronize [RANK_BASE + steps*L, +1000): the last iteration, 1000 ns.
    `env_rank` records RANK=<rank> in the environment nsys saw (as `srun nsys profile` does)."""
    kw = {} if epoch_ns is None else {"utc_epoch_ns": epoch_ns}
    exp = NsysExport(schema="2022.4")
    exp.add_gpu(device_id=0, name="NVIDIA A100-SXM4-40GB", total_memory=42505273344, sm_count=108, compute=(8, 0))
    exp.system_env("Hostname", host)
    if env_rank:
        exp.system_env("DeviceEnvironment", f"HOME=/root;LOCAL_RANK=0;RANK={rank};WORLD_SIZE=4")
    pid = 1000 + rank
    main = exp.add_thread(pid=pid, tid=pid, name="python", process_name="python")
    length = SLOW_ITERATION if slow else RANK_ITERATION
    compute = 40_000 if slow else 20_000
    op_id = 1
    for i in range(steps):
        t = RANK_BASE + i * length
        exp.push_pop(main, t, t + 10_000, f"aten::conv2d, seq = {i + 1}, op_id = {op_id}")
        exp.launch(main, t + 1000, t + 2000, t + 3000, t + 3000 + compute, kernel=COMPUTE)
        exp.push_pop(main, t + 12_000, t + 14_000, f"c10d::allreduce_, op_id = {op_id + 1}")
        exp.launch(main, t + 12_500, t + 13_500, t + 15_000, t + 25_000, kernel=NCCL, stream_id=13)
        exp.push_pop(main, t + length - 2000, t + length, f"Optimizer.step#SGD.step, op_id = {op_id + 2}")
        op_id += 3
    end = RANK_BASE + steps * length
    exp.runtime(main, end, end + 1000, name="cudaDeviceSynchronize_v3020")
    exp.set_session(start_time=0, **kw)
    return exp.write(path)


MIB = 1 << 20


def memory_profile(path: Path, iterations: int = 3) -> Path:
    """CUDA memory events (`nsys profile --cuda-memory-usage=true`) in a PyTorch loop, for hand-computed
    memory figures. Per iteration i (T = BASE + i * ITERATION_SPAN; key node Optimizer.step, which ends at
    T+30000, so what comes after it belongs to the next iteration):

    main thread (tid 100)
      [T+1000,  T+3000)   aten::empty     cudaMalloc [T+1500,T+2500)    -> +4096 B on GPU 0 at T+2000
      [T+5000,  T+9000)   aten::conv2d    cudaMalloc [T+6000,T+7000)    -> +1 MiB on GPU 0 at T+6500
                                          cudaLaunchKernel [T+7500,T+8000) -> TC_CONV [T+8500,T+12000)
      [T+10000, T+12000)  aten::to        cudaHostAlloc [T+10500,T+11500) -> +2048 B pinned host memory at
                                          T+11000 (iteration 0 only)
      [T+20000, T+30000)  Optimizer.step#SGD.step (scope)
        [T+21000, T+29000)  aten::add_    cudaFree [T+22000,T+23000)    -> -1 MiB on GPU 0 at T+22500
      cudaFree [T+35000,T+36000) outside every range (unassociated) -> -4096 B on GPU 0 at T+36500, after the
                                          call returned: it is attributed by its call
      +512 B on GPU 1 at T+40000 without a CUDA API call (no thread: no op)
    """
    exp = NsysExport(schema="2022.4")
    for device in (0, 1):
        exp.add_gpu(
            device_id=device, name="NVIDIA A100-SXM4-40GB", total_memory=42505273344, sm_count=108, compute=(8, 0)
        )
    main = exp.add_thread(pid=PID, tid=PID, name="python", process_name="python")
    op_id = 1
    for i in range(iterations):
        t = BASE + i * ITERATION_SPAN

        def rng(a, b, label, seq=None):
            nonlocal op_id
            text = label + (f", seq = {seq}" if seq is not None else "") + f", op_id = {op_id}"
            op_id += 1
            exp.push_pop(main, t + a, t + b, text)

        rng(1000, 3000, "aten::empty")
        corr = exp.runtime(main, t + 1500, t + 2500, name="cudaMalloc_v3020")
        exp.memory_usage(PID, t + 2000, 4096, correlation_id=corr, address=0x10000)
        rng(5000, 9000, "aten::conv2d", 10 * i + 1)
        corr = exp.runtime(main, t + 6000, t + 7000, name="cudaMalloc_v3020")
        exp.memory_usage(PID, t + 6500, MIB, correlation_id=corr, address=0x20000)
        exp.launch(main, t + 7500, t + 8000, t + 8500, t + 12000, kernel=TC_CONV)
        if i == 0:
            rng(10000, 12000, "aten::to", 10 * i + 2)
            corr = exp.runtime(main, t + 10500, t + 11500, name="cudaHostAlloc_v3020")
            exp.memory_usage(PID, t + 11000, 2048, mem_kind=1, correlation_id=corr, address=0x30000)
        rng(20000, 30000, "Optimizer.step#SGD.step")
        rng(21000, 29000, "aten::add_", 10 * i + 3)
        corr = exp.runtime(main, t + 22000, t + 23000, name="cudaFree_v3020")
        exp.memory_usage(PID, t + 22500, MIB, free=True, correlation_id=corr, address=0x20000)
        corr = exp.runtime(main, t + 35000, t + 36000, name="cudaFree_v3020")
        exp.memory_usage(PID, t + 36500, 4096, free=True, correlation_id=corr, address=0x10000)
        exp.memory_usage(PID, t + 40000, 512, device_id=1, address=0x40000 + i)
    exp.set_session(start_time=0)
    return exp.write(path)
