"""Which trackers a run mirrors its metrics to (`--log wandb`, `--log tensorboard`): the settings
alone, without the store or the trackers, so the command line reads them at once. The mirrors
themselves are `lrt_lab.training.mirrors`.
"""

from __future__ import annotations

from dataclasses import dataclass

# --log NAME -> (the module it needs, the extra that installs it)
MIRROR_PACKAGES = {"wandb": ("wandb", "wandb"), "tensorboard": ("tensorboard", "tensorboard")}
DEFAULT_WANDB_PROJECT = "lrt_lab"


@dataclass(frozen=True)
class MirrorSettings:
    """Which mirrors a run writes to, and their options (picklable: it travels to Ray tasks)."""

    names: tuple[str, ...] = ()
    wandb_project: str | None = None  # None: $WANDB_PROJECT, else DEFAULT_WANDB_PROJECT

    def __post_init__(self):
        # --log wandb twice: once
        object.__setattr__(self, "names", tuple(dict.fromkeys(self.names)))
        for name in self.names:
            if name not in MIRROR_PACKAGES:
                raise ValueError(
                    f"--log {name!r} is invalid; allowed: {', '.join(MIRROR_PACKAGES)}"
                )
        if self.wandb_project is not None and "wandb" not in self.names:
            raise ValueError("--wandb-project needs --log wandb")
