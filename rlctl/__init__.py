"""rlctl: reinforcement-learning post-training of LLMs from the command line."""

__version__ = "0.1.0"

from rlctl.utils.torch_extras import install_hook as _install_hook  # noqa: E402

_install_hook()   # a torchvision that does not load must not break transformers (see the module)
