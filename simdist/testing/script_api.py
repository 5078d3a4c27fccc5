"""The sweep generator's families for torch.distributed's Gloo API surface beyond the
common collectives (`simdist.testing.scripts`): list and split-size all_to_all, list
reduce_scatter, gather/scatter and their object forms, batch_isend_irecv, any-source and
tagged receives, monitored_barrier, coalescing, bitwise and refused reductions, complex and
bool tensors, views, group-rank arguments, object p2p, and async works waited out of order.
Each family writes one operation (or a few that belong together) with its result printed;
`api_op` draws one. Ops on the subgroup (`group_ranks`, `group_src_dst`) fall back to the
world's where the script has none."""

from __future__ import annotations

from simdist.testing.script_parts import DTYPES, FLOAT_DTYPES, ScriptCtx, tensor_expr

# The families, drawn from a generator of their own (`ScriptCtx.api`) so that the draws of
# the families before them stay as they were.
API_OPS = ("all_to_all", "all_to_all_uneven", "reduce_scatter", "gather", "scatter", "gather_object",
           "scatter_object_list", "batch_isend_irecv", "recv_any_source", "send_tags", "monitored_barrier",
           "coalescing_manager", "bitwise", "gloo_refuses", "complex_bool", "non_contiguous", "group_ranks",
           "group_src_dst", "wait_reordered", "object_p2p", "coalesced_lists")

INT_DTYPES = ("int64", "int32", "uint8", "int8")
BITWISE_OPS = ("BAND", "BOR", "BXOR")
# Reductions Gloo refuses, each with the dtype it refuses it for: caught and named by the script
REFUSED = (("AVG", "int64"), ("AVG", "int32"), ("BAND", "float32"), ("BXOR", "float64"),
           ("MAX", "complex64"), ("PRODUCT", "complex128"), ("premul", "float32"))


def api_op(ctx: ScriptCtx) -> list[str]:
    """One family of `API_OPS`, drawn from `ctx.api`."""
    op = ctx.api.choice(API_OPS)
    ctx.features.add(op)
    return _API_FAMILIES[op](ctx, ctx.var("y"))


def _dtype_n(ctx: ScriptCtx, dtypes: tuple[str, ...] = DTYPES) -> tuple[str, int]:
    return ctx.api.choice(dtypes), ctx.api.choice([1, 2, 3, 7, 64])


def _all_to_all(ctx: ScriptCtx, t: str) -> list[str]:
    """The list form: one tensor to and from each rank."""
    dtype, n = _dtype_n(ctx)
    return [f"{t}_in = [torch.full(({n},), 10 * rank + k + step, dtype=torch.{dtype}) for k in range(world)]",
            f"{t} = [torch.zeros({n}, dtype=torch.{dtype}) for _ in range(world)]",
            f"dist.all_to_all({t}, {t}_in)", f'show(rank, step, "all_to_all list", torch.stack({t}))']


def _all_to_all_uneven(ctx: ScriptCtx, t: str) -> list[str]:
    """all_to_all_single with split sizes: rank r sends (r + k) % 3 + 1 elements to rank k."""
    dtype = ctx.api.choice(DTYPES)
    return [f"{t}_splits = [(rank + k) % 3 + 1 for k in range(world)]",
            f"{t}_in = torch.arange(sum({t}_splits), dtype=torch.{dtype}) + 20 * rank + step",
            f"{t} = torch.zeros(sum({t}_splits), dtype=torch.{dtype})",
            f"dist.all_to_all_single({t}, {t}_in, {t}_splits, {t}_splits)",
            f'show(rank, step, "all_to_all uneven", {t})']


def _reduce_scatter(ctx: ScriptCtx, t: str) -> list[str]:
    """The list form (Gloo runs it as one all_reduce per input)."""
    dtype, n = _dtype_n(ctx)
    red = ctx.api.choice(["SUM", "MAX", "MIN"])
    return [f"{t}_in = [torch.arange({n}, dtype=torch.{dtype}) * (rank + 1) + k + step for k in range(world)]",
            f"{t} = torch.zeros({n}, dtype=torch.{dtype})",
            f"dist.reduce_scatter({t}, {t}_in, op=dist.ReduceOp.{red})", f'show(rank, step, "reduce_scatter list", {t})']


