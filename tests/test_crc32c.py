"""CRC-32C of TensorBoard's event records (crc32c.py) against TensorBoard's own byte-at-a-time implementation
and the check value of the standard, for sizes around the block and small-data thresholds."""

import os

import pytest
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c as reference_crc
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as reference_masked

from dlprof_profiler.outputs.crc32c import SMALL, crc32c, masked_crc32c


def test_check_value_of_the_standard():
    assert crc32c(b"123456789") == 0xE3069283  # CRC-32C check value (RFC 3720, iSCSI)
    assert crc32c(b"") == 0


@pytest.mark.slow
@pytest.mark.parametrize("size", [1, 3, 4, 5, 100, SMALL - 1, SMALL, SMALL + 1, 20_000, 99_999, 1 << 20, 3_000_007])
def test_equals_tensorboards_crc(size):
    data = os.urandom(size)
    assert crc32c(data) == reference_crc(data)
    assert masked_crc32c(data) == reference_masked(data)


def test_zero_bytes_and_repeated_patterns():
    """Leading zero bytes change a CRC (its initial value is not 0): the block padding must not hide them."""
    for data in (b"\0" * 70_000, b"\0" * 69_999 + b"\1", b"ab" * 50_000):
        assert crc32c(data) == reference_crc(data)
