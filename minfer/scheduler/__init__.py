"""The iteration-level scheduler and its queue policies."""

from minfer.scheduler.policies import POLICIES, make_policy
from minfer.scheduler.policy import Policy
from minfer.scheduler.scheduler import ScheduledChunk, Scheduler, SchedulerOutput, StepBudget

__all__ = ["POLICIES", "Policy", "ScheduledChunk", "Scheduler", "SchedulerOutput", "StepBudget", "make_policy"]
