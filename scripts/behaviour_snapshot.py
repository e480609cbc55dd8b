"""Record, or compare, a fixed set of float64 outputs: proof that a refactor changed no numbers.

    python scripts/behaviour_snapshot.py before.pt              # on the old code
    python scripts/behaviour_snapshot.py after.pt               # on the new code
    python scripts/behaviour_snapshot.py --compare before.pt after.pt
    python scripts/behaviour_snapshot.py --compare --atol 1e-12 before.pt after.pt

The set: for several memory variants, the transformer and both baselines, every schedule's logits,
loss and per-parameter gradients; every hook point's capture; greedy decoding after each prefill;
and the evaluation's per-position accuracy. Comparison is bit for bit (torch.equal), and names what
differs; with --atol, outputs within that absolute difference count as equal (a refactor that only
reorders a sum, such as autograd accumulating a gradient in another order, changes the last bits)
and the largest difference is reported.
"""

import argparse
import sys
from types import SimpleNamespace

import torch

from lrt_lab import LRT, MemoryConfig, preset
from lrt_lab.core.baselines import build_baseline
from lrt_lab.run.decode import Decoder
from lrt_lab.run.evaluation import evaluate
from lrt_lab.run.registry import parse_schedule
from lrt_lab.run.runner import run_schedule

MEMORIES = {
    "transformer": None,
    "default": MemoryConfig(),
    "layerwise_lag2": MemoryConfig(projections="layerwise", source_layer=1, lag=2),
    "averages": MemoryConfig(source_layer=2, source_avg=2, lag_avg=3),
    "keys_replace_nogate": MemoryConfig(kv="keys", kv_mode="replace", gate=False),
    "reset_at_bos": MemoryConfig(reset_memory_at_bos=True),
}
BASELINES = ("loop:2", "ponder:2:2")
SCHEDULES = (
    "onepass",
    "interleaved:2",
    "fullseq:2",
    "fullseq:2:1,0,2",
    "chunked:3",
    "exact",
    "fixedpoint:0.001:4",
    "fixedpoint:0:4:2",
    "rollout:2",
)
PREFILLS = ("onepass", "interleaved:2", "exact", "rollout")
B, T = 3, 10


def make_model(memory, seed=0, kind=None):
    fields = dict(n_layer=3, window_pattern="SL", short_window=4, bos_token_id=0)
    cfg = preset("tiny", memory=memory, **fields)
    torch.manual_seed(seed)
    model = (build_baseline(kind, cfg) if kind else LRT(cfg)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.4)
    return model


def tokens(seed=1):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(1, 64, (B, T + 1), generator=g)
    idx[:, 4] = 0
    return idx[:, :-1], idx[:, 1:]


def record(name, model, out: dict):
    idx, targets = tokens()
    model.eval()
    for spec in SCHEDULES if kind_is_lrt(model) else ("onepass",):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        res = run_schedule(model, idx, targets, parse_schedule(spec))
        res.loss.backward()
        out[f"{name}/{spec}/logits"] = res.logits.detach()
        out[f"{name}/{spec}/loss"] = res.loss.detach()
        for pname, p in model.named_parameters():
            if p.grad is not None:
                out[f"{name}/{spec}/grad/{pname}"] = p.grad.detach().clone()
    cache = {}
    with torch.no_grad():
        run_schedule(
            model, idx, None, "interleaved:2" if kind_is_lrt(model) else "onepass", cache=cache
        )
    for hname, act in cache.items():
        out[f"{name}/hooks/{hname}"] = act
    prefills = PREFILLS if model.pathway is not None and kind_is_lrt(model) else ("onepass",)
    for prefill in prefills:
        dec = Decoder(model, B, T + 6)
        logits = dec.prefill(idx[:, :5], parse_schedule(prefill))
        steps = [logits]
        for _ in range(6):
            logits = dec.step(logits.argmax(-1))
            steps.append(logits)
        out[f"{name}/decode/{prefill}"] = torch.stack(steps, 1)
    mask = torch.ones_like(targets, dtype=torch.bool)
    sets = {"L10": SimpleNamespace(inputs=idx, targets=targets, loss_mask=mask)}
    res = evaluate(model, "onepass", sets, exact=kind_is_lrt(model))
    for key, value in _flat(res, f"{name}/eval").items():
        out[key] = value


def kind_is_lrt(model) -> bool:
    return type(model) is LRT


def _flat(value, prefix):
    if isinstance(value, dict):
        flat = {}
        for k, v in value.items():
            flat.update(_flat(v, f"{prefix}/{k}"))
        return flat
    if isinstance(value, (list, tuple)):
        return {prefix: torch.tensor(value, dtype=torch.float64)}
    if isinstance(value, torch.Tensor):
        return {prefix: value}
    if isinstance(value, (int, float)):
        return {prefix: torch.tensor(float(value), dtype=torch.float64)}
    return {}


def snapshot() -> dict:
    torch.set_num_threads(1)
    out = {}
    for name, memory in MEMORIES.items():
        record(name, make_model(memory), out)
    for kind in BASELINES:
        record(kind, make_model(None, kind=kind), out)
    return out


def max_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """The largest absolute difference (NaN where both are NaN counts as equal; inf if shapes or
    NaN positions differ)."""
    if x.shape != y.shape or not torch.equal(x.isnan(), y.isnan()):
        return float("inf")
    both = ~x.isnan()
    return (x[both] - y[both]).abs().max().item() if both.any() else 0.0


def compare(a: dict, b: dict, atol: float = 0.0) -> int:
    common = sorted(a.keys() & b.keys())
    unequal = {k: max_diff(a[k], b[k]) for k in common if not torch.equal(a[k], b[k])}
    differ = [k for k, d in unequal.items() if not d <= atol]
    only = sorted(a.keys() ^ b.keys())
    for k in differ:
        print(f"differs: {k} (max |diff| {unequal[k]:.3g})")
    for k in only:
        print(f"in one snapshot only: {k}")
    within = len(unequal) - len(differ)
    if within:
        largest = max(d for k, d in unequal.items() if k not in differ)
        print(f"{within} outputs differ by at most {largest:.3g} (<= atol {atol:g})")
    print(f"{len(common)} outputs compared, {len(differ)} differ, {len(only)} in one snapshot only")
    return 1 if differ or only else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="where to write the snapshot (or two to compare)")
    parser.add_argument("--compare", action="store_true", help="compare two snapshot files")
    parser.add_argument(
        "--atol",
        type=float,
        default=0.0,
        help="with --compare: outputs within this absolute difference count as equal (default 0)",
    )
    args = parser.parse_args(argv)
    if args.compare:
        if len(args.paths) != 2:
            parser.error("--compare takes two snapshot files")
        return compare(*(torch.load(p, weights_only=True) for p in args.paths), atol=args.atol)
    out = snapshot()
    torch.save(out, args.paths[0])
    print(f"{len(out)} float64 outputs written to {args.paths[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
