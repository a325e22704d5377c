#!/usr/bin/env python3
"""Checks Cleave's kernels against PyTorch and times them against PyTorch baselines.

Runs on the GPU machine after `cleave-gpu-bench` (see README.md beside this file):

- Correctness: reads the bench's manifest.json and raw files (inputs and Cleave's outputs at odd
  extents), evaluates each kernel's declared body in float64 with torch on the GPU, and reports
  the largest relative error with the metric of `cleave_core::reference::max_rel_err`:
  |got - ref| / max(|ref|, 0.1 * rms(ref)), the maximum over all elements; a NaN or infinity in
  the output makes it infinite.
- Timing: for every case of the bench's timings.json, times the baselines on fresh random inputs
  of the same shapes, with the same procedure the bench used for Cleave (CUDA events, warm-up,
  median; cold or warm L2 as the bench did): SDPA with the flash backend forced for attention,
  the declared body in eager PyTorch, torch.compile of that function, and cuBLAS
  (torch.matmul) for kernels made only of matmuls.
- Writes results.md (one Markdown table) and results.json into --out, after every phase, so an
  interrupted run still leaves what was measured.

The declared body is evaluated by translating the declaration language (DESIGN.md section 7.1)
into straight-line Python: torch calls for the reference and the baselines, or calls into a
small pure-Python tensor for `--self-test`, which runs without torch and checks this script
against Cleave's own f64 reference (`cleave-gpu-bench --backend host --reference`).
"""

import argparse
import json
import linecache
import math
import operator
import os
import struct
import sys
import time
import traceback

# --------------------------------------------------------------------------------------------
# The declaration language: lexer and parser (the grammar of cleave-core/src/front/expr.rs).
# --------------------------------------------------------------------------------------------

UNARY = ("exp", "log", "sqrt", "rsqrt", "square", "recip", "silu", "sigmoid", "gelu")
REDUCTIONS = ("sum", "mean", "max")
RMSNORM_EPS = 1e-5


class DeclError(Exception):
    """A body this script cannot read: reported for that kernel, never fatal."""


def lex(text):
    toks = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r":
            i += 1
        elif c in "\n;":
            toks.append(("end", None))
            i += 1
        elif c == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif c in "+-*/(),=":
            toks.append((c, None))
            i += 1
        elif c.isdigit() or c == ".":
            j = i
            while j < n and (text[j].isdigit() or text[j] == "."):
                j += 1
            if j < n and text[j] in "eE":
                k = j + 1
                if k < n and text[k] in "+-":
                    k += 1
                if k < n and text[k].isdigit():
                    j = k
                    while j < n and text[j].isdigit():
                        j += 1
            try:
                toks.append(("num", float(text[i:j])))
            except ValueError:
                raise DeclError("malformed number %r" % text[i:j])
            i = j
        elif c.isalpha() or c == "_":
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            toks.append(("name", text[i:j]))
            i = j
        else:
            raise DeclError("unexpected character %r" % c)
    toks.append(("eof", None))
    return toks


class Parser:
    """Expressions become tuples: ("num", x), ("name", n), ("neg", e), ("bin", op, a, b),
    ("call", func, [positional], {keyword: expr})."""

    def __init__(self, text):
        self.toks = lex(text)
        self.i = 0

    def peek(self, k=0):
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def take(self, kind):
        tok = self.peek()
        if tok[0] != kind:
            raise DeclError("expected %s, found %s" % (kind, tok[0] if tok[1] is None else repr(tok[1])))
        self.i += 1
        return tok

    def body(self):
        stmts = []
        while True:
            while self.peek()[0] == "end":
                self.i += 1
            if self.peek()[0] == "eof":
                return stmts
            target = self.take("name")[1]
            self.take("=")
            stmts.append((target, self.expr()))
            nxt = self.peek()
            # A statement ends at a line break, a `;`, the end, or where `name =` begins.
            if not (nxt[0] in ("end", "eof") or (nxt[0] == "name" and self.peek(1)[0] == "=")):
                raise DeclError("unexpected %r after a statement" % (nxt[1] or nxt[0]))

    def expr(self):
        e = self.term()
        while self.peek()[0] in ("+", "-"):
            op = self.take(self.peek()[0])[0]
            e = ("bin", op, e, self.term())
        return e

    def term(self):
        e = self.unary()
        while self.peek()[0] in ("*", "/"):
            op = self.take(self.peek()[0])[0]
            e = ("bin", op, e, self.unary())
        return e

    def unary(self):
        if self.peek()[0] == "-":
            self.i += 1
            return ("neg", self.unary())
        return self.atom()

    def atom(self):
        tok = self.peek()
        if tok[0] == "num":
            self.i += 1
            return ("num", tok[1])
        if tok[0] == "(":
            self.i += 1
            e = self.expr()
            self.take(")")
            return e
        name = self.take("name")[1]
        if self.peek()[0] != "(":
            return ("name", name)
        self.i += 1
        pos, kw = [], {}
        if self.peek()[0] != ")":
            while True:
                if self.peek()[0] == "name" and self.peek(1)[0] == "=":
                    key = self.take("name")[1]
                    self.take("=")
                    kw[key] = self.expr()
                else:
                    pos.append(self.expr())
                if self.peek()[0] != ",":
                    break
                self.i += 1
        self.take(")")
        return ("call", name, pos, kw)


def parse_body(text):
    return Parser(text).body()


def literal(e):
    """The value of a number literal, possibly negated (axes, eps)."""
    if e[0] == "num":
        return e[1]
    if e[0] == "neg":
        return -literal(e[1])
    raise DeclError("expected a number literal")


def ops_used(stmts):
    seen = set()

    def walk(e):
        if e[0] == "call":
            seen.add(e[1])
            for a in e[2]:
                walk(a)
            for a in e[3].values():
                walk(a)
        elif e[0] == "bin":
            seen.add(e[1])
            walk(e[2])
            walk(e[3])
        elif e[0] == "neg":
            seen.add("neg")
            walk(e[1])

    for _, e in stmts:
        walk(e)
    return seen


# --------------------------------------------------------------------------------------------
# Translation into straight-line Python.
# --------------------------------------------------------------------------------------------

# Torch style: the code a user would write in eager PyTorch. MATMUL and SOFTMAX are bound per
# use (torch.matmul and torch.softmax, or recording wrappers); OUT_DTYPES casts the outputs to
# their declared dtypes (a no-op for the float64 reference).
TORCH_UNARY = {
    "exp": "torch.exp({0})",
    "log": "torch.log({0})",
    "sqrt": "torch.sqrt({0})",
    "rsqrt": "torch.rsqrt({0})",
    "square": "torch.square({0})",
    "recip": "torch.reciprocal({0})",
    "silu": "F.silu({0})",
    "sigmoid": "torch.sigmoid({0})",
    "gelu": "F.gelu({0})",
}


