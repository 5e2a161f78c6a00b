"""The one error class of rlctl.algorithms."""

from __future__ import annotations


class AlgorithmError(ValueError):
    """Bad input to rlctl.algorithms (unknown name, duplicate name, missing or misshaped tensor).

    A plain ValueError subclass so this package stays a leaf; callers map it to the project's
    own error classes (ConfigError for names, NumericalError for tensors).
    """
