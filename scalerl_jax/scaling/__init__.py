"""ScaleRL's compute -> reward law: the paper's grid fit, a NumPyro posterior, comparisons, plots and reports.

Stable names (DESIGN.md): ``sigmoid_reward``, ``fit_grid`` -> ``SigmoidFit``, ``fit_bayes`` -> ``SigmoidPosterior``.
"""

from .bayes import SigmoidPosterior, fit_bayes, fit_bayes_batch
from .checks import ScalingFitWarning, check_curve
from .grid import SigmoidFit, fit_grid, fit_grid_scipy
from .law import efficiency_F, gain_fraction, power_law_reward, sigmoid_reward

__all__ = [
    "sigmoid_reward",
    "gain_fraction",
    "power_law_reward",
    "efficiency_F",
    "fit_grid",
    "fit_grid_scipy",
    "SigmoidFit",
    "fit_bayes",
    "fit_bayes_batch",
    "SigmoidPosterior",
    "ScalingFitWarning",
    "check_curve",
]