class Gen:
    """Translates a parsed body into the source of `def kernel(inputs...)` returning a tuple of
    the outputs. style "torch" emits torch calls; style "ops" emits calls on a namespace `O`
    (the pure-Python tensor, or the shape tracker that counts FLOPs)."""

    def __init__(self, style, inputs, outputs, cublas=False):
        self.style = style
        self.inputs = inputs
        self.outputs = outputs
        self.cublas = cublas
        self.lines = []
        self.n = 0
        self.env = {name: "v_" + name for name in inputs}

    def tmp(self, code):
        name = "t%d" % self.n
        self.n += 1
        self.lines.append("    %s = %s" % (name, code))
        return name

    def expr(self, e, out=None):
        kind = e[0]
        if kind == "num":
            return repr(float(e[1]))
        if kind == "name":
            if e[1] not in self.env:
                raise DeclError("undefined name %r" % e[1])
            return self.env[e[1]]
        if kind == "neg":
            return self.tmp("-%s" % self.expr(e[1]))
        if kind == "bin":
            a, b = self.expr(e[2]), self.expr(e[3])
            return self.tmp("%s %s %s" % (a, e[1], b))
        return self.call(e[1], e[2], e[3], out)

    def call(self, func, pos, kw, out):
        torch = self.style == "torch"
        need = 2 if func == "matmul" or (func == "max" and not kw) else 1
        if len(pos) != need:
            raise DeclError("%s takes %d tensor arguments, got %d" % (func, need, len(pos)))
        xs = [self.expr(p) for p in pos]
        x = xs[0]

        def axis(default=None):
            if "axis" in kw:
                v = literal(kw["axis"])
                if v != int(v):
                    raise DeclError("axis must be an integer")
                return int(v)
            if default is None:
                raise DeclError("%s needs axis=" % func)
            return default

        if func == "matmul":
            if torch and out is not None:
                return self.tmp("torch.matmul(%s, %s, out=%s)" % (xs[0], xs[1], out))
            return self.tmp(("MATMUL(%s, %s)" if torch else "O.matmul(%s, %s)") % (xs[0], xs[1]))
        if func == "transpose":
            return self.tmp(("%s.transpose(-1, -2)" if torch else "O.transpose(%s)") % x)
        if func in UNARY:
            return self.tmp(TORCH_UNARY[func].format(x) if torch else "O.%s(%s)" % (func, x))
        if func == "max" and not kw:
            return self.tmp(("torch.maximum(%s, %s)" if torch else "O.maximum(%s, %s)") % (xs[0], xs[1]))
        if func in REDUCTIONS:
            name = {"sum": "sum", "mean": "mean", "max": "amax"}[func]
            if torch:
                return self.tmp("torch.%s(%s, dim=%d, keepdim=True)" % (name, x, axis()))
            return self.tmp("O.%s(%s, %d)" % (name, x, axis()))
        if func == "softmax":
            return self.tmp(("SOFTMAX(%s, dim=%d)" if torch else "O.softmax(%s, %d)") % (x, axis(-1)))
        if func == "rmsnorm":
            # Exactly the declaration's expansion: x * rsqrt(mean(square(x)) + eps).
            eps = literal(kw["eps"]) if "eps" in kw else RMSNORM_EPS
            ax = axis(-1)
            if torch:
                sq = self.tmp("torch.square(%s)" % x)
                ms = self.tmp("torch.mean(%s, dim=%d, keepdim=True)" % (sq, ax))
                r = self.tmp("torch.rsqrt(%s + %r)" % (ms, float(eps)))
            else:
                sq = self.tmp("O.square(%s)" % x)
                ms = self.tmp("O.mean(%s, %d)" % (sq, ax))
                r = self.tmp("O.rsqrt(%s + %r)" % (ms, float(eps)))
            return self.tmp("%s * %s" % (x, r))
        raise DeclError("unknown function %r" % func)

    def source(self, stmts):
        outs = {name: i for i, name in enumerate(self.outputs)}
        for target, e in stmts:
            out = None
            if self.cublas and target in outs and e[0] == "call" and e[1] == "matmul":
                out = "out%d" % outs[target]
            self.env[target] = self.expr(e, out)
        for name in self.outputs:
            if name not in self.env:
                raise DeclError("output %r is never assigned" % name)
        params = ["v_" + n for n in self.inputs]
        if self.cublas:
            params += ["out%d" % i for i in range(len(self.outputs))]
        if self.style == "torch":
            rets = ["%s.to(OUT_DTYPES[%d])" % (self.env[n], i) for i, n in enumerate(self.outputs)]
        else:
            rets = [self.env[n] for n in self.outputs]
        head = "def kernel(%s):" % ", ".join(params)
        return "\n".join([head] + self.lines + ["    return (%s,)" % ", ".join(rets)]) + "\n"


_COUNTER = [0]


def make_function(stmts, inputs, outputs, style, namespace, cublas=False, tag="kernel"):
    """Compiles the body into a fresh function (a fresh code object each time, so torch.compile
    caches of different kernels and shapes never share guards)."""
    src = Gen(style, inputs, outputs, cublas).source(stmts)
    _COUNTER[0] += 1
    filename = "<cleave:%s:%d>" % (tag, _COUNTER[0])
    # Registered so that tracebacks and torch.compile can show the generated source.
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    scope = dict(namespace)
    exec(compile(src, filename, "exec"), scope)
    return scope["kernel"], src


def attention_pattern(stmts, inputs, outputs):
    """Recognizes `o = matmul(softmax(S * c, axis=-1), v)` with S = matmul(q, transpose(k)) or a
    sum of such products (MLA's absorbed form), after inlining intermediate names. Returns
    {"q": [names], "k": [names], "v": name, "scale": c} or None."""
    if len(outputs) != 1:
        return None
    env = {}

    def inline(e):
        if e[0] == "name" and e[1] in env:
            return env[e[1]]
        if e[0] == "neg":
            return ("neg", inline(e[1]))
        if e[0] == "bin":
            return ("bin", e[1], inline(e[2]), inline(e[3]))
        if e[0] == "call":
            return ("call", e[1], [inline(a) for a in e[2]], {k: inline(v) for k, v in e[3].items()})
        return e

    for target, e in stmts:
        env[target] = inline(e)
    e = env.get(outputs[0])
    if not e or e[0] != "call" or e[1] != "matmul" or len(e[2]) != 2:
        return None
    sm, v = e[2]
    if sm[0] != "call" or sm[1] != "softmax" or v[0] != "name" or v[1] not in inputs:
        return None
    if "axis" in sm[3] and literal(sm[3]["axis"]) != -1:
        return None
    s = sm[2][0]
    scale = 1.0
    if s[0] == "bin" and s[1] == "*" and s[3][0] == "num":
        s, scale = s[2], s[3][1]
    elif s[0] == "bin" and s[1] == "*" and s[2][0] == "num":
        s, scale = s[3], s[2][1]
    elif s[0] == "bin" and s[1] == "/" and s[3][0] == "num":
        s, scale = s[2], 1.0 / s[3][1]
    pairs = []

    def products(t):
        if t[0] == "bin" and t[1] == "+":
            return products(t[2]) and products(t[3])
        if t[0] == "call" and t[1] == "matmul" and len(t[2]) == 2:
            a, bt = t[2]
            if a[0] == "name" and bt[0] == "call" and bt[1] == "transpose" and len(bt[2]) == 1 and bt[2][0][0] == "name":
                if a[1] in inputs and bt[2][0][1] in inputs:
                    pairs.append((a[1], bt[2][0][1]))
                    return True
        return False

    if not products(s):
        return None
    return {"q": [p[0] for p in pairs], "k": [p[1] for p in pairs], "v": v[1], "scale": scale}


