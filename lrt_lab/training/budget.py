"""Training budgets in the paper's units, and the compute a step really spends.

Tokens per parameter (paper app. "Compute Budget and Full Scaling Results"): a run at budget R
trains on R x N tokens, N its parameter count. Which parameters N counts differs between the
paper's text (every parameter: `"all"`) and its released code (the 2-D hidden matrices and the LM
head, no embeddings or scalars: `"matrices"`); the run records which (`TrainConfig
.param_convention`). The steps follow from the budget, so each budget point is its own run and
its learning-rate warm-down ends at its own last step, as in the paper.

FLOPs: `StepFlops` counts a training step's forward and backward FLOPs with
`torch.utils.flop_counter` on the first step at each sequence length, instead of estimating them
from forward passes. Forward passes without a gradient (FixedPoint's sweeps to convergence) cost a
forward and no backward, so counting passes alone overstates such a schedule several-fold.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import torch
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode

from lrt_lab.training.optim import param_roles
from lrt_lab.training.train_config import TrainConfig

# the roles the released code's count includes (lrt_lab.training.optim.ROLES)
MATRIX_ROLES = ("matrix", "head")


def counted_params(model: torch.nn.Module, convention: str = "all") -> int:
    """The parameter count a tokens-per-parameter budget multiplies (see the module docstring)."""
    if convention == "all":
        return sum(p.numel() for p in model.parameters())
    if convention == "matrices":
        params = dict(model.named_parameters())
        roles = param_roles(model)
        return sum(params[name].numel() for name, role in roles.items() if role in MATRIX_ROLES)
    raise ValueError(f"param_convention={convention!r} is invalid; allowed: all, matrices")


def budget_steps(tokens: float, batch_size: int, length_at, max_steps: int = 10**9) -> int:
    """The fewest steps whose batches (batch_size x length_at(step) tokens) reach `tokens`."""
    done, step = 0, 0
    while done < tokens:
        done += batch_size * length_at(step)
        step += 1
        if step >= max_steps:
            raise ValueError(f"a budget of {tokens:.3g} tokens needs more than {max_steps} steps")
    return max(step, 1)


def resolve_budget(cfg: TrainConfig, model, task) -> TrainConfig:
    """cfg with `steps` set from its tokens-per-parameter budget (cfg unchanged without one).

    `model` may live on the meta device (only its parameter shapes are read)."""
    if cfg.tokens_per_param is None:
        return cfg
    n = counted_params(model, cfg.param_convention)
    steps = budget_steps(cfg.tokens_per_param * n, cfg.batch_size, task.length_at)
    return dataclasses.replace(cfg, steps=steps)


# FLOPs --------------------------------------------------------------------------------------------


def _heads_like_query(query_shape, key_shape, value_shape):
    # grouped-query attention: the FLOPs are those of the keys and values repeated to the query's
    # heads (what the kernel computes)
    h = query_shape[1]
    return query_shape, (*key_shape[:1], h, *key_shape[2:]), (*value_shape[:1], h, *value_shape[2:])


def _sdpa_cpu(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return flop_counter.sdpa_flop_count(*_heads_like_query(query_shape, key_shape, value_shape))


def _sdpa_cpu_backward(
    grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs
) -> int:
    q, k, v = _heads_like_query(query_shape, key_shape, value_shape)
    return flop_counter.sdpa_backward_flop_count(grad_out_shape, q, k, v)


def _cpu_attention_formulas() -> dict:
    """flop_counter has formulas for the CUDA attention kernels only; the CPU flash kernel (what
    SDPA runs here) would otherwise count as zero. Causal masking is not discounted, as in
    flop_counter's own formulas."""
    aten = torch.ops.aten
    formulas = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        formulas[aten._scaled_dot_product_flash_attention_for_cpu] = _sdpa_cpu
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward"):
        formulas[aten._scaled_dot_product_flash_attention_for_cpu_backward] = _sdpa_cpu_backward
    return formulas


class FlopCount(TorchDispatchMode):
    """Counts the FLOPs of every operator run inside it with `torch.utils.flop_counter`'s formulas
    (plus the CPU attention kernel's).

    Not FlopCounterMode itself: its per-module breakdown hooks the backward of every module's
    output and fails on modules run under no_grad (FixedPoint's sweeps); only the total is needed.
    """

    def __init__(self, decompose: bool = True):
        """decompose=False counts as this counter did before it decomposed composite operators
        (zero for them under inference_mode): what runs recorded then, for restating their
        records (`lrt_lab.analysis.recount`)."""
        super().__init__()
        self.decompose = decompose
        extra = {k: flop_counter.shape_wrapper(f) for k, f in _cpu_attention_formulas().items()}
        self.formulas = {**flop_counter.flop_registry, **extra}
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        formula = self.formulas.get(func._overloadpacket)
        if formula is None and self.decompose and func is not torch.ops.prim.device.default:
            # Under inference_mode composite operators (matmul, linear) reach the mode whole,
            # since the autograd key that decomposes them is off: decompose them here, so their
            # matmuls are counted (uncounted, the rollout of Rollout(G) read as zero FLOPs)
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func(*args, **kwargs)
        if formula is not None:
            self.total += formula(*args, **kwargs, out_val=out)
        return out

    def get_total_flops(self) -> int:
        return self.total


def flop_counter_mode(decompose: bool = True) -> FlopCount:
    return FlopCount(decompose)


@dataclasses.dataclass
class StepFlops:
    """Forward and backward FLOPs of a training step, counted on the first step at each length.

    Later steps at that length reuse the count. A schedule whose forward passes vary from step to
    step (FixedPoint stops when it converges) has its forward FLOPs scaled by the passes the step
    ran against the counted step's (every pass at one length costs the same); its backward, through
    a fixed number of differentiated passes, is the counted one.
    """

    counted: dict = dataclasses.field(default_factory=dict)  # length -> (fwd, bwd, step cost)
    enabled: bool = True  # off under torch.compile, whose graphs the counter does not see

    def counting(self, length: int):
        """A context that counts this step's FLOPs when its length has not been counted yet."""
        if not self.enabled or length in self.counted:
            return contextlib.nullcontext()
        return flop_counter_mode()

    def step(self, length: int, forward, backward, step_cost: float) -> float:
        """This step's FLOPs; `forward`/`backward` are what `counting` returned for its two
        halves (counters on a counted step, None otherwise)."""
        if not self.enabled:
            return math.nan
        if forward is not None:
            self.counted[length] = (
                forward.get_total_flops(),
                backward.get_total_flops(),
                step_cost,
            )
        fwd, bwd, cost = self.counted[length]
        return fwd * (step_cost / cost if cost else 1.0) + bwd

    def forward(self, length: int, forward, step_cost: float) -> float:
        """The FLOPs of a forward alone (a step the spike guard refused: no backward); `forward`
        is what `counting` returned for it (a counter when its length had no count yet, as on
        the first step after a resume)."""
        if not self.enabled:
            return math.nan
        if forward is not None:  # not kept: a count is of a forward and its backward together
            return float(forward.get_total_flops())
        fwd, _, cost = self.counted[length]
        return fwd * (step_cost / cost if cost else 1.0)
