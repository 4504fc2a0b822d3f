"""Every label the viewer shows, with its one definition (docs/DESIGN.md's rules in a sentence): the table
columns (`tables.Col(term=...)`), the dashboard, the views, the details pane and the tooltips all take their
labels and tooltips from here (the frontend through the `terms` route), so one label never names two figures.

Where two figures differ in kind they have two labels: busy wall time (a time class: overlapping work counts
once) is "... running", a sum of durations is "... Time" or "Duration"; "All kernels" counts memory operations,
"Compute Kernel Time" does not. Report headers keep DLProf 1.8's column names (`Col.label`), so scripts written
for DLProf keep working; the viewer shows these labels instead.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    label: str
    definition: str


_CALL = "a call (a backward call: every autograd node its forward call created)"
_GPU_TIME = (
    "the flattened duration of its GPU activities (kernels, memcpys, memsets; activities running at the same time "
    "count once)"
)
_CPU_TIME = "end − start of its range"
_OVERHEAD = "its CPU time minus the flattened time of the CUDA API calls inside its range on its thread"
_IDLE = "the span of its GPU activities (first start to last end) minus their flattened time"


def _stats(prefix: str, name: str, what: str, per: str = "call", over: str = "calls") -> dict:
    return {
        f"{prefix}_total": Term(f"Total {name}", f"{what}, summed over the {over}."),
        f"{prefix}_avg": Term(f"Avg. {name}", f"{what}: the average per {per}."),
        f"{prefix}_min": Term(f"Min {name}", f"{what}: the smallest of a {per}."),
        f"{prefix}_max": Term(f"Max {name}", f"{what}: the largest of a {per}."),
    }


def _group_stats(prefix: str, name: str, what: str) -> dict:
    return {
        f"group_{prefix}_total": Term(f"Group {name}", f"{what}, summed over the aggregated iterations."),
        f"group_{prefix}_avg": Term(f"Avg. Group {name} / Iteration", f"{what}: the average per iteration."),
        f"group_{prefix}_min": Term(f"Min Group {name} / Iteration", f"{what}: the smallest of an iteration."),
        f"group_{prefix}_max": Term(f"Max Group {name} / Iteration", f"{what}: the largest of an iteration."),
    }


TERMS: dict[str, Term] = {
    # ---- performance summary
    "wall_time": Term(
        "Wall Clock Time",
        "From the start of the aggregation's first iteration (iteration 0 starts at the first recorded event) to "
        "the latest end of an op instance or GPU activity of its iterations.",
    ),
    "tc_utilization": Term(
        "Tensor Core Kernel Utilization",
        "100 × the time of Tensor Core kernels / the time of all kernels, both in Tensor-Core-eligible ops.",
    ),
    "gpu_utilization": Term(
        "GPU Utilization",
        "Share of the time (the aggregation's window, or the iteration) when a Tensor Core kernel, another kernel or a "
        "memory operation runs: the first three time classes, per GPU, averaged over the GPUs that ran work.",
    ),
    "iter_total": Term(
        "Total Iterations", "Iterations in the profile: key node instances + 1, or its ProfilerStep#N steps."
    ),
    "iter_aggregated": Term("Aggregated Iterations", "Iterations the aggregation covers (Start to Stop, inclusive)."),
    "iter_range": Term("Iteration Range", "The aggregated iterations, Start – Stop (inclusive)."),
    "avg_iteration_time": Term("Average Iteration Time", "Wall clock time / aggregated iterations."),
    "median_iteration_time": Term(
        "Median Iteration Time",
        "The median duration (end − start) of the complete aggregated iterations: the steady figure, start-up and "
        "tear-down left out (of all aggregated iterations when none is complete).",
    ),
    "complete_iterations": Term(
        "Complete Iterations",
        "The aggregated iterations that are whole steps, first – last (count): with a key node, all but the first "
        "(up to the first key node) and the last (after the last key node); every ProfilerStep#N step, but for "
        "the first and last of a dlprof --backend=torch capture (opened when profiling starts, closed when it ends).",
    ),
    "max_iteration_time": Term("Max Iteration Time", "The longest aggregated iteration (end − start)."),
    "iteration_time_std_dev": Term(
        "Iteration Time Std. Dev.", "Sample standard deviation (n − 1) of the aggregated iterations' durations."
    ),
    "n_visible_gpus": Term("GPUs", "GPUs the profiled processes ran work on; the summary averages over them."),
    "key_node": Term(
        "Key Node", "The op or NVTX range whose instances end the iterations (--key_node, else the default)."
    ),
    # ---- time classes: busy wall time, each class taking the time when it is active and no earlier class is
    "busy_tc": Term(
        "Tensor Core kernels running",
        "Wall time when a Tensor Core kernel runs (overlapping kernels count once): the first time class. Not the "
        "sum of the kernels' durations (TC Kernel Time).",
    ),
    "busy_non_tc": Term(
        "Other kernels running", "Wall time when a kernel not using Tensor Cores runs and no Tensor Core kernel does."
    ),
    "busy_memory": Term("Memory operations running", "Wall time when a memcpy or memset runs and no kernel does."),
    "busy_dataloader": Term(
        "Data loading",
        "Wall time in data-loading ranges (DataLoader iterator, DALI, IteratorGetNext) with no GPU work.",
    ),
    "busy_io": Term("I/O", "Wall time in OS read/write calls (when traced) with no GPU work or data loading."),
    "busy_cpu": Term(
        "CPU only",
        "Wall time when an op range of the process driving the GPU (any process without a GPU) is active and no "
        "class above is.",
    ),
    "busy_other": Term("Idle (other)", "Wall time with none of the classes above active."),
    "outside": Term("Outside the aggregation", "An iteration outside the aggregation's Start – Stop range."),
    "select_iter_start": Term(
        "Select Iter Start", "The first iteration of a re-aggregation (inclusive; empty: the first)."
    ),
    "select_iter_stop": Term(
        "Select Iter Stop", "The last iteration of a re-aggregation (inclusive; empty: the last)."
    ),
    "selected_range": Term(
        "Selected Start / Stop", "The iteration range chosen for a re-aggregation (Select Iter Start / Stop)."
    ),
    # ---- ops: identity
    "op_index": Term("Op Index", "The op's row key in the database."),
    "op_id": Term(
        "Op ID", "Unique op identifier: its type in capitals and an ordinal per type in execution order (CONV2D_1)."
    ),
    "op_name": Term("Op Name", "Scope path and op label; the k-th call of a label under one parent is suffixed [k]."),
    "direction": Term("Direction", "fprop (forward pass) or bprop (run by autograd's backward pass)."),
    "op_type": Term(
        "Op Type", "The framework's op type (conv2d, linear …); for calls outside every op, the CUDA API or kernel."
    ),
    "label": Term("Label", "The op's label: its name without the scope path (accepted as key node)."),
    "data_type": Term("Data Type", "Data type of the tensors, as the op's markers recorded it."),
    "input_shapes": Term(
        "Input Shapes",
        "Input tensor shapes as the markers recorded them: of the op's first call (ops), of the launching call "
        "(kernel launches).",
    ),
    "output_shapes": Term("Output Shapes", "Output tensor shapes of the launching call, as its markers recorded them."),
    "parameters": Term("Parameters", "Op parameters of the launching call, as its markers recorded them."),
    "stack_trace": Term("Stack Trace", "Python frames of the op's call site, script first."),
    "num_calls": Term(
        "No. Calls",
        f"Calls in the aggregated iterations: of the op (for an op type or a group node: of its ops); {_CALL} "
        "counts once.",
    ),
    "memory_device": Term("Memory Device", "Where the memory is: a GPU (GPU N) or the host (CPU)."),
    "op_allocations": Term("Allocations", "Allocations made during the op's calls (in the aggregated iterations)."),
    "op_frees": Term("Frees", "Frees made during the op's calls (in the aggregated iterations)."),
    "op_bytes_allocated": Term("Bytes Allocated", "Bytes the op's calls allocated (in the aggregated iterations)."),
    "op_bytes_freed": Term("Bytes Freed", "Bytes the op's calls freed (in the aggregated iterations)."),
    "op_peak_allocated": Term(
        "Peak Allocated (bytes)",
        "The device's highest allocated memory while one of the op's calls ran (every thread's allocations count).",
    ),
    "flops_per_call": Term(
        "FLOPs per Call",
        "Floating-point operations of one call of the op (on a kernel row: of the op launching the kernel), from "
        "the input shapes of its first call (matmul, linear, convolution and attention ops) or the trace's own "
        "figure; a backward op counts twice its forward op's.",
    ),
    "achieved_tflops": Term(
        "Achieved TFLOP/s",
        "The FLOPs of the op's calls over their total GPU time (on a kernel row: of the op launching the kernel).",
    ),
    "num_ops": Term("# Ops", "Distinct ops (of the op type, inside the group node, or of the summary row's class)."),
    "instances": Term("Instances", "How often it occurs in the whole profile (op calls, NVTX range occurrences)."),
    "kind": Term(
        "Kind",
        "What the row is: an op or an NVTX range (key nodes); a kernel, memory operation, op or CUDA API call "
        "(timeline).",
    ),
    "candidate": Term(
        "Name", "Op name, or NVTX range text without PyTorch's per-call fields: what --key_node matches."
    ),
    "tc_eligible": Term("TC Eligible", "The op's type can use Tensor Cores (the framework's eligible op types)."),
    "using_tc": Term("Using TC", "At least one of the op's kernels uses Tensor Cores."),
    "uses_tc": Term("Uses TC", "The kernel uses Tensor Cores (its name matches a Tensor Core kernel pattern)."),
    "kernel_calls": Term("Kernel Calls", "Kernel launches of the op in the aggregated iterations."),
    "is_bad_data_type": Term("Bad Data Type", "A Tensor-Core-eligible op whose data type keeps it off Tensor Cores."),
    "graph_node": Term(
        "GRAPHS Node",
        "The op's node in TensorBoard's GRAPHS tab (ops outside every scope sit under their op type, API calls "
        "outside every op under unassociated); choose the dlprof/op_time tag there to colour nodes by time.",
    ),
    # ---- ops: statistics over calls
    **_stats("cpu", "CPU Time", f"CPU time of {_CALL}: {_CPU_TIME}"),
    **_stats("gpu", "GPU Time", f"GPU time of {_CALL}: {_GPU_TIME}"),
    **_stats("overhead", "CPU Overhead", f"CPU overhead of {_CALL}: {_OVERHEAD}"),
    **_stats("idle", "GPU Idle", f"GPU idle of {_CALL}: {_IDLE}"),
    "cpu_time": Term("CPU Time", f"CPU time of {_CALL}: {_CPU_TIME}; total over calls, average, minimum and maximum."),
    "gpu_time": Term("GPU Time", f"GPU time of {_CALL}: {_GPU_TIME}; total over calls, average, minimum and maximum."),
    "cpu_overhead": Term(
        "CPU Overhead", f"CPU overhead of {_CALL}: {_OVERHEAD}; total over calls, average, minimum and maximum."
    ),
    "gpu_idle": Term("GPU Idle", f"GPU idle of {_CALL}: {_IDLE}; total over calls, average, minimum and maximum."),
    "stat_total": Term("Total", "Summed over the calls."),
    "stat_avg": Term("Average", "Per call, on average."),
    "stat_min": Term("Minimum", "Of the call with the smallest value."),
    "stat_max": Term("Maximum", "Of the call with the largest value."),
    # ---- group nodes: statistics over iterations
    "group_name": Term("Group Node", "An interior node of the op-name tree (a module or scope), by its path."),
    "level": Term("Level", "Depth of the group node in the tree (-1: the complete model)."),
    "num_tc_eligible": Term("Num TC Eligible Ops", "Tensor-Core-eligible ops inside the group node."),
    "num_using_tc": Term("Num Ops Using TC", "Ops inside the group node using Tensor Cores."),
    "has_children": Term("Has Children", "The group node contains other group nodes."),
    **_group_stats("cpu", "CPU Time", "Per iteration, the flattened time of the group's op ranges"),
    **_group_stats("gpu", "GPU Time", "Per iteration, the flattened time of the group's GPU activities"),
    **_group_stats("overhead", "CPU Overhead", "Per iteration, the sum of its op instances' CPU overhead"),
    **_group_stats("idle", "GPU Idle", "Per iteration, the sum of its op instances' GPU idle"),
    # ---- kernels (per kernel name and op): durations of the kernel itself
    "kernel_name": Term("Kernel Name", "Short name of the GPU kernel."),
    "long_name": Term("Long Kernel Name", "Demangled kernel signature."),
    "launches": Term("Launches", "Launches of the kernel by the op in the aggregated iterations."),
    **_stats("kernel", "Duration", "Duration (end − start) of a launch of the kernel", per="launch", over="launches"),
    **_stats(
        "api",
        "API Time",
        "Duration of the CUDA API call that launched the kernel",
        per="launch",
        over="launches",
    ),
    # ---- summary panels
    "ops_all": Term("All ops", "Every op of the aggregation (sums of the per-op totals)."),
    "ops_using_tc": Term("Ops using Tensor Cores", "Ops with at least one kernel using Tensor Cores."),
    "ops_eligible_not_using": Term(
        "Eligible ops not using Tensor Cores", "Ops whose type can use Tensor Cores but none of whose kernels does."
    ),
    "ops_other": Term("All other ops", "Ops whose type cannot use Tensor Cores and that use none."),
    "kernels_all": Term(
        "All kernels",
        "Every kernel and memory operation (memcpy, memset) of the aggregated iterations: the three rows below "
        "partition it. Compute Kernel Time (Compare) leaves the memory operations out.",
    ),
    "kernels_tc": Term("Kernels using Tensor Cores", "Kernels whose names match a Tensor Core kernel pattern."),
    "kernels_memory": Term("Memory operations", "Memcpys and memsets."),
    "kernels_other": Term("All other kernels", "Kernels not using Tensor Cores (memory operations excluded)."),
    "kernel_time": Term(
        "Kernel Time",
        "Sum of the durations of the kernels (memory operations: of the memcpys and memsets); kernels running at "
        "the same time both count.",
    ),
    "api_time_total": Term("API Time", "Sum of the durations of the distinct CUDA API calls that launched them."),
    "kernel_count": Term(
        "Kernel Count", "Distinct kernel names (memory operations: distinct CUDA API names), of the row's class or op."
    ),
    "eligible_ops": Term(
        "Ops eligible for Tensor Cores", "Ops whose type is in the framework's list of Tensor-Core-eligible types."
    ),
    "using_tc_ops": Term(
        "Eligible ops using Tensor Cores", "Eligible ops with at least one kernel using Tensor Cores."
    ),
    "top_rank": Term("#", "Place among the ops, by Total GPU Time."),
    # ---- Tensor Cores (per op)
    "op_kernel_time": Term(
        "Kernel Time of the Op", "Sum of the durations of the op's compute kernels in the aggregated iterations."
    ),
    "tc_kernel_time": Term("TC Kernel Time", "Sum of the durations of the op's Tensor Core kernels."),
    "non_tc_kernel_time": Term("Non-TC Kernel Time", "Sum of the durations of the op's other kernels."),
    "op_tc_utilization": Term("TC Utilization", "100 × the op's TC Kernel Time / its Kernel Time."),
    "tc_kernel_count": Term("TC Kernel Count", "Distinct Tensor Core kernel names of the op."),
    "non_tc_kernel_count": Term("Non-TC Kernel Count", "Distinct names of the op's kernels not using Tensor Cores."),
    "tc_kernel_names": Term("TC Kernel Names", "The op's Tensor Core kernels."),
    "non_tc_kernel_names": Term("Non-TC Kernel Names", "The op's kernels not using Tensor Cores."),
    # ---- iterations
    "iteration": Term(
        "Iteration", "Iteration number: iteration k lies between the ends of key node instances k and k+1."
    ),
    "iteration_start": Term("Start", "Start of the iteration on the capture clock."),
    "iteration_end": Term("End", "End of the iteration on the capture clock."),
    "duration": Term("Duration", "How long it lasts: end − start (an iteration, a kernel, a call, an op range)."),
    "aggregated": Term("Aggregated", "Inside the aggregation's iteration range."),
    "kernels": Term("Kernels", "Compute kernel launches in the iteration (memory operations not counted)."),
    "tc_kernels": Term("TC Kernels", "Launches of kernels using Tensor Cores in the iteration."),
    "kernel_time_per_gpu": Term(
        "Kernel Time per GPU",
        "Sum of the compute kernels' durations in the iteration per GPU (kernels running at the same time both "
        "count: not the busy time); the bar shows its share of the iteration.",
    ),
    "tc_kernel_time_per_gpu": Term(
        "TC Kernel Time per GPU",
        "Sum of the Tensor Core kernels' durations in the iteration per GPU (not Tensor Core kernels running, the "
        "busy time); the bar shows its share of the iteration's Kernel Time per GPU.",
    ),
    # ---- kernel launches of an iteration
    "activity_id": Term("Activity", "The GPU activity's row key in the database."),
    "device_id": Term("Device", "The GPU (CUDA device id)."),
    "stream_id": Term("Stream", "The CUDA stream."),
    "gpu_start": Term("GPU Start", "Start of the kernel on the GPU, on the capture clock."),
    "gpu_start_offset": Term(
        "GPU Start (from iteration start)", "Start of the kernel on the GPU, from the iteration's start."
    ),
    "api_start": Term("API Call Start", "Start of the launching CUDA API call, on the capture clock."),
    "api_start_offset": Term(
        "API Call Start (from iteration start)", "Start of the launching CUDA API call, from the iteration's start."
    ),
    "api_time": Term("API Call Time", "Duration of the CUDA API call that launched the kernel."),
    **{f"grid_{a}": Term(f"Grid {a.upper()}", f"Blocks of the launch along {a}.") for a in "xyz"},
    **{f"block_{a}": Term(f"Block {a.upper()}", f"Threads per block along {a}.") for a in "xyz"},
    # ---- ops of an iteration
    "calls_in_iteration": Term("Calls in Iteration", "The op's calls starting in the iteration."),
    "cpu_time_in_iteration": Term("CPU Time in Iteration", f"CPU time ({_CPU_TIME}) of those calls, summed."),
    "gpu_time_in_iteration": Term("GPU Time in Iteration", f"GPU time ({_GPU_TIME}) of those calls, summed."),
    "cpu_overhead_in_iteration": Term(
        "CPU Overhead in Iteration", f"CPU overhead ({_OVERHEAD}) of those calls, summed."
    ),
    "kernels_launched": Term("Kernels Launched", "Kernels those calls launched."),
    "first_start": Term("First Start", "Start of the op's first call in the iteration."),
    # ---- expert systems
    "id": Term("ID", "The finding's row key."),
    "exp_sys_id": Term("Detector", "The expert system that reported it."),
    "severity": Term("Severity", "error, warning or info."),
    "problem": Term("Problem", "What was found."),
    "recommendation": Term("Recommendation", "What to try."),
    "link": Term("Link", "More information."),
    # ---- compare
    "row": Term("Report Row", "The row's place in the diff report."),
    "presence": Term("Present In", "both, after only (not in the baseline) or baseline only (no longer run)."),
    "compare_calls": Term("Calls (after)", "Calls of the op (its name and direction) in the compared aggregation."),
    "compare_baseline_calls": Term("Calls (baseline)", "Calls of the op (its name and direction) in the baseline."),
    "compare_gpu_time": Term(
        "Total GPU Time (after)", "The op's Total GPU Time in the compared aggregation (0 if it did not run)."
    ),
    "compare_baseline_gpu_time": Term(
        "Total GPU Time (baseline)", "The op's Total GPU Time in the baseline (0 if it did not run)."
    ),
    "compare_delta": Term(
        "Change in GPU Time",
        "Total GPU Time after − in the baseline; the op changes add up to the change of Total GPU Time (ops).",
    ),
    "compare_delta_pct": Term(
        "Change in GPU Time %", "The change in % of the baseline's Total GPU Time (none when it had none)."
    ),
    "abs_delta": Term("Size of the Change", "The change without its sign (the default order)."),
    "compare_launches": Term("Launches (after)", "Launches of the kernel (by any op) in the compared aggregation."),
    "compare_baseline_launches": Term("Launches (baseline)", "Launches of the kernel (by any op) in the baseline."),
    "compare_kernel_time": Term(
        "Kernel Time (after)", "Sum of the kernel's durations in the compared aggregation (0 if it did not run)."
    ),
    "compare_baseline_kernel_time": Term(
        "Kernel Time (baseline)", "Sum of the kernel's durations in the baseline (0 if it did not run)."
    ),
    "compare_kernel_delta": Term(
        "Change in Kernel Time",
        "Kernel Time after − in the baseline; the kernel changes add up to the change of Compute Kernel Time.",
    ),
    "compare_kernel_delta_pct": Term(
        "Change in Kernel Time %", "The change in % of the baseline's Kernel Time (none when it had none)."
    ),
    "total_gpu_time": Term("Total GPU Time (ops)", "Sum of the ops' Total GPU Time (the summary's All ops GPU time)."),
    "compute_kernel_time": Term(
        "Compute Kernel Time",
        "Sum of the compute kernels' durations: All kernels without the memory operations (the diff report's "
        "Kernel GPU Time).",
    ),
    "baseline": Term("Baseline", "The figure of the baseline (before)."),
    "after": Term("After", "The figure of the compared aggregation (after)."),
    "change": Term("Change", "After − baseline (percentages: the difference in points)."),
    # ---- GPUs and system
    "gpu_name": Term("GPU Name", "The GPU model."),
    "compute_capability": Term("Compute Capability", "The GPU's CUDA compute capability (major.minor)."),
    "sm_count": Term("SM Count", "Streaming multiprocessors of the GPU."),
    "total_memory": Term("GPU Memory", "The GPU's memory."),
    "gpu_count": Term("GPU Count", "GPUs the export lists."),
    "gpu_names": Term("GPU Name(s)", "The models of the GPUs the export lists."),
    "cpu_model": Term("CPU Model", "The host's CPU."),
    "driver_version": Term("GPU Driver Version", "The NVIDIA driver of the capture."),
    "framework": Term("Framework", "The framework (and version) the profiled program ran."),
    "cuda_version": Term("CUDA Version", "The CUDA version of the capture."),
    "nsys_version": Term("Nsight Systems Version", "The Nsight Systems that captured (or exported) the profile."),
    "dlprof_version": Term("DLProf Version", "The dlprof that analysed this profile."),
    "plugin_version": Term("DLProf Plugin Version", "The DLProf plugin serving this page."),
    "tensorboard_version": Term("TensorBoard Version", "The TensorBoard serving this page (or installed with it)."),
    # ---- ranks
    "rank": Term("Rank", "The profile (process group member) of a multi-rank run."),
    "source_file": Term("Source File", "The file the rank's profile was read from."),
    "communication_time": Term(
        "Communication Time",
        "Per GPU the busy wall time of collective kernels (NCCL, RCCL, c10d …) in the aggregation window (overlapping "
        "ones count once), summed over the GPUs used.",
    ),
    "overlapped_communication_pct": Term(
        "Overlapped Communication",
        "Share of the communication time during which a compute kernel (any other kernel; not a memcpy or memset) "
        "ran on the same GPU.",
    ),
    "times_slowest": Term("Times Slowest", "Matched iterations in which the rank finished last."),
    # ---- GPU time breakdowns (DESIGN.md "GPU time breakdowns"): busy wall time per class, which may overlap
    "bd_computation": Term(
        "Compute kernels running", "Wall time when a compute kernel (any kernel but a collective) runs on the GPU."
    ),
    "bd_communication": Term(
        "Collective kernels running", "Wall time when a collective kernel (NCCL, RCCL, c10d …) runs on the GPU."
    ),
    "bd_memory": Term(
        "Memcpy/memset running", "Wall time when a memcpy or memset runs on the GPU, whatever else runs beside it."
    ),
    "bd_idle": Term("GPU idle", "Wall time when nothing (no kernel, memcpy or memset) runs on the GPU."),
    "bd_overlapped": Term(
        "Communication overlapped", "Wall time when a collective kernel and a compute kernel run on the GPU together."
    ),
    "idle_host_wait": Term(
        "Idle: host wait",
        "GPU (or stream) idle time before the launch call of the next activity started: nothing was queued, the CPU "
        "was late.",
    ),
    "idle_kernel_wait": Term(
        "Idle: kernel wait",
        "GPU (or stream) idle time after the launch call of the next activity started: work was queued but waited "
        "(on other work, a synchronisation, the launch itself).",
    ),
    "idle_other": Term(
        "Idle: other",
        "GPU (or stream) idle time whose next activity has no launch call, or that no activity ends (to the end of "
        "the aggregation window).",
    ),
    "kernel_launches": Term("Kernel Launches", "Kernels launched (by a CUDA API call) in the aggregated iterations."),
    "launch_delay_mean": Term("Mean Launch Delay", "Kernel start − launch call start, averaged over the launches."),
    "launch_delay_p50": Term("Median Launch Delay", "Kernel start − launch call start: the median of the launches."),
    "launch_delay_p95": Term("P95 Launch Delay", "Kernel start − launch call start: the 95th percentile (linear)."),
    "short_kernels": Term("Short Kernels", "Kernels that ran for less time than their launch call took on the CPU."),
    # ---- timeline
    "tl_op": Term("Op (CPU)", "An op instance on its CPU thread, coloured by op name; nested ones one row lower."),
    "tl_api": Term("CUDA API call", "A CUDA API call on its CPU thread."),
    "tl_kernel": Term("Kernel", "A kernel on its GPU stream, coloured by kernel name."),
    "tl_memcpy": Term("Memcpy", "A memory copy on its GPU stream."),
    "tl_memset": Term("Memset", "A memory set on its GPU stream."),
    "tl_gap": Term("GPU idle (no kernel)", "A stretch when no kernel runs on the GPU; hover it for what the CPU did."),
    "tl_merged": Term("Merged events", "Events shorter than a pixel in one pixel column, one box (paler = less busy)."),
    "tl_row": Term("Row", "The CPU thread or GPU stream row it is drawn on."),
    "start_offset": Term("Start (from iteration start)", "When it starts, from the start of the shown iteration."),
    "end_offset": Term("End (from iteration start)", "When it ends, from the start of the shown iteration."),
    "span": Term("Span", "From the first start to the last end of the merged events."),
    "busy": Term("Busy", "Sum of the merged events' durations."),
    "longest": Term("Longest", "The longest of the merged events (its kind and name are the box's)."),
    "launch_call": Term(
        "Launch Call", "The CUDA API call that launched the kernel: its start, and how long before the kernel."
    ),
    "launching_op": Term("Launching Op", "The op whose call launched the kernel (unassociated_… when none did)."),
    "event_iteration": Term(
        "In Iteration", "The iteration it belongs to: a kernel that of its launch, an op or call that of its start."
    ),
    "gap_ops": Term("Op ranges", "Time the thread's op ranges covered during the gap (flattened)."),
    "gap_api": Term("CUDA API calls", "Time the thread's CUDA API calls covered during the gap (flattened)."),
}


def term(key: str) -> Term:
    """The label and definition of `key` (KeyError for an unknown one: every shown label has an entry)."""
    return TERMS[key]


def as_json() -> dict:
    """The `terms` route's answer."""
    return {"terms": {k: {"label": t.label, "definition": t.definition} for k, t in TERMS.items()}}
