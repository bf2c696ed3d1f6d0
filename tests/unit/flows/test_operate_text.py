"""The late-release alert states its window as a person reads it (seen in the browser check: 0:00:12 read oddly)."""

from datetime import timedelta

import pytest

from flows.operate import span


@pytest.mark.parametrize("window, text", [(timedelta(seconds=12), "12 s"), (timedelta(minutes=45), "45 min"),
                                          (timedelta(hours=2, minutes=30), "2 h 30 min"), (timedelta(hours=3), "3 h"),
                                          (timedelta(seconds=150), "2 min 30 s")])
def test_a_window_reads_as_a_person_writes_it(window, text):
    assert span(window) == text
