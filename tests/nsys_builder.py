"""Synthetic Nsight Systems SQLite exports with the real per-version schema.

Tests build small, hand-computed profiles with :class:`NsysExport` and write them
as SQLite files laid out the way ``nsys export --type sqlite`` lays them out:
same table names, column names and order, column types, NOT NULL constraints,
``StringIds`` indirection and per-version metadata/ENUM tables.  ``nsys stats``
(2022.4) runs its reports on the generated 2022.4 files.

The table definitions below are facts read off real exports (the fixtures in
``tests/data/nsys`` and a ``--lazy=false`` export made with nsys
2022.4.2.1), typed out here as data; nothing is read from those files at run time.
Where no real export of a version was available the layout is carried over from
the nearest version that was seen; such spots are marked "(assumed)".

Example::

    exp = NsysExport(schema="2022.4")
    tid = exp.add_thread(pid=100, tid=100, name="python")
    exp.push_pop(tid, 0, 100, "step")
    exp.launch(tid, 10, 20, 30, 40, kernel="A")
    exp.write(tmp_path / "profile.sqlite")
"""

from __future__ import annotations

import datetime as _dt
import itertools
import sqlite3
import uuid as _uuid
from operator import itemgetter
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["NsysExport", "global_tid", "global_pid", "SCHEMA_VERSIONS"]

SCHEMA_VERSIONS = ("2021.3", "2022.4", "2024.6", "2026.2")

_TID_MASK = 0xFFFFFF
_PID_BITS_MASK = ~0xFFFFFF  # clears the TID bits of a globalTid -> globalPid


def global_tid(pid: int, tid: int, hw: int = 1) -> int:
    """Serialized nsys thread id: ``(hw << 48) | (pid << 24) | tid``."""
    return (int(hw) << 48) | ((int(pid) & _TID_MASK) << 24) | (int(tid) & _TID_MASK)


def global_pid(pid: int, hw: int = 1) -> int:
    """Serialized nsys process id: a globalTid with TID 0."""
    return global_tid(pid, 0, hw)


def _vkey(version: str) -> Tuple[int, int]:
    """Orderable key of an nsys release name such as ``"2024.6"``."""
    year, release = version.split(".")[:2]
    return int(year), int(release)


def _in_range(version: str, span: str) -> bool:
    """Whether ``version`` lies in ``span`` (``""``, ``"A"``, ``"-B"`` or ``"A-B"``, B exclusive)."""
    if not span:
        return True
    since, _, until = span.partition("-")
    if since and _vkey(version) < _vkey(since):
        return False
    if until and _vkey(version) >= _vkey(until):
        return False
    return True


# ---------------------------------------------------------------------------
# Table definitions.  One column per line: ``name TYPE [NOT NULL] [PRIMARY KEY]``,
# optionally followed by ``@span`` (see _in_range) when the column exists only in
# some versions.  Spans name the first release where the change was seen (or is
# documented); boundaries between the four supported versions are otherwise moot.
# ---------------------------------------------------------------------------

_TABLE_DEFS: List[Tuple[str, str, str]] = [
    # (table, version span, columns)
    (
        "StringIds",
        "",
        """
        id INTEGER NOT NULL PRIMARY KEY
        value TEXT NOT NULL
    """,
    ),
    (
        "ThreadNames",
        "",
        """
        nameId INTEGER NOT NULL
        priority INTEGER
        globalTid INTEGER
    """,
    ),
    # Absent from every <= 2021.3 export (reference §3).
    (
        "PROCESSES",
        "2022.1",
        """
        globalPid INTEGER
        pid INTEGER
        name TEXT
    """,
    ),
    (
        "TARGET_INFO_SYSTEM_ENV",
        "",
        """
        globalVid INTEGER NOT NULL @-2024.6
        globalVid INTEGER @2024.6
        devStateName TEXT NOT NULL
        name TEXT NOT NULL
        nameEnum INTEGER NOT NULL
        value TEXT NOT NULL
    """,
    ),
    (
        "TARGET_INFO_SESSION_START_TIME",
        "",
        """
        utcEpochNs INTEGER
        utcTime TEXT
        localTime TEXT
        systemClockNs INTEGER @2026.2
    """,
    ),
    # Not in the 2021.3 exports seen; present from 2022.4 on.
    (
        "ANALYSIS_DETAILS",
        "2022.4",
        """
        globalVid INTEGER NOT NULL
        duration INTEGER NOT NULL
        startTime INTEGER NOT NULL
        stopTime INTEGER NOT NULL
    """,
    ),
    # The 41-column layout keyed by ``id`` (2021.2+).  2026.2 (assumed): the
    # 2026.2 fixture has no GPU table; 2025.5 still has this layout.
    (
        "TARGET_INFO_GPU",
        "",
        """
        vmId INTEGER NOT NULL
        id INTEGER NOT NULL
        name TEXT
        busLocation TEXT
        isDiscrete INTEGER
        l2CacheSize INTEGER
        totalMemory INTEGER
        memoryBandwidth INTEGER
        clockRate INTEGER
        smCount INTEGER
        pwGpuId INTEGER
        uuid TEXT
        luid INTEGER
        chipName TEXT
        cuDevice INTEGER
        ctxswDevPath TEXT
        ctrlDevPath TEXT
        revision INTEGER
        nodeMask INTEGER
        constantMemory INTEGER
        maxIPC INTEGER
        maxRegistersPerBlock INTEGER
        maxShmemPerBlock INTEGER
        maxShmemPerBlockOptin INTEGER
        maxShmemPerSm INTEGER
        maxRegistersPerSm INTEGER
        threadsPerWarp INTEGER
        asyncEngines INTEGER
        maxWarpsPerSm INTEGER
        maxBlocksPerSm INTEGER
        maxThreadsPerBlock INTEGER
        maxBlockDimX INTEGER
        maxBlockDimY INTEGER
        maxBlockDimZ INTEGER
        maxGridDimX INTEGER
        maxGridDimY INTEGER
        maxGridDimZ INTEGER
        computeMajor INTEGER
        computeMinor INTEGER
        smMajor INTEGER
        smMinor INTEGER
    """,
    ),
    # Seen in 2025.1 and 2025.5 exports (3 columns); 2026.2 assumed unchanged.
    (
        "TARGET_INFO_CUDA_DEVICE",
        "2025.1",
        """
        gpuId INTEGER
        cudaId INTEGER NOT NULL
        pid INTEGER NOT NULL
    """,
    ),
    (
        "EXPORT_META_DATA",
        "2022.1-2024.6",
        """
        name TEXT NOT NULL
        value TEXT
    """,
    ),
    (
        "META_DATA_EXPORT",
        "2024.6",
        """
        name TEXT NOT NULL
        value TEXT
    """,
    ),
    (
        "META_DATA_CAPTURE",
        "2024.6",
        """
        name TEXT NOT NULL
        value TEXT
    """,
    ),
    # ENUM tables: none in 2021.3 (or 2022.1) exports.  The launch-type table is
    # spelled KRENEL in 2022.4 (and 2023.1), fixed by 2024.6.
    ("ENUM_NSYS_EVENT_TYPE", "2022.4", "@enum"),
    ("ENUM_NSYS_EVENT_CLASS", "2022.4", "@enum"),
    ("ENUM_CUDA_MEMCPY_OPER", "2022.4", "@enum"),
    ("ENUM_CUDA_MEM_KIND", "2022.4", "@enum"),
    ("ENUM_CUDA_KRENEL_LAUNCH_TYPE", "2022.4-2024.6", "@enum"),
    ("ENUM_CUDA_KERNEL_LAUNCH_TYPE", "2024.6", "@enum"),
    ("ENUM_CUDA_SHARED_MEM_LIMIT_CONFIG", "2022.4", "@enum"),
    ("ENUM_CUDA_UNIF_MEM_MIGRATION", "2022.4", "@enum"),
    ("ENUM_CUDA_FUNC_CACHE_CONFIG", "2022.4", "@enum"),
    ("ENUM_CUPTI_STREAM_TYPE", "2024.6", "@enum"),
    ("ENUM_CUPTI_SYNC_TYPE", "2022.4", "@enum"),
    # 2021.3 (assumed): no 2021.3 export with NVTX was available; the 2022.4
    # layout is used (same columns as documented for 2021.x).
    (
        "NVTX_EVENTS",
        "",
        """
        start INTEGER NOT NULL
        end INTEGER
        eventType INTEGER NOT NULL
        rangeId INTEGER
        category INTEGER
        color INTEGER
        text TEXT
        globalTid INTEGER
        endGlobalTid INTEGER
        textId INTEGER
        domainId INTEGER
        uint64Value INTEGER
        int64Value INTEGER
        doubleValue REAL
        uint32Value INTEGER
        int32Value INTEGER
        floatValue REAL
        jsonTextId INTEGER
        jsonText TEXT
        binaryData TEXT @2024.6
    """,
    ),
    (
        "CUPTI_ACTIVITY_KIND_RUNTIME",
        "",
        """
        start INTEGER NOT NULL
        end INTEGER NOT NULL
        eventClass INTEGER NOT NULL
        globalTid INTEGER
        correlationId INTEGER
        nameId INTEGER NOT NULL
        returnValue INTEGER NOT NULL
        callchainId INTEGER
    """,
    ),
    (
        "CUPTI_ACTIVITY_KIND_KERNEL",
        "",
        """
        start INTEGER NOT NULL
        end INTEGER NOT NULL
        deviceId INTEGER NOT NULL
        contextId INTEGER NOT NULL
        greenContextId INTEGER @2024.6
        streamId INTEGER NOT NULL
        correlationId INTEGER
        globalPid INTEGER
        demangledName INTEGER NOT NULL
        shortName INTEGER NOT NULL
        mangledName INTEGER @2022.1
        launchType INTEGER
        cacheConfig INTEGER
        registersPerThread INTEGER NOT NULL
        gridX INTEGER NOT NULL
        gridY INTEGER NOT NULL
        gridZ INTEGER NOT NULL
        blockX INTEGER NOT NULL
        blockY INTEGER NOT NULL
        blockZ INTEGER NOT NULL
        staticSharedMemory INTEGER NOT NULL
        dynamicSharedMemory INTEGER NOT NULL
        localMemoryPerThread INTEGER NOT NULL
        localMemoryTotal INTEGER NOT NULL
        gridId INTEGER NOT NULL
        sharedMemoryExecuted INTEGER
        graphNodeId INTEGER
        sharedMemoryLimitConfig INTEGER
        qmdBulkReleaseDone INTEGER @2026.2
        qmdPreexitDone INTEGER @2026.2
        qmdLastCtaDone INTEGER @2026.2
        graphId INTEGER @2026.2
        clusterX INTEGER @2026.2
        clusterY INTEGER @2026.2
        clusterZ INTEGER @2026.2
        clusterSchedulingPolicy INTEGER @2026.2
        maxPotentialClusterSize INTEGER @2026.2
        maxActiveClusters INTEGER @2026.2
        sharedMemoryRequestedPercentage INTEGER @2026.2
        tensorSizeMinusOneElements TEXT NOT NULL @2026.2
    """,
    ),
    (
        "CUPTI_ACTIVITY_KIND_MEMCPY",
        "",
        """
        start INTEGER NOT NULL
        end INTEGER NOT NULL
        deviceId INTEGER NOT NULL
        contextId INTEGER NOT NULL
        greenContextId INTEGER @2024.6
        streamId INTEGER NOT NULL
        correlationId INTEGER
        globalPid INTEGER
        bytes INTEGER NOT NULL
        copyKind INTEGER NOT NULL
        deprecatedSrcId INTEGER
        srcKind INTEGER
        dstKind INTEGER
        srcDeviceId INTEGER
        srcContextId INTEGER
        dstDeviceId INTEGER
        dstContextId INTEGER
        migrationCause INTEGER
        graphNodeId INTEGER
        virtualAddress INTEGER @2022.1
        copyCount INTEGER @2026.2
    """,
    ),
    (
        "CUPTI_ACTIVITY_KIND_MEMSET",
        "",
        """
        start INTEGER NOT NULL
        end INTEGER NOT NULL
        deviceId INTEGER NOT NULL
        contextId INTEGER NOT NULL
        greenContextId INTEGER @2024.6
        streamId INTEGER NOT NULL
        correlationId INTEGER
        globalPid INTEGER
        value INTEGER NOT NULL
        bytes INTEGER NOT NULL
        graphNodeId INTEGER
        memKind INTEGER
    """,
    ),
    (
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
        "",
        """
        start INTEGER NOT NULL
        end INTEGER NOT NULL
        deviceId INTEGER NOT NULL
        contextId INTEGER NOT NULL
        greenContextId INTEGER @2024.6
        streamId INTEGER NOT NULL
        correlationId INTEGER
        globalPid INTEGER
        deprecatedSyncType INTEGER @2025.1
        syncType INTEGER NOT NULL
        eventId INTEGER NOT NULL
        eventSyncId INTEGER @2025.1
    """,
    ),
    # Only with `nsys profile --cuda-memory-usage=true`; layout of nsys 2022.4's export (assumed for the others).
    (
        "CUDA_GPU_MEMORY_USAGE_EVENTS",
        "",
        """
        start INTEGER NOT NULL
        globalPid INTEGER NOT NULL
        deviceId INTEGER NOT NULL
        contextId INTEGER NOT NULL
        address INTEGER NOT NULL
        pc INTEGER NOT NULL
        bytes INTEGER NOT NULL
        memKind INTEGER NOT NULL
        memoryOperationType INTEGER NOT NULL
        name TEXT
        correlationId INTEGER
        localMemoryPoolAddress INTEGER
        localMemoryPoolReleaseThreshold INTEGER
        localMemoryPoolSize INTEGER
        localMemoryPoolUtilizedSize INTEGER
        importedMemoryPoolAddress INTEGER
        importedMemoryPoolProcessId INTEGER
    """,
    ),
    # 2021.3 still has correlationId.  2024.6 (assumed) = 2022.4 layout;
    # argumentsId seen in 2025.5, 2026.2 (assumed) keeps it.
    (
        "OSRT_API",
        "",
        """
        start INTEGER NOT NULL
        end INTEGER NOT NULL
        eventClass INTEGER NOT NULL
        globalTid INTEGER
        correlationId INTEGER @-2022.1
        nameId INTEGER NOT NULL
        returnValue INTEGER NOT NULL
        nestingLevel INTEGER
        callchainId INTEGER NOT NULL
        argumentsId INTEGER NOT NULL @2025.5
    """,
    ),
]