def _gather(ctx: ScriptCtx, t: str) -> list[str]:
    dtype, n = _dtype_n(ctx)
    root = ctx.api.randrange(ctx.world)
    return [f"{t} = [torch.zeros({n}, dtype=torch.{dtype}) for _ in range(world)] if rank == {root} else None",
            f"dist.gather({tensor_expr(ctx, dtype, n, 'rank + step')}, {t}, dst={root})",
            f'show(rank, step, "gather", torch.stack({t}) if {t} else torch.zeros(0))']


def _scatter(ctx: ScriptCtx, t: str) -> list[str]:
    dtype, n = _dtype_n(ctx)
    root = ctx.api.randrange(ctx.world)
    return [f"{t}_in = [torch.arange({n}, dtype=torch.{dtype}) + 10 * k + step for k in range(world)]",
            f"{t} = torch.zeros({n}, dtype=torch.{dtype})",
            f"dist.scatter({t}, {t}_in if rank == {root} else None, src={root})", f'show(rank, step, "scatter", {t})']


def _gather_object(ctx: ScriptCtx, t: str) -> list[str]:
    root = ctx.api.randrange(ctx.world)
    return [f"{t} = [None] * world if rank == {root} else None",
            f'dist.gather_object({{"rank": rank, "step": step, "name": "r" * rank}}, {t}, dst={root})',
            f'print(f"[{{rank}}] step {{step}} gather_object {{{t}}}", flush=True)']


def _scatter_object_list(ctx: ScriptCtx, t: str) -> list[str]:
    root = ctx.api.randrange(ctx.world)
    return [f"{t} = [None]",
            f'dist.scatter_object_list({t}, [{{"to": k, "step": step}} for k in range(world)] if rank == {root} '
            f"else None, src={root})",
            f'print(f"[{{rank}}] step {{step}} scatter_object_list {{{t}}}", flush=True)']


def _batch_isend_irecv(ctx: ScriptCtx, t: str) -> list[str]:
    """A ring exchange: each rank sends to the next and receives from the previous (the
    P2POps in either order)."""
    dtype, n = _dtype_n(ctx)
    ops = [f"dist.P2POp(dist.isend, {t}_out, (rank + 1) % world)", f"dist.P2POp(dist.irecv, {t}, (rank - 1) % world)"]
    ctx.api.shuffle(ops)
    return [f"{t}_out = {tensor_expr(ctx, dtype, n, '10 * rank + step')}", f"{t} = torch.zeros({n}, dtype=torch.{dtype})",
            f"for w in dist.batch_isend_irecv([{', '.join(ops)}]):", "    w.wait()",
            f'show(rank, step, "batch_isend_irecv", {t})']


def _recv_any_source(ctx: ScriptCtx, t: str) -> list[str]:
    """`dist.recv` with no `src` (which returns the sender): one sender, or two told apart
    by their tags (the receiver asks for the second sender's tag first)."""
    dtype, n = _dtype_n(ctx, FLOAT_DTYPES)
    senders = ctx.api.sample(range(ctx.world), 3 if ctx.world >= 3 and ctx.api.random() < 0.5 else 2)
    dst, srcs = senders[0], senders[1:]
    lines = []
    for k, a in enumerate(srcs):
        lines += [f"{'if' if k == 0 else 'elif'} rank == {a}:",
                  f"    dist.send({tensor_expr(ctx, dtype, n, f'{k + 1} * step + {a}')}, dst={dst}, tag={k + 1})"]
    lines += [f"elif rank == {dst}:"]
    for k in reversed(range(len(srcs))):
        lines += [f"    {t} = torch.zeros({n}, dtype=torch.{dtype})", f"    {t}_src = dist.recv({t}, tag={k + 1})",
                  f'    show(rank, step, f"recv from {{{t}_src}}", {t})']
    return lines


def _send_tags(ctx: ScriptCtx, t: str) -> list[str]:
    """Two isends with different tags, received in the other order."""
    a, b = ctx.api.sample(range(ctx.world), 2)
    dtype = ctx.api.choice(DTYPES)
    return [f"if rank == {a}:", f"    {t}_a = dist.isend({tensor_expr(ctx, dtype, 2, 'step + 1')}, dst={b}, tag=3)",
            f"    {t}_b = dist.isend({tensor_expr(ctx, dtype, 3, 'step + 5')}, dst={b}, tag=5)",
            f"    {t}_a.wait()", f"    {t}_b.wait()", f"elif rank == {b}:",
            f"    {t}_b = torch.zeros(3, dtype=torch.{dtype})", f"    dist.recv({t}_b, src={a}, tag=5)",
            f"    {t}_a = torch.zeros(2, dtype=torch.{dtype})", f"    dist.recv({t}_a, src={a}, tag=3)",
            f'    show(rank, step, "tagged", torch.cat([{t}_a, {t}_b]))']


