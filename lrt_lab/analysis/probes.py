"""Memory-vs-depth probes: at which layer and position does a task's latent state become linearly
decodable, and does the LRT memory carry it to the next token?

    acts = collect_activations(model, batch.inputs, "exact")          # {site: (B, T, d)}
    table = probe_model(model, batch.inputs, batch.state, "exact")    # one row per site x position
    x control
    fig = plot_probe_heatmap(table)

Sites are hook point names (`lrt_lab.run.hooks`): "hook_embed", "blocks.{l}.hook_resid_post" for
every layer, and for an LRT "hook_mem_in" (the memory m_{t-1} a position reads) and "hook_mem_out"
(the source state it emits). "hook_mem_in" is probed twice: against the state at t (target "state")
and against the state at t-1 (target "state_prev"): the question "does the memory carry it forward".

Probes: multinomial logistic regression on standardized features (statistics from the training
sequences), L2 weight decay, fitted by full-batch Adam on the analytic gradient. One probe per
(site, position, target, control), all fitted at once as a batch of independent problems (batched
matmuls; no torch.optim, whose first use imports torch._dynamo: seconds on a loaded CPU). Sequences,
never tokens, are split
into train/test (`train_frac` of the sequences train every probe).

Controls (column `control`):
  probe            the probe on the model's activations;
  majority         always predict the training split's most frequent label at that position;
  shuffled_labels  the same probe fitted on labels permuted across training sequences (what a
                   probe can fit without a real signal: ~chance, unless the features memorise);
  random_init      the same probe on a randomly initialised model of the same config, with the
                   zero-initialised output projections filled too (`random_init_like`): what the
                   architecture alone makes decodable (e.g. the current token from `embed`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from lrt_lab.analysis.loading import as_run, eval_batch, load_model, load_task
from lrt_lab.core.model import LRT
from lrt_lab.run.registry import as_schedule
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import OnePass

CONTROLS = ("majority", "shuffled_labels", "random_init")


def default_sites(model) -> list[str]:
    """embed, every layer's residual output, and (LRT) the injected and emitted memory."""
    sites = ["hook_embed"] + [f"blocks.{l}.hook_resid_post" for l in range(model.config.n_layer)]
    if model.config.is_lrt:
        sites += ["hook_mem_in", "hook_mem_out"]
    return sites


def decoding_label(schedule) -> str:
    """A table-name-safe label: 'exact', 'interleaved_2', 'onepass', ..."""
    return as_schedule(schedule).spec.replace(":", "_").replace(",", "-")


@torch.no_grad()
def collect_activations(
    model, inputs: torch.Tensor, schedule="exact", sites=None, chunk: int = 256
) -> dict:
    """{site: (B, T, ...) float tensor on the CPU} under `schedule` (a parallel schedule, or
    "exact" = exact recurrent decoding; for a plain transformer every schedule is its forward)."""
    schedule = as_schedule(schedule)
    if not model.config.is_lrt:
        schedule = OnePass()  # no memory: every schedule gives the same activations
    sites = list(sites) if sites is not None else default_sites(model)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    parts = {s: [] for s in sites}
    for i in range(0, inputs.size(0), chunk):
        cache = {}
        run_schedule(model, inputs[i : i + chunk].to(device), None, schedule, cache=cache)
        for s in sites:
            if s not in cache:
                raise ValueError(
                    f"sites: {s!r} is not a hook of this model; allowed: {', '.join(sorted(cache))}"
                )
            parts[s].append(cache[s].float().cpu())
    model.train(was_training)
    return {s: torch.cat(v) for s, v in parts.items()}


def choose_positions(T: int, max_positions: int | None) -> list[int]:
    """0-based positions to probe: all T, or max_positions
    evenly spaced including first and last."""
    if max_positions is None or max_positions >= T:
        return list(range(T))
    if not isinstance(max_positions, int) or max_positions < 1:
        raise ValueError(
            f"max_positions={max_positions!r} is invalid; allowed: an integer >= 1 or None"
        )
    return sorted(set(np.linspace(0, T - 1, max_positions).round().astype(int).tolist()))