_ENUM_COLUMNS = """
    id INTEGER NOT NULL PRIMARY KEY
    name TEXT
    label TEXT
"""

# Columns DLProf 1.x appended to the kernel table when it modified a file in place.
_DLPROF_KERNEL_COLUMNS = """
    kernel_name TEXT
    long_kernel_name TEXT
"""
# Layout of DLProf's SystemInfo table (plausible; DLProf's own DDL is not known).
_DLPROF_SYSTEM_INFO_COLUMNS = """
    name TEXT
    value TEXT
"""


class _Column:
    """One column of a table definition."""

    __slots__ = ("name", "decl")

    def __init__(self, name: str, decl: str):
        self.name = name
        self.decl = decl

    @property
    def is_text(self) -> bool:
        return self.decl.startswith("TEXT")

    @property
    def ddl(self) -> str:
        return f"{self.name} {self.decl}"


def _parse_columns(spec: str, version: str) -> List[_Column]:
    """Columns of a table spec (see _TABLE_DEFS) that exist in ``version``."""
    columns = []
    for line in spec.strip().splitlines():
        line = line.strip()
        span = ""
        if "@" in line:
            line, span = (part.strip() for part in line.split("@", 1))
        if _in_range(version, span):
            name, decl = line.split(None, 1)
            columns.append(_Column(name, decl))
    return columns


def _table_spec(table: str) -> str:
    """Column spec text of a table in _TABLE_DEFS."""
    return next(spec for name, _, spec in _TABLE_DEFS if name == table)


def table_columns(version: str, dlprof_modified: bool = False) -> Dict[str, List[_Column]]:
    """All tables this module knows for ``version``, in creation order, with their columns."""
    tables: Dict[str, List[_Column]] = {}
    for name, span, spec in _TABLE_DEFS:
        if _in_range(version, span):
            tables[name] = _parse_columns(_ENUM_COLUMNS if spec == "@enum" else spec, version)
    if dlprof_modified:
        tables["CUPTI_ACTIVITY_KIND_KERNEL"] += _parse_columns(_DLPROF_KERNEL_COLUMNS, version)
        tables["SystemInfo"] = _parse_columns(_DLPROF_SYSTEM_INFO_COLUMNS, version)
    return tables


# ---------------------------------------------------------------------------
# ENUM table contents, as nsys writes them (2022.4 from a real 2022.4.2.1
# export; 2024.6 and 2026.2 from the fixtures).  Event types are id = position
# with label == name; event-class names carry a TRACE_PROCESS_EVENT_ prefix.
# ---------------------------------------------------------------------------