def _monitored_barrier(ctx: ScriptCtx, t: str) -> list[str]:
    every = ctx.api.random() < 0.5
    return [f"dist.monitored_barrier(timeout=datetime.timedelta(seconds=1){', wait_all_ranks=True' if every else ''})",
            'print(f"[{rank}] step {step} monitored_barrier", flush=True)']


def _coalescing_manager(ctx: ScriptCtx, t: str) -> list[str]:
    """all_reduces or all_gather_into_tensors issued under `_coalescing_manager` (one
    coalesced op on Gloo), waited together."""
    dtype = ctx.api.choice(DTYPES)
    sizes = [ctx.api.choice([1, 2, 5]) for _ in range(ctx.api.randint(1, 3))]
    gather = ctx.api.random() < 0.4
    lines = [f"{t} = [torch.arange(n, dtype=torch.{dtype}) + rank + step for n in {sizes}]"]
    if gather:
        lines.append(f"{t}_out = [torch.zeros(world * n, dtype=torch.{dtype}) for n in {sizes}]")
    lines.append(f"with dist._coalescing_manager(async_ops=True) as {t}_cm:")
    lines.append(f"    for k in range({len(sizes)}):")
    lines.append(f"        dist.all_gather_into_tensor({t}_out[k], {t}[k])" if gather else
                 f"        dist.all_reduce({t}[k])")
    lines.append(f"{t}_cm.wait()")
    lines.append(f'show(rank, step, "coalesced", torch.cat({t}_out if {gather} else {t}))')
    return lines


def _bitwise(ctx: ScriptCtx, t: str) -> list[str]:
    dtype, n = _dtype_n(ctx, INT_DTYPES + ("bool",))
    red = ctx.api.choice(BITWISE_OPS)
    value = "(torch.arange({n}) + rank) % 2 == 0" if dtype == "bool" else \
        f"(torch.arange({n}) * 3 + rank * 5 + step).to(torch.{dtype})"
    return [f"{t} = {value.format(n=n)}", f"dist.all_reduce({t}, op=dist.ReduceOp.{red})",
            f'show(rank, step, "all_reduce {red.lower()}", {t})']


def _gloo_refuses(ctx: ScriptCtx, t: str) -> list[str]:
    """A reduction Gloo refuses (integer AVG, a bitwise op on floats, MAX of complex, PREMUL_SUM),
    caught: the script prints the exception's type and what the tensor holds after, and goes on."""
    red, dtype = ctx.api.choice(REFUSED)
    op = "dist._make_nccl_premul_sum(2.0)" if red == "premul" else f"dist.ReduceOp.{red}"
    how = ctx.api.choice(["all_reduce", "reduce", "async"])
    call = {"all_reduce": f"dist.all_reduce({t}, op={op})",
            "reduce": f"dist.reduce({t}, dst={ctx.api.randrange(ctx.world)}, op={op})",
            "async": f"dist.all_reduce({t}, op={op}, async_op=True).wait()"}[how]
    return [f"{t} = (torch.arange(3) + rank + step).to(torch.{dtype})", "try:", f"    {call}",
            f'    print(f"[{{rank}}] step {{step}} {red} of {dtype} ran: {{{t}.tolist()}}", flush=True)',
            "except (RuntimeError, ValueError) as e:",
            f'    print(f"[{{rank}}] step {{step}} {red} of {dtype} refused: {{type(e).__name__}} {{{t}.tolist()}}",'
            ' flush=True)']


