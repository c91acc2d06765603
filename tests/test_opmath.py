"""jobprof.plugin.opmath against ground truth, on the shapes and dtype strings a real profiled run records.

Every case runs the operator under torch's profiler (Kineto, ``record_shapes=True`` and
``with_flops=True``, as jobprof's capture does), takes the recorded shapes/dtypes of the
operator, and compares opmath's FLOPs, bytes and output shapes with numbers computed by hand
(and, where torch itself produces them, with the real output tensor's size and dtype).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from jobprof.plugin import opmath  # noqa: E402


def record(fn):
    """Run ``fn`` under the profiler; returns [(name, shapes, dtypes, kineto_flops)] of cpu ops."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                with_flops=True) as prof:
        fn()
    return [(e.name(), e.shapes(), e.dtypes(), e.flops()) for e in prof.profiler.kineto_results.events()
            if e.activity_type() == "cpu_op"]


def first(events, name):
    """The first recorded call of ``name`` (the top-level one: events come in start order)."""
    found = [e for e in events if e[0] == name]
    assert found, f"{name} not recorded; saw {[e[0] for e in events]}"
    return found[0]


def one(name, fn):
    """Record ``fn`` and return (name, shapes, dtypes, kineto flops) of its first ``name`` call."""
    return first(record(fn), name)


F32 = 4


# -- dtype spellings ---------------------------------------------------------------------------
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
          torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtype_table_matches_what_kineto_records(dtype):
    tensor = torch.zeros(3, dtype=dtype)
    _, shapes, dtypes, _ = one("aten::clone", tensor.clone)
    assert shapes[0] == [3]
    spelling = dtypes[0]
    assert opmath.DTYPE_BYTES[spelling] == tensor.element_size()
    assert opmath.TORCH_DTYPE[spelling] == str(dtype).removeprefix("torch.")
    read, written = opmath.bytes_moved("aten::clone", shapes, dtypes)
    assert read == written == 3 * tensor.element_size()


# -- the matmul family (exact) -----------------------------------------------------------------
def test_mm_flops_bytes_and_output_match_hand_count_and_kineto():
    a, b = torch.randn(64, 32), torch.randn(32, 16)
    name, shapes, dtypes, kineto = one("aten::mm", lambda: torch.mm(a, b))
    assert opmath.flops(name, shapes, dtypes) == 65_536 == 2 * 64 * 16 * 32
    assert kineto == 65_536  # Kineto's own estimate agrees
    assert opmath.bytes_moved(name, shapes, dtypes) == ((64 * 32 + 32 * 16) * F32, 64 * 16 * F32)
    assert opmath.output_meta(name, shapes, dtypes) == ([[64, 16]], ["float"])
    assert opmath.unit(name) == "cube"


def test_addmm_counts_the_product_only_like_kineto():
    bias, a, b = torch.randn(16), torch.randn(64, 32), torch.randn(32, 16)
    name, shapes, dtypes, kineto = one("aten::addmm", lambda: torch.addmm(bias, a, b))
    assert opmath.flops(name, shapes, dtypes) == 65_536 == kineto
    assert opmath.bytes_moved(name, shapes, dtypes) == ((16 + 64 * 32 + 32 * 16) * F32, 64 * 16 * F32)
    assert opmath.output_meta(name, shapes, dtypes) == ([[64, 16]], ["float"])


def test_bmm_and_baddbmm():
    a, b = torch.randn(4, 8, 16), torch.randn(4, 16, 2)
    name, shapes, dtypes, kineto = one("aten::bmm", lambda: torch.bmm(a, b))
    assert opmath.flops(name, shapes, dtypes) == 2 * 4 * 8 * 2 * 16 == 2048 == kineto
    assert opmath.output_meta(name, shapes, dtypes) == ([[4, 8, 2]], ["float"])
    c = torch.randn(4, 8, 2)
    name, shapes, dtypes, _ = one("aten::baddbmm", lambda: torch.baddbmm(c, a, b))
    assert opmath.flops(name, shapes, dtypes) == 2048
    assert opmath.bytes_moved(name, shapes, dtypes) == ((64 + 512 + 128) * F32, 64 * F32)


@pytest.mark.parametrize(("left", "right", "expected_flops", "out"), [
    ((2, 3, 8, 16), (16, 5), 2 * 6 * 8 * 5 * 16, [2, 3, 8, 5]),   # batched @ matrix
    ((5,), (2, 5, 3), 2 * 2 * 1 * 3 * 5, [2, 3]),                  # vector @ batched
    ((3, 5), (5,), 2 * 3 * 5, [3]),                                # matrix @ vector
    ((5,), (5,), 2 * 5, []),                                       # dot
    ((7, 1, 4, 6), (3, 6, 2), 2 * 21 * 4 * 2 * 6, [7, 3, 4, 2]),   # broadcast batch dims
])
def test_matmul_from_broadcast_shapes(left, right, expected_flops, out):
    a, b = torch.randn(*left), torch.randn(*right)
    result = torch.matmul(a, b)
    name, shapes, dtypes, _ = one("aten::matmul", lambda: torch.matmul(a, b))
    assert opmath.flops(name, shapes, dtypes) == expected_flops
    assert opmath.output_meta(name, shapes, dtypes) == ([list(result.shape)], ["float"])
    assert list(result.shape) == out


