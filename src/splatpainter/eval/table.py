"""The evaluation report as rich tables (what `splatpainter evaluate` prints without --json)."""

from __future__ import annotations

from typing import Any

COLUMNS = (
    ("psnr_changed", "PSNR chg dB", "{:.2f}"),
    ("ssim_changed", "SSIM chg", "{:.3f}"),
    ("psnr_unchanged", "PSNR unchg dB", "{:.2f}"),
    ("psnr_unchanged_back", "unchg back dB", "{:.2f}"),
    ("psnr_bleed", "bleed dB", "{:.2f}"),
    ("unseen_color_error", "unseen err", "{:.3f}"),
    ("seconds_per_edit", "s/edit", "{:.3f}"),
)
FORGET_COLUMNS = (
    ("psnr_after_first", "edit-1 PSNR after 1", "{:.2f}"),
    ("psnr_after_last", "after last", "{:.2f}"),
    ("drop", "drop dB", "{:+.2f}"),
    ("seconds_per_edit", "s/edit", "{:.3f}"),
    ("region_kept_fraction", "region kept", "{:.2f}"),
)


def _fmt(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _label(method: str, roles: dict[str, str]) -> str:
    """The method's row label; ablations are flagged so nobody reads them as the method."""
    return f"{method} (ablation)" if roles.get(method) == "ablation" else method


def report_tables(report: dict[str, Any]) -> list:
    """Per suite: a table of per-kind metrics (a section per kind) and, if measured, the
    forgetting one."""
    from rich.table import Table

    cfg = report["config"]
    roles = report.get("roles", {})
    seeds = cfg["seeds"]
    span = f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else seeds
    caption = (
        f"{len(seeds)} seeds ({span}), {cfg['min_gaussians']}-{cfg['max_gaussians']} Gaussians,"
        f" {cfg['view_size']}px, {cfg['num_heldout']} held-out views, optimize"
        f" {cfg['optimize_steps']} steps, model hint {cfg['hint']}"
    )
    model = report.get("model")
    if model is not None:
        caption += (
            f", model weights {model['weights']} ({'trained' if model['trained'] else 'UNTRAINED'})"
        )
    if report.get("ablations"):
        caption += (
            "; ablations: model_kind = the model told the true kind,"
            " model_init = its architecture without the learned weights"
        )
    tables = []
    for suite, section in report["suites"].items():
        t = Table(
            title=f"{suite} suite: held-out metrics per edit kind",
            caption=caption,
            title_justify="left",
            caption_justify="left",
        )
        t.add_column("kind")
        t.add_column("method")
        for _, head, _ in COLUMNS:
            t.add_column(head, justify="right")
        t.add_column("unseen frac", justify="right")
        for kind, k in section["kinds"].items():
            for i, (method, m) in enumerate(k["methods"].items()):
                t.add_row(
                    kind if i == 0 else "",
                    _label(method, roles),
                    *(_fmt(m[key], fmt) for key, _, fmt in COLUMNS),
                    _fmt(k["unseen_changed_fraction"], "{:.2f}") if i == 0 else "",
                )
            t.add_section()
        tables.append(t)
        f = section.get("forgetting")
        if f:
            ft = Table(
                title=f"{suite} forgetting: {f['edits']} paint/recolour edits, {f['seeds']} seeds",
                title_justify="left",
            )
            ft.add_column("method")
            for _, head, _ in FORGET_COLUMNS:
                ft.add_column(head, justify="right")
            for method, m in f["methods"].items():
                ft.add_row(
                    _label(method, roles), *(_fmt(m[key], fmt) for key, _, fmt in FORGET_COLUMNS)
                )
            tables.append(ft)
    return tables
