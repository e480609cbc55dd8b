"""Optimizer groups by declared role: one builder for the toy loop, scale/ and the bench.

Every module that owns parameters declares their roles with `param_roles()` (patterns relative to
the module, e.g. `"gates.*": "matrix"`); `param_roles(model)` resolves them for the whole model and
fails unless every parameter has exactly one role, so a new parameter cannot silently fall into a
default group. Roles (paper app. A "Optimization", nanochat's recipe):

    matrix        2-D hidden matrices: attention, MLP, the LRT projections and gate matrices -> Muon
    embedding     token and value embeddings                                                -> AdamW
    head          the LM head                                                               -> AdamW
    scalar        per-layer scalars: gamma, learned mixing weights                          -> AdamW
    resid_scalar  the residual scales alpha_l                                               -> AdamW
    x0_scalar     the x0-skip scales beta_l                                                 -> AdamW

The gate matrices W_g (eq. 3) and the value-embedding gates are matrices: trained with AdamW at the
scalar rate they saturate within tens of steps (2*sigmoid outside [0.05, 1.95]); with Muon, as in
the paper's released code, they stay in range (tests/test_optim.py).

`Muon` is `torch.optim.Muon` with one change on CPU: torch orthogonalises in bfloat16, right for GPU
tensor cores but 20-50x slower than float32 on a CPU without bf16 matrix units (measured on the
project's 2-core machine: 0.8 vs 17 ms for a 128x128 matrix, 150 ms vs 8.6 s at 768x768; bench
`--preset cpu` prints the ratio). Toy runs were bound by it. On CUDA the step is torch's, unchanged.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

import torch
import torch.nn as nn

from lrt_lab.core.interface import DeclaresParamRoles

ROLES = ("matrix", "embedding", "head", "scalar", "resid_scalar", "x0_scalar")


def param_roles(model: nn.Module) -> dict[str, str]:
    """{parameter name: role} for every parameter of `model`; ValueError unless each parameter
    matches exactly one declared pattern."""
    declared = []  # (full pattern, role, declaring module)
    for prefix, module in model.named_modules():
        if isinstance(module, DeclaresParamRoles):
            for pattern, role in module.param_roles().items():
                if role not in ROLES:
                    raise ValueError(
                        f"role {role!r} of {prefix}.{pattern} is invalid; allowed: "
                        f"{', '.join(ROLES)}"
                    )
                declared.append((f"{prefix}.{pattern}" if prefix else pattern, role))
    out = {}
    for name, _ in model.named_parameters():
        hits = {role for pattern, role in declared if fnmatchcase(name, pattern)}
        if len(hits) != 1:
            raise ValueError(
                f"parameter {name!r} has roles {sorted(hits)}; allowed: exactly one "
                f"(declare it in its module's param_roles())"
            )
        out[name] = hits.pop()
    return out


def param_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """{role: [parameters]} (every role present, possibly empty)."""
    groups = {role: [] for role in ROLES}
    params = dict(model.named_parameters())
    for name, role in param_roles(model).items():
        groups[role].append(params[name])
    return groups


def newton_schulz(
    update: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float
) -> torch.Tensor:
    """The quintic Newton-Schulz orthogonalisation of torch.optim.Muon (Keller Jordan's
    coefficients; approximately U V^T of update = U S V^T), in update's own dtype."""
    a, b, c = coefficients
    x = update.T if update.size(0) > update.size(1) else update
    x = x / x.norm().clamp(min=eps)  # spectral norm <= Frobenius norm <= 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if update.size(0) > update.size(1) else x


class Muon(torch.optim.Muon):
    """torch.optim.Muon; on CPU the Newton-Schulz step runs in float32 instead of bfloat16 (see the
    module docstring). Same hyper-parameters, state and update rule (tests/test_optim.py checks it
    against torch's step)."""

    @torch.no_grad()
    def step(self, closure=None):
        if all(p.is_cuda for g in self.param_groups for p in g["params"]):
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, bufs = [], [], []
            self._init_group(group, params, grads, bufs)
            lr, momentum = group["lr"], group["momentum"]
            for p, grad, buf in zip(params, grads, bufs):
                buf.lerp_(grad, 1 - momentum)
                update = grad.lerp(buf, momentum) if group["nesterov"] else buf
                update = newton_schulz(
                    update.float(), group["ns_coefficients"], group["ns_steps"], group["eps"]
                )
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(
                    update.to(p.dtype), alpha=-lr * _muon_lr_scale(group["adjust_lr_fn"], p.shape)
                )
        return loss