def fit_probes(
    X_train: torch.Tensor,
    y_train: torch.Tensor,
    X_test: torch.Tensor,
    y_test: torch.Tensor,
    n_classes: int | None = None,
    weight_decay: float = 1e-3,
    steps: int = 200,
    group_chunk: int = 64,
) -> torch.Tensor:
    """Test accuracy (G,) of G independent multinomial logistic-regression probes.

    X_train (G, N, d), y_train (G, N) long, X_test (G, M, d), y_test (G, M). Features are
    standardized per probe with the training split's mean and std. Loss per probe: mean CE +
    weight_decay * ||W||^2 (bias not decayed), minimised by `steps` full-batch Adam steps on its
    analytic gradient, for all probes of a chunk at once (batched matmuls).
    """
    if (
        X_train.dim() != 3
        or X_test.dim() != 3
        or y_train.shape != X_train.shape[:2]
        or y_test.shape != X_test.shape[:2]
        or X_train.size(0) != X_test.size(0)
    ):
        raise ValueError(
            "fit_probes: allowed shapes X_train (G, N, d), y_train (G, N), X_test (G, M, d), "
            f"y_test (G, M); got {tuple(X_train.shape)}, {tuple(y_train.shape)}, "
            f"{tuple(X_test.shape)}, {tuple(y_test.shape)}"
        )
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay={weight_decay!r} is invalid; allowed: a number >= 0")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} is invalid; allowed: an integer >= 1")
    C = int(n_classes or max(int(y_train.max()), int(y_test.max())) + 1)
    accs = []
    for g0 in range(0, X_train.size(0), group_chunk):
        sl = slice(g0, g0 + group_chunk)
        accs.append(
            _fit_chunk(
                X_train[sl].float(),
                y_train[sl],
                X_test[sl].float(),
                y_test[sl],
                C,
                weight_decay,
                steps,
            )
        )
    return torch.cat(accs)


@torch.no_grad()
def _fit_chunk(Xtr, ytr, Xte, yte, C, wd, steps, lr=0.1, betas=(0.9, 0.999), eps=1e-8):
    mu = Xtr.mean(1, keepdim=True)
    sd = Xtr.std(1, keepdim=True).clamp_min(1e-6)
    ones = lambda X: torch.ones(X.shape[:2] + (1,))
    Xtr = torch.cat([(Xtr - mu) / sd, ones(Xtr)], -1)
    Xte = torch.cat([(Xte - mu) / sd, ones(Xte)], -1)
    G, N, d1 = Xtr.shape
    Y = F.one_hot(ytr, C).float()
    XtT = Xtr.transpose(1, 2) / N
    decay = torch.ones(d1, 1)
    decay[-1] = 0.0  # no decay on the bias
    W = torch.zeros(G, d1, C)
    m, v = torch.zeros_like(W), torch.zeros_like(W)
    b1, b2 = betas
    # full-batch Adam on the analytic gradient of mean CE + wd ||W||^2: X^T (softmax(XW) - Y) / N
    for i in range(1, steps + 1):
        grad = torch.bmm(XtT, torch.softmax(torch.bmm(Xtr, W), -1) - Y) + (2 * wd) * W * decay
        m.mul_(b1).add_(grad, alpha=1 - b1)
        v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        W -= lr * (m / (1 - b1**i)) / ((v / (1 - b2**i)).sqrt() + eps)
    pred = torch.bmm(Xte, W).argmax(-1)
    return (pred == yte).float().mean(1)


def _split(B: int, train_frac: float, seed: int):
    if not 0 < train_frac < 1:
        raise ValueError(f"train_frac={train_frac!r} is invalid; allowed: a number in (0, 1)")
    n_train = int(round(B * train_frac))
    if n_train < 2 or B - n_train < 1:
        raise ValueError(
            f"inputs has {B} sequences; allowed: enough for a train/test split by sequence "
            f"(at least 2 train and 1 test at train_frac={train_frac})"
        )
    perm = torch.randperm(B, generator=torch.Generator().manual_seed(seed))
    return perm[:n_train], perm[n_train:]


