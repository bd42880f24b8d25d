"""The planner's second stage: the training step of a meta-device torch model lowered to a JAX
function over abstract sharded arrays (`lowering`), its repeated blocks' saved activations named
as MaxText names them and read back (`residuals`)."""

from spmd.plan.lower.lowering import LoweredStep, TrainStepConfig, lower_train_step

__all__ = ["LoweredStep", "TrainStepConfig", "lower_train_step"]
