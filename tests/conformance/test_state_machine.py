"""The lockstep runner as a Hypothesis RuleBasedStateMachine (rules = spec actions)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

from kvhandoff.conformance.campaign import campaign_config
from kvhandoff.conformance.inproc import InProcTarget
from kvhandoff.conformance.lockstep import machine_for

TestReferenceConformsInProcess = machine_for(InProcTarget, campaign_config()).TestCase
TestReferenceConformsInProcess.settings = settings(
    max_examples=100,
    stateful_step_count=20,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
