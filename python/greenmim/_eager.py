"""Deprecated alias of :mod:`greenmim._dispatch` (its name before the layers were named for what
they are); importing it warns, and it is that module, for one release."""
import sys
import warnings

from . import _dispatch as _module

warnings.warn("greenmim._eager is deprecated: it is greenmim._dispatch; this alias goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _module