def test_linear_counts_leading_dims():
    x, w, bias = torch.randn(3, 7, 8), torch.randn(4, 8), torch.randn(4)
    name, shapes, dtypes, _ = one("aten::linear", lambda: torch.nn.functional.linear(x, w, bias))
    assert opmath.flops(name, shapes, dtypes) == 2 * 21 * 8 * 4 == 1344
    # ... the same as Kineto's count of the addmm linear runs inside
    assert first(record(lambda: torch.nn.functional.linear(x, w, bias)), "aten::addmm")[3] == 1344
    assert opmath.bytes_moved(name, shapes, dtypes) == ((3 * 7 * 8 + 32 + 4) * F32, 3 * 7 * 4 * F32)
    assert opmath.output_meta(name, shapes, dtypes) == ([[3, 7, 4]], ["float"])
    name, shapes, dtypes, _ = one("aten::linear", lambda: torch.nn.functional.linear(x, w))  # no bias
    assert opmath.flops(name, shapes, dtypes) == 1344
    assert opmath.bytes_moved(name, shapes, dtypes) == ((3 * 7 * 8 + 32) * F32, 3 * 7 * 4 * F32)


def test_bfloat16_matmul_bytes_use_two_byte_elements():
    a, b = torch.randn(8, 8, dtype=torch.bfloat16), torch.randn(8, 8, dtype=torch.bfloat16)
    name, shapes, dtypes, kineto = one("aten::mm", lambda: torch.mm(a, b))
    assert dtypes[:2] == ["c10::BFloat16", "c10::BFloat16"]
    assert opmath.flops(name, shapes, dtypes) == 1024 == kineto
    assert opmath.bytes_moved(name, shapes, dtypes) == (2 * 64 * 2, 64 * 2)


def test_convolution_flops_unknown_without_stride_and_padding():
    x, w = torch.randn(2, 3, 10, 10), torch.randn(6, 3, 3, 3)
    name, shapes, dtypes, kineto = one("aten::conv2d", lambda: torch.nn.functional.conv2d(x, w, stride=2,
                                                                                          padding=1))
    assert shapes[3:6] == [[], [], []]  # stride, padding, dilation: recorded without their values
    assert opmath.flops(name, shapes, dtypes) is None
    assert opmath.bytes_moved(name, shapes, dtypes) is None
    assert opmath.unit(name) == "cube"
    assert kineto == 2 * 2 * 6 * 5 * 5 * 3 * 3 * 3  # Kineto's estimate had the arguments


# -- elementwise -------------------------------------------------------------------------------
def test_elementwise_one_flop_per_output_element():
    a, b = torch.randn(4, 1), torch.randn(1, 5)
    name, shapes, dtypes, _ = one("aten::add", lambda: torch.add(a, b))
    assert opmath.flops(name, shapes, dtypes) == 20
    assert opmath.output_meta(name, shapes, dtypes) == ([[4, 5]], ["float"])
    assert opmath.bytes_moved(name, shapes, dtypes) == ((4 + 5) * F32, 20 * F32)
    assert opmath.unit(name) == "vector"
    x = torch.randn(10)
    # x * 2: Kineto records the Python number as a 0-dim 'long int' operand; the result is float
    name, shapes, dtypes, _ = one("aten::mul", lambda: x * 2)
    assert dtypes == ["float", "long int"]
    assert opmath.flops(name, shapes, dtypes) == 10
    assert opmath.output_meta(name, shapes, dtypes) == ([[10]], ["float"])
    t1, t2 = torch.randn(100), torch.randn(100)
    name, shapes, dtypes, _ = one("aten::addcmul", lambda: torch.addcmul(x.new_zeros(100), t1, t2))
    assert opmath.flops(name, shapes, dtypes) == 200


def test_in_place_and_out_variants():
    x, y = torch.randn(10), torch.randn(10)
    name, shapes, dtypes, _ = one("aten::add_", lambda: x.add_(y))
    assert opmath.flops(name, shapes, dtypes) == 10
    assert opmath.bytes_moved(name, shapes, dtypes) == (20 * F32, 10 * F32)  # reads self and y
    assert opmath.output_meta(name, shapes, dtypes) == ([[10]], ["float"])
    out = torch.empty(10)
    name, shapes, dtypes, _ = one("aten::add", lambda: torch.add(x, y, out=out))
    assert len(shapes) == 4  # self, other, alpha, out
    assert opmath.bytes_moved(name, shapes, dtypes) == (20 * F32, 10 * F32)  # out is written, not read
    assert opmath.flops(name, shapes, dtypes) == 10


