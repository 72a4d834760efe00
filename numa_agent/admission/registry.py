"""The registered providers, in the order admission asks them (and the
order their hints reach the topology manager). A new resource is one new
module under ``providers/`` and one entry here."""

from __future__ import annotations

from numa_agent.admission.provider import HintProvider
from numa_agent.admission.providers.cpu import CpuProvider
from numa_agent.admission.providers.devices import DeviceProvider
from numa_agent.admission.providers.memory import MemoryProvider

PROVIDERS: tuple[HintProvider, ...] = (CpuProvider(), MemoryProvider(), DeviceProvider())
