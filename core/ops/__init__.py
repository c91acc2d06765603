"""The operator engine the operator-tier plugins share: capture from Kineto, the op tree,
FLOP/byte math, hardware counters, and the calibration of machine peaks."""
