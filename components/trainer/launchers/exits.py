"""What a cluster process's output says about why it exited: its last exception and the lines after it."""
from __future__ import annotations

import re

_EXCEPTION_LINE = re.compile(r"^(\w+\.)*\w*(Error|Exception|Interrupt)\b.*")


def error_summary(lines: list[str], tail_if_no_exception: bool = True) -> str:
    """The last exception line of a process's output and the message right after it."""
    for i in range(len(lines) - 1, -1, -1):
        if _EXCEPTION_LINE.match(lines[i].strip()):
            after = (line.strip() for line in lines[i + 1:i + 4])
            following = [line for line in after if line and not line.startswith("[[")]
            return " ".join([lines[i].strip(), *following[:2]])[:600]
    if not tail_if_no_exception:
        return ""
    tail = [line.strip() for line in lines if line.strip()]
    return " | ".join(tail[-2:])[:600]
