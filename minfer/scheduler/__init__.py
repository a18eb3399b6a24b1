"""The iteration-level scheduler and its queue policies. (The plan it writes each step is in ``minfer.plan``.)"""

from minfer.scheduler.policies import POLICIES, make_policy
from minfer.scheduler.policy import Policy
from minfer.scheduler.scheduler import Scheduler

__all__ = ["POLICIES", "Policy", "Scheduler", "make_policy"]
