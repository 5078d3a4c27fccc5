"""Network model: topologies (networkx), FIFO links (simpy), routing, the cost model."""

from simdist.network.cost import CostModel
from simdist.network.simulate import CollectiveRequest, CollectiveResult, simulate
from simdist.network.topology import PRESETS, Network, preset_network, scenario_network, uniform_network

__all__ = [
    "PRESETS",
    "CollectiveRequest",
    "CollectiveResult",
    "CostModel",
    "Network",
    "preset_network",
    "scenario_network",
    "simulate",
    "uniform_network",
]
