"""The real run's allocator timeline (tests/allocator_timeline.py), on hand-made events: the
dry-run tests trust its peaks, so its accounting is held here to what each case must give."""

from tests.allocator_timeline import Event, step_peaks


def _run(*changes: tuple[int, int, bool]) -> list[Event]:
    """Events from (bytes, address, staging) changes, each carrying the count they lead to;
    (0, 0, False) is a step boundary. A change of 0 bytes at an address is a free no event
    reports of the block there (it shows only in the next event's count)."""
    count, held, out = 1000, {}, []
    for size, ptr, staging in changes:
        if (size, ptr) == (0, 0):
            out.append(Event(0, 0, count, mark=True))
        elif size == 0:
            count -= held.pop(ptr)  # freed on a thread the profiler does not follow
        else:
            count += size
            if size > 0:
                held[ptr] = size
            else:
                held.pop(ptr)
            out.append(Event(size, ptr, count, staging))
    return out


MARK = (0, 0, False)


def test_peak_is_the_count_not_the_sum_of_the_reported_events():
    # A block freed where no event reports it: summing the events would hold it to the end.
    events = _run(MARK, (500, 1, False), (0, 1, False), (300, 2, False), (-300, 2, False), MARK)
    (step,) = step_peaks(events, held_at_start=0, steps=1)
    assert step.allocator_peak_bytes == 500  # not 800


def test_gloo_staging_is_counted_apart():
    events = _run(MARK, (400, 1, False), (200, 2, True), (-200, 2, True), (-400, 1, False), MARK)
    (step,) = step_peaks(events, held_at_start=50, steps=1)
    assert (step.allocator_peak_bytes, step.staging_at_peak_bytes) == (650, 200)
    assert (step.peak_without_staging_bytes, step.staging_max_bytes) == (450, 200)


def test_a_staging_copy_freed_unreported_is_released_where_the_count_drops():
    # A reduce-scatter's clone (staging, 200) freed by gloo's worker: no event; the count shows it.
    events = _run(MARK, (200, 9, True), (0, 9, False), (300, 1, False), (-300, 1, False), MARK)
    (step,) = step_peaks(events, held_at_start=0, steps=1)
    assert step.peak_without_staging_bytes == 300  # the clone is gone when the 300 come
    assert step.staging_at_peak_bytes == 0 and step.released_by_gloo_at_peak_bytes == 0


def test_a_tensor_gloo_frees_late_is_named_at_the_peak():
    # 400 (a gathered buffer) outlives its user: gloo's worker frees it after the next 300 came.
    events = _run(MARK, (400, 1, False), (300, 2, False), (0, 1, False), (-300, 2, False), MARK)
    (step,) = step_peaks(events, held_at_start=0, steps=1)
    assert step.peak_without_staging_bytes == 700
    assert step.released_by_gloo_at_peak_bytes == 400


def test_what_is_still_held_at_the_end_is_not_gloos():
    # Parameters and optimizer state outlive the profile: no free, and none is owed.
    events = _run(MARK, (400, 1, False), (300, 2, False), (-300, 2, False), MARK)
    (step,) = step_peaks(events, held_at_start=0, steps=1)
    assert (step.peak_without_staging_bytes, step.released_by_gloo_at_peak_bytes) == (700, 0)


def test_steps_split_at_boundaries_and_an_unfinished_last_step_is_kept():
    events = _run(MARK, (100, 1, False), (-100, 1, False), MARK, (250, 2, False))
    first, second = step_peaks(events, held_at_start=10, steps=2)
    assert first.allocator_peak_bytes == 110 and second.allocator_peak_bytes == 260
