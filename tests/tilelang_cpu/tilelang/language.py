"""The subset of `tilelang.language` that cleave's TileLang backend writes, executed on the CPU.

Semantics follow TileLang's where the generated code depends on them, and are strict where a
GPU would be silently wrong:

- A global tensor read outside its shape gives 0 and a store outside it is dropped, as
  TileLang's safe-memory-access pass makes them; any other index past a shared tile or a
  fragment is an error, because on a GPU it reads or overwrites a neighbour.
- Shared tiles and fragments start as NaN, so a value read before it is written shows.
- Every store rounds to the buffer's element type; arithmetic between stores is in f64, which
  is what an oracle of the program's logic (not of its rounding) needs.
- `T.copy` needs both sides to have the same shape once unit axes are dropped, and `T.gemm`
  and the reductions check their operands' shapes.

`run.py` rewrites `with T.Kernel(...)` into a loop over the grid, `T.if_then_else` into a
conditional that evaluates one branch, and `/` into IEEE division before executing a module.
"""

import itertools
import math
import operator
import struct

# Values of the `T.symbolic` dims, set by the runner before a module is executed.
DIMS = {}

_F32_MAX = 3.4028234663852886e38


def _round_f32(x):
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        # Past the largest f32: values within half an ulp of it round down, others overflow.
        return math.copysign(_F32_MAX if abs(x) < 3.4028235677973366e38 else math.inf, x)


def _round_f16(x):
    try:
        return struct.unpack("e", struct.pack("e", x))[0]
    except OverflowError:
        return math.copysign(65504.0 if abs(x) < 65520.0 else math.inf, x)


def _round_bf16(x):
    x = _round_f32(x)
    if math.isnan(x) or math.isinf(x):
        return x
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


_ROUND = {"float32": _round_f32, "float16": _round_f16, "bfloat16": _round_bf16, "int32": lambda x: x}


class ShimError(Exception):
    """A construct that is wrong on a GPU (an index past a tile, mismatched shapes)."""


class Buffer:
    """A global tensor (`scope` "global") or a block's shared tile or fragment."""

    def __init__(self, name, shape, dtype, scope, data=None):
        self.name = name
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.scope = scope
        self.round = _ROUND[dtype]
        n = 1
        for s in self.shape:
            n *= s
        self.data = list(data) if data is not None else [math.nan] * n
        if len(self.data) != n:
            raise ShimError(f"{name}: {len(self.data)} values for shape {self.shape}")
        self.strides = []
        acc = 1
        for s in reversed(self.shape):
            self.strides.append(acc)
            acc *= s
        self.strides.reverse()

    def _offset(self, idx):
        """The flat offset of `idx`, or None when it lies outside the shape."""
        if type(idx) is not tuple:
            idx = (idx,)
        if len(idx) != len(self.shape):
            raise ShimError(f"{self.name}: {len(idx)} indices for shape {self.shape}")
        off = 0
        for i, s, st in zip(idx, self.shape, self.strides):
            if not 0 <= i < s:
                return None
            off += i * st
        return int(off)

    def read(self, idx):
        off = self._offset(idx)
        if off is None:
            if self.scope == "global":
                return 0.0
            raise ShimError(f"read of {self.scope} {self.name}{self.shape} at {idx}")
        return self.data[off]

    def write(self, idx, value):
        off = self._offset(idx)
        if off is None:
            if self.scope == "global":
                return
            raise ShimError(f"write of {self.scope} {self.name}{self.shape} at {idx}")
        self.data[off] = self.round(float(value))

    # The element loops index buffers millions of times; a two-index read or write of a 2-D
    # buffer inside its shape skips the general path.
    def __getitem__(self, idx):
        if type(idx) is tuple:
            if len(idx) == 2 and len(self.shape) == 2:
                i, j = idx
                if type(i) is int and type(j) is int:
                    rows, cols = self.shape
                    if 0 <= i < rows and 0 <= j < cols:
                        return self.data[i * cols + j]
                    return self.read(idx)
            for x in idx:
                if type(x) is slice:
                    return Region(self, idx)
        elif type(idx) is slice:
            return Region(self, (idx,))
        return self.read(idx)

    def __setitem__(self, idx, value):
        if type(idx) is tuple and len(idx) == 2 and len(self.shape) == 2:
            i, j = idx
            rows, cols = self.shape
            if type(i) is int and type(j) is int and 0 <= i < rows and 0 <= j < cols:
                self.data[i * cols + j] = self.round(float(value))
                return
        self.write(idx, value)

    def elements(self):
        """Every index of the buffer in row-major order, with unit axes dropped from the shape."""
        shape = [s for s in self.shape if s != 1]
        return shape, [tuple(ix) for ix in itertools.product(*[range(s) for s in self.shape])]


