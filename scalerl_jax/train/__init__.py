"""Training: TrainState, the pure train step, the optimiser."""

from scalerl_jax.train.optim import lr_schedule, make_optimizer
from scalerl_jax.train.step import TrainState, init_train_state, jit_train_step, make_train_step, state_shardings

__all__ = ["TrainState", "init_train_state", "jit_train_step", "lr_schedule", "make_optimizer", "make_train_step",
           "state_shardings"]
