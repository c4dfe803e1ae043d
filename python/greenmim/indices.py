"""Deprecated: the module is :mod:`greenmim.mask_plan` (plans), and the per-stage builders are in
:mod:`greenmim.testing`. Importing ``greenmim.indices`` warns; its names work for one release."""
import warnings

from .mask_plan import (CACHE_SIZE, MaskPlan, StagePartition, StagePlan, clear_cache, group_capacity,  # noqa: F401
                        plan_inputs, plan_masks, random_masks, window_geometry)
from .testing import merge_indices, stage_partition  # noqa: F401

warnings.warn("greenmim.indices is deprecated: use greenmim.mask_plan (plans) and greenmim.testing (per-stage "
              "builders); this alias goes in the next release", DeprecationWarning, stacklevel=2)
