"""Planning: a pure function of facts (token counts, model shape, memory, throughput)."""

from ktcli.plan.planner import PlanRequest, Throughput, make_plan

__all__ = ["PlanRequest", "Throughput", "make_plan"]
