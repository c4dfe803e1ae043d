"""Deprecated alias of :mod:`greenmim._conv_abi` (its name before the layers were named for what
they are); importing it warns, and it is that module, for one release."""
import sys
import warnings

from . import _conv_abi as _module

warnings.warn("greenmim._conv_backend is deprecated: it is greenmim._conv_abi; this alias goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _module
