"""Write the plain systemd units in deploy/systemd/ from the Ansible role templates, the one source of truth.

    python deploy/systemd/render.py            # rewrite fedge-agent.service and fedge-coordinator@.service
    python deploy/systemd/render.py --check    # exit 1 when a plain copy differs from its template
    python deploy/systemd/render.py --set fedge_prefix=/srv/fedge --out /tmp/units   # other values, elsewhere
    python deploy/systemd/render.py --set 'fedge_agent_device_allow=["/dev/i2c-1 rw"]' --out /tmp/units  # a list

The values are the roles' defaults (roles/{common,edge_agent,coordinator}/defaults/main.yml), read without a
YAML library: a unit template may only use variables whose default is a plain one-line literal there, or the empty
list `[]` (the sensor-access lists of the agent's unit). A --set value starting with `[` is read as a JSON list.
Rendering uses Jinja2 as Ansible's template module does (trim_blocks, the trailing newline kept), and
deploy/ci-check.sh compares this output with the units Ansible itself writes. Needs jinja2 only; knows nothing of
Fedge's code.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path

import jinja2

HERE = Path(__file__).resolve().parent
ROLES = HERE.parent / "ansible" / "roles"
DEFAULTS = [ROLES / role / "defaults" / "main.yml" for role in ("common", "edge_agent", "coordinator")]
UNITS = {
    "fedge-agent.service": ROLES / "edge_agent" / "templates" / "fedge-agent.service.j2",
    "fedge-coordinator@.service": ROLES / "coordinator" / "templates" / "fedge-coordinator@.service.j2",
}
_LITERAL = re.compile(r"^(fedge_[a-z0-9_]+):[ \t]+(.+?)[ \t]*$")


Value = str | list[str]


def _scalar(text: str) -> Value | None:
    """A one-line YAML scalar as a string, `[]` as an empty list; None for anything this reader does not take
    (templates, other collections)."""
    if text == "[]":
        return []
    if text[0] in "\"'":
        if len(text) < 2 or text[-1] != text[0]:
            return None
        text = text[1:-1]
    elif text[0] in "[{>|&*!#":
        return None
    return None if "{{" in text or "{%" in text else text


def role_defaults(files: list[Path] = DEFAULTS) -> dict[str, Value]:
    """Every `fedge_*: literal` line at the top level of the defaults files."""
    values: dict[str, Value] = {}
    for path in files:
        for line in path.read_text().splitlines():
            match = _LITERAL.match(line)
            if match and (value := _scalar(match.group(2))) is not None:
                values[match.group(1)] = value
    return values


def render(template: Path, values: Mapping[str, Value]) -> str:
    """The template with values filled in; an unknown variable is an error."""
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined, trim_blocks=True, keep_trailing_newline=True, autoescape=False
    )
    return env.from_string(template.read_text()).render(values)


def render_all(overrides: Mapping[str, Value] | None = None) -> dict[str, str]:
    """Unit file name -> text, from the role defaults updated with overrides."""
    values = role_defaults() | dict(overrides or {})
    return {name: render(template, values) for name, template in UNITS.items()}


def _override(item: str) -> tuple[str, Value]:
    """NAME=VALUE from --set; a VALUE starting with `[` is a JSON list of strings."""
    name, sep, text = item.partition("=")
    if not sep:
        raise SystemExit(f"--set {item!r}: expected NAME=VALUE")
    if not text.startswith("["):
        return name, text
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--set {name}: not a JSON list: {exc}") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SystemExit(f"--set {name}: expected a JSON list of strings")
    return name, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="compare instead of writing; exit 1 on a difference"
    )
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override a default")
    parser.add_argument(
        "--out", type=Path, default=HERE, help="folder of the plain units (default: this one)"
    )
    args = parser.parse_args(argv)
    overrides = dict(_override(item) for item in args.set)
    stale = []
    for name, text in render_all(overrides).items():
        path = args.out / name
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        elif not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(
            f"out of date in {args.out}: {', '.join(stale)}; run python deploy/systemd/render.py",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