# --------------------------------------------------------------------------------------------
# The metric and small helpers (no torch).
# --------------------------------------------------------------------------------------------


def max_rel_err_list(got, want):
    """cleave_core::reference::max_rel_err on Python lists."""
    if len(got) != len(want):
        raise ValueError("compared tensors differ in length")
    if not want:
        return 0.0
    if any(not math.isfinite(w) for w in want):
        return float("nan")
    rms = math.sqrt(sum(w * w for w in want) / len(want))
    floor = max(0.1 * rms, sys.float_info.min)
    worst = 0.0
    for g, w in zip(got, want):
        if not math.isfinite(g):
            return float("inf")
        worst = max(worst, abs(g - w) / max(abs(w), floor))
    return worst


def read_raw_list(path, dtype, count):
    """A raw little-endian file as a list of Python floats (no numpy, no torch)."""
    with open(path, "rb") as f:
        data = f.read()
    if dtype == "f16":
        vals = struct.unpack("<%de" % count, data)
    elif dtype == "bf16":
        halves = struct.unpack("<%dH" % count, data)
        vals = struct.unpack("<%df" % count, struct.pack("<%dI" % count, *[h << 16 for h in halves]))
    elif dtype == "f32":
        vals = struct.unpack("<%df" % count, data)
    elif dtype == "f64":
        vals = struct.unpack("<%dd" % count, data)
    else:
        raise ValueError("unknown dtype %r" % dtype)
    return list(vals)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


DTYPE_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8}


# --------------------------------------------------------------------------------------------
# Pure-Python backends of the "ops" style: values (the self-test reference) and shapes (FLOPs).
# --------------------------------------------------------------------------------------------


def broadcast_shape(a, b):
    rank = max(len(a), len(b))
    a = (1,) * (rank - len(a)) + tuple(a)
    b = (1,) * (rank - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            raise DeclError("shapes %s and %s do not broadcast" % (a, b))
        out.append(max(x, y) if min(x, y) != 0 else 0)
    return tuple(out)


def strides(shape):
    s, acc = [0] * len(shape), 1
    for i in range(len(shape) - 1, -1, -1):
        s[i] = acc
        acc *= shape[i]
    return s


def index_map(shape, out_shape):
    """For each element of out_shape (row-major), the flat index of the broadcast operand."""
    shape = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    st = [0 if shape[d] == 1 else s for d, s in enumerate(strides(shape))]
    idx = [0]
    for d, n in enumerate(out_shape):
        idx = [i + j * st[d] for i in idx for j in range(n)]
    return idx


def safe(f):
    def g(*a):
        try:
            return f(*a)
        except OverflowError:
            return float("inf")
        except (ValueError, ZeroDivisionError):
            return float("nan")

    return g


def _div(a, b):
    if b == 0:
        return float("nan") if a == 0 or a != a else math.copysign(float("inf"), a) * math.copysign(1.0, b)
    return a / b


def _exp(x):
    try:
        return math.exp(x)
    except OverflowError:
        return float("inf")


class PT:
    """A dense row-major float64 tensor of Python floats, enough for the declaration language."""

    __slots__ = ("shape", "data")

    def __init__(self, shape, data):
        self.shape = tuple(shape)
        self.data = data

    @staticmethod
    def of(x):
        return x if isinstance(x, PT) else PT((), [float(x)])

    def _bin(self, other, f, swap=False):
        a, b = (PT.of(other), self) if swap else (self, PT.of(other))
        out = broadcast_shape(a.shape, b.shape)
        ia, ib = index_map(a.shape, out), index_map(b.shape, out)
        ad, bd = a.data, b.data
        return PT(out, [f(ad[i], bd[j]) for i, j in zip(ia, ib)])

    def __add__(self, o):
        return self._bin(o, operator.add)

    def __radd__(self, o):
        return self._bin(o, operator.add, True)

    def __sub__(self, o):
        return self._bin(o, operator.sub)

    def __rsub__(self, o):
        return self._bin(o, operator.sub, True)

    def __mul__(self, o):
        return self._bin(o, operator.mul)

    def __rmul__(self, o):
        return self._bin(o, operator.mul, True)

    def __truediv__(self, o):
        return self._bin(o, _div)

    def __rtruediv__(self, o):
        return self._bin(o, _div, True)

    def __neg__(self):
        return PT(self.shape, [-x for x in self.data])


class PyOps:
    """The "ops" namespace over PT values."""

    @staticmethod
    def _map(x, f):
        return PT(x.shape, [f(v) for v in x.data])

    exp = staticmethod(lambda x: PyOps._map(x, _exp))
    log = staticmethod(lambda x: PyOps._map(x, safe(lambda v: math.log(v) if v > 0 else (float("-inf") if v == 0 else float("nan")))))
    sqrt = staticmethod(lambda x: PyOps._map(x, safe(lambda v: math.sqrt(v) if v >= 0 else float("nan"))))
    rsqrt = staticmethod(lambda x: PyOps._map(x, safe(lambda v: _div(1.0, math.sqrt(v)) if v >= 0 else float("nan"))))
    square = staticmethod(lambda x: PyOps._map(x, lambda v: v * v))
    recip = staticmethod(lambda x: PyOps._map(x, lambda v: _div(1.0, v)))
    sigmoid = staticmethod(lambda x: PyOps._map(x, lambda v: _div(1.0, 1.0 + _exp(-v))))
    silu = staticmethod(lambda x: PyOps._map(x, lambda v: _div(v, 1.0 + _exp(-v))))
    gelu = staticmethod(lambda x: PyOps._map(x, lambda v: 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))))

    @staticmethod
    def maximum(a, b):
        return PT.of(a)._bin(b, max)

    @staticmethod
    def transpose(x):
        if len(x.shape) < 2:
            raise DeclError("transpose needs rank >= 2")
        *batch, m, n = x.shape
        out = []
        for b in range(numel(batch)):
            base = b * m * n
            for j in range(n):
                out.extend(x.data[base + i * n + j] for i in range(m))
        return PT(tuple(batch) + (n, m), out)

    @staticmethod
    def matmul(a, b):
        if len(a.shape) < 2 or len(b.shape) < 2:
            raise DeclError("matmul needs rank >= 2")
        *ba, m, k = a.shape
        *bb, k2, n = b.shape
        if k != k2:
            raise DeclError("matmul contracts %d with %d" % (k, k2))
        batch = broadcast_shape(tuple(ba), tuple(bb))
        ia, ib = index_map(tuple(ba), batch), index_map(tuple(bb), batch)
        out = []
        for oa, ob in zip(ia, ib):
            a0, b0 = oa * m * k, ob * k * n
            for i in range(m):
                acc = [0.0] * n
                for kk in range(k):
                    aik = a.data[a0 + i * k + kk]
                    row = b.data[b0 + kk * n : b0 + (kk + 1) * n]
                    acc = [c + aik * r for c, r in zip(acc, row)]
                out.extend(acc)
        return PT(batch + (m, n), out)

    @staticmethod
    def _reduce(x, axis, f):
        rank = len(x.shape)
        ax = axis + rank if axis < 0 else axis
        if not 0 <= ax < rank:
            raise DeclError("axis %d out of range for rank %d" % (axis, rank))
        outer, n, inner = numel(x.shape[:ax]), x.shape[ax], numel(x.shape[ax + 1 :])
        out = [0.0] * (outer * inner)
        for o in range(outer):
            for i in range(inner):
                out[o * inner + i] = f([x.data[(o * n + j) * inner + i] for j in range(n)])
        shape = list(x.shape)
        shape[ax] = 1
        return PT(shape, out)

    @staticmethod
    def _sum(vals):
        s = 0.0
        for v in vals:
            s += v
        return s

    sum = staticmethod(lambda x, axis: PyOps._reduce(x, axis, PyOps._sum))
    mean = staticmethod(lambda x, axis: PyOps._reduce(x, axis, lambda v: PyOps._sum(v) / len(v)))
    amax = staticmethod(lambda x, axis: PyOps._reduce(x, axis, max))

    @staticmethod
    def softmax(x, axis):
        m = PyOps.amax(x, axis)
        e = PyOps.exp(x - m)
        return e / PyOps.sum(e, axis)


