"""The run's options: the names and defaults the command line offers, and `RunOptions`, the typed, immutable
record of one run's choices. The CLI builds it once from the parsed command line (cli.main.run_options), the
viewer's re-aggregation from its request (`RunOptions.reaggregation`); everything below the CLI (capture, run,
the rank workers it is pickled to) reads it and nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from dlprof_profiler import log
from dlprof_profiler.engine.analysis import AnalysisConfig

REPORT_NAMES = (
    "summary",
    "detail",
    "iteration",
    "kernel",
    "tensor",
    "op_type",
    "group_node",
    "expert_systems",
    "memory",
    "gpu_breakdown",
    "diff",
    "all",
)
FORMAT_NAMES = ("csv", "json")
MODES = ("simple", "nvtx", "pytorch", "tensorflow1", "tensorflow2", "tensorrt")
BACKENDS = ("nsys", "torch")
DEFAULT_REPORTS = ("summary", "detail", "expert_systems")
DEFAULT_FORMATS = ("csv",)
DEFAULT_BASE_NAME = "dlprof"
DEFAULT_NSYS_BASE_NAME = "nsys_profile"
# From this many events (NVTX ranges + CUDA API calls + GPU activities) an nsys export is analysed out of core:
# in memory a profile takes about 0.45 GB per 10^6 events, so larger ones would not stay under 4 GB
OUT_OF_CORE_EVENTS = 8_000_000


@dataclass(frozen=True)
class RunOptions:
    """One run's options, as `dlprof --help` describes them (defaults applied, lists as tuples)."""

    # what to analyse, and where the outputs go
    database: str | None = None
    command: tuple = ()
    output_path: str = "."
    base_name: str = DEFAULT_BASE_NAME
    profile_name: str = DEFAULT_BASE_NAME
    force: bool = False
    verbosity: int = log.INFO
    # the analysis
    mode: str | None = None
    key_node: str | None = None
    iter_start: int | None = None
    iter_stop: int | None = None
    domain: str | None = None
    baseline: str | None = None
    out_of_core: str = "auto"  # auto, on, off
    # the outputs
    reports: tuple = DEFAULT_REPORTS
    formats: tuple = DEFAULT_FORMATS
    dump_model_data: bool = False
    # multi-rank analysis
    scheduler: str | None = None
    workers: int | None = None
    # {staged export: the Nsight Systems report it stands for}, handed to the rank workers
    nsys_reports: dict = field(default_factory=dict)
    # a key node that a rank lacks fails the re-aggregation (the viewer's), rather than aggregating it whole
    require_key_node: bool = False
    # profiling
    backend: str | None = None
    capture_iterations: str | None = None
    nsys_opts: str = ""
    nsys_base_name: str = DEFAULT_NSYS_BASE_NAME
    delay: float | None = None
    duration: float | None = None
    nsys_profile_range: bool = False
    detailed_mode: bool = False
    pytorch_init: bool = True

    @classmethod
    def reaggregation(
        cls, key_node: str | None = None, iter_start: int | None = None, iter_stop: int | None = None
    ) -> "RunOptions":
        """The viewer's Reaggregate: a new aggregation appended in place, no reports written."""
        return cls(
            key_node=key_node or None,
            iter_start=iter_start,
            iter_stop=iter_stop,
            reports=(),
            formats=(),
            require_key_node=True,
        )

    def but(self, **changes) -> "RunOptions":
        """A copy with some options changed."""
        return replace(self, **changes)

    @property
    def baseline_path(self) -> Path | None:
        """The --baseline file, if one was given."""
        return Path(self.baseline) if self.baseline else None

    @property
    def database_path(self) -> Path:
        """The run's DLProf database."""
        return Path(self.output_path) / f"{self.base_name}_dldb.sqlite"

    def analysis_config(self) -> AnalysisConfig:
        """What the engine is asked."""
        return AnalysisConfig(
            mode=self.mode,
            key_node=self.key_node or None,
            iter_start=self.iter_start,
            iter_stop=self.iter_stop,
            domain=self.domain,
        )
