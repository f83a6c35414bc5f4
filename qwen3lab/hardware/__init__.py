"""The machine: GPU catalogue and probes, the memory and roofline planner, calibration."""
