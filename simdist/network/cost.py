"""The communication cost model the engine calls.

    cm = CostModel.from_scenario_topology(scenario.topology, scenario.world_size)
    cm.collective_time("all_reduce", nbytes, ranks)      # seconds, no contention
    cm.p2p_time(nbytes, src, dst)

Where the time comes from:
  * a calibrated profile (`simdist.network.profile.Profile`, e.g. from
    ``simdist compare-timing --save-profile``) for the (op, world size) it was measured
    on, when given: the piecewise Gloo model;
  * otherwise the algorithm's closed form T = ca*alpha + n*(kb*beta + kg*gamma) when the
    network is uniform (every pair of ranks costs the same: loopback, switch8, or
    alpha/beta given in the scenario), cached per (op, algo, p);
  * otherwise (two_nodes, ring, custom graphs) the schedule executed step by step with
    per-pair route costs, without contention, cached per call signature.

Algorithms: ``algo`` argument > scenario ``topology.algorithms[op]`` > "auto", which
picks the smallest predicted time, as NCCL's tuner does.

`nbytes` is the per-rank input (all_gather and gather: each rank's contribution; scatter:
the root's whole buffer).
"""

from __future__ import annotations

import numpy as np

from simdist.collectives.algorithms import REGISTRY, algorithms_for, make_schedule, resolve
from simdist.collectives.execute import schedule_time
from simdist.errors import ScenarioError
from simdist.network.profile import Profile, load_profile
from simdist.network.topology import Network, cached_preset, scenario_network, uniform_network


class CostModel:
    def __init__(
        self,
        network: Network,
        alpha: float | None = None,
        beta: float | None = None,
        gamma: float | None = None,
        algorithms: dict[str, str] | None = None,
        profile: Profile | None = None,
    ):
        self.network = network
        self.world_size = network.world_size
        self.gamma = network.gamma if gamma is None else float(gamma)
        self.network.gamma = self.gamma
        if alpha is not None or beta is not None:
            a0, b0 = network.uniform_params()
            self.alpha = a0 if alpha is None else float(alpha)
            self.beta = b0 if beta is None else float(beta)
            self.uniform = True
            # A network that realises these parameters, for the contention executor.
            self.network = uniform_network(network.world_size, self.alpha, self.beta, self.gamma)
        else:
            self.uniform = network.is_uniform()
            self.alpha, self.beta = network.uniform_params()
        self.algorithms: dict[str, str | None] = {}
        for op, algo in (algorithms or {}).items():
            self.algorithms[op] = resolve(op, algo, f"topology.algorithms.{op}")
        self.profile = profile
        # With measured Gloo primitives the engine runs a group's collectives one after another
        # (Engine._schedule_finish): each is timed alone, and they share the group's sockets.
        self.queued = profile is not None and profile.host is not None
        self._closed: dict[tuple[str, str, int], tuple[float, float]] = {}
        self._auto: dict[tuple[str, int, int], str] = {}
        self._sched_cache: dict[tuple, float] = {}

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_scenario_topology(cls, topo, world_size: int, profile: Profile | None = None) -> CostModel:
        if world_size < 1:
            raise ScenarioError(f"world_size: must be >= 1, got {world_size}")
        if topo.preset is not None:
            net = cached_preset(topo.preset, world_size).shared_copy()
        else:
            net = scenario_network(topo, world_size)
        # An optional `topology.profile` (path to a calibrated profile JSON written by
        # `simdist compare-timing --save-profile`), if the scenario model has that field.
        prof_path = getattr(topo, "profile", None)
        if profile is None and prof_path:
            profile = load_profile(prof_path)  # a one-line ScenarioError naming topology.profile
        return cls(
            net, alpha=topo.alpha, beta=topo.beta, gamma=topo.gamma, algorithms=dict(topo.algorithms), profile=profile
        )

    @classmethod
    def from_params(cls, world_size: int, alpha: float, beta: float, gamma: float, **kw) -> CostModel:
        return cls(uniform_network(world_size, alpha, beta, gamma), alpha=alpha, beta=beta, gamma=gamma, **kw)

    # ------------------------------------------------------------------ queries
    def closed_form(self, op: str, algo: str, p: int) -> tuple[float, float]:
        """(fixed seconds, seconds per byte) of the closed form on the uniform params."""
        key = (op, algo, p)
        v = self._closed.get(key)
        if v is None:
            ca, kb, kg = REGISTRY[(op, algo)].coeffs(p)
            v = (ca * self.alpha, kb * self.beta + kg * self.gamma)
            self._closed[key] = v
        return v

    def choose(self, op: str, nbytes: int, p: int) -> str:
        """The algorithm for this call: the scenario's choice, else the fastest predicted."""
        fixed = self.algorithms.get(op)
        if fixed is not None:
            return fixed
        key = (op, int(nbytes), p)
        a = self._auto.get(key)
        if a is None:
            a = min(algorithms_for(op), key=lambda name: (self._predict(op, name, nbytes, list(range(p)), None), name))
            if len(self._auto) > 200_000:
                self._auto.clear()
            self._auto[key] = a
        return a

    def collective_time(
        self, op: str, nbytes: int, ranks: list[int], algo: str | None = None, root: int | None = None
    ) -> float:
        """Seconds for one collective over these global ranks, without contention."""
        p = len(ranks)
        if p <= 1:
            return 0.0
        if self.profile is not None and algo is None:
            t = self.profile.predict(op, nbytes, p)
            if t is not None:
                return t
        name = resolve(op, algo) if algo is not None else None
        if name is None:
            name = self.choose(op, nbytes, p) if self.uniform else self._choose_sched(op, nbytes, ranks, root)
        return self._predict(op, name, nbytes, ranks, root)

    def p2p_time(self, nbytes: int, src: int, dst: int) -> float:
        if src == dst:
            return 0.0
        if self.uniform:
            return self.alpha + nbytes * self.beta
        a, b = self.network.pair_cost(src, dst)
        return a + nbytes * b

    # ------------------------------------------------------------------ internals
    def _predict(self, op: str, algo: str, nbytes: int, ranks: list[int], root: int | None) -> float:
        if self.uniform:
            fixed, per_byte = self.closed_form(op, algo, len(ranks))
            return fixed + nbytes * per_byte
        key = (op, algo, int(nbytes), tuple(ranks), root)
        t = self._sched_cache.get(key)
        if t is None:
            t = self._sched_time(op, algo, int(nbytes), tuple(ranks), root)
            if len(self._sched_cache) > 100_000:
                self._sched_cache.clear()
            self._sched_cache[key] = t
        return t

    def _choose_sched(self, op: str, nbytes: int, ranks: list[int], root: int | None) -> str:
        fixed = self.algorithms.get(op)
        if fixed is not None:
            return fixed
        return min(algorithms_for(op), key=lambda name: (self._predict(op, name, nbytes, ranks, root), name))

    def _sched_time(self, op: str, algo: str, nbytes: int, ranks: tuple[int, ...], root: int | None) -> float:
        p = len(ranks)
        local_root = ranks.index(root) if root is not None and root in ranks else 0
        # Schedules are built on a scaled count so huge buffers stay cheap: blocks keep
        # their proportions and the time is scaled back (exact for divisible sizes).
        unit = 1.0
        count = nbytes
        grain = 64 * p * p
        if nbytes > grain * 16:
            unit = nbytes / grain
            count = grain
        sched = make_schedule(op, algo, p, count, local_root)
        net = self.network
        on = np.array(ranks, dtype=np.int64)
        return schedule_time(sched, lambda i, j: net.pair_costs(on[i], on[j]), self.gamma, unit)
