"""Real profiler outputs copied from ../shared/fixtures (attribution in README.md here); never written to."""

from pathlib import Path

DATA = Path(__file__).resolve().parent
NSYS = DATA / "nsys"
KINETO = DATA / "kineto"
KINETO_MALFORMED = DATA / "kineto_malformed"