def _check_sites(acts: dict, B: int, T: int) -> None:
    for s, a in acts.items():
        if a.shape[:2] != (B, T):
            raise ValueError(
                f"acts[{s!r}] has shape {tuple(a.shape)}; allowed: (B, T, ...) = ({B}, {T}, ...)"
            )


def _probe_rows(specs, accuracies: list[float], n_test: int) -> list[dict]:
    return [
        {
            "site": site,
            "target": target,
            "position": t + 1,
            "control": control,
            "accuracy": a,
            "n_test": n_test,
        }
        for (site, target, t, control), a in zip(specs, accuracies)
    ]


def _majority_rows(specs, state, tr, te, C: int, label: str) -> list[dict]:
    """The majority control of each probed (site, target, position)."""
    rows = []
    # majority: the most frequent training label at that position, scored on the test split
    for site, target, t, control in specs:
        if control != label:
            continue
        lag = 1 if target == "state_prev" else 0
        y = state[:, t - lag]
        maj = torch.bincount(y[tr], minlength=C).argmax()
        rows.append(
            {
                "site": site,
                "target": target,
                "position": t + 1,
                "control": "majority",
                "accuracy": float((y[te] == maj).float().mean()),
                "n_test": len(te),
            }
        )
    return rows


def probe_activations(
    acts: dict,
    state: torch.Tensor,
    positions=None,
    prev_sites=("hook_mem_in",),
    train_frac: float = 0.7,
    seed: int = 0,
    shuffled: bool = True,
    n_shuffles: int = 3,
    weight_decay: float = 1e-3,
    steps: int = 200,
    n_classes: int | None = None,
    label: str = "probe",
) -> pd.DataFrame:
    """Probe every site of `acts` ({site: (B, T, d)}) for `state` (B, T) at each position.

    Rows: site, target ("state", or "state_prev" for prev_sites at t >= 2), position (1-based),
    control (`label`, "majority", and with shuffled=True "shuffled_labels": the mean over
    `n_shuffles` label permutations), accuracy, n_test.
    """
    state = torch.as_tensor(state).long()
    if state.dim() != 2:
        raise ValueError(
            f"state is invalid; allowed: a (B, T) integer tensor, got {tuple(state.shape)}"
        )
    B, T = state.shape
    _check_sites(acts, B, T)
    positions = list(range(T)) if positions is None else list(positions)
    tr, te = _split(B, train_frac, seed)
    C = n_classes or int(state.max()) + 1
    g = torch.Generator().manual_seed(seed + 1)
    specs, Xtr, Ytr, Xte, Yte = [], [], [], [], []
    for site, a in acts.items():
        a = a.reshape(B, T, -1)
        targets = [("state", 0)] + ([("state_prev", 1)] if site in prev_sites else [])
        for target, lag in targets:
            for t in positions:
                if t - lag < 0:
                    continue
                y = state[:, t - lag]
                variants = [(label, y[tr])]
                if shuffled:  # several permutations, averaged: one is noisy when features cluster
                    variants += [
                        ("shuffled_labels", y[tr][torch.randperm(len(tr), generator=g)])
                        for _ in range(n_shuffles)
                    ]
                for control, ytrain in variants:
                    specs.append((site, target, t, control))
                    Xtr.append(a[tr, t])
                    Ytr.append(ytrain)
                    Xte.append(a[te, t])
                    Yte.append(y[te])
    rows = []
    if specs:
        acc = fit_probes(
            torch.stack(Xtr),
            torch.stack(Ytr),
            torch.stack(Xte),
            torch.stack(Yte),
            C,
            weight_decay,
            steps,
        )
        rows += _probe_rows(specs, acc.tolist(), len(te))
        rows += _majority_rows(specs, state, tr, te, C, label)
    cols = ["site", "target", "position", "control", "accuracy", "n_test"]
    out = pd.DataFrame(rows, columns=cols)
    if shuffled and n_shuffles > 1 and not out.empty:
        keys = ["site", "target", "position", "control"]
        out = out.groupby(keys, sort=False, as_index=False).agg(
            accuracy=("accuracy", "mean"), n_test=("n_test", "first")
        )[cols]
    return out


