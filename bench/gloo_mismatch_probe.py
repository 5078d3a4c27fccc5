#!/usr/bin/env python
"""Probe what the real Gloo backend does when ranks issue mismatched collectives.

Every case starts ``world`` fresh worker processes (this same file with ``--worker``),
which rendezvous through a FileStore, run a warm-up barrier, then each run their own
list of ops at the same per-group sequence position. Each worker prints one JSON line
per op (``@@R``), so partial results survive a SIGABRT. The parent records, per rank:
outcome (completed / raised / aborted / killed), exception type and first message line,
the ``terminate called ... what():`` lines from stderr, values (small tensors) and time.

Usage::

    python bench/gloo_mismatch_probe.py                 # all cases, table on stdout
    python bench/gloo_mismatch_probe.py --json out.json # also write raw results
    python bench/gloo_mismatch_probe.py -k ar_numel     # only cases whose name contains it
    python bench/gloo_mismatch_probe.py --list
    python bench/gloo_mismatch_probe.py --check         # also compare with gloo_rules

Processes are started by `simdist.procs` (each in its own session; SIGKILL to every process
group when its case ends; a worker dies with the probe); ``ps`` should show nothing left.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
import tempfile
import time

from simdist.procs import LOOPBACK_IFNAME, LocalProcesses, die_with_parent

PG_TIMEOUT_S = 4.0
LINGER_S = 5.0  # a rank that raised waits this long before exiting, so peers see the mismatch itself
CASE_WALL_S = 40.0


# -------------------- Cases -------------------------------------------------------------


def AR(numel=1, dtype="float32", op="SUM", **kw):
    return dict(op="all_reduce", numel=numel, dtype=dtype, reduce_op=op, **kw)


def BC(numel=1, dtype="float32", root=0, **kw):
    return dict(op="broadcast", numel=numel, dtype=dtype, root=root, **kw)


def AG(numel=1, dtype="float32", **kw):
    return dict(op="all_gather", numel=numel, dtype=dtype, **kw)


def BAR(**kw):
    return dict(op="barrier", **kw)


IDLE = dict(op="sleep", s=8.0)  # a non-member of the sub-group stays alive meanwhile


def case(name, world, ops, group=None, followup=True, note=""):
    """ops: list (one entry per rank) of op dicts or lists of op dicts."""
    ops = [o if isinstance(o, list) else [o] for o in ops]
    assert len(ops) == world
    return dict(name=name, world=world, ops=ops, group=group, followup=followup, note=note)


def two(a, b, name, **kw):
    return case(name, 2, [a, b], **kw)


CASES = [
    # --- controls -------------------------------------------------------------------
    two(AR(1), AR(1), "ctl_ar_f32x1"),
    two(AR(4), AR(4), "ctl_ar_f32x4_mixed_values"),
    two(BAR(), BAR(), "ctl_barrier_barrier"),
    # --- all_reduce vs all_reduce: same bytes ----------------------------------------
    two(AR(2, "float32"), AR(1, "int64"), "ar_f32x2_vs_i64x1"),
    two(AR(1, "float32"), AR(1, "int32"), "ar_f32x1_vs_i32x1"),
    two(AR(4, op="SUM"), AR(4, op="MAX"), "ar_sum_vs_max_x4"),
    two(AR(1, op="SUM"), AR(1, op="MAX"), "ar_sum_vs_max_x1"),
    two(AR(4, op="SUM"), AR(4, op="AVG"), "ar_sum_vs_avg_x4"),
    # --- all_reduce vs all_reduce: different numel ------------------------------------
    two(AR(1), AR(2), "ar_numel_1_vs_2"),
    two(AR(2), AR(1), "ar_numel_2_vs_1"),
    two(AR(1), AR(4), "ar_numel_1_vs_4"),
    two(AR(4), AR(8), "ar_numel_4_vs_8"),
    two(AR(3), AR(4), "ar_numel_3_vs_4"),
    two(AR(1000), AR(1001), "ar_numel_1000_vs_1001"),
    two(AR(1 << 20), AR(1 << 21), "ar_numel_1M_vs_2M"),
    # --- all_reduce vs all_reduce: different byte size ----------------------------------
    two(AR(1, "int64"), AR(1, "float32"), "ar_i64x1_vs_f32x1"),
    two(AR(1, "float32"), AR(1, "int64"), "ar_f32x1_vs_i64x1"),
    two(AR(1, "float64"), AR(2, "float64"), "ar_f64_numel_1_vs_2"),
    # --- broadcast vs broadcast --------------------------------------------------------
    two(BC(1, root=0), BC(1, root=1), "bc_root0_vs_root1"),
    two(BC(1, root=0), BC(2, root=0), "bc_numel_root1_vs_2"),
    two(BC(2, root=0), BC(1, root=0), "bc_numel_root2_vs_1"),
    two(BC(1, "float32", root=0), BC(1, "int32", root=0), "bc_f32_vs_i32_same_bytes"),
    # --- different collective kinds ----------------------------------------------------
    two(AR(1), BC(1, root=0), "ar_vs_bc_same_bytes"),
    two(AR(1), BC(2, root=0), "ar_vs_bc_diff_bytes"),
    two(AR(1), BAR(), "ar_vs_barrier"),
    two(AR(1), AG(1), "ar_vs_allgather"),
    two(BC(1, root=0), AG(1), "bc_vs_allgather"),
    two(BAR(), BC(1, root=0), "barrier_vs_bc"),
    two(AG(1), AG(2), "ag_numel_1_vs_2"),
    two(AG(2), AG(1), "ag_numel_2_vs_1"),
    two(AG(1, "float32"), AG(1, "int32"), "ag_f32_vs_i32_same_bytes"),
    # --- world size 3 / 4 ---------------------------------------------------------------
    case("w3_ar_numel_r0_2", 3, [AR(2), AR(1), AR(1)]),
    case("w3_ar_numel_r2_2", 3, [AR(1), AR(1), AR(2)]),
    case("w3_ar_numel_r0_1_others_2", 3, [AR(1), AR(2), AR(2)]),
    case("w3_ar_numel_r2_1_others_2", 3, [AR(2), AR(2), AR(1)]),
    case("w3_ar_i64_r0", 3, [AR(1, "int64"), AR(1), AR(1)]),
    case("w3_ar_i64_r2", 3, [AR(1), AR(1), AR(1, "int64")]),
    case("w3_ar_vs_bc_r1", 3, [AR(1), BC(1, root=0), AR(1)]),
    case("w3_ar_sum_max_r1", 3, [AR(3), AR(3, op="MAX"), AR(3)]),
    case("w3_bc_numel_r2_small", 3, [BC(2), BC(2), BC(1)]),
    case("w4_ar_numel_r3_2", 4, [AR(1), AR(1), AR(1), AR(2)]),
    case("w4_ar_numel_r1_8_vs_4", 4, [AR(4), AR(8), AR(4), AR(4)]),
    case("w4_ar_vs_barrier_r2", 4, [AR(1), AR(1), BAR(), AR(1)]),
    case("w4_bc_numel_r3_small", 4, [BC(2), BC(2), BC(2), BC(1)]),
    # --- sub-groups ------------------------------------------------------------------
    case("w3_sub01_ar_numel_1_vs_2", 3, [AR(1, group=True), AR(2, group=True), IDLE],
         group=[0, 1]),
    case("w4_sub123_ar_i64_vs_f32", 4, [IDLE, AR(1, "int64", group=True), AR(1, group=True),
                                        AR(1, group=True)], group=[1, 2, 3]),
    case("w3_sub12_ar_f32x2_vs_i64", 3, [IDLE, AR(2, group=True), AR(1, "int64", group=True)],
         group=[1, 2]),
    # --- exits -----------------------------------------------------------------------
    two([dict(op="sleep", s=1.0), AR(1)], dict(op="exit_destroy"), "exit_destroy_then_peer_ar", followup=False),
    two(AR(1), [dict(op="sleep", s=1.0), dict(op="exit_destroy")], "peer_blocked_then_exit_destroy", followup=False),
    two([dict(op="sleep", s=1.0), AR(1)], dict(op="exit_nodestroy"), "exit_nodestroy_then_peer_ar", followup=False),
    two(AR(1), [dict(op="sleep", s=1.0), dict(op="exit_nodestroy")], "peer_blocked_then_exit_nodestroy",
        followup=False),
    two(AR(1), [dict(op="sleep", s=1.0), dict(op="exit_hard")], "peer_blocked_then_os_exit", followup=False),
    two([dict(op="sleep", s=1.0), BC(1, root=1)], dict(op="exit_destroy"), "exit_destroy_then_peer_bc", followup=False),
    case("w4_r3_exit_destroy_then_ar", 4,
         [[dict(op="sleep", s=1.0), AR(1)], [dict(op="sleep", s=1.0), AR(1)],
          [dict(op="sleep", s=1.0), AR(1)], dict(op="exit_destroy")], followup=False),
    # --- p2p vs collective ------------------------------------------------------------
    two(AR(1), dict(op="recv", peer=0, numel=1, dtype="float32"), "ar_vs_recv", followup=False),
    two(dict(op="send", peer=1, numel=1, dtype="float32"), AR(1), "send_vs_ar", followup=False),
]


# -------------------- Worker ------------------------------------------------------------


def _emit(rec):
    sys.stdout.write("@@R " + json.dumps(rec) + "\n")
    sys.stdout.flush()


def _values(t, small=16):
    flat = t.reshape(-1)
    if flat.numel() <= small:
        return flat.tolist()
    return {"head": flat[:3].tolist(), "tail": flat[-3:].tolist()}


def worker(spec):
    die_with_parent()
    import datetime

    import torch
    import torch.distributed as dist

    rank, world = spec["rank"], spec["world"]
    store = dist.FileStore(spec["store"], world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=spec["pg_timeout"]))
    grp = None
    if spec["group"] is not None:
        # new_group does NOT inherit init_process_group's timeout (it defaults to
        # default_pg_timeout = 30 min), so pass it explicitly.
        grp = dist.new_group(spec["group"], timeout=datetime.timedelta(seconds=spec["pg_timeout"]))
    dist.barrier()  # warm-up: all ranks start the case within a few ms of each other
    _emit({"ev": "ready", "t": time.time()})
    ops = list(spec["ops"])
    if spec["followup"] and ops and all(o["op"] in COLLECTIVE_OPS for o in ops):
        ops.append(dict(AR(1, followup=True), group=ops[0].get("group", False)))

    for i, o in enumerate(ops):
        kind = o["op"]
        if kind == "sleep":
            time.sleep(o["s"])
            continue
        if kind == "exit_destroy":
            dist.destroy_process_group()
            _emit({"ev": "exit", "how": "destroy", "t": time.time()})
            os._exit(0)
        if kind == "exit_nodestroy":
            _emit({"ev": "exit", "how": "nodestroy", "t": time.time()})
            sys.stdout.flush()
            raise SystemExit(0)  # normal interpreter shutdown, PG never destroyed
        if kind == "exit_hard":
            _emit({"ev": "exit", "how": "os_exit", "t": time.time()})
            os._exit(0)
        g = grp if o.get("group") else None
        dtype = getattr(torch, o.get("dtype", "float32"))
        n = o.get("numel", 1)
        if n <= 16:
            base = torch.arange(n, dtype=torch.float64) + 100.0 * (rank + 1)
        else:
            base = torch.full((n,), float(rank + 1), dtype=torch.float64)
        t = base.to(dtype)
        out_list = None
        t0 = time.time()
        _emit({"ev": "start", "i": i, "op": kind, "t": t0})
        rec = {"ev": "op", "i": i, "op": kind, "numel": n, "dtype": o.get("dtype"),
               "followup": bool(o.get("followup"))}
        try:
            out_list = _issue(o, t, g)
            rec.update(ok=True)
        except Exception as e:  # noqa: BLE001 - we record whatever the backend raises
            msg = str(e).strip().splitlines()
            first = re.sub(r"^\[[^\]]*\.(cc|cpp|h|hpp):\d+\]\s*", "", msg[0]) if msg else ""
            rec.update(ok=False, exc=type(e).__name__, msg=first)
        rec["dt"] = round(time.time() - t0, 3)
        if kind != "barrier":
            rec["values"] = _values(torch.cat(out_list) if out_list is not None else t)
        _emit(rec)
        if not rec["ok"]:
            time.sleep(spec["linger"])
            os._exit(3)
    time.sleep(0.3)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    _emit({"ev": "done", "t": time.time()})
    os._exit(0)


def _issue(o, t, g):
    """Issue op `o` on tensor `t` in group `g`; all_gather's output list, else None."""
    import torch
    import torch.distributed as dist

    kind = o["op"]
    if kind == "all_reduce":
        dist.all_reduce(t, op=getattr(dist.ReduceOp, o["reduce_op"]), group=g)
    elif kind == "broadcast":
        dist.broadcast(t, src=o["root"], group=g)
    elif kind == "all_gather":
        out_list = [torch.full((t.numel(),), -1, dtype=t.dtype) for _ in range(dist.get_world_size(g))]
        dist.all_gather(out_list, t, group=g)
        return out_list
    elif kind == "barrier":
        dist.barrier(group=g)
    elif kind == "recv":
        dist.recv(t, src=o["peer"])
    elif kind == "send":
        dist.send(t, dst=o["peer"])
    else:
        raise ValueError(kind)
    return None