class ST:
    """A shape only: evaluates a body's shapes and counts its matmul FLOPs."""

    __slots__ = ("shape",)

    def __init__(self, shape):
        self.shape = tuple(shape)

    def _bin(self, o):
        return ST(broadcast_shape(self.shape, o.shape if isinstance(o, ST) else ()))

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _bin

    def __neg__(self):
        return self


class ShapeOps:
    """The "ops" namespace over shapes; `flops` accumulates 2·M·N·K per matmul and batch."""

    def __init__(self):
        self.flops = 0
        for name in UNARY:
            setattr(self, name, lambda x: x)

    def maximum(self, a, b):
        return ST(broadcast_shape(a.shape, b.shape))

    def transpose(self, x):
        return ST(x.shape[:-2] + (x.shape[-1], x.shape[-2]))

    def matmul(self, a, b):
        batch = broadcast_shape(a.shape[:-2], b.shape[:-2])
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        if k != b.shape[-2]:
            raise DeclError("matmul contracts %d with %d" % (k, b.shape[-2]))
        self.flops += 2 * numel(batch) * m * n * k
        return ST(batch + (m, n))

    def _reduce(self, x, axis):
        s = list(x.shape)
        s[axis] = 1
        return ST(s)

    sum = mean = amax = _reduce

    def softmax(self, x, axis):
        return x


def matmul_flops(stmts, inputs, outputs, shapes):
    ops = ShapeOps()
    fn, _ = make_function(stmts, inputs, outputs, "ops", {"O": ops}, tag="flops")
    res = fn(*[ST(s) for s in shapes])
    return ops.flops, [r.shape for r in res]


# --------------------------------------------------------------------------------------------
# Results: one table, written after every phase.
# --------------------------------------------------------------------------------------------


def fmt_us(entry):
    if not entry:
        return "–"
    if "us" in entry:
        return "%.1f" % entry["us"]
    if str(entry.get("error", "")).startswith("skipped"):
        return "skip"
    return "err" if "error" in entry else "–"


def fmt_err(x):
    if x is None:
        return "–"
    if isinstance(x, str):
        return x
    if x != x:
        return "NaN"
    if math.isinf(x):
        return "inf"
    return "%.2e" % x


def render(results, tolerance):
    env = results.get("env", {})
    lines = [
        "GPU: %s (compute capability %s), driver %s; torch %s (CUDA %s), triton %s; %s UTC"
        % (
            env.get("gpu"),
            env.get("capability"),
            env.get("driver"),
            env.get("torch"),
            env.get("torch_cuda"),
            env.get("triton"),
            env.get("date"),
        ),
        "",
        "Timing: median of CUDA-event-timed runs, L2 %s (%s); the baselines are timed the same way."
        % (results.get("l2") or "?", results.get("l2_note") or "no timings.json"),
        "max_rel_err: Cleave's output at the check extents (%s) against the float64 torch reference; "
        "tolerance %g." % (results.get("check_extents", "?"), tolerance),
        "",
        "| kernel | shape | cleave µs | SDPA-flash µs | torch.compile µs | eager µs | cuBLAS µs | speedup vs best | TFLOP/s | GB/s | max_rel_err |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for case in results.get("cases", []):
        k = case["kernel"]
        check = results.get("kernels", {}).get(k, {})
        err = check.get("max_rel_err")
        if check.get("error"):
            err_cell = "err"
            notes.append("%s check: %s" % (k, check["error"]))
        elif err is None:
            err_cell = "–"
        else:
            err_cell = fmt_err(err) + ("" if (err == err and err <= tolerance) else " ✗")
        cle = case.get("cleave", {})
        cle_cell = fmt_us(cle)
        if cle.get("nonfinite_outputs"):
            cle_cell += " (NaN out)"
        if "error" in cle:
            notes.append("%s %s cleave: %s" % (k, case["case"], cle["error"]))
        base = case.get("baselines", {})
        for name in ("sdpa", "compile", "eager", "cublas"):
            b = base.get(name)
            if b and b.get("error"):
                notes.append("%s %s %s: %s" % (k, case["case"], name, b["error"]))
            if b and b.get("note"):
                notes.append("%s %s %s: %s" % (k, case["case"], name, b["note"]))
        best = [base[n]["us"] for n in base if base[n] and "us" in base[n]]
        speed = tflops = gbs = "–"
        if cle.get("us"):
            if best:
                speed = "%.2f×" % (min(best) / cle["us"])
            if case.get("flops"):
                tflops = "%.1f" % (case["flops"] / (cle["us"] * 1e-6) / 1e12)
            if case.get("bytes"):
                gbs = "%.0f" % (case["bytes"] / (cle["us"] * 1e-6) / 1e9)
        lines.append(
            "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |"
            % (
                k,
                case["case"],
                cle_cell,
                fmt_us(base.get("sdpa")),
                fmt_us(base.get("compile")),
                fmt_us(base.get("eager")),
                fmt_us(base.get("cublas")),
                speed,
                tflops,
                gbs,
                err_cell,
            )
        )
    # Kernels that were checked but have no timing row still show their error.
    timed = {case["kernel"] for case in results.get("cases", [])}
    for k, check in results.get("kernels", {}).items():
        if k not in timed:
            err = check.get("max_rel_err")
            cell = "err" if check.get("error") else fmt_err(err) + ("" if (err is None or (err == err and err <= tolerance)) else " ✗")
            lines.append("| %s | %s (check only) | – | – | – | – | – | – | – | – | %s |" % (k, check.get("case"), cell))
            if check.get("error"):
                notes.append("%s check: %s" % (k, check["error"]))
    for k, check in sorted(results.get("kernels", {}).items()):
        for name in ("eager_check", "sdpa_check"):
            c = check.get(name)
            if c and c.get("error"):
                notes.append("%s %s: %s" % (k, name, c["error"]))
    if notes:
        lines += ["", "Notes:", ""] + ["- " + n for n in dict.fromkeys(notes)]
    return "\n".join(lines) + "\n"


def write_results(out, results, tolerance):
    """Writes results.json and results.md, each through a temporary file and a rename, so that
    a run stopped at its time limit never leaves a half-written file."""
    os.makedirs(out, exist_ok=True)
    text = render(results, tolerance)
    for name, write in (
        ("results.json", lambda f: json.dump(results, f, indent=1, default=str, allow_nan=True)),
        ("results.md", lambda f: f.write(text)),
    ):
        path = os.path.join(out, name)
        with open(path + ".partial", "w") as f:
            write(f)
        os.replace(path + ".partial", path)
    return text


def short(e):
    """An exception as one line, at most 300 characters."""
    msg = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip() else "")
    return msg if len(msg) <= 300 else msg[:297] + "..."