def probe_model(
    model,
    inputs: torch.Tensor,
    state: torch.Tensor,
    schedule="exact",
    sites=None,
    max_positions: int | None = 16,
    train_frac: float = 0.7,
    seed: int = 0,
    controls=CONTROLS,
    weight_decay: float = 1e-3,
    steps: int = 200,
    dense_random_init: bool = True,
) -> pd.DataFrame:
    """The layer x position probe table of a model (and its controls) under one decoding.

    schedule: "exact" (exact recurrent decoding, what inference does), or a parallel schedule
    ("interleaved:2", "onepass", ...), whose final activations are probed.
    Returns rows (site, target, position, control, accuracy, n_test, decoding, layer_index).
    """
    bad = set(controls) - set(CONTROLS)
    if bad:
        raise ValueError(f"controls={sorted(bad)} is invalid; allowed: {', '.join(CONTROLS)}")
    if state is None:
        raise ValueError(
            "state is None: this task defines no latent state to probe (tasks' Batch.state)"
        )
    schedule = as_schedule(schedule)
    sites = list(sites) if sites is not None else default_sites(model)
    positions = choose_positions(inputs.size(1), max_positions)
    n_classes = int(torch.as_tensor(state).max()) + 1
    kw = dict(
        positions=positions,
        train_frac=train_frac,
        seed=seed,
        weight_decay=weight_decay,
        steps=steps,
        n_classes=n_classes,
    )
    acts = collect_activations(model, inputs, schedule, sites)
    table = probe_activations(acts, state, shuffled="shuffled_labels" in controls, **kw)
    if "majority" not in controls:
        table = table[table["control"] != "majority"]
    if "random_init" in controls:
        fresh = random_init_like(model, seed, dense_random_init)
        rand = probe_activations(
            collect_activations(fresh, inputs, schedule, sites),
            state,
            shuffled=False,
            label="random_init",
            **kw,
        )
        table = pd.concat([table, rand[rand["control"] == "random_init"]], ignore_index=True)
    table["decoding"] = decoding_label(schedule) if model.config.is_lrt else "onepass"
    order = {s: i for i, s in enumerate(sites)}
    table["layer_index"] = table["site"].map(order)
    return table.reset_index(drop=True)


def random_init_like(model, seed: int = 0, dense: bool = True) -> LRT:
    """A freshly initialised model of the same config (the random-init control).

    dense=True also fills the matrices the init sets to zero (attention/MLP output projections,
    gates, zero-initialised recurrent projections) with N(0, 1/fan_in): nanochat's init makes
    every block the identity, so without this the control would only be the embedding again."""
    state = torch.get_rng_state()
    try:
        torch.manual_seed(10_000 + seed)
        fresh = LRT(model.config)
        if dense:
            with torch.no_grad():
                for p in fresh.parameters():
                    if p.dim() == 2 and not p.any():
                        p.normal_(0.0, p.size(1) ** -0.5)
    finally:
        torch.set_rng_state(state)
    ref = next(model.parameters())
    return fresh.to(device=ref.device, dtype=ref.dtype).eval()


def probe_run(
    run,
    schedule="exact",
    n_sequences: int = 512,
    length: int | None = None,
    write: bool = True,
    eval_seed: int = 1,
    **kw,
) -> pd.DataFrame:
    """probe_model on a trained run (latest checkpoint) with a held-out batch of its task.

    schedule: "exact", "train" (the run's training schedule, parallel forward), or a spec.
    Writes tables/probe_<decoding>.csv into the run when write=True.
    """
    run = as_run(run)
    model = load_model(run)
    if schedule == "train":
        schedule = run.config["schedule"]
    task = load_task(run)
    batch = eval_batch(task, length or run.config["train"]["length"], n_sequences, seed=eval_seed)
    table = probe_model(model, batch.inputs, batch.state, schedule, **kw)
    table.insert(0, "run", run.name)
    table.insert(1, "kind", run.config.get("kind", "lrt" if model.config.is_lrt else "transformer"))
    if write:
        run.write_table(f"probe_{table['decoding'].iloc[0]}", table)
    return table


