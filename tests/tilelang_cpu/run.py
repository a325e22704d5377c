"""Runs a TileLang module cleave emitted on the CPU stand-in of `tilelang.language`.

    python3 run.py MODULE.py JOB.txt OUT.txt

JOB.txt, one item per line:
    dim NAME EXTENT                          the extent of a `T.symbolic` dim
    buffer KEY DTYPE [EXTENT ...] : [VALUE ...]  a tensor; no values: NaN (outputs, workspaces)
    kernel SYMBOL KEY ...                    a prim_func, run with these buffers in order
    output KEY                               a buffer to write out after the last kernel
OUT.txt gets `KEY VALUE ...` per output. Errors (an index past a tile, mismatched shapes) go
to stderr with a non-zero exit.
"""

import ast
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tilelang.language as T  # noqa: E402


class Lower(ast.NodeTransformer):
    """`with T.Kernel(..) as (bx, ..)` → a loop over the grid; `T.if_then_else(c, a, b)` → `a if
    c else b` (TileLang evaluates one branch); `a / b` → `T.div(a, b)` (IEEE); allocations get
    their variable's name for error messages."""

    @staticmethod
    def is_call(node, name):
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "T"
            and node.func.attr == name
        )

    def visit_With(self, node):
        self.generic_visit(node)
        if len(node.items) == 1 and self.is_call(node.items[0].context_expr, "Kernel"):
            item = node.items[0]
            target = item.optional_vars
            if target is None:
                target = ast.Name(id="_block", ctx=ast.Store())
            loop = ast.For(target=target, iter=item.context_expr, body=node.body, orelse=[])
            return ast.copy_location(loop, node)
        return node

    def visit_Call(self, node):
        self.generic_visit(node)
        if self.is_call(node, "if_then_else"):
            if len(node.args) != 3:
                raise SyntaxError("T.if_then_else takes three arguments")
            c, a, b = node.args
            return ast.copy_location(ast.IfExp(test=c, body=a, orelse=b), node)
        return node

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.Div):
            call = ast.Call(
                func=ast.Attribute(value=ast.Name(id="T", ctx=ast.Load()), attr="div", ctx=ast.Load()),
                args=[node.left, node.right],
                keywords=[],
            )
            return ast.copy_location(call, node)
        return node

    def visit_Assign(self, node):
        self.generic_visit(node)
        v = node.value
        if (
            len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and (self.is_call(v, "alloc_shared") or self.is_call(v, "alloc_fragment"))
        ):
            v.args.append(ast.Constant(value=node.targets[0].id))
        return node


def parse_job(path):
    dims, buffers, kernels, outputs = {}, {}, [], []
    with open(path) as f:
        for line in f:
            words = line.split()
            if not words:
                continue
            if words[0] == "dim":
                dims[words[1]] = int(words[2])
            elif words[0] == "buffer":
                colon = words.index(":")
                key, dtype = words[1], words[2]
                shape = [int(w) for w in words[3:colon]]
                values = [float(w) for w in words[colon + 1 :]] or None
                buffers[key] = T.Buffer(key, shape, dtype, "global", values)
            elif words[0] == "kernel":
                kernels.append((words[1], words[2:]))
            elif words[0] == "output":
                outputs.append(words[1])
            else:
                raise ValueError(f"{path}: unknown line {line!r}")
    return dims, buffers, kernels, outputs


def main():
    module_path, job_path, out_path = sys.argv[1:4]
    dims, buffers, kernels, outputs = parse_job(job_path)
    T.DIMS.clear()
    T.DIMS.update(dims)
    with open(module_path) as f:
        tree = ast.parse(f.read(), module_path)
    tree = ast.fix_missing_locations(Lower().visit(tree))
    scope = {"__name__": "cleave_tilelang_module"}
    exec(compile(tree, module_path, "exec"), scope)
    for symbol, keys in kernels:
        func = scope[symbol]
        try:
            func(*[buffers[k] for k in keys])
        except T.ShimError as e:
            sys.exit(f"{symbol}: {e}")
    with open(out_path, "w") as f:
        for key in outputs:
            f.write(key + " " + " ".join(repr(x) for x in buffers[key].data) + "\n")


if __name__ == "__main__":
    main()