_EVENT_TYPES_2022_4 = (
    "Unknown",
    "CpuCycles",
    "Instructions",
    "CacheReferences",
    "L1CacheDataWriteMisses",
    "L1CacheDataReadMisses",
    "L1CacheInstructionMisses",
    "L2CacheDataWriteMisses",
    "L2CacheDataReadMisses",
    "L2CacheInstructionMisses",
    "BranchInstructions",
    "BranchMisses",
    "BusCycles",
    "CpuClock",
    "TaskClock",
    "PageFault",
    "ContextSwitches",
    "CpuMigrations",
    "PageFaultsMin",
    "PageFaultsMax",
    "AlignmentFaults",
    "EmulationFaults",
    "ThreadState",
    "Frames",
    "Annotations",
    "SchedSwitch",
    "SchedWakeup",
    "Command",
    "Mmap",
    "MemUsage",
    "Emc",
    "Composite",
    "NvtxEvents",
    "NvtxCategory",
    "NvtxMark",
    "NvtxPushRange",
    "NvtxPopRange",
    "NvtxStartRange",
    "NvtxEndRange",
    "NvtxThread",
    "PowerRate",
    "Sched",
    "CpuCyclesSelf",
    "CpuCyclesTotal",
    "CpuCyclesSelfPlus",
    "Cuda",
    "CudaDevice",
    "TraceProcess",
    "TraceFunctions",
    "Diagnostic",
    "GlWorkload",
    "BandwidthUsage",
    "KhrDebugMark",
    "KhrDebugPushRange",
    "KhrDebugPopRange",
    "KhrDebugGpuMark",
    "KhrDebugGpuPushRange",
    "KhrDebugGpuPopRange",
    "GpuCtxsw",
    "NvtxPushPopRange",
    "NvtxStartEndRange",
    "ProfTime",
    "KhrDebugPushPopRange",
    "KhrDebugGpuPushPopRange",
    "NvtxtCategory",
    "NvtxtMark",
    "NvtxtPushRange",
    "NvtxtPopRange",
    "NvtxtStartRange",
    "NvtxtEndRange",
    "NvtxtPushPopRange",
    "NvtxtStartEndRange",
    "NvtxtMetaThread",
    "NvtxtMetaProcess",
    "NvtxtMetaFileDisplay",
    "NvtxDomainCreate",
    "NvtxDomainDestroy",
    "NvnGpuCmdBuf",
    "TraceVSync",
    "CudaDeviceKernel",
    "CudaDeviceMemory",
    "Pmu",
    "NvnGpuDraw",
    "NvnGpuCompute",
    "NvnGpuDebug",
    "OS runtime libraries",
    "CuDNN",
    "CuBLAS",
    "NvMedia",
    "OpenACC",
    "Correlation",
    "DX12",
    "DX12Workload",
    "PmuRawEvent",
    "GraphicsFrame",
    "Vulkan",
    "VulkanWorkload",
    "NvtxNameCudaDevice",
    "NvtxNameCudaContext",
    "NvtxNameCudaStream",
    "SystemEvent",
    "GpuMemoryEvent",
    "DX12CreateObject",
    "VulkanCreateObject",
    "UnitTraceEvent",
    "CustomETWEvent",
    "CudaSyncEvent",
    "SLIEvent",
    "CudaBacktrace",
    "WddmEvent",
    "DX11",
    "DX11CreateObject",
    "DXGI",
    "CudaGraphNodeCreation",
    "OpenMP",
    "UncorePmuEvent",
    "UncorePmuCarmel",
    "CudaDeviceMemoryUsage",
    "ETWDxgKrnlEvent",
    "CudaUvmCpuPageFaultEvent",
    "CudaUvmGpuPageFaultEvent",
    "NICMetricsValuesEvent",
    "NICMetricsListEvent",
    "InterruptHandler",
    "NVENC",
    "NVDEC",
    "nvJPEG",
    "CudaEventRecord",
    "PerfEventCountEvent",
    "CudaDeviceMemoryPool",
    "CudaDeviceGraph",
    "CudaGraphExecCreation",
    "CudaGraphCreation",
    "CudaGraphClone",
)
_EVENT_TYPES_ADDED_2024_6 = (  # ids 134..146
    "GpuMemoryTransferEvent",
    "GlTrace",
    "GpuVideoEngineWorkload",
    "IBSwitchMetricsValuesEvent",
    "GenericEvent",
    "UncorePmuT23xScf",
    "UncorePmuT23xDsu",
    "IBSwitchCongestionEvent",
    "CudaDeviceMemcpy",
    "PerfMetricValueEvent",
    "OpenXREvent",
    "TegraInternalEvent",
    "OSRuntimeStartStop",
)
_EVENT_TYPES_RENAMED_2026_2 = {107: "SLIEvent (DEPRECATED)", 124: "NvEncode", 125: "NVDecode"}
_EVENT_TYPES_ADDED_2026_2 = _EVENT_TYPES_ADDED_2024_6[:-1] + (  # ids 134..154
    "TraceStartFinish",
    "Syscall",
    "CudaConfidentialComputeKeyRotation",
    "CudaGraphExecNodeSetParams",
    "NvApi",
    "CudaHostFunc",
    "CudaApi",
    "Overhead",
    "CudaOverhead",
)

_EVENT_CLASSES_2022_4 = (
    (0, "CUDA_RUNTIME", "CUDA runtime"),
    (1, "CUDA_DRIVER", "CUDA driver"),
    (2, "GL", "GL"),
    (3, "TSP_OVERHEAD", "TSP overhead"),
    (4, "GL_DEBUG", "GL debug"),
    (5, "GL_WORKLOAD", "GL workload"),
    (6, "NVTX_START", "NVTX start"),
    (7, "NVTX_FINISH", "NVTX finish"),
    (8, "GL_START", "GL start"),
    (9, "GL_FINISH", "GL finish"),
    (10, "CUDA_START", "CUDA start"),
    (11, "CUDA_FINISH", "CUDA finish"),
    (12, "CUDA_INIT_ERROR", "CUDA init error"),
    (13, "CUDA_EGL_DRIVER", "CUDA EGL driver"),
    (18, "VSYNC", "Vsync"),
    (26, "CUDA_API", "CUDA API"),
    (27, "OS_RUNTIME", "OSRT runtime"),
    (28, "CUDNN", "cuDNN"),
    (29, "CUBLAS", "cuBLAS"),
    (31, "OS_RUNTIME_START", "OSRT start"),
    (32, "OS_RUNTIME_FINISH", "OSRT finish"),
    (33, "CUDNN_START", "cuDNN start"),
    (34, "CUDNN_FINISH", "cuDNN finish"),
    (35, "CUBLAS_START", "cuBLAS start"),
    (36, "CUBLAS_FINISH", "cuBLAS finish"),
    (37, "THREAD_BLOCK", "Thread block"),
    (38, "NVMEDIA", "NVmedia"),
    (39, "NVMEDIA_START", "NVmedia start"),
    (40, "NVMEDIA_FINISH", "NVmedia finish"),
    (41, "DX12_API", "DX12 API"),
    (42, "DX12_WORKLOAD", "DX12 workload"),
    (43, "DX12_START", "DX12 start"),
    (44, "DX12_FINISH", "DX12 finish"),
    (45, "OPENACC_START", "OpenACC start"),
    (46, "OPENACC_FINISH", "OpenACC finish"),
    (47, "OPENACC_INIT_ERROR", "OpenACC init error"),
    (48, "OPENACC", "OpenACC"),
    (49, "CPU_FPS", "CPU FPS"),
    (50, "GPU_FPS", "GPU FPS"),
    (51, "GL_MULTI_ERROR", "GL multi-error"),
    (52, "DX12_DISPLAY", "DX12 display"),
    (53, "VULKAN_API", "Vulkan API"),
    (54, "VULKAN_WORKLOAD", "Vulkan workload"),
    (55, "VULKAN_START", "Vulkan start"),
    (56, "VULKAN_FINISH", "Vulkan finish"),
    (57, "SYSTEM_EVENT", "System event"),
    (58, "GPU_MEMORY", "GPU memory"),
    (59, "DX12_CREATE_OBJECT", "DX12 create object"),
    (60, "VULKAN_CREATE_OBJECT", "Vulkan create object"),
    (61, "CUSTOM_ETW_TRACE", "Custom ETW trace"),
    (62, "SLI", "SLI"),
    (63, "SLI_START", "SLI start"),
    (64, "SLI_FINISH", "SLI finish"),
    (65, "DX12_DEBUG_API", "DX12 debug API"),
    (66, "VULKAN_DEBUG_API", "Vulkan debug API"),
    (67, "CUDABACKTRACE", "CUDA backtrace"),
    (68, "CUDABACKTRACE_START", "CUDA backtrace start"),
    (69, "CUDABACKTRACE_FINISH", "CUDA backtrace finish"),
    (70, "WDDM", "WDDM"),
    (71, "DX11_API", "DX11 API"),
    (72, "DX11_START", "DX11 start"),
    (73, "DX11_FINISH", "DX11 finish"),
    (74, "DX11_CREATE_OBJECT", "DX11 create object"),
    (75, "DX11_DEBUG_API", "DX11 debug API"),
    (76, "DXCOMMON_API", "DX common API"),
    (77, "CUDA_GRAPH_NODE_CREATION", "CUDA graph node creation"),
    (78, "OPENMP", "OpenMP"),
    (79, "OPENMP_START", "OpenMP start"),
    (80, "OPENMP_FINISH", "OpenMP finish"),
    (81, "NVAPI", "NV API"),
    (82, "ETWDXGKRNL", "ETW DXG KRNL"),
    (83, "NVENC", "NVENC"),
    (84, "NVENC_START", "NVENC start"),
    (85, "NVENC_FINISH", "NVENC finish"),
    (86, "NVDEC", "NVDEC"),
    (87, "NVDEC_START", "NVDEC start"),
    (88, "NVDEC_FINISH", "NVDEC finish"),
    (89, "NVJPEG", "nvJPEG"),
    (90, "NVJPEG_START", "nvJPEG start"),
    (91, "NVJPEG_FINISH", "nvJPEG finish"),
    (92, "DX12_BATCH_WORKLOAD", "DX12 batch workload"),
    (93, "VULKAN_BATCH_WORKLOAD", "Vulkan batch workload"),
    (94, "CUDA_GRAPHEXEC_CREATION", "CUDA graph exec creation"),
    (95, "CUDA_GRAPH_CREATION", "CUDA graph creation"),
    (96, "CUDA_GRAPH_CLONE", "CUDA graph clone"),
)
_EVENT_CLASSES_CHANGED_2024_6 = (
    (107, "SYSCALL", "Syscall"),
    (108, "TEGRA_INTERNAL", "Tegra Internal API"),
    (109, "TEGRA_INTERNAL_START", "Tegra Internal API start"),
    (110, "TEGRA_INTERNAL_FINISH", "Tegra Internal API finish"),
)
_EVENT_CLASSES_CHANGED_2026_2 = _EVENT_CLASSES_CHANGED_2024_6 + (
    (62, "SLI_DEPRECATED", "SLI (Deprecated)"),
    (63, "SLI_START_DEPRECATED", "SLI start (Deprecated)"),
    (64, "SLI_FINISH_DEPRECATED", "SLI finish (Deprecated)"),
    (83, "NVENCODE", "NVENCODE"),
    (84, "NVENCODE_START", "NVENCODE start"),
    (85, "NVENCODE_FINISH", "NVENCODE finish"),
    (86, "NVDECODE", "NVDECODE"),
    (87, "NVDECODE_START", "NVDECODE start"),
    (88, "NVDECODE_FINISH", "NVDECODE finish"),
    (98, "OPENCL", "OpenCL event"),
    (99, "OPENCL_START", "OpenCL start"),
    (100, "OPENCL_FINISH", "OpenCL finish"),
    (101, "OPENCL_INIT_ERROR", "OpenCL Init error"),
    (102, "CUDA_JIT", "CUDA JIT"),
    (103, "CUDA_OVERHEAD", "CUDA overhead"),
    (104, "OPENXR", "OpenXR event"),
    (105, "OPENXR_START", "OpenXR start"),
    (106, "OPENXR_FINISH", "OpenXR finish"),
    (111, "CUDA_GRAPH_EXEC_NODE_SET_PARAMS", "CUDA graph exec-node set params"),
)

