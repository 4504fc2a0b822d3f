"""Generate examples/sample_pytorch_training.sqlite: a synthetic Nsight Systems export (real nsys 2022.4
schema, written by tests/nsys_builder.py) of a small CNN trained with PyTorch on one A100 under
`emit_nvtx`, 12 iterations of which the first two are slow warm-up iterations (cuDNN autotuning).

    python examples/make_sample_profile.py [--force]

The sample ships with the project so the README's quick start runs without a GPU; this script shows
exactly what is in it and regenerates it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.nsys_builder import NsysExport  # noqa: E402

SAMPLE = ROOT / "examples" / "sample_pytorch_training.sqlite"
PID = 4321

# (label, forward kernel, its duration in us, backward kernel, its duration in us); fp16 convolutions use
# Tensor Cores, the fp32 linear layer does not (a case for AMP), the rest are elementwise kernels.
LAYERS = [
    (
        "aten::conv2d",
        "volta_fp16_s884cudnn_fp16_128x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1",
        180,
        "volta_fp16_s884cudnn_fp16_256x64_ldg8_dgrad_f2f_exp_small_nhwc_tn_v1",
        260,
    ),
    ("aten::batch_norm", "cudnn::bn_fw_tr_1C11_kernel_NCHW", 40, "cudnn::bn_bw_1C11_kernel_new", 55),
    ("aten::relu", "vectorized_elementwise_kernel", 15, "vectorized_elementwise_kernel", 18),
    (
        "aten::conv2d",
        "sm80_xmma_fprop_implicit_gemm_f16f16_f16f16_f16_nhwckrsc_nhwc_tilesize128x128x32_stage4_"
        "warpsize2x2x1_g1_tensor16x8x16_execute_kernel",
        150,
        "sm80_xmma_dgrad_implicit_gemm_f16f16_f16f16_f16_nhwckrsc_nhwc_tilesize128x128x32_stage4_warpsize2x2x1_g1_"
        "tensor16x8x16_execute_kernel",
        210,
    ),
    ("aten::batch_norm", "cudnn::bn_fw_tr_1C11_kernel_NCHW", 35, "cudnn::bn_bw_1C11_kernel_new", 50),
    ("aten::relu", "vectorized_elementwise_kernel", 12, "vectorized_elementwise_kernel", 15),
    ("aten::adaptive_avg_pool2d", "reduce_kernel", 25, "elementwise_kernel", 20),
    ("aten::linear", "volta_sgemm_128x64_nn", 120, "volta_sgemm_64x64_nt", 160),
    ("aten::cross_entropy_loss", "reduce_kernel", 20, "elementwise_kernel", 15),
]
BACKWARD_NODES = {
    "aten::conv2d": "ConvolutionBackward0",
    "aten::batch_norm": "CudnnBatchNormBackward0",
    "aten::relu": "ReluBackward0",
    "aten::adaptive_avg_pool2d": "MeanBackward1",
    "aten::linear": "AddmmBackward0",
    "aten::cross_entropy_loss": "NllLossBackward0",
}


def build(path: Path, iterations: int = 12, seed: int = 7) -> Path:
    rng = np.random.default_rng(seed)
    exp = NsysExport(schema="2022.4")
    exp.add_gpu(
        device_id=0,
        name="NVIDIA A100-SXM4-40GB",
        total_memory=42505273344,
        sm_count=108,
        compute=(8, 0),
        bus_location="0000:07:00.0",
        chip_name="GA100",
    )
    exp.system_env("CpuDescription", "AMD EPYC 7742 64-Core Processor")
    exp.system_env("NvDriverVersion", "535.104.05")
    exp.system_env("CudaDriverVersion", "12020")
    exp.system_env("Hostname", "trainer-01")
    main = exp.add_thread(pid=PID, tid=PID, name="python", process_name="python")
    grad = exp.add_thread(pid=PID, tid=PID + 1, name="pt_autograd_0", process_name="python")
    config = (
        '{"model_config": {"torch_version": "2.3.1", "cuda_version": "12.1", "cudnn_version": 8902, '
        '"cudnn_benchmark": true, "amp_enabled": true, "detect_anomaly": false, "emit_nvtx": true, '
        '"num_workers": 2, "pin_memory": false, "batch_size": 32, "gpu_total_memory": 42505273344, '
        '"gpu_name": "NVIDIA A100-SXM4-40GB"}}'
    )
    exp.push_pop(main, 500_000, 500_000, config)
    op_id, seq = 1, 0
    t = 1_000_000  # CPU clock (ns)
    gpu = 1_000_000  # the GPU stream's clock: kernels queue behind each other
    for it in range(iterations):
        slow = 4.0 if it < 2 else 1.0  # warm-up iterations: cuDNN autotuning and allocator growth

        def rng_range(thread, start, end, text):
            nonlocal op_id
            exp.push_pop(thread, start, end, f"{text}, op_id = {op_id}")
            op_id += 1

        load = int(rng.integers(300_000, 400_000))
        rng_range(main, t, t + load, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__")
        t += load + 5_000
        corr = exp.runtime(main, t + 1_000, t + 9_000, name="cudaMemcpyAsync_v3020")
        gpu = max(gpu, t + 10_000)
        exp.memcpy(PID, corr, gpu, gpu + 120_000, bytes=32 * 3 * 224 * 224 * 2, copy_kind=1, src_kind=0)
        gpu += 120_000
        rng_range(main, t, t + 12_000, f"aten::to, seq = {seq}")
        t += 15_000

        def op(thread, start, cpu, text, kernel, dur_us):
            """An op range launching one kernel a third of the way in; returns where the op ends."""
            nonlocal gpu
            rng_range(thread, start, start + cpu, text)
            call = start + cpu // 3
            launch_start = max(gpu, call + 6_000)  # the kernel queues behind the previous one
            run = int(dur_us * 1000 * slow * rng.uniform(0.95, 1.05))
            exp.launch(thread, call, call + 5_000, launch_start, launch_start + run, kernel=kernel)
            gpu = launch_start + run
            return start + cpu + 2_000

        fwd_seqs = []
        for label, kernel, dur, _bk, _bd in LAYERS:
            seq += 1
            fwd_seqs.append((label, seq))
            t = op(main, t, int(rng.integers(25_000, 45_000)), f"{label}, seq = {seq}", kernel, dur)
        # backward on the autograd thread, in reverse order, linked by sequence number
        bt = t + 10_000
        for (label, s), (_l, _k, _d, bkernel, bdur) in zip(reversed(fwd_seqs), reversed(LAYERS)):
            bt = op(grad, bt, int(rng.integers(20_000, 35_000)), f"{BACKWARD_NODES[label]}, seq = {s}", bkernel, bdur)
        t = max(bt, gpu - 200_000) + 5_000
        step = 60_000
        rng_range(main, t, t + step, "Optimizer.step#SGD.step")
        seq += 1
        rng_range(main, t + 5_000, t + 50_000, f"aten::_foreach_add_, seq = {seq}")
        call = t + 10_000
        launch_start = max(gpu, call + 6_000)
        exp.launch(main, call, call + 5_000, launch_start, launch_start + 45_000, kernel="multi_tensor_apply_kernel")
        gpu = launch_start + 45_000
        t += step + 3_000
        # the loss is read back every iteration: the host waits for the GPU
        wait_end = max(t + 5_000, gpu + 3_000)
        exp.runtime(main, t, wait_end, name="cudaStreamSynchronize_v3020")
        t = wait_end + 20_000
    exp.set_session(start_time=0)
    return exp.write(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--force", action="store_true", help="replace an existing sample")
    parser.add_argument("--output", type=Path, default=SAMPLE)
    args = parser.parse_args()
    if args.output.exists():
        if not args.force:
            print(f"{args.output} exists (use --force to regenerate)")
            return 0
        args.output.unlink()
    path = build(args.output)
    print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
