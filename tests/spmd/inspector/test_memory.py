"""XLA's buffer assignment read into per-device memory."""

import pytest

from spmd.inspector.memory import MemoryUsage

# The buffer assignment XLA wrote for x[64,32] P(None,'x') @ w[32,16] P('x',None) on 8 CPU devices.
BUFFER_ASSIGNMENT = """\
BufferAssignment:
allocation 0: size 4096, maybe-live-out:
 value: <6 all-reduce @0> (size=4096,offset=0): f32[64,16]{1,0}
allocation 1: size 1024, parameter 1, shape |f32[64,4]| at ShapeIndex {}:
 value: <3 param @0> (size=1024,offset=0): f32[64,4]{1,0}
allocation 2: size 256, parameter 0, shape |f32[4,16]| at ShapeIndex {}:
 value: <4 param.1 @0> (size=256,offset=0): f32[4,16]{1,0}
allocation 3: size 8, output shape is |(f32[64,16])|, maybe-live-out:
 value: <7 tuple{} @0> (size=8,offset=0): (f32[64,16]{1,0})
allocation 4: size 4, thread-local:
 value: <2 add.1 @0> (size=4,offset=0): f32[]
allocation 5: size 4, thread-local:
 value: <0 x.1 @0> (size=4,offset=0): f32[]
allocation 6: size 4, thread-local:
 value: <1 y.1 @0> (size=4,offset=0): f32[]
allocation 7: size 4096, preallocated-temp:
 value: <5 dot @0> (size=4096,offset=0): f32[64,16]{1,0}

Total bytes used: 9492 (9.3KiB)
"""


def test_parse_buffer_assignment():
    m = MemoryUsage.parse(BUFFER_ASSIGNMENT)
    assert m.peak_bytes == 9492
    assert m.argument_bytes == 1024 + 256
    assert m.output_bytes == 4096 + 8
    assert m.alias_bytes == 0
    assert m.temp_bytes == 4096
    assert len(m.allocations) == 8
    assert m.allocations[1].parameter == 1


def test_donated_parameter_counts_once_as_argument():
    text = (
        "allocation 0: size 64, parameter 0, shape |f32[16]| at ShapeIndex {}, maybe-live-out:\nTotal bytes used: 64\n"
    )
    m = MemoryUsage.parse(text)
    assert (m.argument_bytes, m.alias_bytes, m.output_bytes) == (64, 64, 0)


def test_not_a_buffer_assignment():
    with pytest.raises(ValueError, match="not an XLA buffer assignment"):
        MemoryUsage.parse("Total bytes used: 3 (3B)\n")
    with pytest.raises(TypeError, match="takes the dump's text \\(a str\\), got NoneType"):
        MemoryUsage.parse(None)  # was AttributeError from inside the parser
