"""ui's formatting: sizes as people read them."""

from runner.ui import human_bytes


def test_sizes_use_decimal_units_up_to_terabytes() -> None:
    assert human_bytes(5) == "5 B"
    assert human_bytes(98_362_432) == "98.4 MB"
    assert human_bytes(713 * 10**9) == "713.0 GB"
    assert human_bytes(2_304_000 * 10**9) == "2304.0 TB"  # a fit at an absurd context: not 2304000.0 GB
