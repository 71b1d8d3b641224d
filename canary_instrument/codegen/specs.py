"""The kernel specialisation grid: one rendered file per (layout, v_half, realkv).

A specialisation is a dict of axis values; its file name spells every axis, so a listing of
kernels/ is a table of what exists.
"""

from __future__ import annotations

from dataclasses import dataclass

LAYOUTS = ("mha", "mla", "swa")
REALKV_MODES = ("none", "partial", "all")
TEMPLATE = "canary.py.jinja"
PARTIAL_WORDS = 2  # 16 bytes of layer 0's row


@dataclass(frozen=True)
class Group:
    """One (group, half) of canary rows as the template sees it."""

    name: str  # kernel argument stem, e.g. "full_k"
    group: int  # 0 FULL, 1 SWA
    half: int  # 0 K, 1 V
    swa: bool
    fingerprint: bool


@dataclass(frozen=True)
class Spec:
    layout: str
    v_half: bool
    realkv: str

    @property
    def axes(self) -> dict[str, str]:
        return {"layout": self.layout, "v_half": str(int(self.v_half)), "realkv": self.realkv}

    @property
    def stem(self) -> str:
        return "canary_" + "_".join(f"{k}_{v}" for k, v in self.axes.items())

    @property
    def filename(self) -> str:
        return self.stem + ".py"

    @property
    def groups(self) -> list[Group]:
        halves = [0, 1] if self.v_half else [0]
        kinds = [0, 1] if self.layout == "swa" else [0]
        fp = self.realkv != "none"
        return [
            Group(f"{'swa' if g else 'full'}_{'v' if h else 'k'}", g, h, bool(g), fp) for g in kinds for h in halves
        ]

    def context(self) -> dict:
        """Variables the template may use (StrictUndefined rejects anything else)."""
        return {
            "layout": self.layout,
            "v_half": self.v_half,
            "realkv": self.realkv,
            "swa": self.layout == "swa",
            "groups": self.groups,
            "fingerprint_words": {"none": 0, "partial": PARTIAL_WORDS, "all": None}[self.realkv],
        }


def all_specs(layouts: tuple[str, ...] | list[str] | None = None) -> list[Spec]:
    """Every specialisation, optionally only those of ``layouts``; MLA has no V half."""
    chosen = LAYOUTS if not layouts else tuple(layouts)
    unknown = [x for x in chosen if x not in LAYOUTS]
    if unknown:
        raise ValueError(f"unknown layout {unknown[0]!r}; known layouts: {', '.join(LAYOUTS)}")
    specs = []
    for layout in chosen:
        for v_half in ((False,) if layout == "mla" else (False, True)):
            for realkv in REALKV_MODES:
                specs.append(Spec(layout, v_half, realkv))
    return specs


def spec_for(layout: str, v_half: bool, realkv: str) -> Spec:
    """The specialisation for a runtime pool; raises ValueError naming the bad axis."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {', '.join(LAYOUTS)}")
    if realkv not in REALKV_MODES:
        raise ValueError(f"realkv={realkv!r} is not one of {', '.join(REALKV_MODES)}")
    if layout == "mla" and v_half:
        raise ValueError("layout='mla' has no V half (the latent row is the only half)")
    return Spec(layout, bool(v_half), realkv)
