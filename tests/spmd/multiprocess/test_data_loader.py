"""ProcessSampler (spmd.multiprocess): every row once per epoch across processes, the same global
batches for any process count, and a saved position that resumes exactly."""

import json

import numpy as np
import pytest

from mesh import Mesh
from spmd import DataPosition, DataPositionError, IndivisibleBatchError, P, ProcessDataError, ProcessSampler
from spmd.errors import SpmdTypeError
from spmd.multiprocess._process_layout import ProcessLayout
from spmd.sharding._named_sharding import hlo_sharding_for

MESH = Mesh(np.arange(8), (8,), ("data",))


def samplers(processes, size=100, batch=16, **kw):
    """One sampler per process of a job whose processes split the 8 devices evenly."""
    per = 8 // processes
    out = []
    for p in range(processes):
        layout = ProcessLayout(hlo_sharding_for(MESH, P("data"), 1), 1, tuple(d // per for d in range(8)), p, "test")
        out.append(ProcessSampler(size, batch, lambda n, layout=layout: layout.rows(0, n), **kw))
    return out


def epoch(sampler):
    return list(sampler)


def test_every_row_is_loaded_once_per_epoch_across_processes():
    four = samplers(4, size=96, batch=16)
    loaded = [i for s in four for batch in epoch(s) for i in batch]
    assert sorted(loaded) == list(range(96))
    second = [i for s in four for batch in epoch(s) for i in batch]
    assert sorted(second) == list(range(96)) and second != loaded  # a new order each epoch


def test_global_batches_do_not_depend_on_the_process_count():
    (one,) = samplers(1, seed=3)
    four = samplers(4, seed=3)
    eight = samplers(8, seed=3)
    for whole, *parts in zip(epoch(one), *[epoch(s) for s in four]):
        assert whole == [i for part in parts for i in part]  # process p holds rows [4p, 4p + 4) of the batch
    assert [sum(b, []) for b in zip(*[epoch(s) for s in eight])] == epoch(samplers(1, seed=3)[0])


def test_the_order_is_fixed_by_the_seed():
    assert epoch(samplers(1, seed=1)[0]) == epoch(samplers(1, seed=1)[0])
    assert epoch(samplers(1, seed=1)[0]) != epoch(samplers(1, seed=2)[0])
    plain = ProcessSampler(10, 5, shuffle=False)
    assert list(plain) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


def test_a_saved_position_resumes_exactly_even_with_another_process_count():
    (reference,) = samplers(1, seed=5)
    expected = epoch(reference) + epoch(reference)
    four = samplers(4, seed=5)
    seen = []
    iterators = [iter(s) for s in four]
    for _ in range(4):  # four batches, then "crash"
        seen.append(sum((next(it) for it in iterators), []))
    saved = json.loads(json.dumps(four[0].state_dict()))  # through JSON, as in a checkpoint's extra
    assert saved == {
        "epoch": 0,
        "batch": 4,
        "seed": 5,
        "dataset_size": 100,
        "global_batch": 16,
        "shuffle": True,
        "drop_last": True,
    }
    (resumed,) = samplers(1, seed=5)  # resumed on one process
    resumed.load_state_dict(saved)
    seen += epoch(resumed) + epoch(resumed)
    assert seen == expected
    assert resumed.position == DataPosition(2, 0, 5, 100, 16, True, True)


def test_a_position_for_other_data_is_refused():
    (sampler,) = samplers(1, seed=5)
    other = samplers(1, seed=6)[0].state_dict()
    with pytest.raises(DataPositionError, match=r"has seed=6, this sampler 5: it would load other batches"):
        sampler.load_state_dict(other)
    with pytest.raises(DataPositionError, match=r"is a dict with keys"):
        sampler.load_state_dict({"epoch": 1})
    with pytest.raises(DataPositionError, match=r"field 'batch' is '3', not an int: .* Save it again from the sampl"):
        sampler.load_state_dict(dict(other, seed=5, batch="3"))
    with pytest.raises(DataPositionError, match=r"batch 99 is outside 0..6 .* Load the position the sampler saved"):
        sampler.load_state_dict(dict(other, seed=5, batch=99))
    with pytest.raises(DataPositionError, match=r"field 'epoch' is -1, below 0: .* Save it again from the sampler"):
        sampler.load_state_dict(dict(other, seed=5, epoch=-1))  # numpy's generator raised its own ValueError


def test_the_last_short_batch_and_batches_that_do_not_split():
    (one,) = samplers(1, size=40, batch=16, drop_last=False, shuffle=False)
    assert [len(b) for b in epoch(one)] == [16, 16, 8]
    assert len(one) == 3
    with pytest.raises(
        IndivisibleBatchError, match=r"4 entries along dim 0 \(the batch, for dim 0\) do not split into 8 equal blocks"
    ):
        samplers(4, size=36, batch=16, drop_last=False)  # the last batch, 4 rows, cannot feed 8 devices
    with pytest.raises(
        IndivisibleBatchError, match=r"12 entries along dim 0 \(the batch, for dim 0\) do not split into 8"
    ):
        samplers(2, batch=12)
    with pytest.raises(ProcessDataError, match=r"global_batch 16 is larger than the dataset \(10 rows\)"):
        ProcessSampler(10, 16)
    with pytest.raises(ProcessDataError, match=r"global_batch must be an int >= 1, got 0"):
        ProcessSampler(10, 0)


@pytest.mark.parametrize("flag", ["shuffle", "drop_last"])
@pytest.mark.parametrize("value", ["no", "False", 1, None])
def test_a_flag_takes_a_bool_not_a_truthy_string(flag, value):
    from spmd import SpmdTypeError

    with pytest.raises(SpmdTypeError, match=f"{flag} takes True or False, got {value!r}"):
        ProcessSampler(100, 16, **{flag: value})


@pytest.mark.parametrize("name, value", [("dataset_size", 10.0), ("global_batch", -4), ("seed", 1.5)])
def test_counts_are_whole_numbers(name, value):
    args = {"dataset_size": 100, "global_batch": 16, "seed": 0, name: value}
    with pytest.raises(ProcessDataError, match=f"{name} must be an int >= "):
        ProcessSampler(args["dataset_size"], args["global_batch"], seed=args["seed"])


def test_numpy_counts_are_ints():
    assert len(ProcessSampler(np.int64(100), np.int32(16), seed=np.int64(3))) == 6


GOOD_POSITION = dict(epoch=0, batch=0, seed=0, dataset_size=64, global_batch=8, shuffle=True, drop_last=True)


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("epoch", -1, DataPositionError),
        ("batch", 1.5, SpmdTypeError),
        ("seed", "3", SpmdTypeError),
        ("dataset_size", 0, DataPositionError),
        ("global_batch", True, SpmdTypeError),
        ("global_batch", float("nan"), SpmdTypeError),
        ("shuffle", "no", SpmdTypeError),
        ("drop_last", 1, SpmdTypeError),
    ],
)
def test_a_data_position_checks_its_fields_when_built(field, value, error):
    """DataPosition(...) took any value (shuffle='no' read as True; a negative epoch failed inside
    numpy's generator at the next epoch); from_dict checked, the constructor did not."""
    with pytest.raises(error, match=f"DataPosition.{field} must be"):
        DataPosition(**{**GOOD_POSITION, field: value})
    assert DataPosition(**{**GOOD_POSITION, "seed": np.int64(3)}).seed == 3
