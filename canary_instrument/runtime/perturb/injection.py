"""One injected corruption as a user reads it, and its one-line, parseable log format.

```
kv_canary_perturb= step=57 kind=real_kv_used group=full half=k slot=1203 position=14 req=3 applied=1 byte=5 bit=2
```

``step`` is the manager step whose violations would report it (the same numbering as the
``step=`` of ``kv_canary violation`` lines), ``req`` the req-pool index (-1: none), ``applied=0``
marks an injection the device found nothing to corrupt for (an unmapped SWA slot): it changed
nothing and is not scored. Kind-specific fields follow (``new_slot``, ``byte``, ``bit``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from canary_instrument.runtime.reports.loglines import LogLine

PREFIX = "kv_canary_perturb="
_CORE = ("step", "kind", "group", "half", "slot", "position", "req", "applied")
NO_GROUP = "-"


@dataclass(frozen=True)
class Injection(LogLine):
    PREFIX = PREFIX

    step: int
    kind: str
    slot: int  # the corrupted slot (its group's own index for group=swa); the old slot for req_to_token
    position: int
    req: int  # req-pool index, -1 when no request owns it (a cached slot)
    group: str = NO_GROUP  # "full" | "swa" for real-KV kinds
    half: str = NO_GROUP  # "k" | "v" for real-KV kinds
    applied: bool = True
    extra: tuple = ()  # ((name, int), ...) kind-specific fields, in log order

    def get(self, name: str, default: Optional[int] = None) -> Optional[int]:
        return dict(self.extra).get(name, default)

    def fields(self) -> list:
        return [("step", self.step), ("kind", self.kind), ("group", self.group), ("half", self.half),
                ("slot", self.slot), ("position", self.position), ("req", self.req),
                ("applied", int(self.applied)), *self.extra]

    @classmethod
    def from_fields(cls, fields: list) -> "Injection":
        values = dict(fields)
        return cls(
            step=int(values["step"]),
            kind=values["kind"],
            group=values["group"],
            half=values["half"],
            slot=int(values["slot"]),
            position=int(values["position"]),
            req=int(values["req"]),
            applied=values["applied"] == "1",
            extra=tuple((name, int(value)) for name, value in fields if name not in _CORE),
        )