COLLECTIVE_OPS = {"all_reduce", "broadcast", "all_gather", "barrier"}


# -------------------- Parent ------------------------------------------------------------

_WHAT = re.compile(r"what\(\):\s*(.*)")


def _short_what(line):
    m = re.search(r"\] (.*)", line)
    s = m.group(1) if m else line
    return s.split(" Received data size")[0].strip()


def run_case(c, pg_timeout=PG_TIMEOUT_S, linger=LINGER_S):
    with tempfile.TemporaryDirectory(prefix="gloo_probe_") as tmp, LocalProcesses() as procs, \
            contextlib.ExitStack() as files:
        store = os.path.join(tmp, "store")
        env = dict(os.environ, GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", LOOPBACK_IFNAME))
        for r in range(c["world"]):
            spec = dict(rank=r, world=c["world"], store=store, ops=c["ops"][r], group=c["group"],
                        followup=c["followup"], pg_timeout=pg_timeout, linger=linger)
            out = files.enter_context(open(os.path.join(tmp, f"r{r}.out"), "w"))
            err = files.enter_context(open(os.path.join(tmp, f"r{r}.err"), "w"))
            procs.start([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)], env=env,
                        stdout=out, stderr=err)
        start = time.monotonic()
        while time.monotonic() - start < CASE_WALL_S and not procs.all_ended():
            procs.poll()
            time.sleep(0.02)
        procs.poll()
        procs.close()  # SIGKILL whatever is left (and anything a rank forked), reap
        wall = time.time() - time.monotonic()  # the workers stamp their records with time.time()
        ranks = []
        for r, p in enumerate(procs.procs):
            with open(os.path.join(tmp, f"r{r}.out")) as f:
                recs = [json.loads(ln[4:]) for ln in f if ln.startswith("@@R ")]
            with open(os.path.join(tmp, f"r{r}.err")) as f:
                err_txt = f.read()
            exit_t = None if p.ended_at is None else p.ended_at + wall
            ranks.append(_summarise(r, p.returncode, exit_t, recs, err_txt))
    return dict(name=c["name"], world=c["world"], group=c["group"], ops=c["ops"], ranks=ranks)