def _complex_bool(ctx: ScriptCtx, t: str) -> list[str]:
    """A complex or bool tensor all-reduced, broadcast or all-gathered."""
    dtype = ctx.api.choice(["complex64", "complex128", "bool"])
    n = ctx.api.choice([1, 2, 5])
    value = f"(torch.arange({n}) + rank) % 3 == 0" if dtype == "bool" else \
        f"torch.complex(torch.arange({n}.0) + rank, torch.full(({n},), step - rank * 1.0)).to(torch.{dtype})"
    how = ctx.api.choice(["all_reduce", "broadcast", "all_gather"])
    if how == "all_gather":
        return [f"{t}_in = {value}", f"{t} = [torch.zeros({n}, dtype=torch.{dtype}) for _ in range(world)]",
                f"dist.all_gather({t}, {t}_in)",
                f'print(f"[{{rank}}] step {{step}} all_gather {dtype} {{torch.stack({t}).tolist()}}", flush=True)']
    call = f"dist.broadcast({t}, src={ctx.api.randrange(ctx.world)})" if how == "broadcast" else \
        f"dist.all_reduce({t}, op=dist.ReduceOp.{ctx.api.choice(['SUM', 'SUM', 'MAX'] if dtype == 'bool' else ['SUM'])})"
    return [f"{t} = {value}", call, f'print(f"[{{rank}}] step {{step}} {how} {dtype} {{{t}.tolist()}}", flush=True)']


def _non_contiguous(ctx: ScriptCtx, t: str) -> list[str]:
    """A transposed or strided view handed to a collective (Gloo works on its memory)."""
    dtype = ctx.api.choice(FLOAT_DTYPES + ("int64",))
    n = ctx.api.choice([2, 3, 4])
    base = f"(torch.arange(2 * {n}, dtype=torch.{dtype}) + rank + step)"
    view = ctx.api.choice([f"{base}.reshape(2, {n}).t()", f"{base}[::2]"])
    how = ctx.api.choice(["all_reduce", "broadcast", "reduce", "all_gather"])
    lines = [f"{t} = {view}"]
    if how == "all_gather":
        return lines + [f"{t}_out = [torch.zeros_like({t}) for _ in range(world)]", f"dist.all_gather({t}_out, {t})",
                        f'show(rank, step, "all_gather of a view", torch.stack({t}_out))']
    call = {"all_reduce": f"dist.all_reduce({t})", "broadcast": f"dist.broadcast({t}, src={ctx.api.randrange(ctx.world)})",
            "reduce": f"dist.reduce({t}, dst={ctx.api.randrange(ctx.world)})"}[how]
    return lines + [call, f'show(rank, step, "{how} of a view", {t})']


def _group_ranks(ctx: ScriptCtx, t: str) -> list[str]:
    """What the group translation functions say, on the subgroup (or the world)."""
    members = ctx.members or list(range(ctx.world))
    group = "sub" if ctx.members else "dist.group.WORLD"
    line = (f"print(f\"[{{rank}}] step {{step}} group {{dist.get_process_group_ranks({group})}} "
            f"{{dist.get_global_rank({group}, {len(members) - 1})}} {{dist.get_group_rank({group}, {members[0]})}} "
            f"{{dist.get_rank({group})}} {{dist.get_world_size({group})}}\", flush=True)")
    return [f"if rank in {members}:", "    " + line] if ctx.members else [line]


def _group_src_dst(ctx: ScriptCtx, t: str) -> list[str]:
    """Rooted ops and p2p on the subgroup named by group ranks (`group_src`, `group_dst`)."""
    members = ctx.members or list(range(ctx.world))
    group = "sub" if ctx.members else "dist.group.WORLD"
    dtype, n = _dtype_n(ctx, FLOAT_DTYPES + ("int64",))
    k = len(members)
    root, a, b = ctx.api.randrange(k), *ctx.api.sample(range(k), 2)
    how = ctx.api.choice(["broadcast", "reduce", "p2p", "gather", "scatter", "broadcast_object_list"])
    body = {"broadcast": [f"dist.broadcast({t}, group={group}, group_src={root})"],
            "reduce": [f"dist.reduce({t}, group={group}, group_dst={root})"],
            "p2p": [f"if dist.get_rank({group}) == {a}:", f"    dist.send({t}, group={group}, group_dst={b})",
                    f"elif dist.get_rank({group}) == {b}:", f"    dist.recv({t}, group={group}, group_src={a})"],
            "gather": [f"{t}_all = [torch.zeros_like({t}) for _ in range({k})] if dist.get_rank({group}) == {root} "
                       "else None", f"dist.gather({t}, {t}_all, group={group}, group_dst={root})",
                       f"{t} = torch.cat({t}_all) if {t}_all else {t}"],
            "scatter": [f"{t}_all = [{t} + 100 * j for j in range({k})] if dist.get_rank({group}) == {root} else None",
                        f"dist.scatter({t}, {t}_all, group={group}, group_src={root})"],
            "broadcast_object_list": [f"{t}_obj = [{t}.tolist()]",
                                      f"dist.broadcast_object_list({t}_obj, group={group}, group_src={root})",
                                      f"{t} = torch.tensor({t}_obj[0])"]}[how]
    return [f"if rank in {members}:", f"    {t} = {tensor_expr(ctx, dtype, n, '10 * rank + step')}",
            *("    " + x for x in body), f'    show(rank, step, "{how} by group rank", {t})']