_LAUNCH_TYPE_ROWS = (
    (0, "CUDA_KERNEL_LAUNCH_TYPE_UNKNOWN", "Unknown"),
    (1, "CUDA_KERNEL_LAUNCH_TYPE_REGULAR", "Regular"),
    (2, "CUDA_KERNEL_LAUNCH_TYPE_COOPERATIVE_SINGLE_DEVICE", "Coop Single Device"),
    (3, "CUDA_KERNEL_LAUNCH_TYPE_COOPERATIVE_MULTI_DEVICE", "Coop Multi Device"),
)

# CUDA enums: identical rows in 2022.4, 2024.6 and 2026.2.
_STATIC_ENUM_ROWS: Dict[str, Tuple[Tuple[int, str, str], ...]] = {
    "ENUM_CUDA_MEMCPY_OPER": (
        (0, "CUDA_MEMCPY_KIND_UNKNOWN", "Unknown"),
        (1, "CUDA_MEMCPY_KIND_HTOD", "Host-to-Device"),
        (2, "CUDA_MEMCPY_KIND_DTOH", "Device-to-Host"),
        (3, "CUDA_MEMCPY_KIND_HTOA", "Host-to-Array"),
        (4, "CUDA_MEMCPY_KIND_ATOH", "Array-to-Host"),
        (5, "CUDA_MEMCPY_KIND_ATOA", "Array-to-Array"),
        (6, "CUDA_MEMCPY_KIND_ATOD", "Array-to-Device"),
        (7, "CUDA_MEMCPY_KIND_DTOA", "Device-to-Array"),
        (8, "CUDA_MEMCPY_KIND_DTOD", "Device-to-Device"),
        (9, "CUDA_MEMCPY_KIND_HTOH", "Host-to-Host"),
        (10, "CUDA_MEMCPY_KIND_PTOP", "Peer-to-Peer"),
        (11, "CUDA_MEMCPY_KIND_UVM_HTOD", "Unified Host-to-Device"),
        (12, "CUDA_MEMCPY_KIND_UVM_DTOH", "Unified Device-to-Host"),
        (13, "CUDA_MEMCPY_KIND_UVM_DTOD", "Unified Device-to-Device"),
    ),
    "ENUM_CUDA_MEM_KIND": (
        (0, "CUDA_MEMOPR_MEMORY_KIND_PAGEABLE", "Pageable"),
        (1, "CUDA_MEMOPR_MEMORY_KIND_PINNED", "Pinned"),
        (2, "CUDA_MEMOPR_MEMORY_KIND_DEVICE", "Device"),
        (3, "CUDA_MEMOPR_MEMORY_KIND_ARRAY", "Array"),
        (4, "CUDA_MEMOPR_MEMORY_KIND_MANAGED", "Managed"),
        (5, "CUDA_MEMOPR_MEMORY_KIND_DEVICE_STATIC", "Device Static"),
        (6, "CUDA_MEMOPR_MEMORY_KIND_MANAGED_STATIC", "Managed Static"),
        (7, "CUDA_MEMOPR_MEMORY_KIND_UNKNOWN", "Unknown"),
    ),
    "ENUM_CUPTI_SYNC_TYPE": (
        (0, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_UNKNOWN", "Unknown"),
        (1, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE", "Event sync"),
        (2, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT", "Stream wait sync"),
        (3, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE", "Stream sync"),
        (4, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE", "Context sync"),
    ),
    "ENUM_CUDA_KRENEL_LAUNCH_TYPE": _LAUNCH_TYPE_ROWS,
    "ENUM_CUDA_KERNEL_LAUNCH_TYPE": _LAUNCH_TYPE_ROWS,
    "ENUM_CUDA_FUNC_CACHE_CONFIG": (
        (0, "CU_FUNC_CACHE_PREFER_NONE", "None"),
        (1, "CU_FUNC_CACHE_PREFER_SHARED", "Shared"),
        (2, "CU_FUNC_CACHE_PREFER_L1", "L1"),
        (3, "CU_FUNC_CACHE_PREFER_EQUAL", "Equal"),
    ),
    "ENUM_CUDA_SHARED_MEM_LIMIT_CONFIG": (
        (0, "CUDA_SHARED_MEM_LIMIT_DEFAULT", "Default"),
        (1, "CUDA_SHARED_MEM_LIMIT_OPTIN", "Opt in"),
    ),
    "ENUM_CUDA_UNIF_MEM_MIGRATION": (
        (0, "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_UNKNOWN", "Unknown"),
        (1, "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_USER", "User prefetch"),
        (2, "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_COHERENCE", "Page fault"),
        (3, "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_PREFETCH", "Speculative prefecth"),  # sic
        (4, "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_EVICTION", "Eviction"),
        (5, "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_ACCESS_COUNTERS", "Access counters"),
    ),
    "ENUM_CUPTI_STREAM_TYPE": (
        (0, "CUPTI_ACTIVITY_STREAM_CREATE_FLAG_UNKNOWN", "Unknown stream type"),
        (1, "CUPTI_ACTIVITY_STREAM_CREATE_FLAG_DEFAULT", "Default stream"),
        (2, "CUPTI_ACTIVITY_STREAM_CREATE_FLAG_NON_BLOCKING", "Non-blocking stream"),
        (3, "CUPTI_ACTIVITY_STREAM_CREATE_FLAG_NULL", "Null stream"),
    ),
}


def enum_rows(table: str, version: str) -> List[Tuple[int, str, str]]:
    """Rows nsys ``version`` writes into ENUM ``table`` (id, name, label)."""
    if table == "ENUM_NSYS_EVENT_TYPE":
        names = list(_EVENT_TYPES_2022_4)
        if _vkey(version) >= _vkey("2026.2"):
            for type_id, name in _EVENT_TYPES_RENAMED_2026_2.items():
                names[type_id] = name
            names += _EVENT_TYPES_ADDED_2026_2
        elif _vkey(version) >= _vkey("2024.6"):
            names += _EVENT_TYPES_ADDED_2024_6
        return [(i, name, name) for i, name in enumerate(names)]
    if table == "ENUM_NSYS_EVENT_CLASS":
        rows = {row[0]: row for row in _EVENT_CLASSES_2022_4}
        if _vkey(version) >= _vkey("2026.2"):
            rows.update((row[0], row) for row in _EVENT_CLASSES_CHANGED_2026_2)
        elif _vkey(version) >= _vkey("2024.6"):
            rows.update((row[0], row) for row in _EVENT_CLASSES_CHANGED_2024_6)
        return [(i, "TRACE_PROCESS_EVENT_" + rows[i][1], rows[i][2]) for i in sorted(rows)]
    return list(_STATIC_ENUM_ROWS[table])


# ---------------------------------------------------------------------------
# Metadata of each exporter version.
# ---------------------------------------------------------------------------

_PRODUCT = {
    # version: (EXPORT_PRODUCT_VERSION, schema version, EXPORT_SCHEMA_VERSION_CKSUM)
    "2022.4": ("2022.4.2.1", "3.0.0", "4042420554 115894"),
    "2024.6": ("2024.6.2.25", "3.16.1", "1636331256 167395"),
    "2026.2": ("2026.2.1.210", "3.25.0", "306658267 182758"),
}

# nameEnum of TARGET_INFO_SYSTEM_ENV properties (stable across 2021.3 .. 2026.2).
_SYSTEM_ENV_ENUMS = {
    "CpuCores": 1,
    "CpuSpeedMhz": 2,
    "CpuArchitecture": 3,
    "SupportedABIs": 5,
    "Supported64BitABIs": 7,
    "CNTFRQMHz": 11,
    "CpuDescription": 13,
    "CpuInfo": 14,
    "CpuEmcSpeedMhz": 101,
    "SupportsXmcClients": 153,
    "TargetInstallDir": 170,
    "InjectionFilesStoragePath": 173,
    "HasDiscreteGpu": 203,
    "NvDriverVersion": 205,
    "IsX86BasedDevice": 506,
    "HardwarePlatform": 600,
    "SoftwarePlatform": 601,
    "OsDescription": 605,
    "DeviceEnvironment": 610,
    "CudaDriverVersion": 611,
    "SoftwareReleaseVersion": 618,
    "Hostname": 619,
    "IsDevicePropsUpdated": 701,
    "IsDeviceCapsUpdated": 702,
    "IsPersistentDevice": 703,
    "IsRootEnabled": 705,
    "NamespacePID": 722,
    "HasThreadStateEvents": 800,
    "HasNvtxEvents": 809,
    "HasCudaEvents": 812,
    "HasGraphicsEvents": 813,
    "HasOSRuntimeEvents": 815,
    "HasCuDNNEvents": 816,
    "HasCuBLASEvents": 817,
    "HasOpenACCEvents": 819,
    "HasNvMediaEvents": 820,
    "HasCudaBacktraceEvents": 821,
    "KernelVersion": 882,
    "GpuInfo": 897,
    "GpuMetricsConfig": 902,
    "ExportLevel": 904,
    "NicInfo": 910,
}

# Strings every export of the version starts StringIds with (ids 0..).  Seeding them
# keeps our own strings away from id 0, as in real files.
_SEED_STRINGS = {
    "2021.3": ("[Unknown]", "[kernel.kallsyms]", "[Max depth]"),
    "2022.4": ("[Unknown]", "[kernel.kallsyms]", "[Max depth]"),
    "2024.6": ("GpuMetrics", "SocMetrics", "GenericCounters"),
    "2026.2": ("GpuMetrics", "SocMetrics"),
}

_DEFAULT_UTC_EPOCH_NS = 1_700_000_000_000_000_000  # 2023-11-14T22:13:20Z

# Values for NOT NULL (or always-filled) columns the builder has no argument for,
# as they appear in real exports.  Columns in neither a table's fields nor here stay NULL.
_CONSTANTS: Dict[str, Dict[str, Any]] = {
    "CUPTI_ACTIVITY_KIND_KERNEL": {
        "greenContextId": 0,
        "launchType": 1,
        "cacheConfig": 1,
        "localMemoryPerThread": 0,
        "localMemoryTotal": 0,
        "sharedMemoryLimitConfig": 0,
        "clusterX": 0,
        "clusterY": 0,
        "clusterZ": 0,
        "clusterSchedulingPolicy": 1,
        "maxPotentialClusterSize": 0,
        "maxActiveClusters": 0,
        "tensorSizeMinusOneElements": "[]",
    },
    "CUPTI_ACTIVITY_KIND_MEMCPY": {"greenContextId": 0, "copyCount": 1},
    "CUPTI_ACTIVITY_KIND_MEMSET": {"greenContextId": 0},
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": {"eventSyncId": 0},
    "OSRT_API": {"returnValue": 0, "correlationId": 0, "nestingLevel": 0, "callchainId": 0, "argumentsId": 0},
    "CUDA_GPU_MEMORY_USAGE_EVENTS": {"contextId": 1, "pc": 0},
}

# Fields the builder stores per row of each event table (row tuples use this order).
_FIELDS: Dict[str, Tuple[str, ...]] = {
    "NVTX_EVENTS": (
        "start",
        "end",
        "eventType",
        "rangeId",
        "category",
        "color",
        "text",
        "globalTid",
        "endGlobalTid",
        "textId",
        "domainId",
    ),
    "CUPTI_ACTIVITY_KIND_RUNTIME": (
        "start",
        "end",
        "eventClass",
        "globalTid",
        "correlationId",
        "nameId",
        "returnValue",
    ),
    "CUPTI_ACTIVITY_KIND_KERNEL": (
        "start",
        "end",
        "deviceId",
        "contextId",
        "streamId",
        "correlationId",
        "globalPid",
        "demangledName",
        "shortName",
        "mangledName",
        "registersPerThread",
        "gridX",
        "gridY",
        "gridZ",
        "blockX",
        "blockY",
        "blockZ",
        "staticSharedMemory",
        "dynamicSharedMemory",
        "gridId",
        "sharedMemoryExecuted",
        "graphNodeId",
        "kernel_name",
        "long_kernel_name",
    ),
    "CUPTI_ACTIVITY_KIND_MEMCPY": (
        "start",
        "end",
        "deviceId",
        "contextId",
        "streamId",
        "correlationId",
        "globalPid",
        "bytes",
        "copyKind",
        "srcKind",
        "dstKind",
    ),
    "CUPTI_ACTIVITY_KIND_MEMSET": (
        "start",
        "end",
        "deviceId",
        "contextId",
        "streamId",
        "correlationId",
        "globalPid",
        "value",
        "bytes",
        "memKind",
    ),
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": (
        "start",
        "end",
        "deviceId",
        "contextId",
        "streamId",
        "correlationId",
        "globalPid",
        "syncType",
        "eventId",
    ),
    "OSRT_API": ("start", "end", "eventClass", "globalTid", "nameId"),
    "CUDA_GPU_MEMORY_USAGE_EVENTS": (
        "start",
        "globalPid",
        "deviceId",
        "address",
        "bytes",
        "memKind",
        "memoryOperationType",
        "correlationId",
    ),
    "ThreadNames": ("nameId", "priority", "globalTid"),
    "PROCESSES": ("globalPid", "pid", "name"),
    "TARGET_INFO_SYSTEM_ENV": ("globalVid", "devStateName", "name", "nameEnum", "value"),
    "TARGET_INFO_GPU": tuple(c.name for c in _parse_columns(_table_spec("TARGET_INFO_GPU"), "2022.4")),
}

# nsys eventType values of NVTX_EVENTS rows (ENUM_NSYS_EVENT_TYPE).
EVENT_NVTX_CATEGORY = 33
EVENT_NVTX_MARK = 34
EVENT_NVTX_PUSHPOP = 59
EVENT_NVTX_STARTEND = 60
EVENT_NVTX_DOMAIN_CREATE = 75


class _Table:
    """Rows of one table in insertion order: chunks of row tuples or of column batches.

    Column batches (bulk adds) keep numpy arrays as they are until write time, so
    millions of rows cost no per-row Python objects before ``write``.
    """

    def __init__(self, fields: Sequence[str]):
        self.fields = tuple(fields)
        self._index = {name: i for i, name in enumerate(self.fields)}
        self._chunks: List[Tuple[str, Any, int]] = []
        self.count = 0

    def add(self, row: Tuple) -> None:
        """Append one row tuple (values in ``fields`` order)."""
        if not self._chunks or self._chunks[-1][0] != "rows":
            self._chunks.append(("rows", [], 0))
        self._chunks[-1][1].append(row)
        self.count += 1

    def add_columns(self, columns: Dict[str, Any], n: int) -> None:
        """Append ``n`` rows given as field -> sequence (length n) or scalar."""
        unknown = set(columns) - set(self.fields)
        if unknown:
            raise KeyError(f"unknown fields {sorted(unknown)}")
        self._chunks.append(("cols", columns, n))
        self.count += n

    def iter_rows(self, wanted: Sequence[str]) -> Iterator[Tuple]:
        """Rows projected on the ``wanted`` fields, ready for sqlite3 binding."""
        for bound, scalars, rows in self.chunks(wanted):
            if scalars:
                positions = {name: i for i, name in enumerate(bound)}
                yield from (
                    tuple(row[positions[name]] if name in positions else scalars[name] for name in wanted)
                    for row in rows
                )
            else:
                yield from rows

    def chunks(self, wanted: Sequence[str]) -> Iterator[Tuple[List[str], Dict[str, Any], Iterable[Tuple]]]:
        """Per chunk: (fields bound per row, fields constant over the chunk, row tuples of the bound fields).

        Constant fields of bulk batches (scalars) are not bound row by row: the
        writer inlines them in the INSERT, which is much faster for 10^6 rows.
        """
        indexes = [self._index[name] for name in wanted]
        identity = indexes == list(range(len(self.fields)))
        for kind, payload, n in self._chunks:
            if kind == "rows":
                if identity:
                    rows: Iterable[Tuple] = payload
                elif len(indexes) == 1:
                    rows = ((row[indexes[0]],) for row in payload)
                else:
                    rows = map(itemgetter(*indexes), payload)
                yield list(wanted), {}, rows
            else:
                bound = [name for name in wanted if _is_sequence(payload.get(name))]
                scalars = {name: _scalar(payload.get(name)) for name in wanted if name not in bound}
                rows = zip(*(_as_list(payload[name]) for name in bound)) if bound else itertools.repeat((), n)
                yield bound, scalars, rows


def _is_sequence(values: Any) -> bool:
    """Whether a bulk column is per-row data (else a scalar broadcast over the batch)."""
    return isinstance(values, (np.ndarray, list, tuple))


def _as_list(values: Any) -> Sequence:
    """Bindable per-row values; numpy scalars are not bindable by sqlite3, hence tolist()."""
    return values.tolist() if isinstance(values, np.ndarray) else values


def _scalar(value: Any) -> Any:
    """Plain Python value of a broadcast scalar."""
    return value.item() if isinstance(value, np.generic) else value


def _per_row_or_scalar(values: Any) -> Any:
    """A bulk column argument: an int64 array if per row, else one int for the whole batch."""
    arr = np.asarray(values, dtype=np.int64)
    return int(arr) if arr.ndim == 0 else arr


def _opt_int(value: Any) -> Optional[int]:
    """int(value), keeping None (sqlite3 cannot bind numpy integers)."""
    return None if value is None else int(value)


def _sql_literal(value: Any) -> str:
    """SQL literal of a constant (bytes become TEXT holding those bytes, like bound values)."""
    if isinstance(value, bytes):
        return f"CAST(X'{value.hex()}' AS TEXT)"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, float):
        return repr(value)
    return str(int(value))


def _max_of(values: Any) -> Optional[int]:
    """Largest non-None value of a sequence, or None."""
    arr = np.asarray(values)
    if arr.size == 0:
        return None
    if arr.dtype == object:
        present = [v for v in arr.tolist() if v is not None]
        return int(max(present)) if present else None
    return int(arr.max())


class NsysExport:
    """Builder of one synthetic nsys SQLite export.

    ``schema`` is the nsys (exporter) version whose layout is written: one of
    SCHEMA_VERSIONS.  ``dlprof_modified`` mimics a file DLProf 1.x modified in place
    (``kernel_name``/``long_kernel_name`` on the kernel table, a ``SystemInfo`` table).
    ``lazy=False`` creates every known table of the version even when empty, as
    ``nsys export --lazy=false`` does.  ``hw`` is the hardware id put in bits 48+ of
    global ids.  All times are integer nanoseconds on the session timeline.
    """

    def __init__(self, schema: str = "2022.4", dlprof_modified: bool = False, lazy: bool = True, hw: int = 1):
        if schema not in SCHEMA_VERSIONS:
            raise ValueError(f"schema must be one of {SCHEMA_VERSIONS}, not {schema!r}")
        self.schema = schema
        self.dlprof_modified = dlprof_modified
        self.lazy = lazy
        self.hw = int(hw)
        self._strings: Dict[Any, int] = {}
        for text in _SEED_STRINGS[schema]:
            self.intern(text)
        self._tables: Dict[str, _Table] = {name: _Table(fields) for name, fields in _FIELDS.items()}
        self._processes: set = set()
        self._next_corr: Dict[int, int] = {}
        self._next_grid_id = 1
        self._next_range_id = 1
        self._max_time: Optional[int] = None
        self._session: Dict[str, Any] = {"start_time": 0, "stop_time": None, "utc_epoch_ns": _DEFAULT_UTC_EPOCH_NS}
        self._capture_meta: List[Tuple[str, str]] = []
        self._system_info: List[Tuple[str, str]] = []

    # -- strings and ids ---------------------------------------------------

    def intern(self, text: Any) -> int:
        """StringIds id of ``text`` (str, or bytes for invalid UTF-8), added on first use."""
        sid = self._strings.get(text)
        if sid is None:
            sid = self._strings[text] = len(self._strings)
        return sid

    def _intern_many(self, texts: Iterable) -> List[int]:
        """StringIds ids of many strings (fast path for bulk adds)."""
        get = self._strings.get
        return [get(t) if t in self._strings else self.intern(t) for t in texts]

    def _gpid(self, pid: int) -> int:
        """globalPid from a plain PID, or from a globalTid/globalPid (bits above 24 set)."""
        pid = int(pid)
        if pid >> 24:
            return pid & _PID_BITS_MASK
        return global_pid(pid, self.hw)

    def _gpids(self, pids: Any) -> np.ndarray:
        """Vectorised _gpid."""
        arr = np.asarray(pids, dtype=np.int64)
        return np.where(arr >> 24 != 0, arr & _PID_BITS_MASK, (self.hw << 48) | ((arr & _TID_MASK) << 24))

    def _seen(self, *times: Optional[int]) -> None:
        """Track the latest timestamp (default ANALYSIS_DETAILS.stopTime)."""
        for t in times:
            if t is not None and (self._max_time is None or t > self._max_time):
                self._max_time = int(t)

    def _seen_many(self, *arrays: Any) -> None:
        self._seen(*(_max_of(a) for a in arrays))

    # -- processes, threads, GPUs, environment ------------------------------

    def add_gpu(
        self,
        device_id: int = 0,
        name: str = "NVIDIA A100-SXM4-40GB",
        total_memory: int = 42505273344,
        sm_count: int = 108,
        compute: Tuple[int, int] = (8, 0),
        bus_location: str = "0000:07:00.0",
        chip_name: str = "GA100",
        uuid: Optional[str] = None,
        **columns: Any,
    ) -> None:
        """Add a TARGET_INFO_GPU row; extra keyword arguments override any other column."""
        device_id = int(device_id)
        if uuid is None:
            uuid = str(_uuid.uuid5(_uuid.NAMESPACE_OID, f"nsys-builder-gpu-{device_id}"))
        row = {
            "vmId": self.hw << 48,
            "id": device_id,
            "name": name,
            "busLocation": bus_location,
            "isDiscrete": 1,
            "l2CacheSize": 41943040,
            "totalMemory": int(total_memory),
            "memoryBandwidth": 1555200000000,
            "clockRate": 1410000000,
            "smCount": int(sm_count),
            "pwGpuId": device_id,
            "uuid": uuid,
            "luid": 0,
            "chipName": chip_name,
            "cuDevice": device_id,
            "ctxswDevPath": "",
            "ctrlDevPath": "",
            "revision": 161,
            "nodeMask": 0,
            "constantMemory": 65536,
            "maxIPC": 4,
            "maxRegistersPerBlock": 65536,
            "maxShmemPerBlock": 49152,
            "maxShmemPerBlockOptin": 166912,
            "maxShmemPerSm": 167936,
            "maxRegistersPerSm": 65536,
            "threadsPerWarp": 32,
            "asyncEngines": 3,
            "maxWarpsPerSm": 64,
            "maxBlocksPerSm": 32,
            "maxThreadsPerBlock": 1024,
            "maxBlockDimX": 1024,
            "maxBlockDimY": 1024,
            "maxBlockDimZ": 64,
            "maxGridDimX": 2147483647,
            "maxGridDimY": 65535,
            "maxGridDimZ": 65535,
            "computeMajor": int(compute[0]),
            "computeMinor": int(compute[1]),
            "smMajor": int(compute[0]),
            "smMinor": int(compute[1]),
        }
        unknown = set(columns) - set(row)
        if unknown:
            raise KeyError(f"unknown TARGET_INFO_GPU columns {sorted(unknown)}")
        row.update(columns)
        table = self._tables["TARGET_INFO_GPU"]
        table.add(tuple(row[name] for name in table.fields))

    def add_thread(self, pid: int, tid: int, name: str, process_name: Optional[str] = None) -> int:
        """Name a thread (ThreadNames) and register its process once (PROCESSES); returns globalTid."""
        gtid = global_tid(pid, tid, self.hw)
        self._tables["ThreadNames"].add((self.intern(name), 20, gtid))
        gpid = global_pid(pid, self.hw)
        if gpid not in self._processes:
            self._processes.add(gpid)
            self._tables["PROCESSES"].add((gpid, int(pid), process_name if process_name is not None else name))
        return gtid

    def system_env(self, name: Any, value: Any) -> None:
        """Add a TARGET_INFO_SYSTEM_ENV row; bytes values are stored as (possibly invalid) TEXT."""
        self._tables["TARGET_INFO_SYSTEM_ENV"].add(
            (self.hw << 48, "Local (CLI)", name, _SYSTEM_ENV_ENUMS.get(name, 0), value)
        )

    def capture_meta(self, name: str, value: str) -> None:
        """Add a META_DATA_CAPTURE row (2024.6+; ignored by older schemas)."""
        self._capture_meta.append((name, value))

    def system_info(self, name: str, value: str) -> None:
        """Add a row to DLProf's SystemInfo table (dlprof_modified only)."""
        self._system_info.append((name, value))

    def set_session(
        self, start_time: int = 0, stop_time: Optional[int] = None, utc_epoch_ns: int = _DEFAULT_UTC_EPOCH_NS
    ) -> None:
        """Capture window (ANALYSIS_DETAILS); stop defaults to the latest event time."""
        self._session = {
            "start_time": int(start_time),
            "stop_time": _opt_int(stop_time),
            "utc_epoch_ns": int(utc_epoch_ns),
        }

    # -- NVTX ----------------------------------------------------------------

    def _nvtx(
        self,
        start,
        end,
        event_type,
        tid,
        text,
        domain_id=0,
        registered=False,
        category=None,
        end_tid=None,
        range_id=None,
    ) -> None:
        """Append one NVTX_EVENTS row; registered strings go to StringIds (text NULL)."""
        text_value, text_id = (None, self.intern(text)) if registered else (text, None)
        self._tables["NVTX_EVENTS"].add(
            (
                int(start),
                _opt_int(end),
                event_type,
                range_id,
                _opt_int(category),
                None,
                text_value,
                int(tid),
                _opt_int(end_tid),
                text_id,
                _opt_int(domain_id),
            )
        )
        self._seen(start, end)

    def add_domain(self, tid: int, domain_id: int, name: str, registered: bool = False, time: int = 0) -> None:
        """nvtxDomainCreate: an eventType 75 row naming ``domain_id`` within tid's process."""
        self._nvtx(time, None, EVENT_NVTX_DOMAIN_CREATE, tid, name, domain_id, registered)

    def add_category(self, tid: int, category: int, name: str, domain_id: int = 0, time: int = 0) -> None:
        """nvtxNameCategory: an eventType 33 row naming ``category``."""
        self._nvtx(time, None, EVENT_NVTX_CATEGORY, tid, name, domain_id, category=category)

    def push_pop(
        self,
        tid: int,
        start: int,
        end: Optional[int],
        text: Any,
        domain_id: int = 0,
        registered: bool = False,
        category: Optional[int] = None,
    ) -> None:
        """Push/pop range (eventType 59); ``end=None`` writes an unclosed range."""
        self._nvtx(start, end, EVENT_NVTX_PUSHPOP, tid, text, domain_id, registered, category)

    def start_end(
        self,
        tid: int,
        start: int,
        end: Optional[int],
        text: Any,
        domain_id: int = 0,
        registered: bool = False,
        end_tid: Optional[int] = None,
    ) -> None:
        """Start/end range (eventType 60); ``end_tid`` fills endGlobalTid (range ended on another thread)."""
        range_id = self._next_range_id
        self._next_range_id += 1
        self._nvtx(
            start, end, EVENT_NVTX_STARTEND, tid, text, domain_id, registered, end_tid=end_tid, range_id=range_id
        )

    def mark(self, tid: int, time: int, text: Any, domain_id: int = 0) -> None:
        """Instantaneous marker (eventType 34, end NULL)."""
        self._nvtx(time, None, EVENT_NVTX_MARK, tid, text, domain_id)

    def push_pop_many(self, tids: Any, starts: Any, ends: Any, texts: Any, domain_id: int = 0) -> None:
        """Bulk push/pop ranges with inline (non-registered) texts; one element per row."""
        n = len(starts)
        self._tables["NVTX_EVENTS"].add_columns(
            {
                "start": np.asarray(starts),
                "end": ends if isinstance(ends, list) else np.asarray(ends),
                "eventType": EVENT_NVTX_PUSHPOP,
                "text": list(texts),
                "globalTid": np.asarray(tids),
                "domainId": int(domain_id),
            },
            n,
        )
        self._seen_many(starts, ends)

    # -- CUDA API and GPU activities ------------------------------------------

    def _take_corr(self, gpid: int, correlation_id: Optional[int]) -> int:
        """Next per-process correlation id, or record an explicit one."""
        nxt = self._next_corr.get(gpid, 1)
        if correlation_id is None:
            correlation_id = nxt
        self._next_corr[gpid] = max(nxt, int(correlation_id) + 1)
        return int(correlation_id)

    def runtime(
        self,
        tid: int,
        start: int,
        end: int,
        name: str = "cudaLaunchKernel_v7000",
        correlation_id: Optional[int] = None,
        event_class: int = 0,
        return_value: int = 0,
    ) -> int:
        """CUDA runtime/driver call (CUPTI_ACTIVITY_KIND_RUNTIME); returns its correlation id."""
        corr = self._take_corr(int(tid) & _PID_BITS_MASK, correlation_id)
        self._tables["CUPTI_ACTIVITY_KIND_RUNTIME"].add(
            (int(start), int(end), int(event_class), int(tid), corr, self.intern(name), int(return_value))
        )
        self._seen(start, end)
        return corr

    def runtime_many(self, tids: Any, starts: Any, ends: Any, names: Any, correlation_ids: Any) -> None:
        """Bulk CUDA API calls; one element per row."""
        tids = np.asarray(tids, dtype=np.int64)
        corrs = np.asarray(correlation_ids, dtype=np.int64)
        self._tables["CUPTI_ACTIVITY_KIND_RUNTIME"].add_columns(
            {
                "start": np.asarray(starts),
                "end": np.asarray(ends),
                "eventClass": 0,
                "globalTid": tids,
                "correlationId": corrs,
                "nameId": self._intern_many(names),
                "returnValue": 0,
            },
            len(tids),
        )
        for gpid in np.unique(tids & _PID_BITS_MASK).tolist():
            self._take_corr(gpid, int(corrs[(tids & _PID_BITS_MASK) == gpid].max()))
        self._seen_many(starts, ends)

    def _name_ids(self, short_name: str, demangled_name: Optional[str], mangled_name: Optional[str]):
        """StringIds of a kernel's names; like nsys, a plain (extern "C") kernel shares one id."""
        short_id = self.intern(short_name)
        demangled_id = short_id if demangled_name is None else self.intern(demangled_name)
        mangled_id = demangled_id if mangled_name is None else self.intern(mangled_name)
        return short_id, demangled_id, mangled_id

    def kernel(
        self,
        pid: int,
        correlation_id: int,
        start: int,
        end: int,
        short_name: str,
        demangled_name: Optional[str] = None,
        device_id: int = 0,
        stream_id: int = 7,
        context_id: int = 1,
        grid: Tuple[int, int, int] = (1, 1, 1),
        block: Tuple[int, int, int] = (128, 1, 1),
        registers: int = 32,
        static_smem: int = 0,
        dynamic_smem: int = 0,
        graph_node_id: Optional[int] = None,
        mangled_name: Optional[str] = None,
    ) -> None:
        """Kernel execution (CUPTI_ACTIVITY_KIND_KERNEL) of process ``pid`` (PID or global id)."""
        short_id, demangled_id, mangled_id = self._name_ids(short_name, demangled_name, mangled_name)
        grid_id = self._next_grid_id
        self._next_grid_id += 1
        self._tables["CUPTI_ACTIVITY_KIND_KERNEL"].add(
            (
                int(start),
                int(end),
                int(device_id),
                int(context_id),
                int(stream_id),
                _opt_int(correlation_id),
                self._gpid(pid),
                demangled_id,
                short_id,
                mangled_id,
                int(registers),
                *(int(v) for v in grid),
                *(int(v) for v in block),
                int(static_smem),
                int(dynamic_smem),
                grid_id,
                int(static_smem) + int(dynamic_smem),
                _opt_int(graph_node_id),
                short_name,
                demangled_name if demangled_name is not None else short_name,
            )
        )
        self._seen(start, end)

    def kernels_many(
        self,
        pids: Any,
        correlation_ids: Any,
        starts: Any,
        ends: Any,
        short_names: Any,
        device_ids: Any = 0,
        stream_ids: Any = 7,
    ) -> None:
        """Bulk kernels (plain names: demangled = mangled = short); one element per row."""
        n = len(starts)
        names = list(short_names)
        name_ids = self._intern_many(names)
        grid_ids = np.arange(self._next_grid_id, self._next_grid_id + n, dtype=np.int64)
        self._next_grid_id += n
        self._tables["CUPTI_ACTIVITY_KIND_KERNEL"].add_columns(
            {
                "start": np.asarray(starts),
                "end": np.asarray(ends),
                "deviceId": _per_row_or_scalar(device_ids),
                "contextId": 1,
                "streamId": _per_row_or_scalar(stream_ids),
                "correlationId": np.asarray(correlation_ids),
                "globalPid": self._gpids(pids),
                "demangledName": name_ids,
                "shortName": name_ids,
                "mangledName": name_ids,
                "registersPerThread": 32,
                "gridX": 1,
                "gridY": 1,
                "gridZ": 1,
                "blockX": 128,
                "blockY": 1,
                "blockZ": 1,
                "staticSharedMemory": 0,
                "dynamicSharedMemory": 0,
                "gridId": grid_ids,
                "sharedMemoryExecuted": 0,
                "graphNodeId": None,
                "kernel_name": names,
                "long_kernel_name": names,
            },
            n,
        )
        self._seen_many(starts, ends)

    def memcpy(
        self,
        pid: int,
        correlation_id: int,
        start: int,
        end: int,
        bytes: int,
        copy_kind: int = 1,
        src_kind: int = 0,
        dst_kind: int = 2,
        device_id: int = 0,
        stream_id: int = 7,
        context_id: int = 1,
    ) -> None:
        """Memory copy (CUPTI_ACTIVITY_KIND_MEMCPY); copy_kind per ENUM_CUDA_MEMCPY_OPER (1 = HtoD)."""
        self._tables["CUPTI_ACTIVITY_KIND_MEMCPY"].add(
            (
                int(start),
                int(end),
                int(device_id),
                int(context_id),
                int(stream_id),
                _opt_int(correlation_id),
                self._gpid(pid),
                int(bytes),
                int(copy_kind),
                _opt_int(src_kind),
                _opt_int(dst_kind),
            )
        )
        self._seen(start, end)

    def memset(
        self,
        pid: int,
        correlation_id: int,
        start: int,
        end: int,
        bytes: int,
        value: int = 0,
        mem_kind: int = 2,
        device_id: int = 0,
        stream_id: int = 7,
        context_id: int = 1,
    ) -> None:
        """Memory set (CUPTI_ACTIVITY_KIND_MEMSET); mem_kind per ENUM_CUDA_MEM_KIND (2 = Device)."""
        self._tables["CUPTI_ACTIVITY_KIND_MEMSET"].add(
            (
                int(start),
                int(end),
                int(device_id),
                int(context_id),
                int(stream_id),
                _opt_int(correlation_id),
                self._gpid(pid),
                int(value),
                int(bytes),
                _opt_int(mem_kind),
            )
        )
        self._seen(start, end)

    def sync(
        self,
        pid: int,
        correlation_id: int,
        start: int,
        end: int,
        sync_type: int = 3,
        device_id: int = 0,
        stream_id: int = 7,
        context_id: int = 1,
        event_id: int = 0,
    ) -> None:
        """GPU-side wait of a sync API (CUPTI_ACTIVITY_KIND_SYNCHRONIZATION); 3 = stream sync."""
        self._tables["CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"].add(
            (
                int(start),
                int(end),
                int(device_id),
                int(context_id),
                int(stream_id),
                _opt_int(correlation_id),
                self._gpid(pid),
                int(sync_type),
                int(event_id),
            )
        )
        self._seen(start, end)

    def memory_usage(
        self,
        pid: int,
        start: int,
        nbytes: int,
        free: bool = False,
        device_id: int = 0,
        address: int = 0x7F0000000000,
        mem_kind: int = 2,
        correlation_id: Optional[int] = None,
    ) -> None:
        """A CUDA memory allocation or free (CUDA_GPU_MEMORY_USAGE_EVENTS, `--cuda-memory-usage=true`): memKind 2
        is device memory, 1 pinned host memory; `correlation_id` links it to its CUDA API call."""
        self._tables["CUDA_GPU_MEMORY_USAGE_EVENTS"].add(
            (
                int(start),
                self._gpid(pid),
                int(device_id),
                int(address),
                int(nbytes),
                int(mem_kind),
                1 if free else 0,
                _opt_int(correlation_id),
            )
        )
        self._seen(start)

    def osrt(self, tid: int, start: int, end: int, name: str = "read", event_class: int = 27) -> None:
        """OS runtime call (OSRT_API); event_class 27 = a real call."""
        self._tables["OSRT_API"].add((int(start), int(end), int(event_class), int(tid), self.intern(name)))
        self._seen(start, end)

    def launch(
        self,
        tid: int,
        api_start: int,
        api_end: int,
        gpu_start: int,
        gpu_end: int,
        kernel: str = "my_kernel",
        device_id: int = 0,
        stream_id: int = 7,
        api: str = "cudaLaunchKernel_v7000",
        **kernel_kwargs: Any,
    ) -> int:
        """A launch call plus its kernel under a fresh correlation id; returns the id."""
        corr = self.runtime(tid, api_start, api_end, name=api)
        self.kernel(
            int(tid) & _PID_BITS_MASK,
            corr,
            gpu_start,
            gpu_end,
            kernel,
            device_id=device_id,
            stream_id=stream_id,
            **kernel_kwargs,
        )
        return corr

    # -- writing ----------------------------------------------------------------

    def write(self, path: Any) -> Path:
        """Write a new SQLite file (FileExistsError if ``path`` exists); returns its Path."""
        path = Path(path)
        if path.exists():
            raise FileExistsError(path)
        con = sqlite3.connect(str(path), isolation_level=None)
        try:
            # One transaction, no journal: a throw-away file, written as fast as possible.
            con.execute("PRAGMA journal_mode=OFF")
            con.execute("PRAGMA synchronous=OFF")
            con.execute("BEGIN")
            for table, columns in table_columns(self.schema, self.dlprof_modified).items():
                source = self._source(table, path)
                if source is None and self.lazy:
                    continue
                _create_table(con, table, columns)
                if source is not None:
                    _insert_rows(con, table, columns, source)
            con.execute("COMMIT")
        finally:
            con.close()
        return path

    def _source(self, table: str, path: Path) -> Optional[_Table]:
        """Rows of a table, or None when it has none and is created lazily."""
        if table in self._tables and table not in ("ThreadNames", "TARGET_INFO_SYSTEM_ENV"):
            data = self._tables[table]
            return data if data.count else None
        rows = self._generated_rows(table, path)
        if rows is None:
            return None
        fields, values = rows
        data = _Table(fields)
        for row in values:
            data.add(row)
        return data

    def _generated_rows(self, table: str, path: Path) -> Optional[Tuple[Tuple[str, ...], List[Tuple]]]:
        """Rows of the tables built at write time (always present in real exports)."""
        if table in ("ThreadNames", "TARGET_INFO_SYSTEM_ENV"):
            data = self._tables[table]
            return data.fields, list(data.iter_rows(data.fields))
        if table == "StringIds":
            return ("id", "value"), [(sid, text) for text, sid in self._strings.items()]
        if table.startswith("ENUM_"):
            return ("id", "name", "label"), enum_rows(table, self.schema)
        if table in ("EXPORT_META_DATA", "META_DATA_EXPORT"):
            return ("name", "value"), self._export_meta(path)
        if table == "META_DATA_CAPTURE":
            return ("name", "value"), _default_capture_meta() + self._capture_meta
        if table == "ANALYSIS_DETAILS":
            start, stop = self._window()
            return ("globalVid", "duration", "startTime", "stopTime"), [(self.hw << 48, stop - start, start, stop)]
        if table == "TARGET_INFO_SESSION_START_TIME":
            return self._start_time_row()
        if table == "TARGET_INFO_CUDA_DEVICE":
            rows = self._cuda_device_rows()
            return (("gpuId", "cudaId", "pid"), rows) if rows else None
        if table == "SystemInfo":
            return ("name", "value"), self._dlprof_system_info()
        raise KeyError(table)

    def _window(self) -> Tuple[int, int]:
        """Session (start, stop) on the timeline."""
        start = self._session["start_time"]
        stop = self._session["stop_time"]
        if stop is None:
            stop = max(start, self._max_time if self._max_time is not None else start)
        return start, stop

    def _start_time_row(self) -> Tuple[Tuple[str, ...], List[Tuple]]:
        """TARGET_INFO_SESSION_START_TIME; systemClockNs (2026.2) equals ANALYSIS_DETAILS.startTime."""
        epoch = self._session["utc_epoch_ns"]
        stamp = _dt.datetime.fromtimestamp(epoch // 10**9, tz=_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        return (("utcEpochNs", "utcTime", "localTime", "systemClockNs"), [(epoch, stamp, stamp, self._window()[0])])

    def _export_meta(self, path: Path) -> List[Tuple[str, str]]:
        """EXPORT_META_DATA (2022.4) or META_DATA_EXPORT (2024.6+) rows, key spelling as nsys writes it."""
        product, schema, cksum = _PRODUCT[self.schema]
        major, minor, micro = schema.split(".")
        now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        head = [
            ("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"),
            ("EXPORT_PRODUCT_VERSION", product),
            ("EXPORT_PRODUCT_DATE", self.schema),
            ("EXPORT_SCHEMA_VERSION", schema),
            ("EXPORT_SCHEMA_VERSION_MAJOR", major),
            ("EXPORT_SCHEMA_VERSION_MINOR", minor),
            ("EXPORT_SCHEMA_VERSION_MICRO", micro),
            ("EXPORT_SCHEMA_VERSION_CKSUM", cksum),
            ("EXPORT_PLATFORM", "linux-desktop"),
            ("EXPORT_ARCH", "x64"),
        ]
        source = path.with_suffix(".nsys-rep")
        lazy = "true" if self.lazy else "false"
        if self.schema == "2022.4":
            # 2022.4 spells OUTPUT as "OUTUPT" (sic).
            return head + [
                ("EXPORT_TIME", "0.01"),
                ("EXPORT_TIME_UTC", now),
                ("EXPORT_TIME_LOCAL", now),
                ("EXPORT_HOST", "nsys-builder"),
                ("EXPORT_USER", ""),
                ("EXPORT_INPUT_FILE", source.name),
                ("EXPORT_OUTUPT_FILE", path.name),
                ("EXPORT_INPUT_PATH", str(source)),
                ("EXPORT_OUTUPT_PATH", str(path)),
                ("EXPORT_INPUT_PATH_ABS", str(source.absolute())),
                ("EXPORT_OUTUPT_PATH_ABS", str(path.absolute())),
                ("EXPORT_OVERWRITE", "true"),
                ("EXPORT_LAZY", lazy),
            ]
        rows = head + [
            ("EXPORT_TIME_UTC", now),
            ("EXPORT_TIME_LOCAL", now + " +0000 UTC"),
            ("EXPORT_HOST", "nsys-builder"),
            ("EXPORT_USER", ""),
        ]
        if self.schema == "2026.2":
            rows.append(("EXPORT_PARAM_EXPORT_TYPE", "SQLite"))
        rows += [
            ("EXPORT_PARAM_INPUT_FILE", source.name),
            ("EXPORT_PARAM_OUTPUT_FILE", path.name),
            ("EXPORT_PARAM_INPUT_PATH", str(source)),
            ("EXPORT_PARAM_OUTPUT_PATH", str(path)),
            ("EXPORT_PARAM_INPUT_PATH_ABS", str(source.absolute())),
            ("EXPORT_PARAM_OUTPUT_PATH_ABS", str(path.absolute())),
        ]
        if self.schema == "2026.2":
            rows.append(("EXPORT_PARAM_PROGRESS", "true"))
        rows += [("EXPORT_PARAM_OVERWRITE", "true"), ("EXPORT_PARAM_APPEND", "false"), ("EXPORT_PARAM_LAZY", lazy)]
        if self.schema == "2026.2":
            rows += [
                ("EXPORT_PARAM_USE_SHUFFLE", "true"),
                ("EXPORT_PARAM_INCLUDE_JSON", "false"),
                ("EXPORT_PARAM_INCLUDE_BLOBS", "false"),
            ]
        rows += [
            ("EXPORT_PARAM_TIME_NORMALIZE", "false"),
            ("EXPORT_PARAM_TIME_SHIFT", "0"),
            ("EXPORT_PARAM_TABLES_TO_EXPORT", ""),
            ("EXPORT_PARAM_TIMES_TO_EXPORT", ""),
            ("EXPORT_CONFIG_TIME_SHIFT", "0"),
            ("EXPORT_TIME", "0.01 sec"),
        ]
        return rows

    def _cuda_device_rows(self) -> List[Tuple[int, int, int]]:
        """TARGET_INFO_CUDA_DEVICE: one (gpuId, cudaId, pid) per process and device with GPU work.

        The builder uses the same number for gpuId, cudaId and the activities' deviceId.
        """
        pairs = set()
        for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
            pairs.update(self._tables[table].iter_rows(("globalPid", "deviceId")))
        return [(device, device, (gpid >> 24) & _TID_MASK) for gpid, device in sorted(pairs)]

    def _dlprof_system_info(self) -> List[Tuple[str, str]]:
        """SystemInfo rows of a DLProf-modified file: a few defaults plus system_info() rows."""
        gpus = self._tables["TARGET_INFO_GPU"]
        names = [row[0] for row in gpus.iter_rows(("name",))]
        defaults = [
            ("dlprof_version", "1.8.0"),
            ("nsys_version", _PRODUCT.get(self.schema, (self.schema,))[0]),
            ("gpu_count", str(len(names))),
        ] + [(f"gpu_{i}", name) for i, name in enumerate(names)]
        return defaults + self._system_info


def _default_capture_meta() -> List[Tuple[str, str]]:
    """A few META_DATA_CAPTURE rows every 2024.6+ capture has."""
    return [
        ("DEVICE_ID", "Local (CLI)"),
        ("CAPTURE_EVENT_TYPE", "NvtxEvents"),
        ("CAPTURE_EVENT_TYPE", "Cuda"),
        ("DEVICE_TYPE", "Unix"),
        ("CUDA_GRAPH_TRACE_OPTIONS:MODE", "Graph"),
    ]


def _create_table(con: sqlite3.Connection, table: str, columns: List[_Column]) -> None:
    """CREATE TABLE with the version's columns (no indexes, as nsys)."""
    body = ",\n    ".join(column.ddl for column in columns)
    con.execute(f"CREATE TABLE {table} (\n    {body}\n)")


def _insert_rows(con: sqlite3.Connection, table: str, columns: List[_Column], data: _Table) -> None:
    """executemany per chunk; constants inlined as literals, NULLs left out."""
    constants = _CONSTANTS.get(table, {})
    for bound, scalars, rows in data.chunks([c.name for c in columns if c.name in data.fields]):
        names, values = [], []
        for column in columns:
            if column.name in bound:
                # CAST(? AS TEXT) stores a bytes parameter (invalid UTF-8) as TEXT, not as a BLOB.
                values.append("CAST(? AS TEXT)" if column.is_text else "?")
            elif scalars.get(column.name) is not None:
                values.append(_sql_literal(scalars[column.name]))
            elif column.name in constants and column.name not in scalars:
                values.append(_sql_literal(constants[column.name]))
            else:
                continue  # NULL
            names.append(f'"{column.name}"')
        con.executemany(f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join(values)})", rows)