def _summarise(r, rc, exit_t, recs, err_txt):
    ops = [x for x in recs if x["ev"] == "op"]
    starts = {x["i"]: x["t"] for x in recs if x["ev"] == "start"}
    main = [x for x in ops if not x.get("followup")]
    follow = [x for x in ops if x.get("followup")]
    what = [_short_what(m.group(1)) for m in map(_WHAT.search, err_txt.splitlines()) if m]
    term = [ln.strip() for ln in err_txt.splitlines() if ln.startswith("terminate called")]
    s = dict(rank=r, rc=rc)
    if rc is None or rc == -signal.SIGKILL:
        s["outcome"] = "killed"  # still running at the end of the case: killed by the parent
    elif rc < 0:
        s["outcome"] = "aborted"
        s["signal"] = signal.Signals(-rc).name
        s["what"] = what[0] if what else None
        s["terminate"] = term[0] if term else None
        last_start = max(starts.values()) if starts else None
        s["dt"] = round(exit_t - last_start, 3) if (exit_t and last_start) else None
        if main and main[-1]["ok"]:
            s["outcome"] = "aborted_after_ok"
    elif any(x["ev"] == "exit" for x in recs):
        s["outcome"] = "exited"
    elif main and all(x["ok"] for x in main):
        s["outcome"] = "completed"
    elif main:
        bad = next(x for x in main if not x["ok"])
        s["outcome"] = "raised"
        s["exc"] = bad["exc"]
        s["msg"] = bad["msg"]
    else:
        s["outcome"] = "no_op"
    if main:
        s["dt"] = s.get("dt") or main[-1].get("dt")
        s["values"] = main[-1].get("values")
    if follow:
        f = follow[-1]
        s["followup"] = "ok" if f["ok"] else f"{f['exc']}: {_classify_msg(f['msg'])}"
        s["followup_values"] = f.get("values")
    if s["outcome"] == "raised":
        s["kind"] = _classify_msg(s["msg"])
    if s["outcome"] == "exited":
        s["kind"] = "exited"
    return s