def load_json(path):
    """The file's JSON, or None (with a message) when it is missing or unreadable: the bench may
    have been stopped before writing it."""
    if not path or not os.path.exists(path):
        if path:
            print("compare.py: %s does not exist" % path, file=sys.stderr)
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print("compare.py: cannot read %s: %s" % (path, short(e)), file=sys.stderr)
        return None


# --------------------------------------------------------------------------------------------
# On the GPU, with torch.
# --------------------------------------------------------------------------------------------


def gpu_main(args):
    import torch
    import torch.nn.functional as F

    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # older torch: SDPA flash cannot be forced; reported per case
        SDPBackend = sdpa_kernel = None

    started = time.time()
    deadline = started + args.budget_s
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def empty_cache():
        if cuda:
            torch.cuda.empty_cache()

    torch_dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64}
    manifest = load_json(args.manifest)
    timings = load_json(args.timings)
    try:
        import triton

        triton_version = triton.__version__
    except Exception:
        triton_version = None
    props = torch.cuda.get_device_properties(dev) if cuda else None
    results = {
        "env": {
            "gpu": props.name if props else "none (--device %s: a dry run, not a measurement)" % args.device,
            "capability": "%d.%d" % (props.major, props.minor) if props else None,
            "driver": nvidia_driver(),
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "triton": triton_version,
            "python": sys.version.split()[0],
            "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        },
        "bench_device": (timings or manifest or {}).get("device"),
        "l2": ((timings or {}).get("timing") or {}).get("l2"),
        "timing": (timings or {}).get("timing"),
        "kernels": {},
        "cases": [],
    }
    if results["l2"] == "cold":
        results["l2_note"] = "a %d MiB buffer is zeroed before each timed run" % (
            results["timing"]["flush_bytes"] >> 20
        )
    elif results["l2"] == "warm":
        results["l2_note"] = "back-to-back runs in batches of about %.1f ms" % results["timing"]["warm_batch_ms"]
    wanted = set(args.kernels or [])

    def selected(name):
        return not wanted or name in wanted

    # --- phase 1: correctness at the check extents ---
    records = (manifest or {}).get("kernels", [])
    if records:
        results["check_extents"] = ", ".join(sorted({r.get("case", "") for r in records if r.get("case")}))
    data_dir = (manifest or {}).get("data_dir") or ""

    def softmax_recorder(peaks):
        def softmax(x, dim):
            peaks.append(float(x.abs().max()))
            return torch.softmax(x, dim=dim)

        return softmax

    for rec in records:
        name = rec["kernel"]
        if not selected(name):
            continue
        entry = results["kernels"].setdefault(name, {"case": rec.get("case")})
        if rec.get("status") != "ok":
            entry["error"] = "the bench could not run it: %s" % rec.get("error")
            continue
        try:
            stmts = parse_body(rec["body"])
            ins = [t["name"] for t in rec["inputs"]]
            outs = [t["name"] for t in rec["outputs"]]

            def load(t):
                path = os.path.join(data_dir, t["file"])
                with open(path, "rb") as f:
                    raw = f.read()
                expected = numel(t["shape"]) * DTYPE_BYTES[t["dtype"]]
                if len(raw) != expected:
                    raise ValueError("%s has %d bytes, expected %d" % (path, len(raw), expected))
                x = torch.frombuffer(bytearray(raw), dtype=torch_dtype[t["dtype"]]).reshape(t["shape"])
                return x.to(dev)

            xs = [load(t) for t in rec["inputs"]]
            got = [load(t) for t in rec["outputs"]]
            peaks = []
            ref_fn, _ = make_function(
                stmts,
                ins,
                outs,
                "torch",
                {
                    "torch": torch,
                    "F": F,
                    "MATMUL": torch.matmul,
                    "SOFTMAX": softmax_recorder(peaks),
                    "OUT_DTYPES": [torch.float64] * len(outs),
                },
                tag=name + ":ref",
            )
            with torch.no_grad():
                want = ref_fn(*[x.to(torch.float64) for x in xs])
            errs = [max_rel_err_torch(torch, g, w) for g, w in zip(got, want)]
            entry["max_rel_err"] = max(errs, key=lambda e: (e != e, e))
            entry["per_output"] = dict(zip(outs, errs))
            entry["nonfinite_outputs"] = int(sum(int((~torch.isfinite(g.double())).sum()) for g in got))
            if peaks:
                entry["peak_abs_softmax_arg"] = max(peaks)
            entry["pass"] = bool(entry["max_rel_err"] == entry["max_rel_err"] and entry["max_rel_err"] <= args.tolerance)

            # The baselines' own error at these extents: checks this script's translation of
            # the body (eager) and of the attention layout (SDPA) on the device.
            try:
                eager_fn, _ = make_function(
                    stmts,
                    ins,
                    outs,
                    "torch",
                    eager_namespace(torch, F, [torch_dtype[t["dtype"]] for t in rec["outputs"]]),
                    tag=name + ":eager-check",
                )
                with torch.no_grad():
                    e_out = eager_fn(*xs)
                entry["eager_check"] = {"max_rel_err": max(max_rel_err_torch(torch, g, w) for g, w in zip(e_out, want))}
            except Exception as e:
                entry["eager_check"] = {"error": short(e)}
            pattern = attention_pattern(stmts, ins, outs)
            if pattern:
                entry["attention"] = pattern
                try:
                    with torch.no_grad(), sdpa_ctx(sdpa_kernel, SDPBackend):
                        fn, note = sdpa_function(torch, F, pattern, dict(zip(ins, xs)), tuple(rec["outputs"][0]["shape"]))
                        s_out = fn()
                    entry["sdpa_check"] = {"max_rel_err": max_rel_err_torch(torch, s_out, want[0]), "note": note}
                except Exception as e:
                    entry["sdpa_check"] = {"error": short(e)}
            del xs, got, want
        except Exception as e:
            entry["error"] = short(e)
            traceback.print_exc()
        empty_cache()
        print("check %-24s max_rel_err=%s %s" % (name, fmt_err(entry.get("max_rel_err")), entry.get("error", "")), flush=True)
    write_results(args.out, results, args.tolerance)

    # --- phase 2: eager, SDPA and cuBLAS baselines at every timing case ---
    topt = (timings or {}).get("timing") or {}
    cold = topt.get("l2", "cold") == "cold"
    flush = None
    if cold and cuda:
        flush = torch.empty(int(topt.get("flush_bytes") or (256 << 20)), dtype=torch.uint8, device=dev)
    timer = Timer(torch, flush, topt, cuda)
    cases = [c for c in (timings or {}).get("cases", []) if selected(c["kernel"])]
    prepared = []
    for case in cases:
        row = {"kernel": case["kernel"], "case": case["case"], "dims": case.get("dims"), "primary": case.get("primary")}
        row["cleave"] = (
            {"us": case["median_us"], "reps": case.get("reps"), "nonfinite_outputs": case.get("nonfinite_outputs")}
            if case.get("status") == "ok"
            else {"error": case.get("error", "not run")}
        )
        row["baselines"] = {}
        results["cases"].append(row)
        try:
            stmts = parse_body(case["body"])
            ins = [t["name"] for t in case["inputs"]]
            outs = [t["name"] for t in case["outputs"]]
            flops, out_shapes = matmul_flops(stmts, ins, outs, [tuple(t["shape"]) for t in case["inputs"]])
            for got_shape, t in zip(out_shapes, case["outputs"]):
                if tuple(got_shape) != tuple(t["shape"]):
                    raise DeclError("output %s: the body gives shape %s, the bench %s" % (t["name"], got_shape, t["shape"]))
            row["flops"] = flops
            row["bytes"] = sum(numel(t["shape"]) * DTYPE_BYTES[t["dtype"]] for t in case["inputs"] + case["outputs"])
            prepared.append((row, case, stmts, ins, outs))
        except Exception as e:
            row["baselines"]["eager"] = {"error": short(e)}
    write_results(args.out, results, args.tolerance)

    def inputs_for(case, seed):
        gen = torch.Generator(device=dev)
        gen.manual_seed(seed)
        std = float(case.get("input_std", 1.0))
        return [
            (torch.randn(t["shape"], generator=gen, device=dev, dtype=torch.float32) * std).to(torch_dtype[t["dtype"]])
            for t in case["inputs"]
        ]

    for index, (row, case, stmts, ins, outs) in enumerate(prepared):
        if time.time() > started + 0.6 * args.budget_s:
            row["baselines"].setdefault("eager", {"error": "skipped: time budget"})
            continue
        out_dtypes = [torch_dtype[t["dtype"]] for t in case["outputs"]]
        try:
            xs = inputs_for(case, args.seed + index)
        except Exception as e:
            row["baselines"]["eager"] = {"error": "inputs: " + short(e)}
            continue
        with torch.no_grad():
            try:
                fn, _ = make_function(stmts, ins, outs, "torch", eager_namespace(torch, F, out_dtypes), tag=row["kernel"] + ":eager")
                row["baselines"]["eager"] = timer.run(lambda: fn(*xs))
            except Exception as e:
                row["baselines"]["eager"] = {"error": short(e)}
            if ops_used(stmts) <= {"matmul", "transpose"}:
                try:
                    bufs = [torch.empty(t["shape"], dtype=d, device=dev) for t, d in zip(case["outputs"], out_dtypes)]
                    fn_c, _ = make_function(
                        stmts, ins, outs, "torch", eager_namespace(torch, F, out_dtypes), cublas=True, tag=row["kernel"] + ":cublas"
                    )
                    row["baselines"]["cublas"] = timer.run(lambda: fn_c(*xs, *bufs))
                    del bufs
                except Exception as e:
                    row["baselines"]["cublas"] = {"error": short(e)}
            pattern = attention_pattern(stmts, ins, outs)
            if pattern:
                try:
                    # The backend is forced while the layout is probed and while it is timed.
                    with sdpa_ctx(sdpa_kernel, SDPBackend):
                        fn_s, note = sdpa_function(torch, F, pattern, dict(zip(ins, xs)), tuple(case["outputs"][0]["shape"]))
                        r = timer.run(fn_s)
                    if note:
                        r["note"] = note
                    row["baselines"]["sdpa"] = r
                except Exception as e:
                    row["baselines"]["sdpa"] = {"error": short(e)}
        del xs
        empty_cache()
        print("base  %-24s %-16s eager=%s sdpa=%s cublas=%s" % (
            row["kernel"], row["case"], fmt_us(row["baselines"].get("eager")),
            fmt_us(row["baselines"].get("sdpa")), fmt_us(row["baselines"].get("cublas"))), flush=True)
        write_results(args.out, results, args.tolerance)

    # --- phase 3: torch.compile, primary shapes first, while the budget lasts ---
    if not args.no_compile and prepared:
        configure_dynamo(torch)
        # Primary shapes first; among them the kernels whose stated target is torch.compile
        # (everything but attention, which has SDPA-flash as its baseline).
        def priority(i):
            row, _, stmts, ins, outs = prepared[i]
            return (not row.get("primary"), attention_pattern(stmts, ins, outs) is not None, i)

        order = sorted(range(len(prepared)), key=priority)
        compile_times = []
        for index in order:
            row, case, stmts, ins, outs = prepared[index]
            # The first compile also starts inductor's workers, so later ones are predicted from
            # the later ones; before any, 30 s is assumed.
            predicted = max(compile_times[1:] or compile_times or [30.0])
            if time.time() + 1.5 * predicted > deadline:
                row["baselines"]["compile"] = {"error": "skipped: time budget"}
                continue
            out_dtypes = [torch_dtype[t["dtype"]] for t in case["outputs"]]
            try:
                xs = inputs_for(case, args.seed + index)
                fn, _ = make_function(stmts, ins, outs, "torch", eager_namespace(torch, F, out_dtypes), tag=row["kernel"] + ":compile")
                compiled = torch.compile(fn, dynamic=False)
                t0 = time.time()
                with torch.no_grad():
                    compiled(*xs)
                    sync()
                    compile_s = time.time() - t0
                    compile_times.append(compile_s)
                    r = timer.run(lambda: compiled(*xs))
                r["compile_s"] = round(compile_s, 2)
                row["baselines"]["compile"] = r
                del xs
            except Exception as e:
                row["baselines"]["compile"] = {"error": short(e)}
            empty_cache()
            print("comp  %-24s %-16s %s" % (row["kernel"], row["case"], fmt_us(row["baselines"].get("compile"))), flush=True)
            write_results(args.out, results, args.tolerance)

    results["seconds"] = round(time.time() - started, 1)
    text = write_results(args.out, results, args.tolerance)
    print()
    print(text)
    checks = list(results["kernels"].values())
    failed = [c for c in checks if c.get("error") or not c.get("pass")]
    return 1 if failed or not checks else 0


def nvidia_driver():
    try:
        import subprocess

        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except Exception:
        return None


def max_rel_err_torch(torch, got, want):
    """cleave_core::reference::max_rel_err on device tensors, in float64."""
    g = got.to(torch.float64).reshape(-1)
    w = want.to(torch.float64).reshape(-1)
    if g.numel() != w.numel():
        raise ValueError("compared tensors differ in length (%d, %d)" % (g.numel(), w.numel()))
    if w.numel() == 0:
        return 0.0
    if not bool(torch.isfinite(w).all()):
        return float("nan")
    if not bool(torch.isfinite(g).all()):
        return float("inf")
    rms = float(torch.sqrt((w * w).mean()))
    floor = max(0.1 * rms, sys.float_info.min)
    return float(((g - w).abs() / w.abs().clamp_min(floor)).max())


def eager_namespace(torch, F, out_dtypes):
    return {
        "torch": torch,
        "F": F,
        "MATMUL": torch.matmul,
        "SOFTMAX": torch.softmax,
        "OUT_DTYPES": out_dtypes,
    }


class sdpa_ctx:
    """sdpa_kernel(FLASH_ATTENTION), or an error if this torch cannot force the backend."""

    def __init__(self, sdpa_kernel, backend):
        if sdpa_kernel is None:
            raise RuntimeError("this torch has no torch.nn.attention.sdpa_kernel")
        self.cm = sdpa_kernel(backend.FLASH_ATTENTION)

    def __enter__(self):
        return self.cm.__enter__()

    def __exit__(self, *exc):
        return self.cm.__exit__(*exc)


def sdpa_function(torch, F, pattern, tensors, out_shape):
    """A closure running F.scaled_dot_product_attention on the kernel's inputs laid out as
    (batch, heads, sequence, head dim), and a note on what had to be prepared. The preparation
    (views, and where needed a concatenation or padding) happens here, outside the timing."""
    notes = []
    qs = [tensors[n] for n in pattern["q"]]
    ks = [tensors[n] for n in pattern["k"]]
    q = qs[0] if len(qs) == 1 else torch.cat(qs, dim=-1)
    k = ks[0] if len(ks) == 1 else torch.cat(ks, dim=-1)
    if len(qs) > 1:
        notes.append("q and k concatenated (%s) before timing" % "+".join(pattern["q"]))
    v = tensors[pattern["v"]]
    s_len, e = q.shape[-2], q.shape[-1]
    l_len, ev = k.shape[-2], v.shape[-1]
    lead_q = tuple(q.shape[:-2])
    rank = len(lead_q)

    def extend(lead):
        lead = tuple(lead)
        if len(lead) > rank:
            raise ValueError("K/V have more leading axes than Q")
        return (1,) * (rank - len(lead)) + lead

    lead_k, lead_v = extend(k.shape[:-2]), extend(v.shape[:-2])
    if lead_k != lead_v:
        raise ValueError("K and V leading axes differ: %s vs %s" % (lead_k, lead_v))
    # K/V broadcast over trailing query axes only (GQA: [g, 1] against [g, r]; MQA: [1]
    # against [h]) maps query head i to K/V head i // (Hq / Hkv), which SDPA's GQA expects.
    j = 0
    while j < rank and lead_k[j] == lead_q[j]:
        j += 1
    if any(d != 1 for d in lead_k[j:]):
        raise ValueError("K/V leading axes %s are not a GQA layout of %s" % (lead_k, lead_q))
    hq, hkv = numel(lead_q), numel(lead_k)
    q4 = q.reshape(1, hq, s_len, e)
    k4 = k.reshape(1, hkv, l_len, e)
    v4 = v.reshape(1, hkv, l_len, ev)
    if ev != e:
        # The flash backend needs one head dim for q, k and v: pad v with zeros and drop the
        # padding from the output, as DeepSeek-style MLA prefill does with FlashAttention-2.
        v4 = F.pad(v4, (0, e - ev))
        notes.append("v zero-padded from %d to %d" % (ev, e))
    scale = pattern["scale"]
    gqa = hkv != hq

    def call(kk, vv, enable_gqa):
        if enable_gqa:
            o = F.scaled_dot_product_attention(q4, kk, vv, scale=scale, enable_gqa=True)
        else:
            o = F.scaled_dot_product_attention(q4, kk, vv, scale=scale)
        return o[..., :ev].reshape(out_shape)

    if gqa:
        try:
            with torch.no_grad():
                call(k4, v4, True)
            notes.append("GQA through enable_gqa (%d query heads, %d K/V heads)" % (hq, hkv))
            return (lambda: call(k4, v4, True)), "; ".join(notes)
        except Exception as e:
            rep = hq // hkv
            k4 = k4.repeat_interleave(rep, dim=1)
            v4 = v4.repeat_interleave(rep, dim=1)
            notes.append("enable_gqa failed (%s); K/V repeated to %d heads before timing" % (short(e), hq))
    return (lambda: call(k4, v4, False)), "; ".join(notes)


class Timer:
    """The bench's timing procedure (src/timing.rs), in torch: warm-up (at least three calls and
    warmup_ms), one event-timed call to size the repetitions, then `reps` event-timed runs with
    the L2 flushed before each (cold) or in back-to-back batches (warm); the median per call.
    Without CUDA (a dry run) the wall clock stands in for the events."""

    def __init__(self, torch, flush, opts, cuda=True):
        self.torch = torch
        self.cuda = cuda
        self.flush = flush
        self.max_reps = int(opts.get("max_reps", 50))
        self.min_reps = int(opts.get("min_reps", 5))
        self.target_ms = float(opts.get("target_ms", 200.0))
        self.warmup_ms = float(opts.get("warmup_ms", 25.0))
        self.warm_batch_ms = float(opts.get("warm_batch_ms", 0.5))

    def event(self):
        if self.cuda:
            return self.torch.cuda.Event(enable_timing=True)
        return WallEvent()

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def run(self, fn):
        t0 = time.perf_counter()
        calls = 0
        while calls < 3 or (time.perf_counter() - t0) * 1e3 < self.warmup_ms:
            fn()
            self.sync()
            calls += 1
        start, end = self.event(), self.event()
        if self.flush is not None:
            self.flush.zero_()
        start.record()
        fn()
        end.record()
        self.sync()
        estimate = max(start.elapsed_time(end), 1e-4)
        max_reps = max(self.max_reps, 1)
        reps = min(max(int(self.target_ms / estimate), min(max(self.min_reps, 1), max_reps)), max_reps)
        batch = 1 if self.flush is not None else min(max(int(math.ceil(self.warm_batch_ms / estimate)), 1), 100)
        events = [(self.event(), self.event()) for _ in range(reps)]
        for s, e in events:
            if self.flush is not None:
                self.flush.zero_()
            s.record()
            for _ in range(batch):
                fn()
            e.record()
        self.sync()
        per = sorted(s.elapsed_time(e) * 1e3 / batch for s, e in events)
        mid = reps // 2
        median = per[mid] if reps % 2 else 0.5 * (per[mid - 1] + per[mid])
        return {"us": median, "min_us": per[0], "max_us": per[-1], "reps": reps, "batch": batch}


class WallEvent:
    """torch.cuda.Event's interface over the wall clock, for dry runs on the CPU."""

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def configure_dynamo(torch):
    """Every case compiles a fresh function; raise the recompile limits so that many kernels and
    shapes never make dynamo fall back to eager silently."""
    try:
        import torch._dynamo

        for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 1024)
    except Exception:
        pass