class Region:
    """`tensor[a:a + 16, j, b:b + 64]`: a box of a buffer, as `T.copy` takes it."""

    def __init__(self, buf, index):
        if len(index) != len(buf.shape):
            raise ShimError(f"{buf.name}: a region of {len(index)} axes for shape {buf.shape}")
        self.buf = buf
        self.ranges = []
        for i in index:
            if isinstance(i, slice):
                if i.step not in (None, 1):
                    raise ShimError(f"{buf.name}: a strided region")
                lo, hi = int(i.start), int(i.stop)
                self.ranges.append(range(lo, hi))
            else:
                self.ranges.append(range(int(i), int(i) + 1))

    def elements(self):
        shape = [len(r) for r in self.ranges if len(r) != 1]
        return shape, [tuple(ix) for ix in itertools.product(*self.ranges)]

    def read(self, idx):
        return self.buf.read(idx)

    def write(self, idx, value):
        self.buf.write(idx, value)


def _target(x):
    return x.buf if isinstance(x, Region) else x


def copy(src, dst, **_):
    s_shape, s_idx = src.elements()
    d_shape, d_idx = dst.elements()
    if s_shape != d_shape:
        raise ShimError(
            f"T.copy from {_target(src).name} {s_shape} to {_target(dst).name} {d_shape}: shapes differ"
        )
    for a, b in zip(s_idx, d_idx):
        dst.write(b, src.read(a))


def gemm(a, b, c, transpose_A=False, transpose_B=False, clear_accum=False, policy=None, **_):
    """`c (+)= op(a) @ op(b)`, each dot product summed in f64."""
    (ar, ac), (br, bc), (m, n) = a.shape, b.shape, c.shape
    am, ak = (ac, ar) if transpose_A else (ar, ac)
    bk, bn = (bc, br) if transpose_B else (br, bc)
    if ak != bk or am != m or bn != n:
        raise ShimError(f"T.gemm of {a.name}{a.shape} and {b.name}{b.shape} into {c.name}{c.shape}")
    rows = [[a.data[(k * ac + i) if transpose_A else (i * ac + k)] for k in range(ak)] for i in range(m)]
    cols = [[b.data[(j * bc + k) if transpose_B else (k * bc + j)] for k in range(ak)] for j in range(n)]
    for i in range(m):
        row = rows[i]
        for j in range(n):
            acc = sum(map(operator.mul, row, cols[j]))
            if not clear_accum:
                acc += c.data[i * n + j]
            c.data[i * n + j] = c.round(acc)


def _reduce(src, dst, dim, clear, f, init):
    if len(src.shape) != 2 or dim != 1:
        raise ShimError(f"a reduction along axis {dim} of {src.name}{src.shape}")
    rows, cols = src.shape
    if dst.shape != (rows,):
        raise ShimError(f"a reduction of {src.name}{src.shape} into {dst.name}{dst.shape}")
    for i in range(rows):
        acc = init if clear else dst.data[i]
        for j in range(cols):
            acc = f(acc, src.data[i * cols + j])
        dst.data[i] = dst.round(acc)


def reduce_max(src, dst, dim=1, clear=True):
    _reduce(src, dst, dim, clear, max, -math.inf)


def reduce_sum(src, dst, dim=1, clear=True):
    _reduce(src, dst, dim, clear, lambda a, b: a + b, 0.0)


def symbolic(name):
    if name not in DIMS:
        raise ShimError(f"no extent for the symbolic dim {name}")
    return DIMS[name]


def Tensor(shape, dtype):
    return (shape, dtype)


def prim_func(f):
    return f


def Kernel(*grid, threads=None):
    """The grid's blocks, one after another (the runner turns `with` into `for`)."""
    if threads is None or threads % 32 != 0:
        raise ShimError(f"a block of {threads} threads")
    return itertools.product(*[range(int(g)) for g in grid])


def Parallel(*extents):
    if len(extents) == 1:
        return range(int(extents[0]))
    return itertools.product(*[range(int(e)) for e in extents])


def Pipelined(n, num_stages=None, **_):
    return range(int(n))


def serial(n):
    return range(int(n))


def alloc_shared(shape, dtype, name="shared"):
    return Buffer(name, shape, dtype, "shared")


def alloc_fragment(shape, dtype, name="fragment"):
    return Buffer(name, shape, dtype, "fragment")


class GemmWarpPolicy:
    FullRow = "FullRow"
    FullCol = "FullCol"
    Square = "Square"


def ceildiv(a, b):
    return -(-int(a) // int(b))


def infinity(dtype):
    return math.inf


def cast(x, dtype):
    return _ROUND[dtype](float(x))


def div(a, b):
    """IEEE division: Python raises where a GPU gives an infinity or a NaN."""
    try:
        return a / b
    except ZeroDivisionError:
        if math.isnan(a) or a == 0:
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)


def exp(x):
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def exp2(x):
    try:
        return 2.0 ** x
    except OverflowError:
        return math.inf


def log(x):
    if x < 0 or math.isnan(x):
        return math.nan
    return -math.inf if x == 0 else math.log(x)


def sqrt(x):
    return math.nan if x < 0 or math.isnan(x) else math.sqrt(x)


def rsqrt(x):
    if x == 0:
        return math.copysign(math.inf, x)
    return math.nan if x < 0 or math.isnan(x) else 1.0 / math.sqrt(x)


def erf(x):
    return math.erf(x)


def max(a, b):  # noqa: A001 (TileLang's name)
    if math.isnan(a) or math.isnan(b):
        return b if math.isnan(a) else a
    return a if a >= b else b
