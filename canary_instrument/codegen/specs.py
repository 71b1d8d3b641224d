"""The kernel specialisation grid: one rendered file per (family, layout, v_half, realkv), and per
clock for the layout-free timing-jitter family.

A family is one template (the per-forward passes, the idle-cache sweep, the jitter wait); a
specialisation is a dict of axis values; its file name spells the family and every axis, so a
listing of kernels/ is a table of what exists.
"""

from __future__ import annotations

from dataclasses import dataclass

LAYOUTS = ("mha", "mla", "swa")
REALKV_MODES = ("none", "partial", "all")
TEMPLATE = "canary.py.jinja"
# Kernel family -> its template. "canary": pre/post-forward passes; "sweep": idle-cache sweep.
TEMPLATES = {"canary": TEMPLATE, "sweep": "sweep.py.jinja"}
JITTER_TEMPLATE = "jitter.py.jinja"
# The jitter wait's clock: the GPU's %globaltimer, or none (Triton's CPU interpreter has no timer:
# the kernel draws and counts, and does not wait).
CLOCKS = ("globaltimer", "none")
FAMILIES = (*TEMPLATES, "jitter")
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
    family: str = "canary"

    @property
    def axes(self) -> dict[str, str]:
        return {"layout": self.layout, "v_half": str(int(self.v_half)), "realkv": self.realkv}

    @property
    def template(self) -> str:
        return TEMPLATES[self.family]

    @property
    def stem(self) -> str:
        return f"{self.family}_" + "_".join(f"{k}_{v}" for k, v in self.axes.items())

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


@dataclass(frozen=True)
class JitterSpec:
    """The timing-jitter wait kernel (runtime/features/jitter.py): no pool layout, one axis, the clock."""

    clock: str
    family: str = "jitter"

    @property
    def axes(self) -> dict[str, str]:
        return {"clock": self.clock}

    @property
    def template(self) -> str:
        return JITTER_TEMPLATE

    @property
    def stem(self) -> str:
        return f"{self.family}_clock_{self.clock}"

    @property
    def filename(self) -> str:
        return self.stem + ".py"

    def context(self) -> dict:
        return {"clock": self.clock}


def jitter_spec(clock: str) -> JitterSpec:
    if clock not in CLOCKS:
        raise ValueError(f"clock={clock!r} is not one of {', '.join(CLOCKS)}")
    return JitterSpec(clock)


def all_specs(layouts: tuple[str, ...] | list[str] | None = None, family: str = "canary") -> list[Spec]:
    """Every specialisation of one kernel family, optionally only those of ``layouts``; MLA has no V half."""
    if family not in TEMPLATES:
        raise ValueError(f"unknown layout kernel family {family!r}; known families: {', '.join(TEMPLATES)}")
    chosen = LAYOUTS if not layouts else tuple(layouts)
    unknown = [x for x in chosen if x not in LAYOUTS]
    if unknown:
        raise ValueError(f"unknown layout {unknown[0]!r}; known layouts: {', '.join(LAYOUTS)}")
    specs = []
    for layout in chosen:
        for v_half in ((False,) if layout == "mla" else (False, True)):
            for realkv in REALKV_MODES:
                specs.append(Spec(layout, v_half, realkv, family))
    return specs


def every_spec(layouts: tuple[str, ...] | list[str] | None = None) -> list:
    """The specialisations of every family: what ``build-kernels`` renders (the layout-free jitter
    kernels only when no layout is chosen)."""
    specs: list = [spec for family in TEMPLATES for spec in all_specs(layouts, family)]
    if not layouts:
        specs += [JitterSpec(clock) for clock in CLOCKS]
    return specs


def spec_for(layout: str, v_half: bool, realkv: str, family: str = "canary") -> Spec:
    """The specialisation for a runtime pool; raises ValueError naming the bad axis."""
    if family not in TEMPLATES:
        raise ValueError(f"family={family!r} is not one of {', '.join(TEMPLATES)}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {', '.join(LAYOUTS)}")
    if realkv not in REALKV_MODES:
        raise ValueError(f"realkv={realkv!r} is not one of {', '.join(REALKV_MODES)}")
    if layout == "mla" and v_half:
        raise ValueError("layout='mla' has no V half (the latent row is the only half)")
    return Spec(layout, bool(v_half), realkv, family)
