"""The accumulator guard: a loop's running sum stays float32.

A loop variable updated by addition (``acc = acc + x`` in a ``tf.while_loop`` body) adds one
rounding error per iteration, each of the size of ``acc``, not of ``x``. In half precision,
once ``acc`` is large the addend falls below half a unit in its last place and is lost.
Measured (``tests/test_accumulator_guard.py``): a loop adding a small MatMul's result 5,000
times stopped growing at 128 in float16 where float32 reached 229.6 (guarded: 229.6); a tanh
RNN whose loss sums every step's outputs over 300 steps ended 11% low in bfloat16 (guarded:
2.4%, the rest is the bfloat16 RNN itself). The backward pass has the same shape: ``while_v2``
sums the gradient of each loop-invariant tensor (an RNN's weights) over the iterations in the
gradient loop's body, so that RNN's weight gradient was 2.6e-3 from float32's in float16 and
1.8e-2 in bfloat16 (guarded: 4.5e-4 and 3.4e-3, relative norms), and with the loss scale a
half sum can leave float16's range where float32's does not.

TensorFlow's pass paints such an ``AddV2`` half when the addend comes out of a half op (its
pass 4: an infer op fed by a half op); ``torch.autocast`` would not (float32 + float16
promotes to float32). The guard keeps the update float32. In a ``While`` body function it
costs no Cast: the loop variable is float32 either way (a body's signature does not change),
so a half sum needed the running value cast to half and the result back to float32 every
iteration; guarded, only the addend is cast up. A TF1 loop (and a functional one lowered by
inlining) has no such boundary: its loop variable (``Merge``, ``Switch``, ``NextIteration``)
would take the colour of its neighbours and round the float32 sum back to half every
iteration, so the guard keeps that chain float32 too.

Which nodes: those on a path from loop variable ``k``'s next value back to its value in the
body (in a ``While`` body function, return ``k`` and argument ``k``; in a TF1 loop, the
``NextIteration`` feeding a ``Merge`` and that ``Merge``), through sums (``Add``, ``AddV2``,
``AddN``, and ``Sub`` by its first input: ``acc + x + y``, two ``+=``, ``acc - x``), ops that
pass a value on (``Identity``, ``IdentityN``, ``Switch``, ``Reshape``, ``EnsureShape``, a
``Select``'s branches: a masked RNN state; the layout ops: slices, ``concat``, ``stack``,
``transpose``, gathers, so a sum kept in part of a stacked variable) and products by a
constant (a decay: ``0.999 * acc + x``), when at least one sum is among them. ``x - acc``
alternates rather than accumulates and is left alone. ``RewriteConfig(guard_accumulators=False)`` /
``TF_AMP_GUARD_ACCUMULATORS=0`` turns it off.

A sum under a condition (``if i % 3: acc += x``, which AutoGraph makes a ``tf.cond``) is
followed into the condition: in a ``While`` body, through an ``If`` / ``Case`` node into its
branch functions, whose nodes on the path are guarded with the loop's; in a TF1 loop, through
the condition's ``Switch`` (``_SwitchN`` for a ``Case``) and ``Merge``. Unguarded, a sum of
7,500 small products every two in three iterations stopped at 128 in float16 (16 in bfloat16)
where float32 reached 229.6. Loop variables that feed each other (``s1, s2 = s2 + x, s1``)
are a running sum too, each every other iteration: the paths among variables that form a
cycle with a sum on it are guarded.

A loop over a dataset (``for x in dataset:`` in a ``tf.function``, ``Dataset.reduce``) keeps
its state float32 whatever elementwise ops update it (an EMA with a tensor decay, a running
mean, a product, a clipped sum): TensorFlow's pass leaves such a function float32 as a whole,
and tf_amp rewrites it only so that the model it runs gets mixed precision. The allow list's
ops (a recurrent state's MatMul) stay in the target, as in any loop. Painted, an EMA of 2,000
values came out 60% low in bfloat16 (13% off in float16).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tf_amp.type_attrs import BodyView
from tf_amp.type_attrs.body_view import ARG_OP, RETVAL_OP

_SUMS = frozenset({"Add", "AddV2", "Sub", "AddN"})
# Ops that pass a value on, and which of their inputs carry it (None: output k <- input k;
# "all": every data input, as a TF1 condition's Merge takes either branch's value; "values":
# every input but the axis, last for ConcatV2 and first for Concat). A running sum kept in
# slices of a stacked variable (``concat([t[:2] + x, t[2:]])``) goes through the layout ops:
# lowered, it stopped at 9.0 in bfloat16 where float32 reached 124.3.
_CARRIERS: dict[str, tuple[int, ...] | str | None] = {
    "Identity": (0,),
    "Switch": (0,),
    "_SwitchN": (0,),  # a lowered Case's
    "Merge": "all",
    "Enter": (0,),  # into and out of a lowered inner loop
    "Exit": (0,),
    "Reshape": (0,),
    "EnsureShape": (0,),
    "Select": (1, 2),
    "SelectV2": (1, 2),
    "IdentityN": None,
    "StridedSlice": (0,),
    "Slice": (0,),
    "GatherV2": (0,),
    "Squeeze": (0,),
    "ExpandDims": (0,),
    "Transpose": (0,),
    "Unpack": (0,),
    "Split": (1,),
    "SplitV": (0,),
    "Pack": "all",
    "ConcatV2": "values",
    "Concat": "values",
    "TensorScatterUpdate": (0, 2),
    "TensorScatterAdd": (0, 2),
}
_SCALINGS = frozenset({"Mul"})  # a product by a constant (a decay)
# Function-calling conditions: the attrs naming their branch functions. Input 0 is the
# predicate or branch index; input i + 1 is the branches' argument i, output j their return j.
_CONDITIONS = {
    "If": ("then_branch", "else_branch"),
    "StatelessIf": ("then_branch", "else_branch"),
    "Case": ("branches",),
    "StatelessCase": ("branches",),
}
# Loops inside a dataset loop's body, whose state is followed into them (as into a
# condition's branches, with no predicate input: input i is the body's argument i).
_INNER_LOOPS = {"While": ("body",), "StatelessWhile": ("body",)}


@dataclass
class _Path:
    """A path from a value back to a variable: whether a sum is on it, and the nodes on it per
    body ("" for the body walked, a branch function's name for the nodes inside it)."""

    has_sum: bool = False
    nodes: dict[str, set[int]] = field(default_factory=dict)

    def join(self, other: _Path) -> None:
        self.has_sum |= other.has_sum
        for body, nodes in other.nodes.items():
            self.nodes.setdefault(body, set()).update(nodes)


# (function name, return position) -> argument position -> the path from one to the other
BranchPaths = dict[int, _Path]


class _GuardPlanner:
    """Finds the running sums of every loop of a graph, across the bodies of its library."""

    def __init__(
        self,
        views: Mapping[str, BodyView],
        dataset_loops: Mapping[str, int],
        heavy_ops: frozenset[str],
    ) -> None:
        self.views = views
        self.dataset_loops = dataset_loops
        self.heavy_ops = heavy_ops
        self.producers: dict[str, dict[int, dict[int, tuple[int, int]]]] = {}
        self.branch_paths: dict[tuple[str, int, bool], BranchPaths] = {}

    def producers_of(self, name: str) -> dict[int, dict[int, tuple[int, int]]]:
        if name not in self.producers:
            self.producers[name] = self.views[name].data_producers()
        return self.producers[name]

    def plan(self) -> dict[str, frozenset[int]]:
        guarded: dict[str, set[int]] = {}
        for name, view in self.views.items():
            for path in self.loop_paths(name, view):
                for body, nodes in path.nodes.items():
                    guarded.setdefault(body or name, set()).update(nodes)
        return {
            name: frozenset(n for n in nodes if n < self.views[name].num_real)
            for name, nodes in guarded.items()
        }

    def loop_paths(self, name: str, view: BodyView) -> list[_Path]:
        """The running sums of ``view``'s own loop variables (its returns when it is a
        ``While`` body, and its TF1 loops' ``NextIteration`` -> ``Merge`` pairs): the paths
        by which a variable's next value comes from a variable, where those form a cycle
        with a sum on it. Mostly a variable from itself (``acc + x``); also variables that
        feed each other (``s1, s2 = s2 + x, s1``: each sums every other iteration)."""
        edges: list[tuple[int, int, _Path]] = []  # (variable, the variable it comes from, path)
        if not view.is_loop_body and "NextIteration" not in view.ops:
            return []  # most bodies: no edge map is built for them
        producers = self.producers_of(name)
        state_count = self.dataset_loops.get(name)  # None: a While body, every value
        if view.is_loop_body:
            args = _args(view)[:state_count]
            position = {arg: k for k, arg in enumerate(args)}
            variables = frozenset(args)  # made once: a loop may have thousands
            every_op = state_count is not None
            for k, fed in _returned_values(view, producers):
                if k < len(args):
                    edges.extend((k, position[j], path)
                                 for j, path in self._paths_back(name, fed, variables, every_op))
        if "NextIteration" in view.ops:
            merges_fed: dict[int, list[int]] = {}  # NextIteration -> the Merge nodes it feeds
            for src, dst in zip(view.e_src, view.e_dst, strict=True):
                if view.ops[src] == "NextIteration" and view.ops[dst] == "Merge":
                    merges_fed.setdefault(src, []).append(dst)
            merges = frozenset(m for fed in merges_fed.values() for m in fed)
            for node, fed_merges in merges_fed.items():
                fed = producers.get(node, {}).get(0)
                if fed is None:
                    continue
                for merge in fed_merges:  # the loop variable stays float32 with its sum
                    for source, path in self._paths_back(name, fed, merges):
                        path.nodes.setdefault("", set()).update((node, merge))
                        edges.append((merge, source, path))
            # A lowered inner loop's variable starts from the outer one's value (its Merge's
            # Enter input): the outer sum runs through the inner loop, a cycle of the two.
            for merge in merges:
                for entry in producers.get(merge, {}).values():
                    if view.ops[entry[0]] == "NextIteration":
                        continue
                    for source, path in self._paths_back(name, entry, merges):
                        path.nodes.setdefault("", set()).add(merge)
                        edges.append((merge, source, path))
        # A dataset loop's state stays float32 whatever updates it, as TensorFlow's pass
        # leaves the whole function (see the module docstring).
        return _summing_cycles(edges, need_sum=state_count is None)

    def _paths_back(
        self, name: str, value: tuple[int, int], variables: frozenset[int], every_op: bool = False
    ) -> list[tuple[int, _Path]]:
        """(variable, the path) for each of ``variables`` that ``value`` comes from."""
        walk = _Walk(self, name, variables, every_op)
        reached = walk.reached(value)
        paths = walk.paths()
        return [(v, paths.get(v, _Path())) for v in sorted(reached)]

    def through_branch(self, function: str, ret: int, every_op: bool = False) -> BranchPaths:
        """For return ``ret`` of branch function ``function``: the arguments it carries on
        (``return x`` in the branch that does not add) or adds to, with the path to each
        (through every op, for a dataset loop's state)."""
        key = (function, ret, every_op)
        if key in self.branch_paths:
            return self.branch_paths[key]
        self.branch_paths[key] = {}  # a branch that calls itself carries nothing
        view = self.views.get(function)
        if view is None:  # not rewritten (an input pipeline's), or not in the library
            return {}
        fed = dict(_returned_values(view, self.producers_of(function))).get(ret)
        if fed is None:
            return {}
        args = _args(view)
        walk = _Walk(self, function, frozenset(args), every_op)
        walk.reached(fed)
        found = walk.paths()
        paths = {}
        for position, arg in enumerate(args):
            path = found.get(arg)
            if path is not None or fed[0] == arg:
                path = path or _Path()
                paths[position] = _Path(path.has_sum, {
                    (body or function): nodes for body, nodes in path.nodes.items()
                })
        self.branch_paths[key] = paths
        return paths


class _Walk:
    """One backward walk over a body's data edges, from a value to the ``targets`` it is
    computed from through sums, carriers, products by a constant and conditions."""

    def __init__(
        self, planner: _GuardPlanner, name: str, targets: frozenset[int], every_op: bool = False
    ) -> None:
        self.planner = planner
        self.every_op = every_op  # follow every data input of every op (a dataset loop's)
        self.view = planner.views[name]
        self.producers = planner.producers_of(name)
        self.targets = targets
        self.memo: dict[tuple[int, int], frozenset[int]] = {}
        self.visiting: set[tuple[int, int]] = set()
        # (the targets an argument's input reaches, the path inside the branch)
        self.crossings: list[tuple[frozenset[int], _Path]] = []

    def reached(self, tensor: tuple[int, int]) -> frozenset[int]:
        """The targets that ``tensor`` is computed from along the followed ops.

        A depth-first walk with its own stack, not Python's: a dataset loop's state is
        followed through every op, and a deep model in its body ran past the recursion limit.
        A tensor met again while still open (a cycle) adds nothing."""
        settled = self._settled(tensor)
        if settled is not None:
            return settled
        self.visiting.add(tensor)
        stack = [(tensor, iter(self._inputs_followed(*tensor)), set())]
        while stack:
            current, sources, found = stack[-1]
            for source in sources:
                known = self._settled(source)
                if known is not None:
                    found |= known
                    continue
                self.visiting.add(source)
                stack.append((source, iter(self._inputs_followed(*source)), set()))
                break
            else:
                stack.pop()
                self.visiting.discard(current)
                result = frozenset(found)
                self.memo[current] = result
                if stack:
                    stack[-1][2].update(result)  # every input: each path's nodes are collected
        return self.memo[tensor]

    def _settled(self, tensor: tuple[int, int]) -> frozenset[int] | None:
        """What ``tensor`` reaches when known without walking on (a target, memoized, open,
        outside the body, or a condition, walked into apart); None: walk its inputs."""
        node = tensor[0]
        if node in self.targets:
            return frozenset({node})
        if tensor in self.memo:
            return self.memo[tensor]
        if tensor in self.visiting or node >= self.view.num_real:
            return frozenset()
        op = self.view.ops[node]
        if op in _CONDITIONS or (self.every_op and op in _INNER_LOOPS):
            self.visiting.add(tensor)
            result = frozenset(self._through_condition(*tensor))
            self.visiting.discard(tensor)
            self.memo[tensor] = result
            return result
        return None

    def paths(self) -> dict[int, _Path]:
        """The path to each target reached, from what the walk has seen (one pass over it)."""
        nodes: dict[int, set[int]] = {}
        for tensor, found in self.memo.items():
            for target in found:
                nodes.setdefault(target, set()).add(tensor[0])
        paths = {
            target: _Path(any(self.view.ops[n] in _SUMS for n in on_path), {"": on_path})
            for target, on_path in nodes.items()
        }
        for found, branch in self.crossings:
            for target in found:
                paths.setdefault(target, _Path()).join(branch)
        return paths

    def _inputs_followed(self, node: int, port: int) -> list[tuple[int, int]]:
        op = self.view.ops[node]
        fed = self.producers.get(node, {})
        if self.every_op:  # a dataset loop's state: every op but the model's heavy ones
            return [] if op in self.planner.heavy_ops else list(fed.values())
        if op == "Sub":  # acc - x accumulates; x - acc does not (it alternates)
            return [fed[0]] if 0 in fed else []
        if op in _SUMS:
            return list(fed.values())
        if op in _CARRIERS:
            ports = _CARRIERS[op]
            if ports == "all":
                return list(fed.values())
            if ports == "values":
                axis = max(fed) if op == "ConcatV2" else 0
                return [source for p, source in fed.items() if p != axis]
            wanted = (port,) if ports is None else ports
            return [fed[p] for p in wanted if p in fed]
        if op in _SCALINGS:
            values = list(fed.values())
            if any(self.view.ops[src] == "Const" for src, _ in values):
                return [v for v in values if self.view.ops[v[0]] != "Const"]
        return []

    def _through_condition(self, node: int, port: int) -> set[int]:
        """Output ``port`` of a condition comes from argument i of a branch: follow input
        i + 1 for every i that some branch carries on to that output."""
        fed = self.producers.get(node, {})
        per_argument: dict[int, list[_Path]] = {}
        for branch in _branch_names(self.view, node):
            paths_in = self.planner.through_branch(branch, port, self.every_op)
            for position, path in paths_in.items():
                per_argument.setdefault(position, []).append(path)
        first_argument = 0 if self.view.ops[node] in _INNER_LOOPS else 1  # after the predicate
        found: set[int] = set()
        for position, paths in per_argument.items():
            source = fed.get(position + first_argument)
            if source is None:
                continue
            reached = self.reached(source)
            found |= reached
            if reached:
                for path in paths:
                    self.crossings.append((reached, path))
        return found


def _summing_cycles(edges: list[tuple[int, int, _Path]], need_sum: bool = True) -> list[_Path]:
    """The paths among ``edges`` (variable <- variable it comes from) that lie on a cycle of
    variables (a strongly connected set, or a variable from itself) with a sum on it (any
    cycle when not ``need_sum``)."""
    comes_from: dict[int, set[int]] = {}
    for k, j, _ in edges:
        comes_from.setdefault(k, set()).add(j)

    def upstream(start: int) -> set[int]:
        seen, stack = set(), [start]
        while stack:
            for j in comes_from.get(stack.pop(), ()):
                if j not in seen:
                    seen.add(j)
                    stack.append(j)
        return seen

    reach = {k: upstream(k) for k in comes_from}
    component = {k: frozenset(j for j in reach[k] if k in reach.get(j, ())) for k in reach}
    cyclic = [(k, j, path) for k, j, path in edges if k in reach.get(j, ())]
    summing = {component[k] for k, _, path in cyclic if path.has_sum or not need_sum}
    return [path for k, _, path in cyclic if component[k] in summing]


def _args(view: BodyView) -> list[int]:
    return [n for n in range(view.num_real, len(view.names)) if view.ops[n] == ARG_OP]


def _returned_values(
    view: BodyView, producers: dict[int, dict[int, tuple[int, int]]]
) -> list[tuple[int, tuple[int, int]]]:
    """(return position, the value returned) for each return of a function body."""
    rets = [n for n in range(view.num_real, len(view.names)) if view.ops[n] == RETVAL_OP]
    found = []
    for ret, key in zip(rets, view.ret_keys, strict=True):
        fed = producers.get(ret, {}).get(0)
        if fed is not None and key in view.ret_positions:
            found.append((view.ret_positions[key], fed))
    return found


def _branch_names(view: BodyView, node: int) -> list[str]:
    attrs = view.protos[node].attr
    names = []
    for attr in {**_CONDITIONS, **_INNER_LOOPS}[view.ops[node]]:
        value = attrs.get(attr)
        if value is None:
            continue
        if value.HasField("func"):
            names.append(value.func.name)
        else:
            names.extend(f.name for f in value.list.func)
    return names


def accumulator_guard_plan(
    views: Mapping[str, BodyView],
    dataset_loops: Mapping[str, int] | None = None,
    heavy_ops: frozenset[str] = frozenset(),
) -> dict[str, frozenset[int]]:
    """The nodes the guard keeps float32, per body ("" for the main graph, else a library
    function's name): the running sums of every ``While`` body (``view.is_loop_body``) and
    of every TF1 loop, with their parts inside the branch functions of conditions on the way,
    and the running state of every dataset loop (``dataset_loops``: its body's name -> the
    number of state values it takes and returns first), up to the ``heavy_ops`` (the allow
    list: a recurrent state's MatMul stays in the target). See the module docstring."""
    return _GuardPlanner(views, dataset_loops or {}, heavy_ops).plan()