# --------------------------------------------------------------------------------------------
# Self-test without torch: this script's translation against Cleave's own f64 reference.
# --------------------------------------------------------------------------------------------


def self_test(args):
    failures = []

    def expect(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    # The metric, as cleave_core::reference::max_rel_err defines it.
    expect(max_rel_err_list([1.0, 2.0], [1.0, 2.0]) == 0.0, "metric: equal tensors give 0")
    expect(abs(max_rel_err_list([1.1], [1.0]) - 0.1) < 1e-12, "metric: relative to |ref|")
    expect(max_rel_err_list([float("nan")], [1.0]) == float("inf"), "metric: NaN output is infinite")
    expect(math.isnan(max_rel_err_list([1.0], [float("inf")])), "metric: non-finite reference is NaN")
    expect(abs(max_rel_err_list([0.01, 10.0], [0.0, 10.0]) - 0.01 / (0.1 * math.sqrt(50.0))) < 1e-12,
           "metric: floor of 0.1·rms for tiny references")
    # The parser and the translation.
    stmts = parse_body("a = -x * 2 + y / 4 # c\nb = max(a, axis=-1); c = rmsnorm(x, eps=1e-6)\nd = max(x, y)")
    expect([s[0] for s in stmts] == ["a", "b", "c", "d"], "parser: statements split at newlines and ';'")
    for bad in ("y = foo(x)", "y = sum(x)", "y = x +", "y = 1e"):
        try:
            make_function(parse_body(bad), ["x"], ["y"], "ops", {"O": PyOps})
            expect(False, "translation rejects %r" % bad)
        except DeclError:
            expect(True, "translation rejects %r" % bad)
    x = PT((2, 3), [1.0, -2.0, 3.0, 4.0, 5.0, -6.0])
    fn, src = make_function(parse_body("y = rmsnorm(x, axis=-1, eps=1e-5)"), ["x"], ["y"], "ops", {"O": PyOps})
    (y,) = fn(x)
    row = [1.0, -2.0, 3.0]
    r = 1.0 / math.sqrt(sum(v * v for v in row) / 3 + 1e-5)
    expect(all(abs(a - b * r) < 1e-12 for a, b in zip(y.data[:3], row)), "rmsnorm: x * rsqrt(mean(x²) + eps)")
    fn, _ = make_function(parse_body("y = matmul(x, transpose(x))"), ["x"], ["y"], "ops", {"O": PyOps})
    (y,) = fn(x)
    expect(y.shape == (2, 2) and y.data == [14.0, -24.0, -24.0, 77.0], "matmul with transpose")
    flops, shapes = matmul_flops(parse_body("s = matmul(q, transpose(k)) * 0.5\no = matmul(softmax(s, axis=-1), v)"),
                                 ["q", "k", "v"], ["o"], [(8, 4, 5, 16), (8, 1, 7, 16), (8, 1, 7, 32)])
    expect(shapes == [(8, 4, 5, 32)] and flops == 2 * 32 * 5 * 7 * 16 + 2 * 32 * 5 * 32 * 7,
           "FLOP count and GQA broadcast shapes")

    manifest = load_json(args.manifest)
    if manifest is None:
        print("no manifest at %s: only the unit checks ran" % args.manifest)
        return 1 if failures else 0
    data_dir = manifest.get("data_dir") or ""
    for rec in manifest.get("kernels", []):
        name = rec["kernel"]
        if args.kernels and name not in args.kernels:
            continue
        if rec.get("status") != "ok":
            expect(False, "%s: the bench failed: %s" % (name, rec.get("error")))
            continue
        total = sum(numel(t["shape"]) for t in rec["inputs"])
        if total > args.max_elements:
            print("skip %s: %d input elements, above --max-elements %d" % (name, total, args.max_elements))
            continue
        stmts = parse_body(rec["body"])
        ins = [t["name"] for t in rec["inputs"]]
        outs = [t["name"] for t in rec["outputs"]]
        xs = [PT(t["shape"], read_raw_list(os.path.join(data_dir, t["file"]), t["dtype"], numel(t["shape"])))
              for t in rec["inputs"]]
        fn, _ = make_function(stmts, ins, outs, "ops", {"O": PyOps}, tag=name)
        t0 = time.time()
        want = fn(*xs)
        secs = time.time() - t0
        pattern = attention_pattern(stmts, ins, outs)
        for t, w in zip(rec["outputs"], want):
            n = numel(t["shape"])
            expect(tuple(w.shape) == tuple(t["shape"]), "%s.%s: shape %s" % (name, t["name"], t["shape"]))
            got = read_raw_list(os.path.join(data_dir, t["file"]), t["dtype"], n)
            err = max_rel_err_list(got, w.data)
            expect(err <= args.tolerance, "%s.%s: %s output vs this script's reference: max_rel_err %.3e (%.1f s)"
                   % (name, t["name"], rec.get("backend"), err, secs))
            if t.get("cleave_reference"):
                cref = read_raw_list(os.path.join(data_dir, t["cleave_reference"]), "f64", n)
                agree = max_rel_err_list(w.data, cref)
                expect(agree <= 1e-9, "%s.%s: this script's reference vs cleave's f64 reference: %.3e"
                       % (name, t["name"], agree))
        print("     %s: attention pattern %s" % (name, pattern))
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--manifest", help="manifest.json of cleave-gpu-bench (the check)")
    p.add_argument("--timings", help="timings.json of cleave-gpu-bench")
    p.add_argument("--out", default=".", help="where results.md and results.json go")
    p.add_argument("--budget-s", type=float, default=200.0,
                   help="wall-clock budget: torch.compile cases that would not fit are skipped")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--tolerance", type=float, default=2e-2, help="max_rel_err that passes (f16 outputs)")
    p.add_argument("--seed", type=int, default=1234, help="seed of the baselines' random inputs")
    p.add_argument("--device", default="cuda",
                   help="torch device; 'cpu' is a dry run of the whole script (no SDPA flash, CPU timings)")
    p.add_argument("--self-test", action="store_true",
                   help="no torch: unit checks, and the manifest's kernels through a pure-Python reference")
    p.add_argument("--max-elements", type=int, default=200_000_000,
                   help="self-test: skip kernels with more input elements than this")
    p.add_argument("kernels", nargs="*", help="only these kernels")
    args = p.parse_args()
    if args.self_test:
        return self_test(args)
    if not args.manifest and not args.timings:
        p.error("give --manifest and/or --timings (or --self-test)")
    return gpu_main(args)


if __name__ == "__main__":
    sys.exit(main())