# Plots --------------------------------------------------------------------------------------------
def _row_label(site: str, target: str) -> str:
    return f"{site} (t-1)" if target == "state_prev" else site


def probe_matrix(table: pd.DataFrame, control: str = "probe") -> pd.DataFrame:
    """site-row x position-column accuracy matrix (rows in layer order; hook_mem_in (t-1) after
    hook_mem_in)."""
    sub = table[table["control"] == control]
    if sub.empty:
        raise ValueError(
            f"control={control!r} is invalid; allowed: "
            f"{', '.join(sorted(table['control'].unique()))}"
        )
    sub = sub.assign(row=[_row_label(s, t) for s, t in zip(sub["site"], sub["target"])])
    order = sub.drop_duplicates("row")
    key = (
        order["layer_index"]
        if "layer_index" in order
        else pd.Series(range(len(order)), index=order.index)
    )
    order = (
        order.assign(k=key + (order["target"] == "state_prev") * 0.5)
        .sort_values("k")["row"]
        .tolist()
    )
    return sub.pivot_table(index="row", columns="position", values="accuracy", aggfunc="mean").loc[
        order
    ]


def plot_probe_heatmap(
    table: pd.DataFrame,
    control: str = "probe",
    ax=None,
    title: str | None = None,
    annot: bool | None = None,
):
    """Heatmap of probe accuracy, sites (layer order) x positions; returns the Figure."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    m = probe_matrix(table, control)
    if ax is None:
        fig, ax = plt.subplots(figsize=(1.0 + 0.45 * m.shape[1], 0.9 + 0.4 * m.shape[0]))
    else:
        fig = ax.figure
    annot = m.shape[1] <= 20 if annot is None else annot
    sns.heatmap(
        m,
        vmin=0,
        vmax=1,
        cmap="viridis",
        annot=annot,
        fmt=".2f",
        annot_kws={"size": 7},
        cbar_kws={"label": "test accuracy"},
        ax=ax,
    )
    ax.set_xlabel("position")
    ax.set_ylabel("site")
    ax.set_title(title or f"linear probe ({control})")
    fig.tight_layout()
    return fig


def plot_probe_comparison(
    tables: dict, control: str = "probe", baseline: str | None = "random_init"
):
    """Heatmaps side by side (e.g. {"transformer": t1, "lrt": t2}); with `baseline`, a second row
    shows accuracy minus that control. Returns the Figure."""
    import matplotlib.pyplot as plt

    if not tables:
        raise ValueError("tables is empty; allowed: {label: probe table}")
    rows = 2 if baseline else 1
    mats = {k: probe_matrix(t, control) for k, t in tables.items()}
    h = max(m.shape[0] for m in mats.values())
    w = max(m.shape[1] for m in mats.values())
    fig, axes = plt.subplots(
        rows,
        len(tables),
        figsize=(len(tables) * (1.5 + 0.45 * w), rows * (1 + 0.4 * h)),
        squeeze=False,
    )
    for j, (label, t) in enumerate(tables.items()):
        plot_probe_heatmap(t, control, ax=axes[0, j], title=f"{label}: {control}")
        if baseline:
            diff = t.copy()
            base = t[t["control"] == baseline].set_index(["site", "target", "position"])["accuracy"]
            sub = diff[diff["control"] == control].copy()
            sub["accuracy"] = (
                sub["accuracy"].values
                - base.reindex(pd.MultiIndex.from_frame(sub[["site", "target", "position"]])).values
            )
            _diff_heatmap(sub, axes[1, j], f"{label}: {control} - {baseline}", control)
    fig.tight_layout()
    return fig


def _diff_heatmap(sub, ax, title, control):
    import seaborn as sns

    m = probe_matrix(sub, control)
    sns.heatmap(
        m,
        vmin=-1,
        vmax=1,
        cmap="RdBu_r",
        center=0,
        annot=m.shape[1] <= 20,
        fmt=".2f",
        annot_kws={"size": 7},
        ax=ax,
    )
    ax.set_xlabel("position")
    ax.set_ylabel("site")
    ax.set_title(title)
