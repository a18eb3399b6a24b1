"""The iteration-level scheduler and its queue policies."""

from minfer.scheduler.policy import Policy, make_policy
from minfer.scheduler.scheduler import ScheduledChunk, Scheduler, SchedulerOutput

__all__ = ["Policy", "ScheduledChunk", "Scheduler", "SchedulerOutput", "make_policy"]
