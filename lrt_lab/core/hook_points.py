"""Hook points: identity modules placed where an activation is formed, so a hook can read or
replace it (what each name means, and how to hook them: `lrt_lab.run.hooks`).

A point knows whether anything is registered on it (`hooked`), counting the hooks registered
and removed through it, so an unhooked point costs one attribute read per call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass(frozen=True)
class Hook:
    """What a TransformerLens-style hook function `fn(activation, hook)` receives."""

    name: str  # the hook point's name, e.g. "blocks.0.attn.hook_pattern"
    positions: range  # the sequence positions of the activation's rows

    def layer(self) -> int | None:
        """The block index in the name (TransformerLens's `hook.layer()`), or None."""
        parts = self.name.split(".")
        return int(parts[1]) if len(parts) > 2 and parts[0] == "blocks" else None


# hooks registered on any hook point and not yet removed: a compiled block runs only while none is
# (`Block.forward`), so hooks always run eagerly, as written
_ACTIVE_HOOKS = [0]


def any_hooked() -> bool:
    """Whether a hook is registered on some hook point (of any model)."""
    return _ACTIVE_HOOKS[0] > 0


class HookPoint(nn.Module):
    """Identity; exists so forward hooks can read or replace the activation passing through.

    A module hook registered globally (`torch.nn.modules.module.register_module_forward_hook`)
    does not see hook points: register on the points themselves (`lrt_lab.run.hooks.hooks`)."""

    def __init__(self):
        super().__init__()
        self.n_hooks = 0  # forward (pre-)hooks registered on this point and not yet removed

    @property
    def hooked(self) -> bool:
        """Whether a hook is registered on this point: what decides whether its calls go through
        nn.Module's hook machinery, and whether attention is written out for its scores."""
        return self.n_hooks > 0

    def register_forward_hook(self, hook, **kwargs):
        return _CountedHandle(self, super().register_forward_hook(hook, **kwargs))

    def register_forward_pre_hook(self, hook, **kwargs):
        return _CountedHandle(self, super().register_forward_pre_hook(hook, **kwargs))

    def __call__(self, x: torch.Tensor, positions: range | None) -> torch.Tensor:
        # a model calls ~10 hook points per block and stage; with no hook on the point, skip
        # nn.Module's call machinery (a few microseconds each: measurable in launch-bound
        # decoding and Exact)
        if not self.n_hooks:
            return x
        return super().__call__(x, positions=positions)

    def forward(self, x: torch.Tensor, positions: range | None) -> torch.Tensor:
        return x


class _CountedHandle:
    """torch's removable handle, counting the hook in and (once) out of its point's n_hooks."""

    def __init__(self, point: HookPoint, handle):
        self.point, self.handle, self.removed = point, handle, False
        point.n_hooks += 1
        _ACTIVE_HOOKS[0] += 1

    def remove(self) -> None:
        if not self.removed:
            self.removed = True
            self.point.n_hooks -= 1
            _ACTIVE_HOOKS[0] -= 1
        self.handle.remove()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every hook point of `model` by name (its module path)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, HookPoint)}