def _object_p2p(ctx: ScriptCtx, t: str) -> list[str]:
    """send_object_list / recv_object_list between two ranks."""
    a, b = ctx.api.sample(range(ctx.world), 2)
    return [f"{t} = [{{\"from\": rank, \"step\": step}}, \"x\" * (step + 1)] if rank == {a} else [None, None]",
            f"if rank == {a}:", f"    dist.send_object_list({t}, dst={b})", f"elif rank == {b}:",
            f"    dist.recv_object_list({t}, src={a})",
            f'    print(f"[{{rank}}] step {{step}} recv_object_list {{{t}}}", flush=True)']


def _coalesced_lists(ctx: ScriptCtx, t: str) -> list[str]:
    """The deprecated list forms: all_reduce_coalesced and all_gather_coalesced."""
    dtype = ctx.api.choice(FLOAT_DTYPES + ("int64",))
    sizes = [ctx.api.choice([1, 2, 3]) for _ in range(ctx.api.randint(1, 3))]
    lines = [f"{t} = [torch.arange(n, dtype=torch.{dtype}) + rank + step for n in {sizes}]"]
    if ctx.api.random() < 0.5:
        return lines + [f"dist.all_reduce_coalesced({t})", f'show(rank, step, "all_reduce_coalesced", torch.cat({t}))']
    return lines + [f"{t}_out = [[torch.zeros(n, dtype=torch.{dtype}) for n in {sizes}] for _ in range(world)]",
                    f"dist.all_gather_coalesced({t}_out, {t})",
                    f'show(rank, step, "all_gather_coalesced", torch.cat([x for r in {t}_out for x in r]))']


def _wait_reordered(ctx: ScriptCtx, t: str) -> list[str]:
    """Two or three async collectives, waited in another order than they were issued."""
    ops = [ctx.api.choice(["all_reduce", "broadcast", "all_gather_into_tensor"]) for _ in range(ctx.api.randint(2, 3))]
    issue, waits = [], []
    for k, op in enumerate(ops):
        dtype, n, x = *_dtype_n(ctx, FLOAT_DTYPES + ("int64",)), f"{t}_{k}"
        call = {"all_reduce": f"dist.all_reduce({x}, async_op=True)",
                "broadcast": f"dist.broadcast({x}, src={ctx.api.randrange(ctx.world)}, async_op=True)",
                "all_gather_into_tensor": f"dist.all_gather_into_tensor({x}_out, {x}, async_op=True)"}[op]
        issue += [f"{x} = {tensor_expr(ctx, dtype, n, f'rank + {k} + step')}"]
        if op == "all_gather_into_tensor":
            issue += [f"{x}_out = torch.zeros(world * {n}, dtype=torch.{dtype})"]
        issue += [f"{x}_work = {call}"]
        shown = f"{x}_out" if op == "all_gather_into_tensor" else x
        waits.append([f"{x}_work.wait()", f'show(rank, step, "{op} waited #{k}", {shown})'])
    order = list(range(len(ops)))
    while order == sorted(order):
        ctx.api.shuffle(order)
    return issue + [line for k in order for line in waits[k]]


_API_FAMILIES = {
    "all_to_all": _all_to_all, "all_to_all_uneven": _all_to_all_uneven, "reduce_scatter": _reduce_scatter,
    "gather": _gather, "scatter": _scatter, "gather_object": _gather_object, "scatter_object_list": _scatter_object_list,
    "batch_isend_irecv": _batch_isend_irecv, "recv_any_source": _recv_any_source, "send_tags": _send_tags,
    "monitored_barrier": _monitored_barrier, "coalescing_manager": _coalescing_manager, "bitwise": _bitwise,
    "gloo_refuses": _gloo_refuses, "complex_bool": _complex_bool, "non_contiguous": _non_contiguous,
    "group_ranks": _group_ranks, "group_src_dst": _group_src_dst, "wait_reordered": _wait_reordered,
    "object_p2p": _object_p2p, "coalesced_lists": _coalesced_lists,
}