def _muon_lr_scale(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's per-shape rate scaling: "original" (Keller Jordan) sqrt(max(1, A/B)),
    "match_rms_adamw" (Moonshot) 0.2 sqrt(max(A, B))."""
    rows, cols = shape[:2]
    if adjust_lr_fn in (None, "original"):
        return max(1.0, rows / cols) ** 0.5
    return 0.2 * max(rows, cols) ** 0.5


def build_optimizers(
    model: nn.Module,
    lrs: dict[str, float],
    *,
    weight_decay: float = 0.0,
    adam_betas=(0.8, 0.95),
    betas: dict[str, tuple] | None = None,
    fused: bool | None = None,
) -> list[torch.optim.Optimizer]:
    """Muon for the `matrix` role, AdamW (eps 1e-10, no weight decay) for the others.

    lrs: a learning rate for every role that has parameters; betas: AdamW betas per role where they
    differ from adam_betas (nanochat: (0.96, 0.95) for the x0 scalars). Each param group carries
    its role as "name" and its starting rate as "initial_lr" (for LR schedules)."""
    groups = param_groups(model)
    missing = [r for r, ps in groups.items() if ps and r not in lrs]
    if missing:
        raise ValueError(
            f"lrs is missing roles {missing}; allowed: a rate for each of {', '.join(ROLES)}"
        )
    betas = betas or {}
    opts = []
    if groups["matrix"]:
        opts.append(
            Muon(
                [{"params": groups["matrix"], "lr": lrs["matrix"], "name": "matrix"}],
                lr=lrs["matrix"],
                momentum=0.95,
                weight_decay=weight_decay,
            )
        )
    adam = [
        {"params": groups[r], "lr": lrs[r], "name": r, "betas": betas.get(r, adam_betas)}
        for r in ROLES
        if r != "matrix" and groups[r]
    ]
    if adam:
        opts.append(
            torch.optim.AdamW(adam, betas=adam_betas, eps=1e-10, weight_decay=0.0, fused=fused)
        )
    for opt in opts:
        for g in opt.param_groups:
            g["initial_lr"] = g["lr"]
    return opts


def gate_saturation(gates: list[torch.Tensor], low: float = 0.05, high: float = 1.95) -> float:
    """Fraction of gate values (2*sigmoid(.), in (0, 2)) outside [low, high]: saturated gates pass
    (almost) no gradient."""
    values = torch.cat([g.detach().flatten().float() for g in gates])
    return ((values < low) | (values > high)).float().mean().item()


# The learning-rate schedule (paper app. A), shared by the toy loop and scale/
# --------------------------
def lr_multiplier(step: int, total: int, warmdown_frac: float) -> float:
    """No warm-up; linear warm-down to zero over the final `warmdown_frac` of training."""
    start = total * (1 - warmdown_frac)
    if step < start or warmdown_frac == 0:
        return 1.0
    return max(0.0, (total - step) / (total * warmdown_frac))


def muon_momentum(step: int, warmup_steps: int = 300) -> float:
    """Muon's momentum, 0.85 -> 0.95 linearly over the first warmup_steps (app. A)."""
    return 0.85 + 0.10 * (min(step / warmup_steps, 1.0) if warmup_steps else 1.0)


def set_lr_schedule(
    opts,
    step: int,
    total_steps: int,
    warmdown_frac: float,
    momentum_warmup_steps: int = 300,
    muon_weight_decay: float | None = None,
) -> float:
    """Set every group's rate to its initial rate x lr_multiplier, Muon's momentum (and its weight
    decay, when given) for `step`; returns the multiplier."""
    mult = lr_multiplier(step, total_steps, warmdown_frac)
    for opt in opts:
        for g in opt.param_groups:
            g["lr"] = g["initial_lr"] * mult
        if isinstance(opt, torch.optim.Muon):
            for g in opt.param_groups:
                g["momentum"] = muon_momentum(step, momentum_warmup_steps)
                if muon_weight_decay is not None:
                    g["weight_decay"] = muon_weight_decay
    return mult


def optimizer_step(opts, params, grad_clip: float = 0.0) -> None:
    """Clip the gradient norm of `params` (when grad_clip >
    0), step every optimizer, clear grads."""
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    for opt in opts:
        opt.step()
    for opt in opts:
        opt.zero_grad(set_to_none=True)