def _classify_msg(msg):
    if "Timed out" in msg:
        return "timeout"
    if "closed by peer" in msg:
        return "peer_closed"
    if "reset by peer" in msg:
        return "peer_reset"
    return "other"


def fmt_rank(s):
    o = s["outcome"]
    if o in ("aborted", "aborted_after_ok"):
        txt = f"ABORT({s.get('signal')}: {s.get('what')})"
    elif o == "raised":
        txt = f"{s['kind']}({s['exc']}: {s['msg'][:70]})"
    else:
        txt = o
    if s.get("dt") is not None:
        txt += f" {s['dt']:.2f}s"
    if s.get("values") is not None:
        txt += f" v={s['values']}"
    if s.get("followup"):
        txt += f" | followup={s['followup']}"
    return txt


def check_against_rule(res):
    """Compare one case's observed outcomes with simdist.engine.gloo_rules; returns a list
    of disagreements (empty when the rule predicts every rank's outcome)."""
    from simdist.engine.gloo_rules import CollectiveCall, classify_mismatch

    members = res["group"] or list(range(res["world"]))
    entries, exited = [], set()
    for gi, r in enumerate(members):
        o = [x for x in res["ops"][r] if x["op"] != "sleep"][0]
        if o["op"].startswith("exit"):
            exited.add(gi)
            continue
        entries.append(CollectiveCall(gi, o["op"], o.get("numel", 0), o.get("dtype", "float32"),
                                      o.get("reduce_op"), o.get("root", o.get("peer"))))
    v = classify_mismatch(entries, len(members), exited=exited)
    diffs = []
    for gi, r in enumerate(members):
        if gi in exited:
            continue
        s = res["ranks"][r]
        got = {"completed": "ok", "aborted": "abort", "aborted_after_ok": "abort"}.get(s["outcome"])
        if s["outcome"] == "raised":
            got = {"timeout": "hang"}.get(s["kind"], "peer_error" if s["kind"].startswith("peer") else "?")
        if got != v.rank_outcomes.get(gi):
            diffs.append(f"r{r}: observed {got}, rule says {v.rank_outcomes.get(gi)}")
    return diffs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write raw results here")
    ap.add_argument("-k", help="only run cases whose name contains this")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--check", action="store_true",
                    help="compare each case with simdist.engine.gloo_rules.classify_mismatch")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=PG_TIMEOUT_S, help="PG timeout (s)")
    a = ap.parse_args(argv)
    if a.worker:
        worker(json.loads(a.worker))
        return 0
    cases = [c for c in CASES if not a.k or a.k in c["name"]]
    if a.list:
        for c in cases:
            print(c["name"], c["world"], c["ops"])
        return 0
    import torch

    results = {"torch": torch.__version__, "pg_timeout_s": a.timeout, "cases": []}
    for c in cases:
        t0 = time.time()
        res = run_case(c, pg_timeout=a.timeout)
        res["wall"] = round(time.time() - t0, 1)
        results["cases"].append(res)
        print(f"== {c['name']} (W={c['world']}{', group=' + str(c['group']) if c['group'] else ''}) "
              f"[{res['wall']}s]", flush=True)
        for s in res["ranks"]:
            print(f"   r{s['rank']}: {fmt_rank(s)}", flush=True)
        if a.check:
            res["rule_diffs"] = check_against_rule(res)
            print("   rule: " + ("agrees" if not res["rule_diffs"] else "DIFFERS: "
                                 + "; ".join(res["rule_diffs"])), flush=True)
        if a.json:  # write incrementally so a long run can be inspected
            with open(a.json, "w") as f:
                json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