def test_mixed_dtypes_and_comparisons():
    f, d = torch.randn(10), torch.randn(10, dtype=torch.float64)
    name, shapes, dtypes, _ = one("aten::add", lambda: f + d)
    assert opmath.output_meta(name, shapes, dtypes) is None  # the promotion rule does not guess
    assert opmath.bytes_moved(name, shapes, dtypes) is None
    name, shapes, dtypes, _ = one("aten::gt", lambda: f > 0)
    assert opmath.output_meta(name, shapes, dtypes) == ([[10]], ["bool"])
    assert dtypes == ["float", "Scalar"]  # gt.Scalar: the number is an argument, not a tensor
    assert opmath.bytes_moved(name, shapes, dtypes) == (10 * F32, 10)
    ints = torch.arange(10)
    name, shapes, dtypes, _ = one("aten::div", lambda: ints / torch.arange(1, 11))
    assert opmath.output_meta(name, shapes, dtypes) is None  # integer true division gives float


def test_full_reductions():
    x = torch.randn(100)
    name, shapes, dtypes, _ = one("aten::sum", lambda: x.sum())
    assert opmath.output_meta(name, shapes, dtypes) == ([[]], ["float"])
    assert opmath.flops(name, shapes, dtypes) == 99
    assert opmath.bytes_moved(name, shapes, dtypes) == (400, 4)
    name, shapes, dtypes, _ = one("aten::sum", lambda: torch.arange(5).sum())
    assert opmath.output_meta(name, shapes, dtypes) == ([[]], ["long int"])
    name, shapes, dtypes, _ = one("aten::sum", lambda: x.sum(0))
    assert opmath.output_meta(name, shapes, dtypes) is None  # with dim: output not derived


# -- data movement -----------------------------------------------------------------------------
def test_copy_reads_src_and_writes_self():
    dst, src = torch.empty(1000, 1000), torch.randn(1000, 1000)
    name, shapes, dtypes, _ = one("aten::copy_", lambda: dst.copy_(src))
    assert opmath.bytes_moved(name, shapes, dtypes) == (4_000_000, 4_000_000)
    assert opmath.flops(name, shapes, dtypes) == 0
    assert opmath.unit(name) == "copy"
    half = torch.empty(1000, 1000, dtype=torch.float16)
    name, shapes, dtypes, _ = one("aten::copy_", lambda: half.copy_(src))
    assert opmath.bytes_moved(name, shapes, dtypes) == (4_000_000, 2_000_000)


def test_fill_and_zero_write_only():
    t = torch.empty(1000, 1000)
    name, shapes, dtypes, _ = one("aten::fill_", lambda: t.fill_(1.5))
    assert opmath.bytes_moved(name, shapes, dtypes) == (0, 4_000_000)
    assert opmath.output_meta(name, shapes, dtypes) == ([[1000, 1000]], ["float"])
    name, shapes, dtypes, _ = one("aten::zero_", t.zero_)
    assert opmath.bytes_moved(name, shapes, dtypes) == (0, 4_000_000)


def test_views_move_nothing_and_partial_writes_are_unknown():
    t = torch.randn(6, 4)
    name, shapes, dtypes, _ = one("aten::view", lambda: t.view(4, 6))
    assert opmath.bytes_moved(name, shapes, dtypes) == (0, 0)
    assert opmath.flops(name, shapes, dtypes) == 0
    name, shapes, dtypes, _ = one("aten::t", t.t)
    assert opmath.output_meta(name, shapes, dtypes) == ([[4, 6]], ["float"])
    index = torch.tensor([0, 2])
    name, shapes, dtypes, _ = one("aten::index_fill_", lambda: t.index_fill_(0, index, 0.0))
    assert opmath.bytes_moved(name, shapes, dtypes) is None
    name, shapes, dtypes, _ = one("aten::cat", lambda: torch.cat([t, t]))
    assert dtypes[0] == "TensorList"
    assert opmath.bytes_moved(name, shapes, dtypes) is None


def test_unknown_operators_are_none():
    t = torch.randn(10)
    name, shapes, dtypes, _ = one("aten::relu", lambda: torch.relu(t))
    assert opmath.flops(name, shapes, dtypes) is None  # activations: no agreed FLOP count
    assert opmath.output_meta(name, shapes, dtypes) == ([[10]], ["float"])
    assert opmath.unit(name) == "vector"
    assert opmath.flops("aten::no_such_op", [[10]], ["float"]) is None
    assert opmath.bytes_moved("aten::no_such_op", [[10]], ["float"]) is None
    assert opmath.output_meta("mylib::mm", [[2, 2], [2, 2]], ["float", "float"]) is None
    assert opmath.flops("mylib::mm", [[2, 2], [2, 2]], ["float", "float"]) is None
    assert opmath.unit("mylib::mm") == "other"


def test_repeated_calls_share_results_without_confusing_operators():
    a, b = [[64, 32], [32, 16]], ["float", "float"]
    assert opmath.flops("aten::mm", a, b) == 65_536
    # the same list objects under another name must not return the cached result
    assert opmath.flops("aten::matmul", a, b) == 65_536
    assert opmath.flops("aten::bmm", a, b) is None
    assert opmath.flops("aten::mm", [[64, 32], [32, 8]], b) == 32_768
