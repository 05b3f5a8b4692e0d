"""Stepping lives in the shared core now (:mod:`gencraft.models.stepping`); these names stay
importable from here."""

from gencraft.models.introspect import eos_ids
from gencraft.models.stepping import HFStepper, StepOutput, Stepper, resolve

__all__ = ["HFStepper", "StepOutput", "Stepper", "eos_ids", "resolve"]
